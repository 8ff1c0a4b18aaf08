//! Test harness: real `xced`/`xcecli` binaries, real replica processes, real HTTP on
//! loopback. Every cluster gets its own temp dir and its own block of loopback addresses,
//! so tests run in parallel without sharing a port or a file.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The test kit's shared pieces, under the names the tests have always used: `patience()`
/// (how long `eventually` waits; `XCE_TEST_PATIENCE=60` on a slow machine), `free_port`,
/// `rss_kib`, `http_body`.
pub use testkit::http::http_body;
pub use testkit::{free_port, patience, rss_kib};

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
            panic!(
                "timed out after {:?} waiting for {what}: {last}",
                patience()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
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

// === what a cluster owns: its addresses and its processes ===

/// How many address blocks there are: `127.200.1.0/24` to `127.249.250.0/24` (inside
/// `127.192.0.0/10`, which tests name as the hosts' network).
const IP_BLOCKS: u32 = 50 * 250;

/// A /24 of loopback addresses that no other cluster uses while this value lives, in this
/// test process or any other (`cargo nextest` runs a process per test): block `n`'s lock
/// file, `$TMPDIR/xce-e2e-blocks/<n>.lock`, is held with `flock` until it drops. The
/// kernel releases the lock when the process dies, however it dies, so a crashed test
/// leaves no block taken. Hosts are `.11` upwards of [`IpBlock::first`].
#[derive(Debug)]
pub struct IpBlock {
    first: Ipv4Addr,
    _lock: std::fs::File,
}

impl IpBlock {
    /// Claims the first free block from a start that differs per process and per call
    /// (so that concurrent processes rarely try the same files).
    pub fn claim() -> Self {
        use rustix::fs::{flock, FlockOperation};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join("xce-e2e-blocks");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let start = std::process::id()
            .wrapping_mul(7919)
            .wrapping_add(N.fetch_add(1, Ordering::Relaxed));
        for i in 0..IP_BLOCKS {
            let n = start.wrapping_add(i) % IP_BLOCKS;
            let path = dir.join(format!("{n}.lock"));
            // A file this user may not open (another user's) is a block taken.
            let Ok(file) = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
            else {
                continue;
            };
            // An flock belongs to the open file: a second open of the same file, in this
            // process too, is refused while the first holds it.
            if flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok() {
                return Self {
                    first: Ipv4Addr::new(127, 200 + (n / 250) as u8, (n % 250) as u8 + 1, 11),
                    _lock: file,
                };
            }
        }
        panic!(
            "no address block could be locked: all {IP_BLOCKS} taken, or {} not writable",
            dir.display()
        )
    }

    /// The block's first host address (`127.A.B.11`).
    pub fn first(&self) -> Ipv4Addr {
        self.first
    }
}

/// The environment variable that ties a daemon to the cluster that started it: every
/// daemon a cluster starts gets it ([`Owner::mark`]). Replicas do not inherit it (a
/// worker gives them a clean environment): they are known by their working directory,
/// their job directory inside the cluster's temp dir ([`Owner::within`]). Not `XCE_…`:
/// the daemons warn of an `XCE_` variable that is none of their settings.
pub const OWNER_VAR: &str = "E2E_CLUSTER_OWNER";

/// A cluster's mark on the processes it started, so that its teardown kills exactly
/// those: its daemons, and the replicas its workers leave running when they stop (`xced
/// worker` detaches on SIGTERM, and a SIGKILLed worker cannot stop them), whoever their
/// parent is by then. Nothing else on the machine carries it. The id starts with this
/// test process's id (`<pid>-<n>-<ns>`).
#[derive(Debug)]
pub struct Owner {
    id: String,
    /// The cluster's temp dir: a process working inside it (a replica in its job
    /// directory, a replica's log writer, what a replica started) is the cluster's.
    dir: Option<PathBuf>,
}

/// Every cluster dir of this test process ([`Owner::within`]), for
/// [`kill_replica_listening_on`].
static CLUSTER_DIRS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Whether process `pid` works inside one of `dirs` (`/proc/<pid>/cwd`).
fn works_in(pid: &Path, dirs: &[PathBuf]) -> bool {
    std::fs::read_link(pid.join("cwd")).is_ok_and(|cwd| dirs.iter().any(|d| cwd.starts_with(d)))
}

impl Owner {
    /// An owner whose processes are also those working inside `dir` (its replicas).
    pub fn within(dir: &Path) -> Self {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
        CLUSTER_DIRS.lock().unwrap().push(dir.clone());
        Self {
            dir: Some(dir),
            ..Self::new()
        }
    }

    pub fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Self {
            id: format!(
                "{}-{}-{nanos}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
            dir: None,
        }
    }

    /// Marks a process this cluster starts.
    pub fn mark<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        cmd.env(OWNER_VAR, &self.id)
    }

    /// Live processes that carry the mark (`/proc/<pid>/environ`; a zombie has none) or
    /// work inside the cluster's dir.
    pub fn pids(&self) -> Vec<u32> {
        let needle = format!("{OWNER_VAR}={}", self.id);
        let dirs: Vec<PathBuf> = self.dir.iter().cloned().collect();
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if pid == std::process::id() {
                continue;
            }
            let marked = std::fs::read(entry.path().join("environ")).is_ok_and(|environ| {
                environ
                    .split(|&b| b == 0)
                    .any(|var| var == needle.as_bytes())
            });
            if marked || works_in(&entry.path(), &dirs) {
                pids.push(pid);
            }
        }
        pids
    }

    /// SIGKILLs every process that carries the mark, until none is left (a replica may
    /// start a child meanwhile; it carries the mark too). None is left when two scans
    /// 20 ms apart find none: a process in the middle of an `exec` (a replica's `sh -c
    /// "exec python3 …"`) shows no environment for that moment, and a single empty scan
    /// once let such a replica outlive its test.
    pub fn kill_all(&self) {
        let deadline = Instant::now() + patience();
        let mut empty_scans = 0;
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                empty_scans += 1;
                if empty_scans == 2 {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            empty_scans = 0;
            if Instant::now() > deadline {
                eprintln!("processes of cluster {} still alive: {pids:?}", self.id);
                return;
            }
            for pid in pids {
                signal(pid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Default for Owner {
    fn default() -> Self {
        Self::new()
    }
}

/// A cluster's teardown, in well under a second: SIGKILL to each of its daemons (reaped),
/// then to every process still carrying its mark (the replicas). The temp dir goes with
/// the test, so nothing a graceful stop would save is needed; the graceful stops are
/// tests of their own.
pub fn teardown<'a>(daemons: impl IntoIterator<Item = &'a mut Child>, owner: &Owner) {
    for child in daemons {
        let _ = child.kill();
        let _ = child.wait();
    }
    owner.kill_all();
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

pub use integration_tests::signal;

/// An HTTP client for the apiserver.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub token: String,
    pub http: reqwest::Client,
    /// How `http` was made (its CA file, the worker instance it presents), so that
    /// [`Api::fresh`] can make another.
    ca_file: Option<PathBuf>,
    instance: Option<String>,
}

/// A client for [`Api`]: 20 s timeout, the CA of `ca_file` trusted, `X-Xce-Worker-Instance`
/// (and `X-Xce-Worker-Session`) on every request when given (`instance`: the instance id
/// and, after a space, the session secret).
fn api_client(ca_file: Option<&Path>, instance: Option<&str>) -> reqwest::Client {
    let mut http = reqwest::Client::builder().timeout(Duration::from_secs(20));
    if let Some(ca) = ca_file {
        let tls = control_tls::client::client_config(Some(ca)).expect("a usable ca file");
        http = http.tls_backend_preconfigured(tls);
    }
    if let Some(worker) = instance {
        let mut headers = reqwest::header::HeaderMap::new();
        let (instance, session) = worker.split_once(' ').unwrap_or((worker, ""));
        headers.insert(
            "x-xce-worker-instance",
            reqwest::header::HeaderValue::from_str(instance).expect("an instance id is ASCII"),
        );
        if !session.is_empty() {
            headers.insert(
                "x-xce-worker-session",
                reqwest::header::HeaderValue::from_str(session).expect("a session is hex"),
            );
        }
        http = http.default_headers(headers);
    }
    http.build().unwrap()
}

impl Api {
    pub fn new(base: &str, token: &str) -> Self {
        Self::with_ca(base, token, None)
    }
    /// An `https://` apiserver whose certificate `ca_file` (PEM) signed.
    pub fn with_ca(base: &str, token: &str, ca_file: Option<&Path>) -> Self {
        Self {
            base: base.to_owned(),
            token: token.to_owned(),
            http: api_client(ca_file, None),
            ca_file: ca_file.map(Path::to_owned),
            instance: None,
        }
    }
    pub fn with_token(&self, token: &str) -> Self {
        Self {
            token: token.to_owned(),
            ..self.clone()
        }
    }
    /// The same API with a client of its own (no pooled connection shared): for another
    /// runtime than the one `self`'s connections were made on, whose reactor may not run
    /// while that other runtime waits (a blocked test thread).
    pub fn fresh(&self) -> Self {
        Self {
            http: api_client(self.ca_file.as_deref(), self.instance.as_deref()),
            ..self.clone()
        }
    }
    /// This API acting as worker instance `instance` (`X-Xce-Worker-Instance` on every
    /// request): a test that plays a worker, or a compromised host, presents the id its
    /// worker's data dir holds.
    pub fn as_worker_instance(&self, instance: &str) -> Self {
        Self {
            http: api_client(self.ca_file.as_deref(), Some(instance)),
            instance: Some(instance.to_owned()),
            ..self.clone()
        }
    }
    /// This API acting as worker instance `instance` with its session secret `session`:
    /// a test that plays a compromised host which has the worker's whole data dir.
    pub fn as_worker_session(&self, instance: &str, session: &str) -> Self {
        self.as_worker_instance(&format!("{instance} {session}"))
    }
    pub async fn get(&self, path: &str) -> Result<(u16, reqwest::header::HeaderMap, String)> {
        let r = self
            .http
            .get(format!("{}{}", self.base, path))
            .bearer_auth(&self.token)
            .send()
            .await?;
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
    /// `POST /v1/services` (create only).
    pub async fn submit_toml(&self, toml: &str) -> Result<(u16, Value)> {
        self.send_toml(reqwest::Method::POST, "/v1/services", toml)
            .await
    }
    /// `PUT /v1/services/{name}` (create or update: a rollout).
    pub async fn put_toml(&self, name: &str, toml: &str) -> Result<(u16, Value)> {
        self.send_toml(reqwest::Method::PUT, &format!("/v1/services/{name}"), toml)
            .await
    }
    async fn send_toml(
        &self,
        method: reqwest::Method,
        path: &str,
        toml: &str,
    ) -> Result<(u16, Value)> {
        let r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .header("content-type", "application/toml")
            .body(toml.to_owned())
            .send()
            .await?;
        let status = r.status().as_u16();
        Ok((status, r.json().await.unwrap_or(Value::Null)))
    }
    /// `POST /v1/services/{service}/scale`: the status and the body.
    pub async fn scale(&self, service: &str, replicas: u32) -> Result<(u16, String)> {
        let r = self
            .http
            .post(format!("{}/v1/services/{service}/scale", self.base))
            .bearer_auth(&self.token)
            .json(&serde_json::json!({ "replicas": replicas }))
            .send()
            .await?;
        Ok((r.status().as_u16(), r.text().await?))
    }
    pub async fn delete(&self, path: &str) -> Result<u16> {
        let r = self
            .http
            .delete(format!("{}{}", self.base, path))
            .bearer_auth(&self.token)
            .send()
            .await?;
        Ok(r.status().as_u16())
    }
    /// The ready endpoints of `service` as `address:port` lines (plain format).
    pub async fn plain(&self, service: &str) -> Result<Vec<String>> {
        let (status, _, body) = self
            .get(&format!("/v1/services/{service}/endpoints?format=plain"))
            .await?;
        if status != 200 {
            bail!("plain endpoints of {service}: HTTP {status}: {body}");
        }
        Ok(body.lines().map(str::to_owned).collect())
    }
    /// [`Api::wait_ready`], then until the service's rollout is complete: a new service is
    /// settled then, with nothing more coming from its start. (The rollout's end is a
    /// change of the service of its own, which raises its entry's index: a blocking query
    /// parked at the index read before it would be answered by it.)
    pub async fn wait_settled(&self, service: &str, n: usize) -> Vec<String> {
        let eps = self.wait_ready(service, n).await;
        eventually(&format!("{service}'s rollout complete"), || async {
            let d = self.get_json(&format!("/v1/services/{service}")).await?;
            Ok((d["rollout"]["state"] == "complete").then_some(()))
        })
        .await;
        eps
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
    _block: IpBlock,
    owner: Owner,
}

impl DevCluster {
    pub fn start(hosts: u16, demo: bool) -> Result<Self> {
        Self::start_with(hosts, demo, &[])
    }

    pub fn start_with(hosts: u16, demo: bool, extra: &[&str]) -> Result<Self> {
        Self::start_inner(hosts, demo, extra, None, false)
    }

    /// [`DevCluster::start`] as a user starts it: no `XCE_LOG`, so the full log goes to
    /// `DATA_DIR/xced.log` (the console, this cluster's `xced.log`, gets warnings).
    pub fn start_logging_to_file(hosts: u16, demo: bool) -> Result<Self> {
        Self::start_inner(hosts, demo, &[], None, true)
    }

    /// [`DevCluster::start`] with the daemon's open-file limit set to `(soft, hard)` before
    /// it starts (xced raises its soft limit to the hard one itself).
    /// A dev cluster with the [`TWO_TENANTS`] tokens file (alice on `team-a`, bob on
    /// `team-b`); the returned directory holds the file and must outlive the cluster.
    pub fn two_tenants(hosts: u16) -> (tempfile::TempDir, Self) {
        let dir = tempfile::tempdir().expect("tokens dir");
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, TWO_TENANTS).expect("tokens file");
        let c = Self::start_with(hosts, false, &["--tokens", tokens.to_str().unwrap()])
            .expect("dev cluster");
        (dir, c)
    }

    pub fn start_with_nofile(hosts: u16, soft: u64, hard: u64) -> Result<Self> {
        Self::start_inner(hosts, false, &[], Some((soft, hard)), false)
    }

    fn start_inner(
        hosts: u16,
        demo: bool,
        extra: &[&str],
        nofile: Option<(u64, u64)>,
        file_log: bool,
    ) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let block = IpBlock::claim();
        let first_ip = block.first();
        let owner = Owner::within(dir.path());
        let client_config = dir.path().join("xcecli.toml");
        // A limit for xced alone: prlimit(1) sets it on itself and execs xced (same pid).
        let mut cmd = match nofile {
            Some((soft, hard)) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={soft}:{hard}"))
                    .arg("--")
                    .arg(bin("xced"));
                c
            }
            None => Command::new(bin("xced")),
        };
        owner.mark(&mut cmd);
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
            .env_remove("RUST_LOG")
            .env("XCE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(
                dir.path().join("xced.log"),
            )?));
        if demo {
            cmd.arg("--demo");
        }
        if file_log {
            cmd.env_remove("XCE_LOG");
        }
        let mut child = cmd.spawn().context("spawning xced dev")?;
        let lines = spawn_line_reader(&mut child);
        let line = match wait_for_line(&lines, "xced: apiserver listening on ") {
            Ok(l) => l,
            Err(e) => {
                teardown([&mut child], &owner);
                let log = std::fs::read_to_string(dir.path().join("xced.log")).unwrap_or_default();
                bail!("{e}; xced log:\n{log}");
            }
        };
        let base = line
            .trim_start_matches("xced: apiserver listening on ")
            .trim()
            .to_owned();
        // With --tokens, xced dev writes no client config: tests pick their tokens.
        let (token, ca_file) = match std::fs::read_to_string(&client_config) {
            Ok(text) => {
                let cfg: toml::Table = toml::from_str(&text)?;
                let token = cfg["token"]
                    .as_str()
                    .context("token in client config")?
                    .to_owned();
                (
                    token,
                    cfg.get("ca_file")
                        .and_then(|c| c.as_str())
                        .map(PathBuf::from),
                )
            }
            Err(_) => (String::new(), None),
        };
        let api = Api::with_ca(&base, &token, ca_file.as_deref());
        if demo {
            wait_for_line(&lines, "xced: submitted service")?;
        }
        // `xced dev` announces its listener before its workers have registered; a test
        // starts once every host is there (with --tokens the test's own tokens decide
        // what it may see, so only without them).
        if !token.is_empty() {
            wait_for_hosts_of(&api, hosts as usize)?;
        }
        Ok(Self {
            child,
            api,
            first_ip,
            client_config,
            dir,
            _lines: lines,
            _block: block,
            owner,
        })
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
        teardown([&mut self.child], &self.owner);
        // A failing test shows what the daemon said last: the only record CI keeps of it.
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(80)..].join("\n");
            eprintln!(
                "--- last {} lines of xced.log ---\n{tail}",
                lines.len().min(80)
            );
        }
    }
}

