//! Faults during a rollout (issue 11, docs/design.md "Persistence"): the controller is killed
//! with SIGKILL in the middle of a rolling update — the redb controller restarted on its
//! data dir, the etcd leader replaced by its standby — and the rollout must carry on to
//! completion with no duplicate replica, no port held twice, no index going back, and no
//! drain cut short by the restart.
//!
//! Two witnesses. The service detail, followed with blocking queries
//! (`GET /v1/services/web?index=N&wait=5s`), with `/v1/hosts` and the endpoint index read
//! after every change: what the controller says. And the replica processes themselves,
//! which log their start (address, port, slot, version) and their SIGTERM on the test's
//! monotonic clock: what really ran, including anything the snapshots coalesced.

use crate::daemons::*;
use crate::harness::*;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const REPLICAS: u64 = 4;
const MAX_SURGE: u64 = 1;
/// `drain` of the service; the controller stays down past the end of the drain that runs
/// when it dies, so a drain measured from before the kill would end at once on restart.
const DRAIN: Duration = Duration::from_secs(2);
/// `min_ready`: with the start delay and the 200 ms probe, one slot takes about 3 s, so a
/// rollout lasts long enough to be interrupted twice.
const MIN_READY: &str = "2s";
/// Seconds a replica waits before it listens: a new replica is visibly starting (running,
/// not ready) for about this long, a window to kill the controller in.
const START_DELAY: &str = "0.5";

/// The replica: after `start_delay` seconds (argv[3]) serves HTTP (every path 200) on
/// `$XCE_PORT_HTTP`; appends
/// `start <ns> <ip> <port> <pid> <replica> <version>` and, on SIGTERM, `term <ns>` to
/// `<ctl>/<job>.log` (CLOCK_MONOTONIC, the clock of [`monotonic_ns`]), then exits at once.
const FAULT_REPLICA_PY: &str = r#"
import http.server, os, signal, sys, time
ctl, version, start_delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
port = int(os.environ['XCE_PORT_HTTP'])
ip = os.environ['XCE_HOST_IP']
logf = open(os.path.join(ctl, os.environ['XCE_JOB_ID'] + '.log'), 'a', buffering=1)
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200)
        self.send_header('content-length', '0')
        self.end_headers()
def term(*_):
    logf.write('term %d\n' % time.monotonic_ns())
    os._exit(0)
signal.signal(signal.SIGTERM, term)
time.sleep(start_delay)
srv = http.server.HTTPServer((ip, port), H)
logf.write('start %d %s %d %d %s %s\n' % (time.monotonic_ns(), ip, port, os.getpid(), os.environ['XCE_REPLICA'], version))
srv.serve_forever()
"#;

/// The script, its log dir, and the profiles that run it. Declare it before the cluster:
/// it drops after it and kills any replica still running the script.
struct Replicas {
    _dir: tempfile::TempDir,
    script: PathBuf,
    ctl: PathBuf,
}

/// One replica process, from its log.
#[derive(Debug, Clone)]
struct Proc {
    job: String,
    addr: (String, u64),
    replica: u64,
    generation: u64,
    start: u64,
    /// When it got SIGTERM (it exits right away); `None`: still running, or killed.
    term: Option<u64>,
    /// `start` lines in its log: 1 unless the job was launched twice.
    starts: usize,
}

impl Replicas {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("replica.py");
        std::fs::write(&script, FAULT_REPLICA_PY).unwrap();
        let ctl = dir.path().join("ctl");
        std::fs::create_dir_all(&ctl).unwrap();
        Self {
            _dir: dir,
            script,
            ctl,
        }
    }

    /// Service `web`; `version` (`v1`, `v2`) is the one thing that differs between
    /// generations. The probe's timeout is generous: one probe slower than its timeout
    /// (default: the 200 ms interval) marks a healthy replica not ready, which happened on
    /// this busy 2-core machine and is no action of the rollout's.
    fn profile(&self, version: &str) -> String {
        format!(
            r#"[service]
name = "web"
replicas = {REPLICAS}
command = ["python3", "{}", "{}", "{version}", "{START_DELAY}"]
drain = "{}s"
[[service.ports]]
name = "http"
[service.readiness]
http = {{ port = "http", path = "/ready" }}
interval = "200ms"
timeout = "3s"
[service.update]
max_surge = {MAX_SURGE}
max_unavailable = 0
min_ready = "{MIN_READY}"
deadline = "2m"
"#,
            self.script.display(),
            self.ctl.display(),
            DRAIN.as_secs(),
        )
    }

    fn live_pids(&self) -> Vec<u32> {
        crate::harness::pids_with_cmdline(&self.script.to_string_lossy())
    }

    /// Every replica process that started, by job.
    fn processes(&self) -> Result<BTreeMap<String, Proc>> {
        let mut out = BTreeMap::new();
        for entry in std::fs::read_dir(&self.ctl)? {
            let path = entry?.path();
            let Some(job) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".log"))
            else {
                continue;
            };
            let text = std::fs::read_to_string(&path)?;
            let mut p: Option<Proc> = None;
            let mut starts = 0;
            let mut term = None;
            for line in text.lines() {
                let w: Vec<&str> = line.split_whitespace().collect();
                match w.as_slice() {
                    ["start", t, ip, port, _pid, replica, version] => {
                        starts += 1;
                        p.get_or_insert(Proc {
                            job: job.to_owned(),
                            addr: ((*ip).to_owned(), port.parse()?),
                            replica: replica.parse()?,
                            generation: version.trim_start_matches('v').parse()?,
                            start: t.parse()?,
                            term: None,
                            starts: 0,
                        });
                    }
                    ["term", t] => term = Some(t.parse()?),
                    _ => bail!("{}: unexpected line {line:?}", path.display()),
                }
            }
            let mut p = p.with_context(|| {
                format!(
                    "{}: no start line (the replica never listened: its port taken?)",
                    path.display()
                )
            })?;
            p.starts = starts;
            p.term = term;
            out.insert(job.to_owned(), p);
        }
        Ok(out)
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for pid in self.live_pids() {
            signal(pid, libc::SIGKILL);
        }
    }
}

