//! Test harness: real `xced`/`xcecli` binaries, real replica processes, real HTTP on
//! loopback. Every cluster gets its own temp dir and its own block of loopback addresses,
//! so tests run in parallel without sharing a port or a file.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long `eventually` waits; raise it on a slow machine with `XCE_TEST_PATIENCE=60`.
pub fn patience() -> Duration {
    let secs = std::env::var("XCE_TEST_PATIENCE").ok().and_then(|s| s.parse().ok()).unwrap_or(45);
    Duration::from_secs(secs)
}

/// Polls `check` until it returns `Ok(Some(v))`, up to `patience()`; the last error is in
/// the failure message. For conditions with no notification to wait on (a process
/// appearing), never for timing.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + patience();
    let mut last = String::from("condition not met");
    loop {
        match check().await {
            Ok(Some(v)) => return v,
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() > deadline {
            panic!("timed out after {:?} waiting for {what}: {last}", patience());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn bin(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let p = target.join("debug").join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins` before the tests (the README's test command does)",
        p.display()
    );
    p
}

/// A distinct /24 of loopback addresses per cluster, also across test processes.
fn next_ip_block() -> Ipv4Addr {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    Ipv4Addr::new(127, 100 + (pid % 100) as u8, (n % 250) as u8 + 1, 11)
}

/// Reads a child's stdout lines in a thread; hands them over a channel.
fn spawn_line_reader(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                // Keep draining so the child never blocks on a full pipe.
            }
        }
    });
    rx
}

fn wait_for_line(rx: &mpsc::Receiver<String>, prefix: &str) -> Result<String> {
    let deadline = Instant::now() + patience();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.starts_with(prefix) => return Ok(line),
            Ok(_) => continue,
            Err(_) => bail!("no line starting with {prefix:?} in time"),
        }
    }
}

/// Sends SIGTERM, waits up to 15 s, then SIGKILL.
pub fn terminate(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    signal(child.id(), libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid we own the child of, or a replica we look up; no memory.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// An HTTP client for the apiserver.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub token: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn new(base: &str, token: &str) -> Self {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
        Self { base: base.to_owned(), token: token.to_owned(), http }
    }
    pub fn with_token(&self, token: &str) -> Self {
        Self { token: token.to_owned(), ..self.clone() }
    }
    pub async fn get(&self, path: &str) -> Result<(u16, reqwest::header::HeaderMap, String)> {
        let r = self.http.get(format!("{}{}", self.base, path)).bearer_auth(&self.token).send().await?;
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        Ok((status, headers, r.text().await?))
    }
    pub async fn get_json(&self, path: &str) -> Result<Value> {
        let (status, _, body) = self.get(path).await?;
        if status != 200 {
            bail!("GET {path}: HTTP {status}: {body}");
        }
        Ok(serde_json::from_str(&body)?)
    }
    pub async fn submit_toml(&self, toml: &str) -> Result<(u16, Value)> {
        let r = self
            .http
            .post(format!("{}/v1/services", self.base))
            .bearer_auth(&self.token)
            .header("content-type", "application/toml")
            .body(toml.to_owned())
            .send()
            .await?;
        let status = r.status().as_u16();
        Ok((status, r.json().await.unwrap_or(Value::Null)))
    }
    pub async fn delete(&self, path: &str) -> Result<u16> {
        let r = self.http.delete(format!("{}{}", self.base, path)).bearer_auth(&self.token).send().await?;
        Ok(r.status().as_u16())
    }
    /// The ready endpoints of `service` as `address:port` lines (plain format).
    pub async fn plain(&self, service: &str) -> Result<Vec<String>> {
        let (status, _, body) = self.get(&format!("/v1/services/{service}/endpoints?format=plain")).await?;
        if status != 200 {
            bail!("plain endpoints of {service}: HTTP {status}: {body}");
        }
        Ok(body.lines().map(str::to_owned).collect())
    }
    /// Waits until `service` has exactly `n` ready endpoints; returns them.
    pub async fn wait_ready(&self, service: &str, n: usize) -> Vec<String> {
        eventually(&format!("{n} ready endpoints of {service}"), || async {
            let eps = self.plain(service).await?;
            Ok((eps.len() == n).then_some(eps))
        })
        .await
    }
}

/// `xced dev` in a child process.
pub struct DevCluster {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub api: Api,
    pub first_ip: Ipv4Addr,
    pub client_config: PathBuf,
    _lines: mpsc::Receiver<String>,
}

impl DevCluster {
    pub fn start(hosts: u16, demo: bool) -> Result<Self> {
        Self::start_with(hosts, demo, &[])
    }

    pub fn start_with(hosts: u16, demo: bool, extra: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let first_ip = next_ip_block();
        let client_config = dir.path().join("xcecli.toml");
        let mut cmd = Command::new(bin("xced"));
        cmd.arg("dev")
            .args(["--hosts", &hosts.to_string()])
            .args(["--listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--first-host-ip", &first_ip.to_string()])
            .arg("--client-config")
            .arg(&client_config)
            .args(extra)
            .env_remove("XCE_API")
            .env_remove("XCE_TOKEN")
            .env_remove("XCE_CONFIG")
            .env("XCE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(dir.path().join("xced.log"))?));
        if demo {
            cmd.arg("--demo");
        }
        let mut child = cmd.spawn().context("spawning xced dev")?;
        let lines = spawn_line_reader(&mut child);
        let line = match wait_for_line(&lines, "xced: apiserver listening on ") {
            Ok(l) => l,
            Err(e) => {
                terminate(&mut child);
                let log = std::fs::read_to_string(dir.path().join("xced.log")).unwrap_or_default();
                bail!("{e}; xced log:\n{log}");
            }
        };
        let base = line.trim_start_matches("xced: apiserver listening on ").trim().to_owned();
        // With --tokens, xced dev writes no client config: tests pick their tokens.
        let token = match std::fs::read_to_string(&client_config) {
            Ok(text) => {
                let cfg: toml::Table = toml::from_str(&text)?;
                cfg["token"].as_str().context("token in client config")?.to_owned()
            }
            Err(_) => String::new(),
        };
        if demo {
            wait_for_line(&lines, "xced: submitted service")?;
        }
        Ok(Self { child, api: Api::new(&base, &token), first_ip, client_config, dir, _lines: lines })
    }

    /// The address of dev host `i` (0-based).
    pub fn host_ip(&self, i: u8) -> Ipv4Addr {
        let o = self.first_ip.octets();
        Ipv4Addr::new(o[0], o[1], o[2], o[3] + i)
    }

    /// Runs `xcecli` hermetically against this cluster (cleared environment, pinned config).
    pub fn xcecli(&self, args: &[&str]) -> Output {
        xcecli_with(&self.client_config, args, &[])
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("xced.log")).unwrap_or_default()
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        terminate(&mut self.child);
        let o = self.first_ip.octets();
        let ips: Vec<String> = (0..=200u8)
            .map_while(|i| o[3].checked_add(i).map(|d| Ipv4Addr::new(o[0], o[1], o[2], d).to_string()))
            .collect();
        kill_leftover_replicas(&ips);
    }
}

/// `xcecli` with a cleared environment: only PATH, HOME (a temp-dir path) and `env`.
pub fn xcecli_with(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin("xcecli"));
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", config.parent().unwrap())
        .env("XCE_CONFIG", config)
        .args(args)
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running xcecli")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Kills the process listening on `addr` (a replica), found through its command line.
/// The demo replicas run `python3 -m http.server PORT --bind IP`.
pub fn kill_replica_listening_on(addr: &str) -> Result<u32> {
    let (ip, port) = addr.rsplit_once(':').context("addr:port")?;
    let needle = format!("http.server {port} --bind {ip}");
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) {
            signal(pid, libc::SIGKILL);
            return Ok(pid);
        }
    }
    bail!("no process found serving {addr}")
}

/// A plain HTTP GET to a replica: proves the process really listens and answers.
pub async fn http_ok(addr: &str) -> Result<bool> {
    let r = reqwest::Client::new().get(format!("http://{addr}/")).timeout(Duration::from_secs(5)).send().await?;
    Ok(r.status().is_success())
}

/// Last resort: replicas whose worker is gone (e.g. a test failed mid-way) carry this
/// cluster's host addresses on their command line (`--bind IP`).
pub fn kill_leftover_replicas(ips: &[String]) {
    let Ok(entries) = std::fs::read_dir("/proc") else { return };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if ips.iter().any(|ip| cmdline.contains(&format!("--bind {ip} ")) || cmdline.ends_with(&format!("--bind {ip}"))) {
            signal(pid, libc::SIGKILL);
        }
    }
}

