use super::*;
use expect_test::{expect, Expect};
use proptest::prelude::*;
use serde_json::json;
use std::collections::BTreeMap;

fn facts(range: (u32, u32), reserved: &[u16], eph: Option<(u32, u32)>) -> HostFacts {
    let section = HostPortsFacts {
        range: crate::PortRange::try_new(range.0, range.1).unwrap(),
        reserved: reserved.to_vec(),
        ephemeral: eph.map(|(a, b)| crate::PortRange::try_new(a, b).unwrap()),
    };
    let mut f = HostFacts::default();
    f.sections.insert(PLUGIN_NAME.into(), section.to_value());
    f
}

/// `http:*` (tcp any free), `dns:udp/53`, `m:9100` (tcp fixed), `q:udp/*`.
fn section(spec: &str) -> serde_json::Value {
    let ports: Vec<serde_json::Value> = spec
        .split_whitespace()
        .map(|t| {
            let (name, rest) = t.split_once(':').unwrap();
            let (proto, port) = rest.split_once('/').unwrap_or(("tcp", rest));
            let mut v = json!({"name": name, "protocol": proto});
            if port != "*" {
                v["port"] = json!(port.parse::<i64>().unwrap());
            }
            v
        })
        .collect();
    serde_json::Value::Array(ports)
}

fn request<'a>(job: &'a str, section: Option<&'a serde_json::Value>) -> PlacementRequest<'a> {
    PlacementRequest {
        service: "web",
        project: "default",
        replica: 0,
        job,
        section,
    }
}

/// Runs a script against one plugin, printing each answer. Lines:
/// `host H lo-hi [reserved=a,b] [eph=lo-hi]`, `host H none`, `validate SPEC`, `names SPEC`,
/// `replicas N SPEC`, `fits H SPEC`, `reserve H JOB SPEC`, `release H JOB`, `restore H JOB JSON`,
/// `refuse H JOB JSON`, `summary H`, `removed H`.
fn check(script: &str, expect: Expect) {
    let mut plugin = PortsPlugin::new();
    let mut log = String::new();
    for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let mut words = line.splitn(2, ' ');
        let op = words.next().unwrap();
        let rest = words.next().unwrap_or("");
        let arg = |n: usize| rest.split_whitespace().nth(n).unwrap_or("").to_owned();
        let tail = |n: usize| rest.splitn(n + 1, ' ').nth(n).unwrap_or("").to_owned();
        let out = match op {
            "host" => {
                let host = arg(0);
                let f = if arg(1) == "none" {
                    HostFacts::default()
                } else {
                    let range = arg(1);
                    let (lo, hi) = range.split_once('-').unwrap();
                    let mut reserved = Vec::new();
                    let mut eph = None;
                    for w in rest.split_whitespace().skip(2) {
                        if let Some(r) = w.strip_prefix("reserved=") {
                            reserved = r.split(',').map(|p| p.parse().unwrap()).collect();
                        }
                        if let Some(e) = w.strip_prefix("eph=") {
                            let (a, b) = e.split_once('-').unwrap();
                            eph = Some((a.parse().unwrap(), b.parse().unwrap()));
                        }
                    }
                    facts((lo.parse().unwrap(), hi.parse().unwrap()), &reserved, eph)
                };
                format!("{:?}", plugin.host_up(&host, &f).map_err(|e| e.to_string()))
            }
            "validate" => {
                let s = section(rest);
                match plugin.validate(Some(&s)) {
                    Ok(info) => format!("ok {:?}", info.socket_names),
                    Err(errs) => errs
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("; "),
                }
            }
            "names" => {
                let s = section(rest);
                format!("{:?}", plugin.socket_names(Some(&s)))
            }
            "replicas" => {
                let s = section(&tail(1));
                let n: u32 = arg(0).parse().unwrap();
                match plugin.check_replicas(Some(&s), n) {
                    Ok(()) => "ok".into(),
                    Err(errs) => errs
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("; "),
                }
            }
            "fits" => {
                let s = section(&tail(1));
                format!(
                    "{:?}",
                    plugin
                        .fits(&arg(0), &request("j-x", Some(&s)))
                        .map_err(|u| u.to_string())
                )
            }
            "reserve" => {
                let s = section(&tail(2));
                match plugin.reserve(&arg(0), &request(&arg(1), Some(&s))) {
                    Ok(g) => format!("{}", plugin.grant_summary(&g).unwrap()),
                    Err(u) => format!("unfit: {u}"),
                }
            }
            "release" => {
                plugin.release(&arg(0), &arg(1));
                "ok".into()
            }
            "restore" => {
                let g = plugin_api::Grant::from_json(&tail(2)).unwrap();
                format!("{:?}", plugin.restore(&arg(0), &arg(1), &g))
            }
            "refuse" => {
                let d: serde_json::Value = serde_json::from_str(&tail(2)).unwrap();
                plugin.launch_refused(&arg(0), &arg(1), &d);
                "ok".into()
            }
            "summary" => format!("{:?}", plugin.host_summary(&arg(0)).map(|v| v.to_string())),
            "removed" => {
                plugin.host_removed(&arg(0));
                "ok".into()
            }
            _ => panic!("unknown op {op}"),
        };
        log += &format!("{line}\n  {out}\n");
    }
    expect.assert_eq(&log);
}

