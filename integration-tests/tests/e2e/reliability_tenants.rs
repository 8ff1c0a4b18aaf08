//! Issue 17, tenants and hosts cannot hurt each other (RELIABILITY.md scenarios 13–16):
//! a tenant at its quota while another still places, and bad quotas at start (13); a
//! worker credential advertising another live host's address, or one outside the
//! cluster's networks (14); two projects each with a `web` (15); a newline and an escape
//! sequence in every text field a worker sends, against the controller's log (16).
//!
//! Each runs separate `xced controller` and `xced worker` processes ([`Cluster`]) with a
//! tokens file of two tenants (alice in team-a, bob in team-b) and worker credentials,
//! waits on conditions (never on sleeps), and prints one `FIGURE` line.

use crate::harness::*;
use anyhow::{bail, Context, Result};
use futures_util::StreamExt;
use reqwest::header::HeaderMap;
use reqwest::Method;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

// === helpers ===

/// A profile of python `http.server` replicas: port `http` (+ `ports - 1` more, unused),
/// a TCP probe every 200 ms; `drain` when given; with `envdir`, each replica writes
/// `$XCE_PROJECT $XCE_SERVICE` to `<envdir>/<job>.env` before it serves.
fn profile(
    name: &str,
    project: &str,
    replicas: u32,
    ports: usize,
    drain: Option<&str>,
    envdir: Option<&Path>,
) -> String {
    let mut t =
        format!("[service]\nname = \"{name}\"\nproject = \"{project}\"\nreplicas = {replicas}\n");
    if let Some(d) = drain {
        t += &format!("drain = \"{d}\"\n");
    }
    let before = envdir
        .map(|d| {
            format!(
                "echo $XCE_PROJECT $XCE_SERVICE > {}/$XCE_JOB_ID.env; ",
                d.display()
            )
        })
        .unwrap_or_default();
    t += &format!(
        "command = [\"sh\", \"-c\", \"{before}exec python3 -m http.server $XCE_PORT_HTTP --bind $XCE_HOST_IP\"]\n[[service.ports]]\nname = \"http\"\n"
    );
    for i in 1..ports {
        t += &format!("[[service.ports]]\nname = \"p{i}\"\n");
    }
    t += "[service.readiness]\ntcp = \"http\"\ninterval = \"200ms\"\n";
    t += UNDER_LOAD_TIMEOUT;
    t
}

/// One request with the api's token: status, headers, body.
async fn call(
    api: &Api,
    method: Method,
    path: &str,
    body: Option<(&str, String)>,
) -> (u16, HeaderMap, String) {
    let mut req = api
        .http
        .request(method.clone(), format!("{}{path}", api.base))
        .bearer_auth(&api.token);
    if let Some((ctype, b)) = body {
        req = req.header("content-type", ctype).body(b);
    }
    let r = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.text().await.unwrap_or_default())
}

async fn put_toml(api: &Api, name: &str, toml: String) -> (u16, HeaderMap, String) {
    call(
        api,
        Method::PUT,
        &format!("/v1/services/{name}"),
        Some(("application/toml", toml)),
    )
    .await
}

async fn scale(api: &Api, name: &str, replicas: u32) -> (u16, String) {
    let (st, _, body) = call(
        api,
        Method::POST,
        &format!("/v1/services/{name}/scale"),
        Some((
            "application/json",
            json!({ "replicas": replicas }).to_string(),
        )),
    )
    .await;
    (st, body)
}

fn index_of(headers: &HeaderMap) -> Option<u64> {
    headers.get("x-xce-index")?.to_str().ok()?.parse().ok()
}

/// The `error` object of an error answer.
fn error_of(body: &str) -> Value {
    serde_json::from_str::<Value>(body).unwrap_or(Value::Null)["error"].clone()
}

/// Stops every service the token (admin) sees, by project, skipping drains; waits until
/// they are gone and every host's pool is empty; returns the ports still used.
async fn stop_everything(api: &Api) -> u64 {
    let list = api.get_json("/v1/services").await.unwrap();
    for s in list["services"].as_array().unwrap() {
        let (name, project) = (s["name"].as_str().unwrap(), s["project"].as_str().unwrap());
        let st = api
            .delete(&format!("/v1/services/{name}?project={project}&now=true"))
            .await
            .unwrap();
        assert!(
            st == 202 || st == 404,
            "stopping {project}/{name}: HTTP {st}"
        );
    }
    eventually("every service gone", || async {
        let l = api.get_json("/v1/services").await?;
        Ok(l["services"]
            .as_array()
            .is_some_and(Vec::is_empty)
            .then_some(()))
    })
    .await;
    eventually("every port free again", || async {
        let used = ports_used(api).await?;
        Ok(used.values().all(|&u| u == 0).then_some(()))
    })
    .await;
    ports_used(api).await.unwrap().values().sum()
}

/// Ports held by the live jobs of `project`'s services (draining and stopping ones too),
/// as the admin's service details list them.
async fn ports_held_by(admin: &Api, project: &str) -> Result<u64> {
    let list = admin.get_json("/v1/services").await?;
    let mut n = 0;
    for s in list["services"].as_array().context("services")? {
        if s["project"] != project {
            continue;
        }
        let name = s["name"].as_str().context("name")?;
        let d = admin
            .get_json(&format!("/v1/services/{name}?project={project}"))
            .await?;
        for j in d["jobs"].as_array().context("jobs")? {
            n += j["ports"].as_object().map_or(0, |m| m.len() as u64);
        }
    }
    Ok(n)
}

// === scenario 13: quotas ===

const QUOTAS: &str = r#"
[quotas.default]
services = 4
replicas = 6
ports = 8

[quotas."team-a"]
services = 2
replicas = 4
ports = 6
"#;

/// Checks a 403 `quota_exceeded` naming `quota`, its limit, the use now and what the
/// change needed; returns it as `quota limit/used->wanted`.
fn quota_refusal(
    what: &str,
    st: u16,
    body: &str,
    quota: &str,
    limit: u64,
    used: u64,
    wanted: u64,
) -> String {
    assert_eq!(st, 403, "{what}: {body}");
    let e = error_of(body);
    assert_eq!(e["code"], "quota_exceeded", "{what}: {body}");
    let msg = e["message"].as_str().unwrap_or("");
    for word in [
        quota.to_owned(),
        format!("quota of {limit}"),
        format!("{used} in use"),
    ] {
        assert!(
            msg.contains(&word),
            "{what}: message lacks {word:?}: {body}"
        );
    }
    let d = &e["details"][0];
    assert_eq!(
        d["field"],
        format!("quotas.team-a.{quota}"),
        "{what}: {body}"
    );
    let want = format!("limit {limit}, in use {used}, this change needs {wanted}");
    assert_eq!(d["reason"], want.as_str(), "{what}: {body}");
    format!("{quota} {limit}/{used}->{wanted}")
}

