//! Host and cluster identity (issue 12, bugs 2 and 3), with separate `xced controller`
//! and `xced worker` processes: a second worker with the same host id is refused and
//! changes nothing (RELIABILITY scenario 19); a worker pointed at another cluster's
//! controller is refused and keeps its replicas (scenario 20).

use crate::harness::*;
use anyhow::{Context, Result};
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// (job, host, state, ready, ports) of a service's live jobs: what a restart or a stop
/// would change.
async fn jobs(api: &Api, service: &str) -> Result<Vec<String>> {
    let svc = api.get_json(&format!("/v1/services/{service}")).await?;
    Ok(svc["jobs"]
        .as_array()
        .context("jobs")?
        .iter()
        .map(|j| {
            format!(
                "{} {} {} ready={} ports={}",
                j["job"], j["host"], j["state"], j["ready"], j["ports"]
            )
        })
        .collect())
}

/// `/v1/hosts` without the volatile parts: the whole record of every host.
async fn hosts(api: &Api) -> Result<Value> {
    Ok(api.get_json("/v1/hosts").await?["hosts"].clone())
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits, on a blocking query with a `wait` longer than `unreachable_after` (2 s in the
/// harness), for a change of the service: `Some(new index)` if anything changed it
/// (a job ended, restarted, became unknown), `None` if nothing did.
async fn change_within(api: &Api, service: &str, wait: &str) -> Option<u64> {
    let (_, h, _) = api.get(&format!("/v1/services/{service}")).await.ok()?;
    let index: u64 = h.get("x-xce-index")?.to_str().ok()?.parse().ok()?;
    let (_, h, _) = api
        .get(&format!("/v1/services/{service}?index={index}&wait={wait}"))
        .await
        .ok()?;
    let after: u64 = h.get("x-xce-index")?.to_str().ok()?.parse().ok()?;
    (after != index).then_some(after)
}

/// The cluster id `/v1/hosts` names.
async fn cluster_of(api: &Api) -> String {
    let v = api.get_json("/v1/hosts").await.unwrap();
    v["cluster"]
        .as_str()
        .unwrap_or_else(|| panic!("no cluster id in /v1/hosts: {v}"))
        .to_owned()
}

/// A daemon the test started itself: stopped (SIGTERM, then SIGKILL) when dropped, also
/// when an assertion fails first.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        terminate(&mut self.0);
    }
}

