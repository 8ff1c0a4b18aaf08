//! Controller high availability: two `xced controller` processes on one (private,
//! loopback) etcd, workers pointed at both; the active one is killed with SIGKILL and the
//! standby takes over from the stored state.

use crate::daemons::*;
use crate::harness::*;
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

fn web(replicas: u32) -> String {
    http_service("web", replicas).interval("500ms").toml()
}

/// job → (host, port) of the service's live jobs.
pub(crate) async fn jobs(api: &Api) -> Result<BTreeMap<String, (String, u64)>> {
    let svc = api.get_json("/v1/services/web").await?;
    svc["jobs"]
        .as_array()
        .context("jobs")?
        .iter()
        .map(|j| {
            Ok((
                j["job"].as_str().context("job")?.to_owned(),
                (
                    j["host"].as_str().context("host")?.to_owned(),
                    j["ports"]["http"].as_u64().unwrap_or(0),
                ),
            ))
        })
        .collect()
}

/// `exec-02` → 1.
fn host_index(host: &str) -> usize {
    host.trim_start_matches("exec-")
        .parse::<usize>()
        .expect("exec-NN")
        - 1
}

fn victim_ip(addr: &str) -> String {
    addr.rsplit_once(':').expect("addr:port").0.to_owned()
}

/// The endpoint entry without its index (which a takeover may move on).
async fn endpoints(api: &Api) -> Result<Value> {
    let v = api.get_json("/v1/services/web/endpoints").await?;
    Ok(v["endpoints"].clone())
}

fn log_has(path: &Path, needle: &str) -> Result<Option<()>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    Ok(text.contains(needle).then_some(()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_controller_takes_over_after_kill_9_with_the_same_jobs_ports_and_endpoints() {
    let etcd = EtcdCluster::start(1).await.expect("etcd");
    let mut ha = Fleet::new(etcd, 2, 0).expect("cluster dir");

    // The first controller leads; the second one waits and answers only /healthz.
    ha.start_controller(0).unwrap();
    ha.wait_announced(0).await;
    ha.start_controller(1).unwrap();
    let standby_log = ha.log("controller-1");
    let leader0 = format!("@127.0.0.1:{})", ha.controller_ports[0]);
    eventually("controller 1 waits as a standby", || async {
        log_has(&standby_log, "standby: waiting for leadership (leader: ")?;
        log_has(&standby_log, &leader0)
    })
    .await;
    assert_eq!(
        ha.serving_controller().unwrap(),
        0,
        "a standby must not serve the API"
    );

    ha.start_workers(2).unwrap();
    let a = ha.controller_api(0);
    eventually("2 ready hosts", || async {
        let h = a.get_json("/v1/hosts").await?;
        let ready = h["hosts"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|h| h["state"] == "ready").count());
        Ok((ready == 2).then_some(()))
    })
    .await;
    assert_eq!(a.submit_toml(&web(4)).await.unwrap().0, 201);
    let mut eps_before = a.wait_ready("web", 4).await;
    eps_before.sort();
    let jobs_before = jobs(&a).await.unwrap();
    let table_before = endpoints(&a).await.unwrap();

    // kill -9 the leader: the standby takes over once the lease runs out.
    ha.kill_9_controller(0);
    let killed = Instant::now();
    let b = ha.controller_api(1);
    eventually("controller 1 serves the table", || async {
        let (status, _, body) = b.get("/v1/services/web/endpoints?format=plain").await?;
        Ok((status == 200 && body.lines().count() == 4).then_some(()))
    })
    .await;
    let takeover = killed.elapsed();
    ha.wait_announced(1).await;

    // Both workers found the new leader; nothing moved or dropped on the way.
    for i in 0..2 {
        let log = ha.log(&format!("worker-{i}"));
        eventually(&format!("worker {i} switched"), || async {
            log_has(&log, "switched to the controller that answers")
        })
        .await;
    }
    eventually("2 ready hosts on the new leader", || async {
        let h = b.get_json("/v1/hosts").await?;
        let ready = h["hosts"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|h| h["state"] == "ready").count());
        Ok((ready == 2).then_some(()))
    })
    .await;
    let jobs_after = jobs(&b).await.unwrap();
    let reassigned = jobs_before
        .iter()
        .filter(|(job, hp)| jobs_after.get(*job) != Some(hp))
        .count();
    assert_eq!(jobs_after, jobs_before, "the same jobs on the same ports");
    assert_eq!(
        endpoints(&b).await.unwrap(),
        table_before,
        "endpoints identical"
    );
    let mut eps_after = b.plain("web").await.unwrap();
    eps_after.sort();
    let eps_changed = eps_before
        .iter()
        .filter(|e| !eps_after.contains(e))
        .chain(eps_after.iter().filter(|e| !eps_before.contains(e)))
        .count();
    assert_eq!(eps_after, eps_before);
    let host_log_ok = !std::fs::read_to_string(ha.log("controller-1"))
        .unwrap_or_default()
        .contains("host unreachable");
    assert!(
        host_log_ok,
        "a worker missed its heartbeats across the takeover"
    );
    for ep in &eps_after {
        assert!(http_ok(ep).await.unwrap(), "{ep} still serves");
    }

    // The new leader runs the cluster: a killed replica is replaced.
    let victim = eps_after[0].clone();
    kill_replica_listening_on(&victim).unwrap();
    let victim_job = jobs_after
        .iter()
        .find(|(_, (host, port))| {
            victim.ends_with(&format!(":{port}")) && ha.ip(host_index(host)) == victim_ip(&victim)
        })
        .map(|(job, _)| job.clone())
        .expect("the victim is one of the jobs");
    let replaced = eventually("the killed replica replaced", || async {
        let now = jobs(&b).await?;
        let eps = b.plain("web").await?;
        Ok((!now.contains_key(&victim_job)
            && now.len() == 4
            && eps.len() == 4
            && !eps.contains(&victim))
        .then_some(now))
    })
    .await;
    let gone: Vec<_> = jobs_before
        .keys()
        .filter(|j| !replaced.contains_key(*j))
        .collect();
    assert_eq!(
        gone,
        [&victim_job],
        "only the killed job ended: {replaced:?}"
    );

    // The old leader, restarted, is a standby of the new one.
    ha.start_controller(0).unwrap();
    let old_log = ha.log("controller-0");
    let leader1 = format!("@127.0.0.1:{})", ha.controller_ports[1]);
    eventually("the restarted controller 0 waits as a standby", || async {
        log_has(&old_log, &leader1)
    })
    .await;
    assert!(!ha.controllers[0].as_ref().unwrap().announced());

    println!(
        "FIGURE controller takeover after kill -9: {} ms (leader_ttl {LEADER_TTL}), jobs={} ports_reassigned={reassigned} endpoints_changed={eps_changed}",
        takeover.as_millis(),
        jobs_before.len()
    );
}
