//! Separate `xced controller` and `xced worker` processes: restarts and host loss.

use crate::harness::*;
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

const ADMIN: &str = "admin-secret-for-tests";

/// A controller and workers as separate processes, sharing a temp dir.
struct Cluster {
    dir: tempfile::TempDir,
    port: u16,
    first_ip: Ipv4Addr,
    hosts: usize,
    controller: Option<Child>,
    workers: Vec<Option<Child>>,
    api: Api,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn ip_block() -> Ipv4Addr {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    Ipv4Addr::new(127, 200 + (std::process::id() % 50) as u8, (n % 250) as u8 + 1, 11)
}

impl Cluster {
    fn new(hosts: usize, grace: &str) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let first_ip = ip_block();
        let mut tokens = format!(
            "[[token]]\nsecret = \"{ADMIN}\"\nprincipal = \"admin\"\ngrants = [ {{ permission = \"admin\", projects = [\"*\"] }} ]\n"
        );
        for i in 0..hosts {
            tokens += &format!("\n[[worker]]\nhost = \"exec-{:02}\"\nsecret = \"worker-{i}-secret\"\n", i + 1);
        }
        std::fs::write(dir.path().join("tokens.toml"), tokens)?;
        std::fs::write(
            dir.path().join("controller.toml"),
            format!(
                "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\ntokens = \"{}\"\nunreachable_after = \"2s\"\ngrace_period = \"{grace}\"\n\n[address]\nallow_loopback_hosts = [\"*\"]\n",
                dir.path().join("controller").display(),
                dir.path().join("tokens.toml").display()
            ),
        )?;
        for i in 0..hosts {
            let o = first_ip.octets();
            let ip = Ipv4Addr::new(o[0], o[1], o[2], o[3] + i as u8);
            std::fs::write(
                dir.path().join(format!("worker-{i}.toml")),
                format!(
                    "host = \"exec-{:02}\"\ncontroller = \"http://127.0.0.1:{port}\"\ncredential = \"worker-{i}-secret\"\ndata_dir = \"{}\"\nstop_timeout = \"3s\"\n\n[address]\nadvertise = \"{ip}\"\nallow_loopback = true\n",
                    i + 1,
                    dir.path().join(format!("worker-{i}")).display()
                ),
            )?;
        }
        let api = Api::new(&format!("http://127.0.0.1:{port}"), ADMIN);
        let mut c = Self { dir, port, first_ip, hosts, controller: None, workers: Vec::new(), api };
        c.start_controller()?;
        for i in 0..hosts {
            c.workers.push(None);
            c.start_worker(i)?;
        }
        Ok(c)
    }

    fn log(&self, name: &str) -> Result<Stdio> {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join(format!("{name}.log")))?;
        Ok(Stdio::from(f))
    }

    fn start_controller(&mut self) -> Result<()> {
        let mut child = Command::new(bin("xced"))
            .arg("controller")
            .arg("--config")
            .arg(self.dir.path().join("controller.toml"))
            .env("XCE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(self.log("controller")?)
            .spawn()?;
        // Wait for the announce line: the controller has restored its state and serves.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = std::time::Instant::now() + patience();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = rx.recv_timeout(left).context("controller did not announce its listener")?;
            if line.contains("apiserver listening on") {
                break;
            }
        }
        self.controller = Some(child);
        Ok(())
    }

    fn kill_controller(&mut self) {
        if let Some(mut c) = self.controller.take() {
            let _ = c.kill(); // SIGKILL: no chance to flush anything
            let _ = c.wait();
        }
    }

    fn start_worker(&mut self, i: usize) -> Result<()> {
        let child = Command::new(bin("xced"))
            .arg("worker")
            .arg("--config")
            .arg(self.dir.path().join(format!("worker-{i}.toml")))
            .env("XCE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.log(&format!("worker-{i}"))?)
            .spawn()?;
        self.workers[i] = Some(child);
        Ok(())
    }

    fn kill_worker(&mut self, i: usize) {
        if let Some(mut w) = self.workers[i].take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }

    fn host_ip(&self, i: usize) -> String {
        let o = self.first_ip.octets();
        Ipv4Addr::new(o[0], o[1], o[2], o[3] + i as u8).to_string()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Stop every service first so no replica outlives the test, then the daemons.
        if self.controller.is_some() {
            let api = self.api.clone();
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async {
                    if let Ok(list) = api.get_json("/v1/services").await {
                        for s in list["services"].as_array().cloned().unwrap_or_default() {
                            let _ = api.delete(&format!("/v1/services/{}", s["name"].as_str().unwrap_or(""))).await;
                        }
                        let _ = tokio::time::timeout(std::time::Duration::from_secs(15), async {
                            loop {
                                let n = api
                                    .get_json("/v1/services")
                                    .await
                                    .map(|l| l["services"].as_array().map_or(0, Vec::len))
                                    .unwrap_or(0);
                                if n == 0 {
                                    break;
                                }
                                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            }
                        })
                        .await;
                    }
                })
            })
            .join();
        }
        for w in self.workers.iter_mut().flatten() {
            terminate(w);
        }
        if let Some(c) = self.controller.as_mut() {
            terminate(c);
        }
        let ips: Vec<String> = (0..self.hosts).map(|i| self.host_ip(i)).collect();
        kill_leftover_replicas(&ips);
    }
}

