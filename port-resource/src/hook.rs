//! The worker's launch hook: the replica's environment (docs/profile.md) and the check that its
//! ports can be bound. This is the one place that names the `XCE_*` variables a replica
//! gets; a port's part of `XCE_PORT_<NAME>` and `XCE_ADDR_<NAME>` is its name's
//! environment form, [`PortName::env_suffix`], which `xcecli-ext` also uses for its
//! `XCE_ENDPOINTS_<NAME>` lines. The `XCE_*` variables the daemons and the CLI read
//! (`XCE_API`, `XCE_TOKEN`, …) are theirs.

use crate::grant::PLUGIN_NAME;
use crate::grant::{PortGrant, Protocol};
use crate::name::PortName;
use async_trait::async_trait;
use plugin_api::{LaunchContext, LaunchHook, LaunchPlan, LaunchRefusal};
use serde::{Deserialize, Serialize};
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};

/// `LaunchRefusal::detail` of this hook, read back by the plugin's `launch_refused`:
/// `{"ports":[{"protocol":"tcp","port":20417}]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RefusalDetail {
    pub(crate) ports: Vec<RefusedPort>,
}

/// One port found in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RefusedPort {
    pub(crate) protocol: Protocol,
    pub(crate) port: u16,
}

/// Sets the `XCE_*` environment of a replica and checks its ports are free on the host.
#[derive(Debug, Default, Clone)]
pub struct PortsLaunchHook {
    _priv: (),
}

// === impl PortsLaunchHook ===

impl PortsLaunchHook {
    /// The hook.
    pub fn new() -> Self {
        Self::default()
    }

    /// The environment and sockets of a replica (no I/O).
    pub fn plan(
        cx: &LaunchContext,
        grant: &PortGrant,
        plan: &mut LaunchPlan,
    ) -> Result<(), String> {
        let ip = host_ip(cx);
        let env = &mut plan.env;
        env.insert("XCE_SERVICE".into(), cx.service.clone());
        env.insert("XCE_PROJECT".into(), cx.project.clone());
        env.insert("XCE_REPLICA".into(), cx.replica.to_string());
        env.insert("XCE_JOB_ID".into(), cx.job.clone());
        env.insert("XCE_HOST_IP".into(), ip.to_string());
        let mut all = Vec::with_capacity(grant.ports.len());
        for p in &grant.ports {
            let name = PortName::new(&p.name)
                .map_err(|e| format!("granted port name {:?} is invalid: {e}", p.name))?;
            let suffix = name.env_suffix();
            let addr = SocketAddr::new(ip, p.port);
            env.insert(format!("XCE_PORT_{suffix}"), p.port.to_string());
            env.insert(format!("XCE_ADDR_{suffix}"), addr.to_string());
            plan.sockets.insert(p.name.clone(), addr);
            all.push(format!("{}={}", p.name, p.port));
        }
        env.insert("XCE_PORTS".into(), all.join(","));
        Ok(())
    }
}