/// Scenario 13: team-a fills its quota — further creates, scales and updates answer 403
/// `quota_exceeded` and change nothing — while team-b's service still places and becomes
/// ready; what draining replicas of a scale-down and of a stopped service hold beyond the
/// quota is measured, not asserted (RELIABILITY.md, Found 10); a controller config with
/// bad quotas does not start and lists every problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_its_quota_is_refused_while_another_still_places() {
    let cfg = ClusterConfig {
        extra_tokens: TWO_TENANTS.to_owned(),
        // 6 ports per host, 12 in all: team-a's quota is half the cluster.
        extra_worker: "[ports]\nrange = \"20000-20005\"\n".to_owned(),
        controller_tables: QUOTAS.to_owned(),
        ..ClusterConfig::default()
    };
    let c = Cluster::start(2, "30s", &cfg).expect("cluster");
    let admin = c.api.clone();
    let alice = c.api.with_token("alice-example-secret");
    let bob = c.api.with_token("bob-example-secret");

    // Fill team-a: a1 (2 replicas, drains for an hour), a2 (1 replica).
    let a1 = |n| profile("a1", "team-a", n, 1, Some("1h"), None);
    let (st, _, body) = put_toml(&alice, "a1", a1(2)).await;
    assert_eq!(st, 201, "{body}");
    let (st, _, body) = put_toml(&alice, "a2", profile("a2", "team-a", 1, 1, None, None)).await;
    assert_eq!(st, 201, "{body}");
    // team-a declares: 2 services, 3 replicas, 3 ports.

    let mut refused = Vec::new();
    // A third service: services 2 of 2.
    let (st, _, body) = put_toml(&alice, "a3", profile("a3", "team-a", 1, 1, None, None)).await;
    refused.push(quota_refusal("PUT a3", st, &body, "services", 2, 2, 3));
    let (st, body) = alice
        .submit_toml(&profile("a3", "team-a", 1, 1, None, None))
        .await
        .unwrap();
    refused.push(quota_refusal(
        "POST a3",
        st,
        &body.to_string(),
        "services",
        2,
        2,
        3,
    ));
    // Scale a1 2 -> 4: replicas 3 -> 5 of 4.
    let (st, body) = scale(&alice, "a1", 4).await;
    refused.push(quota_refusal(
        "scale a1 to 4",
        st,
        &body,
        "replicas",
        4,
        3,
        5,
    ));
    // Update a2 to 5 ports per replica: ports 3 -> 7 of 6.
    let (st, _, body) = put_toml(&alice, "a2", profile("a2", "team-a", 1, 5, None, None)).await;
    refused.push(quota_refusal(
        "update a2 to 5 ports",
        st,
        &body,
        "ports",
        6,
        3,
        7,
    ));
    let refused: Vec<String> = ["create (PUT)", "create (POST)", "scale", "update"]
        .iter()
        .zip(&refused)
        .map(|(how, r)| format!("{how}: {r}"))
        .collect();
    // The finding's own attack, thousands of ports in one profile: at most 64 ports.
    let (st, _, body) = put_toml(&alice, "hog", profile("hog", "team-a", 1, 65, None, None)).await;
    assert_eq!(st, 400, "65 ports: {body}");
    assert!(body.contains("64"), "65 ports: {body}");
    let too_many_ports = st;

    // Within the quota still works: a1 2 -> 3 (replicas 4 of 4, ports 4 of 6).
    let (st, body) = scale(&alice, "a1", 3).await;
    assert_eq!(st, 200, "{body}");

    // The refusals changed nothing.
    let mut changed_by_refusals = 0;
    for name in ["a3", "hog"] {
        let (st, _, _) = alice.get(&format!("/v1/services/{name}")).await.unwrap();
        changed_by_refusals += usize::from(st != 404);
    }
    let a2 = alice.get_json("/v1/services/a2").await.unwrap();
    if a2["generation"] != 1 || a2["profile"]["ports"].as_array().map(Vec::len) != Some(1) {
        changed_by_refusals += 1;
    }
    let list = alice.get_json("/v1/services").await.unwrap();
    let declared: BTreeMap<String, u64> = list["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["replicas"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        declared,
        BTreeMap::from([("a1".into(), 3), ("a2".into(), 1)]),
        "team-a after the refusals"
    );
    assert_eq!(changed_by_refusals, 0);
    alice.wait_ready("a1", 3).await;
    alice.wait_ready("a2", 1).await;

    // team-b places and becomes ready while team-a is at its quota.
    let t0 = Instant::now();
    let (st, _, body) = put_toml(&bob, "b1", profile("b1", "team-b", 2, 1, None, None)).await;
    assert_eq!(st, 201, "{body}");
    let b1 = bob.wait_ready("b1", 2).await;
    let b1_ready_after = t0.elapsed();
    for ep in &b1 {
        assert!(http_ok(ep).await.unwrap(), "{ep} answers");
    }
    // team-b has the default quota: replicas 2 -> 7 of 6.
    let (st, _, body) = put_toml(&bob, "b2", profile("b2", "team-b", 5, 1, None, None)).await;
    assert_eq!(st, 403, "{body}");
    let e = error_of(&body);
    assert_eq!(e["code"], "quota_exceeded", "{body}");
    assert_eq!(e["details"][0]["field"], "quotas.team-b.replicas", "{body}");
    assert_eq!(
        e["details"][0]["reason"], "limit 6, in use 2, this change needs 7",
        "{body}"
    );
    let team_a_held_at_quota = ports_held_by(&admin, "team-a").await.unwrap();

    // Found 10, fixed: replicas draining after a scale-down hold their ports until they
    // exit, and count. a1 drains for an hour: 3 -> 1 is fine, 1 -> 3 while the two old
    // replicas drain is refused; team-a holds no more than its quota.
    let (st, body) = scale(&alice, "a1", 1).await;
    assert_eq!(st, 200, "{body}");
    let (st, body) = scale(&alice, "a1", 3).await;
    assert_eq!(st, 403, "scale up while two replicas drain: {body}");
    assert_eq!(error_of(&body)["code"], "quota_exceeded", "{body}");
    let team_a_held = ports_held_by(&admin, "team-a").await.unwrap();
    assert!(
        team_a_held <= 6,
        "team-a holds {team_a_held} ports, quota 6"
    );
    // team-b still places a new replica.
    let (st, _, body) = put_toml(&bob, "b3", profile("b3", "team-b", 1, 1, None, None)).await;
    assert_eq!(st, 201, "{body}");
    let b3 = bob.wait_ready("b3", 1).await;
    assert_eq!(b3.len(), 1);
    let total_used: u64 = ports_used(&admin).await.unwrap().values().sum();
    let mut leaked_ports = stop_everything(&admin).await;

    // And a stopped service counts while its replicas drain: create a 4-replica service
    // (drain 1h), stop it, create another: refused until the first has drained.
    let mut stopped_held = 0;
    let mut stop_cycles = 0;
    let mut refused_while_draining = 0;
    for i in 0..3 {
        let name = format!("d{i}");
        let (st, _, body) = put_toml(
            &alice,
            &name,
            profile(&name, "team-a", 4, 1, Some("1h"), None),
        )
        .await;
        if st != 201 {
            assert_eq!(st, 403, "create {name} while another drains: {body}");
            assert_eq!(error_of(&body)["code"], "quota_exceeded", "{body}");
            refused_while_draining += 1;
            continue;
        }
        alice.wait_ready(&name, 4).await;
        assert_eq!(
            alice.delete(&format!("/v1/services/{name}")).await.unwrap(),
            202
        );
        stop_cycles += 1;
        stopped_held = ports_held_by(&admin, "team-a").await.unwrap();
    }
    assert_eq!((stop_cycles, refused_while_draining), (1, 2));
    assert!(
        stopped_held <= 6,
        "team-a holds {stopped_held} ports, quota 6"
    );
    let services_listed = alice.get_json("/v1/services").await.unwrap()["services"]
        .as_array()
        .map_or(0, Vec::len);
    leaked_ports += stop_everything(&admin).await;

    // Bad quotas: the controller does not start, and names every problem.
    let bad = c.dir.path().join("bad-quotas.toml");
    std::fs::write(
        &bad,
        format!(
            "listen = \"127.0.0.1:{}\"\ndata_dir = \"{}\"\ntokens = \"{}\"\n\n[quotas]\n\"team-b\" = 5\n\n[quotas.default]\nservices = -1\nreplicas = \"ten\"\nprots = 3\n\n[quotas.\"team-a\"]\nports = 1.5\nreplicas = 2\n",
            free_port(),
            c.dir.path().join("bad-data").display(),
            c.dir.path().join("tokens.toml").display()
        ),
    )
    .unwrap();
    let (code, err) = run_to_exit(&bad);
    let problems = [
        "quotas.default.services: must be a non-negative integer, not -1",
        "quotas.default.replicas: must be a non-negative integer, not \"ten\"",
        "quotas.default.prots: unknown quota (known: services, replicas, ports)",
        "quotas.\"team-a\".ports: must be a non-negative integer, not 1.5",
        "quotas.\"team-b\": must be a table of limits",
    ];
    let listed = problems.iter().filter(|p| err.contains(*p)).count();
    assert_eq!(code, Some(1), "bad quotas: exit code; stderr: {err}");
    assert_eq!(
        listed,
        problems.len(),
        "every problem listed; stderr: {err}"
    );
    assert!(
        !c.dir.path().join("bad-data").exists(),
        "nothing created before the config was checked"
    );

    println!(
        "FIGURE scenario 13 quotas: team-a limits services=2 replicas=4 ports=6; refused={} ({}) 65_ports_in_one_service={too_many_ports} changed_by_refusals={changed_by_refusals} team_a_ports_at_quota={team_a_held_at_quota}; team-b placed=2/2 ready_after={b1_ready_after:?} default_quota_refused=1 (replicas 6/2->7); draining replicas count (Found 10, fixed): scale_up_while_draining=refused team_a_ports_held={team_a_held} (quota 6) all_hosts_used={total_used}/12 team_b_new_replica_placed=yes; stop_then_create: created={stop_cycles} refused_while_draining={refused_while_draining} team_a_ports_held={stopped_held} (quota 6) services_listed={services_listed}; bad_quotas: exit={} problems_listed={listed}/{} leaked_ports={leaked_ports}",
        refused.len(),
        refused.join(", "),
        code.map_or("signal".to_owned(), |c| c.to_string()),
        problems.len(),
    );
}

