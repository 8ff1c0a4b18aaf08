//! The cluster shapes a run can use, behind one interface for the nemesis: its daemons
//! (by name), their pids, which of them can be killed and restarted, and their logs.

use crate::harness::{Api, Cluster, ClusterConfig, DevCluster};
use crate::nemesis::Caps;
use crate::proxy::{Cut, Proxy};
use anyhow::Result;
use testkit::small_fs::SmallFs;

/// The file that fills a small disk.
const FILLER: &str = "filler";
use std::path::PathBuf;

pub trait Shape {
    fn name(&self) -> &'static str;
    fn api(&self) -> Api;
    /// The daemons, by name (the fault schedule names them by index).
    fn daemons(&self) -> Vec<String>;
    fn pid(&self, daemon: usize) -> Option<u32>;
    fn kill9(&mut self, daemon: usize) {
        let _ = daemon;
        unreachable!("this shape kills nothing")
    }
    fn restart(&mut self, daemon: usize) -> Result<()> {
        let _ = daemon;
        unreachable!("this shape kills nothing")
    }
    /// The daemons' log files (for the report).
    fn logs(&self) -> Vec<PathBuf>;
    /// What the nemesis may do to each daemon (besides pausing it).
    fn caps(&self) -> Vec<Caps> {
        vec![Caps::default(); self.daemons().len()]
    }
    /// The APIs the readers and load clients spread over (the first: the writer's).
    fn reader_apis(&self) -> Vec<Api> {
        vec![self.api()]
    }
    /// Cuts `daemon` off from what it talks to (both ways or one way), or heals it.
    fn partition(&mut self, daemon: usize, cut: Cut) {
        let _ = (daemon, cut);
        unreachable!("this shape has no partitions")
    }
    /// Sets `daemon`'s wall-clock offset (`+0`: back to the true time).
    fn jump_clock(&mut self, daemon: usize, offset: &str) {
        let _ = (daemon, offset);
        unreachable!("this shape has no clock jumps")
    }
    /// Fills the filesystem under `daemon`'s data dir (`full`), or frees it and starts
    /// the daemon again if it stopped.
    fn fill_disk(&mut self, daemon: usize, full: bool) -> Result<()> {
        let _ = (daemon, full);
        unreachable!("this shape has no small disk")
    }
    /// Moves the etcd raft leadership to `daemon` (a member).
    fn move_leader(&mut self, daemon: usize) {
        let _ = daemon;
        unreachable!("this shape has no etcd")
    }
}

/// `xced dev` with two hosts: one process, which the nemesis pauses (a restarted dev
/// cluster is another cluster: it is not killed).
pub struct Dev(pub DevCluster);

impl Dev {
    pub fn start() -> Result<Self> {
        Ok(Self(DevCluster::start(2, false)?))
    }
}

impl Shape for Dev {
    fn name(&self) -> &'static str {
        "dev"
    }
    fn api(&self) -> Api {
        self.0.api.clone()
    }
    fn daemons(&self) -> Vec<String> {
        vec!["xced-dev".into()]
    }
    fn pid(&self, _: usize) -> Option<u32> {
        Some(self.0.child.id())
    }
    fn logs(&self) -> Vec<PathBuf> {
        vec![self.0.dir.path().join("xced.log")]
    }
}

/// A controller on redb and three workers, each its own process: any of them is paused
/// or killed -9 and restarted, and each worker reaches the controller through a proxy
/// (`proxy.rs`) the nemesis can cut. Each worker's dynamic port range is 12 ports.
///
/// The controller's data dir is a small tmpfs of the suite (where it may mount one), which
/// the nemesis fills: the controller answers 507 and stops (fail-stop); once the filler is
/// gone the nemesis starts it again.
pub struct Redb(pub Cluster, Vec<Proxy>, Option<Faketime>, Option<SmallFs>);

/// The size of the controller's tmpfs (a run's store stays far below it).
const DISK: &str = "32m";

/// libfaketime for the workers: each reads its wall-clock offset from a file of its own
/// (`FAKETIME_TIMESTAMP_FILE`, re-read every second), so the nemesis jumps a running
/// worker's clock by writing it; CLOCK_MONOTONIC stays untouched (`DONT_FAKE_MONOTONIC`).
/// Replicas do not inherit it (a worker gives them a clean environment).
pub struct Faketime {
    dir: tempfile::TempDir,
}

/// Where Debian's `faketime` package puts the library.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

impl Faketime {
    /// `None`, with a `SKIPPED:` line, where the library is not installed.
    fn new(workers: usize) -> Option<Self> {
        if !std::path::Path::new(LIBFAKETIME).exists() {
            println!("SKIPPED: clock jumps: {LIBFAKETIME} is missing (apt-get install faketime)");
            return None;
        }
        let me = Self {
            dir: tempfile::tempdir().ok()?,
        };
        for i in 0..workers {
            me.set(i, "+0");
        }
        Some(me)
    }
    fn file(&self, worker: usize) -> PathBuf {
        self.dir.path().join(format!("worker-{worker}"))
    }
    /// Sets worker `worker`'s wall-clock offset (`+1h`, `-10m`, `+0`).
    fn set(&self, worker: usize, offset: &str) {
        std::fs::write(self.file(worker), offset).expect("faketime file");
    }
    fn apply(&self, worker: usize, cmd: &mut std::process::Command) {
        cmd.env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME_TIMESTAMP_FILE", self.file(worker))
            .env("FAKETIME_CACHE_DURATION", "1")
            .env("DONT_FAKE_MONOTONIC", "1");
    }
}

