//! Scaling out the read side (issue 8): `xced apiserver`s on etcd, each serving the
//! endpoint table from its own copy fed by an etcd watch.
//!
//! Setup, all on loopback: a 1-member etcd (data in a /dev/shm temp dir), one
//! `xced controller` on it, and this process acting as a **fake worker** through the real
//! `/internal/v1` worker protocol (register, heartbeat, assignments, events), so that a
//! readiness change is one precise event: service `web` with 3 replicas is placed on the
//! fake host, reported started and ready; a change is "job 0 not ready" (then "ready"
//! again the next round), sent by the fake worker straight to the controller.
//!
//! Measured, with W blocking-query watchers (`GET /v1/services/web/endpoints?index=N&wait=60s`,
//! one connection each):
//!
//! 1. fan-out: all W on one apiserver, then spread evenly over three (fresh apiserver
//!    processes for each scenario). Once the apiservers' `xce_endpoint_watchers` gauge
//!    shows every watcher parked, t0 is taken just before the readiness event is sent;
//!    each watcher records when its answer (with the new index) was read whole. p50, p99
//!    and max of (t - t0) over the measured rounds (watchers re-park between rounds);
//! 2. memory: the apiservers' VmRSS with the watchers parked, minus before they connected,
//!    per watcher;
//! 3. CPU: the apiservers' CPU time over the measured rounds, per delivered answer (the
//!    answer plus the re-parked query);
//! 4. reads: C closed-loop keep-alive connections doing `?format=plain` reads against one
//!    apiserver, then round-robin over three: requests/s, p50/p99 latency, apiserver CPU
//!    per read.
//!
//! Needs `target/release/xced` (`cargo build --release --bin xced`, or `$XCED`), `etcd`
//! (or `$ETCD`) and `ulimit -n` above W + 500 (the hard limit is enough: the soft one is
//! raised here). `XCE_BENCH_WATCHERS` changes W (default 10,000). Run:
//! `sh integration-tests/bench-scale.sh`. Children are killed when dropped, on a panic, and
//! by a watchdog past [`DEADLINE`].

mod common;

use anyhow::{anyhow, bail, Context, Result};
use common::fake_worker::{FakeWorker, HostId};
use common::procs::{
    forget_child, install_guards, keep_child, raise_nofile, wait_announce, xced, Proc, ROOT,
};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::http::Conn;
use testkit::{cpu_us, free_port, rss_kib};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Semaphore};

/// The whole run is killed past this (children first).
const DEADLINE: Duration = Duration::from_secs(10 * 60);
/// Default watcher count.
const WATCHERS: usize = 10_000;
/// Fan-out: passes (each starts fresh apiservers: one, then three), and per pass the
/// unmeasured warm-up rounds, then the measured ones.
const PASSES: usize = 2;
const WARMUP_ROUNDS: usize = 1;
const ROUNDS: usize = 5;
/// How long one round may take before the bench gives up.
const ROUND_LIMIT: Duration = Duration::from_secs(60);
/// Concurrent connects while watchers connect (a burst of 10,000 SYNs would overflow the
/// accept backlog and time the SYN retransmits instead).
const CONNECTS: usize = 256;
/// Read load: connections, warm-up and measured time per round, rounds per variant (the
/// variants alternate).
const READ_CONNS: usize = 64;
const READ_WARMUP: Duration = Duration::from_millis(500);
const READ_TIME: Duration = Duration::from_secs(3);
const READ_ROUNDS: usize = 3;
/// Replicas of `web`.
const REPLICAS: usize = 3;
/// Secrets of the tokens file.
const ADMIN: &str = "9d41f0c27b6e4a58a1c3e5f7092b4d6f8a0c2e4b6d8f0a1c3e5b7d9f1a3c5e7b";
const HOST: &str = "bench-01";
const HOST_SECRET: &str = "4e6a8c0e2b4d6f8a1c3e5b7d9f0a2c4e6b8d0f2a4c6e8b0d2f4a6c8e0b2d4f6a";
/// The fake host's advertised address.
const HOST_IP: &str = "127.0.61.11";

