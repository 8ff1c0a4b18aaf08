//! Processes the multi-process tests on etcd share: an etcd cluster of their own, `xced`
//! daemons whose announce line is watched, and [`Fleet`], the controllers, apiservers and
//! workers of one cluster on that etcd.

use crate::harness::*;
use anyhow::{Context, Result};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An etcd cluster of N members on loopback (the test kit's), each with its own data dir
/// (on tmpfs when there is one); every member is killed when dropped.
pub struct EtcdCluster {
    etcd: testkit::etcd::Etcd,
    clients: Vec<String>,
}

impl EtcdCluster {
    pub async fn start(n: usize) -> Result<Self> {
        Self::start_with(n, &[]).await
    }

    /// As [`start`](Self::start), with `extra` flags for every member
    /// (`--max-txn-ops=8`).
    pub async fn start_with(n: usize, extra: &[&str]) -> Result<Self> {
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        // The kit waits for the members with blocking calls: off the runtime's threads.
        let etcd = tokio::task::spawn_blocking(move || {
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            testkit::etcd::Etcd::start_with(n, &extra)
        })
        .await??;
        let clients = etcd.endpoints().to_vec();
        Ok(Self { etcd, clients })
    }

    /// How many members it started with.
    pub fn members(&self) -> usize {
        self.etcd.members()
    }

    /// Member `m`'s name (`m0`, `m1`, …).
    pub fn name(&self, m: usize) -> String {
        self.etcd.name(m)
    }

    /// `etcd://m1,m2,m3`.
    pub fn url(&self) -> String {
        self.etcd.url()
    }

    pub fn log(&self, m: usize) -> PathBuf {
        self.etcd.log(m)
    }

    /// Member `m`'s status: (its id, the raft leader's id).
    pub async fn status(&self, m: usize) -> Result<(String, String)> {
        let v: Value = reqwest::Client::new()
            .post(format!("http://{}/v3/maintenance/status", self.clients[m]))
            .body("{}")
            .timeout(Duration::from_secs(2))
            .send()
            .await?
            .json()
            .await?;
        let id = v["header"]["member_id"].as_str().context("member_id")?;
        let leader = v["leader"].as_str().context("leader")?;
        Ok((id.to_owned(), leader.to_owned()))
    }

    /// Moves the raft leadership to member `m` (etcd's move-leader), so that killing `m`
    /// costs the cluster an election as well as the endpoint every client tries first.
    pub async fn make_leader(&self, m: usize) {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        eventually(&format!("etcd member {} leads", self.name(m)), || async {
            let (id, leader) = self.status(m).await?;
            if id == leader {
                return Ok(Some(()));
            }
            for ep in &self.clients {
                // Only the leader accepts it; the others answer "not leader".
                let _ = http
                    .post(format!("http://{ep}/v3/maintenance/transfer-leadership"))
                    .body(format!(r#"{{"targetID":"{id}"}}"#))
                    .send()
                    .await;
            }
            Ok(None)
        })
        .await;
    }

    /// Member `m`'s process id (for SIGSTOP/SIGCONT), while it runs.
    pub fn pid(&self, m: usize) -> Option<u32> {
        self.etcd.pid(m)
    }

    pub fn kill_9(&mut self, m: usize) {
        self.etcd.kill_9(m);
    }

    /// Starts member `m` again after [`kill_9`](Self::kill_9) (it rejoins from its data).
    #[allow(dead_code)] // the robustness suite's, which shares this file
    pub fn restart(&mut self, m: usize) -> Result<()> {
        self.etcd.restart(m)
    }

    /// Every member's client address, `127.0.0.1:PORT`.
    #[allow(dead_code)] // the robustness suite's, which shares this file
    pub fn endpoints(&self) -> &[String] {
        &self.clients
    }
}

/// `GET /healthz` on `127.0.0.1:port` (blocking, short timeouts): the status and body,
/// `None` when nothing answers.
pub fn healthz(port: u16) -> Option<(u16, String)> {
    testkit::http::get(port, "/healthz")
}

/// A daemon whose stdout a thread reads; it notes when the announce line came.
pub struct Daemon {
    pub child: Child,
    announced: Arc<Mutex<Option<Instant>>>,
}

impl Daemon {
    /// When the daemon printed `xced: apiserver listening on` (it serves).
    pub fn announced_at(&self) -> Option<Instant> {
        *self.announced.lock().unwrap()
    }
}

/// `xced ARGS --config CONFIG`, its stderr appended to `log`, marked as `owner`'s.
/// `xced` is the binary: this build's (`bin("xced")`) or another release's (an upgrade).
pub fn spawn_xced_from(
    xced: &Path,
    args: &[&str],
    config: &Path,
    log: &Path,
    owner: &Owner,
) -> Result<Daemon> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let mut child = owner
        .mark(&mut Command::new(xced))
        .args(args)
        .arg("--config")
        .arg(config)
        .env("XCE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()?;
    let stdout = child.stdout.take().context("piped stdout")?;
    let announced = Arc::new(Mutex::new(None));
    let seen = announced.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("apiserver listening on") {
                seen.lock().unwrap().get_or_insert_with(Instant::now);
            }
        }
    });
    Ok(Daemon { child, announced })
}