/// Runs `xced controller --config FILE` until it exits (killed after a deadline, which
/// fails the caller's checks); returns its exit code and stderr.
fn run_to_exit(config: &Path) -> (Option<i32>, String) {
    let mut child = std::process::Command::new(bin("xced"))
        .arg("controller")
        .arg("--config")
        .arg(config)
        .env("XCE_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning xced controller");
    let deadline = Instant::now() + patience();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            terminate(&mut child);
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    (status.and_then(|s| s.code()), err)
}

// === scenario 14: stolen address ===

/// What `/v1/hosts` says of each host's address: id -> (state, ip_addr, addresses).
async fn host_addresses(api: &Api) -> BTreeMap<String, (Value, Value, Value)> {
    let h = api.get_json("/v1/hosts").await.unwrap();
    h["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["id"].as_str().unwrap().to_owned(),
                (
                    h["state"].clone(),
                    h["ip_addr"].clone(),
                    h["addresses"].clone(),
                ),
            )
        })
        .collect()
}

/// How many endpoints of `entry` are on their own host's address, of how many.
fn on_own_address(
    entry: &Value,
    hosts: &BTreeMap<String, (Value, Value, Value)>,
) -> (usize, usize) {
    let eps = entry["endpoints"].as_array().cloned().unwrap_or_default();
    let right = eps
        .iter()
        .filter(|e| {
            let host = e["host"].as_str().unwrap_or("");
            hosts.get(host).is_some_and(|h| h.1 == e["address"])
        })
        .count();
    (right, eps.len())
}

