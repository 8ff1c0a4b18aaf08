//! Real processes on loopback against a fake controller (an axum router implementing the
//! `/internal/v1` routes of [`xce_proto::worker`] and recording what the worker sends).

use super::*;
use async_trait::async_trait;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use plugin_api::{
    FactsError, HostFacts, HostFactsProvider, LaunchContext, LaunchHook, LaunchPlan, LaunchRefusal,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testkit::{free_port, patience};
use tokio::sync::{oneshot, watch};
use xce_proto::profile::{Probe, Readiness};
use xce_proto::worker::{
    Assignment, Assignments, Desired, RegisterRequest, RegisterResponse, RunningJob, WorkerEvent,
};

const HOST: &str = "exec-01";
const TOKEN: &str = "worker-secret";

// === fake controller ===

#[derive(Debug)]
struct FakeState {
    assignments: Assignments,
    events: Vec<WorkerEvent>,
    register_attempts: u32,
    registers: Vec<RegisterRequest>,
    facts_puts: Vec<HostFacts>,
    /// Answer this many registrations with 503 first.
    fail_registers: u32,
    /// Answer heartbeats with 404 until the next registration.
    forget_host: bool,
    /// Answer fact reports with 400.
    refuse_facts: bool,
}

impl Default for FakeState {
    fn default() -> Self {
        Self {
            assignments: Assignments {
                index: 0,
                jobs: Vec::new(),
            },
            events: Vec::new(),
            register_attempts: 0,
            registers: Vec::new(),
            facts_puts: Vec::new(),
            fail_registers: 0,
            forget_host: false,
            refuse_facts: false,
        }
    }
}

#[derive(Clone)]
struct Fake {
    state: Arc<Mutex<FakeState>>,
    /// Bumped on every change of `state`.
    generation: Arc<watch::Sender<u64>>,
}

impl Fake {
    fn new() -> Self {
        Self {
            state: Arc::default(),
            generation: Arc::new(watch::Sender::new(0)),
        }
    }

    fn update<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        let r = f(&mut self.state.lock().unwrap());
        self.generation.send_modify(|g| *g += 1);
        r
    }

    /// Waits until `pred` holds of the state (woken by every change, no polling).
    async fn wait_until(&self, what: &str, pred: impl Fn(&FakeState) -> bool) {
        let mut rx = self.generation.subscribe();
        let wait = async {
            loop {
                if pred(&self.state.lock().unwrap()) {
                    return;
                }
                rx.changed().await.unwrap();
            }
        };
        if tokio::time::timeout(patience(), wait).await.is_err() {
            panic!(
                "timed out waiting for {what}; state: {:#?}",
                self.state.lock().unwrap()
            );
        }
    }

    fn set_jobs(&self, jobs: Vec<Assignment>) {
        self.update(|s| {
            s.assignments.index += 1;
            s.assignments.jobs = jobs;
        });
    }

    fn events_of(&self, job: &str) -> Vec<WorkerEvent> {
        self.state
            .lock()
            .unwrap()
            .events
            .iter()
            .filter(|e| event_job(e) == job)
            .cloned()
            .collect()
    }

    async fn serve(&self) -> String {
        let app = Router::new()
            .route("/internal/v1/hosts/{host}/register", post(register))
            .route("/internal/v1/hosts/{host}/heartbeat", post(heartbeat))
            .route("/internal/v1/hosts/{host}/facts", put(facts))
            .route("/internal/v1/hosts/{host}/assignments", get(assignments))
            .route("/internal/v1/hosts/{host}/events", post(events))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }
}

fn event_job(e: &WorkerEvent) -> &str {
    match e {
        WorkerEvent::Started { job, .. }
        | WorkerEvent::Readiness { job, .. }
        | WorkerEvent::Exited { job, .. }
        | WorkerEvent::Refused { job, .. } => job,
    }
}

fn authorized(host: &str, headers: &HeaderMap) -> Result<(), StatusCode> {
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if bearer != Some(TOKEN) {
        return Err(StatusCode::UNAUTHORIZED);
    }
    if host != HOST {
        return Err(StatusCode::FORBIDDEN);
    }
    Ok(())
}

