//! Issue 11, "No request lost": a load client follows the endpoint stream of `web` and
//! sends HTTP requests round-robin to the current endpoints, each on a fresh connection,
//! while the service is rolled v1 → v2, scaled 5 → 2 → 6, restarted, and given a broken
//! v3 that fails and is reverted; then the same client against the old way (stop at once,
//! then submit again).
//!
//! The replicas run the program of `examples/web-v2.toml` (it answers with its version,
//! and on SIGTERM stops accepting, finishes what is in flight and exits); it appends
//! `start|term|exit <CLOCK_MONOTONIC ns>` lines per job to a directory of the test, so the
//! instant each process got SIGTERM is on the test's own clock.

use crate::harness::*;
use futures_util::StreamExt;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// Requests per second the load client sends (the issue asks for at least 100).
pub(crate) const RATE: u64 = 200;
/// A request that has not been answered whole by then has failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// The service's `drain`.
const DRAIN: &str = "2s";
/// How long one `xcecli ... --wait` may take before the test gives up on it.
const CLI_TIMEOUT: &str = "150s";

// === the service ===

/// The test's directory: the profiles, and the replicas' event logs. Declared before the
/// cluster, it drops after it and kills any replica still running with its event dir.
pub(crate) struct Web {
    dir: tempfile::TempDir,
    events: PathBuf,
    /// `command` of examples/web-v2.toml without its version argument.
    program: Vec<String>,
}

impl Web {
    pub(crate) fn new() -> Self {
        let text = std::fs::read_to_string(workspace_root().join("examples/web-v2.toml"))
            .expect("examples/web-v2.toml");
        let doc: toml::Table = toml::from_str(&text).expect("examples/web-v2.toml parses");
        let mut program: Vec<String> = doc["service"]["command"]
            .as_array()
            .expect("service.command")
            .iter()
            .map(|v| v.as_str().expect("command strings").to_owned())
            .collect();
        assert_eq!(
            program.pop().as_deref(),
            Some("v2"),
            "examples/web-v2.toml ends its command with the version"
        );
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events");
        std::fs::create_dir_all(&events).unwrap();
        Self {
            dir,
            events,
            program,
        }
    }

    /// The test's profile of `web`: `replicas` replicas of `command`, drain 2 s, rolling
    /// one at a time (surge 1, unavailable 0), probe every 200 ms.
    fn profile_with(&self, replicas: usize, command: Vec<String>) -> String {
        let command = toml::Value::Array(command.into_iter().map(toml::Value::String).collect());
        format!(
            "[service]\nname = \"web\"\nreplicas = {replicas}\ndrain = \"{DRAIN}\"\ncommand = {command}\n\n\
             [[service.ports]]\nname = \"http\"\n\n\
             [service.readiness]\nhttp = {{ port = \"http\", path = \"/\" }}\ninterval = \"200ms\"\ntimeout = \"3s\"\n\n\
             [service.update]\nmax_surge = 1\nmax_unavailable = 0\nmin_ready = \"500ms\"\ndeadline = \"60s\"\nauto_revert = true\n"
        )
    }

    /// The web-v2 program answering as `version`.
    pub(crate) fn profile(&self, version: &str, replicas: usize) -> String {
        let mut command = self.program.clone();
        command.push(version.to_owned());
        command.push(self.events.display().to_string());
        self.profile_with(replicas, command)
    }

    /// A v3 whose command exits at once.
    fn broken(&self, replicas: usize) -> String {
        self.profile_with(
            replicas,
            vec![
                "sh".into(),
                "-c".into(),
                "echo 'web v3: broken build' >&2; exit 1".into(),
            ],
        )
    }

    pub(crate) fn write(&self, file: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(file);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// When each job's process got SIGTERM (monotonic ns), from the event logs.
    pub(crate) fn term_times(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for entry in std::fs::read_dir(&self.events).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(job) = name.strip_suffix(".log") else {
                continue;
            };
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let term = text.lines().find_map(|l| {
                let (kind, t) = l.split_once(' ')?;
                (kind == "term").then(|| t.trim().parse::<u64>().ok())?
            });
            if let Some(t) = term {
                out.insert(job.to_owned(), t);
            }
        }
        out
    }

    pub(crate) fn live_pids(&self) -> Vec<u32> {
        crate::harness::pids_with_cmdline(&self.events.display().to_string())
    }
}

impl Drop for Web {
    fn drop(&mut self) {
        for pid in self.live_pids() {
            signal(pid, libc::SIGKILL);
        }
    }
}