/// Scenario 14: exec-01's credential advertises exec-02's address (facts and
/// registration), and addresses outside `[address] networks`: refused, facts, hosts and
/// endpoints unchanged, traffic still reaches the right replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_advertise_another_hosts_address() {
    let cfg = ClusterConfig {
        extra_tokens: TWO_TENANTS.to_owned(),
        // The harness's host addresses are 127.200.0.0 - 127.249.255.255.
        controller_address: "networks = [\"127.192.0.0/10\"]".to_owned(),
        ..ClusterConfig::default()
    };
    let c = Cluster::start(2, "30s", &cfg).expect("cluster");
    let alice = c.api.with_token("alice-example-secret");
    let (ip1, ip2) = (c.host_ip(0), c.host_ip(1));
    let (st, _, body) = put_toml(&alice, "web", profile("web", "team-a", 2, 1, None, None)).await;
    assert_eq!(st, 201, "{body}");
    alice.wait_ready("web", 2).await;
    let hosts_before = host_addresses(&c.api).await;
    let (_, h, entry_before) = alice.get("/v1/services/web/endpoints").await.unwrap();
    let index_before = index_of(&h).unwrap();
    let entry: Value = serde_json::from_str(&entry_before).unwrap();
    assert_eq!(on_own_address(&entry, &hosts_before), (2, 2), "{entry}");
    let hosts_used: BTreeSet<&str> = entry["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts_used.len(), 2, "one replica per host: {entry}");

    let facts = |ip: &str, also: Option<&str>| {
        let mut addresses = vec![json!({"ip": ip, "interface": "lo"})];
        if let Some(a) = also {
            addresses.push(json!({"ip": a, "interface": "lo"}));
        }
        json!({
            "ip_addr": ip,
            "addresses": addresses,
            "sections": {"ports": {"range": [20000, 32000], "reserved": [], "ephemeral": null}}
        })
    };
    // A compromised host has its worker's data dir: it presents the real instance id
    // and the worker's session.
    let instances = [c.worker_instance(0), c.worker_instance(1)];
    let sessions = [c.worker_session(0), c.worker_session(1)];
    let worker = |i: usize, method: Method, what: &'static str, body: Value| {
        let api = c
            .api
            .with_token(&format!("worker-{i}-example-secret"))
            .as_worker_session(&instances[i], &sessions[i]);
        let host = format!("exec-{:02}", i + 1);
        async move {
            let path = format!("/internal/v1/hosts/{host}/{what}");
            call(
                &api,
                method,
                &path,
                Some(("application/json", body.to_string())),
            )
            .await
        }
    };
    // (who, what, body, status, error code, text the details must have)
    let attacks = [
        (
            0,
            "facts with exec-02's address",
            Method::PUT,
            "facts",
            facts(&ip2, None),
            409,
            "address_in_use",
            "exec-02".to_owned(),
        ),
        (
            0,
            "facts with exec-02's address among its own",
            Method::PUT,
            "facts",
            facts(&ip2, Some(&ip1)),
            409,
            "address_in_use",
            "exec-02".to_owned(),
        ),
        (
            0,
            "registration with exec-02's address",
            Method::POST,
            "register",
            json!({"facts": facts(&ip2, None), "running": []}),
            409,
            "address_in_use",
            "exec-02".to_owned(),
        ),
        (
            1,
            "exec-02 with exec-01's address",
            Method::PUT,
            "facts",
            facts(&ip1, None),
            409,
            "address_in_use",
            "exec-01".to_owned(),
        ),
        (
            0,
            "8.8.8.8, outside the networks",
            Method::PUT,
            "facts",
            facts("8.8.8.8", None),
            400,
            "invalid",
            "outside the cluster's networks".to_owned(),
        ),
        (
            0,
            "127.0.0.99, loopback outside the networks",
            Method::PUT,
            "facts",
            facts("127.0.0.99", None),
            400,
            "invalid",
            "outside the cluster's networks".to_owned(),
        ),
    ];
    let mut refused = 0;
    for (i, what, method, route, body, want, code, names) in attacks.clone() {
        let (st, _, answer) = worker(i, method, route, body).await;
        assert_eq!(st, want, "{what}: {answer}");
        let e = error_of(&answer);
        assert_eq!(e["code"], code, "{what}: {answer}");
        assert!(
            e["details"].to_string().contains(&names),
            "{what}: details name {names:?}: {answer}"
        );
        refused += 1;
    }

    // Nothing moved: hosts, the entry and its index, and the traffic.
    let hosts_after = host_addresses(&c.api).await;
    assert_eq!(hosts_after, hosts_before, "hosts unchanged");
    let hosts_changed = usize::from(hosts_after != hosts_before);
    let (_, h, entry_after) = alice.get("/v1/services/web/endpoints").await.unwrap();
    let index_moves = index_of(&h).unwrap() - index_before;
    assert_eq!(entry_after, entry_before, "endpoints unchanged");
    assert_eq!(index_moves, 0);
    let entry: Value = serde_json::from_str(&entry_after).unwrap();
    let (right, all) = on_own_address(&entry, &hosts_after);
    assert_eq!((right, all), (2, 2));
    let mut answering = 0;
    for ep in alice.plain("web").await.unwrap() {
        answering += usize::from(http_ok(&ep).await.unwrap());
    }
    assert_eq!(answering, 2);
    // Both workers still report: they keep heartbeating and their facts stand.
    assert!(hosts_after.values().all(|h| h.0 == "ready"));
    // A new service after the attacks is placed on the right addresses too.
    let (st, _, body) = put_toml(&alice, "web2", profile("web2", "team-a", 2, 1, None, None)).await;
    assert_eq!(st, 201, "{body}");
    alice.wait_ready("web2", 2).await;
    let entry2 = alice.get_json("/v1/services/web2/endpoints").await.unwrap();
    let (right2, all2) = on_own_address(&entry2, &hosts_after);
    assert_eq!((right2, all2), (2, 2), "{entry2}");

    let log = std::fs::read_to_string(c.dir.path().join("controller.log")).unwrap_or_default();
    let logged = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("host facts refused"))
        .count();
    assert!(logged >= attacks.len(), "every refusal logged: {logged}");
    let leaked_ports = stop_everything(&c.api).await;
    println!(
        "FIGURE scenario 14 stolen address: attempts={} refused={refused} (another live host's address: {}x 409 address_in_use, via facts and registration, both ways; outside [address] networks: {}x 400) accepted={} hosts_changed={hosts_changed} endpoint_index_moves={index_moves} endpoints_on_own_host_address={right}/{all} answering={answering}/{all} new_service_on_right_addresses={right2}/{all2} refusals_logged={logged} leaked_ports={leaked_ports}",
        attacks.len(),
        attacks.iter().filter(|a| a.5 == 409).count(),
        attacks.iter().filter(|a| a.5 == 400).count(),
        attacks.len() - refused,
    );
}

// === scenario 15: the same name in two projects ===

/// carol views both projects, dave views team-a and team-c (no `web` in team-c).
const MORE_TENANTS: &str = r#"
[[token]]
secret = "carol-example-secret"
principal = "carol"
grants = [ { permission = "job.view", projects = ["team-a", "team-b"] } ]

[[token]]
secret = "dave-example-secret"
principal = "dave"
grants = [ { permission = "job.view", projects = ["team-a", "team-c"] } ]
"#;

/// What a read answered: status, headers but `date`, body (for a stream: its first
/// event).
type Answer = (u16, Vec<String>, String);

fn header_lines(h: &HeaderMap) -> Vec<String> {
    let mut v: Vec<String> = h
        .iter()
        .filter(|(k, _)| *k != "date")
        .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or("?")))
        .collect();
    v.sort();
    v
}

async fn read(api: &Api, path: &str) -> Answer {
    if path.ends_with("/stream") {
        let r = sse_open(api, path, None).await.unwrap();
        let status = r.status().as_u16();
        let headers = header_lines(r.headers());
        let mut body = r.bytes_stream();
        let mut parser = SseParser::default();
        let first = tokio::time::timeout(patience(), async {
            loop {
                let chunk = body.next().await.expect("a first event").unwrap();
                if let Some(e) = parser.push(&chunk).into_iter().next() {
                    return e;
                }
            }
        })
        .await
        .expect("first stream event in time");
        return (
            status,
            headers,
            format!("id: {}\ndata: {}", first.0, first.1),
        );
    }
    let (st, h, body) = api.get(path).await.unwrap();
    (st, header_lines(&h), body)
}

