//! The real controller at scale (issue 14, item 3): a release `xced controller` on each
//! store (redb, then etcd: a 1-member etcd with its data in /dev/shm) and 1,000 fake
//! workers speaking the real `/internal/v1` protocol from this process
//! (`common/fake_worker.rs`: one tokio task per host; a replica starts, becomes ready and
//! exits at once), with services totalling 50,000 replicas, one of them of 10,000.
//!
//! Measured per store, every figure computed from what the run did:
//!
//! 1. placements/s from the first submit until every replica is committed (the
//!    controller's `xce_jobs` gauge counts them `placed` or `running`) and until every
//!    one is ready (the fakes' `ready` acknowledged and `GET /v1/services` counting them);
//! 2. controller RSS per replica: VmRSS with 50,000 ready replicas minus before the first
//!    submit (the 1,000 hosts registered), per replica;
//! 3. (etcd) endpoint table RSS per endpoint: an `xced apiserver` following the store,
//!    VmRSS with the 50,000 endpoints served minus before, per endpoint (its copy of the
//!    jobs included: an upper bound);
//! 4. controller restart at 50,000 jobs: SIGTERM, start again on the same data, the time
//!    until `/healthz` answers 200 and `GET /v1/services` shows every replica ready; (etcd)
//!    an apiserver restarted, the time until its `GET /v1/endpoints` equals the
//!    controller's;
//! 5. stopping the big service (`DELETE ?now=true`): the time until every one of its
//!    replicas was reported exited (acknowledged) and until `GET /v1/hosts` shows every
//!    port released. The fakes' replicas exit at once, so a worker that judges a stop by
//!    its own process (as `xced worker` does since issue 14) reports none as "did not stop
//!    within the grace" (`local-cluster`'s worker test proves that with 300 real
//!    processes); what is counted here is the controller's side of the same path: exits
//!    whose report it acknowledged more than the worker's grace (10 s) after the
//!    assignments answer that asked for the stop;
//! 6. what the fakes cost: this process's CPU per placement next to the controller's (and
//!    etcd's, and the apiserver's, whose follower watches every committed batch).
//!
//! Knobs: `XCE_SCALE_HOSTS` (1,000), `XCE_SCALE_REPLICAS` (50,000 in all),
//! `XCE_SCALE_BIG` (10,000: the big service; the controller's per-service limit must
//! allow it), `XCE_SCALE_EACH` (500: the size of the other services),
//! `XCE_SCALE_STORES` (`redb,etcd`), `XCE_SCALE_ETCD_TXN_OPS` (128: etcd's
//! `--max-txn-ops` and the controller's `etcd_max_txn_ops`, both), `XCE_SCALE_STORE_FORMAT`
//! (3: the controller's `store_format`, whose job events refer to the job records of
//! their batch; 0 leaves the setting out, for an `xced` that predates it). Needs `target/release/xced` (or `$XCED`) and `etcd`
//! (or `$ETCD`). Run: `sh integration-tests/bench-scale.sh controller_scale`. Children are
//! killed when dropped, on a panic and by a watchdog past [`DEADLINE`].

mod common;

use anyhow::{bail, Context, Result};
use common::fake_worker::{spawn_fleet, FleetStats, HostId};
use common::procs::{install_guards, keep_child, raise_nofile, wait_announce, xced, Proc, ROOT};
use futures_util::StreamExt as _;
use serde_json::Value;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::{cpu_us, free_port, rss_kib};

/// The whole run is killed past this (children first).
const DEADLINE: Duration = Duration::from_secs(30 * 60);
/// How long one phase (placing, stopping, a restart) may take before the bench gives up.
const PHASE_LIMIT: Duration = Duration::from_secs(600);
/// The real worker's default stop timeout: a stop acknowledged later than this after it
/// was asked for is one a worker whose exits queue up would report as not stopped.
const GRACE: Duration = Duration::from_secs(10);
/// Profiles submitted at once.
const SUBMITS: usize = 8;
/// How often a condition with no change notification (the controller's gauges and
/// lists) is read again.
const POLL: Duration = Duration::from_millis(20);
const ADMIN: &str = "5b7d9f1a3c5e7b9d41f0c27b6e4a58a1c3e5f7092b4d6f8a0c2e4b6d8f0a1c3e";