// === the load client: endpoint follower ===

/// One ready endpoint as the stream lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ep {
    pub(crate) job: String,
    pub(crate) addr: SocketAddr,
}

/// One list the follower received: when (monotonic ns), from which server, what.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) at: u64,
    pub(crate) from: String,
    pub(crate) eps: Arc<Vec<Ep>>,
}

/// Follows `GET /v1/services/web/endpoints/stream` and publishes the current list. A
/// stream that ends is opened again (with `Last-Event-ID`); a service that is gone (the
/// stream's `error` event, or 404 while it is away) is an empty list until it is back.
/// Given several servers, it moves to the next when one cannot be reached or answers
/// 503 (as `xcecli` does with a list of URLs), keeping the list it has meanwhile: the
/// replicas it names still run.
#[derive(Debug)]
pub(crate) struct Follower {
    pub(crate) list: watch::Receiver<Arc<Vec<Ep>>>,
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
    /// Which server's stream ended, and when (a stale apiserver ends its streams).
    pub(crate) ended: Arc<Mutex<Vec<(String, Instant)>>>,
    reopened: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Follower {
    pub(crate) async fn start(api: &Api) -> Self {
        Self::start_for(api, "web").await
    }

    /// Follows the endpoint stream of `service` (of the token's default project).
    pub(crate) async fn start_for(api: &Api, service: &str) -> Self {
        Self::start_on(std::slice::from_ref(api), service).await
    }

    /// Follows `web`'s stream on the first of `apis` that serves it.
    pub(crate) async fn start_any(apis: &[Api]) -> Self {
        Self::start_on(apis, "web").await
    }

    /// Follows `service`'s stream on the first of `apis` that serves it.
    async fn start_on(apis: &[Api], service: &str) -> Self {
        let (tx, list) = watch::channel(Arc::new(Vec::new()));
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let ended: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
        let reopened = Arc::new(AtomicU64::new(0));
        let path = format!("/v1/services/{service}/endpoints/stream");
        let task = tokio::spawn(follow(
            apis.to_vec(),
            path,
            tx,
            Records {
                seen: seen.clone(),
                ended: ended.clone(),
                reopened: reopened.clone(),
            },
        ));
        let f = Self {
            list,
            seen,
            ended,
            reopened,
            task,
        };
        f.wait_for("the first stream event", |_| true).await;
        f
    }

    /// Waits (on the follower's notifications, up to `patience()`) until the current list
    /// satisfies `pred`; returns it.
    pub(crate) async fn wait_for(&self, what: &str, pred: impl Fn(&[Ep]) -> bool) -> Arc<Vec<Ep>> {
        let mut rx = self.list.clone();
        let seen = self.seen.clone();
        // The first event counts even when it is an empty list: wait for one to be seen.
        let r = tokio::time::timeout(patience(), async {
            loop {
                if !seen.lock().unwrap().is_empty() {
                    let now = rx.borrow_and_update().clone();
                    if pred(&now) {
                        return now;
                    }
                }
                rx.changed().await.expect("follower runs");
            }
        })
        .await;
        match r {
            Ok(l) => l,
            Err(_) => panic!(
                "timed out after {:?} waiting for the endpoint stream to show {what}; last list: {:?}",
                patience(),
                self.list.borrow()
            ),
        }
    }

    pub(crate) fn history(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What [`follow`] records beside the current list (the [`Follower`]'s fields).
struct Records {
    seen: Arc<Mutex<Vec<Seen>>>,
    ended: Arc<Mutex<Vec<(String, Instant)>>>,
    reopened: Arc<AtomicU64>,
}

async fn follow(apis: Vec<Api>, path: String, tx: watch::Sender<Arc<Vec<Ep>>>, rec: Records) {
    let Records {
        seen,
        ended,
        reopened,
    } = rec;
    let publish = |from: &str, eps: Vec<Ep>| {
        let eps = Arc::new(eps);
        seen.lock().unwrap().push(Seen {
            at: monotonic_ns(),
            from: from.to_owned(),
            eps: eps.clone(),
        });
        tx.send_replace(eps);
    };
    let mut last_id: Option<u64> = None;
    let mut first = true;
    let mut at = 0;
    loop {
        let api = &apis[at % apis.len()];
        let resp = match sse_open(api, &path, last_id).await {
            Ok(r) => r,
            Err(e) if apis.len() > 1 && !format!("{e:#}").contains("HTTP 404") => {
                // Not reachable, or not serving: the next server; the list stands.
                at += 1;
                tokio::time::sleep(Duration::from_millis(20)).await; // a client's retry pause
                continue;
            }
            Err(e) => {
                // Gone (404) or not reachable: nowhere to send requests until it is back.
                if !first && !tx.borrow().is_empty() {
                    eprintln!("follower: {} answered {e:#}: an empty list", api.base);
                }
                if first || !tx.borrow().is_empty() {
                    publish(&api.base, Vec::new());
                    first = false;
                }
                last_id = None;
                tokio::time::sleep(Duration::from_millis(20)).await; // a client's retry pause
                continue;
            }
        };
        if !first {
            reopened.fetch_add(1, Ordering::Relaxed);
        }
        first = false;
        let mut body = resp.bytes_stream();
        let mut parser = Sse::default();
        'stream: while let Some(chunk) = body.next().await {
            let Ok(chunk) = chunk else { break };
            for ev in parser.push(&chunk) {
                if ev.event == "error" {
                    // The service went away.
                    eprintln!(
                        "follower: {} sent error {}: an empty list",
                        api.base, ev.data
                    );
                    publish(&api.base, Vec::new());
                    last_id = None;
                    break 'stream;
                }
                let entry: Value = match serde_json::from_str(&ev.data) {
                    Ok(v) => v,
                    Err(e) => panic!("stream event is not JSON ({e}): {}", ev.data),
                };
                last_id = ev.id.or(last_id);
                publish(&api.base, endpoints_of(&entry));
            }
        }
        // The stream ended (a stale apiserver ends its streams, then answers 503 until it
        // is current again, which moves the follower on above).
        ended
            .lock()
            .unwrap()
            .push((api.base.clone(), Instant::now()));
    }
}

pub(crate) fn endpoints_of(entry: &Value) -> Vec<Ep> {
    entry["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e.get("ready").is_none_or(|r| r == true))
        .map(|e| Ep {
            job: e["job"].as_str().unwrap_or("").to_owned(),
            addr: format!(
                "{}:{}",
                e["address"].as_str().unwrap_or(""),
                e["ports"]["http"]
            )
            .parse()
            .unwrap_or_else(|_| panic!("endpoint without an address and port: {e}")),
        })
        .collect()
}

/// One Server-Sent Event.
#[derive(Debug, Default)]
pub(crate) struct Event {
    pub(crate) event: String,
    pub(crate) id: Option<u64>,
    pub(crate) data: String,
}

/// Incremental SSE parser that keeps every event (the harness's drops those without an
/// id, such as the stream's last `error` event).
#[derive(Debug, Default)]
pub(crate) struct Sse {
    buf: String,
}

impl Sse {
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buf.push_str(&String::from_utf8_lossy(bytes));
        let mut out = Vec::new();
        while let Some(end) = self.buf.find("\n\n") {
            let block: String = self.buf.drain(..end + 2).collect();
            let mut ev = Event {
                event: "message".into(),
                ..Event::default()
            };
            let mut any = false;
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    ev.event = v.trim().to_owned();
                    any = true;
                } else if let Some(v) = line.strip_prefix("id:") {
                    ev.id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("data:") {
                    ev.data.push_str(v.trim_start());
                    any = true;
                }
            }
            // Comment-only blocks are keep-alives.
            if any {
                out.push(ev);
            }
        }
        out
    }
}

// === the load client: requests ===

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// 2xx; the version named in the answer.
    Ok(String),
    /// The list was empty: nowhere to send the request.
    NoEndpoint,
    Connect(std::io::ErrorKind),
    Io(std::io::ErrorKind),
    Status(u16),
    Garbled,
    Timeout,
}

impl Outcome {
    pub(crate) fn kind(&self) -> String {
        match self {
            Outcome::Ok(_) => "ok".into(),
            Outcome::NoEndpoint => "no_endpoint".into(),
            Outcome::Connect(k) => format!("connect:{k:?}"),
            Outcome::Io(k) => format!("io:{k:?}"),
            Outcome::Status(s) => format!("http_{s}"),
            Outcome::Garbled => "garbled".into(),
            Outcome::Timeout => "timeout".into(),
        }
    }
}

/// One request: when it was sent (monotonic ns), to which job, how it ended, how long.
#[derive(Debug, Clone)]
pub(crate) struct Shot {
    pub(crate) at: u64,
    pub(crate) job: Option<String>,
    pub(crate) outcome: Outcome,
    took: Duration,
}

/// Sends `RATE` requests per second round-robin over the follower's current list until
/// stopped; returns every request.
#[derive(Debug)]
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Shot>>,
}

