//! `xced store backup` while the cluster serves, changes after it (a restart, a scale, a
//! new service), then `xced store restore` into the stopped controller: the restored
//! cluster lists no endpoint whose process does not run, reuses no job id, converges to
//! the backup's services and holds no port twice.

use crate::daemons::{EtcdCluster, Fleet};
use crate::harness::*;
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

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

fn store_cmd(config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(bin("xced"))
        .arg("store")
        .args(args)
        .arg("--config")
        .arg(config)
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

/// What the scenario needs of a cluster: where users read, the controller's config and
/// log, and stopping and starting its controller (one redb controller, or the leader of
/// an etcd fleet read through an apiserver).
trait Shape {
    fn name(&self) -> &'static str;
    fn api(&self) -> Api;
    fn config(&self) -> PathBuf;
    fn controller_log(&self) -> PathBuf;
    fn backup_dir(&self) -> &Path;
    fn stop_controller(&mut self);
    async fn start_controller(&mut self);
}

impl Shape for Cluster {
    fn name(&self) -> &'static str {
        "redb"
    }
    fn api(&self) -> Api {
        self.api.clone()
    }
    fn config(&self) -> PathBuf {
        self.dir.path().join("controller.toml")
    }
    fn controller_log(&self) -> PathBuf {
        self.dir.path().join("controller.log")
    }
    fn backup_dir(&self) -> &Path {
        self.dir.path()
    }
    fn stop_controller(&mut self) {
        terminate(self.controller.as_mut().unwrap());
        self.controller = None;
    }
    async fn start_controller(&mut self) {
        Cluster::start_controller(self).expect("the restored controller starts");
    }
}

impl Shape for Fleet {
    fn name(&self) -> &'static str {
        "etcd"
    }
    fn api(&self) -> Api {
        self.apiserver(0)
    }
    fn config(&self) -> PathBuf {
        self.dir.path().join("controller-0.toml")
    }
    fn controller_log(&self) -> PathBuf {
        self.log("controller-0")
    }
    fn backup_dir(&self) -> &Path {
        self.dir.path()
    }
    fn stop_controller(&mut self) {
        // SIGTERM: the leader resigns (its key goes), so a restore is allowed.
        if let Some(d) = self.controllers[0].as_mut() {
            terminate(&mut d.child);
        }
        self.controllers[0] = None;
    }
    async fn start_controller(&mut self) {
        self.start_leader(0).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_lists_no_dead_endpoint_reuses_no_job_id_and_converges() {
    let mut c = Cluster::new(2, "30s").expect("cluster");
    backup_change_restore(&mut c).await;
}

/// The same on etcd: a backup read from etcd at one revision while the leader serves,
/// restored into etcd after the leader resigned; users read through an `xced apiserver`,
/// which must follow the restored store (a load at a revision it never saw) and list no
/// endpoint without a process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_etcd_backup_lists_no_dead_endpoint_on_an_apiserver_and_converges() {
    let etcd = EtcdCluster::start(1).await.expect("etcd");
    let mut fleet = Fleet::new(etcd, 2, 1).expect("fleet");
    fleet.start_leader(0).await;
    fleet.start_apiserver(0).unwrap();
    fleet.start_workers(2).unwrap();
    let api = fleet.apiserver(0);
    eventually("both hosts registered", || async {
        let hosts = api.get_json("/v1/hosts").await?;
        Ok((hosts["hosts"].as_array().map(Vec::len) == Some(2)).then_some(()))
    })
    .await;
    backup_change_restore(&mut fleet).await;
}

