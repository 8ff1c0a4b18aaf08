//! Failure causes where the operator looks (issue 12, usability 5): a replica that cannot
//! be started, one that exits 3 and one killed with SIGKILL each show, in
//! `GET /v1/services/{name}` and `xcecli service status NAME`, the cause, when it
//! happened, how many restarts, and the path of the log file on the host — which exists
//! and holds the replica's output.

use crate::harness::*;
use serde_json::Value;
use std::time::Instant;

/// `replica_status[0]` of `service` once `done` holds of it.
async fn slot_when(api: &Api, service: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let path = format!("/v1/services/{service}");
    eventually(what, || async {
        let svc = api.get_json(&path).await?;
        let slot = svc["replica_status"][0].clone();
        Ok(done(&slot).then_some(slot))
    })
    .await
}

fn restarts(slot: &Value) -> u64 {
    slot["restarts"].as_u64().unwrap_or(0)
}

async fn submit(api: &Api, name: &str, command: &str) {
    let toml = format!("[service]\nname = \"{name}\"\nreplicas = 1\ncommand = {command}\n");
    let (status, body) = api.submit_toml(&toml).await.unwrap();
    assert_eq!(status, 201, "{body}");
}

/// `xcecli service status NAME` (table), checked to succeed.
fn status_table(c: &DevCluster, name: &str) -> String {
    let out = c.xcecli(&["service", "status", name]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_why_replicas_end_when_how_often_and_where_their_log_is() {
    let c = DevCluster::start(1, false).expect("dev cluster");
    let api = &c.api;
    // A marker only this test's victim has on its command line.
    let marker = format!("xce-causes-victim-{}", std::process::id());
    let t0 = Instant::now();
    submit(
        api,
        "missing",
        r#"["no-such-binary-xyz", "--port", "8080"]"#,
    )
    .await;
    submit(
        api,
        "exit3",
        r#"["sh", "-c", "echo out-of-exit3; echo err-of-exit3 >&2; exit 3"]"#,
    )
    .await;
    submit(
        api,
        "victim",
        &format!(r#"["sh", "-c", "echo victim-up; while :; do sleep 1; done", "{marker}"]"#),
    )
    .await;

    // 1. A program that is not there: the start error, with argv[0], and a restart count
    //    that keeps rising (each failed start is a restart after the backoff).
    let spawn_error = "cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)";
    let first = slot_when(api, "missing", "the spawn error of missing", |s| {
        s["last_exit"]["error"] == spawn_error
    })
    .await;
    let first_seen = t0.elapsed();
    // Two more failed starts, each after its backoff (1s, 2s, 4s, ...).
    let mut seen = vec![(restarts(&first), first_seen)];
    let mut later = first.clone();
    for _ in 0..2 {
        let before = restarts(&later);
        later = slot_when(api, "missing", "a rising restart count", |s| {
            restarts(s) > before
        })
        .await;
        seen.push((restarts(&later), t0.elapsed()));
    }
    assert_eq!(later["last_exit"]["code"], 127, "{later}");
    assert_eq!(later["last_exit"]["summary"], spawn_error, "{later}");
    let log = later["log"].as_str().expect("a log path").to_owned();
    assert!(log.starts_with('/'), "absolute: {log}");
    let text = std::fs::read_to_string(&log).expect("the log file exists");
    assert!(text.contains(spawn_error), "the log says why: {text:?}");
    let svc = api.get_json("/v1/services/missing").await.unwrap();
    let pending = svc["pending"][0]["reason"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let table = status_table(&c, "missing");
    println!("{table}");
    assert!(table.contains(spawn_error), "{table}");
    assert!(table.contains(&log), "{table}");
    assert!(table.contains(" ago "), "{table}");
    let seen: Vec<String> = seen
        .iter()
        .map(|(n, t)| format!("{n} at {:.1}s", t.as_secs_f64()))
        .collect();
    println!(
        "FIGURE missing: restarts seen (after submit): {}; pending reason: {pending:?}",
        seen.join(", ")
    );

    // 2. A replica that exits 3: the code; its log holds its stdout and stderr.
    let slot = slot_when(api, "exit3", "exit 3 of exit3", |s| {
        s["last_exit"]["code"] == 3
    })
    .await;
    assert_eq!(slot["last_exit"]["summary"], "exit 3", "{slot}");
    assert_eq!(slot["last_exit"]["signal"], Value::Null, "{slot}");
    let log = slot["log"].as_str().expect("a log path").to_owned();
    let text = std::fs::read_to_string(&log).expect("the log file exists");
    assert!(
        text.contains("out-of-exit3") && text.contains("err-of-exit3"),
        "{log}: {text:?}"
    );
    let table = status_table(&c, "exit3");
    assert!(table.contains(": exit 3"), "{table}");
    let svc = api.get_json("/v1/services/exit3").await.unwrap();
    let reasons: Vec<&str> = svc["pending"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["reason"].as_str())
        .collect();
    println!(
        "FIGURE exit3: restarts {}, last exit {:?} at {}, log {log} ({} bytes); pending {reasons:?}",
        restarts(&slot),
        slot["last_exit"]["summary"].as_str().unwrap_or(""),
        slot["last_exit"]["at"].as_str().unwrap_or(""),
        text.len()
    );

    // 3. A replica killed with SIGKILL from outside: the signal, by name.
    let pid = eventually("the victim running", || async {
        let svc = api.get_json("/v1/services/victim").await?;
        let running = svc["jobs"][0]["state"] == "running";
        let pids = pids_with_cmdline(&marker);
        Ok((running && pids.len() == 1).then(|| pids[0]))
    })
    .await;
    let before = api.get_json("/v1/services/victim").await.unwrap();
    assert_eq!(restarts(&before["replica_status"][0]), 0, "{before}");
    let log = before["jobs"][0]["log"]
        .as_str()
        .expect("the job's log")
        .to_owned();
    let killed_at = Instant::now();
    signal(pid, libc::SIGKILL);
    let slot = slot_when(api, "victim", "the SIGKILL of victim", |s| {
        s["last_exit"]["signal_name"] == "SIGKILL"
    })
    .await;
    let seen = killed_at.elapsed();
    assert_eq!(slot["last_exit"]["signal"], 9, "{slot}");
    assert_eq!(restarts(&slot), 1, "{slot}");
    assert_eq!(slot["last_exit"]["code"], Value::Null, "{slot}");
    let text = std::fs::read_to_string(&log).expect("the log file exists");
    assert!(text.contains("victim-up"), "{log}: {text:?}");
    let table = status_table(&c, "victim");
    println!("{table}");
    assert!(table.contains("SIGKILL (signal 9)"), "{table}");
    // -o json is the API's answer.
    let out = c.xcecli(&["service", "status", "victim", "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json["replica_status"][0]["last_exit"]["signal_name"], "SIGKILL",
        "{json}"
    );
    println!(
        "FIGURE victim: SIGKILL shown {}ms after the kill; restarts {}",
        seen.as_millis(),
        restarts(&slot)
    );

    // The restarts are counted in the metrics too.
    let counted = eventually("restarts in /metrics", || async {
        let n = metric(api, "xce_replica_restarts").await?;
        Ok((n >= 3.0).then_some(n))
    })
    .await;
    println!("FIGURE xce_replica_restarts_total summed over the 3 services: {counted}");
}

/// The history is stored with the service: a controller killed with SIGKILL and started
/// again (separate daemons, the redb store) shows the same restart count, the same last
/// exit (its time included) and the same log path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_exit_survives_a_controller_kill() {
    let mut c = Cluster::new(1, "30s").expect("cluster");
    let flag = c.dir.path().join("exited-once");
    // Exits 3 the first time, runs for good the second: exactly one restart.
    let toml = format!(
        "[service]\nname = \"once\"\nreplicas = 1\ncommand = [\"sh\", \"-c\", \"echo start; if [ -e '{f}' ]; then exec sleep 1000; fi; touch '{f}'; exit 3\"]\n",
        f = flag.display()
    );
    let (status, body) = c.api.submit_toml(&toml).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let before = eventually("one exit 3, and the replacement running", || async {
        let svc = c.api.get_json("/v1/services/once").await?;
        let slot = &svc["replica_status"][0];
        let running = svc["jobs"][0]["state"] == "running";
        Ok((running && slot["last_exit"]["code"] == 3).then(|| slot.clone()))
    })
    .await;
    assert_eq!(restarts(&before), 1, "{before}");
    let worker_logs = std::fs::canonicalize(c.dir.path().join("worker-0/logs")).unwrap();
    let log = before["log"].as_str().expect("the log of the running job");
    assert!(
        log.starts_with(&worker_logs.display().to_string()),
        "{log} is in {}",
        worker_logs.display()
    );

    c.kill_controller();
    let t = Instant::now();
    c.start_controller().expect("controller starts again");
    let after = c.api.get_json("/v1/services/once").await.unwrap();
    let after = &after["replica_status"][0];
    println!(
        "FIGURE reload: controller back {}ms after SIGKILL; before {before}; after {after}",
        t.elapsed().as_millis()
    );
    assert_eq!(
        after, &before,
        "the slot's history is read back from the store"
    );
}