async fn register(
    State(fake): State<Fake>,
    UrlPath(host): UrlPath<String>,
    headers: HeaderMap,
    Json(req): Json<RegisterRequest>,
) -> Response {
    if let Err(status) = authorized(&host, &headers) {
        return status.into_response();
    }
    fake.update(|s| {
        s.register_attempts += 1;
        if s.fail_registers > 0 {
            s.fail_registers -= 1;
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
        s.forget_host = false;
        s.registers.push(req);
        // A controller of before sessions: the worker goes on without one.
        Json(RegisterResponse {
            heartbeat_ms: 100,
            cluster: None,
            session: None,
        })
        .into_response()
    })
}

async fn heartbeat(
    State(fake): State<Fake>,
    UrlPath(host): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(status) = authorized(&host, &headers) {
        return status.into_response();
    }
    if fake.state.lock().unwrap().forget_host {
        StatusCode::NOT_FOUND.into_response()
    } else {
        StatusCode::NO_CONTENT.into_response()
    }
}

async fn facts(
    State(fake): State<Fake>,
    UrlPath(host): UrlPath<String>,
    headers: HeaderMap,
    Json(facts): Json<HostFacts>,
) -> Response {
    if let Err(status) = authorized(&host, &headers) {
        return status.into_response();
    }
    fake.update(|s| {
        s.facts_puts.push(facts);
        if s.refuse_facts {
            let body = serde_json::json!({"error": {"code": "invalid", "message": "bad facts",
                "details": [{"field": "sections.fake", "reason": "refused by the test"}]}});
            (StatusCode::BAD_REQUEST, Json(body)).into_response()
        } else {
            StatusCode::NO_CONTENT.into_response()
        }
    })
}

async fn assignments(
    State(fake): State<Fake>,
    UrlPath(host): UrlPath<String>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(status) = authorized(&host, &headers) {
        return status.into_response();
    }
    let index: u64 = q["index"].parse().unwrap();
    let wait = humantime::parse_duration(&q["wait"]).unwrap();
    let mut rx = fake.generation.subscribe();
    let newer = async {
        loop {
            let a = fake.state.lock().unwrap().assignments.clone();
            if a.index > index {
                return a;
            }
            rx.changed().await.unwrap();
        }
    };
    let a = match tokio::time::timeout(wait, newer).await {
        Ok(a) => a,
        Err(_) => fake.state.lock().unwrap().assignments.clone(),
    };
    Json(a).into_response()
}

async fn events(
    State(fake): State<Fake>,
    UrlPath(host): UrlPath<String>,
    headers: HeaderMap,
    Json(evs): Json<Vec<WorkerEvent>>,
) -> Response {
    if let Err(status) = authorized(&host, &headers) {
        return status.into_response();
    }
    fake.update(|s| s.events.extend(evs));
    StatusCode::NO_CONTENT.into_response()
}

// === fake plugins ===

/// Puts `XCE_TEST_PORT` and a marker into the environment and declares socket `http`,
/// from the `fake` grant (`{"port": N}`); refuses when the grant says `"refuse": true`.
struct FakeHook;

#[async_trait]
impl LaunchHook for FakeHook {
    fn name(&self) -> &'static str {
        "fake"
    }

    async fn prepare(
        &self,
        cx: &LaunchContext,
        plan: &mut LaunchPlan,
    ) -> Result<(), LaunchRefusal> {
        let grant = &cx.grants["fake"].to_value();
        if grant["refuse"] == serde_json::json!(true) {
            return Err(LaunchRefusal {
                plugin: "fake".into(),
                reason: "refused by the test".into(),
                detail: grant.clone(),
            });
        }
        let port = grant["port"].as_u64().unwrap();
        let ip = cx.host_ip.unwrap();
        plan.env.insert("XCE_TEST_PORT".into(), port.to_string());
        plan.env
            .insert("XCE_TEST_MARK".into(), format!("{}@{}", cx.job, cx.host));
        plan.sockets
            .insert("http".into(), SocketAddr::new(ip, port as u16));
        Ok(())
    }
}

use std::net::SocketAddr;

/// Reports `ip_addr = 127.0.0.1` and `sections.fake = <value>`; counts its calls.
struct FakeFacts {
    value: Mutex<serde_json::Value>,
    calls: watch::Sender<u64>,
    fail: bool,
}

#[async_trait]
impl HostFactsProvider for FakeFacts {
    fn name(&self) -> &'static str {
        "fake"
    }

    async fn collect(&self, facts: &mut HostFacts) -> Result<(), FactsError> {
        self.calls.send_modify(|c| *c += 1);
        if self.fail {
            return Err(FactsError::new("fake", "no interfaces found"));
        }
        facts.ip_addr = Some("127.0.0.1".parse().unwrap());
        facts
            .sections
            .insert("fake".into(), self.value.lock().unwrap().clone());
        Ok(())
    }
}

impl FakeFacts {
    fn new(fail: bool) -> Arc<Self> {
        Arc::new(Self {
            value: Mutex::new(serde_json::json!(1)),
            calls: watch::Sender::new(0),
            fail,
        })
    }

    /// Waits until `n` more collections than now happened.
    async fn wait_calls(&self, n: u64) {
        let mut rx = self.calls.subscribe();
        let target = *rx.borrow() + n;
        tokio::time::timeout(patience(), rx.wait_for(|c| *c >= target))
            .await
            .expect("facts re-read in time")
            .unwrap();
    }
}

// === harness ===

struct Worker {
    stop: oneshot::Sender<ShutdownMode>,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Worker {
    fn start(cfg: WorkerConfig, facts: Arc<FakeFacts>) -> Self {
        let plugins = WorkerPlugins {
            facts: vec![facts],
            hooks: vec![Arc::new(FakeHook)],
        };
        let (stop, rx) = oneshot::channel();
        let handle = tokio::spawn(run(cfg, plugins, async move {
            rx.await.unwrap_or(ShutdownMode::Detach)
        }));
        Self { stop, handle }
    }

    async fn shutdown(self, mode: ShutdownMode) {
        self.stop.send(mode).unwrap();
        self.handle.await.unwrap().unwrap();
    }
}

/// Kills the replicas a test started (if they are still the same processes), whatever
/// way the test ends.
#[derive(Default)]
struct Reaper(Mutex<Vec<(u32, u64)>>);

impl Reaper {
    fn watch(&self, pid: u32) {
        if let Ok(Some(stat)) = procfs::read_stat(pid) {
            self.0.lock().unwrap().push((pid, stat.start_time));
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for &(pid, start) in self.0.lock().unwrap().iter() {
            if procfs::is_same_and_live(pid, start) {
                let _ = sys::kill_group(pid, sys::Signal::Kill);
            }
        }
    }
}

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "xce_worker=debug".into()),
        )
        .try_init();
}

fn config(base: &str, dir: &std::path::Path) -> WorkerConfig {
    WorkerConfig {
        stop_timeout: Duration::from_secs(5),
        facts_interval: Duration::from_secs(3600),
        // Orphans are stopped soon: the tests that check their drain set it long.
        orphan_drain: Duration::from_millis(100),
        ..WorkerConfig::new(HOST, base, TOKEN, dir)
    }
}