/// Waits until `/v1/hosts` lists `n` ready hosts (in a thread of its own: the callers are
/// synchronous, often inside an async test).
fn wait_for_hosts(base: &str, token: &str, n: usize) -> Result<()> {
    wait_for_hosts_of(&Api::new(base, token), n)
}

/// [`wait_for_hosts`] through `api` (an https one, say).
pub fn wait_for_hosts_of(api: &Api, n: usize) -> Result<()> {
    let api = api.fresh();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let deadline = Instant::now() + patience();
            loop {
                if let Ok(h) = api.get_json("/v1/hosts").await {
                    let ready = h["hosts"]
                        .as_array()
                        .map_or(0, |a| a.iter().filter(|h| h["state"] == "ready").count());
                    if ready == n {
                        return Ok(());
                    }
                }
                if Instant::now() > deadline {
                    bail!("{n} dev hosts did not register in time");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    })
    .join()
    .expect("host wait thread")
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
/// The demo replicas run `python3 -m http.server PORT --bind IP`. Only a process that a
/// cluster of this test process started (it works in one of its cluster dirs) is a
/// candidate: whatever else runs on the machine is left alone.
pub fn kill_replica_listening_on(addr: &str) -> Result<u32> {
    let (ip, port) = addr.rsplit_once(':').context("addr:port")?;
    let needle = format!("http.server {port} --bind {ip}");
    let ours = format!("{OWNER_VAR}={}-", std::process::id());
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let marked = || {
            std::fs::read(entry.path().join("environ")).is_ok_and(|env| {
                env.split(|&b| b == 0)
                    .any(|var| var.starts_with(ours.as_bytes()))
            }) || works_in(&entry.path(), &CLUSTER_DIRS.lock().unwrap())
        };
        if cmdline.contains(&needle) && marked() {
            signal(pid, libc::SIGKILL);
            return Ok(pid);
        }
    }
    bail!("no process found serving {addr}")
}

