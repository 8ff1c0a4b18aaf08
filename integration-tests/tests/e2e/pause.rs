//! Issue 12, bug 5: a controller that was not running judges no host on that time, and
//! most hosts silent at once lose nothing (the full-disruption rule).
//!
//! - A separate `xced controller` (redb) and 2 `xced worker`s, `unreachable_after = "2s"`,
//!   `grace_period = "5s"`, 3 ready replicas; the controller is stopped (SIGSTOP) for
//!   twice the grace period, then continued: no replica stopped (same pids), no endpoint
//!   change (a blocking query opened before the pause sees none before the one the test
//!   makes once the controller has noticed its pause; the table's change counter moved
//!   by that one only), no host unreachable or lost.
//! - 3 workers, 2 of them stopped (SIGSTOP) until the controller has judged them past the
//!   grace period: their replicas leave the endpoints but nothing is lost or placed
//!   elsewhere (`xce_full_disruption 1`); continued: they serve again, nothing was
//!   restarted.

use crate::harness::*;
use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const GRACE: Duration = Duration::from_secs(5);

fn count(path: &std::path::Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .matches(needle)
        .count()
}

/// The live (job, host) pairs of `web`.
async fn jobs(api: &Api) -> Result<BTreeSet<(String, String)>> {
    let svc = api.get_json("/v1/services/web").await?;
    Ok(svc["jobs"]
        .as_array()
        .context("jobs")?
        .iter()
        .map(|j| {
            (
                j["job"].as_str().unwrap_or("").to_owned(),
                j["host"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect())
}

async fn hosts_in(api: &Api, state: &str) -> Result<usize> {
    let h = api.get_json("/v1/hosts").await?;
    Ok(h["hosts"]
        .as_array()
        .map_or(0, |a| a.iter().filter(|h| h["state"] == state).count()))
}

/// `web`'s endpoint entry: (index, ready endpoints).
async fn entry(api: &Api) -> Result<(u64, BTreeSet<(u64, String, String)>)> {
    let e = api.get_json("/v1/services/web/endpoints").await?;
    Ok((e["index"].as_u64().context("index")?, entry_endpoints(&e)))
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_paused_past_the_grace_period_stops_nothing() {
    let replicas = ReplicaDir::new();
    let c = Cluster::new(2, &format!("{}s", GRACE.as_secs())).unwrap();
    let log = c.dir.path().join("controller.log");
    let profile = replicas.profile("web", 3, "0", "500ms", 0);
    assert_eq!(c.api.submit_toml(&profile).await.unwrap().0, 201);
    c.api.wait_settled("web", 3).await;
    let pids_before = sorted(replicas.live_pids());
    assert_eq!(pids_before.len(), 3, "3 replica processes");
    let jobs_before = jobs(&c.api).await.unwrap();
    let (index_before, eps_before) = entry(&c.api).await.unwrap();
    let changes_before = metric(&c.api, "xce_endpoint_table_changes").await.unwrap();

    // A blocking query on the entry, opened before the pause: it answers at the first
    // change (its wait is longer than the test).
    let watchers = metric(&c.api, "xce_endpoint_watchers").await.unwrap();
    let wait = Duration::from_secs(600);
    let url = format!(
        "{}/v1/services/web/endpoints?index={index_before}&wait={}s",
        c.api.base,
        wait.as_secs()
    );
    let token = c.api.token.clone();
    let opened = Instant::now();
    let query = tokio::spawn(async move {
        let http = reqwest::Client::builder()
            .timeout(patience() * 2)
            .build()
            .unwrap();
        let r = http.get(url).bearer_auth(token).send().await?;
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await?;
        anyhow::Ok((status, body, opened.elapsed()))
    });
    eventually("the blocking query waits in the controller", || async {
        let n = metric(&c.api, "xce_endpoint_watchers").await?;
        Ok((n > watchers).then_some(()))
    })
    .await;

    // The fault: the controller stopped for twice the grace period (time is the fault
    // here, not a wait for a condition).
    let pid = c.controller_pid().unwrap();
    signal(pid, libc::SIGSTOP);
    let paused = Instant::now();
    tokio::time::sleep(GRACE * 2).await;
    signal(pid, libc::SIGCONT);
    let pause = paused.elapsed();
    let resumed = Instant::now();

    // Resumed, the controller notices it was not running (and judges no host on that
    // time): its judgement of the hosts happens then. Once it has, the test makes the one
    // change it expects, replica 0 failing its probe: the blocking query must answer with
    // exactly that change, so it saw no other one before.
    eventually("the controller notices its pause", || async {
        Ok((count(&log, "the controller was not running for a while") > 0).then_some(()))
    })
    .await;
    set_mode(&replicas.ctl, "web", 0, "down");
    let marked: BTreeSet<_> = eps_before.iter().filter(|e| e.0 != 0).cloned().collect();
    let (status, body, answered_after) = tokio::time::timeout(patience(), query)
        .await
        .expect("the blocking query answers the change")
        .unwrap()
        .unwrap();
    let (index_seen, eps_seen) = (body["index"].as_u64().unwrap(), entry_endpoints(&body));
    let watched_after_resume = resumed.elapsed();
    let ready_hosts = hosts_in(&c.api, "ready").await.unwrap();
    let pids_after = sorted(replicas.live_pids());
    let jobs_after = jobs(&c.api).await.unwrap();
    let (index_after, eps_after) = entry(&c.api).await.unwrap();
    let changes_after = metric(&c.api, "xce_endpoint_table_changes").await.unwrap();
    let stopped = pids_before
        .iter()
        .filter(|p| !pids_after.contains(p))
        .count();
    let (lost, unreachable, lagged) = (
        count(&log, "host lost;"),
        count(&log, "host unreachable;"),
        count(&log, "the controller was not running for a while"),
    );
    println!(
        "FIGURE pause: controller stopped {:.1} s (grace period {} s, unreachable_after 2 s)",
        pause.as_secs_f64(),
        GRACE.as_secs()
    );
    println!(
        "FIGURE pause: blocking query (index {index_before}) answered HTTP {status} after {:.1} s, {:.1} s after the resume (at the test's own change), index {index_seen}",
        answered_after.as_secs_f64(),
        watched_after_resume.as_secs_f64()
    );
    println!(
        "FIGURE pause: replicas stopped {stopped} of {}; jobs {} before, {} after, same: {}",
        pids_before.len(),
        jobs_before.len(),
        jobs_after.len(),
        jobs_before == jobs_after
    );
    println!(
        "FIGURE pause: endpoint changes {} (table change counter), index {index_before} → {index_after}, endpoints {} → {}",
        changes_after - changes_before,
        eps_before.len(),
        eps_after.len()
    );
    println!(
        "FIGURE pause: log lines: host lost {lost}, host unreachable {unreachable}, controller-lag warnings {lagged}; ready hosts {ready_hosts}"
    );
    assert_eq!(status, 200);
    assert!(
        index_seen > index_before,
        "{index_seen} after {index_before}"
    );
    assert_eq!(eps_seen, marked, "the first change is the test's own");
    assert_eq!(
        stopped, 0,
        "replicas stopped: {pids_before:?} → {pids_after:?}"
    );
    assert_eq!(jobs_after, jobs_before);
    assert_eq!(index_after, index_seen);
    assert_eq!(eps_after, marked);
    assert_eq!(
        changes_after,
        changes_before + 1.0,
        "the test's own change only"
    );
    assert_eq!((lost, unreachable), (0, 0), "see {}", log.display());
    assert!(lagged >= 1, "the controller noticed its pause");
    assert_eq!(ready_hosts, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn most_workers_stopped_past_the_grace_period_lose_nothing() {
    let replicas = ReplicaDir::new();
    let c = Cluster::new(3, &format!("{}s", GRACE.as_secs())).unwrap();
    let log = c.dir.path().join("controller.log");
    let profile = replicas.profile("web", 3, "0", "500ms", 0);
    assert_eq!(c.api.submit_toml(&profile).await.unwrap().0, 201);
    c.api.wait_ready("web", 3).await;
    let pids_before = sorted(replicas.live_pids());
    let jobs_before = jobs(&c.api).await.unwrap();
    let (_, eps_before) = entry(&c.api).await.unwrap();
    let placements_before = metric(&c.api, "xce_placements").await.unwrap();
    // Workers 1 and 2 (exec-02, exec-03) stop; exec-01 keeps talking.
    let on_stopped = jobs_before.iter().filter(|(_, h)| h != "exec-01").count();
    let hosts_with: BTreeSet<&String> = jobs_before
        .iter()
        .map(|(_, h)| h)
        .filter(|h| *h != "exec-01")
        .collect();

    let pids: Vec<u32> = (1..3)
        .map(|i| c.workers[i].as_ref().unwrap().id())
        .collect();
    for &p in &pids {
        signal(p, libc::SIGSTOP);
    }
    let stopped_at = Instant::now();
    // Past the grace period the stopped hosts' replicas leave the endpoints (nobody has
    // heard of them for that long), and the controller says it keeps them.
    let left = eventually(
        "the stopped hosts' replicas leave the endpoints",
        || async {
            let lost = count(&log, "host lost;");
            assert_eq!(lost, 0, "a host was declared lost: see {}", log.display());
            let (_, eps) = entry(&c.api).await?;
            let kept = count(
                &log,
                "host silent past the grace period during a full disruption",
            );
            Ok((eps.len() == 3 - on_stopped && kept == hosts_with.len())
                .then(|| stopped_at.elapsed()))
        },
    )
    .await;
    // The controller's own judgement of each stopped host past its grace period, logged
    // above ("not declared lost, its replicas are kept"), is the moment a host would have
    // been lost and its replicas placed elsewhere: what it did then is what it does.
    let disruption = metric(&c.api, "xce_full_disruption").await.unwrap();
    let unreachable = hosts_in(&c.api, "unreachable").await.unwrap();
    let jobs_during = jobs(&c.api).await.unwrap();
    let placements_during = metric(&c.api, "xce_placements").await.unwrap();

    for &p in &pids {
        signal(p, libc::SIGCONT);
    }
    let continued = Instant::now();
    let back = eventually("every replica an endpoint again", || async {
        let (_, eps) = entry(&c.api).await?;
        Ok((eps == eps_before).then(|| continued.elapsed()))
    })
    .await;
    eventually("the disruption is over", || async {
        let d = metric(&c.api, "xce_full_disruption").await?;
        Ok((d == 0.0).then_some(()))
    })
    .await;
    let jobs_after = jobs(&c.api).await.unwrap();
    let pids_after = sorted(replicas.live_pids());
    let placements_after = metric(&c.api, "xce_placements").await.unwrap();
    let lost = count(&log, "host lost;");
    let (started, ended) = (
        count(&log, "full disruption: most hosts are unreachable"),
        count(&log, "full disruption over"),
    );
    println!(
        "FIGURE disruption: 2 of 3 workers stopped; their {on_stopped} replicas left the endpoints {:.1} s after the stop (grace period {} s)",
        left.as_secs_f64(),
        GRACE.as_secs()
    );
    println!(
        "FIGURE disruption: during it: xce_full_disruption {disruption}, unreachable hosts {unreachable}, jobs same: {}, placements {}",
        jobs_during == jobs_before,
        placements_during - placements_before
    );
    println!(
        "FIGURE disruption: continued after {:.1} s stopped; every replica an endpoint again {:.1} s later; replicas restarted {}, placements {}, jobs same: {}",
        (continued - stopped_at).as_secs_f64(),
        back.as_secs_f64(),
        pids_before.iter().filter(|p| !pids_after.contains(p)).count(),
        placements_after - placements_before,
        jobs_after == jobs_before
    );
    println!(
        "FIGURE disruption: log lines: host lost {lost}, disruption started {started}, ended {ended}"
    );
    assert_eq!(disruption, 1.0);
    assert_eq!(unreachable, 2);
    assert_eq!(jobs_during, jobs_before);
    assert_eq!(placements_during, placements_before);
    assert_eq!(jobs_after, jobs_before);
    assert_eq!(pids_after, pids_before);
    assert_eq!(placements_after, placements_before);
    assert_eq!(lost, 0);
    assert_eq!((started, ended), (1, 1));
}
