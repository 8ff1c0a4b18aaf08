//! `xced store backup` while the cluster serves, changes after it (a restart, a scale, a
//! new service), then `xced store restore` into the stopped controller: the restored
//! cluster lists no endpoint whose process does not run, reuses no job id, converges to
//! the backup's services and holds no port twice.

use crate::harness::*;
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Instant;

fn web(name: &str, replicas: u32) -> String {
    http_service(name, replicas).interval("500ms").toml()
}

/// job → (service, host, port) of every live job of every service.
async fn all_jobs(api: &Api) -> Result<BTreeMap<String, (String, String, u64)>> {
    let list = api.get_json("/v1/services").await?;
    let mut out = BTreeMap::new();
    for s in list["services"].as_array().context("services")? {
        let name = s["name"].as_str().context("name")?;
        let d = api.get_json(&format!("/v1/services/{name}")).await?;
        for j in d["jobs"].as_array().context("jobs")? {
            out.insert(
                j["job"].as_str().context("job")?.to_owned(),
                (
                    name.to_owned(),
                    j["host"].as_str().unwrap_or("").to_owned(),
                    j["ports"]["http"].as_u64().unwrap_or(0),
                ),
            );
        }
    }
    Ok(out)
}

fn store_cmd(c: &Cluster, args: &[&str]) -> std::process::Output {
    Command::new(bin("xced"))
        .arg("store")
        .args(args)
        .arg("--config")
        .arg(c.dir.path().join("controller.toml"))
        .env("XCE_TOKEN", ADMIN)
        .output()
        .expect("xced store runs")
}

/// The live processes of a job (their environment names it: `XCE_JOB_ID`).
fn pids_of_job(job: &str) -> Vec<u32> {
    let needle = format!("XCE_JOB_ID={job}\0");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if String::from_utf8_lossy(&env).contains(&needle) {
            pids.push(pid);
        }
    }
    pids
}