/// A plain HTTP GET to a replica: proves the process really listens and answers.
pub async fn http_ok(addr: &str) -> Result<bool> {
    let r = reqwest::Client::new()
        .get(format!("http://{addr}/"))
        .timeout(Duration::from_secs(5))
        .send()
        .await?;
    Ok(r.status().is_success())
}

// === impl Cluster ===

pub const ADMIN: &str = "admin-example-secret-for-tests";

/// A controller and workers as separate processes, sharing a temp dir.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub first_ip: Ipv4Addr,
    /// Held until the cluster's processes are dead (fields drop after `drop`).
    _block: IpBlock,
    /// Marks every daemon the cluster starts, and so their replicas.
    pub owner: Owner,
    pub controller: Option<Child>,
    pub workers: Vec<Option<Child>>,
    pub api: Api,
    /// `XCE_LOG` of the controller.
    controller_log: String,
    /// More environment for every daemon ([`ClusterConfig::env`]).
    env: Vec<(String, String)>,
}

/// What a [`Cluster`] starts with beyond its defaults ([`Cluster::start`]).
#[derive(Debug, Clone, Default)]
pub struct ClusterConfig {
    /// More `[[token]]`s for the tokens file.
    pub extra_tokens: String,
    /// Top-level keys for every worker's config (before its `[address]` table).
    pub extra_worker: String,
    /// Keys added to controller.toml's `[address]` table (e.g. `networks = [...]`).
    pub controller_address: String,
    /// Tables appended to controller.toml (e.g. `[quotas.default]`).
    pub controller_tables: String,
    /// The controller's `XCE_LOG` (default `info`).
    pub controller_log: Option<String>,
    /// The controller's `data_dir` (default: `controller` in the cluster's temp dir).
    pub controller_data_dir: Option<PathBuf>,
    /// Environment variables for the controller and every worker (the robustness suite's
    /// planted bugs are switched on this way).
    pub env: Vec<(String, String)>,
}