impl Load {
    pub(crate) fn start(list: watch::Receiver<Arc<Vec<Ep>>>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(shoot(list, stop.clone()));
        Self { stop, task }
    }

    pub(crate) async fn finish(self) -> Vec<Shot> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("load task")
    }
}

async fn shoot(list: watch::Receiver<Arc<Vec<Ep>>>, stop: Arc<AtomicBool>) -> Vec<Shot> {
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / RATE));
    // Open loop: ticks missed while the machine was busy are sent at once, so a stall
    // does not quietly lower the rate (nor skip the moment it happened in).
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut inflight = tokio::task::JoinSet::new();
    let mut shots = Vec::new();
    let mut next = 0usize;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let eps = list.borrow().clone();
        let at = monotonic_ns();
        if eps.is_empty() {
            shots.push(Shot {
                at,
                job: None,
                outcome: Outcome::NoEndpoint,
                took: Duration::ZERO,
            });
            continue;
        }
        let ep = eps[next % eps.len()].clone();
        next = next.wrapping_add(1);
        inflight.spawn(async move {
            let t0 = Instant::now();
            let outcome = match tokio::time::timeout(REQUEST_TIMEOUT, request(ep.addr)).await {
                Ok(o) => o,
                Err(_) => Outcome::Timeout,
            };
            Shot {
                at,
                job: Some(ep.job),
                outcome,
                took: t0.elapsed(),
            }
        });
        while let Some(done) = inflight.try_join_next() {
            shots.push(done.expect("request task"));
        }
    }
    while let Some(done) = inflight.join_next().await {
        shots.push(done.expect("request task"));
    }
    shots.sort_by_key(|s| s.at);
    shots
}