fn header_index(h: &reqwest::header::HeaderMap) -> Option<u64> {
    h.get("x-xce-index")?.to_str().ok()?.parse().ok()
}

fn jobs(d: &Value) -> &[Value] {
    d["jobs"].as_array().map_or(&[], Vec::as_slice)
}

fn job_str<'a>(j: &'a Value, key: &str) -> &'a str {
    j[key].as_str().unwrap_or("")
}

fn leaving(j: &Value) -> bool {
    matches!(job_str(j, "state"), "draining" | "stopping")
}

fn count(d: &Value, f: impl Fn(&Value) -> bool) -> usize {
    jobs(d).iter().filter(|j| f(j)).count()
}

/// Follows `GET /v1/services/web` with blocking queries until `pred` holds, up to
/// `patience()`; returns that detail.
async fn wait_detail(api: &Api, what: &str, pred: impl Fn(&Value) -> bool) -> Result<Value> {
    let deadline = Instant::now() + patience();
    let mut index = 0;
    let mut last = String::from("no answer yet");
    while Instant::now() < deadline {
        match api
            .get(&format!("/v1/services/web?index={index}&wait=5s"))
            .await
        {
            Ok((200, h, body)) => {
                let d: Value = serde_json::from_str(&body)?;
                if pred(&d) {
                    return Ok(d);
                }
                index = header_index(&h).context("X-Xce-Index")?;
                last = body;
            }
            Ok((status, _, body)) => {
                last = format!("HTTP {status}: {body}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                last = format!("{e:#}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    bail!(
        "timed out after {:?} waiting for {what}; last: {last}",
        patience()
    )
}

/// The rollout to generation `g` is over: complete, `replicas` jobs of `g`, all running
/// and ready, and nothing else left (the last drains are over too).
fn settled(d: &Value, g: u64) -> bool {
    d["generation"] == g
        && d["rollout"]["state"] == "complete"
        && jobs(d).len() as u64 == REPLICAS
        && jobs(d)
            .iter()
            .all(|j| j["generation"] == g && j["state"] == "running" && j["ready"] == true)
}

/// One answer of the blocking detail query.
#[derive(Debug)]
struct Snap {
    /// When the answer came (monotonic ns).
    at: u64,
    index: u64,
    detail: Value,
    /// When a second read was sent that still answered this index: the state shown here
    /// held at least until then (any later change came after it).
    confirmed: Option<u64>,
}

/// What the observer saw, and every invariant it saw broken.
#[derive(Debug, Default)]
struct Observed {
    snaps: Vec<Arc<Snap>>,
    violations: Vec<String>,
    /// Reads that failed (the controller was down or taking over).
    failed_reads: u32,
    /// `/v1/hosts` port pools compared with the jobs at one index.
    pool_checks: u32,
    endpoint_reads: u32,
    /// Highest index of the endpoint entry seen.
    endpoint_index: u64,
    /// Most live (not draining or stopping) jobs at once.
    max_live: usize,
    /// Fewest ready jobs at once.
    min_ready: usize,
}

/// Follows the service detail in a task of its own and checks every answer; the test
/// waits on `latest`.
struct Observer {
    latest: watch::Receiver<Option<Arc<Snap>>>,
    snaps: Arc<Mutex<Vec<Arc<Snap>>>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Observed>,
}

impl Observer {
    fn start(api: Api) -> Self {
        let (tx, latest) = watch::channel(None);
        let (stop, stop_rx) = watch::channel(false);
        let snaps = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(observe(api, stop_rx, tx, snaps.clone()));
        Self {
            latest,
            snaps,
            stop,
            task,
        }
    }

    /// The latest answer if `pred` holds for it, else the first one to come for which it
    /// does.
    async fn wait_for(&mut self, what: &str, pred: impl Fn(&Snap) -> bool) -> Arc<Snap> {
        let got = tokio::time::timeout(
            patience(),
            self.latest
                .wait_for(|s| s.as_ref().is_some_and(|s| pred(s))),
        )
        .await;
        let got = got.map(|r| r.map(|s| s.clone()));
        match got {
            Ok(Ok(s)) => s.unwrap(),
            Ok(Err(_)) => panic!("the observer stopped before {what}"),
            Err(_) => panic!(
                "timed out after {:?} waiting for {what}; last detail: {:#}",
                patience(),
                self.latest
                    .borrow()
                    .as_ref()
                    .map_or(Value::Null, |s| s.detail.clone())
            ),
        }
    }

    /// When `job` was first seen draining, and a time it surely did not drain yet (the
    /// confirmation of the answer before; 0 if there is none).
    fn drain_seen(&self, job: &str) -> Option<(u64, u64)> {
        let snaps = self.snaps.lock().unwrap();
        let draining = |s: &Snap| {
            jobs(&s.detail)
                .iter()
                .any(|j| j["job"] == job && j["state"] == "draining")
        };
        let first = snaps.iter().position(|s| draining(s))?;
        let before = first
            .checked_sub(1)
            .and_then(|b| snaps[b].confirmed)
            .unwrap_or(0);
        Some((snaps[first].at, before))
    }

    async fn finish(self) -> Observed {
        self.stop.send_replace(true);
        self.task.await.expect("observer task")
    }
}

async fn observe(
    api: Api,
    mut stop: watch::Receiver<bool>,
    tx: watch::Sender<Option<Arc<Snap>>>,
    shared: Arc<Mutex<Vec<Arc<Snap>>>>,
) -> Observed {
    let mut o = Observed {
        min_ready: usize::MAX,
        ..Observed::default()
    };
    let mut index = 0u64;
    loop {
        let path = format!("/v1/services/web?index={index}&wait=5s");
        let answer = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            r = api.get(&path) => r,
        };
        let (headers, body) = match answer {
            Ok((200, h, b)) => (h, b),
            _ => {
                // Down or taking over: try again shortly (there is nothing to wait on).
                o.failed_reads += 1;
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
        };
        let at = monotonic_ns();
        let Some(got) = header_index(&headers) else {
            o.violations
                .push(format!("detail without X-Xce-Index: {body}"));
            continue;
        };
        let detail: Value = match serde_json::from_str(&body) {
            Ok(d) => d,
            Err(e) => {
                o.violations.push(format!("detail not JSON ({e}): {body}"));
                continue;
            }
        };
        if got < index {
            o.violations
                .push(format!("detail index went back from {index} to {got}"));
        }
        if detail["index"].as_u64() != Some(got) {
            o.violations.push(format!(
                "detail body index {} differs from X-Xce-Index {got}",
                detail["index"]
            ));
        }
        if got <= index {
            continue; // the wait ran out: unchanged
        }
        check_detail(&detail, &mut o);
        // The endpoint entry's index never goes back either (read after the detail: it
        // may be ahead of it, never behind an index it already had).
        if let Ok((200, h, _)) = api.get("/v1/services/web/endpoints").await {
            o.endpoint_reads += 1;
            match header_index(&h) {
                Some(e) if e < o.endpoint_index => o.violations.push(format!(
                    "endpoint index went back from {} to {e}",
                    o.endpoint_index
                )),
                Some(e) => o.endpoint_index = e,
                None => o.violations.push("endpoints without X-Xce-Index".into()),
            }
        }
        // Every host's pool holds exactly the ports of the service's jobs on it (`web`
        // is the only service): compared when the detail did not move meanwhile.
        let mut confirmed = None;
        if let Ok(hosts) = api.get_json("/v1/hosts").await {
            let sent = monotonic_ns();
            if let Ok((200, h, _)) = api.get("/v1/services/web").await {
                if header_index(&h) == Some(got) {
                    confirmed = Some(sent);
                    o.pool_checks += 1;
                    check_pools(&detail, &hosts, &mut o.violations);
                }
            }
        }
        index = got;
        let snap = Arc::new(Snap {
            at,
            index,
            detail,
            confirmed,
        });
        shared.lock().unwrap().push(snap.clone());
        o.snaps.push(snap.clone());
        tx.send_replace(Some(snap));
    }
    o
}

/// The invariants of one detail: no duplicate replica, no more than `replicas +
/// max_surge` live jobs, no port held twice, ready never below `replicas`
/// (`max_unavailable = 0`), a draining job never ready, no failed rollout.
fn check_detail(d: &Value, o: &mut Observed) {
    let index = &d["index"];
    let mut slot_gen: BTreeMap<(u64, u64), Vec<&str>> = BTreeMap::new();
    let mut ports: BTreeMap<(&str, u64), &str> = BTreeMap::new();
    let mut live = 0;
    let mut ready = 0;
    for j in jobs(d) {
        let job = job_str(j, "job");
        if !leaving(j) {
            live += 1;
            slot_gen
                .entry((
                    j["replica"].as_u64().unwrap_or(u64::MAX),
                    j["generation"].as_u64().unwrap_or(0),
                ))
                .or_default()
                .push(job);
        } else if j["ready"] == true {
            o.violations
                .push(format!("index {index}: {job} is {} and ready", j["state"]));
        }
        ready += usize::from(j["ready"] == true);
        match j["ports"]["http"].as_u64() {
            Some(p) => {
                if let Some(other) = ports.insert((job_str(j, "host"), p), job) {
                    o.violations.push(format!(
                        "index {index}: port {p} on {} held by {other} and {job}",
                        job_str(j, "host")
                    ));
                }
            }
            None => o
                .violations
                .push(format!("index {index}: {job} has no http port: {j}")),
        }
    }
    for ((replica, generation), js) in &slot_gen {
        if js.len() > 1 {
            o.violations.push(format!(
                "index {index}: replica {replica} has {} live jobs of generation {generation}: {js:?}",
                js.len()
            ));
        }
    }
    if live as u64 > REPLICAS + MAX_SURGE {
        o.violations.push(format!(
            "index {index}: {live} live jobs > replicas + max_surge = {}",
            REPLICAS + MAX_SURGE
        ));
    }
    if (ready as u64) < REPLICAS {
        o.violations.push(format!(
            "index {index}: {ready} ready jobs < replicas - max_unavailable = {REPLICAS}"
        ));
    }
    if matches!(
        d["rollout"]["state"].as_str(),
        Some("failed" | "reverted") | None
    ) {
        o.violations
            .push(format!("index {index}: rollout {}", d["rollout"]));
    }
    o.max_live = o.max_live.max(live);
    o.min_ready = o.min_ready.min(ready);
}

/// Each host's `ports.used` equals the number of the service's jobs on it (one port each).
fn check_pools(d: &Value, hosts: &Value, violations: &mut Vec<String>) {
    let mut on: BTreeMap<&str, u64> = BTreeMap::new();
    for j in jobs(d) {
        *on.entry(job_str(j, "host")).or_default() += 1;
    }
    for h in hosts["hosts"].as_array().map_or(&[][..], Vec::as_slice) {
        let id = job_str(h, "id");
        let used = h["ports"]["used"].as_u64();
        let want = on.get(id).copied().unwrap_or(0);
        if used != Some(want) {
            violations.push(format!(
                "index {}: {id} has ports.used {:?} but {want} jobs hold a port there",
                d["index"], h["ports"]["used"]
            ));
        }
    }
}

/// Kill point 1, a drain in the middle of the rollout: a new replica ready, old ones
/// still live, and an old one draining (the earliest such moment is the first drain, so
/// the rest of the rollout leaves room for kill point 2 even on a slow machine).
fn mid_rollout(d: &Value) -> bool {
    count(d, |j| {
        j["generation"] == 2 && j["state"] == "running" && j["ready"] == true
    }) >= 1
        && count(d, |j| j["generation"] == 1 && !leaving(j)) >= 1
        && count(d, |j| j["generation"] == 1 && j["state"] == "draining") >= 1
}

/// Kill point 2, a new replica starting: placed, or running and not ready yet (its
/// readiness arrives while the controller is down), with an old one still live, and
/// after an old one has exited (its port was released before the kill, and the rollout
/// still has a replica to place after the restart).
fn starting(d: &Value) -> bool {
    count(d, |j| {
        j["generation"] == 2 && !leaving(j) && j["ready"] != true
    }) >= 1
        && count(d, |j| j["generation"] == 1 && !leaving(j)) >= 1
        && (count(d, |j| j["generation"] == 1) as u64) < REPLICAS
}

/// The service's jobs as job → (host, port).
fn placements(d: &Value) -> BTreeMap<String, (String, u64)> {
    jobs(d)
        .iter()
        .map(|j| {
            (
                job_str(j, "job").to_owned(),
                (
                    job_str(j, "host").to_owned(),
                    j["ports"]["http"].as_u64().unwrap_or(0),
                ),
            )
        })
        .collect()
}

/// One kill -9 of the controller that serves, and its way back.
#[derive(Debug)]
struct Kill {
    what: &'static str,
    /// The detail the kill was decided on (the last answer before it).
    at_kill: Arc<Snap>,
    /// Jobs draining at the kill.
    draining: Vec<Draining>,
    killed_at: u64,
    /// The earliest the next controller can have loaded the state (monotonic ns): drains
    /// restart from then, so no job draining at the kill gets SIGTERM before
    /// `up_from + DRAIN`.
    up_from: u64,
    /// When it served again.
    serving_at: u64,
    /// redb: from the restart (spawn) to serving.
    restart: Option<Duration>,
}

/// A parked blocking query answers within milliseconds of the change it waits for: a
/// job first seen draining at `t` began its drain after `t` minus this.
const WAKE_UP_SLACK: u64 = 250_000_000;

/// A job draining when the controller was killed.
#[derive(Debug)]
struct Draining {
    job: String,
    /// When the observer first saw it draining.
    seen: u64,
    /// Its drain (the one running at the kill) began before this: `seen`, or the
    /// previous restart if it was draining across that too.
    began_by: u64,
    /// Its drain began after this: the latest of when the answer before `seen` was last
    /// confirmed, `seen` minus [`WAKE_UP_SLACK`], and the previous restart (which
    /// restarted the drain).
    began_after: u64,
}

impl Kill {
    /// Waits until every drain running at the kill would be over if it were measured
    /// from its start (at or before `began_by`), plus a margin: a
    /// controller that did not restart the drain would send SIGTERM at once.
    async fn outlast_drains(&self) {
        let Some(began_by) = self.draining.iter().map(|d| d.began_by).max() else {
            return;
        };
        let until = began_by + DRAIN.as_nanos() as u64 + 300_000_000;
        let now = monotonic_ns();
        if until > now {
            tokio::time::sleep(Duration::from_nanos(until - now)).await;
        }
    }
}

/// The rollout v1 → v2 of `web` under observation, and the kills made in it.
struct Run {
    observer: Observer,
    put_at: u64,
    kills: Vec<Kill>,
}

impl Run {
    /// Creates `web` v1, waits until it is complete, starts the observer and rolls out v2.
    async fn start(api: &Api, r: &Replicas) -> Self {
        let (status, body) = api.put_toml("web", &r.profile("v1")).await.unwrap();
        assert_eq!(status, 201, "create v1: {body}");
        wait_detail(api, "v1 complete with 4 ready replicas", |d| settled(d, 1))
            .await
            .unwrap();
        let mut observer = Observer::start(api.clone());
        observer
            .wait_for("the observer's first answer", |s| settled(&s.detail, 1))
            .await;
        let put_at = monotonic_ns();
        let (status, body) = api.put_toml("web", &r.profile("v2")).await.unwrap();
        assert_eq!(status, 200, "update to v2: {body}");
        assert_eq!(body["generation"], 2, "a changed profile is generation 2");
        Self {
            observer,
            put_at,
            kills: Vec::new(),
        }
    }

    /// Waits for an answer from the controller serving now (after the last restart)
    /// where the rollout to v2 is at `point`; fails if the rollout is over first.
    async fn kill_point(&mut self, what: &'static str, point: fn(&Value) -> bool) -> Kill {
        let after = self.kills.last().map_or(0, |k| k.serving_at);
        let at_kill = self
            .observer
            .wait_for(what, |s| {
                s.at > after
                    && s.detail["generation"] == 2
                    && (s.detail["rollout"]["state"] != "progressing" || point(&s.detail))
            })
            .await;
        assert!(
            at_kill.detail["rollout"]["state"] == "progressing" && point(&at_kill.detail),
            "the rollout was over before {what}: {:#}",
            at_kill.detail
        );
        let (restarted, served) = self
            .kills
            .last()
            .map_or((0, 0), |k| (k.up_from, k.serving_at));
        let draining = jobs(&at_kill.detail)
            .iter()
            .filter(|j| j["state"] == "draining")
            .map(|j| {
                let job = job_str(j, "job").to_owned();
                let (seen, before) = self.observer.drain_seen(&job).unwrap_or((at_kill.at, 0));
                Draining {
                    job,
                    seen,
                    began_by: seen.max(served),
                    began_after: before
                        .max(seen.saturating_sub(WAKE_UP_SLACK))
                        .max(restarted),
                }
            })
            .collect();
        Kill {
            what,
            at_kill,
            draining,
            killed_at: 0,
            up_from: 0,
            serving_at: 0,
            restart: None,
        }
    }
}

/// What one kill measured.
#[derive(Debug)]
struct KillFigures {
    what: &'static str,
    after_put: Duration,
    at_kill: String,
    down: Duration,
    restart: Option<Duration>,
    ports_reassigned: usize,
    drains: Vec<DrainFigure>,
}

/// A drain that ran across a kill.
#[derive(Debug)]
struct DrainFigure {
    job: String,
    /// It surely still ran at the kill, so the full-drain check applied.
    checked: bool,
    /// SIGTERM after the controller came back (`up_from`).
    sigterm_after_up: Duration,
    /// SIGTERM after the job was first seen draining.
    drained: Duration,
}

/// What one run measured.
#[derive(Debug)]
struct Figures {
    kills: Vec<KillFigures>,
    complete_after_last_up: Duration,
    complete_after_first_kill: Duration,
    rollout_total: Duration,
    processes: usize,
    ports_reused: usize,
    snapshots: usize,
    pool_checks: u32,
    endpoint_reads: u32,
    failed_reads: u32,
    max_live: usize,
    min_ready: usize,
    leaked: u64,
}

fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (n, k) in self.kills.iter().enumerate() {
            let drains: Vec<String> = k
                .drains
                .iter()
                .map(|d| {
                    format!(
                        "{}:sigterm_after_up={},drained={}{}",
                        d.job,
                        secs(d.sigterm_after_up),
                        secs(d.drained),
                        if d.checked { "" } else { ",unchecked" }
                    )
                })
                .collect();
            write!(
                f,
                "kill{}=({}: after_put={} at_kill=[{}] down={}{} ports_reassigned={} draining=[{}]) ",
                n + 1,
                k.what,
                secs(k.after_put),
                k.at_kill,
                secs(k.down),
                k.restart
                    .map(|r| format!(" (restart to serving {})", secs(r)))
                    .unwrap_or_default(),
                k.ports_reassigned,
                drains.join(" ")
            )?;
        }
        write!(
            f,
            "complete_after_last_up={} complete_after_first_kill={} rollout_total={} processes={} ports_reused={} snapshots={} pool_checks={} endpoint_index_reads={} failed_reads={} max_live={} min_ready={} leaked_ports={}",
            secs(self.complete_after_last_up),
            secs(self.complete_after_first_kill),
            secs(self.rollout_total),
            self.processes,
            self.ports_reused,
            self.snapshots,
            self.pool_checks,
            self.endpoint_reads,
            self.failed_reads,
            self.max_live,
            self.min_ready,
            self.leaked,
        )
    }
}

fn ns(d: u64) -> Duration {
    Duration::from_nanos(d)
}

/// After the last restart: the rollout completes; every invariant held all along
/// (observer); across each kill no job moved or vanished; the service stops without a
/// leak; and the replica processes' own logs agree (each job ran once, no address and no
/// slot-generation held by two processes at once, every drain running at a kill restarted
/// in full).
async fn finish(api: &Api, r: &Replicas, run: Run, worker_logs: &[PathBuf]) -> Figures {
    let Run {
        mut observer,
        put_at,
        kills,
    } = run;
    let last_up = kills.last().expect("a kill").serving_at;
    let done = observer
        .wait_for("the v2 rollout settled after the last restart", |s| {
            s.at > last_up && settled(&s.detail, 2)
        })
        .await;
    let observed = observer.finish().await;
    assert!(
        observed.violations.is_empty(),
        "invariants broken during the rollout:\n{}",
        observed.violations.join("\n")
    );
    let complete_at = observed
        .snaps
        .iter()
        .find(|s| s.at > last_up && s.detail["rollout"]["state"] == "complete")
        .map_or(done.at, |s| s.at);
    assert_eq!(
        done.detail["generation"], 2,
        "the restarts made no generation of their own"
    );

    // Stop it all: every port free again, every replica gone.
    let leaked = stop_all_and_count_leaks(api).await;
    assert_eq!(leaked, 0, "ports leaked");
    eventually("every replica process gone", || async {
        Ok(r.live_pids().is_empty().then_some(()))
    })
    .await;

    // What really ran.
    let procs = r.processes().unwrap();
    for p in procs.values() {
        assert_eq!(p.starts, 1, "{} was launched {} times", p.job, p.starts);
        assert!(
            p.term.is_some(),
            "{} ended without SIGTERM (killed?)",
            p.job
        );
    }
    assert_eq!(
        procs.len() as u64,
        2 * REPLICAS,
        "one process per replica and generation: {procs:#?}"
    );
    let all: Vec<&Proc> = procs.values().collect();
    let overlap = |a: &Proc, b: &Proc| {
        a.start < b.term.unwrap_or(u64::MAX) && b.start < a.term.unwrap_or(u64::MAX)
    };
    let mut reused = BTreeSet::new();
    for (n, a) in all.iter().enumerate() {
        for b in &all[n + 1..] {
            if a.addr == b.addr {
                reused.insert(a.addr.clone());
                assert!(
                    !overlap(a, b),
                    "{:?} held by {} and {} at once",
                    a.addr,
                    a.job,
                    b.job
                );
            }
            assert!(
                !((a.replica, a.generation) == (b.replica, b.generation) && overlap(a, b)),
                "replica {} generation {} ran twice at once: {} and {}",
                a.replica,
                a.generation,
                a.job,
                b.job
            );
        }
    }

    let mut kill_figures = Vec::new();
    for k in &kills {
        // The jobs the controller had at the kill are still there after it (none of them
        // could end meanwhile but a stopping one), on the same host and port.
        let before = placements(&k.at_kill.detail);
        let first_after = observed
            .snaps
            .iter()
            .find(|s| s.at > k.killed_at)
            .expect("an answer after the restart");
        assert!(
            first_after.index >= k.at_kill.index,
            "{}: the index went back across the restart: {} -> {}",
            k.what,
            k.at_kill.index,
            first_after.index
        );
        let after = placements(&first_after.detail);
        let reassigned: Vec<_> = before
            .iter()
            .filter(|(job, hp)| after.get(*job).is_some_and(|now| now != *hp))
            .collect();
        assert!(
            reassigned.is_empty(),
            "{}: jobs moved across the restart: {reassigned:?}",
            k.what
        );
        let vanished: Vec<&str> = jobs(&k.at_kill.detail)
            .iter()
            .filter(|j| j["state"] != "stopping" && !after.contains_key(job_str(j, "job")))
            .map(|j| job_str(j, "job"))
            .collect();
        // Jobs "gone" here mostly means the observer saw nothing for a while after the
        // restart (its first answer came after the rollout had moved on): say when.
        assert!(
            vanished.is_empty(),
            "{}: jobs gone across the restart: {vanished:?}; the first answer after the kill came {:?} after it ({:?} after the next controller served), {} reads failed in the whole run",
            k.what,
            ns(first_after.at - k.killed_at),
            ns(first_after.at.saturating_sub(k.serving_at)),
            observed.failed_reads
        );
        let mut drains = Vec::new();
        for d in &k.draining {
            let term = procs[&d.job].term.unwrap();
            // A drain that may have ended on its own just before the kill proves nothing.
            let running_at_kill = d.began_after + DRAIN.as_nanos() as u64 > k.killed_at;
            if running_at_kill {
                assert!(
                    term >= k.up_from + DRAIN.as_nanos() as u64,
                    "{}: {} was draining at the kill and got SIGTERM {:?} after the controller came back (drain {DRAIN:?}): the restart shortened its drain",
                    k.what,
                    d.job,
                    ns(term.saturating_sub(k.up_from))
                );
            }
            drains.push(DrainFigure {
                job: d.job.clone(),
                checked: running_at_kill,
                sigterm_after_up: ns(term.saturating_sub(k.up_from)),
                drained: ns(term.saturating_sub(d.seen)),
            });
        }
        let d = &k.at_kill.detail;
        kill_figures.push(KillFigures {
            what: k.what,
            after_put: ns(k.killed_at - put_at),
            at_kill: format!(
                "new_ready={},new_starting={},old_live={},old_draining={}",
                count(d, |j| j["generation"] == 2 && j["ready"] == true),
                count(d, |j| j["generation"] == 2 && j["ready"] != true),
                count(d, |j| j["generation"] == 1 && !leaving(j)),
                count(d, |j| j["generation"] == 1 && leaving(j)),
            ),
            down: ns(k.serving_at - k.killed_at),
            restart: k.restart,
            ports_reassigned: reassigned.len(),
            drains,
        });
    }

    let mut refused = Vec::new();
    for log in worker_logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for needle in ["launch refused", "controller refused events"] {
            if text.contains(needle) {
                refused.push(format!("{}: {needle}", log.display()));
            }
        }
    }
    assert!(refused.is_empty(), "workers: {refused:?}");

    Figures {
        complete_after_last_up: ns(complete_at.saturating_sub(last_up)),
        complete_after_first_kill: ns(complete_at - kills[0].killed_at),
        rollout_total: ns(complete_at - put_at),
        kills: kill_figures,
        processes: procs.len(),
        ports_reused: reused.len(),
        snapshots: observed.snaps.len(),
        pool_checks: observed.pool_checks,
        endpoint_reads: observed.endpoint_reads,
        failed_reads: observed.failed_reads,
        max_live: observed.max_live,
        min_ready: observed.min_ready,
        leaked,
    }
}

/// Prints the daemons' logs when the test fails (the redb [`Cluster`] does not).
struct LogsOnPanic(Vec<(String, PathBuf)>);

impl Drop for LogsOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            dump_logs(&self.0);
        }
    }
}