/// A tokens file: the admin token ([`ADMIN`]) and a `[[worker]]` `exec-NN` with secret
/// `worker-I-secret` for each of `workers`.
pub fn admin_and_worker_tokens(workers: usize) -> String {
    let mut tokens = format!(
        "[[token]]\nsecret = \"{ADMIN}\"\nprincipal = \"admin\"\ngrants = [ {{ permission = \"admin\", projects = [\"*\"] }} ]\n"
    );
    for i in 0..workers {
        tokens += &format!(
            "\n[[worker]]\nhost = \"exec-{:02}\"\nsecret = \"worker-{i}-example-secret\"\n",
            i + 1
        );
    }
    tokens
}

impl Cluster {
    pub fn new(hosts: usize, grace: &str) -> Result<Self> {
        Self::new_with(hosts, grace, "", "")
    }

    /// `extra_tokens` is appended to the tokens file (more `[[token]]`s), `extra_worker`
    /// to every worker's config (top-level keys, before its `[address]` table).
    pub fn new_with(
        hosts: usize,
        grace: &str,
        extra_tokens: &str,
        extra_worker: &str,
    ) -> Result<Self> {
        Self::start(
            hosts,
            grace,
            &ClusterConfig {
                extra_tokens: extra_tokens.to_owned(),
                extra_worker: extra_worker.to_owned(),
                ..ClusterConfig::default()
            },
        )
    }