#[derive(Debug, Clone)]
struct Config {
    hosts: usize,
    replicas: usize,
    big: usize,
    each: usize,
    stores: Vec<String>,
    /// etcd's `--max-txn-ops` and the controller's `etcd_max_txn_ops` (etcd's default).
    etcd_txn_ops: usize,
    /// The controller's `store_format` (0: not set).
    store_format: usize,
}

fn knob(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.replace(['_', ','], "").parse().unwrap_or_else(|_| {
            eprintln!("bench: {name}={v:?} is not a number");
            std::process::exit(1)
        }),
        Err(_) => default,
    }
}

impl Config {
    fn from_env() -> Self {
        let stores = std::env::var("XCE_SCALE_STORES").unwrap_or_else(|_| "redb,etcd".into());
        let cfg = Config {
            hosts: knob("XCE_SCALE_HOSTS", 1_000),
            replicas: knob("XCE_SCALE_REPLICAS", 50_000),
            big: knob("XCE_SCALE_BIG", 10_000),
            each: knob("XCE_SCALE_EACH", 500),
            stores: stores.split(',').map(|s| s.trim().to_owned()).collect(),
            etcd_txn_ops: knob("XCE_SCALE_ETCD_TXN_OPS", 128),
            store_format: knob("XCE_SCALE_STORE_FORMAT", 3),
        };
        if let Some(bad) = cfg
            .stores
            .iter()
            .find(|s| !matches!(s.as_str(), "redb" | "etcd"))
        {
            eprintln!("bench: XCE_SCALE_STORES: unknown store {bad:?} (redb, etcd)");
            std::process::exit(1);
        }
        if cfg.etcd_txn_ops < 2 {
            eprintln!("bench: XCE_SCALE_ETCD_TXN_OPS must be at least 2");
            std::process::exit(1);
        }
        if cfg.big > cfg.replicas || cfg.each == 0 || cfg.hosts == 0 {
            eprintln!("bench: want 0 < XCE_SCALE_EACH, 0 < XCE_SCALE_HOSTS, XCE_SCALE_BIG <= XCE_SCALE_REPLICAS");
            std::process::exit(1);
        }
        cfg
    }

    /// `big` first, then `svc-NNN` of `each` (the last one smaller) up to `replicas`.
    fn services(&self) -> Vec<(String, usize)> {
        let mut out = vec![("big".to_owned(), self.big)];
        let mut left = self.replicas - self.big;
        while left > 0 {
            let n = left.min(self.each);
            out.push((format!("svc-{:03}", out.len()), n));
            left -= n;
        }
        out
    }
}

fn main() {
    install_guards(DEADLINE);
    let cfg = Config::from_env();
    // Per fake host: a parked assignments query, a heartbeat, an events POST at times.
    let need = (cfg.hosts as u64) * 3 + 1_000;
    let limit = raise_nofile();
    if limit < need {
        eprintln!(
            "bench: the open-file limit is {limit}, {} hosts need {need}",
            cfg.hosts
        );
        std::process::exit(1);
    }
    common::procs::run_to_end(run(cfg));
}

