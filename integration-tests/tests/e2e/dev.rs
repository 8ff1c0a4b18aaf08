//! `xced dev` end to end: hosts and addresses, the demo service, endpoints through REST
//! and xcecli, replica kill and replacement, environment, fixed ports, validation, RBAC.

use crate::harness::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn index_of(headers: &reqwest::header::HeaderMap) -> u64 {
    headers
        .get("x-xce-index")
        .expect("X-Xce-Index header")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_service_is_served_and_heals() {
    let c = DevCluster::start(3, true).expect("dev cluster");
    let api = &c.api;

    // Hosts report distinct loopback addresses, shown by REST and by xcecli.
    let hosts = api.get_json("/v1/hosts").await.unwrap();
    let hosts = hosts["hosts"].as_array().unwrap();
    let ids: Vec<&str> = hosts.iter().map(|h| h["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["exec-01", "exec-02", "exec-03"]);
    let ips: BTreeSet<String> = hosts
        .iter()
        .map(|h| h["ip_addr"].as_str().unwrap().to_owned())
        .collect();
    let expected: BTreeSet<String> = (0..3).map(|i| c.host_ip(i).to_string()).collect();
    assert_eq!(ips, expected, "each dev host advertises its own address");
    let out = c.xcecli(&["host", "list", "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cli_hosts: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli_hosts["hosts"].as_array().unwrap().len(), 3);

    // The three replicas become ready; every endpoint is a process that answers HTTP.
    let eps = api.wait_ready("web", 3).await;
    for ep in &eps {
        assert!(http_ok(ep).await.unwrap(), "{ep} answers HTTP");
    }
    let ep_ips: BTreeSet<String> = eps
        .iter()
        .map(|e| e.rsplit_once(':').unwrap().0.to_owned())
        .collect();
    assert_eq!(ep_ips, expected, "replicas are spread one per host");

    // The service detail agrees with the endpoints.
    let svc = api.get_json("/v1/services/web").await.unwrap();
    let jobs = svc["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 3);
    for j in jobs {
        assert_eq!(j["state"], "running");
        assert_eq!(j["ready"], true);
        let port = j["ports"]["http"].as_u64().unwrap();
        assert!(
            (20000..=32000).contains(&port),
            "{port} in the dynamic range"
        );
    }

    // xcecli -o plain equals REST plain; -o env works with eval.
    let out = c.xcecli(&["service", "endpoints", "web", "-o", "plain"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).lines().map(str::to_owned).collect::<Vec<_>>(),
        eps
    );
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "eval \"$({} service endpoints web -o env)\" && printf %s \"$XCE_ENDPOINTS_HTTP\"",
            bin("xcecli").display()
        ))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .env("XCE_CONFIG", &c.client_config)
        .output()
        .unwrap();
    assert_eq!(stdout(&out), eps.join(","), "{}", stderr(&out));

    // A blocking query wakes on the kill of a replica, and the endpoint is gone.
    let (status, headers, _) = api.get("/v1/services/web/endpoints").await.unwrap();
    assert_eq!(status, 200);
    let index = index_of(&headers);
    let waiter = {
        let api = api.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let r = api
                .get(&format!(
                    "/v1/services/web/endpoints?format=plain&index={index}&wait=60s"
                ))
                .await;
            (t.elapsed(), r)
        })
    };
    let victim = eps[1].clone();
    kill_replica_listening_on(&victim).unwrap();
    let killed_at = Instant::now();
    let (waited, r) = waiter.await.unwrap();
    let (status, headers, body) = r.unwrap();
    assert_eq!(status, 200);
    assert!(index_of(&headers) > index, "the index moved");
    assert!(
        waited < Duration::from_secs(55),
        "the blocking query returned on the change, not at its timeout"
    );
    assert!(
        !body.lines().any(|l| l == victim),
        "killed replica {victim} is no longer an endpoint: {body}"
    );
    println!(
        "FIGURE endpoint removal after kill: {:?}",
        killed_at.elapsed()
    );

    // Its replacement appears when ready, and answers HTTP.
    let healed = api.wait_ready("web", 3).await;
    println!(
        "FIGURE replacement ready after kill: {:?}",
        killed_at.elapsed()
    );
    for ep in &healed {
        assert!(http_ok(ep).await.unwrap(), "{ep} answers HTTP");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_see_their_ports_and_fixed_ports_pend_with_a_reason() {
    let c = DevCluster::start(3, false).expect("dev cluster");
    let envdir = c.dir.path().join("env");
    std::fs::create_dir_all(&envdir).unwrap();
    let profile = format!(
        r#"
[service]
name = "envdump"
replicas = 4
command = ["sh", "-c", "env | grep ^XCE_ | sort > {dir}/env-$XCE_REPLICA.tmp && mv {dir}/env-$XCE_REPLICA.tmp {dir}/env-$XCE_REPLICA && exec python3 -m http.server $XCE_PORT_WEB-API --bind $XCE_HOST_IP"]

[[service.ports]]
name = "web-api"

[[service.ports]]
name = "metrics"
port = 29999

[[service.ports]]
name = "dns"
protocol = "udp"
port = 29999

[service.readiness]
tcp = "web-api"
interval = "500ms"
"#,
        dir = envdir.display()
    )
    // `$XCE_PORT_WEB-API` is not a shell variable: use the env mapping's name.
    .replace("$XCE_PORT_WEB-API", "$XCE_PORT_WEB_API");
    let (status, body) = c.api.submit_toml(&profile).await.unwrap();
    assert_eq!(status, 201, "{body}");

    // metrics/tcp 29999 is fixed: one replica per host, the fourth pends with the reason.
    eventually("3 ready envdump replicas", || async {
        let (s, _, body) = c
            .api
            .get("/v1/services/envdump/endpoints?format=plain&port=web-api")
            .await?;
        Ok((s == 200 && body.lines().count() == 3).then_some(()))
    })
    .await;
    let svc = c.api.get_json("/v1/services/envdump").await.unwrap();
    let pending = svc["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{svc}");
    let reason = pending[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("port metrics/tcp 29999") && reason.contains("all 3 hosts"),
        "{reason}"
    );
    let out = c.xcecli(&["service", "list"]);
    assert!(
        stdout(&out).contains("port metrics/tcp 29999"),
        "service list shows the reason: {}",
        stdout(&out)
    );

    // Each replica's environment is exactly docs/profile.md#environment-of-a-replica.
    for j in svc["jobs"].as_array().unwrap() {
        let replica = j["replica"].as_u64().unwrap();
        let text = std::fs::read_to_string(envdir.join(format!("env-{replica}"))).unwrap();
        let env: std::collections::BTreeMap<&str, &str> =
            text.lines().filter_map(|l| l.split_once('=')).collect();
        let host = c.api.get_json("/v1/hosts").await.unwrap();
        let ip = host["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["id"] == j["host"])
            .unwrap()["ip_addr"]
            .as_str()
            .unwrap()
            .to_owned();
        let web = j["ports"]["web-api"].as_u64().unwrap().to_string();
        assert_eq!(env["XCE_PORT_WEB_API"], web);
        assert_eq!(env["XCE_ADDR_WEB_API"], format!("{ip}:{web}"));
        assert_eq!(env["XCE_PORT_METRICS"], "29999");
        assert_eq!(env["XCE_PORT_DNS"], "29999");
        assert_eq!(env["XCE_ADDR_DNS"], format!("{ip}:29999"));
        assert_eq!(env["XCE_HOST_IP"], ip);
        assert_eq!(
            env["XCE_PORTS"],
            format!("web-api={web},metrics=29999,dns=29999")
        );
        assert_eq!(env["XCE_SERVICE"], "envdump");
        assert_eq!(env["XCE_REPLICA"], replica.to_string());
        assert_eq!(env["XCE_JOB_ID"], j["job"].as_str().unwrap());
    }

    // Stopping the service frees every port: the same fixed port fits again.
    assert_eq!(c.api.delete("/v1/services/envdump").await.unwrap(), 202);
    eventually("envdump gone", || async {
        let (s, _, _) = c.api.get("/v1/services/envdump").await?;
        Ok((s == 404).then_some(()))
    })
    .await;
    let hosts = c.api.get_json("/v1/hosts").await.unwrap();
    for h in hosts["hosts"].as_array().unwrap() {
        assert_eq!(h["ports"]["used"], 0, "leaked ports on {}", h["id"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_profile_is_rejected_whole_with_every_problem() {
    let c = DevCluster::start(1, false).expect("dev cluster");
    let profile = r#"
[service]
name = "Bad_Name"
replicas = 2
command = ["true"]
colour = "blue"

[[service.ports]]
name = "http"
port = 0

[[service.ports]]
name = "http"

[[service.ports]]
name = "two--hyphens"
port = 70000
"#;
    let (status, body) = c.api.submit_toml(profile).await.unwrap();
    assert_eq!(status, 400, "{body}");
    let fields: BTreeSet<&str> = body["error"]["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["field"].as_str().unwrap())
        .collect();
    for f in [
        "service.name",
        "service.colour",
        "service.ports[0].port",
        "service.ports[1].name",
        "service.ports[2].name",
        "service.ports[2].port",
    ] {
        assert!(fields.contains(f), "{f} is named in {body}");
    }
    let list = c.api.get_json("/v1/services").await.unwrap();
    assert_eq!(
        list["services"].as_array().unwrap().len(),
        0,
        "nothing half-applied"
    );

    // The CLI lists the problems too and exits 1.
    let file = c.dir.path().join("bad.toml");
    std::fs::write(&file, profile).unwrap();
    let out = c.xcecli(&["service", "submit", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("service.ports[2].port"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_see_only_their_projects() {
    let (_tokens, c) = DevCluster::two_tenants(2);
    let alice = c.api.with_token("alice-example-secret");
    let bob = c.api.with_token("bob-example-secret");
    let svc = |name: &str, project: &str| http_service(name, 1).project(project).toml();
    assert_eq!(
        alice.submit_toml(&svc("alpha", "team-a")).await.unwrap().0,
        201
    );
    assert_eq!(
        bob.submit_toml(&svc("beta", "team-b")).await.unwrap().0,
        201
    );
    assert_eq!(
        alice.submit_toml(&svc("sneaky", "team-b")).await.unwrap().0,
        403,
        "alice cannot submit to team-b"
    );
    alice.wait_ready("alpha", 1).await;
    bob.wait_ready("beta", 1).await;

    // Every surface: bob cannot see alpha, and the 404 is the same as for a missing name.
    for path in [
        "/v1/services/{}",
        "/v1/services/{}/endpoints",
        "/v1/services/{}/endpoints?format=plain",
        "/v1/services/{}/endpoints?index=1&wait=1s",
        "/v1/sd/prometheus?service={}",
    ] {
        let hidden = bob.get(&path.replace("{}", "alpha")).await.unwrap();
        let missing = bob.get(&path.replace("{}", "nosuch")).await.unwrap();
        assert_eq!(hidden.0, 404, "{path}");
        // Same status, same bytes once the asked-for name is the same.
        assert_eq!(
            (hidden.0, hidden.2.replace("alpha", "nosuch")),
            (missing.0, missing.2.clone()),
            "{path}: byte-identical 404"
        );
        let anon = c
            .api
            .with_token("")
            .get(&path.replace("{}", "alpha"))
            .await
            .unwrap();
        assert_eq!(anon.0, 401, "{path} without a token");
        let forged = c
            .api
            .with_token("not-a-token")
            .get(&path.replace("{}", "alpha"))
            .await
            .unwrap();
        assert_eq!(forged.0, 401, "{path} with a bad token");
    }
    let list = bob.get_json("/v1/services").await.unwrap();
    let names: Vec<&str> = list["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["beta"]);
    assert_eq!(
        bob.delete("/v1/services/alpha").await.unwrap(),
        404,
        "bob cannot stop alpha"
    );

    // The CLI maps these to exit codes 4 and 5.
    let cfg = c.dir.path().join("bob.toml");
    std::fs::write(
        &cfg,
        format!("api = \"{}\"\ntoken = \"bob-example-secret\"\n", c.api.base),
    )
    .unwrap();
    let out = xcecli_with(&cfg, &["service", "endpoints", "alpha", "-o", "plain"], &[]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = xcecli_with(
        &cfg,
        &["service", "endpoints", "beta", "-o", "plain"],
        &[("XCE_TOKEN", "wrong")],
    );
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    // More ready replicas than beta has (1) can never be: a usage error at once (exit 2),
    // not a wait until the timeout (exit 3).
    let out = xcecli_with(
        &cfg,
        &[
            "service",
            "endpoints",
            "beta",
            "--wait-ready",
            "2",
            "--timeout",
            "1s",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_held_outside_xce_gets_the_replica_placed_again() {
    let c =
        DevCluster::start_with(1, false, &["--port-range", "30100-30103"]).expect("dev cluster");
    // Something outside xce holds the first ports of the range on the host's address.
    let ip = c.host_ip(0);
    let _held: Vec<std::net::TcpListener> = (30100..=30101)
        .map(|p| std::net::TcpListener::bind((ip, p)).expect("hold a port"))
        .collect();
    let profile = http_service("squat", 1).toml();
    assert_eq!(c.api.submit_toml(&profile).await.unwrap().0, 201);
    let eps = c.api.wait_ready("squat", 1).await;
    let port: u16 = eps[0].rsplit_once(':').unwrap().1.parse().unwrap();
    assert!(
        port == 30102 || port == 30103,
        "placed again on a free port, got {port}"
    );
    assert!(http_ok(&eps[0]).await.unwrap());
}

/// How many GETs each replica log under `logs` (a dev cluster's `data/workers`) records:
/// the readiness probes of an http probe, each logged by python's `http.server`.
fn probes_per_replica(
    logs: &std::path::Path,
) -> std::collections::BTreeMap<std::path::PathBuf, usize> {
    let mut out = std::collections::BTreeMap::new();
    for host in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        for log in std::fs::read_dir(host.path().join("logs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let text = std::fs::read_to_string(log.path()).unwrap_or_default();
            out.insert(log.path(), text.matches("\"GET / HTTP/1.1\"").count());
        }
    }
    out
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing from /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_cluster_with_probes_running_changes_nothing_and_wakes_nobody() {
    let c = DevCluster::start(3, true).expect("dev cluster");
    // Steady: the demo's rollout is over too (its end is a change of its own).
    c.api.wait_settled("web", 3).await;
    let (_, headers, _) = c.api.get("/v1/services/web/endpoints").await.unwrap();
    let index = index_of(&headers);
    // /metrics needs metrics.view: the dev cluster's admin token holds it.
    let metrics = |api: Api| async move {
        api.http
            .get(format!("{}/metrics", api.base))
            .bearer_auth(&api.token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let before = metrics(c.api.clone()).await;

    // The observation window is a blocking query parked on the entry while every replica
    // answers probe after probe (1 s interval): it must not wake (nothing changed). The
    // window ends on the probes themselves, counted in the replicas' logs (python's
    // http.server logs each GET): ten rounds on each of the 3 replicas, and one more, so
    // that whatever the tenth could have changed has had a probe interval to show.
    const ROUNDS: usize = 10;
    // Blocking queries waiting (the gauge has a line per kind; none before the first).
    let blocking = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("xce_endpoint_watchers{kind=\"blocking\"} "))
            .map_or(0.0, |v| v.parse::<f64>().unwrap())
    };
    let watchers = blocking(&metrics(c.api.clone()).await);
    let t = Instant::now();
    let long = reqwest::Client::builder()
        .timeout(patience() * 2)
        .build()
        .unwrap();
    let query = tokio::spawn(
        long.get(format!(
            "{}/v1/services/web/endpoints?index={index}&wait=10m",
            c.api.base
        ))
        .bearer_auth(&c.api.token)
        .send(),
    );
    eventually("the blocking query is parked (or answered)", || async {
        let n = blocking(&metrics(c.api.clone()).await);
        Ok((n > watchers || query.is_finished()).then_some(()))
    })
    .await;
    let logs = c.dir.path().join("data").join("workers");
    let probes_before = probes_per_replica(&logs);
    assert_eq!(probes_before.len(), 3, "3 replica logs: {probes_before:?}");
    eventually(
        &format!("{} probe rounds on every replica", ROUNDS + 1),
        || async {
            let now = probes_per_replica(&logs);
            Ok(probes_before
                .iter()
                .all(|(log, before)| now.get(log).is_some_and(|n| n - before > ROUNDS))
                .then_some(()))
        },
    )
    .await;
    let waited = t.elapsed();
    // A watcher woken answers at once: still waiting, it was not woken.
    let early_wakeups = u32::from(query.is_finished());
    query.abort();
    let (_, headers, _) = c.api.get("/v1/services/web/endpoints").await.unwrap();
    let index_after = index_of(&headers);

    let after = metrics(c.api.clone()).await;
    let changes = |t: &str| metric(t, "xce_endpoint_table_changes_total");
    let revision = |t: &str| metric(t, "xce_revision");
    println!(
        "FIGURE steady {:.0?}: endpoint table changes={}, controller revisions={}, watcher wake-ups={early_wakeups}",
        waited,
        changes(&after) - changes(&before),
        revision(&after) - revision(&before),
    );
    assert_eq!(index_after, index, "the index did not move");
    assert_eq!(early_wakeups, 0, "the watcher was not woken");
    assert_eq!(
        changes(&after),
        changes(&before),
        "the table's change counter did not move"
    );
    assert_eq!(
        revision(&after),
        revision(&before),
        "no controller change at all"
    );
}

/// `--demo` with a tokens file that grants nothing on the demo's project: the dev process
/// submits in-process, so the demo runs; the file's tokens see only what they may, and no
/// client config is written (its tokens are the user's to hand out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_with_any_tokens_file() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let viewer = r#"
[[token]]
secret = "carol-example-secret-0123456789"
principal = "carol"
grants = [ { permission = "job.view", projects = ["default"] } ]
"#;
    std::fs::write(&tokens, format!("{TWO_TENANTS}{viewer}")).unwrap();
    let c = DevCluster::start_with(2, true, &["--tokens", tokens.to_str().unwrap()])
        .expect("dev cluster with --demo and --tokens");
    let carol = c.api.with_token("carol-example-secret-0123456789");
    let ready = carol.wait_ready("web", 3).await;
    println!(
        "FIGURE dev --demo --tokens: web ready replicas={}",
        ready.len()
    );
    let alice = c.api.with_token("alice-example-secret");
    assert_eq!(alice.get("/v1/services/web").await.unwrap().0, 404);
    assert!(
        !c.client_config.exists(),
        "with --tokens no client config is written"
    );
}

/// `service stop --wait` returns once the service is gone, saying how many replicas were
/// left as that changed. `--project` before the command (documented as global) applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_stop_wait_returns_once_the_service_is_gone() {
    let c = DevCluster::start(1, true).expect("dev cluster");
    c.api.wait_ready("web", 3).await;
    let out = c.xcecli(&["--project", "nope", "service", "stop", "web"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("looked in project nope only"),
        "{}",
        stderr(&out)
    );
    let out = c.xcecli(&["--project", "default", "service", "stop", "web", "--wait"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("service web stopping: 3 replicas left"),
        "{err}"
    );
    assert!(err.trim_end().ends_with("service web is gone"), "{err}");
    let (status, _, _) = c.api.get("/v1/services/web").await.unwrap();
    assert_eq!(status, 404, "gone when the command returned");
}

/// Ctrl-C on `xced dev` stops the replicas through their workers' shutdown: the
/// controller logs each as stopped by its worker, never as a replica that "ended by
/// itself" (a warning an operator would chase), and the daemon exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_the_replicas_without_warning_they_ended_by_themselves() {
    let mut c = DevCluster::start(2, true).expect("dev cluster");
    c.api.wait_ready("web", 3).await;
    signal(c.child.id(), libc::SIGINT);
    let deadline = Instant::now() + testkit::patience().max(Duration::from_secs(30));
    let status = loop {
        if let Some(s) = c.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "xced dev still running after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = c.log();
    assert!(status.success(), "xced dev exited {status}; log:\n{log}");
    let warned = log
        .lines()
        .filter(|l| l.contains("ended by itself"))
        .count();
    let stopped = log
        .lines()
        .filter(|l| l.contains("stopped by its worker's shutdown"))
        .count();
    println!("SUMMARY dev-ctrl-c stopped_by_worker={stopped} warned_ended_by_itself={warned}");
    assert_eq!(warned, 0, "log:\n{log}");
}