fn main() {
    install_guards(DEADLINE);
    let watchers = std::env::var("XCE_BENCH_WATCHERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(WATCHERS);
    let limit = raise_nofile();
    if (watchers as u64) + 500 > limit {
        eprintln!(
            "bench: the open-file limit is {limit}, {watchers} watchers need {} \
             (run integration-tests/bench-scale.sh, or `ulimit -n 20000` first)",
            watchers + 500
        );
        std::process::exit(1);
    }
    common::procs::run_to_end(run(watchers));
}

async fn run(watchers: usize) {
    let started = Instant::now();
    let mut cluster = Cluster::start()
        .await
        .expect("starting etcd, controller, worker");
    println!(
        "setup: etcd {}, controller {}, fake worker {HOST} with {REPLICAS} ready replicas of web \
         (index {}) in {:.1}s",
        cluster.etcd_endpoint,
        cluster.controller,
        cluster.index().await.unwrap(),
        started.elapsed().as_secs_f64()
    );

    // Every watcher on one apiserver, then spread over three, twice (fresh apiserver
    // processes each time: their memory growth is the watchers', and load drift on this
    // shared machine hits both variants).
    let mut one = Fanout::default();
    let mut three = Fanout::default();
    for pass in 0..PASSES {
        cluster.start_apiservers(1).await.expect("1 apiserver");
        one.add(fanout(&cluster, watchers).await);
        cluster.stop_apiservers();
        cluster.start_apiservers(3).await.expect("3 apiservers");
        three.add(fanout(&cluster, watchers).await);
        if pass + 1 < PASSES {
            cluster.stop_apiservers();
        }
    }

    // Reads: one apiserver, then round-robin over three, alternating.
    let mut read_one = Reads::default();
    let mut read_three = Reads::default();
    for _ in 0..READ_ROUNDS {
        read_one.add(reads(&cluster, 1).await);
        read_three.add(reads(&cluster, 3).await);
    }
    let elapsed = started.elapsed();
    common::procs::log_problems(cluster.dir.path());
    drop(cluster);

    report(watchers, &one, &three, &read_one, &read_three);
    println!("\nbench took {:.0}s", elapsed.as_secs_f64());
}

// === processes ===
/// The kernel's count of connections dropped because a listen queue was full (all
/// sockets of the machine), from `/proc/net/netstat`.
fn listen_overflows() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next()?, lines.next()?);
    let at = names
        .split_whitespace()
        .position(|n| n == "ListenOverflows")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

// === the cluster ===

struct Apiserver {
    addr: SocketAddr,
    proc_: Proc,
}

/// etcd, the controller, the fake worker and the current apiservers, in a temp dir.
struct Cluster {
    // Dropped in this order: apiservers, controller, etcd, then the dir.
    apiservers: Vec<Apiserver>,
    worker: FakeWorker,
    controller_proc: Option<Proc>,
    etcd: Option<testkit::etcd::Etcd>,
    dir: tempfile::TempDir,
    etcd_endpoint: String,
    controller: String,
    http: reqwest::Client,
    started_apiservers: usize,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.worker.heartbeats.abort();
        self.apiservers.clear();
        drop(self.controller_proc.take());
        if let Some(etcd) = self.etcd.take() {
            let pid = etcd.pid(0);
            drop(etcd);
            if let Some(pid) = pid {
                forget_child(pid);
            }
        }
        ROOT.lock().unwrap_or_else(|e| e.into_inner()).take();
        let _ = &self.dir;
    }
}