/// A worker marked as `c`'s, so that `c`'s teardown ends whatever it starts too.
fn spawn_worker(c: &Cluster, config: &Path, log: &Path) -> Stopped {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Stopped(
        c.owner
            .mark(&mut Command::new(bin("xced")))
            .arg("worker")
            .arg("--config")
            .arg(config)
            .env("XCE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap(),
    )
}

/// Scenario 19: a second `xced worker` for exec-01 (same host id and credential, its own
/// data dir and port range) while the real one runs a ready replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_worker_with_the_same_host_id_is_refused_and_changes_nothing() {
    let replicas = ReplicaDir::new();
    let c = Cluster::new(1, "30s").expect("cluster");
    let (status, body) = c
        .api
        .submit_toml(&replicas.profile("web", 1, "0", "200ms", 0))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    let endpoints = c.api.wait_ready("web", 1).await;
    let pids = replicas.live_pids();
    assert_eq!(pids.len(), 1, "{pids:?}");
    let jobs_before = jobs(&c.api, "web").await.unwrap();
    let hosts_before = hosts(&c.api).await.unwrap();
    let refused_before = metric(&c.api, "xce_worker_registrations_refused")
        .await
        .unwrap();

    // The duplicate: exec-01's config with its own data dir and another port range.
    let dir = c.dir.path();
    let config = read(&dir.join("worker-0.toml")).replace(
        &dir.join("worker-0").display().to_string(),
        &dir.join("worker-dup").display().to_string(),
    ) + "\n[ports]\nrange = \"21000-21100\"\n";
    std::fs::write(dir.join("worker-dup.toml"), config).unwrap();
    let dup_log = dir.join("worker-dup.log");
    let started = std::time::Instant::now();
    let dup = spawn_worker(&c, &dir.join("worker-dup.toml"), &dup_log);

    // Refused at least 3 times (it backs off and retries), or (the old code) the real
    // replica is gone: whichever comes first.
    let ctl_log = dir.join("controller.log");
    eventually(
        "the duplicate refused 3 times, or the replica stopped",
        || async {
            let refused =
                metric(&c.api, "xce_worker_registrations_refused").await? - refused_before;
            let gone = replicas.live_pids() != pids;
            Ok((refused >= 3.0 || gone).then_some(()))
        },
    )
    .await;
    let refused = metric(&c.api, "xce_worker_registrations_refused")
        .await
        .unwrap()
        - refused_before;
    let refused_after = started.elapsed();
    assert_eq!(
        replicas.live_pids(),
        pids,
        "the real replica keeps running, same pid"
    );
    let text = read(&dup_log);
    assert!(
        text.contains("host exec-01 is held by another live worker;")
            && text.contains("check for a second worker with the same host id"),
        "the duplicate's log says why:\n{text}"
    );
    assert!(
        !text.contains(&c.worker_instance(0)),
        "the refusal names the live instance:\n{text}"
    );
    assert!(
        !text.contains("replica started"),
        "the duplicate launched nothing:\n{text}"
    );
    let ctl = read(&ctl_log);
    let refusals_logged = ctl
        .lines()
        .filter(|l| {
            l.contains("WARN")
                && l.contains("registration refused: another live worker instance holds the host")
                && l.contains("host=exec-01")
                && l.contains("holder=")
                && l.contains("instance=")
                && l.contains("peer=127.0.0.1")
        })
        .count();
    assert!(
        refusals_logged >= 3,
        "the controller logs each refusal:\n{ctl}"
    );
    for (who, text, needle) in [
        ("duplicate", &text, "held by another live worker"),
        ("controller", &ctl, "registration refused"),
    ] {
        if let Some(line) = text.lines().find(|l| l.contains(needle)) {
            eprintln!("LOG {who}: {line}");
        }
    }
    assert_eq!(
        c.api.plain("web").await.unwrap(),
        endpoints,
        "the replica stays the endpoint"
    );
    assert_eq!(
        jobs(&c.api, "web").await.unwrap(),
        jobs_before,
        "no job restarted"
    );
    assert_eq!(
        hosts(&c.api).await.unwrap(),
        hosts_before,
        "facts and port range unchanged"
    );

    // The duplicate exits; past `unreachable_after` nothing about the host changed.
    drop(dup);
    let changed = change_within(&c.api, "web", "3s").await;
    assert_eq!(
        changed, None,
        "the service changed after the duplicate exited"
    );
    let live = replicas.live_pids();
    let stopped = pids.iter().filter(|p| !live.contains(p)).count();
    let jobs_after = jobs(&c.api, "web").await.unwrap();
    let jobs_changed = usize::from(jobs_after != jobs_before);
    assert_eq!(live, pids);
    assert_eq!(c.api.plain("web").await.unwrap(), endpoints);
    assert_eq!(jobs_after, jobs_before);
    let hosts_after = hosts(&c.api).await.unwrap();
    assert_eq!(hosts_after, hosts_before, "facts and port range unchanged");
    eprintln!(
        "FIGURE scenario 19 duplicate host id: registrations refused {refused} (host_taken, in {} ms; logged by the controller {refusals_logged}x), replicas stopped {stopped}, pid unchanged {} -> {}, endpoint unchanged {}, job sets changed {jobs_changed}, host record unchanged (ports range {}), service changes in the 3 s after the duplicate exited: {}",
        refused_after.as_millis(),
        pids[0],
        replicas.live_pids()[0],
        endpoints[0],
        hosts_after[0]["ports"]["range"],
        usize::from(changed.is_some()),
    );
}