/// `GET /` on a fresh connection, read to the end.
async fn request(addr: SocketAddr) -> Outcome {
    let mut s = match tokio::net::TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => return Outcome::Connect(e.kind()),
    };
    if let Err(e) = s
        .write_all(b"GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")
        .await
    {
        return Outcome::Io(e.kind());
    }
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw).await {
        return Outcome::Io(e.kind());
    }
    let (head, body) = http_body(&raw);
    let Some(code) = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
    else {
        return Outcome::Garbled;
    };
    if !(200..300).contains(&code) {
        return Outcome::Status(code);
    }
    // "web v2: replica 1, job j-12"
    let body = String::from_utf8_lossy(&body);
    match body.strip_prefix("web ").and_then(|b| b.split(':').next()) {
        Some(v) => Outcome::Ok(v.to_owned()),
        None => Outcome::Garbled,
    }
}

// === driving the service ===

/// `xcecli` against the cluster, off the async threads; (exit code, stdout, stderr). A
/// `--wait` gets `--timeout CLI_TIMEOUT`.
pub(crate) async fn cli(config: &Path, args: &[&str]) -> (i32, String, String) {
    let config = config.to_owned();
    let mut args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    if args.iter().any(|a| a == "--wait") {
        args.extend(["--timeout".to_owned(), CLI_TIMEOUT.to_owned()]);
    }
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        xcecli_with(&config, &args, &[])
    })
    .await
    .unwrap();
    (out.status.code().unwrap_or(-1), stdout(&out), stderr(&out))
}

/// The service detail once `pred` holds, following it with blocking queries.
pub(crate) async fn wait_detail(api: &Api, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + patience();
    let mut index = 0u64;
    let mut last = Value::Null;
    while Instant::now() < deadline {
        let (st, h, body) = api
            .get(&format!("/v1/services/web?index={index}&wait=5s"))
            .await
            .unwrap_or_else(|e| panic!("GET /v1/services/web: {e:#}"));
        assert_eq!(st, 200, "GET /v1/services/web: {body}");
        last = serde_json::from_str(&body).unwrap();
        if pred(&last) {
            return last;
        }
        index = h
            .get("x-xce-index")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .or_else(|| last["index"].as_u64())
            .unwrap_or(0);
    }
    panic!("timed out waiting for the service to be {what}: {last}");
}

/// The rollout is in `state` with `replicas` replicas of the current generation, all
/// ready, and none of an older one left (draining ones may still be finishing).
pub(crate) fn rollout_is(d: &Value, state: &str, replicas: u64) -> bool {
    let r = &d["rollout"];
    r["state"] == state && r["updated"] == replicas && r["ready"] == replicas && r["outdated"] == 0
}