fn assignment(
    job: &str,
    command: Vec<String>,
    readiness: Option<Readiness>,
    grant: serde_json::Value,
    desired: Desired,
) -> Assignment {
    Assignment {
        job: job.into(),
        service: "web".into(),
        project: "default".into(),
        replica: 0,
        command: command.into(),
        readiness: readiness.map(Into::into),
        env: Default::default(),
        grants: plugin_api::Grants::from([("fake", grant.into())]),
        desired,
    }
}

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

/// A python HTTP server on `$XCE_TEST_PORT` that first prints the marker.
fn http_server(dir: &std::path::Path) -> Vec<String> {
    sh(&format!(
        "echo \"mark=$XCE_TEST_MARK\"; exec python3 -m http.server \"$XCE_TEST_PORT\" --bind 127.0.0.1 --directory '{}'",
        dir.display()
    ))
}

fn http_probe() -> Option<Readiness> {
    Some(Readiness {
        probe: Probe::Http {
            socket: "http".into(),
            path: "/".into(),
        },
        interval: Duration::from_millis(100),
        timeout: Duration::from_secs(1),
        failure_threshold: 1,
        success_threshold: 1,
    })
}

fn started_pid(fake: &Fake, job: &str) -> u32 {
    fake.events_of(job)
        .iter()
        .find_map(|e| match e {
            WorkerEvent::Started { pid, .. } => Some(*pid),
            _ => None,
        })
        .expect("a Started event")
}

/// `(started, ready=true, ready=false, exited, refused)` counts of a job's events; the
/// readiness ones are transitions (a failing probe's new text repeats `ready: false`).
fn counts(fake: &Fake, job: &str) -> (usize, usize, usize, usize, usize) {
    let evs = fake.events_of(job);
    let n = |f: &dyn Fn(&WorkerEvent) -> bool| evs.iter().filter(|e| f(e)).count();
    let mut last = false;
    let mut downs = 0;
    for e in &evs {
        if let WorkerEvent::Readiness { ready, .. } = e {
            downs += usize::from(last && !*ready);
            last = *ready;
        }
    }
    (
        n(&|e| matches!(e, WorkerEvent::Started { .. })),
        n(&|e| matches!(e, WorkerEvent::Readiness { ready: true, .. })),
        downs,
        n(&|e| matches!(e, WorkerEvent::Exited { .. })),
        n(&|e| matches!(e, WorkerEvent::Refused { .. })),
    )
}

fn has(fake: &Fake, job: &str, pred: impl Fn(&WorkerEvent) -> bool) -> impl Fn(&FakeState) -> bool {
    let job = job.to_owned();
    let _ = fake;
    move |s: &FakeState| s.events.iter().any(|e| event_job(e) == job && pred(e))
}

