//! Rollouts that mean it (issue 28, findings 7, 8 and 10), on real processes:
//!
//! - a broken update of a service without a readiness check fails and is reverted, under
//!   the default `min_ready` (10 s), and the old replicas are never replaced;
//! - a stuck rollout says why: `rollout.reason` and `xcecli service status` name the new
//!   replica and its last probe result, and the worker logs the failing probe once;
//! - 20 back-to-back rollouts of a 4-replica service do not pile up processes: a
//!   superseded replica that was never ready stops at once.

use crate::harness::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counts, every 20 ms until `stop`, the live processes whose command line has `marker`;
/// returns the highest count seen.
fn peak_sampler(marker: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !stop.load(Ordering::Relaxed) {
            peak = peak.max(pids_with_cmdline(&marker).len());
            std::thread::sleep(Duration::from_millis(20));
        }
        peak
    })
}

/// Counts, every 20 ms until `stop`, how many of the processes `old` (whose command lines
/// have `marker`) are still alive; returns the fewest seen.
fn fewest_sampler(
    marker: String,
    old: BTreeSet<u32>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut fewest = old.len();
        while !stop.load(Ordering::Relaxed) {
            let now: BTreeSet<u32> = pids_with_cmdline(&marker).into_iter().collect();
            fewest = fewest.min(old.intersection(&now).count());
            std::thread::sleep(Duration::from_millis(20));
        }
        fewest
    })
}