impl Cluster {
    async fn start() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("xce-bench-scale")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())?;
        *ROOT.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.path().to_owned());
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()?;

        // etcd, its log among the daemons' in the cluster's dir; the kit waits for it with
        // blocking calls, off the runtime's threads.
        let etcd_dir = dir.path().to_owned();
        let etcd =
            tokio::task::spawn_blocking(move || testkit::etcd::Etcd::start_in(&etcd_dir, 1, &[]))
                .await??;
        let etcd_pid = etcd.pid(0).context("etcd runs")?;
        keep_child(etcd_pid);
        let etcd_endpoint = etcd.endpoint().to_owned();

        // tokens, controller
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(
            &tokens,
            format!(
                "[[token]]\nsecret = \"{ADMIN}\"\nprincipal = \"admin\"\n\
                 grants = [ {{ permission = \"admin\", projects = [\"*\"] }} ]\n\n\
                 [[worker]]\nhost = \"{HOST}\"\nsecret = \"{HOST_SECRET}\"\n"
            ),
        )?;
        let port = free_port();
        let config = dir.path().join("controller.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\ntokens = \"{}\"\n\
                 store = \"etcd://{etcd_endpoint}\"\nleader_ttl = \"3s\"\n\
                 # The fake worker's heartbeats share 2 cores with 10,000 watchers.\n\
                 unreachable_after = \"30s\"\ngrace_period = \"60s\"\n\n\
                 [address]\nallow_loopback_hosts = [\"*\"]\n",
                dir.path().join("controller-data").display(),
                tokens.display(),
            ),
        )?;
        let mut cmd = Command::new(xced());
        cmd.arg("controller")
            .arg("--config")
            .arg(&config)
            .env("XCE_LOG", "info");
        let (mut controller_proc, lines) =
            Proc::spawn("controller", cmd, dir.path().join("controller.log"))?;
        let addr = wait_announce(&mut controller_proc, &lines)?;
        let controller = format!("http://{addr}");

        let host = HostId {
            host: HOST.into(),
            secret: HOST_SECRET.into(),
            ip: HOST_IP.into(),
        };
        let worker = FakeWorker::start(http.clone(), &controller, &host).await?;
        let mut cluster = Self {
            apiservers: Vec::new(),
            worker,
            controller_proc: Some(controller_proc),
            etcd: Some(etcd),
            dir,
            etcd_endpoint,
            controller,
            http,
            started_apiservers: 0,
        };
        cluster.submit_web().await?;
        Ok(cluster)
    }

    /// Submits `web`, takes its assignments and reports every replica started and ready.
    async fn submit_web(&mut self) -> Result<()> {
        common::api::submit_sleeper(&self.http, &self.controller, ADMIN, "web", REPLICAS).await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let jobs = loop {
            let a = self.worker.assignments().await?;
            let jobs: Vec<String> = a["jobs"]
                .as_array()
                .context("assignments.jobs")?
                .iter()
                .filter(|j| j["service"] == "web" && j["desired"] == "run")
                .filter_map(|j| j["job"].as_str().map(str::to_owned))
                .collect();
            if jobs.len() == REPLICAS {
                break jobs;
            }
            if Instant::now() > deadline {
                bail!("the fake host never got {REPLICAS} assignments: {a}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let pid = std::process::id();
        let started: Vec<Value> = jobs
            .iter()
            .map(|j| json!({"event": "started", "job": j, "pid": pid}))
            .collect();
        self.worker.events(&started).await?;
        let ready: Vec<Value> = jobs
            .iter()
            .map(|j| json!({"event": "readiness", "job": j, "ready": true}))
            .collect();
        self.worker.events(&ready).await?;
        self.worker.jobs = jobs;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let plain = self
                .http
                .get(format!(
                    "{}/v1/services/web/endpoints?format=plain",
                    self.controller
                ))
                .bearer_auth(ADMIN)
                .send()
                .await?
                .text()
                .await?;
            if plain.lines().count() == REPLICAS {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("web never had {REPLICAS} ready endpoints on the controller: {plain:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The endpoint entry's index of `web` on `base`.
    async fn index_at(&self, base: &str) -> Result<u64> {
        let r = self
            .http
            .get(format!("{base}/v1/services/web/endpoints"))
            .bearer_auth(ADMIN)
            .send()
            .await?;
        if r.status() != 200 {
            let st = r.status();
            bail!("{base}: HTTP {st}: {}", r.text().await?);
        }
        r.headers()
            .get("x-xce-index")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .with_context(|| format!("{base}: no X-Xce-Index"))
    }

    /// The controller's index of `web`.
    async fn index(&self) -> Result<u64> {
        self.index_at(&self.controller).await
    }

    /// Starts `n` fresh apiservers and waits until each serves the controller's index.
    /// Every watcher of the bench connects from 127.0.0.1: the per-client connection cap
    /// (2,048 by default, for a fleet of many addresses) is raised above W.
    async fn start_apiservers(&mut self, n: usize) -> Result<()> {
        let tokens = self.dir.path().join("tokens.toml");
        for _ in 0..n {
            let i = self.started_apiservers;
            self.started_apiservers += 1;
            let config = self.dir.path().join(format!("apiserver-{i}.toml"));
            std::fs::write(
                &config,
                format!(
                    "listen = \"127.0.0.1:0\"\ntokens = \"{}\"\nstore = \"etcd://{}\"\n\n\
                     [endpoints]\nmax_watchers = 50000\nmax_watchers_per_principal = 50000\n\n\
                     [connections]\nmax_per_client = 20000\n",
                    tokens.display(),
                    self.etcd_endpoint
                ),
            )?;
            let mut cmd = Command::new(xced());
            cmd.arg("apiserver")
                .arg("--config")
                .arg(&config)
                .env("XCE_LOG", "info");
            let name = format!("apiserver-{i}");
            let (mut p, lines) =
                Proc::spawn(&name, cmd, self.dir.path().join(format!("{name}.log")))?;
            let addr = wait_announce(&mut p, &lines)?;
            self.apiservers.push(Apiserver { addr, proc_: p });
        }
        let want = self.index().await?;
        for a in &self.apiservers {
            let base = format!("http://{}", a.addr);
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let got = self.index_at(&base).await;
                if got.as_ref().is_ok_and(|&i| i == want) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("{base} never served index {want} of web (last: {got:?})");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    fn stop_apiservers(&mut self) {
        self.apiservers.clear();
    }
}

// === requests (the test kit's raw HTTP/1.1 client sends them) ===

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {ADMIN}\r\n\r\n")
}

// === fan-out ===

/// A watcher had an answer: (its request number, the answer's index, when it was read).
type Seen = std::result::Result<(usize, u64, Instant), String>;

/// One watcher: `requests` blocking queries in a row on one connection, each with the
/// index of the answer before, then one more that it leaves parked (so that every
/// measured round has the watchers re-park while answers go out, the last one too). It
/// keeps its connection until `release` turns true, then closes it.
async fn watcher(
    addr: SocketAddr,
    mut index: u64,
    requests: usize,
    connects: Arc<Semaphore>,
    tx: mpsc::UnboundedSender<Seen>,
    mut release: tokio::sync::watch::Receiver<bool>,
) {
    let run = async {
        let permit = connects.acquire().await?;
        let mut conn = Conn::connect(addr).await?;
        drop(permit);
        for r in 0..requests {
            let req = get(&format!(
                "/v1/services/web/endpoints?index={index}&wait=60s"
            ));
            let (head, body) = conn.request(req.as_bytes()).await?;
            let at = Instant::now();
            if head.status != 200 {
                bail!(
                    "{addr}: HTTP {}: {}",
                    head.status,
                    String::from_utf8_lossy(&body)
                );
            }
            let new = head.index.context("no X-Xce-Index")?;
            if new <= index {
                bail!("{addr}: answered index {new} after waiting on {index} (wait ran out?)");
            }
            index = new;
            if tx.send(Ok((r, index, at))).is_err() {
                return Ok(());
            }
        }
        let req = get(&format!(
            "/v1/services/web/endpoints?index={index}&wait=60s"
        ));
        conn.stream.write_all(req.as_bytes()).await?;
        let _ = release.wait_for(|r| *r).await;
        drop(conn);
        Ok::<(), anyhow::Error>(())
    };
    if let Err(e) = run.await {
        let _ = tx.send(Err(format!("{e:#}")));
    }
}

/// The sum of `xce_endpoint_watchers` samples on an apiserver's `/metrics`.
async fn watcher_gauge(conn: &mut Conn) -> Result<u64> {
    // /metrics needs metrics.view (or admin).
    let (head, body) = conn.request(get("/metrics").as_bytes()).await?;
    if head.status != 200 {
        bail!("/metrics: HTTP {}", head.status);
    }
    let text = String::from_utf8_lossy(&body);
    let mut found = false;
    let mut sum = 0.0;
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("xce_endpoint_watchers") else {
            continue;
        };
        if !rest.starts_with([' ', '{']) {
            continue;
        }
        found = true;
        sum += l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    if !found {
        bail!("no xce_endpoint_watchers gauge on /metrics");
    }
    Ok(sum as u64)
}

/// A keep-alive connection to one apiserver's `/metrics`, made again when it was closed.
struct Metrics {
    addr: SocketAddr,
    conn: Option<Conn>,
}

impl Metrics {
    async fn watchers(&mut self) -> Result<u64> {
        if let Some(conn) = &mut self.conn {
            if let Ok(n) = watcher_gauge(conn).await {
                return Ok(n);
            }
        }
        let conn = self.conn.insert(Conn::connect(self.addr).await?);
        watcher_gauge(conn).await
    }
}

/// Waits until every apiserver's gauge shows its share of watchers parked.
async fn wait_parked(
    metrics: &mut [Metrics],
    shares: &[usize],
    rx: &mut mpsc::UnboundedReceiver<Seen>,
) -> Result<()> {
    let deadline = Instant::now() + ROUND_LIMIT;
    loop {
        let mut all = true;
        let mut seen = Vec::new();
        for (m, &share) in metrics.iter_mut().zip(shares) {
            let g = m.watchers().await?;
            seen.push(g);
            all &= g as usize == share;
        }
        if all {
            return Ok(());
        }
        // A watcher that failed while connecting says so here.
        if let Ok(Err(e)) = rx.try_recv() {
            bail!("a watcher failed: {e}");
        }
        if Instant::now() > deadline {
            bail!("watchers parked per apiserver: {seen:?}, want {shares:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[derive(Debug, Default)]
struct Fanout {
    apiservers: usize,
    /// Per measured round: (t - t0) of every watcher, ms.
    rounds: Vec<Vec<f64>>,
    /// Apiserver RSS (KiB) before the watchers connected and with them parked, each
    /// apiserver of each pass.
    rss: Vec<(u64, u64)>,
    /// Apiserver CPU (µs) over the measured rounds, each; and this process's.
    cpu: Vec<f64>,
    client_cpu: f64,
    /// Time to connect and park every watcher, per pass.
    park: Vec<Duration>,
    /// Per pass: how long until the apiservers counted no watcher after every client
    /// closed its connection with a query parked (None: not within 10 s).
    drain: Vec<Option<Duration>>,
}

impl Fanout {
    fn add(&mut self, other: Fanout) {
        self.apiservers = other.apiservers;
        self.rounds.extend(other.rounds);
        self.rss.extend(other.rss);
        self.cpu.extend(other.cpu);
        self.client_cpu += other.client_cpu;
        self.park.extend(other.park);
        self.drain.extend(other.drain);
    }
}

async fn fanout(cluster: &Cluster, watchers: usize) -> Fanout {
    match fanout_run(cluster, watchers).await {
        Ok(f) => f,
        Err(e) => panic!(
            "fan-out over {} apiserver(s) failed: {e:#}",
            cluster.apiservers.len()
        ),
    }
}

async fn fanout_run(cluster: &Cluster, watchers: usize) -> Result<Fanout> {
    let apis: Vec<SocketAddr> = cluster.apiservers.iter().map(|a| a.addr).collect();
    let pids: Vec<u32> = cluster.apiservers.iter().map(|a| a.proc_.pid()).collect();
    let k = apis.len();
    let mut shares = vec![0; k];
    for i in 0..watchers {
        shares[i % k] += 1;
    }
    let mut metrics: Vec<Metrics> = apis
        .iter()
        .map(|&addr| Metrics { addr, conn: None })
        .collect();
    let mut index = cluster.index().await?;
    let rss_before: Vec<u64> = pids.iter().map(|&p| rss_kib(p)).collect();

    let total = WARMUP_ROUNDS + ROUNDS;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let connects = Arc::new(Semaphore::new(CONNECTS));
    let (release, released) = tokio::sync::watch::channel(false);
    let overflows = listen_overflows();
    let t_park = Instant::now();
    let tasks: Vec<_> = (0..watchers)
        .map(|i| {
            tokio::spawn(watcher(
                apis[i % k],
                index,
                total,
                connects.clone(),
                tx.clone(),
                released.clone(),
            ))
        })
        .collect();
    drop(tx);
    wait_parked(&mut metrics, &shares, &mut rx).await?;
    let park = t_park.elapsed();
    let overflows = listen_overflows().zip(overflows).map(|(a, b)| a - b);
    let rss_parked: Vec<u64> = pids.iter().map(|&p| rss_kib(p)).collect();
    println!(
        "  {k} apiserver(s): {watchers} watchers parked in {:.1}s (listen queue overflows \
         meanwhile, whole machine: {})",
        park.as_secs_f64(),
        overflows.map_or("unknown".into(), |n| n.to_string())
    );

    let me = std::process::id();
    let mut cpu0 = (Vec::new(), 0.0);
    let mut rounds = Vec::new();
    for r in 0..total {
        if r > 0 {
            wait_parked(&mut metrics, &shares, &mut rx).await?;
        }
        if r == WARMUP_ROUNDS {
            cpu0 = (pids.iter().map(|&p| cpu_us(p)).collect(), cpu_us(me));
        }
        // Round 0 takes job 0 out, round 1 puts it back, ...
        let ready = r % 2 == 1;
        let t0 = Instant::now();
        cluster.worker.flip(ready).await?;
        let mut got = Vec::with_capacity(watchers);
        let mut new_index = None;
        let deadline = tokio::time::Instant::now() + ROUND_LIMIT;
        while got.len() < watchers {
            let seen = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .map_err(|_| {
                    anyhow!(
                        "round {r}: {} of {watchers} watchers answered in {ROUND_LIMIT:?}",
                        got.len()
                    )
                })?
                .context("every watcher ended")?;
            let (req, idx, at) = seen.map_err(|e| anyhow!("round {r}: a watcher failed: {e}"))?;
            if req != r || at < t0 {
                bail!(
                    "round {r}: a watcher had answer {req} (index {idx}) {} the change was \
                     sent: an index change the bench did not make",
                    if at < t0 { "before" } else { "after" }
                );
            }
            if *new_index.get_or_insert(idx) != idx {
                bail!(
                    "round {r}: watchers saw indexes {} and {idx} for one change",
                    new_index.unwrap()
                );
            }
            got.push(at.duration_since(t0).as_secs_f64() * 1e3);
        }
        let new_index = new_index.unwrap_or(index);
        if new_index <= index {
            bail!("round {r}: index did not move ({index} -> {new_index})");
        }
        index = new_index;
        let mut sorted = got.clone();
        println!(
            "    round {r}{}: index {index}, ready={ready}: first {:.1} ms, p50 {:.1} ms, \
             p99 {:.1} ms, last {:.1} ms",
            if r < WARMUP_ROUNDS { " (warm-up)" } else { "" },
            pct(&mut sorted, 0.0),
            pct(&mut sorted, 0.5),
            pct(&mut sorted, 0.99),
            pct(&mut sorted, 1.0),
        );
        if r >= WARMUP_ROUNDS {
            rounds.push(got);
        }
    }
    // The last round's re-parked queries are part of the cost too.
    wait_parked(&mut metrics, &shares, &mut rx).await?;
    let cpu: Vec<f64> = pids
        .iter()
        .zip(&cpu0.0)
        .map(|(&p, before)| cpu_us(p) - before)
        .collect();
    let client_cpu = cpu_us(me) - cpu0.1;

    // Every client goes away with its query parked: the apiservers should drop those
    // watchers when the connections close, not when their wait runs out.
    release.send_replace(true);
    for t in tasks {
        t.await?;
    }
    let closed = Instant::now();
    let drain = loop {
        let mut left = 0;
        for m in &mut metrics {
            left += m.watchers().await?;
        }
        if left == 0 {
            println!(
                "    clients closed with their queries parked: every watcher gone after {:.0} ms",
                closed.elapsed().as_secs_f64() * 1e3
            );
            break Some(closed.elapsed());
        }
        if closed.elapsed() > Duration::from_secs(10) {
            println!(
                "    clients closed with their queries parked: {left} watchers still counted \
                 10 s later (their wait is 60 s)"
            );
            break None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let each: Vec<String> = rss_before
        .iter()
        .zip(&rss_parked)
        .zip(&cpu)
        .map(|((b, a), c)| {
            format!(
                "{:.0}->{:.0} MB, {:.2}s CPU",
                *b as f64 / 1024.0,
                *a as f64 / 1024.0,
                c / 1e6
            )
        })
        .collect();
    println!(
        "    each apiserver: RSS idle->parked, CPU over the {ROUNDS} measured rounds: {}",
        each.join("; ")
    );
    Ok(Fanout {
        apiservers: k,
        rounds,
        rss: rss_before.into_iter().zip(rss_parked).collect(),
        cpu,
        client_cpu,
        park: vec![park],
        drain: vec![drain],
    })
}

// === reads ===

#[derive(Debug, Default)]
struct Reads {
    apiservers: usize,
    /// Requests completed in the measured windows, and the windows' total length.
    count: u64,
    time: Duration,
    /// Latencies, µs.
    lat: Vec<f64>,
    /// Apiserver CPU (µs, all of them together) and this process's, over the windows.
    cpu: f64,
    client_cpu: f64,
}

impl Reads {
    fn add(&mut self, other: Reads) {
        self.apiservers = other.apiservers;
        self.count += other.count;
        self.time += other.time;
        self.lat.extend(other.lat);
        self.cpu += other.cpu;
        self.client_cpu += other.client_cpu;
    }

    fn rate(&self) -> f64 {
        self.count as f64 / self.time.as_secs_f64().max(1e-9)
    }
}

/// C closed-loop connections round-robin over the first `n` apiservers.
async fn reads(cluster: &Cluster, n: usize) -> Reads {
    let apis: Vec<SocketAddr> = cluster.apiservers[..n].iter().map(|a| a.addr).collect();
    let pids: Vec<u32> = cluster.apiservers[..n]
        .iter()
        .map(|a| a.proc_.pid())
        .collect();
    let start = Instant::now() + READ_WARMUP;
    let end = start + READ_TIME;
    let tasks: Vec<_> = (0..READ_CONNS)
        .map(|i| {
            let addr = apis[i % n];
            tokio::spawn(async move {
                let mut conn = Conn::connect(addr).await?;
                let req = get("/v1/services/web/endpoints?format=plain");
                let mut lat = Vec::new();
                loop {
                    let t = Instant::now();
                    if t >= end {
                        return Ok::<_, anyhow::Error>(lat);
                    }
                    let (head, body) = conn.request(req.as_bytes()).await?;
                    if head.status != 200 || body.is_empty() {
                        bail!("read from {addr}: HTTP {}", head.status);
                    }
                    let done = Instant::now();
                    if t >= start && done <= end {
                        lat.push(done.duration_since(t).as_secs_f64() * 1e6);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep_until(start.into()).await;
    let me = std::process::id();
    let cpu0: Vec<f64> = pids.iter().map(|&p| cpu_us(p)).collect();
    let client0 = cpu_us(me);
    tokio::time::sleep_until(end.into()).await;
    let cpu: f64 = pids
        .iter()
        .zip(&cpu0)
        .map(|(&p, before)| cpu_us(p) - before)
        .sum();
    let client_cpu = cpu_us(me) - client0;
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap().expect("reads"));
    }
    Reads {
        apiservers: n,
        count: lat.len() as u64,
        time: READ_TIME,
        lat,
        cpu,
        client_cpu,
    }
}

// === report ===

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

struct FanoutStats {
    first_p50: f64,
    p50: f64,
    p99: f64,
    max: f64,
    kb_per_watcher: f64,
    cpu_per_answer: f64,
    client_cpu_per_answer: f64,
}

fn fanout_stats(f: &Fanout, watchers: usize) -> FanoutStats {
    let mut all: Vec<f64> = f.rounds.iter().flatten().copied().collect();
    let mut firsts: Vec<f64> = f
        .rounds
        .iter()
        .map(|r| r.iter().copied().fold(f64::MAX, f64::min))
        .collect();
    let answers = (watchers * f.rounds.len()).max(1) as f64;
    let passes = f.park.len().max(1) as f64;
    let grown: f64 = f
        .rss
        .iter()
        .map(|(b, a)| *a as f64 - *b as f64)
        .sum::<f64>()
        / passes;
    FanoutStats {
        first_p50: pct(&mut firsts, 0.5),
        p50: pct(&mut all, 0.5),
        p99: pct(&mut all, 0.99),
        max: all.iter().copied().fold(0.0, f64::max),
        kb_per_watcher: grown / watchers as f64,
        cpu_per_answer: f.cpu.iter().sum::<f64>() / answers,
        client_cpu_per_answer: f.client_cpu / answers,
    }
}

fn report(watchers: usize, one: &Fanout, three: &Fanout, r1: &Reads, r3: &Reads) {
    // 10000 -> "10k", 2500 -> "2.5k".
    let w = format!("{}k", watchers as f64 / 1000.0);
    println!(
        "\nfan-out: one readiness change (fake worker -> controller -> etcd -> apiservers' \
         watch) -> {watchers} blocking-query watchers answered (one connection each); \
         {PASSES} passes of {ROUNDS} measured rounds after {WARMUP_ROUNDS} warm-up, fresh \
         apiservers per pass"
    );
    println!(
        "{:<11} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10} {:>12} {:>12} {:>10}",
        "apiservers",
        "W",
        "first ms",
        "p50 ms",
        "p99 ms",
        "max ms",
        "KB/watcher",
        "srv CPU/ans",
        "cli CPU/ans",
        "park s"
    );
    let s1 = fanout_stats(one, watchers);
    let s3 = fanout_stats(three, watchers);
    for (f, s) in [(one, &s1), (three, &s3)] {
        let park = f.park.iter().map(Duration::as_secs_f64).sum::<f64>() / f.park.len() as f64;
        println!(
            "{:<11} {watchers:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.1} {:>10.1}µs {:>10.1}µs {:>10.1}",
            f.apiservers,
            s.first_p50,
            s.p50,
            s.p99,
            s.max,
            s.kb_per_watcher,
            s.cpu_per_answer,
            s.client_cpu_per_answer,
            park
        );
    }
    println!(
        "(first: median over rounds of the first watcher's answer; KB/watcher: apiserver RSS \
         growth, all apiservers together, per watcher; srv/cli CPU/ans: apiservers' / this \
         client's CPU per delivered answer, re-parked query included; park: time to connect \
         and park all watchers)"
    );
    let drains: Vec<String> = [one, three]
        .iter()
        .flat_map(|f| f.drain.iter())
        .map(|d| {
            d.map_or("NOT within 10 s".into(), |d| {
                format!("{:.0} ms", d.as_secs_f64() * 1e3)
            })
        })
        .collect();
    println!(
        "clients closed with queries parked -> apiservers count no watcher (per scenario run): {}",
        drains.join(", ")
    );
    println!(
        "\nreads: {READ_CONNS} closed-loop keep-alive connections, GET \
         /v1/services/web/endpoints?format=plain, {READ_ROUNDS} x {:.0}s per variant \
         (alternating)",
        READ_TIME.as_secs_f64()
    );
    println!(
        "{:<11} {:>10} {:>9} {:>9} {:>13} {:>13}",
        "apiservers", "req/s", "p50 ms", "p99 ms", "srv CPU/read", "cli CPU/read"
    );
    let mut rows = Vec::new();
    for r in [r1, r3] {
        let mut lat = r.lat.clone();
        let (p50, p99) = (pct(&mut lat, 0.5) / 1e3, pct(&mut lat, 0.99) / 1e3);
        let n = r.count.max(1) as f64;
        println!(
            "{:<11} {:>10.0} {:>9.3} {:>9.3} {:>11.1}µs {:>11.1}µs",
            r.apiservers,
            r.rate(),
            p50,
            p99,
            r.cpu / n,
            r.client_cpu / n
        );
        rows.push((r.rate(), p50, p99, r.cpu / n));
    }
    println!();
    println!(
        "SUMMARY fanout_{w}_1_apiserver_p50_ms={:.1} fanout_{w}_1_apiserver_p99_ms={:.1} \
         fanout_{w}_1_apiserver_max_ms={:.1}",
        s1.p50, s1.p99, s1.max
    );
    println!(
        "SUMMARY fanout_{w}_3_apiservers_p50_ms={:.1} fanout_{w}_3_apiservers_p99_ms={:.1} \
         fanout_{w}_3_apiservers_max_ms={:.1}",
        s3.p50, s3.p99, s3.max
    );
    println!(
        "SUMMARY fanout_ratio_3_vs_1={:.2} (p99; p50 ratio {:.2})",
        s3.p99 / s1.p99,
        s3.p50 / s1.p50
    );
    println!(
        "SUMMARY reads_per_s_1={:.0} reads_per_s_3={:.0} ratio={:.2} p99_ms_1={:.3} p99_ms_3={:.3}",
        rows[0].0,
        rows[1].0,
        rows[1].0 / rows[0].0,
        rows[0].2,
        rows[1].2
    );
    println!(
        "SUMMARY rss_kb_per_watcher_1={:.1} rss_kb_per_watcher_3={:.1} \
         apiserver_cpu_us_per_answer_1={:.1} apiserver_cpu_us_per_answer_3={:.1} \
         apiserver_cpu_us_per_read_1={:.1} apiserver_cpu_us_per_read_3={:.1}",
        s1.kb_per_watcher,
        s3.kb_per_watcher,
        s1.cpu_per_answer,
        s3.cpu_per_answer,
        rows[0].3,
        rows[1].3
    );
}