async fn run(cfg: Config) {
    let started = Instant::now();
    let services = cfg.services();
    println!(
        "controller at scale: {} fake hosts, {} services, {} replicas (the big one {}), stores {:?}; load {}",
        cfg.hosts,
        services.len(),
        cfg.replicas,
        cfg.big,
        cfg.stores,
        loadavg()
    );
    let mut all = Vec::new();
    for store in &cfg.stores {
        let f = match bench_store(&cfg, store, &services).await {
            Ok(f) => f,
            Err(e) => panic!("{store}: {e:#}"),
        };
        f.print();
        all.push(f);
    }
    println!(
        "\nbench took {:.0}s; load {}",
        started.elapsed().as_secs_f64(),
        loadavg()
    );
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

// === the figures ===

#[derive(Debug, Default)]
struct Figures {
    store: String,
    replicas: usize,
    big: usize,
    hosts: usize,
    submit_s: f64,
    committed_s: f64,
    ready_s: f64,
    rss_per_replica_b: f64,
    table_rss_per_endpoint_b: Option<f64>,
    restart_listen_s: f64,
    restart_s: f64,
    resync_s: Option<f64>,
    stop_exits_s: f64,
    stop_ports_s: f64,
    late_stops: usize,
    slowest_stop_s: f64,
    controller_cpu_us_per_placement: f64,
    /// The controller's settles (each one answers a burst of up to 256 queued commands)
    /// while placing: how far its batching kept up.
    settles: f64,
    etcd_cpu_us_per_placement: Option<f64>,
    /// The apiserver's (its follower watches every batch the controller commits).
    apiserver_cpu_us_per_placement: Option<f64>,
    /// What etcd wrote while placing, per placement: (transactions, keys put, bytes put).
    etcd_writes_per_placement: Option<(f64, f64, f64)>,
    fakes_cpu_us_per_placement: f64,
    fake_posts: usize,
    fake_errors: usize,
}

impl Figures {
    fn print(&self) {
        let s = &self.store;
        let n = self.replicas as f64;
        println!(
            "SUMMARY scale store={s} hosts={} replicas={} placements_per_s_committed={:.0} \
             placements_per_s_ready={:.0} committed_s={:.2} ready_s={:.2} submit_s={:.2}",
            self.hosts,
            self.replicas,
            n / self.committed_s,
            n / self.ready_s,
            self.committed_s,
            self.ready_s,
            self.submit_s
        );
        println!(
            "SUMMARY scale store={s} stop_replicas={} stop_all_exited_s={:.2} \
             stop_ports_released_s={:.2} exits_acked_later_than_grace={} slowest_stop_ack_s={:.2}",
            self.big, self.stop_exits_s, self.stop_ports_s, self.late_stops, self.slowest_stop_s
        );
        println!(
            "SUMMARY scale store={s} controller_rss_bytes_per_replica={:.0}{}",
            self.rss_per_replica_b,
            self.table_rss_per_endpoint_b
                .map(|b| format!(" apiserver_rss_bytes_per_endpoint={b:.0}"))
                .unwrap_or_default()
        );
        println!(
            "SUMMARY scale store={s} controller_restart_s={:.2} (listening after {:.2}){}",
            self.restart_s,
            self.restart_listen_s,
            self.resync_s
                .map(|r| format!(" apiserver_resync_s={r:.2}"))
                .unwrap_or_default()
        );
        println!(
            "SUMMARY scale store={s} controller_cpu_us_per_placement={:.1}{}{} \
             fakes_cpu_us_per_placement={:.1} fake_event_posts={} fake_failed_calls={} \
             settles_while_placing={:.0}",
            self.controller_cpu_us_per_placement,
            self.etcd_cpu_us_per_placement
                .map(|c| format!(" etcd_cpu_us_per_placement={c:.1}"))
                .unwrap_or_default(),
            self.apiserver_cpu_us_per_placement
                .map(|c| format!(" apiserver_cpu_us_per_placement={c:.1}"))
                .unwrap_or_default(),
            self.fakes_cpu_us_per_placement,
            self.fake_posts,
            self.fake_errors,
            self.settles
        );
        if let Some((txns, puts, bytes)) = self.etcd_writes_per_placement {
            println!(
                "SUMMARY scale store={s} etcd_txns_per_placement={txns:.3} \
                 etcd_puts_per_placement={puts:.2} etcd_put_bytes_per_placement={bytes:.0}"
            );
        }
    }
}

/// How many files (sockets included) process `pid` has open: the connections the fakes
/// keep to the controller are a per-host cost, not a per-replica one.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

// === one store ===

async fn bench_store(cfg: &Config, store: &str, services: &[(String, usize)]) -> Result<Figures> {
    println!("\n== {store} ==");
    let t = Instant::now();
    let mut c = Cluster::start(cfg, store).await?;
    println!(
        "  setup: controller {} and {} fake hosts registered in {:.1}s",
        c.base,
        cfg.hosts,
        t.elapsed().as_secs_f64()
    );
    let mut f = Figures {
        store: store.into(),
        replicas: cfg.replicas,
        big: cfg.big,
        hosts: cfg.hosts,
        ..Figures::default()
    };
    if store == "etcd" {
        println!(
            "  etcd --max-txn-ops={0}, the controller's etcd_max_txn_ops = {0}, store_format = {1}",
            cfg.etcd_txn_ops,
            match cfg.store_format {
                0 => "(not set)".to_owned(),
                n => n.to_string(),
            }
        );
        c.start_apiserver().await?;
    }
    let rss_ctl0 = rss_kib(c.controller_pid());
    let fds_ctl0 = open_fds(c.controller_pid());
    let rss_api0 = c.apiserver.as_ref().map(|(p, _)| rss_kib(p.pid()));
    let me = std::process::id();
    let cpu0 = (
        cpu_us(c.controller_pid()),
        cpu_us(me),
        c.etcd_pid().map(cpu_us),
        c.apiserver.as_ref().map(|(p, _)| cpu_us(p.pid())),
    );
    let writes0 = c.etcd_writes().await?;

    // 1. placements
    let settles0 = c.counter("xce_controller_settles").await?;
    let profile = perf_record(c.controller_pid(), store)?;
    let t0 = Instant::now();
    futures_util::stream::iter(services.iter().map(|(name, n)| c.submit(name, *n)))
        .buffer_unordered(SUBMITS)
        .collect::<Vec<Result<()>>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;
    f.submit_s = t0.elapsed().as_secs_f64();
    c.poll("every replica committed", |c| async move {
        Ok(c.live_jobs().await? >= cfg.replicas)
    })
    .await?;
    f.committed_s = t0.elapsed().as_secs_f64();
    c.stats
        .wait_until("every replica reported ready", PHASE_LIMIT, |s| {
            FleetStats::get(&s.started) >= cfg.replicas
        })
        .await?;
    c.poll("every replica ready in GET /v1/services", |c| async move {
        Ok(c.ready().await?.1 >= cfg.replicas)
    })
    .await?;
    f.ready_s = t0.elapsed().as_secs_f64();
    if let Some(p) = profile {
        p.finish();
    }
    let placements = cfg.replicas as f64;
    f.settles = c.counter("xce_controller_settles").await? - settles0;
    f.controller_cpu_us_per_placement = (cpu_us(c.controller_pid()) - cpu0.0) / placements;
    f.fakes_cpu_us_per_placement = (cpu_us(me) - cpu0.1) / placements;
    f.etcd_cpu_us_per_placement = c
        .etcd_pid()
        .zip(cpu0.2)
        .map(|(p, before)| (cpu_us(p) - before) / placements);
    f.apiserver_cpu_us_per_placement = c
        .apiserver
        .as_ref()
        .zip(cpu0.3)
        .map(|((p, _), before)| (cpu_us(p.pid()) - before) / placements);
    f.etcd_writes_per_placement = c.etcd_writes().await?.zip(writes0).map(|(a, b)| {
        (
            (a.0 - b.0) / placements,
            (a.1 - b.1) / placements,
            (a.2 - b.2) / placements,
        )
    });
    println!(
        "  placed: submitted in {:.2}s, committed after {:.2}s, ready after {:.2}s",
        f.submit_s, f.committed_s, f.ready_s
    );

    // 2., 3. memory
    let rss_ctl1 = rss_kib(c.controller_pid());
    let fds_ctl1 = open_fds(c.controller_pid());
    f.rss_per_replica_b = (rss_ctl1 as f64 - rss_ctl0 as f64) * 1024.0 / placements;
    if let Some(before) = rss_api0 {
        c.poll("the apiserver serving every endpoint", |c| async move {
            let api = c.apiserver_base().context("apiserver")?;
            Ok(count_endpoints(&c.endpoints(&api).await?) >= cfg.replicas)
        })
        .await?;
        let after = rss_kib(c.apiserver.as_ref().context("apiserver")?.0.pid());
        f.table_rss_per_endpoint_b = Some((after as f64 - before as f64) * 1024.0 / placements);
        println!(
            "  apiserver RSS {:.1} -> {:.1} MB",
            before as f64 / 1024.0,
            after as f64 / 1024.0
        );
    }
    println!(
        "  controller RSS {:.1} -> {:.1} MB, open files {fds_ctl0} -> {fds_ctl1}",
        rss_ctl0 as f64 / 1024.0,
        rss_ctl1 as f64 / 1024.0
    );

    // 4. restarts
    let (listen, serving) = c.restart_controller(cfg.replicas).await?;
    f.restart_listen_s = listen.as_secs_f64();
    f.restart_s = serving.as_secs_f64();
    if c.apiserver.is_some() {
        f.resync_s = Some(c.restart_apiserver().await?.as_secs_f64());
    }

    // 5. stopping the big service
    let exited0 = FleetStats::get(&c.stats.exited);
    let late0 = FleetStats::get(&c.stats.late_stops);
    let ports_left = cfg.replicas - cfg.big;
    let t0 = Instant::now();
    c.delete("big").await?;
    c.stats
        .wait_until("every replica of big reported exited", PHASE_LIMIT, |s| {
            FleetStats::get(&s.exited) - exited0 >= cfg.big
        })
        .await?;
    f.stop_exits_s = t0.elapsed().as_secs_f64();
    c.poll("every port of big released", |c| async move {
        Ok(c.ports_used().await? <= ports_left)
    })
    .await?;
    f.stop_ports_s = t0.elapsed().as_secs_f64();
    f.late_stops = FleetStats::get(&c.stats.late_stops) - late0;
    f.slowest_stop_s = FleetStats::get(&c.stats.slowest_stop_us) as f64 / 1e6;
    f.fake_posts = FleetStats::get(&c.stats.posts);
    f.fake_errors = FleetStats::get(&c.stats.errors);
    if f.fake_errors > 0 {
        println!(
            "  fake workers' last failed call: {}",
            c.stats.last_error.lock().unwrap_or_else(|e| e.into_inner())
        );
    }
    common::procs::log_problems(c.dir.path());
    Ok(f)
}

/// `XCE_SCALE_PERF=DIR`: `perf record -g` of the controller over the placement phase, to
/// `DIR/controller-<store>.perf` (read it with `perf report -i`).
struct Perf(Proc, std::path::PathBuf);

fn perf_record(pid: u32, store: &str) -> Result<Option<Perf>> {
    let Ok(dir) = std::env::var("XCE_SCALE_PERF") else {
        return Ok(None);
    };
    std::fs::create_dir_all(&dir)?;
    let out = std::path::Path::new(&dir).join(format!("controller-{store}.perf"));
    let mut cmd = Command::new("perf");
    cmd.args([
        "record",
        "-F",
        "199",
        "--call-graph",
        "dwarf,16384",
        "-p",
        &pid.to_string(),
        "-o",
    ])
    .arg(&out);
    let (p, _lines) = Proc::spawn("perf", cmd, out.with_extension("log"))?;
    // perf attaches within a moment; samples before that are lost, not wrong.
    Ok(Some(Perf(p, out)))
}

impl Perf {
    /// SIGINT (perf writes its file), then waits for it.
    fn finish(mut self) {
        common::procs::signal(self.0.pid(), libc::SIGINT);
        let _ = self.0.child.wait();
        println!("  perf profile of the controller: {}", self.1.display());
    }
}

fn count_endpoints(list: &Value) -> usize {
    list["services"].as_array().map_or(0, |s| {
        s.iter()
            .map(|e| e["endpoints"].as_array().map_or(0, Vec::len))
            .sum()
    })
}

// === the cluster ===

/// etcd (when asked for), the controller, at most one apiserver and the fleet, in a
/// temp dir in /dev/shm.
struct Cluster {
    // Dropped in this order: the fleet, apiserver, controller, etcd, then the dir.
    fleet: Vec<tokio::task::JoinHandle<()>>,
    apiserver: Option<(Proc, String)>,
    controller: Option<Proc>,
    etcd: Option<testkit::etcd::Etcd>,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    etcd_endpoint: Option<String>,
    base: String,
    http: reqwest::Client,
    stats: Arc<FleetStats>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for t in &self.fleet {
            t.abort();
        }
        self.apiserver.take();
        self.controller.take();
        if let Some(etcd) = self.etcd.take() {
            let pid = etcd.pid(0);
            drop(etcd);
            if let Some(pid) = pid {
                common::procs::forget_child(pid);
            }
        }
        ROOT.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// xced reads `XCE_*` settings from its environment and warns of unknown ones: the
/// bench's own knobs are not for it.
fn quiet_knobs(cmd: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("XCE_SCALE_") {
            cmd.env_remove(k);
        }
    }
}

fn host_ids(n: usize) -> Vec<HostId> {
    (0..n)
        .map(|i| HostId {
            host: format!("sim-{i:04}"),
            secret: format!("{:032x}{:032x}", 0x5ca1_e000_u128 + i as u128, 0xbe9c_u128),
            // 127.62.0.1, 127.62.0.2, ... (200 per /24): every host its own address.
            ip: format!("127.62.{}.{}", i / 200, i % 200 + 1),
        })
        .collect()
}

impl Cluster {
    async fn start(cfg: &Config, store: &str) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("xce-bench-controller-scale")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())?;
        *ROOT.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.path().to_owned());
        // Longer than the 30 s assignments query.
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(45))
            .build()?;
        let (etcd, etcd_endpoint) = if store == "etcd" {
            let etcd_dir = dir.path().to_owned();
            let limit = format!("--max-txn-ops={}", cfg.etcd_txn_ops);
            let etcd = tokio::task::spawn_blocking(move || {
                testkit::etcd::Etcd::start_in(&etcd_dir, 1, &[&limit])
            })
            .await??;
            keep_child(etcd.pid(0).context("etcd runs")?);
            let endpoint = etcd.endpoint().to_owned();
            (Some(etcd), Some(endpoint))
        } else {
            (None, None)
        };
        let hosts = host_ids(cfg.hosts);
        let mut tokens = format!(
            "[[token]]\nsecret = \"{ADMIN}\"\nprincipal = \"admin\"\n\
             grants = [ {{ permission = \"admin\", projects = [\"*\"] }} ]\n"
        );
        for h in &hosts {
            tokens += &format!(
                "\n[[worker]]\nhost = \"{}\"\nsecret = \"{}\"\n",
                h.host, h.secret
            );
        }
        std::fs::write(dir.path().join("tokens.toml"), tokens)?;
        let port = free_port();
        let config = dir.path().join("controller.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\ntokens = \"{}\"\n{}\
                 # 1,000 fake hosts share 2 cores with the controller: a late heartbeat is \
                 not a lost host.\n\
                 unreachable_after = \"30s\"\ngrace_period = \"60s\"\n\n\
                 [address]\nallow_loopback_hosts = [\"*\"]\n\n\
                 # Every fake host connects from 127.0.0.1.\n\
                 [connections]\nmax_per_client = 20000\n",
                dir.path().join("controller-data").display(),
                dir.path().join("tokens.toml").display(),
                etcd_endpoint
                    .as_ref()
                    .map(|e| format!(
                        "store = \"etcd://{e}\"\nleader_ttl = \"3s\"\netcd_max_txn_ops = {}\n",
                        cfg.etcd_txn_ops
                    ))
                    .unwrap_or_default()
                    + &match cfg.store_format {
                        0 => String::new(),
                        n => format!("store_format = {n}\n"),
                    },
            ),
        )?;
        let mut c = Cluster {
            fleet: Vec::new(),
            apiserver: None,
            controller: None,
            etcd,
            dir,
            config,
            etcd_endpoint,
            base: format!("http://127.0.0.1:{port}"),
            http,
            stats: FleetStats::new(),
        };
        c.spawn_controller()?;
        c.fleet = spawn_fleet(
            c.http.clone(),
            &c.base,
            hosts.clone(),
            GRACE,
            c.stats.clone(),
        );
        c.stats
            .wait_until("every host registered", PHASE_LIMIT, |s| {
                FleetStats::get(&s.registered) >= cfg.hosts
            })
            .await?;
        c.poll("every host ready in GET /v1/hosts", |c| async move {
            let hosts = c.get("/v1/hosts").await?;
            let ready = hosts["hosts"]
                .as_array()
                .map_or(0, |h| h.iter().filter(|h| h["state"] == "ready").count());
            Ok(ready >= cfg.hosts)
        })
        .await?;
        common::fake_worker::open_second_connections(&c.http, &c.base, &hosts).await?;
        Ok(c)
    }

    /// Starts the controller on the cluster's config; returns once it listens.
    fn spawn_controller(&mut self) -> Result<()> {
        let n = std::fs::read_dir(self.dir.path())?.count();
        let mut cmd = Command::new(xced());
        cmd.arg("controller")
            .arg("--config")
            .arg(&self.config)
            .env("XCE_LOG", "info");
        quiet_knobs(&mut cmd);
        let log = self.dir.path().join(format!("controller-{n}.log"));
        let (mut p, lines) = Proc::spawn("controller", cmd, log)?;
        wait_announce(&mut p, &lines)?;
        self.controller = Some(p);
        Ok(())
    }

    fn controller_pid(&self) -> u32 {
        self.controller.as_ref().map_or(0, Proc::pid)
    }

    fn etcd_pid(&self) -> Option<u32> {
        self.etcd.as_ref().and_then(|e| e.pid(0))
    }

    fn apiserver_base(&self) -> Option<String> {
        self.apiserver.as_ref().map(|(_, b)| b.clone())
    }

    async fn start_apiserver(&mut self) -> Result<()> {
        let endpoint = self
            .etcd_endpoint
            .clone()
            .context("an apiserver needs etcd")?;
        let config = self.dir.path().join("apiserver.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\ntokens = \"{}\"\nstore = \"etcd://{endpoint}\"\n",
                self.dir.path().join("tokens.toml").display()
            ),
        )?;
        let n = std::fs::read_dir(self.dir.path())?.count();
        let mut cmd = Command::new(xced());
        cmd.arg("apiserver")
            .arg("--config")
            .arg(&config)
            .env("XCE_LOG", "info");
        quiet_knobs(&mut cmd);
        let (mut p, lines) = Proc::spawn(
            "apiserver",
            cmd,
            self.dir.path().join(format!("apiserver-{n}.log")),
        )?;
        let addr = wait_announce(&mut p, &lines)?;
        self.apiserver = Some((p, format!("http://{addr}")));
        Ok(())
    }

    /// SIGTERM, then the same controller again: (time until it listens, time until it
    /// serves every replica ready), both from the start of the new process.
    async fn restart_controller(&mut self, replicas: usize) -> Result<(Duration, Duration)> {
        drop(self.controller.take());
        let t0 = Instant::now();
        self.spawn_controller()?;
        let listen = t0.elapsed();
        self.poll(
            "the restarted controller serving every replica",
            |c| async move {
                let ok = c
                    .http
                    .get(format!("{}/healthz", c.base))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200);
                Ok(ok && c.ready().await? == (replicas, replicas))
            },
        )
        .await?;
        let serving = t0.elapsed();
        println!(
            "  controller restarted: listening after {:.2}s, every replica served after {:.2}s",
            listen.as_secs_f64(),
            serving.as_secs_f64()
        );
        Ok((listen, serving))
    }

    /// A fresh apiserver: the time from its start until its `GET /v1/endpoints` equals
    /// the controller's.
    async fn restart_apiserver(&mut self) -> Result<Duration> {
        drop(self.apiserver.take());
        let want = self.endpoints(&self.base).await?;
        let t0 = Instant::now();
        self.start_apiserver().await?;
        let want = &want;
        self.poll(
            "the restarted apiserver's table equal to the controller's",
            |c| async move {
                let api = c.apiserver_base().context("apiserver")?;
                Ok(c.endpoints(&api).await.is_ok_and(|got| &got == want))
            },
        )
        .await?;
        let took = t0.elapsed();
        println!(
            "  apiserver restarted: its table equal to the controller's after {:.2}s ({} endpoints)",
            took.as_secs_f64(),
            count_endpoints(want)
        );
        Ok(took)
    }

    /// Reads a condition until it holds, every [`POLL`], at most [`PHASE_LIMIT`].
    async fn poll<'a, F, Fut>(&'a self, what: &str, check: F) -> Result<()>
    where
        F: Fn(&'a Self) -> Fut,
        Fut: std::future::Future<Output = Result<bool>> + 'a,
    {
        let deadline = Instant::now() + PHASE_LIMIT;
        loop {
            match check(self).await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                // A restarting controller refuses connections for a while.
                Err(e) if Instant::now() > deadline => return Err(e.context(what.to_owned())),
                Err(_) => {}
            }
            if Instant::now() > deadline {
                bail!("{what}: not within {PHASE_LIMIT:?}; fleet {:?}", self.stats);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn get(&self, path: &str) -> Result<Value> {
        self.get_at(&self.base, path).await
    }

    async fn get_at(&self, base: &str, path: &str) -> Result<Value> {
        let r = self
            .http
            .get(format!("{base}{path}"))
            .bearer_auth(ADMIN)
            .send()
            .await?;
        if r.status() != 200 {
            let st = r.status();
            bail!("GET {path}: HTTP {st}: {}", r.text().await?);
        }
        Ok(r.json().await?)
    }

    async fn endpoints(&self, base: &str) -> Result<Value> {
        self.get_at(base, "/v1/endpoints").await
    }

    async fn submit(&self, name: &str, replicas: usize) -> Result<()> {
        common::api::submit_sleeper(&self.http, &self.base, ADMIN, name, replicas)
            .await
            .context("XCE_SCALE_BIG and XCE_SCALE_EACH must be within the controller's per-service limit")
    }

    async fn delete(&self, name: &str) -> Result<()> {
        let r = self
            .http
            .delete(format!("{}/v1/services/{name}?now=true", self.base))
            .bearer_auth(ADMIN)
            .send()
            .await?;
        if !r.status().is_success() {
            let st = r.status();
            bail!("DELETE {name}: HTTP {st}: {}", r.text().await?);
        }
        Ok(())
    }

    /// The value of every sample of the controller's `/metrics` named `name` (with any
    /// labels) whose line `keep` accepts, summed.
    async fn metric_sum(&self, name: &str, keep: impl Fn(&str) -> bool) -> Result<f64> {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .bearer_auth(ADMIN)
            .send()
            .await?
            .text()
            .await?;
        Ok(sum_of(&text, name, keep))
    }

    /// etcd's write counters (transactions, keys put, bytes of the keys and values put),
    /// from its `/metrics`; `None` without etcd.
    async fn etcd_writes(&self) -> Result<Option<(f64, f64, f64)>> {
        let Some(endpoint) = &self.etcd_endpoint else {
            return Ok(None);
        };
        let text = self
            .http
            .get(format!("http://{endpoint}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        let get = |name| sum_of(&text, name, |_| true);
        Ok(Some((
            get("etcd_mvcc_txn_total"),
            get("etcd_mvcc_put_total"),
            get("etcd_debugging_mvcc_total_put_size_in_bytes"),
        )))
    }

    /// A counter of the controller's `/metrics` (`name` without `_total`), summed over
    /// its label sets.
    async fn counter(&self, name: &str) -> Result<f64> {
        self.metric_sum(&format!("{name}_total"), |_| true).await
    }

    /// Jobs the controller counts `placed` or `running` (`xce_jobs` on `/metrics`).
    async fn live_jobs(&self) -> Result<usize> {
        let n = self
            .metric_sum("xce_jobs", |l| {
                l.contains("state=\"placed\"") || l.contains("state=\"running\"")
            })
            .await?;
        Ok(n as usize)
    }

    /// (replicas, ready) summed over `GET /v1/services`.
    async fn ready(&self) -> Result<(usize, usize)> {
        let v = self.get("/v1/services").await?;
        let list = v
            .as_array()
            .or_else(|| v["services"].as_array())
            .context("GET /v1/services: no list")?;
        let sum = |k: &str| {
            list.iter()
                .map(|s| s[k].as_u64().unwrap_or(0) as usize)
                .sum()
        };
        Ok((sum("replicas"), sum("ready")))
    }

    /// Ports held, summed over the hosts' port pools in `GET /v1/hosts`.
    async fn ports_used(&self) -> Result<usize> {
        let v = self.get("/v1/hosts").await?;
        Ok(v["hosts"]
            .as_array()
            .context("GET /v1/hosts: no hosts")?
            .iter()
            .map(|h| h["ports"]["used"].as_u64().unwrap_or(0) as usize)
            .sum())
    }
}

/// The sum of the samples of metric `name` in a Prometheus text exposition, over the label
/// sets `keep` accepts.
fn sum_of(text: &str, name: &str, keep: impl Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter(|l| keep(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