impl Daemon {
    /// Whether the daemon announced that it serves.
    pub fn announced(&self) -> bool {
        self.announced_at().is_some()
    }
}

/// Prints the last 60 lines of each log: a failed run leaves only its panic message in
/// CI otherwise.
pub fn dump_logs(logs: &[(String, PathBuf)]) {
    for (name, path) in logs {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("----- {name}.log (last 60 lines) -----");
        for l in &lines[lines.len().saturating_sub(60)..] {
            eprintln!("{l}");
        }
    }
}

/// The leader lease TTL the fleet's controllers run with (a standby takes over about this
/// long after the leader dies).
pub const LEADER_TTL: &str = "3s";

/// Two controllers (one leads, the other waits), `apiservers` apiservers and some workers
/// on one etcd, configured in a temp dir; started one by one by the test. The workers talk
/// to the apiservers when there are any (which forward to the leader), else to both
/// controllers. Dropped: every daemon and every replica killed ([`teardown`]), then etcd;
/// on a panic every daemon's log is printed first.
pub struct Fleet {
    pub dir: tempfile::TempDir,
    pub controller_ports: [u16; 2],
    pub apiserver_ports: Vec<u16>,
    first_ip: std::net::Ipv4Addr,
    /// Held until the fleet's processes are dead (fields drop after `drop`).
    _block: IpBlock,
    owner: Owner,
    pub controllers: [Option<Daemon>; 2],
    pub apiservers: Vec<Option<Daemon>>,
    pub workers: Vec<Child>,
    pub etcd: Option<EtcdCluster>,
}