/// Every read surface of `web` for a caller, by path (`{index}`: the entry's index).
fn surfaces(index: u64) -> Vec<String> {
    [
        "/v1/services",
        "/v1/services/web",
        "/v1/services/web?project=team-a",
        "/v1/services/web?project=team-b",
        "/v1/services/web/endpoints",
        "/v1/services/web/endpoints?project=team-a",
        "/v1/services/web/endpoints?project=team-b",
        "/v1/services/web/endpoints?format=plain",
        "/v1/services/web/endpoints?include=all",
        "/v1/services/web/endpoints?index=1&wait=1s",
        "/v1/services/web/endpoints?index={index}&wait=1s",
        "/v1/services/web/endpoints/stream",
        "/v1/sd/prometheus",
        "/v1/sd/prometheus?service=web",
        "/v1/sd/prometheus?service=web&port=http",
        "/v1/endpoints",
    ]
    .iter()
    .map(|p| p.replace("{index}", &index.to_string()))
    .collect()
}

async fn read_all(api: &Api, paths: &[String]) -> BTreeMap<String, Answer> {
    let mut out = BTreeMap::new();
    for p in paths {
        out.insert(p.clone(), read(api, p).await);
    }
    out
}

/// Job ids and `address:port`s of a service, as its owner sees them.
async fn identity(api: &Api, name: &str) -> Vec<String> {
    let d = api.get_json(&format!("/v1/services/{name}")).await.unwrap();
    // Quoted, as JSON bodies carry them (j-1 is not a part of j-12).
    let mut out: Vec<String> = d["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| format!("\"{}\"", j["job"].as_str().unwrap()))
        .collect();
    out.extend(api.plain(name).await.unwrap());
    out
}

/// Digits masked: two answers that differ only by numbers (indexes, job ids, ports,
/// host numbers) compare equal.
fn mask_digits(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_num = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_num {
                out.push('N');
            }
            in_num = true;
        } else {
            in_num = false;
            out.push(c);
        }
    }
    out
}