    pub fn start(hosts: usize, grace: &str, cfg: &ClusterConfig) -> Result<Self> {
        let ClusterConfig {
            extra_tokens,
            extra_worker,
            controller_address,
            controller_tables,
            controller_log,
            controller_data_dir,
            env,
        } = cfg;
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let block = IpBlock::claim();
        let first_ip = block.first();
        let tokens = admin_and_worker_tokens(hosts) + extra_tokens;
        std::fs::write(dir.path().join("tokens.toml"), tokens)?;
        std::fs::write(
            dir.path().join("controller.toml"),
            format!(
                "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\ntokens = \"{}\"\nunreachable_after = \"2s\"\ngrace_period = \"{grace}\"\n\n[address]\nallow_loopback_hosts = [\"*\"]\n{controller_address}\n{controller_tables}\n",
                controller_data_dir
                    .clone()
                    .unwrap_or_else(|| dir.path().join("controller"))
                    .display(),
                dir.path().join("tokens.toml").display()
            ),
        )?;
        for i in 0..hosts {
            let o = first_ip.octets();
            let ip = Ipv4Addr::new(o[0], o[1], o[2], o[3] + i as u8);
            std::fs::write(
                dir.path().join(format!("worker-{i}.toml")),
                format!(
                    "host = \"exec-{:02}\"\ncontroller = \"http://127.0.0.1:{port}\"\ncredential = \"worker-{i}-example-secret\"\ndata_dir = \"{}\"\nstop_timeout = \"3s\"\n{extra_worker}\n[address]\nadvertise = \"{ip}\"\nallow_loopback = true\n",
                    i + 1,
                    dir.path().join(format!("worker-{i}")).display()
                ),
            )?;
        }
        let api = Api::new(&format!("http://127.0.0.1:{port}"), ADMIN);
        let owner = Owner::within(dir.path());
        let mut c = Self {
            dir,
            first_ip,
            _block: block,
            owner,
            controller: None,
            workers: Vec::new(),
            api,
            controller_log: controller_log.clone().unwrap_or_else(|| "info".to_owned()),
            env: env.clone(),
        };
        c.start_controller()?;
        for i in 0..hosts {
            c.workers.push(None);
            c.start_worker(i)?;
        }
        // Placement spreads over the hosts that are there: start once all of them are.
        wait_for_hosts(&c.api.base, ADMIN, hosts)?;
        Ok(c)
    }

    pub fn log(&self, name: &str) -> Result<Stdio> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))?;
        Ok(Stdio::from(f))
    }

    pub fn start_controller(&mut self) -> Result<()> {
        let mut child = self
            .owner
            .mark(&mut Command::new(bin("xced")))
            .arg("controller")
            .arg("--config")
            .arg(self.dir.path().join("controller.toml"))
            .env("XCE_LOG", &self.controller_log)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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
            let line = rx
                .recv_timeout(left)
                .context("controller did not announce its listener")?;
            if line.contains("apiserver listening on") {
                break;
            }
        }
        self.controller = Some(child);
        Ok(())
    }

    pub fn kill_controller(&mut self) {
        if let Some(mut c) = self.controller.take() {
            let _ = c.kill(); // SIGKILL: no chance to flush anything
            let _ = c.wait();
        }
    }

    pub fn start_worker(&mut self, i: usize) -> Result<()> {
        let config = self.dir.path().join(format!("worker-{i}.toml"));
        self.start_worker_with(i, &config, |_| {})
    }

    /// [`Cluster::start_worker`] with another config file, and `adjust` changing the
    /// command first (its working directory, its environment).
    pub fn start_worker_with(
        &mut self,
        i: usize,
        config: &Path,
        adjust: impl FnOnce(&mut Command),
    ) -> Result<()> {
        let mut cmd = Command::new(bin("xced"));
        self.owner
            .mark(&mut cmd)
            .arg("worker")
            .arg("--config")
            .arg(config);
        adjust(&mut cmd);
        let child = cmd
            .env("XCE_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.log(&format!("worker-{i}"))?)
            .spawn()?;
        self.workers[i] = Some(child);
        Ok(())
    }

    /// Worker `i`'s instance id (the `instance` file in its data dir).
    pub fn worker_instance(&self, i: usize) -> String {
        let path = self.dir.path().join(format!("worker-{i}")).join("instance");
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .to_owned()
    }

    /// Worker `i`'s session secret (the `session` file in its data dir).
    pub fn worker_session(&self, i: usize) -> String {
        let path = self.dir.path().join(format!("worker-{i}")).join("session");
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .to_owned()
    }

    pub fn kill_worker(&mut self, i: usize) {
        if let Some(mut w) = self.workers[i].take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }

    pub fn controller_pid(&self) -> Option<u32> {
        self.controller.as_ref().map(Child::id)
    }

    pub fn host_ip(&self, i: usize) -> String {
        let o = self.first_ip.octets();
        Ipv4Addr::new(o[0], o[1], o[2], o[3] + i as u8).to_string()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let daemons = self
            .workers
            .iter_mut()
            .flatten()
            .chain(self.controller.as_mut());
        teardown(daemons, &self.owner);
    }
}

// === reliability helpers ===