impl Fleet {
    pub fn new(etcd: EtcdCluster, workers: usize, apiservers: usize) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let owner = Owner::within(dir.path());
        let block = IpBlock::claim();
        let controller_ports = [free_port(), free_port()];
        let apiserver_ports: Vec<u16> = (0..apiservers).map(|_| free_port()).collect();
        let store = etcd.url();
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, admin_and_worker_tokens(workers))?;
        for (c, port) in controller_ports.iter().enumerate() {
            std::fs::write(
                dir.path().join(format!("controller-{c}.toml")),
                format!(
                    "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\ntokens = \"{}\"\nstore = \"{store}\"\nleader_ttl = \"{LEADER_TTL}\"\nunreachable_after = \"3s\"\ngrace_period = \"30s\"\n\n[address]\nallow_loopback_hosts = [\"*\"]\n",
                    dir.path().join(format!("controller-{c}")).display(),
                    tokens.display(),
                ),
            )?;
        }
        for (a, port) in apiserver_ports.iter().enumerate() {
            std::fs::write(
                dir.path().join(format!("apiserver-{a}.toml")),
                format!(
                    "listen = \"127.0.0.1:{port}\"\ntokens = \"{}\"\nstore = \"{store}\"\n",
                    tokens.display(),
                ),
            )?;
        }
        let talk_to = if apiserver_ports.is_empty() {
            &controller_ports[..]
        } else {
            &apiserver_ports[..]
        };
        let talk_to = talk_to
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let fleet = Self {
            dir,
            controller_ports,
            apiservers: apiserver_ports.iter().map(|_| None).collect(),
            apiserver_ports,
            first_ip: block.first(),
            _block: block,
            owner,
            controllers: [None, None],
            workers: Vec::new(),
            etcd: Some(etcd),
        };
        for i in 0..workers {
            std::fs::write(
                fleet.dir.path().join(format!("worker-{i}.toml")),
                format!(
                    "host = \"exec-{:02}\"\ncontroller = \"{talk_to}\"\ncredential = \"worker-{i}-example-secret\"\ndata_dir = \"{}\"\nstop_timeout = \"3s\"\n\n[address]\nadvertise = \"{}\"\nallow_loopback = true\n",
                    i + 1,
                    fleet.dir.path().join(format!("worker-{i}")).display(),
                    fleet.ip(i),
                ),
            )?;
        }
        Ok(fleet)
    }

    /// The advertised address of worker `i` (`exec-0{i+1}`).
    pub fn ip(&self, i: usize) -> String {
        let o = self.first_ip.octets();
        std::net::Ipv4Addr::new(o[0], o[1], o[2], o[3] + i as u8).to_string()
    }

    /// Controller `c`'s own listener (it only listens while it leads).
    pub fn controller_api(&self, c: usize) -> Api {
        Api::new(
            &format!("http://127.0.0.1:{}", self.controller_ports[c]),
            ADMIN,
        )
    }

    pub fn apiserver(&self, a: usize) -> Api {
        Api::new(
            &format!("http://127.0.0.1:{}", self.apiserver_ports[a]),
            ADMIN,
        )
    }

    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    fn spawn(&self, kind: &str, name: &str) -> Result<Daemon> {
        self.spawn_from(&bin("xced"), kind, name)
    }

    /// Daemon `name` (its config `NAME.toml`, its log `NAME.log`, appended to) of kind
    /// `kind`, run by the `xced` at `xced`: a build of another release, for an upgrade.
    pub fn spawn_from(&self, xced: &Path, kind: &str, name: &str) -> Result<Daemon> {
        spawn_xced_from(
            xced,
            &[kind],
            &self.dir.path().join(format!("{name}.toml")),
            &self.log(name),
            &self.owner,
        )
    }

    pub fn start_controller(&mut self, c: usize) -> Result<()> {
        self.controllers[c] = Some(self.spawn("controller", &format!("controller-{c}"))?);
        Ok(())
    }

    /// Starts controller `c` and waits until it serves (the first controller on an etcd
    /// leads).
    pub async fn start_leader(&mut self, c: usize) {
        self.start_controller(c).unwrap();
        self.wait_announced(c).await;
    }

    /// Waits until controller `c` has announced that it serves (it leads). The
    /// announcement is read from its stdout by a harness thread, which a busy machine may
    /// run after the controller already answers: wait for it, never assert it.
    pub async fn wait_announced(&self, c: usize) {
        eventually(
            &format!("controller {c} announces that it serves"),
            || async {
                Ok(self.controllers[c]
                    .as_ref()
                    .is_some_and(Daemon::announced)
                    .then_some(()))
            },
        )
        .await;
    }

    /// Starts controller 0 and waits until it serves, then controller 1 and waits until
    /// it logs that it waits as a standby.
    pub async fn start_leader_and_standby(&mut self) {
        self.start_leader(0).await;
        self.start_controller(1).unwrap();
        let standby_log = self.log("controller-1");
        eventually("controller 1 waits as a standby", || async {
            let text = std::fs::read_to_string(&standby_log).unwrap_or_default();
            Ok(text
                .contains("standby: waiting for leadership")
                .then_some(()))
        })
        .await;
    }

    pub fn start_apiserver(&mut self, a: usize) -> Result<()> {
        self.apiservers[a] = Some(self.spawn("apiserver", &format!("apiserver-{a}"))?);
        Ok(())
    }

    pub fn start_workers(&mut self, n: usize) -> Result<()> {
        for i in 0..n {
            self.start_worker(i)?;
        }
        Ok(())
    }

    /// Starts worker `i`, the next one (`i` is how many were started before).
    pub fn start_worker(&mut self, i: usize) -> Result<()> {
        assert_eq!(i, self.workers.len(), "workers start in order");
        let d = self.spawn("worker", &format!("worker-{i}"))?;
        self.workers.push(d.child);
        Ok(())
    }

    pub fn kill_9_controller(&mut self, c: usize) {
        if let Some(mut d) = self.controllers[c].take() {
            let _ = d.child.kill();
            let _ = d.child.wait();
        }
    }

    pub fn kill_9_apiserver(&mut self, a: usize) {
        if let Some(mut d) = self.apiservers[a].take() {
            let _ = d.child.kill();
            let _ = d.child.wait();
        }
    }

    /// The controller that serves now: its `/healthz` answers `ok` (a standby's says
    /// `standby`, a dead one does not answer).
    pub fn serving_controller(&self) -> Result<usize> {
        (0..2)
            .find(|&c| {
                self.controllers[c].is_some()
                    && healthz(self.controller_ports[c]).is_some_and(|(status, body)| {
                        status == 200 && body.lines().next() == Some("ok")
                    })
            })
            .context("no controller serves")
    }

    pub fn announced_at(&self, c: usize) -> Option<Instant> {
        self.controllers[c].as_ref().and_then(Daemon::announced_at)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut names = vec!["controller-0".to_owned(), "controller-1".to_owned()];
            names.extend((0..self.apiserver_ports.len()).map(|a| format!("apiserver-{a}")));
            names.extend((0..self.workers.len()).map(|i| format!("worker-{i}")));
            let mut logs: Vec<(String, PathBuf)> = names
                .into_iter()
                .map(|n| (n.clone(), self.log(&n)))
                .collect();
            if let Some(etcd) = &self.etcd {
                logs.extend(
                    (0..etcd.members()).map(|m| (format!("etcd-{}", etcd.name(m)), etcd.log(m))),
                );
            }
            dump_logs(&logs);
        }
        let daemons = (self.workers.iter_mut())
            .chain(self.controllers.iter_mut().flatten().map(|d| &mut d.child))
            .chain(self.apiservers.iter_mut().flatten().map(|d| &mut d.child));
        teardown(daemons, &self.owner);
        drop(self.etcd.take());
    }
}