fn web(replicas: u32) -> String {
    format!(
        "[service]\nname = \"web\"\nreplicas = {replicas}\ncommand = [\"sh\", \"-c\", \"exec python3 -m http.server $XCE_PORT_HTTP --bind $XCE_HOST_IP\"]\n[[service.ports]]\nname = \"http\"\n[service.readiness]\ntcp = \"http\"\ninterval = \"500ms\"\n"
    )
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
                (j["host"].as_str().unwrap().to_owned(), j["ports"]["http"].as_u64().unwrap_or(0)),
            )
        })
        .collect())
}

fn assert_no_port_twice(jobs: &BTreeMap<String, (String, u64)>) {
    let mut seen = BTreeSet::new();
    for (job, hp) in jobs {
        assert!(seen.insert(hp.clone()), "{hp:?} held by two live jobs (second: {job})");
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

    for cycle in 0..3 {
        c.kill_controller();
        c.start_controller().expect("restart");
        // The very first answer after the restart is the whole table, never less.
        let (status, h, body) = c.api.get("/v1/services/web/endpoints?format=plain").await.unwrap();
        assert_eq!(status, 200, "cycle {cycle}: {body}");
        let after: u64 = h["x-xce-index"].to_str().unwrap().parse().unwrap();
        assert!(after >= index, "cycle {cycle}: index went backwards {index} → {after}");
        index = after;
        let mut got: Vec<String> = body.lines().map(str::to_owned).collect();
        got.sort();
        let mut want = eps.clone();
        want.sort();
        assert_eq!(got, want, "cycle {cycle}: the endpoint table after restart");
        let after_jobs = jobs(&c.api, "web").await.unwrap();
        assert_eq!(after_jobs, before_jobs, "cycle {cycle}: jobs and their ports survive");
        assert_no_port_twice(&after_jobs);
        let hosts: Value = c.api.get_json("/v1/hosts").await.unwrap();
        let ids = |v: &Value| v["hosts"].as_array().unwrap().iter().map(|h| h["id"].clone()).collect::<Vec<_>>();
        assert_eq!(ids(&hosts), ids(&hosts_before), "cycle {cycle}: hosts survive");
    }
    for ep in &eps {
        assert!(http_ok(ep).await.unwrap(), "{ep} still serves");
    }
    println!("FIGURE controller kill -9 cycles=3 jobs_lost=0 ports_reassigned=0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_restart_within_grace_keeps_replicas_and_past_grace_replaces_them() {
    let mut c = Cluster::new(2, "6s").expect("cluster");
    assert_eq!(c.api.submit_toml(&web(2)).await.unwrap().0, 201);
    let eps = c.api.wait_ready("web", 2).await;
    let before = jobs(&c.api, "web").await.unwrap();

    // Within the grace period: the worker restarts and re-adopts; nothing changes.
    c.kill_worker(0);
    c.start_worker(0).unwrap();
    eventually("exec-01 ready again", || async {
        let hosts = c.api.get_json("/v1/hosts").await?;
        Ok((hosts["hosts"][0]["state"] == "ready").then_some(()))
    })
    .await;
    assert_eq!(jobs(&c.api, "web").await.unwrap(), before, "same jobs, same ports");
    let mut now = c.api.plain("web").await.unwrap();
    now.sort();
    let mut want = eps.clone();
    want.sort();
    assert_eq!(now, want, "endpoints kept across a worker restart");

    // Past the grace period: exec-01's replica is lost and replaced on exec-02.
    c.kill_worker(0);
    let on_other = c.host_ip(1);
    eventually("both replicas on exec-02", || async {
        let eps = c.api.plain("web").await?;
        Ok((eps.len() == 2 && eps.iter().all(|e| e.starts_with(&format!("{on_other}:")))).then_some(()))
    })
    .await;
    let replaced = jobs(&c.api, "web").await.unwrap();
    assert_no_port_twice(&replaced);

    // The old worker comes back: its orphaned replica is stopped, nothing collides.
    let orphan = eps.iter().find(|e| e.starts_with(&format!("{}:", c.host_ip(0)))).unwrap().clone();
    c.start_worker(0).unwrap();
    eventually("the orphan on exec-01 stopped", || async {
        Ok(http_ok(&orphan).await.is_err().then_some(()))
    })
    .await;
    assert_eq!(c.api.plain("web").await.unwrap().len(), 2);
    let _ = c.hosts;
}