/// kill -9 of the redb controller at the kill point, restarted on its data dir once the
/// drains running at the kill would have ended.
async fn kill_and_restart(c: &mut Cluster, mut k: Kill) -> Kill {
    c.kill_controller();
    k.killed_at = monotonic_ns();
    k.outlast_drains().await;
    k.up_from = monotonic_ns();
    c.start_controller().expect("restart on the same data dir");
    k.serving_at = monotonic_ns();
    k.restart = Some(ns(k.serving_at - k.up_from));
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_kill_9_twice_mid_rollout_restarts_and_the_rollout_completes() {
    let r = Replicas::new();
    let mut c = Cluster::new(3, "30s").expect("cluster");
    let mut names = vec!["controller".to_owned()];
    names.extend((0..3).map(|i| format!("worker-{i}")));
    let _logs = LogsOnPanic(
        names
            .iter()
            .map(|n| (n.clone(), c.dir.path().join(format!("{n}.log"))))
            .collect(),
    );
    let api = c.api.clone();
    let mut run = Run::start(&api, &r).await;
    let k = run.kill_point("a drain", mid_rollout).await;
    run.kills.push(kill_and_restart(&mut c, k).await);
    let k = run
        .kill_point("a new replica starting, an old one gone", starting)
        .await;
    run.kills.push(kill_and_restart(&mut c, k).await);

    let worker_logs: Vec<PathBuf> = (0..3)
        .map(|i| c.dir.path().join(format!("worker-{i}.log")))
        .collect();
    let f = finish(&api, &r, run, &worker_logs).await;
    println!("FIGURE rollout faults, redb controller kill -9 twice in one rollout: {f}");
}

/// kill -9 of the etcd leader at the kill point; the standby takes over (once the lease
/// runs out); the killed one comes back as the next standby.
async fn kill_leader(ha: &mut Fleet, mut k: Kill) -> Kill {
    let leader = ha.serving_controller().expect("a leader");
    let standby = 1 - leader;
    ha.kill_9_controller(leader);
    k.killed_at = monotonic_ns();
    k.outlast_drains().await;
    eventually(&format!("controller {standby} takes over"), || async {
        Ok(ha.announced_at(standby).map(|_| ()))
    })
    .await;
    let announced = ha.announced_at(standby).unwrap();
    k.serving_at = monotonic_ns() - announced.elapsed().as_nanos() as u64;
    // The standby loads the state just before it announces; its drains restart then.
    // Loading and binding take milliseconds: 250 ms of slack.
    k.up_from = k.serving_at - 250_000_000;
    assert!(
        k.up_from > k.killed_at,
        "the standby took over {:?} after the kill, sooner than the lease allows",
        ns(k.serving_at - k.killed_at)
    );
    ha.start_controller(leader).unwrap();
    let log = ha.log(&format!("controller-{leader}"));
    let new_leader = format!("@127.0.0.1:{})", ha.controller_ports[standby]);
    eventually(
        &format!("controller {leader} waits as a standby"),
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            Ok(text.contains(&new_leader).then_some(()))
        },
    )
    .await;
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_9_twice_mid_rollout_standby_takes_over_and_the_rollout_completes() {
    let r = Replicas::new();
    let etcd = EtcdCluster::start(1).await.expect("etcd");
    let mut ha = Fleet::new(etcd, 3, 1).expect("fleet dir");
    ha.start_leader_and_standby().await;
    ha.start_apiserver(0).unwrap();
    eventually("the apiserver serves", || async {
        Ok(ha.apiservers[0]
            .as_ref()
            .and_then(Daemon::announced_at)
            .map(|_| ()))
    })
    .await;
    ha.start_workers(3).unwrap();
    // Everything goes through the apiserver, as a client that does not know the leader.
    let api = ha.apiserver(0);
    eventually("3 ready hosts", || async {
        let h = api.get_json("/v1/hosts").await?;
        let ready = h["hosts"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|h| h["state"] == "ready").count());
        Ok((ready == 3).then_some(()))
    })
    .await;
    let mut run = Run::start(&api, &r).await;
    let k = run.kill_point("a drain", mid_rollout).await;
    run.kills.push(kill_leader(&mut ha, k).await);
    let k = run
        .kill_point("a new replica starting, an old one gone", starting)
        .await;
    run.kills.push(kill_leader(&mut ha, k).await);

    let worker_logs: Vec<PathBuf> = (0..3).map(|i| ha.log(&format!("worker-{i}"))).collect();
    let f = finish(&api, &r, run, &worker_logs).await;
    println!(
        "FIGURE rollout faults, etcd leader kill -9 twice in one rollout (leader_ttl {LEADER_TTL}): {f}"
    );
}