/// Scenario 15: alice (team-a) and bob (team-b) each have `web`; each sees only its own
/// on every surface, and no answer to alice (or to dave, who views team-a and team-c)
/// differs by whether bob's exists; a caller who views both gets 409 `ambiguous` without
/// `?project=` and the right one with it; replicas see `XCE_PROJECT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_projects_each_have_a_web_and_see_only_their_own() {
    let cfg = ClusterConfig {
        extra_tokens: format!("{TWO_TENANTS}{MORE_TENANTS}"),
        ..ClusterConfig::default()
    };
    let c = Cluster::start(2, "30s", &cfg).expect("cluster");
    let envdir = c.dir.path().join("env");
    std::fs::create_dir_all(&envdir).unwrap();
    let alice = c.api.with_token("alice-example-secret");
    let bob = c.api.with_token("bob-example-secret");
    let carol = c.api.with_token("carol-example-secret");
    let dave = c.api.with_token("dave-example-secret");
    let web = |project: &str| profile("web", project, 2, 1, None, Some(&envdir));

    let (st, _, body) = put_toml(&alice, "web", web("team-a")).await;
    assert_eq!(st, 201, "{body}");
    alice.wait_ready("web", 2).await;
    let (_, h, _) = alice.get("/v1/services/web/endpoints").await.unwrap();
    let index = index_of(&h).unwrap();
    let paths = surfaces(index);
    let alice_before = read_all(&alice, &paths).await;
    let dave_before = read_all(&dave, &paths).await;
    // Real answers, not errors that would compare equal anyway.
    for (who, reads) in [("alice", &alice_before), ("dave", &dave_before)] {
        for (p, (st, _, body)) in reads {
            let want = if p.contains("project=team-b") {
                404
            } else {
                200
            };
            assert_eq!(*st, want, "{who} {p}: {body}");
        }
    }

    // A blocking query and a stream of alice's web, open while bob creates his.
    let parked = {
        let (base, token) = (alice.base.clone(), alice.token.clone());
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .get(format!(
                    "{base}/v1/services/web/endpoints?index={index}&wait=120s"
                ))
                .bearer_auth(token)
                .send()
                .await?;
            let idx = index_of(r.headers());
            let body = r.text().await?;
            anyhow::Ok((Instant::now(), idx, body))
        })
    };
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let stream = {
        let r = sse_open(&alice, "/v1/services/web/endpoints/stream", None)
            .await
            .unwrap();
        tokio::spawn(async move {
            let mut body = r.bytes_stream();
            let mut parser = SseParser::default();
            while let Some(Ok(chunk)) = body.next().await {
                for e in parser.push(&chunk) {
                    if events_tx.send((Instant::now(), e)).is_err() {
                        return;
                    }
                }
            }
        })
    };
    let first = tokio::time::timeout(patience(), events.recv())
        .await
        .expect("first event")
        .unwrap();
    assert_eq!(first.1 .0, index);

    // bob creates his web: it just works, answered as a name nobody has.
    let (st, h, bob_created) = put_toml(&bob, "web", web("team-b")).await;
    assert_eq!(st, 201, "bob's web: {bob_created}");
    let bob_change = h
        .get("x-xce-change")
        .map(|v| v.to_str().unwrap().to_owned());
    let bob_web = bob.wait_ready("web", 2).await;
    assert_eq!(bob_web.len(), 2);
    let (st, h, solo_created) = put_toml(
        &bob,
        "solo",
        profile("solo", "team-b", 2, 1, None, Some(&envdir)),
    )
    .await;
    assert_eq!(st, 201, "{solo_created}");
    let solo_change = h
        .get("x-xce-change")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(bob_change, solo_change);
    assert_eq!(bob_change.as_deref(), Some("created"));
    let created_same =
        mask_digits(&bob_created) == mask_digits(&solo_created.replace("solo", "web"));
    assert!(
        created_same,
        "bob's create of web answers like a name nobody has:\n{bob_created}\n{solo_created}"
    );
    bob.wait_ready("solo", 2).await;

    // Nothing alice or dave reads differs by whether bob's web exists.
    let alice_after = read_all(&alice, &paths).await;
    let dave_after = read_all(&dave, &paths).await;
    let mut differing = Vec::new();
    for (who, before, after) in [
        ("alice", &alice_before, &alice_after),
        ("dave", &dave_before, &dave_after),
    ] {
        for p in &paths {
            if before[p] != after[p] {
                differing.push(format!(
                    "{who} {p}:\n  before {:?}\n  after  {:?}",
                    before[p], after[p]
                ));
            }
        }
    }
    assert!(differing.is_empty(), "answers differ: {differing:#?}");
    let identical = 2 * paths.len();
    // The parked query and the stream did not wake for bob's service.
    let query_woken = parked.is_finished();
    let stream_woken = events.try_recv().is_ok();
    let woken_by_bob = usize::from(query_woken) + usize::from(stream_woken);
    assert!(
        !query_woken,
        "alice's blocking query answered for bob's change"
    );
    assert!(
        !stream_woken,
        "alice's stream sent an event for bob's change"
    );

    // Each sees only its own on every surface.
    let alice_ids = identity(&alice, "web").await;
    let bob_ids = identity(&bob, "web").await;
    assert!(alice_ids.iter().all(|x| !bob_ids.contains(x)));
    let bob_paths: Vec<String> = surfaces(0)
        .into_iter()
        .filter(|p| !p.contains("index=0"))
        .collect();
    let bob_reads = read_all(&bob, &bob_paths).await;
    let mut leaks = Vec::new();
    for (who, reads, other, other_project) in [
        ("alice", &alice_after, &bob_ids, "team-b"),
        ("dave", &dave_after, &bob_ids, "team-b"),
        ("bob", &bob_reads, &alice_ids, "team-a"),
    ] {
        for (p, (_, _, body)) in reads {
            for secret in other.iter().map(String::as_str).chain([other_project]) {
                if body.contains(secret) {
                    leaks.push(format!("{who} {p}: {secret}"));
                }
            }
        }
    }
    let leak_count = leaks.len();
    assert!(leaks.is_empty(), "{leaks:#?}");
    for (who, api, project) in [("alice", &alice, "team-a"), ("bob", &bob, "team-b")] {
        let d = api.get_json("/v1/services/web").await.unwrap();
        assert_eq!(d["project"], project, "{who}: {d}");
        let e = api.get_json("/v1/services/web/endpoints").await.unwrap();
        assert_eq!(e["project"], project, "{who}: {e}");
        assert_eq!(e["endpoints"].as_array().unwrap().len(), 2, "{who}: {e}");
        let (_, _, sd) = api.get("/v1/sd/prometheus?service=web").await.unwrap();
        let label = format!("\"__meta_xce_project\":\"{project}\"");
        assert_eq!(sd.matches(&label).count(), 2, "{who}: {sd}");
    }
    let bob_web_status = bob_reads["/v1/services/web"].0;
    assert_eq!(bob_web_status, 200);

    // Callers who view both: 409 ambiguous listing both, unless ?project= picks one.
    let mut ambiguous = 0;
    let mut picked = 0;
    for (who, api) in [("carol", &carol), ("admin", &c.api)] {
        for path in [
            "/v1/services/web",
            "/v1/services/web/endpoints",
            "/v1/services/web/endpoints?format=plain",
            "/v1/services/web/endpoints/stream",
            "/v1/sd/prometheus?service=web",
        ] {
            let (st, _, body) = api.get(path).await.unwrap();
            assert_eq!(st, 409, "{who} {path}: {body}");
            let e = error_of(&body);
            assert_eq!(e["code"], "ambiguous", "{who} {path}: {body}");
            let listed = e["details"].to_string();
            assert!(
                listed.contains("team-a") && listed.contains("team-b"),
                "{who} {path}: {body}"
            );
            ambiguous += 1;
        }
        for (path, owner) in [
            ("/v1/services/web?project=team-a", &alice),
            ("/v1/services/web?project=team-b", &bob),
            ("/v1/services/web/endpoints?project=team-a", &alice),
            ("/v1/services/web/endpoints?project=team-b", &bob),
        ] {
            let got = read(api, path).await;
            let owners = read(owner, path).await;
            assert_eq!(got.0, 200, "{who} {path}: {}", got.2);
            assert_eq!(got, owners, "{who} {path}: the owner's answer");
            picked += 1;
        }
    }
    // Writes need the project too (admin may write both).
    let (st, body) = scale(&c.api, "web", 3).await;
    assert_eq!(st, 409, "admin scale without project: {body}");
    assert_eq!(c.api.delete("/v1/services/web").await.unwrap(), 409);
    ambiguous += 2;

    // Replicas see their project.
    let mut env_ok = 0;
    let mut env_total = 0;
    for (api, want) in [(&alice, "team-a web"), (&bob, "team-b web")] {
        let d = api.get_json("/v1/services/web").await.unwrap();
        for j in d["jobs"].as_array().unwrap() {
            let job = j["job"].as_str().unwrap();
            let got =
                std::fs::read_to_string(envdir.join(format!("{job}.env"))).unwrap_or_default();
            env_total += 1;
            env_ok += usize::from(got.trim() == want);
        }
    }
    assert_eq!(env_ok, env_total, "XCE_PROJECT in every replica");

    // Alice's own change wakes her parked query and stream, with her entry.
    let scaled_at = Instant::now();
    let (st, body) = scale(&alice, "web", 3).await;
    assert_eq!(st, 200, "{body}");
    let (answered_at, idx, body) = tokio::time::timeout(patience(), parked)
        .await
        .expect("parked query answered")
        .unwrap()
        .unwrap();
    assert!(
        answered_at >= scaled_at,
        "parked query answered before alice's change"
    );
    assert!(idx.unwrap() > index);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["project"],
        "team-a"
    );
    let next = tokio::time::timeout(patience(), events.recv())
        .await
        .expect("a stream event for alice's change")
        .unwrap();
    assert!(next.0 >= scaled_at, "stream event before alice's change");
    let ev: Value = serde_json::from_str(&next.1 .1).unwrap();
    assert_eq!(ev["project"], "team-a", "{ev}");
    stream.abort();
    alice.wait_ready("web", 3).await;

    // Each owner stops its own web by name alone.
    let stops = [
        alice.delete("/v1/services/web").await.unwrap(),
        bob.delete("/v1/services/web").await.unwrap(),
    ];
    let stopped_by_name = stops.iter().filter(|s| **s == 202).count();
    assert_eq!(stops, [202, 202]);
    let leaked_ports = stop_everything(&c.api).await;
    println!(
        "FIGURE scenario 15 same name in two projects: surfaces={} identical_before_and_after_bob_created_web={identical}/{identical} (alice and dave) parked_query_and_stream_woken_by_bob={woken_by_bob} leaks={leak_count} bob_create_answered_like_a_new_name={} ambiguous_409={ambiguous} picked_by_project={picked} owners_stop_by_name={stopped_by_name}/{} xce_project_in_env={env_ok}/{env_total} leaked_ports={leaked_ports}",
        paths.len(),
        if created_same { "yes" } else { "no" },
        stops.len(),
    );
}

// === scenario 16: log injection ===

/// What a forged line would start with: a timestamp no real line has.
const FORGED_PREFIX: &str = "1999-12-31T23:59:59.999999Z  INFO xce_serve::auth:";

/// The text injected into field `tag`: the tag's marker, a newline, a forged log line
/// naming the tag, an escape sequence (clear screen).
fn inject(tag: &str) -> String {
    format!("{tag}-MARK\n{FORGED_PREFIX} admin token rotated FORGED-{tag}\u{1b}[2J")
}

