//! Separate `xced controller` and `xced worker` processes: restarts and host loss.

use crate::harness::*;
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

fn web(replicas: u32) -> String {
    http_service("web", replicas).interval("500ms").toml()
}

/// (job → (host, port)) of a service's live jobs.
async fn jobs(api: &Api, service: &str) -> Result<BTreeMap<String, (String, u64)>> {
    let svc = api.get_json(&format!("/v1/services/{service}")).await?;
    Ok(svc["jobs"]
        .as_array()
        .context("jobs")?
        .iter()
        .map(|j| {
            (
                j["job"].as_str().unwrap().to_owned(),
                (
                    j["host"].as_str().unwrap().to_owned(),
                    j["ports"]["http"].as_u64().unwrap_or(0),
                ),
            )
        })
        .collect())
}

/// How many live jobs hold a (host, port) another one holds too.
fn ports_twice(jobs: &BTreeMap<String, (String, u64)>) -> usize {
    let mut seen = BTreeSet::new();
    jobs.values().filter(|hp| !seen.insert(*hp)).count()
}

fn assert_no_port_twice(jobs: &BTreeMap<String, (String, u64)>) {
    let mut seen = BTreeSet::new();
    for (job, hp) in jobs {
        assert!(
            seen.insert(hp.clone()),
            "{hp:?} held by two live jobs (second: {job})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_kill_9_loses_nothing_and_never_serves_a_partial_table() {
    let mut c = Cluster::new(2, "30s").expect("cluster");
    assert_eq!(c.api.submit_toml(&web(4)).await.unwrap().0, 201);
    let eps = c.api.wait_ready("web", 4).await;
    let before_jobs = jobs(&c.api, "web").await.unwrap();
    let hosts_before: Value = c.api.get_json("/v1/hosts").await.unwrap();
    let (_, h, _) = c.api.get("/v1/services/web/endpoints").await.unwrap();
    let mut index: u64 = h["x-xce-index"].to_str().unwrap().parse().unwrap();

    let (mut cycles, mut jobs_lost, mut ports_reassigned) = (0, 0, 0);
    for cycle in 0..3 {
        c.kill_controller();
        c.start_controller().expect("restart");
        // The very first answer after the restart is the whole table, never less.
        let (status, h, body) = c
            .api
            .get("/v1/services/web/endpoints?format=plain")
            .await
            .unwrap();
        assert_eq!(status, 200, "cycle {cycle}: {body}");
        let after: u64 = h["x-xce-index"].to_str().unwrap().parse().unwrap();
        assert!(
            after >= index,
            "cycle {cycle}: index went backwards {index} → {after}"
        );
        index = after;
        let mut got: Vec<String> = body.lines().map(str::to_owned).collect();
        got.sort();
        let mut want = eps.clone();
        want.sort();
        assert_eq!(got, want, "cycle {cycle}: the endpoint table after restart");
        let after_jobs = jobs(&c.api, "web").await.unwrap();
        cycles += 1;
        jobs_lost += before_jobs
            .keys()
            .filter(|j| !after_jobs.contains_key(*j))
            .count();
        ports_reassigned += before_jobs
            .iter()
            .filter(|(j, hp)| after_jobs.get(*j).is_some_and(|a| a != *hp))
            .count();
        assert_eq!(
            after_jobs, before_jobs,
            "cycle {cycle}: jobs and their ports survive"
        );
        assert_no_port_twice(&after_jobs);
        let hosts: Value = c.api.get_json("/v1/hosts").await.unwrap();
        let ids = |v: &Value| {
            v["hosts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h["id"].clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            ids(&hosts),
            ids(&hosts_before),
            "cycle {cycle}: hosts survive"
        );
    }
    for ep in &eps {
        assert!(http_ok(ep).await.unwrap(), "{ep} still serves");
    }
    println!(
        "FIGURE controller kill -9 cycles={cycles} jobs_lost={jobs_lost} ports_reassigned={ports_reassigned}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_restart_within_grace_keeps_replicas_and_past_grace_replaces_them() {
    let mut c = Cluster::new(2, "6s").expect("cluster");
    assert_eq!(c.api.submit_toml(&web(2)).await.unwrap().0, 201);
    let eps = c.api.wait_ready("web", 2).await;
    let before = jobs(&c.api, "web").await.unwrap();

    // Within the grace period: the worker restarts and re-adopts; nothing changes.
    let (_, h, _) = c.api.get("/v1/services/web/endpoints").await.unwrap();
    let index_before: u64 = h["x-xce-index"].to_str().unwrap().parse().unwrap();
    let restarted = std::time::Instant::now();
    c.kill_worker(0);
    c.start_worker(0).unwrap();
    // The restarted worker has registered again and re-adopted its replica.
    let log = c.dir.path().join("worker-0.log");
    eventually("exec-01 registered again", || async {
        let text = std::fs::read_to_string(&log)?;
        Ok((text.matches("registered with the controller").count() >= 2
            && text.contains("re-adopted running replica"))
        .then_some(()))
    })
    .await;
    eventually("exec-01 ready again", || async {
        let hosts = c.api.get_json("/v1/hosts").await?;
        Ok((hosts["hosts"][0]["state"] == "ready").then_some(()))
    })
    .await;
    let same_jobs_same_ports = jobs(&c.api, "web").await.unwrap() == before;
    assert!(same_jobs_same_ports, "same jobs, same ports");
    let mut now = c.api.plain("web").await.unwrap();
    now.sort();
    let mut want = eps.clone();
    want.sort();
    let kept = want.iter().filter(|e| now.contains(e)).count();
    assert_eq!(now, want, "endpoints kept across a worker restart");
    let rejoined = restarted.elapsed();
    let (_, h, _) = c.api.get("/v1/services/web/endpoints").await.unwrap();
    let index_after: u64 = h["x-xce-index"].to_str().unwrap().parse().unwrap();
    for ep in &eps {
        assert!(http_ok(ep).await.unwrap(), "{ep} kept running");
    }

    // Past the grace period: exec-01's replica is lost and replaced on exec-02.
    let lost_at = std::time::Instant::now();
    c.kill_worker(0);
    let on_other = c.host_ip(1);
    eventually("both replicas on exec-02", || async {
        let eps = c.api.plain("web").await?;
        Ok(
            (eps.len() == 2 && eps.iter().all(|e| e.starts_with(&format!("{on_other}:"))))
                .then_some(()),
        )
    })
    .await;
    let replaced_after = lost_at.elapsed();
    let replaced = jobs(&c.api, "web").await.unwrap();
    let collisions_past_grace = ports_twice(&replaced);
    assert_no_port_twice(&replaced);
    // The lost replica's port is released on exec-01.
    let used = ports_used(&c.api).await.unwrap();
    let held_on_lost_host = used["exec-01"];
    assert_eq!(
        used["exec-01"], 0,
        "the lost replica's port is released: {used:?}"
    );

    // The old worker comes back: its orphaned replica is stopped, nothing collides.
    let orphans: Vec<String> = eps
        .iter()
        .filter(|e| e.starts_with(&format!("{}:", c.host_ip(0))))
        .cloned()
        .collect();
    assert!(!orphans.is_empty(), "exec-01 ran a replica: {eps:?}");
    c.start_worker(0).unwrap();
    for orphan in &orphans {
        eventually("the orphan on exec-01 stopped", || async {
            Ok(http_ok(orphan).await.is_err().then_some(()))
        })
        .await;
    }
    let mut after = c.api.plain("web").await.unwrap();
    after.sort();
    assert_eq!(after.len(), 2);
    let back = jobs(&c.api, "web").await.unwrap();
    assert_eq!(back, replaced, "the returning worker changes nothing");
    let collisions_back = ports_twice(&back);
    assert_no_port_twice(&back);
    let leaked = stop_all_and_count_leaks(&c.api).await;
    println!(
        "FIGURE scenario 2 worker restart: grace=6s within_grace: rejoined_and_readopted_after={rejoined:?} endpoints_kept={kept}/{} endpoint_index_changes={} same_jobs_same_ports={same_jobs_same_ports}; past_grace: replaced_on_other_host_after={replaced_after:?} ports_still_held_on_lost_host={held_on_lost_host} collisions={collisions_past_grace}; old_worker_back: orphans_stopped={} collisions={collisions_back} leaked_ports={leaked}",
        want.len(),
        index_after - index_before,
        orphans.len(),
    );
}