/// The address replicas are reached at; the unspecified address when the host reported
/// none (replicas then bind everywhere).
fn host_ip(cx: &LaunchContext) -> IpAddr {
    cx.host_ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// Binds `port` on `ip` and lets it go at once. `Ok(false)`: something holds it.
fn bindable(ip: IpAddr, protocol: Protocol, port: u16) -> std::io::Result<bool> {
    let addr = SocketAddr::new(ip, port);
    let res = match protocol {
        Protocol::Tcp => TcpListener::bind(addr).map(drop),
        Protocol::Udp => UdpSocket::bind(addr).map(drop),
    };
    match res {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::AddrInUse => Ok(false),
        Err(e) => Err(e),
    }
}

fn refusal(reason: String, ports: Vec<RefusedPort>) -> LaunchRefusal {
    LaunchRefusal {
        plugin: PLUGIN_NAME.to_owned(),
        reason,
        detail: serde_json::to_value(RefusalDetail { ports })
            .expect("refusal detail always serializes"),
    }
}

#[async_trait]
impl LaunchHook for PortsLaunchHook {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    async fn prepare(
        &self,
        cx: &LaunchContext,
        plan: &mut LaunchPlan,
    ) -> Result<(), LaunchRefusal> {
        let grant = match cx.grants.get(PLUGIN_NAME) {
            Some(v) => PortGrant::from_grant(v).map_err(|e| refusal(e.to_string(), vec![]))?,
            None => PortGrant::default(),
        };
        let ip = host_ip(cx);
        let mut busy = Vec::new();
        let mut names = Vec::new();
        for p in &grant.ports {
            match bindable(ip, p.protocol, p.port) {
                Ok(true) => {}
                Ok(false) => {
                    busy.push(RefusedPort {
                        protocol: p.protocol,
                        port: p.port,
                    });
                    names.push(format!("{}/{} {}", p.name, p.protocol, p.port));
                }
                // Not a conflict (e.g. a privileged port, an address not on this host):
                // the replica's own bind will say what is wrong; refusing would only
                // place it again elsewhere with the same problem.
                Err(e) => tracing::warn!(
                    job = %cx.job, port = p.port, protocol = %p.protocol, %ip, error = %e,
                    "cannot check that the port is free"
                ),
            }
        }
        if !busy.is_empty() {
            let reason = if names.len() == 1 {
                format!("port {} is in use on the host", names[0])
            } else {
                format!("ports {} are in use on the host", names.join(", "))
            };
            return Err(refusal(reason, busy));
        }
        Self::plan(cx, &grant, plan).map_err(|e| refusal(e, vec![]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::GrantedPort;
    use expect_test::{expect, Expect};
    use plugin_api::{Grant, Grants};

    fn cx(host_ip: Option<&str>, grant: Option<PortGrant>) -> LaunchContext {
        LaunchContext {
            job: "j-17".into(),
            service: "web".into(),
            project: "default".into(),
            replica: 2,
            host: "exec-01".into(),
            host_ip: host_ip.map(|s| s.parse().unwrap()),
            grants: grant
                .map(|g| Grants::from([(PLUGIN_NAME, g.to_grant())]))
                .unwrap_or_default(),
        }
    }

    fn grant(ports: &[(&str, Protocol, u16)]) -> PortGrant {
        PortGrant {
            ports: ports
                .iter()
                .map(|&(n, protocol, port)| GrantedPort {
                    name: n.into(),
                    protocol,
                    port,
                })
                .collect(),
        }
    }

    fn check(cx: LaunchContext, expect: Expect) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut plan = LaunchPlan::default();
        let out = match rt.block_on(PortsLaunchHook::new().prepare(&cx, &mut plan)) {
            Ok(()) => {
                let mut s: Vec<String> = plan.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
                s.extend(plan.sockets.iter().map(|(k, v)| format!("socket {k} {v}")));
                s.join("\n")
            }
            Err(r) => format!("refused by {}: {}\n{}", r.plugin, r.reason, r.detail),
        };
        expect.assert_eq(&out);
    }

    /// A free port on loopback, found by binding port 0 (the listener is dropped).
    fn free_port(ip: &str) -> u16 {
        TcpListener::bind((ip.parse::<IpAddr>().unwrap(), 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn environment() {
        let (a, b) = (free_port("127.0.0.1"), free_port("127.0.0.1"));
        let g = grant(&[("http", Protocol::Tcp, a), ("re-mail-ck", Protocol::Udp, b)]);
        let out = {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let mut plan = LaunchPlan::default();
            rt.block_on(PortsLaunchHook::new().prepare(&cx(Some("127.0.0.1"), Some(g)), &mut plan))
                .unwrap();
            plan.env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .chain(plan.sockets.iter().map(|(k, v)| format!("socket {k} {v}")))
                .collect::<Vec<_>>()
                .join("\n")
                .replace(&a.to_string(), "A")
                .replace(&b.to_string(), "B")
        };
        expect![[r#"
            XCE_ADDR_HTTP=127.0.0.1:A
            XCE_ADDR_RE_MAIL_CK=127.0.0.1:B
            XCE_HOST_IP=127.0.0.1
            XCE_JOB_ID=j-17
            XCE_PORTS=http=A,re-mail-ck=B
            XCE_PORT_HTTP=A
            XCE_PORT_RE_MAIL_CK=B
            XCE_PROJECT=default
            XCE_REPLICA=2
            XCE_SERVICE=web
            socket http 127.0.0.1:A
            socket re-mail-ck 127.0.0.1:B"#]]
        .assert_eq(&out);
    }

    #[test]
    fn no_ports_and_ipv6_format() {
        check(
            cx(Some("127.0.0.11"), None),
            expect![[r#"
                XCE_HOST_IP=127.0.0.11
                XCE_JOB_ID=j-17
                XCE_PORTS=
                XCE_PROJECT=default
                XCE_REPLICA=2
                XCE_SERVICE=web"#]],
        );
        // Env building alone (no bind: the test host may lack IPv6).
        let mut plan = LaunchPlan::default();
        PortsLaunchHook::plan(
            &cx(Some("fd00::1"), None),
            &grant(&[("http", Protocol::Tcp, 20417)]),
            &mut plan,
        )
        .unwrap();
        expect![[r#"[fd00::1]:20417 fd00::1"#]].assert_eq(&format!(
            "{} {}",
            plan.env["XCE_ADDR_HTTP"], plan.env["XCE_HOST_IP"]
        ));
    }

    #[test]
    fn port_in_use_is_refused() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let udp_held = UdpSocket::bind("127.0.0.1:0").unwrap();
        let uport = udp_held.local_addr().unwrap().port();
        let free = free_port("127.0.0.1");
        let out = |g| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let mut plan = LaunchPlan::default();
            match rt.block_on(
                PortsLaunchHook::new().prepare(&cx(Some("127.0.0.1"), Some(g)), &mut plan),
            ) {
                Ok(()) => "launched".to_owned(),
                Err(r) => format!("{}: {} {}", r.plugin, r.reason, r.detail),
            }
            .replace(&port.to_string(), "P")
            .replace(&uport.to_string(), "U")
        };
        expect![[r#"ports: port http/tcp P is in use on the host {"ports":[{"port":P,"protocol":"tcp"}]}"#]]
            .assert_eq(&out(grant(&[("http", Protocol::Tcp, port), ("x", Protocol::Tcp, free)])));
        expect![[r#"ports: ports http/tcp P, dns/udp U are in use on the host {"ports":[{"port":P,"protocol":"tcp"},{"port":U,"protocol":"udp"}]}"#]]
            .assert_eq(&out(grant(&[("http", Protocol::Tcp, port), ("dns", Protocol::Udp, uport)])));
        // tcp and udp are separate: a held tcp port is free for udp.
        expect!["launched"].assert_eq(&out(grant(&[("dns", Protocol::Udp, port)])));
        drop((held, udp_held));
    }

    #[test]
    fn malformed_grant_is_refused() {
        let mut c = cx(Some("127.0.0.1"), None);
        c.grants.insert(
            PLUGIN_NAME,
            Grant::from_value(&serde_json::json!({"ports": 3})),
        );
        check(
            c,
            expect![[r#"
                refused by ports: malformed port grant: invalid type: integer `3`, expected a sequence at line 1 column 10
                {"ports":[]}"#]],
        );
    }
}