/// CLOCK_MONOTONIC in nanoseconds: the clock Python's `time.monotonic_ns()` reads, so the
/// test and the replica processes stamp events on one timeline.
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A replica for the reliability scenarios: serves HTTP on `$XCE_PORT_HTTP`; `/ready`
/// answers by the mode file `<ctl>/mode-<service>-<replica>` ("up" or missing: 200, "down":
/// 503, "flap": 200/503 by 100 ms window of the monotonic clock, "toggle": the opposite
/// of its last answer). It appends `start <ns> <port> <pid>`, every `probe <ns> <code>`
/// and `exit <ns> <port>` to `<ctl>/<service>-<job>.log`. On SIGTERM it waits
/// `term_delay` seconds (argv[2]) before it exits, like a replica draining its clients.
pub const REPLICA_PY: &str = r#"
import http.server, os, signal, sys, time
ctl = sys.argv[1]
term_delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
port = int(os.environ['XCE_PORT_HTTP'])
ip = os.environ['XCE_HOST_IP']
svc = os.environ['XCE_SERVICE']
rep = os.environ['XCE_REPLICA']
job = os.environ['XCE_JOB_ID']
logf = open(os.path.join(ctl, svc + '-' + job + '.log'), 'a', buffering=1)
last = [503]
def note(s):
    logf.write(s + '\n')
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        code = 200
        if self.path == '/ready':
            # Stamped before the mode is read: an answer stamped after a mode change
            # answers by the new mode.
            t = time.monotonic_ns()
            try:
                mode = open(os.path.join(ctl, 'mode-' + svc + '-' + rep)).read().strip()
            except OSError:
                mode = 'up'

            if mode == 'down':
                code = 503
            elif mode == 'flap':
                code = 200 if (t // 100000000) % 2 == 0 else 503
            elif mode == 'toggle':
                code = 200 if last[0] == 503 else 503
            last[0] = code
            note('probe %d %d' % (t, code))
        self.send_response(code)
        self.send_header('content-length', '0')
        self.end_headers()
def term(*_):
    time.sleep(term_delay)
    note('exit %d %d' % (time.monotonic_ns(), port))
    os._exit(0)
signal.signal(signal.SIGTERM, term)
srv = http.server.HTTPServer((ip, port), H)
note('start %d %d %d' % (time.monotonic_ns(), port, os.getpid()))
srv.serve_forever()
"#;

/// A temp dir with [`REPLICA_PY`] and its control dir. Declare it before the cluster: it
/// drops after it, and kills any replica still running the script from this dir.
pub struct ReplicaDir {
    _dir: tempfile::TempDir,
    pub script: PathBuf,
    pub ctl: PathBuf,
}

impl ReplicaDir {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("replica.py");
        std::fs::write(&script, REPLICA_PY).unwrap();
        let ctl = dir.path().join("ctl");
        std::fs::create_dir_all(&ctl).unwrap();
        Self {
            _dir: dir,
            script,
            ctl,
        }
    }

    pub fn profile(
        &self,
        name: &str,
        replicas: u32,
        term_delay: &str,
        interval: &str,
        extra_ports: usize,
    ) -> String {
        replica_profile(
            name,
            replicas,
            &self.script,
            &self.ctl,
            term_delay,
            interval,
            extra_ports,
        )
    }

    /// Pids of live processes running this dir's script.
    pub fn live_pids(&self) -> Vec<u32> {
        pids_with_cmdline(&self.script.to_string_lossy())
    }
}

/// Pids of live processes whose command line contains `needle` (a test's own script or
/// file path: what to kill when the test ends, whatever happened to the daemons).
pub fn pids_with_cmdline(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

impl Drop for ReplicaDir {
    fn drop(&mut self) {
        for pid in self.live_pids() {
            signal(pid, libc::SIGKILL);
        }
    }
}

/// A profile running [`REPLICA_PY`]: port `http` (+ `extra_ports` more), http readiness on
/// `/ready` every `interval`.
pub fn replica_profile(
    name: &str,
    replicas: u32,
    script: &Path,
    ctl: &Path,
    term_delay: &str,
    interval: &str,
    extra_ports: usize,
) -> String {
    let mut p = format!(
        "[service]\nname = \"{name}\"\nreplicas = {replicas}\ncommand = [\"python3\", \"{}\", \"{}\", \"{term_delay}\"]\n[[service.ports]]\nname = \"http\"\n",
        script.display(),
        ctl.display()
    );
    for i in 0..extra_ports {
        // Long names make a fat entry (the watch-load scenario wants big events).
        p += &format!("[[service.ports]]\nname = \"port-padding-{i:02}\"\n");
    }
    p += TEST_MIN_READY;
    p += &format!("[service.readiness]\nhttp = {{ port = \"http\", path = \"/ready\" }}\ninterval = \"{interval}\"\n");
    p
}

/// The `[service.update]` table of the harness's profiles: `min_ready` 500 ms rather than
/// the default 10 s, so a test that does not test `min_ready` does not wait 10 s for every
/// rollout (a service's creation included) to complete. `rollout_meaning.rs` keeps the
/// default. Written before `[service.readiness]`, which callers may append lines to.
pub const TEST_MIN_READY: &str = "[service.update]\nmin_ready = \"500ms\"\n";

/// Appended to a [`replica_profile`] (its `[service.readiness]` table comes last): a
/// probe's timeout that a loaded machine does not hit. By default the timeout is the
/// interval, and at 100 or 200 ms a busy machine times probes out, so replicas drop out of
/// their endpoints and stop changing when the test wants them to (a condition the test
/// waits for then never comes).
pub const UNDER_LOAD_TIMEOUT: &str = "timeout = \"1s\"\n";

pub fn set_mode(ctl: &Path, service: &str, replica: u32, mode: &str) {
    let tmp = ctl.join(format!(".mode-{service}-{replica}.tmp"));
    std::fs::write(&tmp, mode).unwrap();
    std::fs::rename(&tmp, ctl.join(format!("mode-{service}-{replica}"))).unwrap();
}

/// One line of a replica log: (kind, monotonic ns, rest).
pub fn replica_log(ctl: &Path, service: &str, job: &str) -> Vec<(String, u64, Vec<u64>)> {
    let text =
        std::fs::read_to_string(ctl.join(format!("{service}-{job}.log"))).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let kind = w.next()?.to_owned();
            let t = w.next()?.parse().ok()?;
            Some((kind, t, w.filter_map(|x| x.parse().ok()).collect()))
        })
        .collect()
}