/// A list of exactly the detail's ready jobs of its current generation.
fn current_of(d: &Value) -> impl Fn(&[Ep]) -> bool {
    let want: BTreeSet<String> = d["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|j| j["generation"] == d["generation"] && j["ready"] == true)
        .filter_map(|j| Some(j["job"].as_str()?.to_owned()))
        .collect();
    move |l: &[Ep]| l.iter().map(|e| e.job.clone()).collect::<BTreeSet<_>>() == want
}

fn generation(d: &Value) -> u64 {
    d["generation"].as_u64().unwrap_or(0)
}

/// One step of the scenario: what was done, from when to when (monotonic ns), the lowest
/// ready count it may show.
#[derive(Debug)]
struct Phase {
    name: &'static str,
    start: u64,
    end: u64,
    floor: usize,
}

/// Runs one `xcecli` step, checks its exit code, and returns the phase it made.
async fn step(
    config: &Path,
    name: &'static str,
    floor: usize,
    args: &[&str],
    want_code: i32,
) -> (Phase, String) {
    let start = monotonic_ns();
    let (code, out, err) = cli(config, args).await;
    let all = format!("{out}{err}");
    println!(
        "rollout: xcecli {} -> exit {code}\n{out}{err}",
        args.join(" ")
    );
    assert_eq!(
        code,
        want_code,
        "xcecli {}: exit {code}\nstdout:\n{out}\nstderr:\n{err}",
        args.join(" ")
    );
    (
        Phase {
            name,
            start,
            end: 0,
            floor,
        },
        all,
    )
}

// === what the client saw ===

#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) requests: usize,
    pub(crate) failed: usize,
    by_kind: BTreeMap<String, usize>,
    pub(crate) versions: BTreeMap<String, usize>,
    pub(crate) rate: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    /// The list was empty at some point after it first had an endpoint.
    empty_lists: usize,
    pub(crate) min_ready: usize,
    /// Jobs still listed when (or after) their process got SIGTERM.
    pub(crate) listed_after_term: Vec<String>,
    /// Jobs listed again after they had left the list.
    pub(crate) reappeared: Vec<String>,
    /// The shortest time between a job leaving the list and its SIGTERM.
    min_term_margin: Option<Duration>,
    pub(crate) terms_checked: usize,
    /// Requests sent to a job after its process got SIGTERM.
    pub(crate) sent_after_term: usize,
    /// Lists the follower received.
    lists: usize,
    /// The first failed requests, for the failure message.
    pub(crate) failures: Vec<String>,
    /// How long the list was empty in all, after it first had an endpoint.
    empty_for: Duration,
    /// Answers from v1 after the v1 -> v2 rollout was complete.
    v1_after_v2: usize,
    /// Per phase: name, lowest ready count, the floor it may not go below.
    phases: Vec<(&'static str, usize, usize)>,
}

pub(crate) fn report(
    shots: &[Shot],
    seen: &[Seen],
    terms: &BTreeMap<String, u64>,
    from: u64,
) -> Report {
    let mut r = Report {
        requests: shots.len(),
        ..Report::default()
    };
    for s in shots {
        *r.by_kind.entry(s.outcome.kind()).or_default() += 1;
        match &s.outcome {
            Outcome::Ok(v) => *r.versions.entry(v.clone()).or_default() += 1,
            other => {
                r.failed += 1;
                if r.failures.len() < 20 {
                    r.failures
                        .push(format!("at {} to {:?}: {other:?}", s.at, s.job));
                }
            }
        }
        if s.job
            .as_ref()
            .and_then(|j| terms.get(j))
            .is_some_and(|&t| s.at >= t)
        {
            r.sent_after_term += 1;
        }
    }
    if let (Some(a), Some(b)) = (shots.first(), shots.last()) {
        r.rate = shots.len() as f64 / ((b.at - a.at).max(1) as f64 / 1e9);
    }
    let mut took: Vec<Duration> = shots
        .iter()
        .filter(|s| matches!(s.outcome, Outcome::Ok(_)))
        .map(|s| s.took)
        .collect();
    took.sort();
    r.p50 = pct(&took, 50);
    r.p99 = pct(&took, 99);
    r.max = took.last().copied().unwrap_or_default();

    // The lists from `from` on (the one in force then included).
    let start = seen.iter().rposition(|s| s.at <= from).unwrap_or(0);
    let lists = &seen[start..];
    r.lists = lists.len();
    r.min_ready = lists.iter().map(|s| s.eps.len()).min().unwrap_or(0);
    let end = shots.last().map_or(0, |s| s.at);
    let mut had_any = false;
    let mut empty_since: Option<u64> = None;
    for s in lists {
        if s.eps.is_empty() && had_any && empty_since.is_none() {
            r.empty_lists += 1;
            empty_since = Some(s.at.max(from));
        }
        if !s.eps.is_empty() {
            if let Some(t) = empty_since.take() {
                r.empty_for += Duration::from_nanos(s.at.saturating_sub(t));
            }
        }
        had_any |= !s.eps.is_empty();
    }
    if let Some(t) = empty_since {
        r.empty_for += Duration::from_nanos(end.saturating_sub(t));
    }
    // When each job left the list (the receipt of the first list without it).
    let mut listed: BTreeSet<String> = BTreeSet::new();
    let mut left: BTreeMap<String, u64> = BTreeMap::new();
    for s in lists {
        let now: BTreeSet<String> = s.eps.iter().map(|e| e.job.clone()).collect();
        for j in listed.difference(&now) {
            left.insert(j.clone(), s.at);
        }
        for j in now.difference(&listed) {
            if left.contains_key(j) {
                r.reappeared.push(j.clone());
            }
        }
        listed = now;
    }
    for (job, &t) in terms {
        if t < from {
            continue;
        }
        let was_listed = listed.contains(job) || left.contains_key(job);
        if !was_listed {
            continue;
        }
        r.terms_checked += 1;
        match left.get(job) {
            Some(&gone) if gone < t && !listed.contains(job) => {
                let margin = Duration::from_nanos(t - gone);
                r.min_term_margin = Some(r.min_term_margin.map_or(margin, |m| m.min(margin)));
            }
            _ => r.listed_after_term.push(job.clone()),
        }
    }
    r
}

/// What the client saw during one phase.
#[derive(Debug)]
struct PhaseFigures {
    requests: usize,
    failed: usize,
    min_ready: usize,
    versions: BTreeMap<String, usize>,
}

fn phase_figures(p: &Phase, shots: &[Shot], seen: &[Seen]) -> PhaseFigures {
    let mut f = PhaseFigures {
        requests: 0,
        failed: 0,
        min_ready: usize::MAX,
        versions: BTreeMap::new(),
    };
    for s in shots.iter().filter(|s| s.at >= p.start && s.at < p.end) {
        f.requests += 1;
        match &s.outcome {
            Outcome::Ok(v) => *f.versions.entry(v.clone()).or_default() += 1,
            _ => f.failed += 1,
        }
    }
    // The list in force when the phase began, and every one received during it.
    let before = seen.iter().rposition(|s| s.at <= p.start).unwrap_or(0);
    for s in seen[before..].iter().take_while(|s| s.at < p.end) {
        f.min_ready = f.min_ready.min(s.eps.len());
    }
    f
}

fn secs(ns: u64) -> String {
    format!("{:.1}s", ns as f64 / 1e9)
}

// === the scenario ===

/// The scenario under load, then the old way under the same load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_lost_during_rollout_scale_restart_and_revert() {
    let web = Web::new();
    let c = DevCluster::start(3, false).expect("dev cluster");
    let api = c.api.clone();
    let (st, body) = api.submit_toml(&web.profile("v1", 5)).await.unwrap();
    assert_eq!(st, 201, "submit v1: {body}");
    let follower = Follower::start(&api).await;
    follower
        .wait_for("5 ready v1 replicas", |l| l.len() == 5)
        .await;

    let new = new_way(&api, &c.client_config, &web, &follower).await;
    // Back to v1 x5 (not measured), then the old way.
    let cfg = &c.client_config;
    let v1 = web.write("web-v1.toml", &web.profile("v1", 5));
    let _ = step(
        cfg,
        "back",
        0,
        &["service", "submit", v1.to_str().unwrap(), "--wait"],
        0,
    )
    .await;
    let d = wait_detail(&api, "complete at 5", |d| rollout_is(d, "complete", 5)).await;
    follower
        .wait_for("5 replicas of v1 again", current_of(&d))
        .await;

    let old = old_way(&api, &web, &follower).await;
    println!(
        "SUMMARY rollout requests={} failed={} naive_failed={}",
        new.requests, new.failed, old.failed
    );

    // What the issue demands of the new way.
    assert!(
        new.rate >= 100.0,
        "the load client sent {:.0} requests/s",
        new.rate
    );
    assert_eq!(
        new.failed, 0,
        "failed requests (first 20): {:#?}",
        new.failures
    );
    assert_eq!(new.empty_lists, 0, "the endpoint list was empty");
    assert!(
        new.listed_after_term.is_empty(),
        "listed after their SIGTERM: {:?}",
        new.listed_after_term
    );
    assert!(
        new.reappeared.is_empty(),
        "listed again after leaving: {:?}",
        new.reappeared
    );
    assert_eq!(
        new.sent_after_term, 0,
        "requests sent to a process after its SIGTERM"
    );
    assert!(
        new.terms_checked > 0,
        "no listed replica got SIGTERM: events missing?"
    );
    for (name, min, floor) in &new.phases {
        assert!(
            min >= floor,
            "{name}: ready went down to {min} (floor {floor})"
        );
    }
    assert!(
        new.versions.keys().all(|v| v == "v1" || v == "v2"),
        "answers: {:?}",
        new.versions
    );
    assert_eq!(new.v1_after_v2, 0, "v1 answered after v2 was complete");
    // And the old way loses requests.
    assert!(
        old.rate >= 100.0,
        "the load client sent {:.0} requests/s",
        old.rate
    );
    assert!(old.failed > 0, "the old way lost nothing?");

    assert_eq!(stop_all_and_count_leaks(&api).await, 0, "leaked ports");
}