impl Redb {
    /// Starts worker `i` (under libfaketime when the shape has it).
    fn start_worker(cluster: &mut Cluster, faketime: Option<&Faketime>, i: usize) -> Result<()> {
        let config = cluster.dir.path().join(format!("worker-{i}.toml"));
        cluster.start_worker_with(i, &config, |cmd| {
            if let Some(f) = faketime {
                f.apply(i, cmd);
            }
        })
    }
}

/// Workers of the redb shape.
const WORKERS: usize = 3;

impl Redb {
    /// `env` goes to every daemon (the planted bugs' switch).
    pub fn start(env: &[(&str, &str)]) -> Result<Self> {
        let disk = SmallFs::mount(DISK);
        if disk.is_none() {
            println!("SKIPPED: full disks: cannot mount a tmpfs here (needs root)");
        }
        let cfg = ClusterConfig {
            controller_data_dir: disk.as_ref().map(|d| d.path().join("controller")),
            // A small dynamic range: ports come back into use within a run, so a port
            // handed out while still held shows (validator 2).
            extra_worker: "[ports]\nrange = \"20000-20011\"\n".to_owned(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..ClusterConfig::default()
        };
        let mut cluster = Cluster::start(WORKERS, "30s", &cfg)?;
        // Each worker reaches the controller through a proxy of its own: restarted with
        // its config pointing there (no replica runs yet).
        let controller: std::net::SocketAddr =
            cluster.api.base.trim_start_matches("http://").parse()?;
        let mut proxies = Vec::new();
        let faketime = Faketime::new(WORKERS);
        for i in 0..WORKERS {
            let proxy = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(Proxy::start(controller))
            })?;
            let config = cluster.dir.path().join(format!("worker-{i}.toml"));
            let text = std::fs::read_to_string(&config)?.replace(
                &cluster.api.base,
                &format!("http://127.0.0.1:{}", proxy.port),
            );
            std::fs::write(&config, text)?;
            cluster.kill_worker(i);
            Self::start_worker(&mut cluster, faketime.as_ref(), i)?;
            proxies.push(proxy);
        }
        Ok(Self(cluster, proxies, faketime, disk))
    }
}

impl Shape for Redb {
    fn name(&self) -> &'static str {
        "redb"
    }
    fn api(&self) -> Api {
        self.0.api.clone()
    }
    fn daemons(&self) -> Vec<String> {
        std::iter::once("controller".to_owned())
            .chain((0..WORKERS).map(|i| format!("worker-{i}")))
            .collect()
    }
    fn pid(&self, daemon: usize) -> Option<u32> {
        match daemon {
            0 => self.0.controller_pid(),
            i => self.0.workers[i - 1].as_ref().map(std::process::Child::id),
        }
    }
    fn caps(&self) -> Vec<Caps> {
        (0..=WORKERS)
            .map(|d| Caps {
                kill: true,
                partition: d > 0,
                clock: d > 0 && self.2.is_some(),
                disk: d == 0 && self.3.is_some(),
                ..Caps::default()
            })
            .collect()
    }
    fn kill9(&mut self, daemon: usize) {
        match daemon {
            0 => self.0.kill_controller(),
            i => self.0.kill_worker(i - 1),
        }
    }
    fn restart(&mut self, daemon: usize) -> Result<()> {
        match daemon {
            0 => self.0.start_controller(),
            i => Self::start_worker(&mut self.0, self.2.as_ref(), i - 1),
        }
    }
    fn partition(&mut self, daemon: usize, cut: Cut) {
        self.1[daemon - 1].set(cut);
    }
    fn fill_disk(&mut self, _: usize, full: bool) -> Result<()> {
        let disk = self.3.as_ref().expect("the controller's tmpfs");
        if full {
            disk.fill(FILLER);
            return Ok(());
        }
        std::fs::remove_file(disk.path().join(FILLER))?;
        // A controller that stopped on the full disk (fail-stop) is started again.
        let stopped = self
            .0
            .controller
            .as_mut()
            .map(std::process::Child::try_wait);
        if !matches!(stopped, Some(Ok(None))) {
            self.0.kill_controller();
            self.0.start_controller()?;
        }
        Ok(())
    }
    fn jump_clock(&mut self, daemon: usize, offset: &str) {
        if let Some(f) = &self.2 {
            f.set(daemon - 1, offset);
        }
    }
    fn logs(&self) -> Vec<PathBuf> {
        self.daemons()
            .iter()
            .map(|d| self.0.dir.path().join(format!("{d}.log")))
            .collect()
    }
}