/// The worker side of `/internal/v1` for exec-01, driven by the test.
struct FakeWorker {
    api: Api,
    base: String,
    heartbeats: tokio::task::JoinHandle<()>,
}

impl FakeWorker {
    /// Registers as a worker without a session (an older release's), once the host is
    /// free: the real worker just stopped, and its session holds the host until it has
    /// gone unheard for `unreachable_after`.
    async fn register(api: &Api, base: &str, body: &Value) -> Result<u64> {
        let answer = eventually("the fake worker registered", || async {
            let (st, _, answer) = call(
                api,
                Method::POST,
                &format!("{base}register"),
                Some(("application/json", body.to_string())),
            )
            .await;
            match st {
                200 => Ok(Some(answer)),
                409 => Ok(None),
                _ => bail!("register: HTTP {st}: {answer}"),
            }
        })
        .await;
        let v: Value = serde_json::from_str(&answer)?;
        v["heartbeat_ms"].as_u64().context("heartbeat_ms")
    }

    /// Registers (with `running`) and heartbeats until dropped.
    async fn start(api: Api, facts: Value, running: Value) -> Result<Self> {
        let base = "/internal/v1/hosts/exec-01/".to_owned();
        let every = Self::register(
            &api,
            &base,
            &json!({"facts": facts.clone(), "running": running}),
        )
        .await?
        .max(100);
        let heartbeats = tokio::spawn({
            let (api, base) = (api.clone(), base.clone());
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(every)).await;
                    let (st, _, _) =
                        call(&api, Method::POST, &format!("{base}heartbeat"), None).await;
                    if st == 404 {
                        let _ =
                            Self::register(&api, &base, &json!({"facts": facts, "running": []}))
                                .await;
                    }
                }
            }
        });
        Ok(Self {
            api,
            base,
            heartbeats,
        })
    }

    async fn send(&self, method: Method, what: &str, body: Value) -> (u16, String) {
        let (st, _, answer) = call(
            &self.api,
            method,
            &format!("{}{what}", self.base),
            Some(("application/json", body.to_string())),
        )
        .await;
        (st, answer)
    }

    async fn events(&self, events: Value) {
        let (st, answer) = self.send(Method::POST, "events", events).await;
        assert_eq!(st, 204, "events: {answer}");
    }

    /// The host's assigned jobs: (job, service, desired).
    async fn assignments(&self) -> Result<Vec<(String, String, String)>> {
        let (st, _, body) = self
            .api
            .get(&format!("{}assignments?index=0&wait=1s", self.base))
            .await?;
        if st != 200 {
            bail!("assignments: HTTP {st}: {body}");
        }
        let v: Value = serde_json::from_str(&body)?;
        Ok(v["jobs"]
            .as_array()
            .context("jobs")?
            .iter()
            .map(|j| {
                (
                    j["job"].as_str().unwrap_or("").to_owned(),
                    j["service"].as_str().unwrap_or("").to_owned(),
                    j["desired"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect())
    }

    /// Waits for a job of `service` to run that is not in `seen`.
    async fn next_job(&self, service: &str, seen: &BTreeSet<String>) -> String {
        eventually(&format!("a new job of {service} on exec-01"), || async {
            Ok(self
                .assignments()
                .await?
                .into_iter()
                .find(|(j, s, d)| s == service && d == "run" && !seen.contains(j))
                .map(|(j, _, _)| j))
        })
        .await
    }
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}

/// Scenario 16: as exec-01's worker, every text field a worker sends carries a newline,
/// a forged log line and an escape sequence; the controller's log (at debug level, so
/// the debug lines are checked too) has each such event on exactly one line, no line
/// that starts like the forged one, and no raw escape sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_forge_a_controller_log_line() {
    let cfg = ClusterConfig {
        controller_log: Some(
            "info,xced=debug,xce_controller=debug,xce_apiserver=debug,xce_worker=debug,xce_serve=debug,port_resource=debug,host_address=debug,endpoint_table=debug"
                .to_owned(),
        ),
        ..ClusterConfig::default()
    };
    let mut c = Cluster::start(1, "30s", &cfg).expect("cluster");
    // The test is exec-01's worker from now on (its instance: the same data dir).
    let instance = c.worker_instance(0);
    c.kill_worker(0);
    let ip = c.host_ip(0);
    let ports = json!({"range": [20000, 20010], "reserved": [], "ephemeral": null});
    let facts = json!({
        "ip_addr": ip,
        "addresses": [{"ip": ip, "interface": "lo"}],
        "sections": {"ports": ports}
    });
    let mut tags: Vec<&str> = Vec::new();

    // register: running[].job — an orphan the controller does not know; then its exit.
    tags.push("register.running.job");
    let orphan = inject("register.running.job");
    let fake = FakeWorker::start(
        c.api
            .with_token("worker-0-example-secret")
            .as_worker_instance(&instance),
        facts.clone(),
        json!([{"job": orphan, "pid": 999_999, "ready": false}]),
    )
    .await
    .expect("fake exec-01 registers");
    fake.events(json!([{"event": "exited", "job": orphan, "code": null}]))
        .await;

    // events for jobs that do not exist: every event kind's job id.
    for kind in ["started", "readiness", "exited", "refused"] {
        let tag: &'static str = match kind {
            "started" => "events.started.job",
            "readiness" => "events.readiness.job",
            "exited" => "events.exited.job",
            _ => "events.refused.job",
        };
        tags.push(tag);
        let job = inject(tag);
        let ev = match kind {
            "started" => json!({"event": "started", "job": job, "pid": 1}),
            "readiness" => json!({"event": "readiness", "job": job, "ready": true}),
            "exited" => json!({"event": "exited", "job": job, "code": 3}),
            _ => json!({"event": "refused", "job": job,
                        "refusal": {"plugin": "ports", "reason": "r", "detail": {}}}),
        };
        fake.events(json!([ev])).await;
    }

    // A real job placed on the fake host, refused with every refusal field injected.
    let (st, body) = c
        .api
        .submit_toml(&profile("inj", "default", 1, 1, None, None))
        .await
        .unwrap();
    assert_eq!(st, 201, "{body}");
    let mut seen = BTreeSet::new();
    let j1 = fake.next_job("inj", &seen).await;
    seen.insert(j1.clone());
    tags.extend(["refusal.reason", "refusal.detail"]);
    // The reason is also long: logged values are bounded.
    let long_reason = format!("{}{}", inject("refusal.reason"), "x".repeat(10_000));
    fake.events(json!([{"event": "refused", "job": j1, "refusal": {
        "plugin": "ports",
        "reason": long_reason,
        "detail": {"ports": [{"protocol": inject("refusal.detail"), "port": 20001}]}
    }}]))
    .await;
    let j2 = fake.next_job("inj", &seen).await;
    seen.insert(j2.clone());
    tags.push("refusal.plugin");
    fake.events(json!([{"event": "refused", "job": j2, "refusal": {
        "plugin": inject("refusal.plugin"), "reason": "plain", "detail": {}
    }}]))
    .await;

    // facts: an interface name, a section name and a section's value.
    tags.extend(["facts.interface", "facts.section.name"]);
    let (st, answer) = fake
        .send(
            Method::PUT,
            "facts",
            json!({
                "ip_addr": ip,
                "addresses": [{"ip": ip, "interface": inject("facts.interface")}],
                "sections": {"ports": ports}
            }),
        )
        .await;
    assert_eq!(st, 400, "interface name: {answer}");
    let mut sections = serde_json::Map::new();
    sections.insert("ports".into(), ports.clone());
    sections.insert(inject("facts.section.name"), json!(1));
    let (st, answer) = fake
        .send(
            Method::PUT,
            "facts",
            json!({
                "ip_addr": ip,
                "addresses": [{"ip": ip, "interface": "lo"}],
                "sections": sections
            }),
        )
        .await;
    assert!(st == 204 || st == 400, "section name: {st} {answer}");
    // The host's path segment.
    tags.push("path.host");
    let host = inject("path.host")
        .replace('%', "%25")
        .replace('\n', "%0A")
        .replace('\u{1b}', "%1B")
        .replace(' ', "%20");
    let (st, _, _) = call(
        &fake.api,
        Method::POST,
        &format!("/internal/v1/hosts/{host}/heartbeat"),
        None,
    )
    .await;
    assert!(st == 403 || st == 404, "another host's path: {st}");

    // Stop the service: exits reported for every job the controller stops.
    let st = c.api.delete("/v1/services/inj?now=true").await.unwrap();
    assert_eq!(st, 202);
    eventually("inj gone", || async {
        for (job, _, desired) in fake.assignments().await? {
            if desired == "stop" {
                fake.events(json!([{"event": "exited", "job": job, "code": null}]))
                    .await;
            }
        }
        let l = c.api.get_json("/v1/services").await?;
        Ok(l["services"]
            .as_array()
            .is_some_and(Vec::is_empty)
            .then_some(()))
    })
    .await;
    // Last, a `ports` section the plugin cannot read (the host's pool goes), then the
    // good facts again.
    tags.push("facts.section.value");
    let (st, answer) = fake
        .send(
            Method::PUT,
            "facts",
            json!({
                "ip_addr": ip,
                "addresses": [{"ip": ip, "interface": "lo"}],
                "sections": {"ports": {"range": inject("facts.section.value"), "reserved": []}}
            }),
        )
        .await;
    assert!(st == 204 || st == 400, "section value: {st} {answer}");
    let (st, answer) = fake.send(Method::PUT, "facts", facts.clone()).await;
    assert_eq!(st, 204, "good facts again: {answer}");

    // The fields the controller logs (at info, warn or debug) must all be there.
    let must_log = [
        "register.running.job",
        "events.started.job",
        "events.readiness.job",
        "events.exited.job",
        "events.refused.job",
        "refusal.reason",
        "refusal.detail",
        "refusal.plugin",
    ];
    let log_path = c.dir.path().join("controller.log");
    let log = eventually("every logged field in the controller log", || async {
        let bytes = std::fs::read(&log_path)?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let all = must_log.iter().all(|t| text.contains(&format!("{t}-MARK")));
        // Forged text of a field may arrive before its marker's line would end; both
        // are checked below once every field is there.
        Ok(all.then_some((bytes, text)))
    })
    .await;
    let (bytes, text) = log;
    let lines: Vec<&str> = text.lines().collect();
    // A forged line starts with the forged timestamp; every other line carrying a
    // field's marker is a real log line, whole when the forged text is on it too.
    let forged_start = FORGED_PREFIX.split(' ').next().unwrap();
    let mut per_tag = BTreeMap::new();
    let (mut whole, mut forged_alone) = (0, 0);
    let mut offending = Vec::new();
    for tag in &tags {
        let (mark, forged) = (format!("{tag}-MARK"), format!("FORGED-{tag}"));
        let mut marked = 0;
        for l in &lines {
            let real = !l.starts_with(forged_start);
            match (real && l.contains(&mark), l.contains(&forged)) {
                (true, true) => {
                    marked += 1;
                    whole += 1;
                    continue;
                }
                (true, false) => marked += 1,
                (false, true) => forged_alone += 1,
                (false, false) => continue,
            }
            offending.push(format!(
                "{tag}: {}",
                l.chars().take(300).collect::<String>()
            ));
        }
        per_tag.insert(*tag, marked);
    }
    let events_logged: usize = per_tag.values().sum();
    let forged_prefix_lines = lines.iter().filter(|l| l.starts_with(forged_start)).count();
    let raw_escapes = bytes.windows(4).filter(|w| w == b"\x1b[2J").count();
    let escaped_ok = text.contains("-MARK\\n1999-12-31");
    let longest = lines
        .iter()
        .filter(|l| l.contains("refusal.reason-MARK"))
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0);
    let cut = lines
        .iter()
        .any(|l| l.contains("refusal.reason-MARK") && l.contains("more chars)"));
    let not_logged: Vec<&str> = per_tag
        .iter()
        .filter(|(_, &n)| n == 0)
        .map(|(t, _)| *t)
        .collect();
    let leaked_ports = ports_used(&c.api).await.unwrap().values().sum::<u64>();
    drop(fake);
    if let Some(l) = lines.iter().find(|l| l.contains("refusal.plugin-MARK")) {
        eprintln!("a logged injection: {l}");
    }
    println!(
        "FIGURE scenario 16 log injection: fields_injected={} log_lines_carrying_them={events_logged} ({}) whole_on_one_line={whole}/{events_logged} lines_with_forged_text_apart={forged_alone} lines_starting_like_the_forged_one={forged_prefix_lines} raw_escape_sequences={raw_escapes} not_logged_at_all=[{}] longest_line_with_a_10000_char_value={longest} chars{} leaked_ports={leaked_ports}",
        tags.len(),
        per_tag
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(t, n)| format!("{t}={n}"))
            .collect::<Vec<_>>()
            .join(" "),
        not_logged.join(", "),
        if cut { " (cut)" } else { "" },
    );
    offending.truncate(12);
    assert!(
        offending.is_empty(),
        "log events not whole on one line: {offending:#?}"
    );
    assert_eq!(forged_prefix_lines, 0, "forged lines in the log");
    assert_eq!(raw_escapes, 0, "raw escape sequences in the log");
    assert!(escaped_ok, "the newline is logged as \\n");
    assert!(
        cut && longest < 2_000,
        "a 10,000-char reason is cut: {longest} chars"
    );
    for t in must_log {
        assert!(per_tag[t] >= 1, "{t} logged");
    }
}