/// Backup while serving, then a restart, a scale and a new service, then a restore: the
/// restored cluster lists no endpoint without a process from its first answer on, stops
/// what the backup does not know, reuses no job id and holds no port twice.
async fn backup_change_restore<S: Shape>(c: &mut S) {
    let api = c.api();
    assert_eq!(api.submit_toml(&web("web", 3)).await.unwrap().0, 201);
    api.wait_settled("web", 3).await;
    let at_backup = all_jobs(&api).await.unwrap();

    // Taken while the controller serves (redb: through its API, as it holds the file;
    // etcd: from etcd at one revision).
    let file = c.backup_dir().join("store.backup");
    let out = store_cmd(&c.config(), &["backup", "--to", file.to_str().unwrap()]);
    assert!(out.status.success(), "backup: {}", stderr(&out));
    assert!(
        stdout(&out).contains("records written to"),
        "{}",
        stdout(&out)
    );
    let (svc2_jobs, after_backup) = change_after_backup(&api, &at_backup).await;

    // A restore into a running controller's store is refused, changing nothing.
    let out = store_cmd(&c.config(), &["restore", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("a controller is running on")
            || stderr(&out).contains("leads on this etcd: stop every controller"),
        "{}",
        stderr(&out)
    );

    c.stop_controller();
    let out = store_cmd(&c.config(), &["restore", file.to_str().unwrap()]);
    assert!(out.status.success(), "restore: {}", stderr(&out));
    let started = Instant::now();
    c.start_controller().await;
    let (registered, reconciled, polls, probed) =
        converge(&api, &c.controller_log(), started).await;
    let (reused, twice, jobs_now) =
        check_restored(&api, &svc2_jobs, &at_backup, &after_backup).await;
    println!(
        "FIGURE restore {}: workers_registered_again_after={registered:?} converged_after={reconciled:?} polls={polls} listed_endpoints_probed_alive={probed} job_ids_reused={reused} ports_held_twice={twice} jobs_now={jobs_now}",
        c.name()
    );
}

/// After the backup: a restart (every web job replaced), a scale, a new service. Returns
/// the new service's jobs and every job id live afterwards.
async fn change_after_backup(
    api: &Api,
    at_backup: &BTreeMap<String, (String, String, u64)>,
) -> (Vec<String>, BTreeSet<String>) {
    let r = api
        .http
        .post(format!("{}/v1/services/web/restart", api.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "restart: {}", r.status());
    eventually("web restarted: none of the backup's jobs left", || async {
        let now = all_jobs(api).await?;
        let done = now.len() == 3 && now.keys().all(|j| !at_backup.contains_key(j));
        Ok(done.then_some(()))
    })
    .await;
    api.wait_settled("web", 3).await;
    assert_eq!(api.scale("web", 4).await.unwrap().0, 200);
    assert_eq!(api.submit_toml(&web("svc2", 2)).await.unwrap().0, 201);
    api.wait_settled("web", 4).await;
    api.wait_settled("svc2", 2).await;
    let jobs_after_backup = all_jobs(api).await.unwrap();
    let svc2_jobs: Vec<String> = jobs_after_backup
        .iter()
        .filter(|(_, (svc, _, _))| svc == "svc2")
        .map(|(j, _)| j.clone())
        .collect();
    assert_eq!(svc2_jobs.len(), 2);
    assert!(svc2_jobs.iter().all(|j| !pids_of_job(j).is_empty()));
    (svc2_jobs, jobs_after_backup.into_keys().collect())
}

/// Waits until every worker registered again and the restored cluster converged (web
/// alone, 3 endpoints, its rollout complete), checking on every poll that no listed
/// endpoint lacks a process. Returns both times, the number of polls and of listed
/// endpoints probed (each answered HTTP, or the test failed).
async fn converge(api: &Api, log: &Path, started: Instant) -> (Duration, Duration, u32, u32) {
    // Every worker registers again at its next heartbeat (1 s), reporting what runs.
    let registered = eventually("every worker registered again", || async {
        let text = std::fs::read_to_string(log)?;
        let done =
            text.contains("host registered again after the restore") && text.contains("left=0");
        Ok(done.then(|| started.elapsed()))
    })
    .await;
    // From its first answer on, every endpoint listed has a process behind it.
    let polls = std::sync::atomic::AtomicU32::new(0);
    let probed = std::sync::atomic::AtomicU32::new(0);
    let reconciled = eventually("the restored cluster converged", || async {
        polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for svc in ["web", "svc2"] {
            let (status, _, body) = api
                .get(&format!("/v1/services/{svc}/endpoints?format=plain"))
                .await?;
            if status == 200 {
                probed.fetch_add(
                    body.lines().count() as u32,
                    std::sync::atomic::Ordering::Relaxed,
                );
                let dead = dead_endpoints(api, svc).await?;
                assert!(
                    dead.is_empty(),
                    "{svc} lists endpoints without a process: {dead:?} of {body}"
                );
            }
        }
        let list = api.get_json("/v1/services").await?;
        let names: Vec<&str> = list["services"]
            .as_array()
            .context("services")?
            .iter()
            .filter_map(|s| s["name"].as_str())
            .collect();
        let eps = api.plain("web").await?;
        let d = api.get_json("/v1/services/web").await?;
        let done = names == ["web"] && eps.len() == 3 && d["rollout"]["state"] == "complete";
        Ok(done.then(|| started.elapsed()))
    })
    .await;
    (
        registered,
        reconciled,
        polls.into_inner(),
        probed.into_inner(),
    )
}

/// The restored cluster holds the backup's profile (3 replicas of web, no svc2: its
/// replicas drained and stopped), hands out no job id twice (a new service's jobs are new
/// ids) and holds no port twice. Returns the ids reused, the ports held twice and the jobs.
async fn check_restored(
    api: &Api,
    svc2_jobs: &[String],
    at_backup: &BTreeMap<String, (String, String, u64)>,
    after_backup: &BTreeSet<String>,
) -> (usize, usize, usize) {
    let restored = api.get_json("/v1/services/web").await.unwrap();
    assert_eq!(restored["replicas"], Value::from(3), "{restored}");
    for job in svc2_jobs {
        eventually("svc2's replicas stopped", || async {
            Ok(pids_of_job(job).is_empty().then_some(()))
        })
        .await;
    }
    assert_eq!(api.submit_toml(&web("svc3", 2)).await.unwrap().0, 201);
    api.wait_settled("svc3", 2).await;
    let now = all_jobs(api).await.unwrap();
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
            dead_endpoints(api, svc).await.unwrap(),
            Vec::<String>::new()
        );
    }
    (reused.len(), twice, now.len())
}