/// Polls a file until `pred` holds of its content (the one thing that has no change
/// notification here), within the test bound.
async fn wait_file(path: &std::path::Path, what: &str, pred: impl Fn(&str) -> bool) {
    let wait = async {
        loop {
            if pred(&std::fs::read_to_string(path).unwrap_or_default()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    if tokio::time::timeout(patience(), wait).await.is_err() {
        panic!("timed out waiting for {what} in {}", path.display());
    }
}

async fn bounded<T>(test: impl std::future::Future<Output = T>) -> T {
    init_logs();
    // Every test ends within this, whatever happens: longer than any one wait inside it.
    tokio::time::timeout(patience() + Duration::from_secs(15), test)
        .await
        .expect("test finished within its bound")
}

// === tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launches_with_the_hook_env_reports_ready_once_and_the_exit() {
    let reaper = Reaper::default();
    bounded(async {
        let fake = Fake::new();
        let base = fake.serve().await;
        let dir = tempfile::tempdir().unwrap();
        let worker = Worker::start(config(&base, dir.path()), FakeFacts::new(false));
        fake.wait_until("registration", |s| s.registers.len() == 1)
            .await;
        assert_eq!(fake.state.lock().unwrap().registers[0].running, vec![]);

        let port = free_port();
        fake.set_jobs(vec![assignment(
            "j-1",
            http_server(dir.path()),
            http_probe(),
            serde_json::json!({"port": port}),
            Desired::Run,
        )]);
        fake.wait_until(
            "ready",
            has(&fake, "j-1", |e| {
                matches!(e, WorkerEvent::Readiness { ready: true, .. })
            }),
        )
        .await;
        let pid = started_pid(&fake, "j-1");
        reaper.watch(pid);
        let log = std::fs::read_to_string(dir.path().join("logs/j-1.log")).unwrap();
        assert!(log.contains("mark=j-1@exec-01"), "{log}");
        let saved = state::load(&dir.path().join("jobs.json")).unwrap();
        assert_eq!((saved[0].pid, saved[0].ready), (pid, true));

        sys::kill_group(pid, sys::Signal::Kill).unwrap();
        fake.wait_until(
            "exit",
            has(&fake, "j-1", |e| matches!(e, WorkerEvent::Exited { .. })),
        )
        .await;
        let evs = fake.events_of("j-1");
        let log = std::fs::canonicalize(dir.path().join("logs/j-1.log")).unwrap();
        assert_eq!(
            evs.last(),
            Some(&WorkerEvent::Exited {
                job: "j-1".into(),
                code: None,
                signal: Some(9),
                error: None,
                log: Some(log.display().to_string()),
                worker_stopped: false,
            })
        );
        let (started, up, _down, exited, _) = counts(&fake, "j-1");
        assert_eq!((started, up, exited), (1, 1, 1), "{evs:?}");
        worker.shutdown(ShutdownMode::Detach).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stops_asked_and_orphaned_jobs_escalating_to_sigkill() {
    let reaper = Reaper::default();
    bounded(async {
        let fake = Fake::new();
        let base = fake.serve().await;
        let dir = tempfile::tempdir().unwrap();
        let cfg = WorkerConfig {
            stop_timeout: Duration::from_millis(300),
            ..config(&base, dir.path())
        };
        let worker = Worker::start(cfg, FakeFacts::new(false));
        let grant = serde_json::json!({"port": 1});
        // j-2 ignores SIGTERM (an ignored signal stays ignored across exec): only the
        // SIGKILL after the grace ends it.
        let stubborn = assignment(
            "j-2",
            sh("trap '' TERM; exec sleep 1000"),
            None,
            grant.clone(),
            Desired::Run,
        );
        let plain = assignment(
            "j-3",
            vec!["sleep".into(), "1000".into()],
            None,
            grant.clone(),
            Desired::Run,
        );
        fake.set_jobs(vec![stubborn.clone(), plain]);
        for job in ["j-2", "j-3"] {
            // No probe configured: ready as soon as it runs.
            fake.wait_until(
                "ready",
                has(&fake, job, |e| {
                    matches!(e, WorkerEvent::Readiness { ready: true, .. })
                }),
            )
            .await;
            reaper.watch(started_pid(&fake, job));
        }
        let pids = (started_pid(&fake, "j-2"), started_pid(&fake, "j-3"));

        // j-2 asked to stop; j-3 no longer listed (an orphan).
        fake.set_jobs(vec![Assignment {
            desired: Desired::Stop,
            ..stubborn
        }]);
        for job in ["j-2", "j-3"] {
            fake.wait_until(
                "exit",
                has(&fake, job, |e| {
                    matches!(e, WorkerEvent::Exited { code: None, .. })
                }),
            )
            .await;
            assert_eq!(
                counts(&fake, job),
                (1, 1, 0, 1, 0),
                "{:?}",
                fake.events_of(job)
            );
        }
        assert!(procfs::read_stat(pids.0)
            .unwrap()
            .is_none_or(|s| !s.is_live()));
        assert!(procfs::read_stat(pids.1)
            .unwrap()
            .is_none_or(|s| !s.is_live()));
        worker.shutdown(ShutdownMode::Detach).await;
    })
    .await;
}

/// A replica the controller stops listing (its restored store does not know it) is in
/// no endpoint: it keeps running for `orphan_drain` before its SIGTERM, so clients that
/// still hold an older list finish with it, not with a refused connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_is_drained_before_it_is_stopped() {
    let reaper = Reaper::default();
    bounded(async {
        let fake = Fake::new();
        let base = fake.serve().await;
        let dir = tempfile::tempdir().unwrap();
        let cfg = WorkerConfig {
            orphan_drain: Duration::from_secs(3600),
            ..config(&base, dir.path())
        };
        let worker = Worker::start(cfg, FakeFacts::new(false));
        let run = |job: &str, desired| {
            let sleep = vec!["sleep".into(), "1000".into()];
            assignment(job, sleep, None, serde_json::json!({"port": 1}), desired)
        };
        fake.set_jobs(vec![run("j-1", Desired::Run)]);
        fake.wait_until(
            "j-1 started",
            has(&fake, "j-1", |e| matches!(e, WorkerEvent::Started { .. })),
        )
        .await;
        let pid = started_pid(&fake, "j-1");
        reaper.watch(pid);
        // j-1 is no longer listed; two later changes of the set are handled after it.
        fake.set_jobs(vec![run("j-2", Desired::Run)]);
        fake.wait_until(
            "j-2 started",
            has(&fake, "j-2", |e| matches!(e, WorkerEvent::Started { .. })),
        )
        .await;
        reaper.watch(started_pid(&fake, "j-2"));
        fake.set_jobs(vec![run("j-2", Desired::Run), run("j-3", Desired::Stop)]);
        fake.wait_until(
            "j-3 reported gone",
            has(&fake, "j-3", |e| matches!(e, WorkerEvent::Exited { .. })),
        )
        .await;
        assert_eq!(
            counts(&fake, "j-1"),
            (1, 1, 0, 0, 0),
            "{:?}",
            fake.events_of("j-1")
        );
        assert!(
            procfs::read_stat(pid).unwrap().is_some_and(|s| s.is_live()),
            "the orphan drains, it was not stopped"
        );
        worker.shutdown(ShutdownMode::Detach).await;
    })
    .await;
}

/// A job id runs at most once. When the controller lists a job again whose end it was
/// told and acknowledged (its store went back to a backup), the worker does not start
/// it and does not stay silent either: it reports the end again, saying why, so the
/// controller replaces the job instead of waiting for it forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_listed_again_after_its_acknowledged_end_is_reported_again() {
    bounded(async {
        let fake = Fake::new();
        let base = fake.serve().await;
        let dir = tempfile::tempdir().unwrap();
        let worker = Worker::start(config(&base, dir.path()), FakeFacts::new(false));
        let once = assignment(
            "j-1",
            vec!["true".into()],
            None,
            serde_json::json!({"port": 1}),
            Desired::Run,
        );
        fake.set_jobs(vec![once.clone()]);
        fake.wait_until(
            "j-1 exited",
            has(&fake, "j-1", |e| matches!(e, WorkerEvent::Exited { .. })),
        )
        .await;
        // Acknowledged: the worker keeps no exit record of it on disk any more.
        wait_file(
            &dir.path().join("jobs.json"),
            "the exit acknowledged",
            |t| !t.contains("j-1"),
        )
        .await;
        let gone = assignment(
            "j-2",
            vec!["true".into()],
            None,
            serde_json::json!({}),
            Desired::Stop,
        );
        fake.set_jobs(vec![once.clone(), gone.clone()]);
        let twice = |s: &FakeState| {
            s.events
                .iter()
                .filter(|e| matches!(e, WorkerEvent::Exited { job, .. } if job == "j-1"))
                .count()
                == 2
        };
        fake.wait_until("j-1's end reported again", twice).await;
        // Once: another change of the set repeats nothing.
        fake.set_jobs(vec![
            once,
            gone,
            assignment(
                "j-3",
                vec!["true".into()],
                None,
                serde_json::json!({}),
                Desired::Stop,
            ),
        ]);
        fake.wait_until(
            "j-3 reported gone",
            has(&fake, "j-3", |e| matches!(e, WorkerEvent::Exited { .. })),
        )
        .await;
        let evs = fake.events_of("j-1");
        assert_eq!(
            counts(&fake, "j-1"),
            (1, 1, 0, 2, 0),
            "started once, ended twice: {evs:?}"
        );
        let WorkerEvent::Exited { error, .. } = evs.last().unwrap() else {
            panic!("{evs:?}")
        };
        let why = error.as_deref().unwrap_or_default();
        assert!(
            why.contains("j-1 already ran and ended on this worker"),
            "{why}"
        );
        worker.shutdown(ShutdownMode::Detach).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_readiness_refusals_unknown_stops_and_bad_commands() {
    bounded(async {
        let fake = Fake::new();
        let base = fake.serve().await;
        let dir = tempfile::tempdir().unwrap();
        let worker = Worker::start(config(&base, dir.path()), FakeFacts::new(false));
        let refused = assignment("j-4", vec!["true".into()], None, serde_json::json!({"refuse": true}), Desired::Run);
        let unknown = assignment("j-5", vec!["true".into()], None, serde_json::json!({}), Desired::Stop);
        let missing = assignment("j-6", vec!["/nonexistent/xce-test".into()], None, serde_json::json!({"port": 1}), Desired::Run);
        fake.set_jobs(vec![refused.clone(), unknown, missing]);
        fake.wait_until("three reports", |s| s.events.len() >= 3).await;
        // A change of the set makes the worker reconcile again: the refusal is not
        // repeated. j-5 and j-6 leave the list here: whether a listed-again end is
        // reported again depends on whether its acknowledgement arrived before this
        // change (an unacknowledged end is the answer on its way), a race this test
        // must not depend on; `a_job_listed_again_after_its_acknowledged_end_is_reported_again`
        // covers it by waiting for the acknowledgement.
        // j-7 listens on TCP (without ever accepting: the backlog answers the probe);
        // j-8's probe names a socket its launch plan does not have: never ready.
        let port = free_port();
        let listener = vec![
            "python3".into(),
            "-c".into(),
            "import os, socket, time\n\
             s = socket.socket()\n\
             s.bind(('127.0.0.1', int(os.environ['XCE_TEST_PORT'])))\n\
             s.listen()\n\
             time.sleep(1000)"
                .into(),
        ];
        let tcp = |socket: &str| {
            Some(Readiness {
                probe: Probe::Tcp {
                    socket: socket.into(),
                },
                interval: Duration::from_millis(50),
                timeout: Duration::from_secs(1),
                failure_threshold: 1,
                success_threshold: 1,
            })
        };
        let grant = serde_json::json!({"port": port});
        let tcp_job = assignment("j-7", listener, tcp("http"), grant.clone(), Desired::Run);
        let never = assignment("j-8", sh("exec sleep 1000"), tcp("metrics"), grant, Desired::Run);
        fake.set_jobs(vec![refused, tcp_job, never]);
        let ready = |e: &WorkerEvent| matches!(e, WorkerEvent::Readiness { ready: true, .. });
        fake.wait_until("j-7 ready", has(&fake, "j-7", ready)).await;
        fake.wait_until("j-8 started", has(&fake, "j-8", |e| matches!(e, WorkerEvent::Started { .. })))
            .await;
        let reaper = Reaper::default();
        reaper.watch(started_pid(&fake, "j-7"));
        reaper.watch(started_pid(&fake, "j-8"));
        let evs: Vec<_> = fake.state.lock().unwrap().events.iter().map(|e| serde_json::to_string(e).unwrap()).collect();
        let evs: Vec<_> = evs.iter().filter(|e| !e.contains("j-7") && !e.contains("j-8")).cloned().collect();
        let logs = std::fs::canonicalize(dir.path().join("logs")).unwrap();
        expect_test::expect![[r#"
            {"event":"refused","job":"j-4","refusal":{"plugin":"fake","reason":"refused by the test","detail":{"refuse":true}}}
            {"event":"exited","job":"j-6","code":127,"error":"cannot start \"/nonexistent/xce-test\": No such file or directory (os error 2)","log":"$LOGS/j-6.log"}
            {"event":"exited","job":"j-5","code":null}"#]]
        .assert_eq(&evs.join("\n").replace(&logs.display().to_string(), "$LOGS"));
        worker.shutdown(ShutdownMode::StopReplicas).await;
        assert_eq!(counts(&fake, "j-7"), (1, 1, 0, 1, 0));
        assert_eq!(counts(&fake, "j-8"), (1, 0, 0, 1, 0));
        // The shutdown stopped them: the controller must not take it for their own end.
        for job in ["j-7", "j-8"] {
            let by_worker = |e: &WorkerEvent| {
                matches!(e, WorkerEvent::Exited { worker_stopped: true, .. })
            };
            assert!(fake.events_of(job).iter().any(by_worker), "{job}: {:?}", fake.events_of(job));
        }
    })
    .await;
}

/// Each way a replica ends is reported as precisely as the worker knows it: the exit
/// code, the signal (one the replica sent itself, and a SIGKILL from outside), or why it
/// could not be started (with argv[0] and the OS error) — each with the absolute path of
/// its log file, which holds the replica's output (or the worker's line saying why there
/// is none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_report_the_code_the_signal_or_the_start_error_and_the_log() {
    let reaper = Reaper::default();
    bounded(async {
        let fake = Fake::new();
        let base = fake.serve().await;
        let dir = tempfile::tempdir().unwrap();
        let worker = Worker::start(config(&base, dir.path()), FakeFacts::new(false));
        // A file that exists but may not be executed: 126, as from a shell.
        let not_exec = dir.path().join("not-executable");
        std::fs::write(&not_exec, "#!/bin/sh\n").unwrap();
        let grant = serde_json::json!({"port": 1});
        let job = |id: &str, argv: Vec<String>| {
            assignment(id, argv, None, grant.clone(), Desired::Run)
        };
        fake.set_jobs(vec![
            job("j-1", sh("echo out-of-j-1; echo err-of-j-1 >&2; exit 3")),
            job("j-2", sh("echo out-of-j-2; kill -USR1 $$; sleep 1000")),
            job("j-3", vec!["sleep".into(), "1000".into()]),
            job("j-4", vec!["no-such-binary-xyz".into(), "--flag".into()]),
            job("j-5", vec![not_exec.display().to_string()]),
        ]);
        fake.wait_until("j-3 started", has(&fake, "j-3", |e| matches!(e, WorkerEvent::Started { .. })))
            .await;
        let pid = started_pid(&fake, "j-3");
        reaper.watch(pid);
        sys::kill_group(pid, sys::Signal::Kill).unwrap();
        fake.wait_until("every exit", |s| {
            s.events.iter().filter(|e| matches!(e, WorkerEvent::Exited { .. })).count() == 5
        })
        .await;
        let logs = std::fs::canonicalize(dir.path().join("logs")).unwrap();
        let logs = logs.display().to_string();
        let mut lines: Vec<String> = fake
            .state
            .lock()
            .unwrap()
            .events
            .iter()
            .filter(|e| matches!(e, WorkerEvent::Exited { .. } | WorkerEvent::Started { .. }))
            .map(|e| {
                let mut v = serde_json::to_value(e).unwrap();
                if let Some(pid) = v.get_mut("pid") {
                    *pid = serde_json::json!("$PID");
                }
                v.to_string()
            })
            .collect();
        lines.sort();
        let not_exec = not_exec.display().to_string();
        expect_test::expect![[r#"
            {"code":126,"error":"cannot start \"$NOT_EXEC\": Permission denied (os error 13)","event":"exited","job":"j-5","log":"$LOGS/j-5.log"}
            {"code":127,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","event":"exited","job":"j-4","log":"$LOGS/j-4.log"}
            {"code":3,"event":"exited","job":"j-1","log":"$LOGS/j-1.log"}
            {"code":null,"event":"exited","job":"j-2","log":"$LOGS/j-2.log","signal":10}
            {"code":null,"event":"exited","job":"j-3","log":"$LOGS/j-3.log","signal":9}
            {"event":"started","job":"j-1","log":"$LOGS/j-1.log","pid":"$PID"}
            {"event":"started","job":"j-2","log":"$LOGS/j-2.log","pid":"$PID"}
            {"event":"started","job":"j-3","log":"$LOGS/j-3.log","pid":"$PID"}"#]]
        .assert_eq(&lines.join("\n").replace(&logs, "$LOGS").replace(&not_exec, "$NOT_EXEC"));
        // The paths reported are absolute and hold what the replicas wrote.
        let read = |job: &str| std::fs::read_to_string(format!("{logs}/{job}.log")).unwrap();
        assert!(logs.starts_with('/'), "{logs}");
        assert_eq!(read("j-1"), "out-of-j-1\nerr-of-j-1\n");
        assert_eq!(read("j-2"), "out-of-j-2\n");
        assert_eq!(
            read("j-4"),
            "xced worker: cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)\n"
        );
        worker.shutdown(ShutdownMode::Detach).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_readopts_its_replica() {
    let reaper = Reaper::default();
    bounded(async {
        let fake = Fake::new();
        let base = fake.serve().await;
        let dir = tempfile::tempdir().unwrap();
        let facts = FakeFacts::new(false);
        let worker = Worker::start(config(&base, dir.path()), facts.clone());
        let port = free_port();
        fake.set_jobs(vec![assignment(
            "j-1",
            http_server(dir.path()),
            http_probe(),
            serde_json::json!({"port": port}),
            Desired::Run,
        )]);
        fake.wait_until(
            "ready",
            has(&fake, "j-1", |e| {
                matches!(e, WorkerEvent::Readiness { ready: true, .. })
            }),
        )
        .await;
        let pid = started_pid(&fake, "j-1");
        reaper.watch(pid);
        worker.shutdown(ShutdownMode::Detach).await;
        let start = procfs::read_stat(pid).unwrap().unwrap();
        assert!(start.is_live(), "a detached replica keeps running");

        let log = dir.path().join("logs/j-1.log");
        let probes_before = std::fs::read_to_string(&log)
            .unwrap()
            .matches("\"GET / ")
            .count();
        let worker = Worker::start(config(&base, dir.path()), facts);
        fake.wait_until("re-registration", |s| s.registers.len() == 2)
            .await;
        assert_eq!(
            fake.state.lock().unwrap().registers[1].running,
            vec![RunningJob {
                job: "j-1".into(),
                pid,
                ready: true
            }]
        );
        // The adopted replica is probed again (and, still ready, reports nothing).
        wait_file(&log, "new probes", |t| {
            t.matches("\"GET / ").count() > probes_before + 2
        })
        .await;

        // The controller no longer lists it: the adopted replica is stopped as an orphan.
        fake.set_jobs(vec![]);
        fake.wait_until(
            "exit",
            has(&fake, "j-1", |e| matches!(e, WorkerEvent::Exited { .. })),
        )
        .await;
        let (started, up, _down, exited, _) = counts(&fake, "j-1");
        assert_eq!(
            (started, up, exited),
            (1, 1, 1),
            "{:?}",
            fake.events_of("j-1")
        );
        assert!(!procfs::is_same_and_live(pid, start.start_time));
        worker.shutdown(ShutdownMode::Detach).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_through_outages_and_again_when_forgotten() {
    let reaper = Reaper::default();
    bounded(async {
        let fake = Fake::new();
        fake.update(|s| s.fail_registers = 2);
        let base = fake.serve().await;
        let dir = tempfile::tempdir().unwrap();
        let worker = Worker::start(config(&base, dir.path()), FakeFacts::new(false));
        fake.wait_until("registration", |s| s.registers.len() == 1)
            .await;
        assert_eq!(fake.state.lock().unwrap().register_attempts, 3);

        fake.set_jobs(vec![assignment(
            "j-1",
            sh("exec sleep 1000"),
            None,
            serde_json::json!({"port": 1}),
            Desired::Run,
        )]);
        fake.wait_until(
            "ready",
            has(&fake, "j-1", |e| matches!(e, WorkerEvent::Readiness { .. })),
        )
        .await;
        let pid = started_pid(&fake, "j-1");
        reaper.watch(pid);

        fake.update(|s| s.forget_host = true);
        fake.wait_until("re-registration", |s| s.registers.len() == 2)
            .await;
        assert_eq!(
            fake.state.lock().unwrap().registers[1].running,
            vec![RunningJob {
                job: "j-1".into(),
                pid,
                ready: true
            }]
        );

        // xced dev's Ctrl-C: replicas stop and their exits are reported before run ends.
        worker.shutdown(ShutdownMode::StopReplicas).await;
        assert_eq!(counts(&fake, "j-1"), (1, 1, 0, 1, 0));
        assert!(procfs::read_stat(pid).unwrap().is_none_or(|s| !s.is_live()));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn facts_are_reported_only_when_they_change() {
    bounded(async {
        let fake = Fake::new();
        let base = fake.serve().await;
        let dir = tempfile::tempdir().unwrap();
        let facts = FakeFacts::new(false);
        let cfg = WorkerConfig {
            facts_interval: Duration::from_millis(20),
            ..config(&base, dir.path())
        };
        let worker = Worker::start(cfg, facts.clone());
        fake.wait_until("registration", |s| s.registers.len() == 1)
            .await;
        facts.wait_calls(3).await;
        assert_eq!(
            fake.state.lock().unwrap().facts_puts.len(),
            0,
            "unchanged facts are not sent"
        );

        *facts.value.lock().unwrap() = serde_json::json!(2);
        fake.wait_until("a facts report", |s| s.facts_puts.len() == 1)
            .await;
        facts.wait_calls(3).await;
        fake.update(|s| s.refuse_facts = true);
        *facts.value.lock().unwrap() = serde_json::json!(3);
        fake.wait_until("a second facts report", |s| s.facts_puts.len() == 2)
            .await;
        facts.wait_calls(3).await;
        let puts: Vec<_> = fake
            .state
            .lock()
            .unwrap()
            .facts_puts
            .iter()
            .map(|f| f.sections["fake"].clone())
            .collect();
        // A refused report is not repeated while the facts stay the same.
        assert_eq!(puts, vec![serde_json::json!(2), serde_json::json!(3)]);
        worker.shutdown(ShutdownMode::Detach).await;
    })
    .await;
}

#[tokio::test]
async fn a_facts_error_at_start_fails_the_worker() {
    bounded(async {
        let dir = tempfile::tempdir().unwrap();
        let plugins = WorkerPlugins {
            facts: vec![FakeFacts::new(true)],
            hooks: vec![],
        };
        let err = run(
            config("http://127.0.0.1:9", dir.path()),
            plugins,
            std::future::pending(),
        )
        .await
        .unwrap_err();
        expect_test::expect!["collecting host facts: fake: no interfaces found"]
            .assert_eq(&format!("{err:#}"));
    })
    .await;
}

#[tokio::test]
async fn a_data_dir_serves_one_worker_at_a_time() {
    bounded(async {
        let fake = Fake::new();
        let base = fake.serve().await;
        let dir = tempfile::tempdir().unwrap();
        let worker = Worker::start(config(&base, dir.path()), FakeFacts::new(false));
        fake.wait_until("registration", |s| s.registers.len() == 1)
            .await;
        let plugins = WorkerPlugins {
            facts: vec![FakeFacts::new(false)],
            hooks: vec![],
        };
        let err = run(config(&base, dir.path()), plugins, std::future::pending())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("is in use by another worker"), "{err}");
        worker.shutdown(ShutdownMode::Detach).await;
    })
    .await;
}

#[test]
fn config_debug_redacts_the_credential() {
    let cfg = WorkerConfig::new(HOST, "http://127.0.0.1:7480", "s3cret", "/var/lib/xce");
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    expect_test::expect![[r#"WorkerConfig { host: "exec-01", controller: "http://127.0.0.1:7480", credential: "<redacted>", ca_file: None, data_dir: "/var/lib/xce", stop_timeout: 10s, facts_interval: 30s, replicas: ReplicaSettings { user: None, logs: LogPolicy { max_size: 10485760, keep: 3, retain: 86400s }, log_writer: None }, orphan_drain: 5s }"#]]
        .assert_eq(&shown);
}

// === many stops at once ===

/// Counts the worker's "did not stop within the grace" warnings (and which jobs they
/// were for, from the job span) of the thread that installed it as its default
/// subscriber: the test below runs the worker on a current-thread runtime, so every
/// task of it logs on that thread.
#[derive(Clone, Default)]
struct GraceWarnings(Arc<Mutex<Vec<String>>>);

impl GraceWarnings {
    fn jobs(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// The `message` and `job` fields of an event or span.
#[derive(Default)]
struct Fields {
    message: String,
    job: String,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "job" => self.job = format!("{value:?}").trim_matches('"').to_owned(),
            _ => {}
        }
    }
}

/// A job span's `job` field, kept in the span's extensions.
struct JobOf(String);

impl<S> tracing_subscriber::Layer<S> for GraceWarnings
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        cx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        if let (false, Some(span)) = (f.job.is_empty(), cx.span(id)) {
            span.extensions_mut().insert(JobOf(f.job));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, cx: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() != tracing::Level::WARN {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        if !f.message.contains("did not stop within the grace") {
            return;
        }
        let job = cx
            .event_scope(event)
            .and_then(|mut scope| {
                scope.find_map(|s| s.extensions().get::<JobOf>().map(|j| j.0.clone()))
            })
            .unwrap_or_else(|| "?".into());
        self.0.lock().unwrap().push(job);
    }
}

/// The issue-14 report: stopping many replicas of one worker at once under heavy CPU
/// load made a quarter of them "not stop within the grace" although every one had
/// exited long before it ran out. 300 `sleep`s (which exit at once on SIGTERM) and one
/// replica that ignores SIGTERM are stopped in one assignments change while two threads
/// burn CPU: exactly one warning (the stubborn one's, which is then SIGKILLed), and every
/// other replica reported ended by its SIGTERM.
#[test]
fn stopping_many_replicas_at_once_under_load_warns_only_of_the_one_that_ignores_sigterm() {
    const N: usize = 300;
    const GRACE: Duration = Duration::from_secs(1);
    let warnings = GraceWarnings::default();
    use tracing_subscriber::layer::SubscriberExt as _;
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let reaper = Reaper::default();
    let burn = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let burners: Vec<_> = (0..2)
        .map(|_| {
            let burn = burn.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while burn.load(std::sync::atomic::Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();
    let took = rt.block_on(bounded(async {
        let fake = Fake::new();
        let base = fake.serve().await;
        let dir = tempfile::tempdir().unwrap();
        let cfg = WorkerConfig {
            stop_timeout: GRACE,
            ..config(&base, dir.path())
        };
        let worker = Worker::start(cfg, FakeFacts::new(false));
        let grant = serde_json::json!({"port": 1});
        let mut jobs: Vec<Assignment> = (0..N)
            .map(|i| {
                assignment(
                    &format!("j-{i}"),
                    vec!["sleep".into(), "1000".into()],
                    None,
                    grant.clone(),
                    Desired::Run,
                )
            })
            .collect();
        jobs.push(assignment(
            "stubborn",
            sh("trap '' TERM; exec sleep 1000"),
            None,
            grant.clone(),
            Desired::Run,
        ));
        fake.set_jobs(jobs.clone());
        fake.wait_until("every replica ready", |s| {
            s.events
                .iter()
                .filter(|e| matches!(e, WorkerEvent::Readiness { ready: true, .. }))
                .count()
                == N + 1
        })
        .await;
        for a in &jobs {
            reaper.watch(started_pid(&fake, &a.job));
        }

        burn.store(true, std::sync::atomic::Ordering::Relaxed);
        let t0 = std::time::Instant::now();
        fake.set_jobs(
            jobs.iter()
                .map(|a| Assignment {
                    desired: Desired::Stop,
                    ..a.clone()
                })
                .collect(),
        );
        let exited = |s: &FakeState| {
            s.events
                .iter()
                .filter(|e| matches!(e, WorkerEvent::Exited { .. }))
                .count()
        };
        fake.wait_until("every exit reported", |s| exited(s) == N + 1)
            .await;
        let took = t0.elapsed();
        burn.store(false, std::sync::atomic::Ordering::Relaxed);
        let signals: BTreeMap<String, Option<i32>> = fake
            .state
            .lock()
            .unwrap()
            .events
            .iter()
            .filter_map(|e| match e {
                WorkerEvent::Exited { job, signal, .. } => Some((job.clone(), *signal)),
                _ => None,
            })
            .collect();
        assert_eq!(signals.len(), N + 1, "one exit each");
        assert_eq!(
            signals["stubborn"],
            Some(9),
            "the stubborn one was SIGKILLed"
        );
        let not_term: Vec<_> = signals
            .iter()
            .filter(|(j, s)| *j != "stubborn" && **s != Some(15))
            .collect();
        assert!(
            not_term.is_empty(),
            "ended otherwise than by SIGTERM: {not_term:?}"
        );
        worker.shutdown(ShutdownMode::Detach).await;
        took
    }));
    burn.store(false, std::sync::atomic::Ordering::Relaxed);
    for b in burners {
        b.join().unwrap();
    }
    let warned = warnings.jobs();
    println!(
        "FIGURE worker stop: {} replicas stopped at once under 2 CPU burners, every exit \
         reported after {:.0} ms; 'did not stop within the grace' ({GRACE:?}): {} times ({:?}{})",
        N + 1,
        took.as_secs_f64() * 1e3,
        warned.len(),
        &warned[..warned.len().min(5)],
        if warned.len() > 5 { " ..." } else { "" }
    );
    assert_eq!(warned, vec!["stubborn".to_owned()], "false grace reports");
}