/// v1 -> v2, scale 5 -> 2 -> 6, restart, broken v3 reverted, all through `xcecli` and
/// under load. Each step waits for `--wait` and then for the detail and the stream to
/// show the end state, so the next starts from a settled service.
async fn new_way(api: &Api, cfg: &Path, web: &Web, follower: &Follower) -> Report {
    let t0 = Instant::now();
    let load = Load::start(follower.list.clone());
    let from = monotonic_ns();
    let mut phases = Vec::new();

    let v2 = web.write("web-v2.toml", &web.profile("v2", 5));
    let v2 = v2.to_str().unwrap();
    let (mut p, _) = step(
        cfg,
        "rollout v1->v2",
        5,
        &["service", "submit", v2, "--wait"],
        0,
    )
    .await;
    let d = wait_detail(api, "complete at 5", |d| rollout_is(d, "complete", 5)).await;
    follower.wait_for("5 replicas of v2", current_of(&d)).await;
    p.end = monotonic_ns();
    phases.push(p);

    let (mut p, _) = step(
        cfg,
        "scale 5->2",
        2,
        &["service", "scale", "web", "2", "--wait"],
        0,
    )
    .await;
    wait_detail(api, "complete at 2", |d| rollout_is(d, "complete", 2)).await;
    follower.wait_for("2 replicas", |l| l.len() == 2).await;
    p.end = monotonic_ns();
    phases.push(p);

    let (mut p, _) = step(
        cfg,
        "scale 2->6",
        2,
        &["service", "scale", "web", "6", "--wait"],
        0,
    )
    .await;
    wait_detail(api, "complete at 6", |d| rollout_is(d, "complete", 6)).await;
    follower.wait_for("6 replicas", |l| l.len() == 6).await;
    p.end = monotonic_ns();
    phases.push(p);

    let (mut p, _) = step(
        cfg,
        "restart",
        6,
        &["service", "restart", "web", "--wait"],
        0,
    )
    .await;
    let d = wait_detail(api, "complete at 6", |d| rollout_is(d, "complete", 6)).await;
    let restarted = generation(&d);
    follower
        .wait_for("6 replicas of the restart", current_of(&d))
        .await;
    p.end = monotonic_ns();
    phases.push(p);

    // Broken v3: --wait exits 6, and the service rolls back to the restart's profile as
    // a new generation; the test waits for that rollback to be done too.
    let v3 = web.write("web-v3.toml", &web.broken(6));
    let v3 = v3.to_str().unwrap();
    let (mut p, out) = step(
        cfg,
        "broken v3, reverted",
        6,
        &["service", "submit", v3, "--wait"],
        6,
    )
    .await;
    let d = wait_detail(api, "reverted and rolled back at 6", |d| {
        rollout_is(d, "reverted", 6)
    })
    .await;
    let reverted = generation(&d);
    assert!(
        reverted > restarted + 1,
        "the revert is a generation after v3's: {d}"
    );
    follower
        .wait_for("6 replicas of the revert", current_of(&d))
        .await;
    p.end = monotonic_ns();
    phases.push(p);

    // Every replica that was to stop has stopped (so every SIGTERM is in the logs), still
    // under load.
    wait_detail(api, "6 running jobs and no other", |d| {
        d["jobs"]
            .as_array()
            .is_some_and(|j| j.len() == 6 && j.iter().all(|j| j["state"] == "running"))
    })
    .await;
    let shots = load.finish().await;
    let seen = follower.history();
    let mut r = report(&shots, &seen, &web.term_times(), from);
    for p in &phases {
        let f = phase_figures(p, &shots, &seen);
        println!(
            "FIGURE rollout phase {:<20} took={:<6} requests={} failed={} answers={:?} min_ready={} (floor {})",
            p.name,
            secs(p.end - p.start),
            f.requests,
            f.failed,
            f.versions,
            f.min_ready,
            p.floor
        );
        r.phases.push((p.name, f.min_ready, p.floor));
    }
    // Once v2 is complete, v1 is no longer listed: nothing answers v1 any more.
    let v2_done = phases[0].end;
    r.v1_after_v2 = shots
        .iter()
        .filter(|s| s.at >= v2_done && s.outcome == Outcome::Ok("v1".into()))
        .count();
    println!(
        "FIGURE rollout: requests={} failed={} {:?} rate={:.0}/s answers={:?} v1_answers_after_v2_complete={} latency p50={:?} p99={:?} max={:?} lists_seen={} empty_lists={} min_ready={} jobs_sigtermed={} listed_after_sigterm={} min_unlisted_before_sigterm={:?} sent_after_sigterm={} reappeared={} stream_reopened={} revert: {} / xcecli: {:?} took={}",
        r.requests,
        r.failed,
        r.by_kind,
        r.rate,
        r.versions,
        r.v1_after_v2,
        r.p50,
        r.p99,
        r.max,
        r.lists,
        r.empty_lists,
        r.min_ready,
        r.terms_checked,
        r.listed_after_term.len(),
        r.min_term_margin,
        r.sent_after_term,
        r.reappeared.len(),
        follower.reopened.load(Ordering::Relaxed),
        d["rollout"]["reason"],
        out.lines().find(|l| l.starts_with("error:")).unwrap_or(""),
        secs(t0.elapsed().as_nanos() as u64),
    );
    r
}