/// Scenario 20: exec-01 of cluster A, running a ready replica, is restarted pointed at
/// cluster B's controller (same worker credential there), then back at A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_pointed_at_another_clusters_controller_is_refused_and_keeps_its_replicas() {
    let replicas = ReplicaDir::new();
    let mut a = Cluster::new(1, "30s").expect("cluster A");
    let b = Cluster::start(
        0,
        "30s",
        &ClusterConfig {
            extra_tokens:
                "\n[[worker]]\nhost = \"exec-01\"\nsecret = \"worker-0-example-secret\"\n"
                    .to_owned(),
            ..ClusterConfig::default()
        },
    )
    .expect("cluster B");
    let (status, body) = a
        .api
        .submit_toml(&replicas.profile("web", 1, "0", "200ms", 0))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    let endpoints = a.api.wait_ready("web", 1).await;
    let pids = replicas.live_pids();
    assert_eq!(pids.len(), 1, "{pids:?}");
    let jobs_before = jobs(&a.api, "web").await.unwrap();

    // exec-01 restarted with B's controller as its only one.
    let config_path = a.dir.path().join("worker-0.toml");
    let config_a = read(&config_path);
    let url = |api: &Api| format!("controller = \"{}\"", api.base);
    assert!(config_a.contains(&url(&a.api)));
    a.kill_worker(0);
    std::fs::write(&config_path, config_a.replace(&url(&a.api), &url(&b.api))).unwrap();
    let log = a.dir.path().join("worker-0.log");
    let registered = |text: &str| text.matches("registered with the controller").count();
    let before = registered(&read(&log));
    let moved = std::time::Instant::now();
    a.start_worker(0).unwrap();
    eventually(
        "B refused exec-01 twice, or the replica stopped",
        || async {
            let refused = metric(&b.api, "xce_worker_registrations_refused").await?;
            Ok((refused >= 2.0 || replicas.live_pids() != pids).then_some(refused))
        },
    )
    .await;
    let refused = metric(&b.api, "xce_worker_registrations_refused")
        .await
        .unwrap();
    let refused_after = moved.elapsed();
    assert_eq!(
        replicas.live_pids(),
        pids,
        "the replica keeps running, same pid"
    );
    let cluster_a = cluster_of(&a.api).await;
    let cluster_b = cluster_of(&b.api).await;
    let text = read(&log);
    assert!(
        text.contains(&format!(
            "this controller serves cluster {cluster_b}, the worker belongs to cluster {cluster_a}"
        )) || text.contains(&format!(
            "serves cluster {cluster_b}, but this worker belongs to cluster {cluster_a}"
        )),
        "the worker's log names both clusters:\n{text}"
    );
    assert!(text.contains(&b.api.base), "and the controller:\n{text}");
    assert_eq!(registered(&text), before, "not registered with B");
    let ctl_b = read(&b.dir.path().join("controller.log"));
    assert!(
        ctl_b.contains("registration refused: the worker belongs to another cluster")
            && ctl_b.contains(&format!("worker_cluster={cluster_a}")),
        "B's log says why:\n{ctl_b}"
    );
    assert!(!ctl_b.contains("orphans"), "{ctl_b}");
    for (who, text, needle) in [
        ("worker", &text, "another cluster"),
        ("controller B", &ctl_b, "registration refused"),
    ] {
        if let Some(line) = text.lines().find(|l| l.contains(needle)) {
            eprintln!("LOG {who}: {line}");
        }
    }
    let b_hosts = hosts(&b.api).await.unwrap();
    assert_eq!(b_hosts, Value::Array(Vec::new()), "B took no host");

    // Back to A: it rejoins with its replica, still the endpoint.
    a.kill_worker(0);
    std::fs::write(&config_path, &config_a).unwrap();
    let back = std::time::Instant::now();
    a.start_worker(0).unwrap();
    eventually("exec-01 registered with A again", || async {
        Ok((registered(&read(&log)) > before).then_some(()))
    })
    .await;
    eventually("exec-01 ready in A", || async {
        let h = hosts(&a.api).await?;
        let web = jobs(&a.api, "web").await?;
        Ok((h[0]["state"] == "ready" && web == jobs_before).then_some(()))
    })
    .await;
    let rejoined = back.elapsed();
    let live = replicas.live_pids();
    let stopped = pids.iter().filter(|p| !live.contains(p)).count();
    assert_eq!(live, pids, "same pid after rejoining");
    assert_eq!(
        a.api.plain("web").await.unwrap(),
        endpoints,
        "still the endpoint in A"
    );
    // Each cluster has its own id, on /healthz and `xcecli host list`.
    let healthz = |api: Api| async move {
        let (status, headers, body) = api.get("/healthz").await.unwrap();
        assert_eq!(status, 200, "{body}");
        let mut lines = body.lines();
        assert_eq!(lines.next(), Some("ok"), "{body}");
        let id = lines
            .next()
            .and_then(|l| l.strip_prefix("cluster: "))
            .unwrap_or_else(|| panic!("no cluster line: {body}"))
            .to_owned();
        assert_eq!(headers["x-xce-cluster"], id.as_str());
        id
    };
    assert_eq!(healthz(a.api.clone()).await, cluster_a);
    assert_eq!(healthz(b.api.clone()).await, cluster_b);
    assert_ne!(cluster_a, cluster_b);
    let client = a.dir.path().join("client.toml");
    std::fs::write(
        &client,
        format!("api = \"{}\"\ntoken = \"{ADMIN}\"\n", a.api.base),
    )
    .unwrap();
    let table = xcecli_with(&client, &["host", "list"], &[]);
    assert_eq!(table.status.code(), Some(0), "{}", stderr(&table));
    assert_eq!(stderr(&table), format!("cluster: {cluster_a}\n"));
    assert!(stdout(&table).starts_with("ID "), "{}", stdout(&table));
    let json = xcecli_with(&client, &["host", "list", "-o", "json"], &[]);
    let parsed: Value = serde_json::from_str(&stdout(&json)).expect("-o json parses");
    assert_eq!(parsed["cluster"], cluster_a.as_str());
    assert!(stderr(&json).is_empty(), "{}", stderr(&json));

    eprintln!(
        "FIGURE scenario 20 foreign controller: cluster A {cluster_a}, B {cluster_b}; B refused {refused} registrations (wrong_cluster, in {} ms), replicas stopped {stopped}, pid unchanged {}, B's hosts {}, rejoined A in {} ms with the same job ready and the same endpoint {}",
        refused_after.as_millis(),
        pids[0],
        b_hosts.as_array().map_or(0, Vec::len),
        rejoined.as_millis(),
        endpoints[0]
    );
}