#[test]
fn placement_and_reasons() {
    check(
        r#"
        fits exec-01 http:*
        fits exec-01
        host exec-01 20000-20002 reserved=22,20001
        host exec-02 none
        fits exec-02 http:*
        reserve exec-01 j-1 http:* m:9100
        reserve exec-01 j-1 http:* m:9100
        fits exec-01 http:* m:9100
        fits exec-01 ssh:22
        reserve exec-01 j-2 a:* b:*
        reserve exec-01 j-2 a:* dns:udp/9100
        fits exec-01 c:*
        summary exec-01
        summary exec-02
        release exec-01 j-1
        release exec-01 j-1
        reserve exec-01 j-3 a:*
        summary exec-01
        removed exec-01
        summary exec-01
        release exec-01 j-3
        "#,
        expect![[r#"
            fits exec-01 http:*
              Err("ports are not reported by the host")
            fits exec-01
              Ok(())
            host exec-01 20000-20002 reserved=22,20001
              Ok(())
            host exec-02 none
              Err("sections.ports: missing: the worker reports no ports")
            fits exec-02 http:*
              Err("ports are not reported by the host")
            reserve exec-01 j-1 http:* m:9100
              {"http":20000,"m":9100}
            reserve exec-01 j-1 http:* m:9100
              {"http":20000,"m":9100}
            fits exec-01 http:* m:9100
              Err("port m/tcp 9100 is taken")
            fits exec-01 ssh:22
              Err("port ssh/tcp 22 is reserved")
            reserve exec-01 j-2 a:* b:*
              unfit: port b/tcp has no free port in 20000-20002
            reserve exec-01 j-2 a:* dns:udp/9100
              {"a":20002,"dns":9100}
            fits exec-01 c:*
              Err("port c/tcp has no free port in 20000-20002")
            summary exec-01
              Some("{\"capacity\":2,\"range\":\"20000-20002\",\"unavailable\":0,\"used\":4}")
            summary exec-02
              None
            release exec-01 j-1
              ok
            release exec-01 j-1
              ok
            reserve exec-01 j-3 a:*
              {"a":20000}
            summary exec-01
              Some("{\"capacity\":2,\"range\":\"20000-20002\",\"unavailable\":0,\"used\":3}")
            removed exec-01
              ok
            summary exec-01
              None
            release exec-01 j-3
              ok
        "#]],
    );
}

#[test]
fn validation_against_hosts() {
    check(
        r#"
        validate ssh:22 http:* http:udp/*
        host exec-01 20000-20001 reserved=22,80
        host exec-02 20000-20002 reserved=22 eph=20002-30000
        validate ssh:22 web:80 a:* b:* c:* u:udp/*
        validate a:* b:* u:udp/* v:udp/*
        validate BAD:* a:22 b:1 c:1
        "#,
        expect![[r#"
            validate ssh:22 http:* http:udp/*
              service.ports[2].name: duplicate port name "http" (first declared at service.ports[1])
            host exec-01 20000-20001 reserved=22,80
              Ok(())
            host exec-02 20000-20002 reserved=22 eph=20002-30000
              Ok(())
            validate ssh:22 web:80 a:* b:* c:* u:udp/*
              service.ports[0].port: port 22 is reserved on every host; service.ports: 3 "any free" tcp ports are more than any host's range can hold (at most 2)
            validate a:* b:* u:udp/* v:udp/*
              ok ["a", "b", "u", "v"]
            validate BAD:* a:22 b:1 c:1
              service.ports[0].name: "BAD" is not a valid port name: may contain only lowercase letters, digits and '-'; service.ports[3].port: port tcp/1 is already fixed by service.ports[2]; service.ports[1].port: port 22 is reserved on every host
        "#]],
    );
}

/// A section refused for what the hosts hold (here a dynamic range inside the kernel's
/// ephemeral range, which holds nothing) still declares its names, for the host's check
/// of readiness probes; a section with an unreadable name does not.
#[test]
fn a_refused_section_still_declares_its_names() {
    check(
        r#"
        host exec-01 40000-40999 eph=32768-60999
        validate http:*
        names http:*
        validate BAD:*
        names BAD:* a:*
        "#,
        expect![[r#"
            host exec-01 40000-40999 eph=32768-60999
              Ok(())
            validate http:*
              service.ports: 1 "any free" tcp ports are more than any host's range can hold (at most 0)
            names http:*
              Some(["http"])
            validate BAD:*
              service.ports[0].name: "BAD" is not a valid port name: may contain only lowercase letters, digits and '-'; service.ports: 1 "any free" tcp ports are more than any host's range can hold (at most 0)
            names BAD:* a:*
              None
        "#]],
    );
}

/// `replicas` × "any free" ports per protocol against the dynamic ranges of every host
/// together (reserved ports and the ephemeral overlap are not in them); fixed ports are
/// the placement's business.
#[test]
fn replicas_beyond_every_hosts_range_together_are_refused() {
    check(
        r#"
        replicas 10000 a:* b:udp/*
        host exec-01 20000-20999 reserved=20000
        host exec-02 20000-20999 eph=20500-30000
        replicas 1499 a:*
        replicas 1500 a:*
        replicas 750 a:* b:*
        replicas 751 a:* b:* u:udp/*
        replicas 10000 m:9100 d:udp/53
        host exec-03 none
        replicas 1500 a:*
        "#,
        expect![[r#"
            replicas 10000 a:* b:udp/*
              ok
            host exec-01 20000-20999 reserved=20000
              Ok(())
            host exec-02 20000-20999 eph=20500-30000
              Ok(())
            replicas 1499 a:*
              ok
            replicas 1500 a:*
              service.ports: 1500 replicas × 1 "any free" tcp port need 1500 ports, more than the dynamic ranges of all 2 registered hosts hold together (1499): lower replicas, or widen the hosts' port ranges
            replicas 750 a:* b:*
              service.ports: 750 replicas × 2 "any free" tcp ports need 1500 ports, more than the dynamic ranges of all 2 registered hosts hold together (1499): lower replicas, or widen the hosts' port ranges
            replicas 751 a:* b:* u:udp/*
              service.ports: 751 replicas × 2 "any free" tcp ports need 1502 ports, more than the dynamic ranges of all 2 registered hosts hold together (1499): lower replicas, or widen the hosts' port ranges
            replicas 10000 m:9100 d:udp/53
              ok
            host exec-03 none
              Err("sections.ports: missing: the worker reports no ports")
            replicas 1500 a:*
              service.ports: 1500 replicas × 1 "any free" tcp port need 1500 ports, more than the dynamic ranges of all 2 registered hosts hold together (1499): lower replicas, or widen the hosts' port ranges
        "#]],
    );
}

#[test]
fn refusal_restore_and_changed_facts() {
    check(
        r#"
        host exec-01 20000-20003
        reserve exec-01 j-1 http:* m:9100
        refuse exec-01 j-1 {"ports":[{"protocol":"tcp","port":20000},{"protocol":"tcp","port":9100}]}
        release exec-01 j-1
        summary exec-01
        fits exec-01 m:9100
        reserve exec-01 j-2 a:* b:* c:*
        fits exec-01 a:*
        host exec-01 20000-20003
        fits exec-01 m:9100
        refuse exec-01 j-2 {"ports":[{"protocol":"tcp","port":9100}]}
        fits exec-01 m:9100
        host exec-01 20000-20004
        fits exec-01 m:9100
        summary exec-01
        reserve exec-01 j-3 a:*
        restore exec-01 j-2 {"ports":[{"name":"a","protocol":"tcp","port":20001},{"name":"b","protocol":"tcp","port":20002},{"name":"c","protocol":"tcp","port":20003}]}
        restore exec-01 j-4 {"ports":[{"name":"x","protocol":"tcp","port":20001}]}
        restore exec-01 j-5 {"ports":[{"name":"x","protocol":"udp","port":20001}]}
        restore exec-01 j-6 {"ports":3}
        restore exec-09 j-7 {"ports":[{"name":"x","protocol":"tcp","port":20001}]}
        restore exec-09 j-8 {"ports":[{"name":"x","protocol":"tcp","port":20001}]}
        host exec-09 20000-20001
        reserve exec-09 j-9 a:* b:*
        reserve exec-09 j-9 a:*
        "#,
        expect![[r#"
            host exec-01 20000-20003
              Ok(())
            reserve exec-01 j-1 http:* m:9100
              {"http":20000,"m":9100}
            refuse exec-01 j-1 {"ports":[{"protocol":"tcp","port":20000},{"protocol":"tcp","port":9100}]}
              ok
            release exec-01 j-1
              ok
            summary exec-01
              Some("{\"capacity\":4,\"range\":\"20000-20003\",\"unavailable\":2,\"used\":0}")
            fits exec-01 m:9100
              Err("port m/tcp 9100 is unavailable (held by a process outside xce)")
            reserve exec-01 j-2 a:* b:* c:*
              {"a":20001,"b":20002,"c":20003}
            fits exec-01 a:*
              Err("port a/tcp has no free port in 20000-20003")
            host exec-01 20000-20003
              Ok(())
            fits exec-01 m:9100
              Ok(())
            refuse exec-01 j-2 {"ports":[{"protocol":"tcp","port":9100}]}
              ok
            fits exec-01 m:9100
              Err("port m/tcp 9100 is unavailable (held by a process outside xce)")
            host exec-01 20000-20004
              Ok(())
            fits exec-01 m:9100
              Ok(())
            summary exec-01
              Some("{\"capacity\":5,\"range\":\"20000-20004\",\"unavailable\":0,\"used\":3}")
            reserve exec-01 j-3 a:*
              {"a":20004}
            restore exec-01 j-2 {"ports":[{"name":"a","protocol":"tcp","port":20001},{"name":"b","protocol":"tcp","port":20002},{"name":"c","protocol":"tcp","port":20003}]}
              Ok(())
            restore exec-01 j-4 {"ports":[{"name":"x","protocol":"tcp","port":20001}]}
              Err("port x/tcp 20001 of job j-4 on exec-01 is already held by job j-2")
            restore exec-01 j-5 {"ports":[{"name":"x","protocol":"udp","port":20001}]}
              Ok(())
            restore exec-01 j-6 {"ports":3}
              Err("malformed port grant: invalid type: integer `3`, expected a sequence at line 1 column 10")
            restore exec-09 j-7 {"ports":[{"name":"x","protocol":"tcp","port":20001}]}
              Ok(())
            restore exec-09 j-8 {"ports":[{"name":"x","protocol":"tcp","port":20001}]}
              Err("port x/tcp 20001 of job j-8 on exec-09 is already held by job j-7")
            host exec-09 20000-20001
              Ok(())
            reserve exec-09 j-9 a:* b:*
              unfit: port b/tcp has no free port in 20000-20001
            reserve exec-09 j-9 a:*
              {"a":20000}
        "#]],
    );
}

#[test]
fn metrics_are_exposed() {
    let mut plugin = PortsPlugin::new();
    let mut registry = prometheus_client::registry::Registry::default();
    plugin.register_metrics(&mut registry);
    plugin
        .host_up(&"exec-01".into(), &facts((20000, 20009), &[], None))
        .unwrap();
    let s = section("http:* m:9100");
    plugin
        .reserve(&"exec-01".into(), &request("j-1", Some(&s)))
        .unwrap();
    let _ = plugin.reserve(&"exec-01".into(), &request("j-2", Some(&s)));
    let _ = plugin.fits(&"exec-02".into(), &request("j-2", Some(&s)));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    // Samples of one family come in hash order: sort the lines.
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    let text = lines.join("\n");
    expect![[r##"
        # EOF
        # HELP xce_port_alloc_failures Port allocations that failed on a host (fit checks and reservations), by reason.
        # HELP xce_port_pool_capacity Ports of a host's dynamic range that may be handed out (per protocol).
        # HELP xce_port_pool_unavailable Ports marked unavailable on a host (held by a process outside xce).
        # HELP xce_port_pool_used Ports held by live jobs on a host (both protocols, fixed ports included).
        # TYPE xce_port_alloc_failures counter
        # TYPE xce_port_pool_capacity gauge
        # TYPE xce_port_pool_unavailable gauge
        # TYPE xce_port_pool_used gauge
        xce_port_alloc_failures_total{reason="taken"} 1
        xce_port_alloc_failures_total{reason="unreported"} 1
        xce_port_pool_capacity{host="exec-01"} 10
        xce_port_pool_unavailable{host="exec-01"} 0
        xce_port_pool_used{host="exec-01"} 2"##]]
    .assert_eq(&text);

    // The gauges follow a release, the host's removal (its series go) and its return.
    let pool_lines = |registry: &prometheus_client::registry::Registry| {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        let mut lines: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("xce_port_pool_"))
            .map(str::to_owned)
            .collect();
        lines.sort_unstable();
        lines.join(" ")
    };
    plugin.release(&"exec-01".into(), &"j-1".into());
    assert_eq!(
        pool_lines(&registry),
        r#"xce_port_pool_capacity{host="exec-01"} 10 xce_port_pool_unavailable{host="exec-01"} 0 xce_port_pool_used{host="exec-01"} 0"#
    );
    plugin.host_removed(&"exec-01".into());
    assert_eq!(pool_lines(&registry), "");
    plugin
        .host_up(&"exec-01".into(), &facts((20000, 20004), &[], None))
        .unwrap();
    plugin
        .reserve(&"exec-01".into(), &request("j-3", Some(&s)))
        .unwrap();
    assert_eq!(
        pool_lines(&registry),
        r#"xce_port_pool_capacity{host="exec-01"} 5 xce_port_pool_unavailable{host="exec-01"} 0 xce_port_pool_used{host="exec-01"} 2"#
    );
}

// === property tests ===

const FIXED: [u16; 7] = [50, 51, 100, 102, 105, 150, 9000];

/// The hosts of the property tests: small ranges so that pools run dry often.
fn prop_hosts() -> Vec<(String, HostFacts)> {
    vec![
        ("h0".into(), facts((100, 107), &[101, 50], Some((106, 300)))),
        ("h1".into(), facts((100, 109), &[], None)),
        ("h2".into(), facts((100, 103), &[51], None)),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    /// Host index and the ports: (udp?, fixed port).
    Reserve(usize, Vec<(bool, Option<u16>)>),
    Release(usize),
    Refuse(usize),
    /// The worker of a host re-registers with the same facts.
    Reregister(usize),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    let port = (
        any::<bool>(),
        proptest::option::of(proptest::sample::select(&FIXED[..])),
    );
    prop_oneof![
        5 => (0..3usize, proptest::collection::vec(port, 1..4)).prop_map(|(h, p)| Op::Reserve(h, p)),
        3 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Refuse),
        1 => (0..3usize).prop_map(Op::Reregister),
        1 => Just(Op::Restart),
    ]
}

/// What the test believes about one host and protocol.
#[derive(Debug, Default, Clone)]
struct ModelPool {
    /// Port → when it was last freed (absent: never).
    freed_at: BTreeMap<u16, u64>,
    /// Marked unavailable, in marking order.
    unavailable: Vec<u16>,
}

struct Model {
    hosts: Vec<(String, HostPortsFacts)>,
    live: Vec<(usize, String, PortGrant)>,
    pools: BTreeMap<(usize, Protocol), ModelPool>,
    clock: u64,
}

impl Model {
    fn dynamic(&self, h: usize) -> Vec<u16> {
        let f = &self.hosts[h].1;
        (f.range.lo()..=f.range.hi())
            .filter(|p| !f.reserved.contains(p) && !f.ephemeral.is_some_and(|e| e.contains(*p)))
            .collect()
    }
    fn held(&self, h: usize, proto: Protocol, port: u16) -> bool {
        self.live.iter().any(|(lh, _, g)| {
            *lh == h
                && g.ports
                    .iter()
                    .any(|p| p.protocol == proto && p.port == port)
        })
    }
    fn pool(&mut self, h: usize, proto: Protocol) -> &mut ModelPool {
        self.pools.entry((h, proto)).or_default()
    }
    fn free_dynamic(&self, h: usize, proto: Protocol) -> Vec<u16> {
        let unavailable = self
            .pools
            .get(&(h, proto))
            .map(|p| p.unavailable.clone())
            .unwrap_or_default();
        self.dynamic(h)
            .into_iter()
            .filter(|&p| !self.held(h, proto, p) && !unavailable.contains(&p))
            .collect()
    }
    /// Whether the request fits, by the rules of docs/profile.md (independent of the pool code).
    fn fits(&self, h: usize, req: &[(Protocol, Option<u16>)]) -> bool {
        let f = &self.hosts[h].1;
        let mut need: BTreeMap<Protocol, usize> = BTreeMap::new();
        let dynamic = self.dynamic(h);
        for (i, &(proto, fixed)) in req.iter().enumerate() {
            if let Some(port) = fixed {
                let unavailable = self
                    .pools
                    .get(&(h, proto))
                    .is_some_and(|p| p.unavailable.contains(&port));
                if f.reserved.contains(&port)
                    || self.held(h, proto, port)
                    || unavailable
                    || req[..i].contains(&(proto, Some(port)))
                {
                    return false;
                }
                if dynamic.contains(&port) {
                    *need.entry(proto).or_default() += 1;
                }
            } else {
                *need.entry(proto).or_default() += 1;
            }
        }
        need.iter()
            .all(|(&proto, &n)| n <= self.free_dynamic(h, proto).len())
    }
}

fn restart(model: &Model) -> PortsPlugin {
    let mut plugin = PortsPlugin::new();
    for (h, f) in prop_hosts() {
        plugin.host_up(&h, &f).unwrap();
    }
    for (h, job, g) in &model.live {
        plugin
            .restore(&model.hosts[*h].0, job, &g.to_grant())
            .unwrap();
    }
    plugin
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_port_is_held_twice(ops in proptest::collection::vec(op(), 1..60)) {
        let hosts = prop_hosts();
        let mut model = Model {
            hosts: hosts
                .iter()
                .map(|(h, f)| (h.clone(), HostPortsFacts::from_facts(f).unwrap()))
                .collect(),
            live: Vec::new(),
            pools: BTreeMap::new(),
            clock: 0,
        };
        let mut plugin = restart(&model);
        for (n, op) in ops.into_iter().enumerate() {
            match op {
                Op::Reserve(h, ports) => {
                    let host = model.hosts[h].0.clone();
                    let req: Vec<(Protocol, Option<u16>)> = ports
                        .iter()
                        .map(|&(udp, fixed)| (if udp { Protocol::Udp } else { Protocol::Tcp }, fixed))
                        .collect();
                    let section = serde_json::Value::Array(
                        req.iter()
                            .enumerate()
                            .map(|(i, (proto, fixed))| {
                                let mut v = json!({"name": format!("p{i}"), "protocol": proto});
                                if let Some(p) = fixed {
                                    v["port"] = json!(p);
                                }
                                v
                            })
                            .collect(),
                    );
                    let job = format!("j-{n}");
                    let before = plugin.hosts.clone();
                    let free_before: BTreeMap<Protocol, Vec<u16>> = [Protocol::Tcp, Protocol::Udp]
                        .into_iter()
                        .map(|p| (p, model.free_dynamic(h, p)))
                        .collect();
                    let fits = plugin.fits(&host, &request(&job, Some(&section)));
                    match plugin.reserve(&host, &request(&job, Some(&section))) {
                        Ok(g) => {
                            prop_assert!(fits.is_ok());
                            prop_assert!(model.fits(h, &req), "granted what does not fit: {req:?}");
                            let g = PortGrant::from_grant(&g).unwrap();
                            for (p, &(proto, fixed)) in g.ports.iter().zip(&req) {
                                prop_assert_eq!(p.protocol, proto);
                                prop_assert!(!model.held(h, proto, p.port), "{host} {proto}/{} held twice", p.port);
                                match fixed {
                                    Some(f) => prop_assert_eq!(p.port, f),
                                    None => prop_assert!(free_before[&proto].contains(&p.port)),
                                }
                            }
                            // Least recently freed first: no port left free was freed
                            // before one handed out as "any free".
                            let granted: Vec<(Protocol, u16)> = g.ports.iter().map(|p| (p.protocol, p.port)).collect();
                            for (p, &(proto, fixed)) in g.ports.iter().zip(&req) {
                                if fixed.is_some() {
                                    continue;
                                }
                                let mp = model.pools.get(&(h, proto)).cloned().unwrap_or_default();
                                let age = mp.freed_at.get(&p.port).copied();
                                for &q in &free_before[&proto] {
                                    if granted.contains(&(proto, q)) {
                                        continue;
                                    }
                                    let q_age = mp.freed_at.get(&q).copied();
                                    prop_assert!(
                                        q_age >= age,
                                        "{host} {proto}/{} (freed {age:?}) handed out while {q} (freed {q_age:?}) was free",
                                        p.port
                                    );
                                }
                            }
                            model.live.push((h, job, g));
                        }
                        Err(_) => {
                            prop_assert!(fits.is_err());
                            prop_assert!(!model.fits(h, &req), "refused what fits: {req:?}");
                            prop_assert!(plugin.hosts == before, "a failed reservation changed the state");
                        }
                    }
                }
                Op::Release(i) | Op::Refuse(i) => {
                    if model.live.is_empty() {
                        continue;
                    }
                    let (h, job, g) = model.live.remove(i % model.live.len());
                    let host = model.hosts[h].0.clone();
                    if matches!(op, Op::Refuse(_)) {
                        let p = &g.ports[0];
                        plugin.launch_refused(&host, &job, &json!({"ports": [{"protocol": p.protocol, "port": p.port}]}));
                        let mp = model.pool(h, p.protocol);
                        if !mp.unavailable.contains(&p.port) {
                            mp.unavailable.push(p.port);
                        }
                    }
                    plugin.release(&host, &job);
                    for p in &g.ports {
                        model.clock += 1;
                        let clock = model.clock;
                        let mp = model.pool(h, p.protocol);
                        if !mp.unavailable.contains(&p.port) {
                            mp.freed_at.insert(p.port, clock);
                        }
                    }
                }
                Op::Reregister(h) => {
                    let (host, f) = &hosts[h];
                    plugin.host_up(host, f).unwrap();
                    // Marks are dropped; free ports among them count as just freed, in
                    // marking order.
                    for proto in [Protocol::Tcp, Protocol::Udp] {
                        let marked = std::mem::take(&mut model.pool(h, proto).unavailable);
                        for p in marked {
                            if !model.held(h, proto, p) {
                                model.clock += 1;
                                let clock = model.clock;
                                model.pool(h, proto).freed_at.insert(p, clock);
                            }
                        }
                    }
                }
                Op::Restart => {
                    // The free order and unavailable marks are not persisted.
                    model.pools.clear();
                    plugin = restart(&model);
                }
            }
            // The gauges follow every operation (a reservation and a release set only
            // the `used` one: the other two must not have changed).
            for (host, entry) in &plugin.hosts {
                let pool = entry.pool.as_ref().expect("every host reported usable facts");
                let [capacity, used, unavailable] = &plugin.metrics.handles[host];
                prop_assert_eq!(
                    (capacity.get(), used.get(), unavailable.get()),
                    (i64::from(pool.capacity()), i64::from(pool.held()), i64::from(pool.unavailable()))
                );
            }
        }
        // Every port comes back when all jobs end.
        for (h, job, _) in std::mem::take(&mut model.live) {
            plugin.release(&model.hosts[h].0, &job);
        }
        for (h, (host, _)) in model.hosts.iter().enumerate() {
            let pool = plugin.hosts[host].pool.as_ref().unwrap();
            prop_assert_eq!(pool.held(), 0);
            prop_assert!(plugin.hosts[host].jobs.is_empty());
            for proto in [Protocol::Tcp, Protocol::Udp] {
                let unavailable = model
                    .pools
                    .get(&(h, proto))
                    .map_or(0, |p| p.unavailable.iter().filter(|&&q| pool.is_dynamic(proto, q)).count());
                prop_assert_eq!(pool.free(proto) as usize, model.dynamic(h).len() - unavailable);
                prop_assert_eq!(pool.free_order(proto).len(), pool.free(proto) as usize);
            }
        }
    }
}