/// Every host's `ports.used`.
pub async fn ports_used(api: &Api) -> Result<BTreeMap<String, u64>> {
    let hosts = api.get_json("/v1/hosts").await?;
    Ok(hosts["hosts"]
        .as_array()
        .context("hosts")?
        .iter()
        .map(|h| {
            (
                h["id"].as_str().unwrap_or("").to_owned(),
                h["ports"]["used"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect())
}

/// Stops every service the token sees, waits until they are gone and every host's port
/// pool is empty again; returns the ports still used (0 unless the wait timed out). The
/// stop skips the drain (`?now=true`: SIGTERM at once, not after the default 5 s): what is
/// counted is the ports of stopped replicas, which are freed when they exit either way
/// (the drained stop and its ports are the rollout and quota tests' subject).
pub async fn stop_all_and_count_leaks(api: &Api) -> u64 {
    let list = api.get_json("/v1/services").await.unwrap();
    for s in list["services"].as_array().unwrap() {
        let name = s["name"].as_str().unwrap();
        let st = api
            .delete(&format!("/v1/services/{name}?now=true"))
            .await
            .unwrap();
        assert!(st == 202 || st == 404, "stopping {name}: HTTP {st}");
    }
    eventually("every service gone", || async {
        let l = api.get_json("/v1/services").await?;
        Ok(l["services"]
            .as_array()
            .is_some_and(Vec::is_empty)
            .then_some(()))
    })
    .await;
    eventually("every port free again", || async {
        let used = ports_used(api).await?;
        Ok(used.values().all(|&u| u == 0).then_some(()))
    })
    .await;
    ports_used(api).await.unwrap().values().sum()
}

/// The sum of a Prometheus metric (or counter `<name>_total`)'s samples (all label sets) on `/metrics`.
pub async fn metric(api: &Api, name: &str) -> Result<f64> {
    let (status, _, body) = api.get("/metrics").await?;
    if status != 200 {
        bail!("/metrics: HTTP {status}");
    }
    Ok(body
        .lines()
        .filter(|l| {
            // Counters may carry the `_total` suffix.
            let rest = l.strip_prefix(name).unwrap_or("#");
            let rest = rest.strip_prefix("_total").unwrap_or(rest);
            rest.starts_with([' ', '{'])
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// A TCP connection to `addr` with the smallest receive buffer the kernel allows, set
/// before the handshake so the window stays small: a client that does not read stalls
/// the server's writes after a few KiB instead of megabytes.
pub fn small_window_connect(addr: std::net::SocketAddrV4) -> Result<std::net::TcpStream> {
    use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .context("socket")?;
    // Best effort, as before: the kernel rounds it up to its minimum.
    let _ = sockopt::set_socket_recv_buffer_size(&fd, 2048);
    rustix::net::connect(&fd, &addr).with_context(|| format!("connect {addr}"))?;
    Ok(std::net::TcpStream::from(fd))
}

/// Incremental Server-Sent Events parser: feed bytes, get complete events (id, data).
#[derive(Default)]
pub struct SseParser {
    buf: String,
}

impl SseParser {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<(u64, String)> {
        self.buf.push_str(&String::from_utf8_lossy(bytes));
        let mut events = Vec::new();
        while let Some(end) = self.buf.find("\n\n") {
            let block: String = self.buf.drain(..end + 2).collect();
            let mut id = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if let Some(id) = id {
                events.push((id, data));
            }
        }
        events
    }
}

/// Opens an SSE stream; fails unless the answer is 200.
pub async fn sse_open(
    api: &Api,
    path: &str,
    last_event_id: Option<u64>,
) -> Result<reqwest::Response> {
    // A stream lasts as long as the test wants: no total timeout (Api's client has one).
    static STREAMS: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let http = STREAMS.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    });
    let mut req = http
        .get(format!("{}{}", api.base, path))
        .bearer_auth(&api.token)
        .header("accept", "text/event-stream");
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id.to_string());
    }
    let r = req.send().await?;
    if r.status() != 200 {
        let st = r.status();
        bail!(
            "stream {path}: HTTP {st}: {}",
            r.text().await.unwrap_or_default()
        );
    }
    Ok(r)
}

/// The ready endpoints of an entry as (replica, job, address:port of `http`).
pub fn entry_endpoints(entry: &Value) -> BTreeSet<(u64, String, String)> {
    entry["endpoints"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|e| e.get("ready").is_none_or(|r| r == true))
                .map(|e| {
                    (
                        e["replica"].as_u64().unwrap_or(u64::MAX),
                        e["job"].as_str().unwrap_or("").to_owned(),
                        format!(
                            "{}:{}",
                            e["address"].as_str().unwrap_or(""),
                            e["ports"]["http"]
                        ),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Percentile (0-100) of a sorted slice.
pub fn pct(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() - 1) * p / 100]
}

// === test profiles ===

/// A service of python `http.server` replicas on one any-free port `http`, with a TCP
/// readiness probe: the profile most tests submit. Built with [`http_service`].
#[derive(Debug, Clone)]
pub struct HttpService {
    name: String,
    project: Option<String>,
    replicas: u32,
    interval: Option<String>,
    before: Option<String>,
}

/// An [`HttpService`] named `name` with `replicas` replicas, project `default`, a probe
/// every 200 ms.
pub fn http_service(name: &str, replicas: u32) -> HttpService {
    HttpService {
        name: name.to_owned(),
        project: None,
        replicas,
        interval: None,
        before: None,
    }
}

impl HttpService {
    pub fn project(mut self, project: &str) -> Self {
        self.project = Some(project.to_owned());
        self
    }
    pub fn interval(mut self, interval: &str) -> Self {
        self.interval = Some(interval.to_owned());
        self
    }
    /// A shell command run before the server starts (e.g. to record the environment).
    pub fn before(mut self, shell: &str) -> Self {
        self.before = Some(shell.to_owned());
        self
    }
    pub fn toml(&self) -> String {
        let mut t = format!("[service]\nname = \"{}\"\n", self.name);
        if let Some(p) = &self.project {
            t += &format!("project = \"{p}\"\n");
        }
        let before = self
            .before
            .as_deref()
            .map(|b| format!("{b}; "))
            .unwrap_or_default();
        t += &format!(
            "replicas = {}\ncommand = [\"sh\", \"-c\", \"{before}exec python3 -m http.server $XCE_PORT_HTTP --bind $XCE_HOST_IP\"]\n[[service.ports]]\nname = \"http\"\n{TEST_MIN_READY}[service.readiness]\ntcp = \"http\"\n",
            self.replicas
        );
        // Unless set, 200 ms rather than the profile default of 1 s: the first probe runs
        // as the replica starts, before python listens, and the next one is when it
        // becomes ready. The probe's timeout stays the 1 s it was with the default
        // interval (by default it is the interval, and one probe slower than 200 ms on a
        // loaded machine would take the replica out of its endpoints for a moment).
        match &self.interval {
            Some(i) => t += &format!("interval = \"{i}\"\n"),
            None => t += "interval = \"200ms\"\ntimeout = \"1s\"\n",
        }
        t
    }
}

/// A tokens file with two tenants: `alice-example-secret` (view + submit on `team-a`) and
/// `bob-example-secret` (view + submit on `team-b`).
pub const TWO_TENANTS: &str = r#"
[[token]]
secret = "alice-example-secret"
principal = "alice"
grants = [ { permission = "job.view", projects = ["team-a"] }, { permission = "job.submit", projects = ["team-a"] } ]

[[token]]
secret = "bob-example-secret"
principal = "bob"
grants = [ { permission = "job.view", projects = ["team-b"] }, { permission = "job.submit", projects = ["team-b"] } ]
"#;

// === the harness's own checks ===

/// A claimed block is the holder's alone: another claim gets another block, and the lock
/// file of a held block cannot be locked again (an `flock` conflicts between two opens of
/// the file, in two processes as in one) until the claim drops.
#[test]
fn an_address_block_is_held_until_dropped() {
    use rustix::fs::{flock, FlockOperation};
    let a = IpBlock::claim();
    let b = IpBlock::claim();
    assert_ne!(a.first(), b.first());
    let o = a.first().octets();
    let n = u32::from(o[1] - 200) * 250 + u32::from(o[2]) - 1;
    let path = std::env::temp_dir()
        .join("xce-e2e-blocks")
        .join(format!("{n}.lock"));
    let again = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    assert!(
        flock(&again, FlockOperation::NonBlockingLockExclusive).is_err(),
        "{} is locked while claimed",
        path.display()
    );
    drop(a);
    // Free once dropped; a child being spawned meanwhile (by another test's thread) holds
    // a copy of the descriptor from its fork to its exec (the file is close-on-exec).
    let start = Instant::now();
    while flock(&again, FlockOperation::NonBlockingLockExclusive).is_err() {
        assert!(
            start.elapsed() < patience(),
            "{} is free once dropped",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The teardown kills what carries its cluster's mark, also once reparented (a replica
/// whose worker died, and the child it started), and nothing else: not a process of
/// another cluster's mark, nor an unmarked one.
#[test]
fn teardown_kills_what_carries_the_mark_and_nothing_else() {
    let (ours, theirs) = (Owner::new(), Owner::new());
    // A parent that starts a child of its own and waits: killing the parent first leaves
    // the child an orphan, as a worker's death leaves its replicas.
    let spawn = |owner: &Owner| {
        owner
            .mark(&mut Command::new("sh"))
            .args(["-c", "sleep 600 & wait"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut daemon = spawn(&ours);
    let mut other = spawn(&theirs);
    let mut unmarked = Command::new("sleep")
        .arg("600")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // The parent and its sleep: both carry the mark.
    let start = Instant::now();
    while ours.pids().len() < 2 || theirs.pids().len() < 2 {
        assert!(start.elapsed() < patience(), "{:?}", ours.pids());
        std::thread::sleep(Duration::from_millis(10));
    }
    let t = Instant::now();
    teardown([&mut daemon], &ours);
    let took = t.elapsed();
    assert!(ours.pids().is_empty(), "left: {:?}", ours.pids());
    assert!(took < Duration::from_secs(1), "teardown took {took:?}");
    assert_eq!(
        theirs.pids().len(),
        2,
        "another cluster's processes live on"
    );
    assert!(
        unmarked.try_wait().unwrap().is_none(),
        "an unmarked one lives on"
    );
    teardown([&mut other], &theirs);
    let _ = unmarked.kill();
    let _ = unmarked.wait();
}

/// Replicas carry no mark (a clean environment): the teardown knows them by their working
/// directory inside the cluster's dir, also once their worker is gone, and leaves a
/// process working elsewhere alone.
#[test]
fn teardown_kills_what_works_inside_the_cluster_dir() {
    let (inside, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let job_dir = inside.path().join("worker-0/jobs/j-1");
    std::fs::create_dir_all(&job_dir).unwrap();
    let owner = Owner::within(inside.path());
    let sleep_in = |dir: &Path| {
        Command::new("sleep")
            .arg("600")
            .current_dir(dir)
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut replica = sleep_in(&job_dir);
    let mut other = sleep_in(elsewhere.path());
    let start = Instant::now();
    while !owner.pids().contains(&replica.id()) {
        assert!(start.elapsed() < patience(), "{:?}", owner.pids());
        std::thread::sleep(Duration::from_millis(10));
    }
    teardown([], &owner);
    assert!(
        replica.wait().is_ok_and(|s| !s.success()),
        "the replica was killed"
    );
    assert!(
        other.try_wait().unwrap().is_none(),
        "a process elsewhere lives on"
    );
    let _ = other.kill();
    let _ = other.wait();
}