/// The old way under the same load, from v1 x5: stop at once (`DELETE ?now=true`: SIGTERM
/// with the endpoint change, as every stop did before drain) and submit v2 again, until
/// five replicas are listed.
async fn old_way(api: &Api, web: &Web, follower: &Follower) -> Report {
    let t0 = Instant::now();
    let load = Load::start(follower.list.clone());
    let from = monotonic_ns();
    assert_eq!(api.delete("/v1/services/web?now=true").await.unwrap(), 202);
    eventually("web gone", || async {
        let (st, _, _) = api.get("/v1/services/web").await?;
        Ok((st == 404).then_some(()))
    })
    .await;
    let (st, body) = api.submit_toml(&web.profile("v2", 5)).await.unwrap();
    assert_eq!(st, 201, "submit v2 again: {body}");
    follower
        .wait_for("5 replicas after the old way", |l| l.len() == 5)
        .await;
    let shots = load.finish().await;
    let r = report(&shots, &follower.history(), &web.term_times(), from);
    println!(
        "FIGURE old way (DELETE ?now=true, POST v2): requests={} failed={} {:?} rate={:.0}/s answers={:?} empty_lists={} empty_for={:?} jobs_sigtermed={} listed_after_sigterm={} sent_after_sigterm={} took={}",
        r.requests,
        r.failed,
        r.by_kind,
        r.rate,
        r.versions,
        r.empty_lists,
        r.empty_for,
        r.terms_checked,
        r.listed_after_term.len(),
        r.sent_after_term,
        secs(t0.elapsed().as_nanos() as u64),
    );
    r
}

#[test]
fn sse_keeps_error_events_and_skips_keepalives() {
    let mut p = Sse::default();
    let evs = p.push(b"id: 3\ndata: {\"a\":1}\n\n:\n\nevent: error\ndata: {}\n\nid: 4\nda");
    let got: Vec<(String, Option<u64>, String)> =
        evs.into_iter().map(|e| (e.event, e.id, e.data)).collect();
    assert_eq!(
        got,
        vec![
            ("message".into(), Some(3), "{\"a\":1}".into()),
            ("error".into(), None, "{}".into()),
        ]
    );
}
