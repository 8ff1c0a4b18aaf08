//! Child processes of a bench (etcd, `xced controller`s and `apiserver`s): killed when
//! dropped, on a panic, and by a watchdog past the bench's deadline, whatever happens.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc as std_mpsc, Mutex};
use std::time::{Duration, Instant};

/// Child processes to kill whatever happens, and the temp dir to remove.
pub(crate) static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());
pub(crate) static ROOT: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Kills every child on a panic, and everything (then exits 2) past `deadline`.
pub(crate) fn install_guards(deadline: Duration) {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        hook(info);
        kill_children();
    }));
    std::thread::spawn(move || {
        std::thread::sleep(deadline);
        eprintln!("bench: past its {deadline:?} deadline, killing it");
        kill_children();
        if let Some(root) = ROOT.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = std::fs::remove_dir_all(root);
        }
        std::process::exit(2);
    });
}

/// Registers a child started elsewhere (etcd from the test kit) to be killed.
pub(crate) fn keep_child(pid: u32) {
    CHILDREN.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
}

pub(crate) fn kill_children() {
    let pids = std::mem::take(&mut *CHILDREN.lock().unwrap_or_else(|e| e.into_inner()));
    for pid in pids {
        signal(pid, libc::SIGKILL);
    }
}

pub(crate) fn forget_child(pid: u32) {
    CHILDREN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|p| *p != pid);
}

pub(crate) use integration_tests::signal;

/// Raises the soft open-file limit to the hard one (children inherit it); returns it.
pub(crate) fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let r = getrlimit(Resource::Nofile);
    let soft = r.current.unwrap_or(u64::MAX);
    let want = r.maximum.unwrap_or(u64::MAX).min(1 << 20);
    if soft < want {
        let raised = Rlimit {
            current: Some(want),
            maximum: r.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return want;
        }
    }
    soft
}

pub(crate) fn xced() -> PathBuf {
    testkit::release_xced("run `cargo build --release --bin xced` (bench-scale.sh does)")
}

/// A child process, killed (and reaped) when dropped.
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl Proc {
    pub(crate) fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Result<(Self, Lines)> {
        let err = std::fs::File::create(&log)?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        CHILDREN
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(child.id());
        let stdout = child.stdout.take().context("piped stdout")?;
        let (tx, rx) = std_mpsc::channel();
        std::thread::spawn(move || {
            // Keep draining so the child never blocks on a full pipe.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Ok((
            Self {
                name: name.to_owned(),
                child,
                log,
            },
            rx,
        ))
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of its stderr log.
    pub(crate) fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

pub(crate) type Lines = std_mpsc::Receiver<String>;

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- {} ({}), last lines -----\n{}",
                self.name,
                self.log.display(),
                self.log_tail(40)
            );
        }
        if let Ok(None) = self.child.try_wait() {
            signal(self.child.id(), libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        forget_child(self.child.id());
    }
}

/// Waits for the `xced: apiserver listening on http://ADDR` line; returns ADDR.
pub(crate) fn wait_announce(proc_: &mut Proc, lines: &Lines) -> Result<SocketAddr> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left.min(Duration::from_millis(200))) {
            Ok(line) => {
                if let Some(addr) = line.split("listening on http://").nth(1) {
                    return addr
                        .trim()
                        .parse()
                        .with_context(|| format!("address in {line:?}"));
                }
            }
            Err(std_mpsc::RecvTimeoutError::Timeout) => {}
            Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                bail!(
                    "{} exited before announcing its listener:\n{}",
                    proc_.name,
                    proc_.log_tail(20)
                )
            }
        }
        if let Ok(Some(st)) = proc_.child.try_wait() {
            bail!("{} exited ({st}):\n{}", proc_.name, proc_.log_tail(20));
        }
        if Instant::now() > deadline {
            bail!(
                "{} did not announce its listener in 60s:\n{}",
                proc_.name,
                proc_.log_tail(20)
            );
        }
    }
}

/// Runs the bench on a 2-thread runtime, then kills whatever child is left.
pub(crate) fn run_to_end(bench: impl std::future::Future<Output = ()>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bench);
    drop(rt);
    kill_children();
}

/// Prints the warnings and errors the daemons logged into `dir/*.log` (a bench's answers
/// are checked; this shows what else went wrong, if anything).
pub(crate) fn log_problems(dir: &std::path::Path) {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    logs.retain(|p| p.extension().is_some_and(|e| e == "log"));
    logs.sort();
    println!();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let name = log.file_stem().unwrap_or_default().to_string_lossy();
        if name.starts_with("etcd") {
            // etcd logs its own warnings (slow fdatasync and the like) in JSON or
            // capnslog lines; count them only.
            let bad: Vec<&str> = text.lines().filter(|l| l.contains(" W | ")).collect();
            println!("daemon logs: etcd: {} warning lines", bad.len());
            for l in bad.iter().take(3) {
                println!("    {l}");
            }
            continue;
        }
        let bad: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect();
        println!("daemon logs: {name}: {} WARN/ERROR lines", bad.len());
        for l in bad.iter().take(5) {
            println!("    {l}");
        }
    }
}