/// Finding 7: v1 `sleep 3600`, v2 `sh -c "sleep 2; exit 3"`, no readiness check, 3
/// replicas, nothing set in `[service.update]` (the default `min_ready`: this test keeps
/// it). `submit --wait` of v2 exited 0 in 0.2 s and every healthy replica was replaced;
/// now it fails and is reverted (exit 6), and the three v1 processes run throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_update_without_readiness_is_reverted_and_never_replaces_the_old_replicas() {
    let c = DevCluster::start(1, false).expect("dev cluster");
    let marker = format!("xce-meaning-v1-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let v1 = dir.path().join("v1.toml");
    let v2 = dir.path().join("v2.toml");
    let profile = |command: &str| {
        format!("[service]\nname = \"plain\"\nreplicas = 3\ncommand = {command}\ndrain = \"1s\"\n")
    };
    std::fs::write(
        &v1,
        profile(&format!(r#"["sh", "-c", "sleep 3600; :", "{marker}"]"#)),
    )
    .unwrap();
    std::fs::write(&v2, profile(r#"["sh", "-c", "sleep 2; exit 3"]"#)).unwrap();

    let t0 = Instant::now();
    let out = c.xcecli(&["service", "submit", v1.to_str().unwrap(), "--wait"]);
    assert!(out.status.success(), "v1: {}", stderr(&out));
    let v1_took = t0.elapsed();
    let old: BTreeSet<u32> = pids_with_cmdline(&marker).into_iter().collect();
    assert_eq!(old.len(), 3, "three v1 processes: {old:?}");

    let stop = Arc::new(AtomicBool::new(false));
    let watcher = fewest_sampler(marker.clone(), old.clone(), stop.clone());
    let t1 = Instant::now();
    let config = c.client_config.clone();
    let v2_arg = v2.to_str().unwrap().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        xcecli_with(
            &config,
            &["service", "submit", &v2_arg, "--wait", "--timeout", "3m"],
            &[],
        )
    })
    .await
    .unwrap();
    let v2_took = t1.elapsed();
    let d = c.api.get_json("/v1/services/plain").await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let fewest = watcher.join().unwrap();
    let err = stderr(&out);
    println!(
        "FIGURE rollout meaning, finding 7: v1 complete after {:.1}s; v2 submit --wait exit={:?} after {:.1}s: {}; fewest v1 processes alive during v2={fewest} of 3; rollout={}",
        v1_took.as_secs_f64(),
        out.status.code(),
        v2_took.as_secs_f64(),
        err.trim(),
        d["rollout"]
    );
    assert_eq!(out.status.code(), Some(6), "v2 must fail: {err}");
    // The default min_ready: the creation completed once every replica ran for 10 s.
    assert!(
        v1_took >= Duration::from_secs(10),
        "v1 completed after {v1_took:?}, before the default min_ready of 10 s"
    );
    assert!(err.contains("reverted"), "{err}");
    assert!(err.contains("new replicas keep exiting"), "{err}");
    assert_eq!(d["rollout"]["state"], "reverted", "{d}");
    assert_eq!(fewest, 3, "a v1 replica was replaced by the broken v2");
    let now: BTreeSet<u32> = pids_with_cmdline(&marker).into_iter().collect();
    assert_eq!(now, old, "the v1 processes are the same ones");
}

/// Finding 8: a rollout stuck on a readiness path that answers 404 said `reason: null`
/// and the worker logged nothing. Now the service detail's rollout names the new replica
/// and its last probe result, `xcecli service status` prints it, and the worker logs the
/// failing probe once (not once per probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_rollout_names_the_new_replica_and_its_last_probe() {
    let c = DevCluster::start(1, false).expect("dev cluster");
    let v1 = http_service("web", 2).toml();
    assert_eq!(c.api.submit_toml(&v1).await.unwrap().0, 201);
    c.api.wait_settled("web", 2).await;
    // v2: the same server, probed on a path it answers 404.
    let v2 = format!(
        "[service]\nname = \"web\"\nreplicas = 2\ncommand = [\"sh\", \"-c\", \"exec python3 -m http.server $XCE_PORT_HTTP --bind $XCE_HOST_IP\"]\n[[service.ports]]\nname = \"http\"\n{TEST_MIN_READY}[service.readiness]\nhttp = {{ port = \"http\", path = \"/no-such-page\" }}\ninterval = \"200ms\"\ntimeout = \"1s\"\n"
    );
    let (status, body) = c.api.put_toml("web", &v2).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let probe = "readiness GET /no-such-page answered 404";
    let d: Value = eventually("the rollout's reason naming the 404", || async {
        let d = c.api.get_json("/v1/services/web").await?;
        let reason = d["rollout"]["reason"].as_str().unwrap_or_default();
        Ok(reason.contains(probe).then_some(d))
    })
    .await;
    let reason = d["rollout"]["reason"].as_str().unwrap().to_owned();
    assert!(reason.starts_with("replica 0 ("), "{reason}");
    assert_eq!(d["rollout"]["state"], "progressing", "{d}");
    let out = c.xcecli(&["service", "status", "web"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(
        table.contains(&format!("waiting: {reason}")),
        "status does not show the reason:\n{table}"
    );
    // The worker's log: the failing probe once, although it is probed every 200 ms. The
    // replica's own log (python's access log) counts the probes.
    let job = d["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["generation"] == 2)
        .cloned()
        .expect("a v2 job");
    let replica_log = std::path::PathBuf::from(job["log"].as_str().expect("its log"));
    let probes = || {
        std::fs::read_to_string(&replica_log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("GET /no-such-page") && l.contains(" 404 "))
            .count()
    };
    let lines = || {
        c.log()
            .lines()
            .filter(|l| l.contains("last_probe") && l.contains(probe))
            .count()
    };
    let first = eventually("the worker's log line of the failing probe", || async {
        Ok((lines() > 0).then(probes))
    })
    .await;
    // Ten more probes answered 404: still one line.
    let probed = eventually("ten more probes", || async {
        let n = probes();
        Ok((n >= first + 10).then_some(n))
    })
    .await;
    let later = c.api.get_json("/v1/services/web").await.unwrap();
    let lines = lines();
    println!(
        "FIGURE rollout meaning, finding 8: reason={reason:?}; worker log lines for it={lines} after {probed} probes answered 404; xcecli status line: {:?}",
        table.lines().find(|l| l.contains("waiting:")).unwrap_or_default()
    );
    assert_eq!(lines, 1, "the failing probe is logged once per text");
    assert_eq!(later["rollout"]["reason"], d["rollout"]["reason"]);
}

/// Finding 10: 20 back-to-back rollouts of a 4-replica service ran 18 processes: every
/// superseded surge replica was drained for the full `drain` although it was never
/// ready. Now it stops at once; the peak process count is measured and printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_rollouts_do_not_pile_up_never_ready_replicas() {
    const REPLICAS: usize = 4;
    const ROLLOUTS: usize = 20;
    let c = DevCluster::start(1, false).expect("dev cluster");
    // Only this test's replicas have this directory on their command line.
    let www = tempfile::Builder::new()
        .prefix("xce-meaning-b2b-")
        .tempdir()
        .unwrap();
    let marker = www.path().to_string_lossy().into_owned();
    // Each replica takes 2 s to listen, longer than the 20 rollouts take to submit.
    let profile = |round: usize| {
        format!(
            "[service]\nname = \"b2b\"\nreplicas = {REPLICAS}\ndrain = \"2s\"\ncommand = [\"sh\", \"-c\", \"sleep 2; exec python3 -m http.server $XCE_PORT_HTTP --bind $XCE_HOST_IP --directory {marker}\"]\n[service.env]\nROUND = \"{round}\"\n[[service.ports]]\nname = \"http\"\n{TEST_MIN_READY}[service.readiness]\ntcp = \"http\"\ninterval = \"200ms\"\ntimeout = \"1s\"\n"
        )
    };
    assert_eq!(c.api.submit_toml(&profile(0)).await.unwrap().0, 201);
    c.api.wait_settled("b2b", REPLICAS).await;

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = peak_sampler(marker.clone(), stop.clone());
    let t0 = Instant::now();
    for round in 1..=ROLLOUTS {
        let (status, body) = c.api.put_toml("b2b", &profile(round)).await.unwrap();
        assert_eq!(status, 200, "rollout {round}: {body}");
    }
    let submitted = t0.elapsed();
    let generation = (ROLLOUTS + 1) as u64;
    eventually("the last rollout complete", || async {
        let d = c.api.get_json("/v1/services/b2b").await?;
        let done = d["generation"] == generation && d["rollout"]["state"] == "complete";
        Ok(done.then_some(()))
    })
    .await;
    let took = t0.elapsed();
    // The last drains end 2 s after the rollout completes; then 4 processes are left.
    eventually("only the last generation's processes left", || async {
        Ok((pids_with_cmdline(&marker).len() == REPLICAS).then_some(()))
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.join().unwrap();
    println!(
        "FIGURE rollout meaning, finding 10: {ROLLOUTS} back-to-back rollouts of {REPLICAS} replicas submitted in {:.2}s, complete after {:.1}s: peak_processes={peak} (replicas + max_surge = {})",
        submitted.as_secs_f64(),
        took.as_secs_f64(),
        REPLICAS + 1
    );
    assert!(
        peak <= 2 * REPLICAS,
        "{peak} processes at once for {REPLICAS} replicas: superseded replicas that were never ready were kept running"
    );
}
