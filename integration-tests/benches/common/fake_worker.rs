//! Fake workers: this process speaking the worker side of the real `/internal/v1`
//! protocol (register with the facts a real worker's `address` and `ports` providers
//! report, heartbeats, the assignments blocking query, events), with no `xced worker` and
//! no replica processes, so that a bench measures the controller and the apiservers.
//!
//! - [`FakeWorker`]: one host whose events the bench sends itself (`benches/scale.rs`:
//!   one readiness change is one precise event).
//! - [`spawn_fleet`]: many hosts, **one tokio task each**, that behave like a worker whose
//!   replicas start and become ready at once and exit at once when stopped: a job
//!   assigned to run is reported `started` and `ready` in the next events batch, a job
//!   asked to stop (or no longer listed) is reported `exited` by SIGTERM. Batches of at
//!   most [`MAX_BATCH`] events, like the real worker's outbox (`benches/controller_scale.rs`).

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The most events in one POST (the real worker's `MAX_BATCH`).
pub(crate) const MAX_BATCH: usize = 256;

/// A host's id, its worker credential and the address it advertises.
#[derive(Debug, Clone)]
pub(crate) struct HostId {
    pub(crate) host: String,
    pub(crate) secret: String,
    pub(crate) ip: String,
}

impl HostId {
    /// `<controller>/internal/v1/hosts/<host>/`
    fn base(&self, controller: &str) -> String {
        format!("{controller}/internal/v1/hosts/{}/", self.host)
    }
}

/// The facts a real worker with the `address` and `ports` providers reports.
pub(crate) fn facts(ip: &str) -> Value {
    json!({
        "ip_addr": ip,
        "addresses": [ { "ip": ip, "interface": "lo" } ],
        "sections": {
            "ports": { "range": [20000, 32000], "reserved": [22, 80], "ephemeral": null }
        }
    })
}

/// Registers the host; returns the heartbeat period the controller asks for, in ms.
pub(crate) async fn register(http: &reqwest::Client, base: &str, id: &HostId) -> Result<u64> {
    let r = http
        .post(format!("{base}register"))
        .bearer_auth(&id.secret)
        .json(&json!({ "facts": facts(&id.ip), "running": [] }))
        .send()
        .await?;
    if !r.status().is_success() {
        let st = r.status();
        bail!("register {}: HTTP {st}: {}", id.host, r.text().await?);
    }
    let v: Value = r.json().await?;
    v["heartbeat_ms"]
        .as_u64()
        .with_context(|| format!("register answer {v}"))
}

/// One heartbeat: `Ok(false)` when the controller forgot the host (404: register again).
async fn heartbeat(http: &reqwest::Client, base: &str, secret: &str) -> Result<bool> {
    let r = http
        .post(format!("{base}heartbeat"))
        .bearer_auth(secret)
        .send()
        .await?;
    match r.status().as_u16() {
        404 => Ok(false),
        s if (200..300).contains(&s) => Ok(true),
        s => bail!("heartbeat: HTTP {s}"),
    }
}

/// An assignments answer as a JSON tree (the bench-driven [`FakeWorker`]; the fleet reads
/// only what it needs, see [`Answer`]).
async fn assignments(
    http: &reqwest::Client,
    base: &str,
    secret: &str,
    index: u64,
    wait: &str,
) -> Result<Value> {
    let body = assignments_body(http, base, secret, index, wait).await?;
    Ok(serde_json::from_slice(body.as_ref())?)
}

/// An assignments answer's body, unparsed.
async fn assignments_body(
    http: &reqwest::Client,
    base: &str,
    secret: &str,
    index: u64,
    wait: &str,
) -> Result<impl AsRef<[u8]>> {
    let r = http
        .get(format!("{base}assignments?index={index}&wait={wait}"))
        .bearer_auth(secret)
        .send()
        .await?;
    if r.status() != 200 {
        let st = r.status();
        bail!("assignments: HTTP {st}: {}", r.text().await?);
    }
    Ok(r.bytes().await?)
}

async fn post_events(
    http: &reqwest::Client,
    base: &str,
    secret: &str,
    events: &[impl serde::Serialize],
) -> Result<()> {
    let r = http
        .post(format!("{base}events"))
        .bearer_auth(secret)
        .json(events)
        .send()
        .await?;
    if !r.status().is_success() {
        let st = r.status();
        bail!("events: HTTP {st}: {}", r.text().await?);
    }
    Ok(())
}

// === one host, driven by the bench ===

/// One fake host whose heartbeats run in a task and whose events the bench sends.
pub(crate) struct FakeWorker {
    http: reqwest::Client,
    /// `<controller>/internal/v1/hosts/<host>/`
    base: String,
    secret: String,
    pub(crate) jobs: Vec<String>,
    pub(crate) heartbeats: tokio::task::JoinHandle<()>,
}

impl FakeWorker {
    pub(crate) async fn start(
        http: reqwest::Client,
        controller: &str,
        id: &HostId,
    ) -> Result<Self> {
        let base = id.base(controller);
        let every = Duration::from_millis(register(&http, &base, id).await?.max(100));
        let heartbeats = tokio::spawn({
            let (http, base, id) = (http.clone(), base.clone(), id.clone());
            async move {
                loop {
                    tokio::time::sleep(every).await;
                    match heartbeat(&http, &base, &id.secret).await {
                        Ok(false) => {
                            eprintln!("fake worker: heartbeat 404, registering again");
                            let _ = register(&http, &base, &id).await;
                        }
                        Ok(true) => {}
                        Err(e) => eprintln!("fake worker: heartbeat: {e:#}"),
                    }
                }
            }
        });
        Ok(Self {
            http,
            base,
            secret: id.secret.clone(),
            jobs: Vec::new(),
            heartbeats,
        })
    }

    /// The host's assignments now.
    pub(crate) async fn assignments(&self) -> Result<Value> {
        assignments(&self.http, &self.base, &self.secret, 0, "1s").await
    }

    pub(crate) async fn events(&self, events: &[Value]) -> Result<()> {
        post_events(&self.http, &self.base, &self.secret, events).await
    }

    /// The readiness change: job 0 becomes `ready`.
    pub(crate) async fn flip(&self, ready: bool) -> Result<()> {
        self.events(&[json!({"event": "readiness", "job": self.jobs[0], "ready": ready})])
            .await
    }
}

// === a fleet of hosts, one task each ===

/// What a fleet did, summed over its hosts. Every change bumps `changed`, so the bench
/// waits on it instead of polling.
#[derive(Debug)]
pub(crate) struct FleetStats {
    /// Hosts registered (at least once).
    pub(crate) registered: AtomicUsize,
    /// Jobs reported started and ready, acknowledged by the controller.
    pub(crate) started: AtomicUsize,
    /// Jobs reported exited, acknowledged.
    pub(crate) exited: AtomicUsize,
    /// Stops whose `exited` the controller acknowledged more than the grace after the
    /// assignments answer that asked for them (the fake replica exited at once).
    pub(crate) late_stops: AtomicUsize,
    /// Assignments answers taken, event POSTs made, failed calls.
    pub(crate) answers: AtomicUsize,
    pub(crate) posts: AtomicUsize,
    pub(crate) errors: AtomicUsize,
    /// The last failed call's error.
    pub(crate) last_error: std::sync::Mutex<String>,
    /// The longest time from an assignments answer to the acknowledgement of the stops
    /// it asked for, in µs.
    pub(crate) slowest_stop_us: AtomicUsize,
    changed: watch::Sender<u64>,
}

impl FleetStats {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            registered: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            exited: AtomicUsize::new(0),
            late_stops: AtomicUsize::new(0),
            answers: AtomicUsize::new(0),
            posts: AtomicUsize::new(0),
            errors: AtomicUsize::new(0),
            last_error: std::sync::Mutex::new(String::new()),
            slowest_stop_us: AtomicUsize::new(0),
            changed: watch::Sender::new(0),
        })
    }

    fn add(&self, counter: &AtomicUsize, n: usize) {
        counter.fetch_add(n, Ordering::Relaxed);
        self.changed.send_modify(|g| *g += 1);
    }

    fn fail(&self, what: &str, e: &anyhow::Error) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = format!("{what}: {e:#}");
        self.add(&self.errors, 1);
    }

    pub(crate) fn get(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::Relaxed)
    }

    /// Waits until `pred` holds (woken by every change of the fleet), at most `limit`.
    pub(crate) async fn wait_until(
        &self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&Self) -> bool,
    ) -> Result<()> {
        let mut rx = self.changed.subscribe();
        let wait = async {
            while !pred(self) {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        if tokio::time::timeout(limit, wait).await.is_err() {
            bail!("fleet: {what} not within {limit:?}: {self:?}");
        }
        Ok(())
    }
}

/// Starts one task per host; they run until aborted.
pub(crate) fn spawn_fleet(
    http: reqwest::Client,
    controller: &str,
    hosts: Vec<HostId>,
    grace: Duration,
    stats: Arc<FleetStats>,
) -> Vec<tokio::task::JoinHandle<()>> {
    hosts
        .into_iter()
        .map(|id| {
            let base = id.base(controller);
            tokio::spawn(host_loop(http.clone(), base, id, grace, stats.clone()))
        })
        .collect()
}

/// Opens the connections a real fleet keeps: a real worker has its own client, so each
/// host holds its parked assignments query and a second connection for its heartbeats
/// and events. The fleet's hosts share one client, whose pool would otherwise open those
/// second connections only while placing, when every host posts events at once, and a
/// per-host cost would be counted as a per-replica one. One heartbeat per host, all at
/// once: the pool keeps the connections they opened.
pub(crate) async fn open_second_connections(
    http: &reqwest::Client,
    controller: &str,
    hosts: &[HostId],
) -> Result<()> {
    let beats = hosts.iter().map(|id| async move {
        let base = id.base(controller);
        match heartbeat(http, &base, &id.secret).await? {
            true => Ok(()),
            false => bail!("heartbeat of {}: the controller forgot the host", id.host),
        }
    });
    futures_util::future::try_join_all(beats).await?;
    Ok(())
}

/// Registers, retrying every 100 ms (the controller may be restarting).
async fn register_until(
    http: &reqwest::Client,
    base: &str,
    id: &HostId,
    stats: &FleetStats,
) -> Duration {
    loop {
        match register(http, base, id).await {
            Ok(ms) => return Duration::from_millis(ms.max(100)),
            Err(e) => {
                stats.fail("register", &e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One host: heartbeats on time while one assignments query stays parked; each answer
/// is turned into events at once.
async fn host_loop(
    http: reqwest::Client,
    base: String,
    id: HostId,
    grace: Duration,
    stats: Arc<FleetStats>,
) {
    let every = register_until(&http, &base, &id, &stats).await;
    stats.add(&stats.registered, 1);
    let mut running: HashSet<String> = HashSet::new();
    let mut ended: HashSet<String> = HashSet::new();
    let mut index = 0;
    let mut next_beat = tokio::time::Instant::now() + every;
    let query = |index: u64| {
        let (http, base, secret) = (http.clone(), base.clone(), id.secret.clone());
        Box::pin(async move { assignments_body(&http, &base, &secret, index, "30s").await })
    };
    let mut parked = query(index);
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next_beat) => {
                next_beat = tokio::time::Instant::now() + every;
                match heartbeat(&http, &base, &id.secret).await {
                    Ok(true) => {}
                    Ok(false) => {
                        register_until(&http, &base, &id, &stats).await;
                    }
                    Err(e) => stats.fail("heartbeat", &e),
                }
            }
            answer = &mut parked => {
                let at = Instant::now();
                match answer {
                    Ok(body) => match serde_json::from_slice::<Answer<'_>>(body.as_ref()) {
                        Ok(a) => {
                            stats.add(&stats.answers, 1);
                            index = a.index;
                            let events = changes(&a, &mut running, &mut ended);
                            send(&http, &base, &id.secret, events, at, grace, &stats).await;
                        }
                        Err(e) => {
                            stats.fail("assignments", &e.into());
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    },
                    Err(e) => {
                        stats.fail("assignments", &e);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                parked = query(index);
            }
        }
    }
}

/// What the fleet reads of an assignments answer: a fake host needs only the ids and
/// what is desired of them. Borrowed from the body (copied only when a string has
/// escapes), so a host's whole set is read without building a JSON tree: the fakes stand
/// in for 1,000 machines and share this one's cores with the controller they measure.
#[derive(serde::Deserialize)]
struct Answer<'a> {
    index: u64,
    #[serde(borrow)]
    jobs: Vec<Listed<'a>>,
}

#[derive(serde::Deserialize)]
struct Listed<'a> {
    #[serde(borrow)]
    job: Cow<'a, str>,
    #[serde(borrow)]
    desired: Cow<'a, str>,
}

/// One event of a fleet host, serialized as the worker protocol's `WorkerEvent`.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "event")]
enum Event {
    Started {
        job: String,
        pid: u32,
    },
    Readiness {
        job: String,
        ready: bool,
    },
    Exited {
        job: String,
        code: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
    },
}

/// The events a worker whose replicas start, become ready and exit at once sends for a
/// new desired set.
fn changes(
    a: &Answer<'_>,
    running: &mut HashSet<String>,
    ended: &mut HashSet<String>,
) -> Vec<Event> {
    let pid = std::process::id();
    let mut events = Vec::new();
    let mut listed: HashMap<&str, bool> = HashMap::with_capacity(a.jobs.len());
    for j in &a.jobs {
        let job: &str = &j.job;
        let run = j.desired == "run";
        listed.insert(job, run);
        if running.contains(job) || ended.contains(job) {
            continue;
        }
        if run {
            running.insert(job.to_owned());
            events.push(Event::Started {
                job: job.to_owned(),
                pid,
            });
            events.push(Event::Readiness {
                job: job.to_owned(),
                ready: true,
            });
        } else {
            // Asked to stop a job that never ran here: reported gone, as a worker does.
            events.push(Event::Exited {
                job: job.to_owned(),
                code: None,
                signal: None,
            });
            ended.insert(job.to_owned());
        }
    }
    // Asked to stop, or no longer listed (an orphan, which a worker stops too).
    let stops: Vec<String> = running
        .iter()
        .filter(|j| listed.get(j.as_str()) != Some(&true))
        .cloned()
        .collect();
    for job in stops {
        running.remove(&job);
        ended.insert(job.clone());
        events.push(Event::Exited {
            job,
            code: None,
            signal: Some(15),
        });
    }
    // Ended jobs the controller no longer lists are never listed again.
    ended.retain(|j| listed.contains_key(j.as_str()));
    events
}

/// Sends `events` in batches, each retried until acknowledged (as the real outbox does),
/// and counts what was acknowledged.
async fn send(
    http: &reqwest::Client,
    base: &str,
    secret: &str,
    events: Vec<Event>,
    asked_at: Instant,
    grace: Duration,
    stats: &FleetStats,
) {
    for batch in events.chunks(MAX_BATCH) {
        loop {
            stats.add(&stats.posts, 1);
            match post_events(http, base, secret, batch).await {
                Ok(()) => break,
                Err(e) => stats.fail("events", &e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let started = batch
            .iter()
            .filter(|e| matches!(e, Event::Started { .. }))
            .count();
        let exited = batch
            .iter()
            .filter(|e| matches!(e, Event::Exited { .. }))
            .count();
        if exited > 0 {
            let took = asked_at.elapsed();
            if took > grace {
                stats.add(&stats.late_stops, exited);
            }
            stats
                .slowest_stop_us
                .fetch_max(took.as_micros() as usize, Ordering::Relaxed);
            stats.add(&stats.exited, exited);
        }
        if started > 0 {
            stats.add(&stats.started, started);
        }
    }
}