/// The listed endpoints of `service` that do not answer HTTP (no process behind them).
async fn dead_endpoints(api: &Api, service: &str) -> Result<Vec<String>> {
    let mut dead = Vec::new();
    for ep in api.plain(service).await? {
        if !http_ok(&ep).await.unwrap_or(false) {
            dead.push(ep);
        }
    }
    Ok(dead)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_lists_no_dead_endpoint_reuses_no_job_id_and_converges() {
    let mut c = Cluster::new(2, "30s").expect("cluster");
    assert_eq!(c.api.submit_toml(&web("web", 3)).await.unwrap().0, 201);
    c.api.wait_settled("web", 3).await;
    let at_backup = all_jobs(&c.api).await.unwrap();

    // Taken while the controller serves (it holds the redb file: through its API).
    let file = c.dir.path().join("store.backup");
    let out = store_cmd(&c, &["backup", "--to", file.to_str().unwrap()]);
    assert!(out.status.success(), "backup: {}", stderr(&out));
    assert!(
        stdout(&out).contains("records written to"),
        "{}",
        stdout(&out)
    );

    // Afterwards: a restart (every web job replaced), a scale, a new service.
    let r = c
        .api
        .http
        .post(format!("{}/v1/services/web/restart", c.api.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "restart: {}", r.status());
    eventually("web restarted: none of the backup's jobs left", || async {
        let now = all_jobs(&c.api).await?;
        let done = now.len() == 3 && now.keys().all(|j| !at_backup.contains_key(j));
        Ok(done.then_some(()))
    })
    .await;
    c.api.wait_settled("web", 3).await;
    assert_eq!(c.api.scale("web", 4).await.unwrap().0, 200);
    assert_eq!(c.api.submit_toml(&web("svc2", 2)).await.unwrap().0, 201);
    c.api.wait_settled("web", 4).await;
    c.api.wait_settled("svc2", 2).await;
    let jobs_after_backup = all_jobs(&c.api).await.unwrap();
    let svc2_jobs: Vec<String> = jobs_after_backup
        .iter()
        .filter(|(_, (svc, _, _))| svc == "svc2")
        .map(|(j, _)| j.clone())
        .collect();
    assert_eq!(svc2_jobs.len(), 2);
    assert!(svc2_jobs.iter().all(|j| !pids_of_job(j).is_empty()));
    let after_backup: BTreeSet<String> = jobs_after_backup.into_keys().collect();

    // A restore into a running controller's store is refused, changing nothing.
    let out = store_cmd(&c, &["restore", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("a controller is running on"),
        "{}",
        stderr(&out)
    );

    terminate(c.controller.as_mut().unwrap());
    c.controller = None;
    let out = store_cmd(&c, &["restore", file.to_str().unwrap()]);
    assert!(out.status.success(), "restore: {}", stderr(&out));
    let started = Instant::now();
    c.start_controller()
        .expect("the restored controller starts");

    // Every worker registers again at its next heartbeat (1 s), reporting what runs.
    let log = c.dir.path().join("controller.log");
    let registered = eventually("every worker registered again", || async {
        let text = std::fs::read_to_string(&log)?;
        let done =
            text.contains("host registered again after the restore") && text.contains("left=0");
        Ok(done.then(|| started.elapsed()))
    })
    .await;
    // From its first answer on, every endpoint listed has a process behind it.
    let polls = std::sync::atomic::AtomicU32::new(0);
    let reconciled = eventually("the restored cluster converged", || async {
        polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for svc in ["web", "svc2"] {
            let (status, _, body) = c
                .api
                .get(&format!("/v1/services/{svc}/endpoints?format=plain"))
                .await?;
            if status == 200 {
                let dead = dead_endpoints(&c.api, svc).await?;
                assert!(
                    dead.is_empty(),
                    "{svc} lists endpoints without a process: {dead:?} of {body}"
                );
            }
        }
        let list = c.api.get_json("/v1/services").await?;
        let names: Vec<&str> = list["services"]
            .as_array()
            .context("services")?
            .iter()
            .filter_map(|s| s["name"].as_str())
            .collect();
        let eps = c.api.plain("web").await?;
        let d = c.api.get_json("/v1/services/web").await?;
        let done = names == ["web"] && eps.len() == 3 && d["rollout"]["state"] == "complete";
        Ok(done.then(|| started.elapsed()))
    })
    .await;

    // The backup's profile: 3 replicas of web, no svc2 (its replicas drained, stopped).
    let restored = c.api.get_json("/v1/services/web").await.unwrap();
    assert_eq!(restored["replicas"], Value::from(3), "{restored}");
    for job in &svc2_jobs {
        eventually("svc2's replicas stopped", || async {
            Ok(pids_of_job(job).is_empty().then_some(()))
        })
        .await;
    }
    // No id handed out after the backup is handed out again: every live job is one the
    // backup listed or a new one.
    assert_eq!(c.api.submit_toml(&web("svc3", 2)).await.unwrap().0, 201);
    c.api.wait_settled("svc3", 2).await;
    let now = all_jobs(&c.api).await.unwrap();
    let reused: Vec<&String> = now
        .keys()
        .filter(|j| after_backup.contains(*j) && !at_backup.contains_key(*j))
        .collect();
    assert!(
        reused.is_empty(),
        "job ids reused: {reused:?} (after the backup: {after_backup:?})"
    );
    let mut held = BTreeSet::new();
    let twice = now
        .values()
        .filter(|(_, h, p)| !held.insert((h.clone(), *p)))
        .count();
    assert_eq!(twice, 0, "ports held twice: {now:?}");
    for svc in ["web", "svc3"] {
        assert_eq!(
            dead_endpoints(&c.api, svc).await.unwrap(),
            Vec::<String>::new()
        );
    }
    println!(
        "FIGURE restore redb: workers_registered_again_after={registered:?} converged_after={reconciled:?} polls={} dead_endpoints_seen=0 job_ids_reused={} ports_held_twice={twice} jobs_now={}",
        polls.into_inner(),
        reused.len(),
        now.len()
    );
}
