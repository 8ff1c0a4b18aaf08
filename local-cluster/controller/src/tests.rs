//! Controller tests: the state machine on a fake clock, the router through `oneshot`
//! (no sockets), one real-socket run with a fake worker, and a restart on redb.

use super::core::{Core, Timing, Wiring};
use super::metrics::Metrics;
use super::scheduler::tests::Slots;
use super::*;
use axum::body::Body;
use expect_test::{expect, Expect};
use http::{Method, Request, StatusCode};
use plugin_api::{
    ClusterEvent, ClusterSnapshot, FieldError, Grant, HostFacts, HostId, HostState, JobId,
    LaunchRefusal, PlacementRequest, SectionInfo, Unfit,
};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use tower::ServiceExt;
use xce_proto::worker::{Assignments, Caller, ExitCause, RegisterRequest, RunningJob, WorkerEvent};
use xce_serve::auth::Tokens;
use xce_store::MemStore;

// === fakes ===

/// The slot plugin of the scheduler tests, shared so a test can look inside while the
/// controller owns it.
#[derive(Debug, Clone)]
struct SharedSlots(Arc<Mutex<Slots>>);

impl SharedSlots {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(Slots::new("slots"))))
    }
    fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap().log)
    }
    fn used(&self) -> Vec<String> {
        let s = self.0.lock().unwrap();
        s.used
            .iter()
            .map(|((h, n), j)| format!("{h}:{n}={j}"))
            .collect()
    }
}

impl ResourcePlugin for SharedSlots {
    fn name(&self) -> &'static str {
        "slots"
    }
    fn validate(&self, s: Option<&Value>) -> Result<SectionInfo, Vec<FieldError>> {
        match s {
            Some(v) if !v.is_object() => {
                Err(vec![FieldError::new("service.slots", "must be a table")])
            }
            _ => Ok(SectionInfo {
                socket_names: vec!["http".into()],
                quantities: [("slots".to_owned(), 1)].into(),
            }),
        }
    }
    fn host_up(&mut self, host: &HostId, facts: &HostFacts) -> Result<(), FieldError> {
        self.0.lock().unwrap().host_up(host, facts)
    }
    fn host_removed(&mut self, host: &HostId) {
        self.0.lock().unwrap().host_removed(host)
    }
    fn fits(&self, host: &HostId, req: &PlacementRequest<'_>) -> Result<(), Unfit> {
        self.0.lock().unwrap().fits(host, req)
    }
    fn reserve(&mut self, host: &HostId, req: &PlacementRequest<'_>) -> Result<Grant, Unfit> {
        self.0.lock().unwrap().reserve(host, req)
    }
    fn release(&mut self, host: &HostId, job: &JobId) {
        self.0.lock().unwrap().release(host, job)
    }
    fn restore(&mut self, host: &HostId, job: &JobId, grant: &Grant) -> Result<(), String> {
        self.0.lock().unwrap().restore(host, job, grant)
    }
    fn launch_refused(&mut self, host: &HostId, job: &JobId, detail: &Value) {
        self.0
            .lock()
            .unwrap()
            .log
            .push(format!("launch_refused {host} {job} {detail}"));
    }
    fn grant_summary(&self, grant: &Grant) -> Option<Value> {
        Some(json!({ "slot": grant }))
    }
    fn host_summary(&self, host: &HostId) -> Option<Value> {
        self.0.lock().unwrap().host_summary(host)
    }
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let g = prometheus_client::metrics::gauge::Gauge::<i64>::default();
        g.set(42);
        registry.register("test_slots", "A plugin's metric", g);
    }
}

/// An extension route that answers who the caller is (the `Principal` extractor must
/// work in extension handlers), and an extension metric.
#[derive(Debug)]
struct WhoAmI;

impl plugin_api::ApiExtension for WhoAmI {
    fn router(&self, _cx: plugin_api::ApiContext) -> axum::Router {
        axum::Router::new().route(
            "/v1/whoami",
            axum::routing::get(|p: Principal| async move { p.name }),
        )
    }
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let c = prometheus_client::metrics::counter::Counter::<u64>::default();
        c.inc();
        registry.register("test_ext", "An extension's metric", c);
    }
}

/// Refuses an unspecified advertised address and a missing `slots` section.
#[derive(Debug)]
struct Policy;

impl plugin_api::HostFactsPolicy for Policy {
    fn check(&self, _: &HostId, facts: &HostFacts) -> Result<(), Vec<FieldError>> {
        let mut errs = Vec::new();
        if facts.ip_addr.is_some_and(|ip| ip.is_unspecified()) {
            errs.push(FieldError::new("ip_addr", "must not be unspecified"));
        }
        if !facts.sections.contains_key("slots") {
            errs.push(FieldError::new("sections.slots", "missing"));
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs)
        }
    }
}

/// Records what listeners are told, one line each.
#[derive(Debug, Default, Clone)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl Recorder {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

impl ClusterListener for Recorder {
    fn resync(&self, s: &ClusterSnapshot) {
        let jobs: Vec<String> = s
            .jobs
            .iter()
            .map(|j| format!("{}@{}:{:?}", j.job, j.host, j.state))
            .collect();
        self.0.lock().unwrap().push(format!(
            "resync rev={} services={} jobs=[{}] hosts={}",
            s.rev,
            s.services.len(),
            jobs.join(" "),
            s.hosts.len()
        ));
    }
    fn on_event(&self, e: &ClusterEvent) {
        let line = match e {
            ClusterEvent::Service { rev, service } => {
                format!("{rev} service {} rev={}", service.name, service.rev)
            }
            ClusterEvent::ServiceRemoved { rev, name, .. } => format!("{rev} removed {name}"),
            ClusterEvent::Job { rev, job } => format!(
                "{rev} job {} {}/{} {} {:?} ready={}{}",
                job.job,
                job.service,
                job.replica,
                job.host,
                job.state,
                job.ready,
                if job.generation > 1 {
                    format!(" gen={}", job.generation)
                } else {
                    String::new()
                }
            ),
            ClusterEvent::JobEnded { rev, job, reason } => {
                format!(
                    "{rev} ended {} {}/{} {reason:?}",
                    job.job, job.service, job.replica
                )
            }
            ClusterEvent::Host {
                rev,
                host,
                services,
            } => {
                let names: Vec<&str> = services.iter().map(|k| k.name.as_str()).collect();
                format!("{rev} host {} {:?} {names:?}", host.id, host.state)
            }
        };
        self.0.lock().unwrap().push(line);
    }
}

fn facts(slots: u64) -> HostFacts {
    facts_at("127.0.0.11", slots)
}

/// The facts of host `exec-NN`: its own address, 127.0.0.(10 + NN).
fn facts_of(host: &str, slots: u64) -> HostFacts {
    let n: u8 = host.trim_start_matches("exec-").parse().unwrap_or(1);
    facts_at(&format!("127.0.0.{}", 10 + n), slots)
}

fn facts_at(ip: &str, slots: u64) -> HostFacts {
    HostFacts {
        ip_addr: Some(ip.parse().unwrap()),
        addresses: vec![plugin_api::HostAddress {
            ip: ip.parse().unwrap(),
            interface: Some("lo".into()),
        }],
        sections: [("slots".to_owned(), json!(slots))].into(),
    }
}

fn web(name: &str, project: &str, replicas: u32) -> Value {
    json!({"service": {"name": name, "project": project, "replicas": replicas, "command": ["sleep", "1000"]}})
}

fn admin() -> Principal {
    Principal {
        credential: Default::default(),
        name: "admin".into(),
        kind: PrincipalKind::User,
        grants: vec![(Permission::Admin, vec!["*".into()])],
    }
}

use plugin_api::{JobState, Permission, Principal, PrincipalKind, ServiceKey};

// === the state machine on a fake clock ===

const TIMING: Timing = Timing {
    heartbeat_interval: Duration::from_secs(1),
    unreachable_after: Duration::from_secs(3),
    grace_period: Duration::from_secs(30),
    disruption_threshold: DisruptionThreshold::DEFAULT,
};

/// Every announced event, as it was.
#[derive(Clone, Default)]
struct RawEvents(Arc<Mutex<Vec<ClusterEvent>>>);

impl RawEvents {
    fn take(&self) -> Vec<ClusterEvent> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

impl ClusterListener for RawEvents {
    fn resync(&self, _: &ClusterSnapshot) {}
    fn on_event(&self, e: &ClusterEvent) {
        self.0.lock().unwrap().push(e.clone());
    }
}

/// Drives a [`Core`] like the state task does, with a clock the test moves.
struct Sim {
    core: Core,
    now: Instant,
    rec: Recorder,
    /// Every event as it was announced (for property checks).
    raw: RawEvents,
    slots: SharedSlots,
    store: Arc<MemStore>,
    /// The core's metrics (the same gauges).
    metrics: Metrics,
    out: Vec<String>,
}

impl Sim {
    fn new() -> Self {
        Self::load(Arc::new(MemStore::new()), Instant::now())
    }

    fn load(store: Arc<MemStore>, now: Instant) -> Self {
        Self::load_with(TIMING, store, now)
    }

    fn load_with(timing: Timing, store: Arc<MemStore>, now: Instant) -> Self {
        let rec = Recorder::default();
        let raw = RawEvents::default();
        let slots = SharedSlots::new();
        let wiring = Wiring {
            resources: vec![Box::new(slots.clone())],
            policies: vec![Arc::new(Policy)],
            listeners: vec![Arc::new(rec.clone()), Arc::new(raw.clone())],
        };
        let metrics = Metrics::default();
        let core = Core::load(timing, store.clone(), wiring, metrics.clone(), now).unwrap();
        let mut sim = Sim {
            core,
            now,
            rec,
            raw,
            slots,
            store,
            metrics,
            out: Vec::new(),
        };
        sim.settle("load", Ok(()));
        sim
    }

    /// Settles and records what the step caused: its error, events, plugin calls.
    fn settle(&mut self, step: &str, r: Result<(), core::CoreError>) {
        self.core.settle(self.now);
        self.out.push(format!("> {step}"));
        if let Err(e) = r {
            self.out.push(format!("  error: {e}"));
        }
        for l in self.rec.take() {
            self.out.push(format!("  {l}"));
        }
        for l in self.slots.take_log() {
            self.out.push(format!("  plugin: {l}"));
        }
    }

    fn submit(&mut self, doc: Value) {
        let r = self.core.submit(doc, None, &admin(), self.now).map(|_| ());
        self.settle("submit", r);
    }

    fn put(&mut self, doc: Value) {
        let name = doc["service"]["name"].as_str().unwrap().to_owned();
        let r = self
            .core
            .submit(doc, Some(&name), &admin(), self.now)
            .map(|(_, a)| self.out.push(format!("  applied {a:?}")));
        self.settle(&format!("put {name}"), r);
    }

    fn rollout(&self, name: &str) -> String {
        let v = self.core.view();
        let v = v.borrow();
        let s = &v.services[&ServiceKey::new("default", name)];
        format!(
            "{name} generation={} rollout={} updated={} ready={} outdated={} reason={:?}",
            s.info.generation,
            s.rollout.state.as_str(),
            s.counts.updated,
            s.counts.ready,
            s.counts.outdated,
            s.rollout.reason.as_deref().unwrap_or("")
        )
    }

    fn delete(&mut self, name: &str) {
        let r = self
            .core
            .delete(&ServiceKey::new("default", name), false, &admin(), self.now)
            .map(|_| ());
        self.settle(&format!("delete {name}"), r);
    }

    fn register(&mut self, host: &str, slots: u64, running: &[&str]) {
        self.register_as(&worker(host), host, slots, running);
    }

    /// Registers every host with `slots` free and nothing running.
    fn register_all<H: AsRef<str>>(&mut self, hosts: &[H], slots: u64) {
        for h in hosts {
            self.register(h.as_ref(), slots, &[]);
        }
    }

    /// Each `(host, job)`: the host reports the job started, then ready.
    fn start_ready<H: AsRef<str>, J: AsRef<str>>(&mut self, placed: &[(H, J)]) {
        for (h, j) in placed {
            let j = j.as_ref();
            self.events(h.as_ref(), vec![started(j), ready(j, true)]);
        }
    }

    /// A registration by the worker instance `caller`.
    fn register_as(&mut self, caller: &Caller, host: &str, slots: u64, running: &[&str]) {
        let req = RegisterRequest {
            facts: facts_of(host, slots),
            running: running
                .iter()
                .map(|j| RunningJob {
                    job: (*j).into(),
                    pid: 1,
                    ready: true,
                })
                .collect(),
        };
        let r = self
            .core
            .register(&host.to_owned(), caller, req, self.now)
            .map(|_| ());
        let who = if *caller == worker(host) {
            String::new()
        } else {
            format!(" as {}", caller.instance_or_none())
        };
        self.settle(&format!("register {host}{who} running={running:?}"), r);
    }

    fn heartbeat(&mut self, host: &str) {
        let r = self
            .core
            .heartbeat(&host.to_owned(), &worker(host), self.now);
        self.settle(&format!("heartbeat {host}"), r);
    }

    fn events(&mut self, host: &str, events: Vec<WorkerEvent>) {
        let what = format!("events {host} {}", serde_json::to_string(&events).unwrap());
        let r = self
            .core
            .events(&host.to_owned(), &worker(host), events, self.now);
        self.settle(&what, r);
    }

    /// Lets `secs` seconds pass one by one, the listed hosts heartbeating each second
    /// and due timers firing, like the state task.
    fn run_for(&mut self, secs: u64, heartbeating: &[&str]) {
        for _ in 0..secs {
            self.now += Duration::from_secs(1);
            for h in heartbeating {
                self.core
                    .heartbeat(&(*h).to_owned(), &worker(h), self.now)
                    .unwrap();
                self.core.settle(self.now);
            }
            self.core.tick(self.now, Some(self.now));
            self.core.mark_dirty();
            self.core.settle(self.now);
        }
        self.settle(
            &format!("{secs}s pass, heartbeats from {heartbeating:?}"),
            Ok(()),
        );
    }

    /// A controller restart `secs` later on the same store; the log goes on.
    fn restart(mut self, secs: u64) -> Sim {
        // What was acknowledged is what a reload finds: the services' revs too (a job
        // write keeps its service's newest rev in the job's record only).
        let stored = xce_model::Cluster::load(&*self.store).unwrap();
        let stored: Vec<(&ServiceKey, u64)> = stored
            .services
            .iter()
            .map(|(k, s)| (k, s.info.rev))
            .collect();
        let view = self.core.view().borrow().clone();
        let live: Vec<(&ServiceKey, u64)> =
            view.services.iter().map(|(k, s)| (k, s.info.rev)).collect();
        assert_eq!(stored, live, "the services' revs a reload finds");
        let out = std::mem::take(&mut self.out);
        let (store, now) = (self.store.clone(), self.now + Duration::from_secs(secs));
        drop(self);
        let mut s = Sim::load(store, now);
        s.out.splice(0..0, out);
        s
    }

    fn assignments(&mut self, host: &str) -> String {
        let a: Assignments = self
            .core
            .assignments(&host.to_owned(), &worker(host))
            .unwrap()
            .borrow()
            .to_wire();
        let jobs: Vec<String> = a
            .jobs
            .iter()
            .map(|j| format!("{}:{:?}", j.job, j.desired))
            .collect();
        format!("{host} index={} [{}]", a.index, jobs.join(" "))
    }

    fn note(&mut self, s: String) {
        self.out.push(format!("  = {s}"));
    }

    fn check(&self, expect: Expect) {
        expect.assert_eq(&self.out.join("\n"));
    }
}

/// The one worker instance of `host` the simulations use, of no cluster yet.
fn worker(host: &str) -> Caller {
    Caller {
        instance: Some(format!("i-{host}")),
        ..Caller::default()
    }
}

fn started(job: &str) -> WorkerEvent {
    WorkerEvent::Started {
        job: job.into(),
        pid: 7,
        log: None,
    }
}
fn ready(job: &str, ready: bool) -> WorkerEvent {
    WorkerEvent::Readiness {
        job: job.into(),
        ready,
    }
}
fn exited(job: &str) -> WorkerEvent {
    WorkerEvent::exited(job.into(), xce_proto::worker::ExitCause::code(1), None)
}

#[test]
fn lifecycle_readiness_stop_and_release() {
    let mut s = Sim::new();
    s.register("exec-01", 2, &[]);
    s.submit(web("web", "default", 1));
    s.events(
        "exec-01",
        vec![started("j-1"), ready("j-1", true), ready("j-1", true)],
    );
    // Repeats are idempotent.
    s.events("exec-01", vec![started("j-1")]);
    s.delete("web");
    let a = s.assignments("exec-01");
    s.note(a);
    s.events("exec-01", vec![exited("j-1"), exited("j-1")]);
    let a = s.assignments("exec-01");
    s.note(a);
    s.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > submit
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true},{"event":"readiness","job":"j-1","ready":true}]
          4 job j-1 web/0 exec-01 Running ready=false
          5 job j-1 web/0 exec-01 Running ready=true
          6 service web rev=6
        > events exec-01 [{"event":"started","job":"j-1","pid":7}]
        > delete web
          7 service web rev=7
          8 job j-1 web/0 exec-01 Draining ready=false
          = exec-01 index=3 [j-1:Run]
        > events exec-01 [{"event":"exited","job":"j-1","code":1},{"event":"exited","job":"j-1","code":1}]
          9 ended j-1 web/0 Stopped
          10 removed web
          plugin: release exec-01 j-1
          = exec-01 index=10 []"#]],
    );
}

fn versioned(replicas: u32, command: &str) -> Value {
    json!({"service": {"name": "web", "replicas": replicas, "command": ["sh", "-c", command],
                       "drain": "2s", "update": {"max_surge": 1, "max_unavailable": 0}}})
}

/// The readers' rollout counts follow `min_ready` with time alone: a ready replica of the
/// current generation counts as available once it has been ready that long, with no event
/// (the service's part is patched then; every publish is compared with a full rebuild).
#[test]
fn a_replica_counts_as_available_once_ready_for_min_ready() {
    let mut sim = Sim::new();
    sim.register("exec-01", 10, &[]);
    let mut doc = versioned(2, "v1");
    doc["service"]["update"]["min_ready"] = json!("3s");
    sim.put(doc);
    let counts = |sim: &Sim| {
        let v = sim.core.view();
        let v = v.borrow();
        let s = &v.services[&ServiceKey::new("default", "web")];
        (s.counts.ready, s.counts.available)
    };
    assert_eq!(counts(&sim), (0, 0));
    sim.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
    sim.run_for(1, &["exec-01"]);
    sim.events("exec-01", vec![started("j-2"), ready("j-2", true)]);
    assert_eq!(counts(&sim), (2, 0), "ready, not for min_ready yet");
    sim.run_for(2, &["exec-01"]);
    assert_eq!(counts(&sim), (2, 1), "j-1 ready for 3s, j-2 for 2s");
    sim.run_for(1, &["exec-01"]);
    assert_eq!(counts(&sim), (2, 2), "both ready for 3s");
    sim.events("exec-01", vec![ready("j-1", false)]);
    assert_eq!(counts(&sim), (1, 1), "j-1 no longer ready");
    sim.events("exec-01", vec![ready("j-1", true)]);
    assert_eq!(counts(&sim), (2, 1), "j-1 waits for min_ready again");
}

#[test]
fn a_rolling_update_drains_before_stop_and_a_broken_one_is_rolled_back() {
    let mut sim = Sim::new();
    sim.register("exec-01", 10, &[]);
    sim.put(versioned(2, "v1"));
    sim.events(
        "exec-01",
        vec![
            started("j-1"),
            ready("j-1", true),
            started("j-2"),
            ready("j-2", true),
        ],
    );
    let s = sim.rollout("web");
    sim.note(s);
    // v2: one surge replica; the old one of its slot drains only once it is ready.
    sim.put(versioned(2, "v2"));
    sim.events("exec-01", vec![started("j-3")]);
    let s = sim.rollout("web");
    sim.note(s);
    sim.events("exec-01", vec![ready("j-3", true)]);
    let a = sim.assignments("exec-01");
    sim.note(a);
    // The drain (2s) ends: only now is j-1 told to stop.
    sim.run_for(2, &["exec-01"]);
    let a = sim.assignments("exec-01");
    sim.note(a);
    sim.events(
        "exec-01",
        vec![exited("j-1"), started("j-4"), ready("j-4", true)],
    );
    sim.run_for(2, &["exec-01"]);
    sim.events("exec-01", vec![exited("j-2")]);
    let s = sim.rollout("web");
    sim.note(s);
    // v3 dies at once, three times: the rollout fails and rolls back to v2's profile as
    // generation 4; the v2 replicas are generation 4 and were never touched.
    sim.put(versioned(2, "exit 1"));
    for _ in 0..3 {
        let j = sim.core.view().borrow().services[&ServiceKey::new("default", "web")]
            .jobs
            .iter()
            .find(|j| j.info.generation == 3)
            .map(|j| j.info.job.clone());
        if let Some(j) = j {
            sim.events("exec-01", vec![started(&j), exited(&j)]);
        }
        sim.run_for(4, &["exec-01"]);
    }
    let s = sim.rollout("web");
    sim.note(s);
    sim.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
          applied Created
        > put web
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          4 job j-2 web/1 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-01 j-2 1
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true},{"event":"started","job":"j-2","pid":7},{"event":"readiness","job":"j-2","ready":true}]
          5 job j-1 web/0 exec-01 Running ready=false
          6 job j-1 web/0 exec-01 Running ready=true
          7 job j-2 web/1 exec-01 Running ready=false
          8 job j-2 web/1 exec-01 Running ready=true
          9 service web rev=9
          = web generation=1 rollout=complete updated=2 ready=2 outdated=0 reason=""
          applied Updated
        > put web
          10 service web rev=10
          11 job j-3 web/0 exec-01 Placed ready=false gen=2
          plugin: reserve exec-01 j-3 2
        > events exec-01 [{"event":"started","job":"j-3","pid":7}]
          12 job j-3 web/0 exec-01 Running ready=false gen=2
          = web generation=2 rollout=progressing updated=1 ready=2 outdated=2 reason=""
        > events exec-01 [{"event":"readiness","job":"j-3","ready":true}]
          13 job j-3 web/0 exec-01 Running ready=true gen=2
          14 job j-1 web/0 exec-01 Draining ready=false
          15 job j-4 web/1 exec-01 Placed ready=false gen=2
          plugin: reserve exec-01 j-4 3
          = exec-01 index=15 [j-1:Run j-2:Run j-3:Run j-4:Run]
        > 2s pass, heartbeats from ["exec-01"]
          16 job j-1 web/0 exec-01 Stopping ready=false
          = exec-01 index=16 [j-1:Stop j-2:Run j-3:Run j-4:Run]
        > events exec-01 [{"event":"exited","job":"j-1","code":1},{"event":"started","job":"j-4","pid":7},{"event":"readiness","job":"j-4","ready":true}]
          17 ended j-1 web/0 Stopped
          18 job j-4 web/1 exec-01 Running ready=false gen=2
          19 job j-4 web/1 exec-01 Running ready=true gen=2
          20 job j-2 web/1 exec-01 Draining ready=false
          21 service web rev=21
          plugin: release exec-01 j-1
        > 2s pass, heartbeats from ["exec-01"]
          22 job j-2 web/1 exec-01 Stopping ready=false
        > events exec-01 [{"event":"exited","job":"j-2","code":1}]
          23 ended j-2 web/1 Stopped
          plugin: release exec-01 j-2
          = web generation=2 rollout=complete updated=2 ready=2 outdated=0 reason=""
          applied Updated
        > put web
          24 service web rev=24
          25 job j-5 web/0 exec-01 Placed ready=false gen=3
          plugin: reserve exec-01 j-5 0
        > events exec-01 [{"event":"started","job":"j-5","pid":7},{"event":"exited","job":"j-5","code":1}]
          26 job j-5 web/0 exec-01 Running ready=false gen=3
          27 ended j-5 web/0 Exited { code: Some(1) }
          plugin: release exec-01 j-5
        > 4s pass, heartbeats from ["exec-01"]
          28 job j-6 web/0 exec-01 Placed ready=false gen=3
          plugin: reserve exec-01 j-6 0
        > events exec-01 [{"event":"started","job":"j-6","pid":7},{"event":"exited","job":"j-6","code":1}]
          29 job j-6 web/0 exec-01 Running ready=false gen=3
          30 ended j-6 web/0 Exited { code: Some(1) }
          plugin: release exec-01 j-6
        > 4s pass, heartbeats from ["exec-01"]
          31 job j-7 web/0 exec-01 Placed ready=false gen=3
          plugin: reserve exec-01 j-7 0
        > events exec-01 [{"event":"started","job":"j-7","pid":7},{"event":"exited","job":"j-7","code":1}]
          32 job j-7 web/0 exec-01 Running ready=false gen=3
          33 ended j-7 web/0 Exited { code: Some(1) }
          34 job j-3 web/0 exec-01 Running ready=true gen=4
          35 job j-4 web/1 exec-01 Running ready=true gen=4
          36 service web rev=36
          plugin: release exec-01 j-7
        > 4s pass, heartbeats from ["exec-01"]
          37 service web rev=37
          = web generation=4 rollout=reverted updated=2 ready=2 outdated=0 reason="generation 3 failed: new replicas keep exiting (3 exits of generation 3); rolled back to generation 2's profile as generation 4""#]]);
}

#[test]
fn a_rollout_without_room_to_surge_says_why_it_waits_or_uses_max_unavailable() {
    // One host with room for exactly the two replicas (like a fixed port on every host).
    let mut sim = Sim::new();
    sim.register("exec-01", 2, &[]);
    sim.put(versioned(2, "v1"));
    sim.events(
        "exec-01",
        vec![
            started("j-1"),
            ready("j-1", true),
            started("j-2"),
            ready("j-2", true),
        ],
    );
    sim.put(versioned(2, "v2"));
    let s = sim.rollout("web");
    sim.note(s);
    // max_unavailable = 1: one old replica drains first, its slot frees when it is gone.
    let mut doc = versioned(2, "v2");
    doc["service"]["update"] = json!({"max_surge": 1, "max_unavailable": 1});
    sim.put(doc);
    sim.run_for(2, &["exec-01"]);
    sim.events("exec-01", vec![exited("j-2")]);
    let s = sim.rollout("web");
    sim.note(s);
    sim.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
          applied Created
        > put web
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          4 job j-2 web/1 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-01 j-2 1
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true},{"event":"started","job":"j-2","pid":7},{"event":"readiness","job":"j-2","ready":true}]
          5 job j-1 web/0 exec-01 Running ready=false
          6 job j-1 web/0 exec-01 Running ready=true
          7 job j-2 web/1 exec-01 Running ready=false
          8 job j-2 web/1 exec-01 Running ready=true
          9 service web rev=9
          applied Updated
        > put web
          10 service web rev=10
          11 service web rev=11
          = web generation=2 rollout=progressing updated=0 ready=2 outdated=2 reason="waiting: no new replica fits beside the old ones (slots is full on exec-01); with max_unavailable = 0 no old replica leaves first"
          applied Updated
        > put web
          12 service web rev=12
          13 job j-2 web/1 exec-01 Draining ready=false
          14 service web rev=14
        > 2s pass, heartbeats from ["exec-01"]
          15 job j-2 web/1 exec-01 Stopping ready=false
        > events exec-01 [{"event":"exited","job":"j-2","code":1}]
          16 ended j-2 web/1 Stopped
          17 job j-3 web/1 exec-01 Placed ready=false gen=2
          plugin: release exec-01 j-2
          plugin: reserve exec-01 j-3 1
          = web generation=2 rollout=progressing updated=1 ready=1 outdated=1 reason="""#]]);
}

#[test]
fn a_controller_restart_during_a_drain_drains_in_full_again() {
    let mut sim = Sim::new();
    sim.register("exec-01", 10, &[]);
    sim.put(versioned(1, "v1"));
    sim.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
    sim.delete("web");
    sim.run_for(1, &["exec-01"]);
    // The controller dies 1s into the 2s drain and is back 0s later: j-1 still runs for
    // a full drain from the restart before it is told to stop.
    let mut sim = sim.restart(0);
    sim.register("exec-01", 10, &["j-1"]);
    sim.run_for(1, &["exec-01"]);
    let a = sim.assignments("exec-01");
    sim.note(a);
    sim.run_for(1, &["exec-01"]);
    let a = sim.assignments("exec-01");
    sim.note(a);
    sim.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
          applied Created
        > put web
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          4 job j-1 web/0 exec-01 Running ready=false
          5 job j-1 web/0 exec-01 Running ready=true
          6 service web rev=6
        > delete web
          7 service web rev=7
          8 job j-1 web/0 exec-01 Draining ready=false
        > 1s pass, heartbeats from ["exec-01"]
        > load
          resync rev=8 services=1 jobs=[j-1@exec-01:Draining] hosts=1
          plugin: restore exec-01 j-1 0
        > register exec-01 running=["j-1"]
          9 host exec-01 Ready ["web"]
        > 1s pass, heartbeats from ["exec-01"]
          = exec-01 index=8 [j-1:Run]
        > 1s pass, heartbeats from ["exec-01"]
          10 job j-1 web/0 exec-01 Stopping ready=false
          = exec-01 index=10 [j-1:Stop]"#]]);
}

#[test]
fn a_controller_paused_past_the_grace_period_stops_nothing() {
    let mut sim = Sim::new();
    let hosts = ["exec-01", "exec-02", "exec-03"];
    sim.register_all(&hosts, 3);
    sim.put(versioned(3, "v1"));
    sim.start_ready(&[(hosts[0], "j-1"), (hosts[1], "j-2"), (hosts[2], "j-3")]);
    sim.run_for(1, &hosts);
    // SIGSTOP for twice the grace period: the timer armed for `unreachable_after` from
    // now fires 60 s late, before any heartbeat queued meanwhile is handled.
    let armed = sim.now + TIMING.unreachable_after;
    sim.now += TIMING.grace_period * 2;
    sim.core.tick(sim.now, Some(armed));
    sim.core.mark_dirty();
    sim.settle("resumed after 60 s", Ok(()));
    // The hosts are heard again within their fresh window.
    sim.run_for(2, &hosts);
    let s = sim.rollout("web");
    sim.note(s);
    sim.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > register exec-02 running=[]
          2 host exec-02 Ready []
        > register exec-03 running=[]
          3 host exec-03 Ready []
          applied Created
        > put web
          4 service web rev=4
          5 job j-1 web/0 exec-01 Placed ready=false
          6 job j-2 web/1 exec-02 Placed ready=false
          7 job j-3 web/2 exec-03 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-02 j-2 0
          plugin: reserve exec-03 j-3 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          8 job j-1 web/0 exec-01 Running ready=false
          9 job j-1 web/0 exec-01 Running ready=true
        > events exec-02 [{"event":"started","job":"j-2","pid":7},{"event":"readiness","job":"j-2","ready":true}]
          10 job j-2 web/1 exec-02 Running ready=false
          11 job j-2 web/1 exec-02 Running ready=true
        > events exec-03 [{"event":"started","job":"j-3","pid":7},{"event":"readiness","job":"j-3","ready":true}]
          12 job j-3 web/2 exec-03 Running ready=false
          13 job j-3 web/2 exec-03 Running ready=true
          14 service web rev=14
        > 1s pass, heartbeats from ["exec-01", "exec-02", "exec-03"]
        > resumed after 60 s
        > 2s pass, heartbeats from ["exec-01", "exec-02", "exec-03"]
          = web generation=1 rollout=complete updated=3 ready=3 outdated=0 reason="""#]]);
}

/// The full-disruption rule: 2 of 3 hosts go silent at once, past the grace period. The
/// controller suspects itself or its network: nothing is lost or replaced, the silent
/// hosts' replicas leave the endpoints (ready=false) but keep their slots. One comes back
/// (readiness as it was, no restart); the disruption is over, and the other is judged
/// again from then on: lost a whole grace period later, and only then replaced.
#[test]
fn most_hosts_silent_at_once_lose_nothing_until_fewer_are() {
    let mut sim = Sim::new();
    let hosts = ["exec-01", "exec-02", "exec-03"];
    sim.register_all(&hosts, 3);
    sim.submit(web("web", "default", 3));
    sim.start_ready(&[(hosts[0], "j-1"), (hosts[1], "j-2"), (hosts[2], "j-3")]);
    sim.run_for(35, &["exec-01"]);
    let m = sim.metrics.full_disruption.get();
    sim.note(format!("xce_full_disruption {m}"));
    let next = sim.core.next_deadline(sim.now).map(|d| d - sim.now);
    sim.note(format!(
        "next deadline in {next:?} (exec-01's own; no busy timer)"
    ));
    sim.run_for(60, &["exec-01"]);
    sim.heartbeat("exec-02");
    sim.run_for(1, &["exec-01", "exec-02"]);
    let m = sim.metrics.full_disruption.get();
    sim.note(format!("xce_full_disruption {m}"));
    sim.run_for(28, &["exec-01", "exec-02"]);
    sim.note("exec-03 silent for 2 minutes, but only 29 s since the disruption ended".into());
    sim.run_for(2, &["exec-01", "exec-02"]);
    let a = sim.assignments("exec-01");
    sim.note(a);
    sim.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > register exec-02 running=[]
          2 host exec-02 Ready []
        > register exec-03 running=[]
          3 host exec-03 Ready []
        > submit
          4 service web rev=4
          5 job j-1 web/0 exec-01 Placed ready=false
          6 job j-2 web/1 exec-02 Placed ready=false
          7 job j-3 web/2 exec-03 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-02 j-2 0
          plugin: reserve exec-03 j-3 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          8 job j-1 web/0 exec-01 Running ready=false
          9 job j-1 web/0 exec-01 Running ready=true
        > events exec-02 [{"event":"started","job":"j-2","pid":7},{"event":"readiness","job":"j-2","ready":true}]
          10 job j-2 web/1 exec-02 Running ready=false
          11 job j-2 web/1 exec-02 Running ready=true
        > events exec-03 [{"event":"started","job":"j-3","pid":7},{"event":"readiness","job":"j-3","ready":true}]
          12 job j-3 web/2 exec-03 Running ready=false
          13 job j-3 web/2 exec-03 Running ready=true
          14 service web rev=14
        > 35s pass, heartbeats from ["exec-01"]
          15 job j-2 web/1 exec-02 Unknown ready=true
          16 host exec-02 Unreachable ["web"]
          17 job j-3 web/2 exec-03 Unknown ready=true
          18 host exec-03 Unreachable ["web"]
          19 job j-2 web/1 exec-02 Unknown ready=false
          20 job j-3 web/2 exec-03 Unknown ready=false
          = xce_full_disruption 1
          = next deadline in Some(3s) (exec-01's own; no busy timer)
        > 60s pass, heartbeats from ["exec-01"]
        > heartbeat exec-02
          21 job j-2 web/1 exec-02 Running ready=true
          22 host exec-02 Ready ["web"]
        > 1s pass, heartbeats from ["exec-01", "exec-02"]
          = xce_full_disruption 0
        > 28s pass, heartbeats from ["exec-01", "exec-02"]
          = exec-03 silent for 2 minutes, but only 29 s since the disruption ended
        > 2s pass, heartbeats from ["exec-01", "exec-02"]
          23 ended j-3 web/2 HostLost
          24 host exec-03 Lost []
          25 job j-4 web/2 exec-01 Placed ready=false
          plugin: release exec-03 j-3
          plugin: reserve exec-01 j-4 1
          = exec-01 index=25 [j-1:Run j-4:Run]"#]]);
}

/// A host that comes back during a full disruption past its grace period, while the
/// others stay silent: its replicas are endpoints again at once, readiness as it was
/// (the worker reports transitions only and would never report `ready` again), and a
/// readiness change reported meanwhile is the one kept.
#[test]
fn a_host_back_during_a_full_disruption_serves_again_as_it_was() {
    let mut sim = Sim::new();
    let hosts = ["exec-01", "exec-02", "exec-03", "exec-04"];
    sim.register_all(&hosts, 3);
    sim.submit(web("web", "default", 4));
    sim.start_ready(&[
        (hosts[0], "j-1"),
        (hosts[1], "j-2"),
        (hosts[2], "j-3"),
        (hosts[3], "j-4"),
    ]);
    sim.run_for(31, &["exec-01"]);
    // exec-04's replica turned unready while its host was out: that is what it returns to.
    sim.events("exec-04", vec![ready("j-4", false)]);
    sim.heartbeat("exec-04");
    sim.heartbeat("exec-02");
    // 2 of 4 unreachable is not more than 55 %: the disruption is judged over at once.
    let m = sim.metrics.full_disruption.get();
    let next = sim.core.next_deadline(sim.now).map(|d| d - sim.now);
    sim.note(format!(
        "xce_full_disruption {m}, next deadline in {next:?}"
    ));
    sim.run_for(1, &["exec-01", "exec-02", "exec-04"]);
    let m = sim.metrics.full_disruption.get();
    sim.note(format!("xce_full_disruption {m}"));
    sim.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > register exec-02 running=[]
          2 host exec-02 Ready []
        > register exec-03 running=[]
          3 host exec-03 Ready []
        > register exec-04 running=[]
          4 host exec-04 Ready []
        > submit
          5 service web rev=5
          6 job j-1 web/0 exec-01 Placed ready=false
          7 job j-2 web/1 exec-02 Placed ready=false
          8 job j-3 web/2 exec-03 Placed ready=false
          9 job j-4 web/3 exec-04 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-02 j-2 0
          plugin: reserve exec-03 j-3 0
          plugin: reserve exec-04 j-4 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          10 job j-1 web/0 exec-01 Running ready=false
          11 job j-1 web/0 exec-01 Running ready=true
        > events exec-02 [{"event":"started","job":"j-2","pid":7},{"event":"readiness","job":"j-2","ready":true}]
          12 job j-2 web/1 exec-02 Running ready=false
          13 job j-2 web/1 exec-02 Running ready=true
        > events exec-03 [{"event":"started","job":"j-3","pid":7},{"event":"readiness","job":"j-3","ready":true}]
          14 job j-3 web/2 exec-03 Running ready=false
          15 job j-3 web/2 exec-03 Running ready=true
        > events exec-04 [{"event":"started","job":"j-4","pid":7},{"event":"readiness","job":"j-4","ready":true}]
          16 job j-4 web/3 exec-04 Running ready=false
          17 job j-4 web/3 exec-04 Running ready=true
          18 service web rev=18
        > 31s pass, heartbeats from ["exec-01"]
          19 job j-2 web/1 exec-02 Unknown ready=true
          20 host exec-02 Unreachable ["web"]
          21 job j-3 web/2 exec-03 Unknown ready=true
          22 host exec-03 Unreachable ["web"]
          23 job j-4 web/3 exec-04 Unknown ready=true
          24 host exec-04 Unreachable ["web"]
          25 job j-2 web/1 exec-02 Unknown ready=false
          26 job j-3 web/2 exec-03 Unknown ready=false
          27 job j-4 web/3 exec-04 Unknown ready=false
        > events exec-04 [{"event":"readiness","job":"j-4","ready":false}]
        > heartbeat exec-04
          28 job j-4 web/3 exec-04 Running ready=false
          29 host exec-04 Ready ["web"]
        > heartbeat exec-02
          30 job j-2 web/1 exec-02 Running ready=true
          31 host exec-02 Ready ["web"]
          = xce_full_disruption 1, next deadline in Some(0ns)
        > 1s pass, heartbeats from ["exec-01", "exec-02", "exec-04"]
          = xce_full_disruption 0"#]]);
}

/// The rule against a random cluster: `silent` of `hosts` hosts go quiet at once past the
/// grace period, with a random threshold. Either it is a full disruption (by the pure
/// rule) and no host is lost, no replica placed elsewhere, no timer is left in the past;
/// or every silent host is lost. Then all come back: in a disruption, every replica is as
/// it was (same job, ready), and nothing was released.
#[test]
fn the_full_disruption_rule_through_the_core() {
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    });
    let strategy = (1usize..=7, 0usize..=7, 1u32..=20);
    runner
        .run(&strategy, |(n, silent, tenths)| {
            let silent = silent.min(n);
            let threshold = DisruptionThreshold::try_new(f64::from(tenths) / 20.0).unwrap();
            let timing = Timing {
                disruption_threshold: threshold,
                ..TIMING
            };
            let mut sim = Sim::load_with(timing, Arc::new(MemStore::new()), Instant::now());
            let names: Vec<String> = (1..=n).map(|i| format!("exec-{i:02}")).collect();
            sim.register_all(&names, 3);
            sim.submit(web("web", "default", n as u32));
            let jobs: Vec<(String, String)> = sim
                .core
                .view()
                .borrow()
                .services[&ServiceKey::new("default", "web")]
                .jobs
                .iter()
                .map(|j| (j.info.host.clone(), j.info.job.clone()))
                .collect();
            sim.start_ready(&jobs);
            let talking: Vec<&str> = names[silent..].iter().map(String::as_str).collect();
            sim.raw.take();
            sim.run_for(TIMING.grace_period.as_secs() + 5, &talking);
            let events = sim.raw.take();
            let lost = events
                .iter()
                .filter(|e| matches!(e, ClusterEvent::Host { host, .. } if host.state == HostState::Lost))
                .count();
            let placed = events
                .iter()
                .filter(|e| matches!(e, ClusterEvent::Job { job, .. } if job.state == JobState::Placed))
                .count();
            let full = threshold.is_full_disruption(silent, n);
            prop_assert_eq!(sim.metrics.full_disruption.get(), i64::from(full));
            if full {
                prop_assert_eq!((lost, placed), (0, 0));
                let next = sim.core.next_deadline(sim.now);
                prop_assert!(next.is_none_or(|t| t > sim.now), "a timer in the past");
                for h in &names[..silent] {
                    sim.heartbeat(h);
                }
                sim.run_for(1, &names.iter().map(String::as_str).collect::<Vec<_>>());
                let v = sim.core.view();
                let v = v.borrow();
                let now: Vec<(String, String, bool)> = v.services
                    [&ServiceKey::new("default", "web")]
                    .jobs
                    .iter()
                    .map(|j| (j.info.host.clone(), j.info.job.clone(), j.info.ready))
                    .collect();
                let before: Vec<(String, String, bool)> =
                    jobs.iter().map(|(h, j)| (h.clone(), j.clone(), true)).collect();
                prop_assert_eq!(now, before);
                prop_assert!(!sim.out.iter().any(|l| l.contains("plugin: release")));
            } else {
                // Each talking host has 2 free slots for the lost hosts' replicas.
                prop_assert_eq!((lost, placed), (silent, silent.min(2 * (n - silent))));
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_restart_replays_the_release_order_into_the_plugins() {
    let mut sim = Sim::new();
    sim.register("exec-01", 3, &[]);
    sim.put(versioned(2, "v1"));
    sim.events("exec-01", vec![started("j-1"), started("j-2")]);
    // j-1 ends: its slot is the most recently freed one.
    sim.events("exec-01", vec![exited("j-1")]);
    // After a restart (or a takeover) the plugins learn the live grants, then the ended
    // ones again, released in the order they ended: their free order is what it was.
    let sim = sim.restart(0);
    sim.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
          applied Created
        > put web
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          4 job j-2 web/1 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-01 j-2 1
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"started","job":"j-2","pid":7}]
          5 job j-1 web/0 exec-01 Running ready=false
          6 job j-2 web/1 exec-01 Running ready=false
        > events exec-01 [{"event":"exited","job":"j-1","code":1}]
          7 ended j-1 web/0 Exited { code: Some(1) }
          plugin: release exec-01 j-1
        > load
          resync rev=7 services=1 jobs=[j-2@exec-01:Running] hosts=1
          8 job j-3 web/0 exec-01 Placed ready=false
          plugin: restore exec-01 j-2 1
          plugin: restore exec-01 j-1 0
          plugin: release exec-01 j-1
          plugin: reserve exec-01 j-3 0"#]]);
}

#[test]
fn crash_looping_replica_backs_off_then_resets() {
    let mut s = Sim::new();
    s.register("exec-01", 2, &[]);
    s.submit(web("web", "default", 1));
    s.events("exec-01", vec![started("j-1"), exited("j-1")]);
    let d = s.core.next_deadline(s.now).map(|d| d - s.now);
    s.note(format!(
        "next deadline in {d:?} (backoff 1s, before the host's 3s)"
    ));
    s.run_for(1, &["exec-01"]);
    s.events("exec-01", vec![started("j-2"), exited("j-2")]);
    s.run_for(1, &["exec-01"]);
    s.note("1s is not enough after the second exit".into());
    s.run_for(1, &["exec-01"]);
    s.events("exec-01", vec![started("j-3"), exited("j-3")]);
    s.run_for(3, &["exec-01"]);
    s.note("third exit: 4s".into());
    s.run_for(1, &["exec-01"]);
    s.events("exec-01", vec![started("j-4")]);
    s.run_for(60, &["exec-01"]);
    s.events("exec-01", vec![exited("j-4")]);
    s.note("ran 60s: backoff starts over at 1s".into());
    s.run_for(1, &["exec-01"]);
    s.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > submit
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"exited","job":"j-1","code":1}]
          4 job j-1 web/0 exec-01 Running ready=false
          5 ended j-1 web/0 Exited { code: Some(1) }
          plugin: release exec-01 j-1
          = next deadline in Some(1s) (backoff 1s, before the host's 3s)
        > 1s pass, heartbeats from ["exec-01"]
          6 job j-2 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-2 0
        > events exec-01 [{"event":"started","job":"j-2","pid":7},{"event":"exited","job":"j-2","code":1}]
          7 job j-2 web/0 exec-01 Running ready=false
          8 ended j-2 web/0 Exited { code: Some(1) }
          plugin: release exec-01 j-2
        > 1s pass, heartbeats from ["exec-01"]
          = 1s is not enough after the second exit
        > 1s pass, heartbeats from ["exec-01"]
          9 job j-3 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-3 0
        > events exec-01 [{"event":"started","job":"j-3","pid":7},{"event":"exited","job":"j-3","code":1}]
          10 job j-3 web/0 exec-01 Running ready=false
          11 ended j-3 web/0 Exited { code: Some(1) }
          12 service web rev=12
          plugin: release exec-01 j-3
        > 3s pass, heartbeats from ["exec-01"]
          = third exit: 4s
        > 1s pass, heartbeats from ["exec-01"]
          13 job j-4 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-4 0
        > events exec-01 [{"event":"started","job":"j-4","pid":7}]
          14 job j-4 web/0 exec-01 Running ready=false
        > 60s pass, heartbeats from ["exec-01"]
        > events exec-01 [{"event":"exited","job":"j-4","code":1}]
          15 ended j-4 web/0 Exited { code: Some(1) }
          plugin: release exec-01 j-4
          = ran 60s: backoff starts over at 1s
        > 1s pass, heartbeats from ["exec-01"]
          16 job j-5 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-5 0"#]]);
}

/// A fixed wall clock: 2026-12-03T09:00:00Z.
fn wall() -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_secs(1_796_288_400)
}

/// What `GET /v1/services/{name}` says of a replica (its `replica_status` entry) and its
/// pending reason, on one line.
fn replica_status(s: &Sim, name: &str, replica: u32) -> String {
    let v = s.core.view();
    let v = v.borrow();
    let svc = &v.services[&ServiceKey::new("default", name)];
    let pending = svc
        .pending
        .iter()
        .find(|(r, _)| *r == replica)
        .map_or("-", |(_, why)| why.as_str());
    format!(
        "{} pending={pending:?}",
        api::services::replica_json(svc, replica)
    )
}

/// Each way a replica can end by itself — an exit code, a signal, a program that cannot
/// be started — is kept for its slot with the time and the job, counts as a restart,
/// names the cause in the pending reason, and survives a controller restart (it is in
/// the store, committed with the exit itself).
#[test]
fn a_replicas_last_exit_and_restarts_are_shown_and_survive_a_reload() {
    let mut s = Sim::new();
    s.core.set_wall_clock(wall);
    s.register("exec-01", 2, &[]);
    s.submit(web("web", "default", 1));
    let status = |s: &mut Sim| {
        let line = replica_status(s, "web", 0);
        s.note(line);
    };
    status(&mut s);
    let log = |job: &str| Some(format!("/var/lib/xce/logs/{job}.log"));
    let start = |job: &str| WorkerEvent::Started {
        job: job.into(),
        pid: 7,
        log: log(job),
    };
    let end = |job: &str, cause| WorkerEvent::exited(job.into(), cause, log(job));
    let report = |s: &mut Sim, events| {
        s.events("exec-01", events);
        status(s);
    };
    report(&mut s, vec![start("j-1")]);
    report(&mut s, vec![end("j-1", ExitCause::code(3))]);
    s.run_for(1, &["exec-01"]);
    report(&mut s, vec![start("j-2"), end("j-2", ExitCause::signal(9))]);
    s.run_for(2, &["exec-01"]);
    let spawn_error = ExitCause {
        code: Some(127),
        signal: None,
        error: Some(
            "cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)".into(),
        ),
    };
    report(&mut s, vec![end("j-3", spawn_error)]);
    // A repeated report (its acknowledgement was lost) counts nothing twice.
    report(&mut s, vec![end("j-3", ExitCause::code(127))]);
    // A controller restart: the history is read back from the store.
    let mut s = s.restart(1);
    s.core.set_wall_clock(wall);
    status(&mut s);
    // The replacement's start: its log is shown, the slot's history stays.
    report(&mut s, vec![start("j-4")]);
    s.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > submit
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
          = {"last_exit":null,"log":null,"log_host":null,"replica":0,"restarts":0} pending="-"
        > events exec-01 [{"event":"started","job":"j-1","pid":7,"log":"/var/lib/xce/logs/j-1.log"}]
          4 job j-1 web/0 exec-01 Running ready=false
          = {"last_exit":null,"log":"/var/lib/xce/logs/j-1.log","log_host":"exec-01","replica":0,"restarts":0} pending="-"
        > events exec-01 [{"event":"exited","job":"j-1","code":3,"log":"/var/lib/xce/logs/j-1.log"}]
          5 ended j-1 web/0 Exited { code: Some(3) }
          plugin: release exec-01 j-1
          = {"last_exit":{"at":"2026-12-03T09:00:00.000Z","code":3,"error":null,"host":"exec-01","job":"j-1","signal":null,"signal_name":null,"summary":"exit 3"},"log":"/var/lib/xce/logs/j-1.log","log_host":"exec-01","replica":0,"restarts":1} pending="restarting after exit 3 in 1s"
        > 1s pass, heartbeats from ["exec-01"]
          6 job j-2 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-2 0
        > events exec-01 [{"event":"started","job":"j-2","pid":7,"log":"/var/lib/xce/logs/j-2.log"},{"event":"exited","job":"j-2","code":null,"signal":9,"log":"/var/lib/xce/logs/j-2.log"}]
          7 job j-2 web/0 exec-01 Running ready=false
          8 ended j-2 web/0 Exited { code: None }
          plugin: release exec-01 j-2
          = {"last_exit":{"at":"2026-12-03T09:00:00.000Z","code":null,"error":null,"host":"exec-01","job":"j-2","signal":9,"signal_name":"SIGKILL","summary":"SIGKILL (signal 9)"},"log":"/var/lib/xce/logs/j-2.log","log_host":"exec-01","replica":0,"restarts":2} pending="restarting after SIGKILL in 2s"
        > 2s pass, heartbeats from ["exec-01"]
          9 job j-3 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-3 0
        > events exec-01 [{"event":"exited","job":"j-3","code":127,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","log":"/var/lib/xce/logs/j-3.log"}]
          10 ended j-3 web/0 Exited { code: Some(127) }
          11 service web rev=11
          plugin: release exec-01 j-3
          = {"last_exit":{"at":"2026-12-03T09:00:00.000Z","code":127,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","host":"exec-01","job":"j-3","signal":null,"signal_name":null,"summary":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"},"log":"/var/lib/xce/logs/j-3.log","log_host":"exec-01","replica":0,"restarts":3} pending="restarting in 4s: cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"
        > events exec-01 [{"event":"exited","job":"j-3","code":127,"log":"/var/lib/xce/logs/j-3.log"}]
          = {"last_exit":{"at":"2026-12-03T09:00:00.000Z","code":127,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","host":"exec-01","job":"j-3","signal":null,"signal_name":null,"summary":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"},"log":"/var/lib/xce/logs/j-3.log","log_host":"exec-01","replica":0,"restarts":3} pending="restarting in 4s: cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"
        > load
          resync rev=11 services=1 jobs=[] hosts=1
          12 job j-4 web/0 exec-01 Placed ready=false
          plugin: restore exec-01 j-1 0
          plugin: release exec-01 j-1
          plugin: restore exec-01 j-2 0
          plugin: release exec-01 j-2
          plugin: restore exec-01 j-3 0
          plugin: release exec-01 j-3
          plugin: reserve exec-01 j-4 0
          = {"last_exit":{"at":"2026-12-03T09:00:00.000Z","code":127,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","host":"exec-01","job":"j-3","signal":null,"signal_name":null,"summary":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"},"log":"/var/lib/xce/logs/j-3.log","log_host":"exec-01","replica":0,"restarts":3} pending="-"
        > events exec-01 [{"event":"started","job":"j-4","pid":7,"log":"/var/lib/xce/logs/j-4.log"}]
          13 job j-4 web/0 exec-01 Running ready=false
          = {"last_exit":{"at":"2026-12-03T09:00:00.000Z","code":127,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","host":"exec-01","job":"j-3","signal":null,"signal_name":null,"summary":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"},"log":"/var/lib/xce/logs/j-4.log","log_host":"exec-01","replica":0,"restarts":3} pending="-""#]]);
}

/// A commit slower than the backoff (etcd electing a new raft leader took 5 s): the pass
/// that ran right after the exit saw the backoff still running, and by the time the
/// controller looks at its timers the backoff's instant is past. It must still wake the
/// controller (the replica used to stay pending until some unrelated change), and once a
/// pass has seen it over it arms nothing more (no busy loop).
#[test]
fn a_backoff_that_ends_during_a_slow_commit_still_places_the_replica() {
    let mut s = Sim::new();
    s.register("exec-01", 2, &[]);
    s.submit(web("web", "default", 1));
    s.events("exec-01", vec![started("j-1"), exited("j-1")]);
    let exited_at = s.now;
    s.now += Duration::from_secs(5);
    s.core
        .heartbeat(&"exec-01".to_owned(), &worker("exec-01"), s.now)
        .unwrap();
    let due = s.core.next_deadline(s.now).expect("a deadline");
    assert_eq!(
        due,
        exited_at + Duration::from_secs(1),
        "the backoff's own instant"
    );
    // The timer fires at once (its instant is past): a pass with the fresh time.
    s.core.tick(s.now, Some(s.now));
    s.core.mark_dirty();
    s.core.settle(s.now);
    s.settle("the timer fires 5s after the exit", Ok(()));
    let next = s.core.next_deadline(s.now).expect("the host's deadline");
    assert!(next > s.now, "nothing past-due is armed any more");
    s.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > submit
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"exited","job":"j-1","code":1}]
          4 job j-1 web/0 exec-01 Running ready=false
          5 ended j-1 web/0 Exited { code: Some(1) }
          plugin: release exec-01 j-1
        > the timer fires 5s after the exit
          6 job j-2 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-2 0"#]]);
}

#[test]
fn unreachable_host_keeps_jobs_and_lost_host_is_replaced() {
    let mut s = Sim::new();
    s.register("exec-01", 2, &[]);
    s.register("exec-02", 2, &[]);
    s.submit(web("web", "default", 2));
    s.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
    s.events("exec-02", vec![started("j-2")]);
    s.run_for(5, &["exec-02"]);
    // Back within the grace period: jobs as before, readiness kept.
    s.heartbeat("exec-01");
    s.run_for(35, &["exec-02"]);
    let a = s.assignments("exec-02");
    s.note(a);
    // The lost worker comes back still running j-1: an orphan; exec-01 takes nothing new
    // until it reported j-1 exited.
    s.heartbeat("exec-01");
    s.register("exec-01", 2, &["j-1"]);
    let a = s.assignments("exec-01");
    s.note(a);
    s.submit(web("api", "default", 2));
    s.events("exec-01", vec![exited("j-1")]);
    s.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > register exec-02 running=[]
          2 host exec-02 Ready []
        > submit
          3 service web rev=3
          4 job j-1 web/0 exec-01 Placed ready=false
          5 job j-2 web/1 exec-02 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-02 j-2 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          6 job j-1 web/0 exec-01 Running ready=false
          7 job j-1 web/0 exec-01 Running ready=true
        > events exec-02 [{"event":"started","job":"j-2","pid":7}]
          8 job j-2 web/1 exec-02 Running ready=false
        > 5s pass, heartbeats from ["exec-02"]
          9 job j-1 web/0 exec-01 Unknown ready=true
          10 host exec-01 Unreachable ["web"]
        > heartbeat exec-01
          11 job j-1 web/0 exec-01 Running ready=true
          12 host exec-01 Ready ["web"]
        > 35s pass, heartbeats from ["exec-02"]
          13 job j-1 web/0 exec-01 Unknown ready=true
          14 host exec-01 Unreachable ["web"]
          15 ended j-1 web/0 HostLost
          16 host exec-01 Lost []
          17 job j-3 web/0 exec-02 Placed ready=false
          plugin: release exec-01 j-1
          plugin: reserve exec-02 j-3 1
          = exec-02 index=17 [j-2:Run j-3:Run]
        > heartbeat exec-01
          error: host "exec-01" is not registered
        > register exec-01 running=["j-1"]
          18 host exec-01 Ready []
          = exec-01 index=17 []
        > submit
          19 service api rev=19
        > events exec-01 [{"event":"exited","job":"j-1","code":1}]
          20 job j-4 api/0 exec-01 Placed ready=false
          21 job j-5 api/1 exec-01 Placed ready=false
          plugin: reserve exec-01 j-4 0
          plugin: reserve exec-01 j-5 1"#]]);
}

#[test]
fn refused_launch_is_reported_released_and_placed_again() {
    let mut s = Sim::new();
    s.register("exec-01", 2, &[]);
    s.submit(web("web", "default", 1));
    s.events(
        "exec-01",
        vec![WorkerEvent::Refused {
            job: "j-1".into(),
            refusal: LaunchRefusal {
                plugin: "slots".into(),
                reason: "slot 0 is in use on the host".into(),
                detail: json!({"slot": 0}),
            },
        }],
    );
    s.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > submit
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
        > events exec-01 [{"event":"refused","job":"j-1","refusal":{"plugin":"slots","reason":"slot 0 is in use on the host","detail":{"slot":0}}}]
          4 ended j-1 web/0 Refused { reason: "slot 0 is in use on the host" }
          5 job j-2 web/0 exec-01 Placed ready=false
          plugin: launch_refused exec-01 j-1 {"slot":0}
          plugin: release exec-01 j-1
          plugin: reserve exec-01 j-2 0"#]],
    );
}

#[test]
fn register_reconciles_and_refused_facts_keep_the_old_ones() {
    let mut s = Sim::new();
    s.register("exec-01", 3, &[]);
    s.submit(web("web", "default", 3));
    s.events("exec-01", vec![started("j-1"), started("j-2")]);
    s.delete("web");
    // Worker restarted: j-1 (stopping) still runs, j-2 is gone, j-3 never started.
    s.register("exec-01", 3, &["j-1"]);
    let bad = HostFacts {
        ip_addr: Some("0.0.0.0".parse().unwrap()),
        ..HostFacts::default()
    };
    let r = s
        .core
        .facts(&"exec-01".into(), &worker("exec-01"), bad, s.now);
    s.settle("facts 0.0.0.0", r);
    let ip = s.core.view().borrow().hosts[0].info.facts.ip_addr;
    s.note(format!("ip_addr still {ip:?}"));
    s.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > submit
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          4 job j-2 web/1 exec-01 Placed ready=false
          5 job j-3 web/2 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-01 j-2 1
          plugin: reserve exec-01 j-3 2
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"started","job":"j-2","pid":7}]
          6 job j-1 web/0 exec-01 Running ready=false
          7 job j-2 web/1 exec-01 Running ready=false
        > delete web
          8 service web rev=8
          9 job j-1 web/0 exec-01 Draining ready=false
          10 job j-2 web/1 exec-01 Draining ready=false
          11 job j-3 web/2 exec-01 Stopping ready=false
        > register exec-01 running=["j-1"]
          12 ended j-2 web/1 Stopped
          13 ended j-3 web/2 Stopped
          14 host exec-01 Ready ["web"]
          plugin: release exec-01 j-2
          plugin: release exec-01 j-3
        > facts 0.0.0.0
          error: host facts refused
          = ip_addr still Some(127.0.0.11)"#]],
    );
}

#[test]
fn restart_restores_grants_and_continues_the_revision() {
    let mut s = Sim::new();
    s.register("exec-01", 3, &[]);
    s.submit(web("web", "default", 2));
    s.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
    // A failed commit changes nothing: no event, no grant kept.
    s.store.fail_next_commit();
    s.submit(web("api", "default", 1));
    // The service commits, its placement fails: the reservation is rolled back and the
    // replica stays pending.
    s.store.fail_commit_after(1);
    s.submit(web("api", "default", 1));
    let pending = s.core.view().borrow().services[&ServiceKey::new("default", "api")]
        .pending
        .clone();
    s.note(format!(
        "api pending {pending:?}, used {:?}",
        s.slots.used()
    ));
    let mut s = s.restart(100);
    s.note(format!("used {:?}", s.slots.used()));
    s.events("exec-01", vec![started("j-2")]);
    s.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > submit
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          4 job j-2 web/1 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-01 j-2 1
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          5 job j-1 web/0 exec-01 Running ready=false
          6 job j-1 web/0 exec-01 Running ready=true
        > submit
          error: store failure injected for a test
        > submit
          7 service api rev=7
          plugin: reserve exec-01 j-3 2
          plugin: release exec-01 j-3
          = api pending [(0, "the controller's store failed")], used ["exec-01:0=j-1", "exec-01:1=j-2"]
        > load
          resync rev=7 services=2 jobs=[j-1@exec-01:Running j-2@exec-01:Placed] hosts=1
          8 job j-3 api/0 exec-01 Placed ready=false
          plugin: restore exec-01 j-1 0
          plugin: restore exec-01 j-2 1
          plugin: reserve exec-01 j-3 2
          = used ["exec-01:0=j-1", "exec-01:1=j-2", "exec-01:2=j-3"]
        > events exec-01 [{"event":"started","job":"j-2","pid":7}]
          9 job j-2 web/1 exec-01 Running ready=false"#]]);
}

// === the router, through oneshot ===

const TOKENS: &str = r#"
[[token]]
secret = "alice-example-secret"
principal = "alice"
grants = [ { permission = "job.view", projects = ["team-a"] },
           { permission = "job.submit", projects = ["team-a"] } ]
[[token]]
secret = "bob-example-secret"
principal = "bob"
grants = [ { permission = "job.view", projects = ["team-a", "team-b"] },
           { permission = "job.submit", projects = ["team-b"] } ]
[[token]]
secret = "admin-example-secret"
principal = "admin"
grants = [ { permission = "admin", projects = ["*"] } ]
[[worker]]
host = "exec-01"
secret = "w1-example-secret"
[[worker]]
host = "exec-02"
secret = "w2-example-secret"
"#;

struct App {
    ctl: Controller,
    app: axum::Router,
    /// The tokens in force (tests replace them as a SIGHUP would).
    keyring: xce_serve::keyring::Keyring,
}

async fn app_with(cfg: ControllerConfig, store: Arc<dyn Store>, slots: SharedSlots) -> App {
    let plugins = ControllerPlugins {
        resources: vec![Box::new(slots.clone())],
        facts_policies: vec![Arc::new(Policy)],
        listeners: vec![],
        extensions: vec![Arc::new(WhoAmI)],
    };
    let keyring = xce_serve::keyring::Keyring::new(Tokens::parse(TOKENS).unwrap());
    let ctl = Controller::new(&cfg, keyring.clone(), plugins, store)
        .await
        .unwrap();
    let app = ctl.router();
    App { ctl, app, keyring }
}

/// A store with a fixed cluster id, so answers that name it can be expected.
fn store_of_cluster(id: &str) -> Arc<MemStore> {
    let store = MemStore::new();
    store
        .put_if_absent(xce_model::cluster_id_key(), serde_json::to_vec(id).unwrap())
        .unwrap();
    Arc::new(store)
}

async fn app() -> App {
    app_with(
        ControllerConfig::default(),
        store_of_cluster("c1c1c1c1c1c1c1c1"),
        SharedSlots::new(),
    )
    .await
}

impl App {
    /// Sends one request; returns status and body (JSON compacted).
    async fn call(
        &self,
        method: &str,
        path: &str,
        who: Option<&str>,
        body: Option<(&str, String)>,
    ) -> (StatusCode, String) {
        let mut req = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).unwrap())
            .uri(path);
        if let Some(t) = who {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let body = match body {
            Some((ctype, b)) => {
                req = req.header("content-type", ctype);
                Body::from(b)
            }
            None => Body::empty(),
        };
        let resp = self
            .app
            .clone()
            .oneshot(req.body(body).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn json(
        &self,
        method: &str,
        path: &str,
        who: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let (s, b) = self
            .call(
                method,
                path,
                Some(who),
                body.map(|v| ("application/json", v.to_string())),
            )
            .await;
        (s, serde_json::from_str(&b).unwrap_or(Value::String(b)))
    }

    /// `POST /v1/services` with `profile` (JSON) as `who`.
    async fn submit(&self, who: &str, profile: Value) -> (StatusCode, Value) {
        self.json("POST", "/v1/services", who, Some(profile)).await
    }

    async fn register(&self, host: &str, secret: &str, slots: u64) {
        let req = RegisterRequest {
            facts: facts_of(host, slots),
            running: vec![],
        };
        let (s, b) = self
            .json(
                "POST",
                &format!("/internal/v1/hosts/{host}/register"),
                secret,
                Some(serde_json::to_value(req).unwrap()),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
}

/// Runs each `(method, path, token, body)` and prints `status body` per line.
async fn check_calls(
    app: &App,
    calls: &[(&str, &str, Option<&str>, Option<Value>)],
    expect: Expect,
) {
    let mut out = Vec::new();
    for (m, p, who, body) in calls {
        let (s, b) = app
            .call(
                m,
                p,
                *who,
                body.as_ref().map(|v| ("application/json", v.to_string())),
            )
            .await;
        out.push(format!(
            "{m} {p} as {}: {} {b}",
            who.unwrap_or("-"),
            s.as_u16()
        ));
    }
    expect.assert_eq(&out.join("\n"));
}

#[tokio::test]
async fn rbac_matrix_across_two_projects() {
    let app = app().await;
    app.register("exec-01", "w1-example-secret", 4).await;
    let unknown_before = app
        .call(
            "GET",
            "/v1/services/web-b",
            Some("alice-example-secret"),
            None,
        )
        .await;
    let (s, _) = app
        .submit("alice-example-secret", web("web-a", "team-a", 1))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = app
        .submit("bob-example-secret", web("web-b", "team-b", 1))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    // Invisible and unknown answer byte-identically.
    let invisible = app
        .call(
            "GET",
            "/v1/services/web-b",
            Some("alice-example-secret"),
            None,
        )
        .await;
    assert_eq!(unknown_before, invisible);
    let delete_invisible = app
        .call(
            "DELETE",
            "/v1/services/web-b",
            Some("alice-example-secret"),
            None,
        )
        .await;
    assert_eq!(unknown_before, delete_invisible);

    check_calls(
        &app,
        &[
            ("GET", "/healthz", None, None),
            ("GET", "/v1/services", None, None),
            ("GET", "/v1/services", Some("nope"), None),
            ("GET", "/v1/services/web-b", Some("alice-example-secret"), None),
            ("DELETE", "/v1/services/web-b", Some("alice-example-secret"), None),
            (
                "POST",
                "/v1/services",
                Some("alice-example-secret"),
                Some(web("x", "team-b", 1)),
            ),
            (
                "POST",
                "/v1/services",
                Some("bob-example-secret"),
                Some(web("x", "team-a", 1)),
            ),
            ("DELETE", "/v1/services/web-a", Some("bob-example-secret"), None),
            (
                "POST",
                "/v1/services",
                Some("w1-example-secret"),
                Some(web("x", "team-a", 1)),
            ),
            ("GET", "/v1/services/web-a", Some("w1-example-secret"), None),
            ("GET", "/v1/services", Some("w1-example-secret"), None),
            ("GET", "/v1/hosts", Some("w1-example-secret"), None),
            (
                "POST",
                "/internal/v1/hosts/exec-01/heartbeat",
                Some("admin-example-secret"),
                None,
            ),
            (
                "POST",
                "/internal/v1/hosts/exec-01/heartbeat",
                Some("w2-example-secret"),
                None,
            ),
            (
                "GET",
                "/internal/v1/hosts/exec-01/assignments?index=999",
                Some("w2-example-secret"),
                None,
            ),
            (
                "POST",
                "/internal/v1/hosts/exec-01/heartbeat",
                Some("w1-example-secret"),
                None,
            ),
            (
                "POST",
                "/internal/v1/hosts/exec-02/heartbeat",
                Some("w2-example-secret"),
                None,
            ),
            // A refused worker is told what is wrong: its secret, or its host's entry.
            (
                "POST",
                "/internal/v1/hosts/exec-01/register",
                Some("wrong"),
                None,
            ),
            ("POST", "/internal/v1/hosts/exec-01/heartbeat", None, None),
            (
                "POST",
                "/internal/v1/hosts/exec-09/register",
                Some("wrong"),
                None,
            ),
            (
                "POST",
                "/internal/v1/hosts/exec-09/register",
                Some("w2-example-secret"),
                None,
            ),
            ("GET", "/v1/nothing", Some("alice-example-secret"), None),
            ("GET", "/v1/whoami", Some("bob-example-secret"), None),
            ("GET", "/v1/whoami", None, None),
        ],
        expect![[r#"
            GET /healthz as -: 200 ok
            cluster: c1c1c1c1c1c1c1c1

            GET /v1/services as -: 401 {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}
            GET /v1/services as nope: 401 {"error":{"code":"unauthenticated","details":[],"message":"invalid bearer token"}}
            GET /v1/services/web-b as alice-example-secret: 404 {"error":{"code":"not_found","details":[],"message":"service \"web-b\" not found"}}
            DELETE /v1/services/web-b as alice-example-secret: 404 {"error":{"code":"not_found","details":[],"message":"service \"web-b\" not found"}}
            POST /v1/services as alice-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"no job.submit permission on project \"team-b\""}}
            POST /v1/services as bob-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"no job.submit permission on project \"team-a\""}}
            DELETE /v1/services/web-a as bob-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"no job.submit permission on project \"team-a\""}}
            POST /v1/services as w1-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"worker credentials may only call the worker api of their host"}}
            GET /v1/services/web-a as w1-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"worker credentials may only call the worker api of their host"}}
            GET /v1/services as w1-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"worker credentials may only call the worker api of their host"}}
            GET /v1/hosts as w1-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"worker credentials may only call the worker api of their host"}}
            POST /internal/v1/hosts/exec-01/heartbeat as admin-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"the worker api needs a worker credential (a [[worker]] secret), not a user token"}}
            POST /internal/v1/hosts/exec-01/heartbeat as w2-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"a worker may act for its own host only: this credential is host \"exec-02\"'s, not host \"exec-01\"'s"}}
            GET /internal/v1/hosts/exec-01/assignments?index=999 as w2-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"a worker may act for its own host only: this credential is host \"exec-02\"'s, not host \"exec-01\"'s"}}
            POST /internal/v1/hosts/exec-01/heartbeat as w1-example-secret: 204 
            POST /internal/v1/hosts/exec-02/heartbeat as w2-example-secret: 404 {"error":{"code":"not_found","details":[],"message":"host \"exec-02\" is not registered"}}
            POST /internal/v1/hosts/exec-01/register as wrong: 401 {"error":{"code":"unauthenticated","details":[],"message":"wrong or missing secret for the worker of host \"exec-01\" (invalid bearer token)"}}
            POST /internal/v1/hosts/exec-01/heartbeat as -: 401 {"error":{"code":"unauthenticated","details":[],"message":"wrong or missing secret for the worker of host \"exec-01\" (missing bearer token)"}}
            POST /internal/v1/hosts/exec-09/register as wrong: 401 {"error":{"code":"no_worker_entry","details":[],"message":"no [[worker]] entry for host \"exec-09\" in the controller's tokens file (invalid bearer token)"}}
            POST /internal/v1/hosts/exec-09/register as w2-example-secret: 403 {"error":{"code":"no_worker_entry","details":[],"message":"no [[worker]] entry for host \"exec-09\" in the controller's tokens file (this credential is host \"exec-02\"'s)"}}
            GET /v1/nothing as alice-example-secret: 404 {"error":{"code":"not_found","details":[],"message":"no such route"}}
            GET /v1/whoami as bob-example-secret: 200 bob
            GET /v1/whoami as -: 401 {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}"#]],
    )
    .await;

    // Lists are filtered.
    let names = |v: &Value| -> Vec<String> {
        v["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, a) = app
        .json("GET", "/v1/services", "alice-example-secret", None)
        .await;
    let (_, b) = app
        .json("GET", "/v1/services", "bob-example-secret", None)
        .await;
    assert_eq!(
        (names(&a), names(&b)),
        (
            vec!["web-a".to_owned()],
            vec!["web-a".to_owned(), "web-b".to_owned()]
        )
    );
    // Everyone with a user token sees the hosts.
    let (s, _) = app
        .json("GET", "/v1/hosts", "alice-example-secret", None)
        .await;
    assert_eq!(s, StatusCode::OK);
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn submit_errors_list_every_problem() {
    let app = app().await;
    let bad = json!({"service": {"name": "Bad_", "project": "team-a", "replicas": 0, "command": [], "slots": 3, "what": 1}});
    let toml_ok =
        "[service]\nname = \"web\"\nproject = \"team-a\"\ncommand = [\"true\"]\n".to_owned();
    let mut out = Vec::new();
    for (ctype, body) in [
        ("application/json", bad.to_string()),
        ("application/json", "{not json".to_owned()),
        ("application/toml", "[service\n".to_owned()),
        ("text/plain", "x".to_owned()),
        ("application/toml", toml_ok.clone()),
        ("application/toml", toml_ok),
    ] {
        let (s, b) = app
            .call(
                "POST",
                "/v1/services",
                Some("alice-example-secret"),
                Some((ctype, body)),
            )
            .await;
        let v: Value = serde_json::from_str(&b).unwrap();
        out.push(format!(
            "{} {}",
            s.as_u16(),
            v.get("error").unwrap_or(&v["name"])
        ));
    }
    expect![[r#"
        400 {"code":"invalid","details":[{"field":"service.what","reason":"unknown field"},{"field":"service.name","reason":"may contain only a-z, 0-9 and '-'"},{"field":"service.replicas","reason":"must be between 1 and 10000"},{"field":"service.command","reason":"must not be empty"},{"field":"service.slots","reason":"must be a table"}],"message":"invalid profile"}
        400 {"code":"invalid","details":[{"field":"profile","reason":"not valid JSON: key must be a string at line 1 column 2"}],"message":"invalid profile"}
        400 {"code":"invalid","details":[{"field":"profile","reason":"not valid TOML: unclosed table, expected `]`"}],"message":"invalid profile"}
        415 {"code":"unsupported_media_type","details":[],"message":"content type \"text/plain\" is not supported; send application/json or application/toml"}
        201 "web"
        409 {"code":"conflict","details":[],"message":"service \"web\" already exists"}"#]]
    .assert_eq(&out.join("\n"));
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn put_scale_restart_and_stop_answer_and_refuse_bad_input_whole() {
    let app = app().await;
    let web = |cmd: &str| json!({"service": {"name": "web", "project": "team-a", "replicas": 2, "command": [cmd]}});
    let bad = json!({"service": {"name": "other", "project": "team-a", "command": ["x"],
        "drain": "-1s",
        "update": {"max_surge": 0, "max_unavailable": 0, "min_ready": "2h", "deadline": "0s",
                   "auto_revert": "yes", "surge": 1}}});
    let mut out = Vec::new();
    for (method, path, body) in [
        ("PUT", "/v1/services/web", Some(web("v1"))),
        ("PUT", "/v1/services/web", Some(web("v1"))),
        ("PUT", "/v1/services/web", Some(web("v2"))),
        ("PUT", "/v1/services/web", Some(bad)),
        (
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": 0})),
        ),
        (
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": 10001})),
        ),
        (
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": "three"})),
        ),
        (
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": 3})),
        ),
        ("POST", "/v1/services/web/restart", None),
        ("POST", "/v1/services/nope/restart", None),
        ("DELETE", "/v1/services/web?now=true", None),
        ("PUT", "/v1/services/web", Some(web("v3"))),
    ] {
        let (s, v) = app.json(method, path, "alice-example-secret", body).await;
        let what = match v.get("error") {
            Some(e) => e.to_string(),
            None if v.get("rollout").is_some() => format!(
                "generation={} replicas={} rollout={}",
                v["generation"], v["replicas"], v["rollout"]["state"]
            ),
            None => v.to_string(),
        };
        out.push(format!("{method} {path} -> {} {what}", s.as_u16()));
    }
    expect![[r#"
        PUT /v1/services/web -> 201 generation=1 replicas=2 rollout="progressing"
        PUT /v1/services/web -> 200 generation=1 replicas=2 rollout="progressing"
        PUT /v1/services/web -> 200 generation=2 replicas=2 rollout="progressing"
        PUT /v1/services/web -> 400 {"code":"invalid","details":[{"field":"service.name","reason":"is \"other\", but the request is for service \"web\""},{"field":"service.drain","reason":"must not be negative"},{"field":"service.update.surge","reason":"unknown field"},{"field":"service.update","reason":"max_surge and max_unavailable must not both be 0 (a rollout could never replace a replica)"},{"field":"service.update.min_ready","reason":"must be between 0s and 1h"},{"field":"service.update.deadline","reason":"must be between 1s and 1h"},{"field":"service.update.auto_revert","reason":"must be true or false"}],"message":"invalid profile"}
        POST /v1/services/web/scale -> 400 {"code":"invalid","details":[{"field":"replicas","reason":"must be between 1 and 10000 (to stop the service, delete it)"}],"message":"invalid scale request"}
        POST /v1/services/web/scale -> 400 {"code":"invalid","details":[{"field":"replicas","reason":"must be between 1 and 10000 (to stop the service, delete it)"}],"message":"invalid scale request"}
        POST /v1/services/web/scale -> 400 {"code":"invalid","details":[{"field":"replicas","reason":"send {\"replicas\": N} with N between 1 and 10000 (invalid type: string \"three\", expected i64 at line 1 column 19)"}],"message":"invalid scale request"}
        POST /v1/services/web/scale -> 200 generation=2 replicas=3 rollout="progressing"
        POST /v1/services/web/restart -> 200 generation=3 replicas=3 rollout="progressing"
        POST /v1/services/nope/restart -> 404 {"code":"not_found","details":[],"message":"service \"nope\" not found"}
        DELETE /v1/services/web?now=true -> 202 {"name":"web","stopping":0}
        PUT /v1/services/web -> 201 generation=1 replicas=2 rollout="progressing""#]]
    .assert_eq(&out.join("\n"));
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn a_project_at_its_quota_is_refused_while_another_still_places() {
    let quotas = quota::Quotas::parse(
        &json!({"default": {"replicas": 3, "slots": 3}, "team-b": {"services": 1}}),
        &["slots"],
    )
    .unwrap();
    let cfg = ControllerConfig {
        quotas,
        ..ControllerConfig::default()
    };
    let app = app_with(cfg, Arc::new(MemStore::new()), SharedSlots::new()).await;
    app.register("exec-01", "w1-example-secret", 10).await;
    let svc = |name: &str, project: &str, replicas: u32| {
        json!({"service": {"name": name, "project": project, "replicas": replicas,
                           "command": ["sleep", "1000"]}})
    };
    let mut out = Vec::new();
    for (who, method, path, body) in [
        (
            "alice-example-secret",
            "POST",
            "/v1/services",
            Some(svc("a1", "team-a", 2)),
        ),
        (
            "alice-example-secret",
            "POST",
            "/v1/services",
            Some(svc("a2", "team-a", 2)),
        ),
        (
            "alice-example-secret",
            "POST",
            "/v1/services/a1/scale",
            Some(json!({"replicas": 4})),
        ),
        (
            "alice-example-secret",
            "PUT",
            "/v1/services/a2",
            Some(svc("a2", "team-a", 1)),
        ),
        (
            "alice-example-secret",
            "POST",
            "/v1/services/a1/scale",
            Some(json!({"replicas": 1})),
        ),
        (
            "bob-example-secret",
            "POST",
            "/v1/services",
            Some(svc("b1", "team-b", 5)),
        ),
        (
            "bob-example-secret",
            "POST",
            "/v1/services",
            Some(svc("b2", "team-b", 1)),
        ),
    ] {
        let (s, v) = app.json(method, path, who, body).await;
        let what = match v.get("error") {
            Some(e) => e.to_string(),
            None => format!(
                "{} ready-or-placed={}",
                v["name"],
                v["jobs"].as_array().map_or(0, Vec::len)
            ),
        };
        out.push(format!("{method} {path} -> {} {what}", s.as_u16()));
    }
    expect![[r#"
        POST /v1/services -> 201 "a1" ready-or-placed=2
        POST /v1/services -> 403 {"code":"quota_exceeded","details":[{"field":"quotas.team-a.replicas","reason":"limit 3, in use 2, this change needs 4"}],"message":"project \"team-a\" would use 4 replicas of its quota of 3 (2 in use)"}
        POST /v1/services/a1/scale -> 403 {"code":"quota_exceeded","details":[{"field":"quotas.team-a.replicas","reason":"limit 3, in use 2, this change needs 4"}],"message":"project \"team-a\" would use 4 replicas of its quota of 3 (2 in use)"}
        PUT /v1/services/a2 -> 201 "a2" ready-or-placed=1
        POST /v1/services/a1/scale -> 200 "a1" ready-or-placed=2
        POST /v1/services -> 201 "b1" ready-or-placed=5
        POST /v1/services -> 403 {"code":"quota_exceeded","details":[{"field":"quotas.team-b.services","reason":"limit 1, in use 1, this change needs 2"}],"message":"project \"team-b\" would use 2 services of its quota of 1 (1 in use)"}"#]]
    .assert_eq(&out.join("\n"));
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn a_worker_cannot_advertise_another_live_hosts_address() {
    let app = app().await;
    app.register("exec-01", "w1-example-secret", 2).await;
    app.register("exec-02", "w2-example-secret", 2).await;
    // exec-01's credential reports exec-02's address.
    let stolen = serde_json::to_value(facts_at("127.0.0.12", 2)).unwrap();
    let (s, v) = app
        .json(
            "PUT",
            "/internal/v1/hosts/exec-01/facts",
            "w1-example-secret",
            Some(stolen),
        )
        .await;
    let (_, hosts) = app
        .json("GET", "/v1/hosts", "admin-example-secret", None)
        .await;
    let ips: Vec<&Value> = hosts["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| &h["ip_addr"])
        .collect();
    expect![[r#"
        409 {"code":"address_in_use","details":[{"field":"ip_addr","reason":"address 127.0.0.12 is advertised by live host exec-02"}],"message":"host facts refused"}
        [String("127.0.0.11"), String("127.0.0.12")]"#]]
    .assert_eq(&format!("{} {}\n{ips:?}", s.as_u16(), v["error"]));
    // A registration with it is refused the same way.
    let req = RegisterRequest {
        facts: facts_at("127.0.0.11", 2),
        running: vec![],
    };
    let (s, _) = app
        .json(
            "POST",
            "/internal/v1/hosts/exec-02/register",
            "w2-example-secret",
            Some(serde_json::to_value(req).unwrap()),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn oversized_bodies_answer_413_in_the_error_shape() {
    let cfg = ControllerConfig {
        body_limit: 64,
        ..ControllerConfig::default()
    };
    let app = app_with(cfg, Arc::new(MemStore::new()), SharedSlots::new()).await;
    let big = web("web", "team-a", 1).to_string() + &" ".repeat(100);
    let (s, b) = app
        .call(
            "POST",
            "/v1/services",
            Some("alice-example-secret"),
            Some(("application/json", big)),
        )
        .await;
    expect![[r#"413 {"error":{"code":"too_large","details":[],"message":"request body is larger than the limit of 64 bytes"}}"#]]
        .assert_eq(&format!("{} {b}", s.as_u16()));
    app.ctl.shutdown().await;
}

/// Two hosts (2 and 1 slots), `web` of 4 replicas submitted (3 placed), and `j-1`
/// reported started and ready. Returns the submit's answer.
async fn web_of_4_on_2_hosts_one_ready(app: &App) -> Value {
    app.register("exec-01", "w1-example-secret", 2).await;
    app.register("exec-02", "w2-example-secret", 1).await;
    let (s, created) = app
        .submit("admin-example-secret", web("web", "default", 4))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let body = json!([{"event": "started", "job": "j-1", "pid": 9}, {"event": "readiness", "job": "j-1", "ready": true}]);
    let (s, _) = app
        .json(
            "POST",
            "/internal/v1/hosts/exec-01/events",
            "w1-example-secret",
            Some(body),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    created
}

#[tokio::test]
async fn service_and_host_answers_have_the_rest_shapes() {
    let app = app().await;
    let created = web_of_4_on_2_hosts_one_ready(&app).await;
    let (_, detail) = app
        .json("GET", "/v1/services/web", "admin-example-secret", None)
        .await;
    let (_, list) = app
        .json("GET", "/v1/services", "admin-example-secret", None)
        .await;
    let (_, hosts) = app
        .json("GET", "/v1/hosts", "admin-example-secret", None)
        .await;
    let (_, metrics) = app.call("GET", "/metrics", None, None).await;
    let mut metrics: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("xce_jobs{")
                || l.starts_with("test_")
                || l.starts_with("xce_pending")
                || l.starts_with("xce_placements")
        })
        .collect();
    // Label sets of a family come out in hash order.
    metrics.sort_unstable();
    expect![[r#"
        {"generation":1,"index":6,"jobs":[{"generation":1,"host":"exec-01","job":"j-1","log":null,"ready":false,"replica":0,"slots":{"slot":0},"state":"placed"},{"generation":1,"host":"exec-02","job":"j-2","log":null,"ready":false,"replica":1,"slots":{"slot":0},"state":"placed"},{"generation":1,"host":"exec-01","job":"j-3","log":null,"ready":false,"replica":2,"slots":{"slot":1},"state":"placed"}],"name":"web","pending":[{"reason":"slots is full on all 2 hosts (exec-01, exec-02)","replica":3}],"profile":{"command":["sleep","1000"],"name":"web","project":"default","replicas":4},"project":"default","replica_status":[{"last_exit":null,"log":null,"log_host":null,"replica":0,"restarts":0},{"last_exit":null,"log":null,"log_host":null,"replica":1,"restarts":0},{"last_exit":null,"log":null,"log_host":null,"replica":2,"restarts":0},{"last_exit":null,"log":null,"log_host":null,"replica":3,"restarts":0}],"replicas":4,"rollout":{"generation":1,"outdated":0,"ready":0,"reason":null,"state":"progressing","updated":3},"state":"active"}
        {"generation":1,"index":8,"jobs":[{"generation":1,"host":"exec-01","job":"j-1","log":null,"ready":true,"replica":0,"slots":{"slot":0},"state":"running"},{"generation":1,"host":"exec-02","job":"j-2","log":null,"ready":false,"replica":1,"slots":{"slot":0},"state":"placed"},{"generation":1,"host":"exec-01","job":"j-3","log":null,"ready":false,"replica":2,"slots":{"slot":1},"state":"placed"}],"name":"web","pending":[{"reason":"slots is full on all 2 hosts (exec-01, exec-02)","replica":3}],"profile":{"command":["sleep","1000"],"name":"web","project":"default","replicas":4},"project":"default","replica_status":[{"last_exit":null,"log":null,"log_host":null,"replica":0,"restarts":0},{"last_exit":null,"log":null,"log_host":null,"replica":1,"restarts":0},{"last_exit":null,"log":null,"log_host":null,"replica":2,"restarts":0},{"last_exit":null,"log":null,"log_host":null,"replica":3,"restarts":0}],"replicas":4,"rollout":{"generation":1,"outdated":0,"ready":1,"reason":null,"state":"progressing","updated":3},"state":"active"}
        {"services":[{"generation":1,"index":8,"name":"web","pending":1,"pending_reason":"slots is full on all 2 hosts (exec-01, exec-02)","project":"default","ready":1,"replicas":4,"rollout":"progressing","running":1,"state":"active"}]}
        {"cluster":"c1c1c1c1c1c1c1c1","hosts":[{"addresses":[{"interface":"lo","ip":"127.0.0.11"}],"id":"exec-01","ip_addr":"127.0.0.11","jobs":2,"slots":{"capacity":2,"used":2},"state":"ready"},{"addresses":[{"interface":"lo","ip":"127.0.0.12"}],"id":"exec-02","ip_addr":"127.0.0.12","jobs":1,"slots":{"capacity":1,"used":1},"state":"ready"}]}
        test_ext_total 1
        test_slots 42
        xce_jobs{state="draining"} 0
        xce_jobs{state="placed"} 2
        xce_jobs{state="running"} 1
        xce_jobs{state="stopping"} 0
        xce_jobs{state="unknown"} 0
        xce_pending_replicas 1
        xce_placements_total 3"#]]
    .assert_eq(&format!("{created}\n{detail}\n{list}\n{hosts}\n{}", metrics.join("\n")));
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn two_projects_each_have_a_web_and_nobody_learns_of_the_other() {
    let app = app().await;
    app.register("exec-01", "w1-example-secret", 10).await;
    let web = |project: &str| {
        json!({"service": {"name": "web", "project": project, "replicas": 1,
                           "command": ["sleep", "1000"]}})
    };
    // What alice sees before bob's web exists, to compare bytes with after.
    let (_, before) = app
        .call(
            "GET",
            "/v1/services/nope",
            Some("alice-example-secret"),
            None,
        )
        .await;
    let mut out = Vec::new();
    for (who, method, path, body) in [
        (
            "alice-example-secret",
            "POST",
            "/v1/services",
            Some(web("team-a")),
        ),
        (
            "bob-example-secret",
            "POST",
            "/v1/services",
            Some(web("team-b")),
        ),
        (
            "bob-example-secret",
            "PUT",
            "/v1/services/web",
            Some(web("team-b")),
        ),
        ("alice-example-secret", "GET", "/v1/services/web", None),
        (
            "alice-example-secret",
            "GET",
            "/v1/services/web?project=team-b",
            None,
        ),
        ("bob-example-secret", "GET", "/v1/services/web", None),
        (
            "bob-example-secret",
            "GET",
            "/v1/services/web?project=team-b",
            None,
        ),
        (
            "bob-example-secret",
            "POST",
            "/v1/services/web/restart",
            None,
        ),
        (
            "bob-example-secret",
            "POST",
            "/v1/services/web/restart?project=team-a",
            None,
        ),
        (
            "bob-example-secret",
            "DELETE",
            "/v1/services/web?project=team-b&now=true",
            None,
        ),
        (
            "alice-example-secret",
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": 2})),
        ),
    ] {
        let (s, v) = app.json(method, path, who, body).await;
        let what = match v.get("error") {
            Some(e) => e.to_string(),
            None if v.get("project").is_some() => format!(
                "{}/{} replicas={} generation={}",
                v["project"].as_str().unwrap(),
                v["name"].as_str().unwrap(),
                v["replicas"],
                v["generation"]
            ),
            None => v.to_string(),
        };
        out.push(format!(
            "{} {method} {path} -> {} {what}",
            who.trim_end_matches("-example-secret"),
            s.as_u16()
        ));
    }
    expect![[r#"
        alice POST /v1/services -> 201 team-a/web replicas=1 generation=1
        bob POST /v1/services -> 201 team-b/web replicas=1 generation=1
        bob PUT /v1/services/web -> 200 team-b/web replicas=1 generation=1
        alice GET /v1/services/web -> 200 team-a/web replicas=1 generation=1
        alice GET /v1/services/web?project=team-b -> 404 {"code":"not_found","details":[],"message":"service \"web\" not found"}
        bob GET /v1/services/web -> 409 {"code":"ambiguous","details":[{"field":"project","reason":"\"team-a\" has a service \"web\""},{"field":"project","reason":"\"team-b\" has a service \"web\""}],"message":"service \"web\" exists in several of your projects (team-a, team-b); pick one with ?project="}
        bob GET /v1/services/web?project=team-b -> 200 team-b/web replicas=1 generation=1
        bob POST /v1/services/web/restart -> 409 {"code":"ambiguous","details":[{"field":"project","reason":"\"team-a\" has a service \"web\""},{"field":"project","reason":"\"team-b\" has a service \"web\""}],"message":"service \"web\" exists in several of your projects (team-a, team-b); pick one with ?project="}
        bob POST /v1/services/web/restart?project=team-a -> 403 {"code":"forbidden","details":[],"message":"no job.submit permission on project \"team-a\""}
        bob DELETE /v1/services/web?project=team-b&now=true -> 202 {"name":"web","stopping":1}
        alice POST /v1/services/web/scale -> 200 team-a/web replicas=2 generation=1"#]]
    .assert_eq(&out.join("\n"));
    // A project alice cannot view answers exactly as a name nobody uses.
    let (_, invisible) = app
        .call(
            "GET",
            "/v1/services/nope?project=team-b",
            Some("alice-example-secret"),
            None,
        )
        .await;
    assert_eq!(invisible, before);
    app.ctl.shutdown().await;
}

#[test]
fn service_records_stored_by_name_alone_move_to_project_keys() {
    let store = Arc::new(MemStore::new());
    let rec = json!({"info": {"name": "web", "project": "team-a", "replicas": 1,
                              "profile": {"name": "web", "project": "team-a", "command": ["x"]},
                              "rev": 1},
                     "state": "active"});
    let mut b = xce_store::Batch::default();
    b.put(
        xce_store::Key::new("service", "web"),
        serde_json::to_vec(&rec).unwrap(),
    );
    store.commit(b).unwrap();
    let sim = Sim::load(store.clone(), Instant::now());
    let keys: Vec<String> = store
        .load_all()
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.ns == "service")
        .map(|(k, _)| k.key)
        .collect();
    assert_eq!(keys, vec!["team-a/web".to_owned()]);
    let v = sim.core.view();
    let s = &v.borrow().services[&ServiceKey::new("team-a", "web")];
    assert_eq!((s.info.generation, s.info.rev), (1, 1));
}

#[tokio::test]
async fn restart_on_redb_hands_nothing_out_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let slots = SharedSlots::new();
    let store: Arc<dyn Store> = Arc::new(xce_store::RedbStore::open(&path).unwrap());
    let app = app_with(ControllerConfig::default(), store, slots.clone()).await;
    app.register("exec-01", "w1-example-secret", 3).await;
    let (_, a) = app
        .submit("admin-example-secret", web("web", "default", 2))
        .await;
    let App {
        ctl, app: router, ..
    } = app;
    drop(router);
    ctl.shutdown().await;
    let first = slots.take_log();

    let slots2 = SharedSlots::new();
    let store: Arc<dyn Store> = Arc::new(xce_store::RedbStore::open(&path).unwrap());
    let app = app_with(ControllerConfig::default(), store, slots2.clone()).await;
    let restored = slots2.take_log();
    let (_, b) = app
        .submit("admin-example-secret", web("api", "default", 1))
        .await;
    let (_, w) = app
        .json("GET", "/v1/services/web", "admin-example-secret", None)
        .await;
    expect![[r#"
        before: ["reserve exec-01 j-1 0", "reserve exec-01 j-2 1"] index 4
        restored: ["restore exec-01 j-1 0", "restore exec-01 j-2 1"]
        after: ["reserve exec-01 j-3 2"] index 6, web index 4
        used: ["exec-01:0=j-1", "exec-01:1=j-2", "exec-01:2=j-3"]"#]]
    .assert_eq(&format!(
        "before: {first:?} index {}\nrestored: {restored:?}\nafter: {:?} index {}, web index {}\nused: {:?}",
        a["index"],
        slots2.take_log(),
        b["index"],
        w["index"],
        slots2.used()
    ));
    app.ctl.shutdown().await;
}

// === one real socket: a fake worker over HTTP ===

#[tokio::test]
async fn fake_worker_over_http_sees_assignments_and_replacements() {
    let slots = SharedSlots::new();
    let plugins = ControllerPlugins {
        resources: vec![Box::new(slots.clone())],
        facts_policies: vec![Arc::new(Policy)],
        listeners: vec![],
        extensions: vec![],
    };
    let cfg = ControllerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..ControllerConfig::default()
    };
    let run = start(
        cfg,
        Tokens::parse(TOKENS).unwrap(),
        plugins,
        Arc::new(MemStore::new()),
    )
    .await
    .unwrap();
    let base = format!("http://{}", run.addr);
    let http = reqwest::Client::new();
    let bounded = Duration::from_secs(20);
    let worker = |m: reqwest::Method, p: &str| {
        http.request(m, format!("{base}/internal/v1/hosts/exec-01/{p}"))
            .bearer_auth("w1-example-secret")
    };

    let r = worker(reqwest::Method::POST, "register")
        .json(&RegisterRequest {
            facts: facts(2),
            running: vec![],
        })
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<xce_proto::worker::RegisterResponse>()
            .await
            .unwrap()
            .heartbeat_ms,
        1000
    );

    // Nothing assigned yet: the blocking query waits for the submit.
    let (_, index0) = get_assignments(&worker, 0).await;
    let waiter = {
        let w = worker(
            reqwest::Method::GET,
            &format!("assignments?index={index0}&wait=15s"),
        );
        tokio::spawn(async move { w.send().await.unwrap().json::<Assignments>().await.unwrap() })
    };
    let r = http
        .post(format!("{base}/v1/services"))
        .bearer_auth("alice-example-secret")
        .header("content-type", "application/toml")
        .body("[service]\nname = \"web\"\nproject = \"team-a\"\ncommand = [\"sleep\", \"100\"]\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let a = tokio::time::timeout(bounded, waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(a.index > index0);
    let jobs: Vec<(&str, u32, xce_proto::worker::Desired)> = a
        .jobs
        .iter()
        .map(|j| (j.job.as_str(), j.replica, j.desired))
        .collect();
    assert_eq!(jobs, vec![("j-1", 0, xce_proto::worker::Desired::Run)]);
    assert_eq!(*a.jobs[0].command, vec!["sleep", "100"]);
    assert_eq!(a.jobs[0].grants["slots"], json!(0));

    let events = vec![started("j-1"), ready("j-1", true)];
    let r = worker(reqwest::Method::POST, "events")
        .json(&events)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let detail: Value = http
        .get(format!("{base}/v1/services/web"))
        .bearer_auth("alice-example-secret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            detail["jobs"][0]["state"].as_str(),
            detail["jobs"][0]["ready"].as_bool()
        ),
        (Some("running"), Some(true))
    );

    // The replica exits; after its backoff a replacement appears in the assignments.
    let r = worker(reqwest::Method::POST, "events")
        .json(&vec![exited("j-1")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let replacement = tokio::time::timeout(bounded, async {
        let mut index = a.index;
        loop {
            let (a, i) = get_assignments(&worker, index).await;
            if let Some(j) = a.jobs.first() {
                break j.clone();
            }
            index = i;
        }
    })
    .await
    .unwrap();
    assert_eq!((replacement.job.as_str(), replacement.replica), ("j-2", 0));
    assert_eq!(slots.used(), vec!["exec-01:0=j-2"]);
    tokio::time::timeout(bounded, run.shutdown()).await.unwrap();
}

async fn get_assignments(
    worker: &impl Fn(reqwest::Method, &str) -> reqwest::RequestBuilder,
    index: u64,
) -> (Assignments, u64) {
    let r = worker(
        reqwest::Method::GET,
        &format!("assignments?index={index}&wait=10s"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let a: Assignments = r.json().await.unwrap();
    let i = a.index;
    (a, i)
}

// === config ===

#[test]
fn config_timing_rules() {
    let check = |f: fn(&mut ControllerConfig), expect: Expect| {
        let mut cfg = ControllerConfig::default();
        f(&mut cfg);
        let out = match cfg.validate() {
            Ok(()) => "ok".to_owned(),
            Err(e) => e.to_string(),
        };
        expect.assert_eq(&out);
    };
    check(|_| {}, expect!["ok"]);
    check(
        |c| c.grace_period = c.unreachable_after,
        expect!["grace_period (3s) must be longer than unreachable_after (3s)"],
    );
    check(
        |c| c.heartbeat_interval = Duration::from_secs(5),
        expect!["heartbeat_interval (5s) must be shorter than unreachable_after (3s)"],
    );
    check(
        |c| c.body_limit = 0,
        expect!["body_limit must be greater than zero"],
    );
}

#[test]
fn disruption_threshold_is_a_share_above_zero_up_to_one() {
    let out: Vec<String> = [0.55, 1.0, 0.0, -0.5, 1.5, f64::NAN]
        .into_iter()
        .map(|x| match DisruptionThreshold::try_new(x) {
            Ok(t) => format!("{x}: ok {}", t.get()),
            Err(e) => format!("{x}: {e}"),
        })
        .collect();
    expect![[r#"
        0.55: ok 0.55
        1: ok 1
        0: disruption_threshold (0) must be more than 0 and at most 1 (1 turns the full-disruption rule off)
        -0.5: disruption_threshold (-0.5) must be more than 0 and at most 1 (1 turns the full-disruption rule off)
        1.5: disruption_threshold (1.5) must be more than 0 and at most 1 (1 turns the full-disruption rule off)
        NaN: disruption_threshold (NaN) must be more than 0 and at most 1 (1 turns the full-disruption rule off)"#]]
    .assert_eq(&out.join("\n"));
    // (unreachable, hosts) → full disruption? With the default, and with the rule off.
    let t = DisruptionThreshold::DEFAULT;
    let off = DisruptionThreshold::try_new(1.0).unwrap();
    let cases = [
        (1, 1),
        (1, 2),
        (2, 2),
        (2, 3),
        (1, 3),
        (2, 4),
        (3, 5),
        (5, 9),
        (5, 10),
    ];
    let out: Vec<String> = cases
        .iter()
        .map(|&(u, n)| {
            format!(
                "{u}/{n}: {} {}",
                t.is_full_disruption(u, n),
                off.is_full_disruption(u, n)
            )
        })
        .collect();
    expect![[r#"
        1/1: false false
        1/2: false false
        2/2: true false
        2/3: true false
        1/3: false false
        2/4: false false
        3/5: true false
        5/9: true false
        5/10: false false"#]]
    .assert_eq(&out.join("\n"));
}

#[test]
fn open_store_creates_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ControllerConfig {
        data_dir: dir.path().join("a/b"),
        ..ControllerConfig::default()
    };
    let store = open_store(&cfg).unwrap();
    assert!(store.load_all().unwrap().is_empty());
    assert!(cfg.store_path().exists());
}

/// A reload that removes a worker's credential and a user's token ends their blocking
/// queries (assignments, a service's detail) at once with 401 `bearer token revoked`;
/// another user's goes on and answers the next change.
#[tokio::test]
async fn revoked_credentials_end_their_blocking_queries() {
    let app = app().await;
    app.register("exec-01", "w1-example-secret", 4).await;
    let (s, _) = app
        .submit("alice-example-secret", web("web", "team-a", 1))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (_, a) = app
        .json(
            "GET",
            "/internal/v1/hosts/exec-01/assignments?index=0",
            "w1-example-secret",
            None,
        )
        .await;
    let host_index = a["index"].as_u64().unwrap();
    let (_, d) = app
        .json("GET", "/v1/services/web", "alice-example-secret", None)
        .await;
    let rev = d["index"].as_u64().unwrap();
    let parked = |path: String, who: &'static str| {
        let app = app.app.clone();
        let req = Request::get(path)
            .header("authorization", format!("Bearer {who}"))
            .body(Body::empty())
            .unwrap();
        tokio::spawn(async move {
            let resp = app.oneshot(req).await.unwrap();
            let status = resp.status().as_u16();
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap();
            format!("{status} {}", String::from_utf8_lossy(&body))
        })
    };
    let worker = parked(
        format!("/internal/v1/hosts/exec-01/assignments?index={host_index}&wait=60s"),
        "w1-example-secret",
    );
    let alice = parked(
        format!("/v1/services/web?index={rev}&wait=60s"),
        "alice-example-secret",
    );
    let bob = parked(
        format!("/v1/services/web?project=team-a&index={rev}&wait=60s"),
        "bob-example-secret",
    );
    // Let the three reach their wait. The runtime has one thread and nothing here does
    // I/O, so each yield runs every ready task a step: no clock involved. A query that
    // had not parked yet would be refused at authentication ("invalid bearer token"),
    // not end as revoked, so the expectation below tells.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let without = TOKENS
        .replace(
            "[[token]]\nsecret = \"alice-example-secret\"",
            "[[token]]\nsecret = \"alice-gone-example-secret\"",
        )
        .replace(
            "secret = \"w1-example-secret\"",
            "secret = \"w1-gone-example-secret\"",
        );
    let done = app.keyring.replace(Tokens::parse(&without).unwrap());
    assert_eq!((done.added, done.removed), (2, 2));
    let worker = worker.await.unwrap();
    let alice = alice.await.unwrap();
    assert!(!bob.is_finished());
    let (s, _) = app
        .json(
            "POST",
            "/v1/services/web/scale",
            "admin-example-secret",
            Some(json!({"replicas": 2})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let bob = bob.await.unwrap();
    let bob_index =
        serde_json::from_str::<Value>(bob.split_once(' ').unwrap().1).unwrap()["index"].as_u64();
    expect![[r#"
        worker: 401 {"error":{"code":"unauthenticated","details":[],"message":"bearer token revoked"}}
        alice: 401 {"error":{"code":"unauthenticated","details":[],"message":"bearer token revoked"}}
        bob: 200 index>3: true
    "#]].assert_eq(&format!(
        "worker: {worker}\nalice: {alice}\nbob: {} index>{rev}: {}\n",
        &bob[..3],
        bob_index.is_some_and(|i| i > rev)
    ));
}

#[tokio::test]
async fn worker_routes_refuse_bad_facts_and_blocking_queries_end() {
    let app = app().await;
    // Registration with facts the policy refuses: 400 with every problem, nothing kept.
    let bad = json!({"facts": {"ip_addr": "0.0.0.0"}, "running": []});
    let (s, b) = app
        .json(
            "POST",
            "/internal/v1/hosts/exec-01/register",
            "w1-example-secret",
            Some(bad),
        )
        .await;
    expect![[r#"400 {"error":{"code":"invalid","details":[{"field":"ip_addr","reason":"must not be unspecified"},{"field":"sections.slots","reason":"missing"}],"message":"host facts refused"}}"#]]
        .assert_eq(&format!("{} {b}", s.as_u16()));
    let (s, _) = app
        .json(
            "GET",
            "/internal/v1/hosts/exec-01/assignments",
            "w1-example-secret",
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    app.register("exec-01", "w1-example-secret", 1).await;
    let (s, b) = app
        .json(
            "PUT",
            "/internal/v1/hosts/exec-01/facts",
            "w1-example-secret",
            Some(json!({"nope": 1})),
        )
        .await;
    assert_eq!(
        (s, &b["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("invalid"))
    );

    // Index 0 answers at once; the current index waits until `wait` runs out and answers
    // unchanged; a pending query ends when the controller shuts down.
    let (_, a) = app
        .json(
            "GET",
            "/internal/v1/hosts/exec-01/assignments?index=0",
            "w1-example-secret",
            None,
        )
        .await;
    let index = a["index"].as_u64().unwrap();
    assert!(index >= 1);
    let (s, a) = app
        .json(
            "GET",
            &format!("/internal/v1/hosts/exec-01/assignments?index={index}&wait=50ms"),
            "w1-example-secret",
            None,
        )
        .await;
    assert_eq!((s, a["index"].as_u64()), (StatusCode::OK, Some(index)));
    let (s, b) = app
        .json(
            "GET",
            "/internal/v1/hosts/exec-01/assignments?wait=soon",
            "w1-example-secret",
            None,
        )
        .await;
    assert_eq!(
        (s, &b["error"]["details"][0]["field"]),
        (StatusCode::BAD_REQUEST, &json!("wait"))
    );
    let pending = {
        let router = app.app.clone();
        let req = Request::get(format!(
            "/internal/v1/hosts/exec-01/assignments?index={index}&wait=10m"
        ))
        .header("authorization", "Bearer w1-example-secret")
        .body(Body::empty())
        .unwrap();
        tokio::spawn(async move { router.oneshot(req).await.unwrap().status() })
    };
    tokio::task::yield_now().await;
    app.ctl.shutdown().await;
    let status = tokio::time::timeout(testkit::patience(), pending)
        .await
        .unwrap()
        .unwrap();
    assert!(
        status == StatusCode::OK || status == StatusCode::SERVICE_UNAVAILABLE,
        "{status}"
    );
}

/// A store that says, from some point on, that it changed under the controller.
use xce_store::{Batch, Key, StoreError};

struct StaleAfter {
    inner: MemStore,
    stale: std::sync::atomic::AtomicBool,
}

impl Store for StaleAfter {
    fn load_all(&self) -> Result<Vec<(Key, Vec<u8>)>, StoreError> {
        self.inner.load_all()
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        if self.stale.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Stale("another writer moved the fence".into()));
        }
        self.inner.commit(batch)
    }
    fn put_if_absent(&self, key: Key, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        self.inner.put_if_absent(key, value)
    }
}

/// A controller whose store says its view is stale stops itself (fail-stop) and says
/// why, instead of running on refusing every change; its API answers 503 from then on.
#[tokio::test]
async fn a_stale_store_stops_the_controller() {
    let store = Arc::new(StaleAfter {
        inner: MemStore::new(),
        stale: false.into(),
    });
    let app = app_with(
        ControllerConfig::default(),
        store.clone(),
        SharedSlots::new(),
    )
    .await;
    app.register("exec-01", "w1-example-secret", 2).await;
    store.stale.store(true, std::sync::atomic::Ordering::SeqCst);
    let (s, _) = app
        .submit("admin-example-secret", web("web", "default", 1))
        .await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "not persisted");
    let reason = tokio::time::timeout(testkit::patience(), app.ctl.failed())
        .await
        .expect("the controller reports that it stopped");
    assert_eq!(
        reason,
        "the store changed under this controller: another writer moved the fence"
    );
    let (s, _) = app
        .json("GET", "/v1/services", "admin-example-secret", None)
        .await;
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "no answers from a stale view"
    );
}

#[tokio::test]
async fn a_full_disk_answers_507_and_stops_the_controller() {
    let store = Arc::new(MemStore::new());
    let app = app_with(
        ControllerConfig::default(),
        store.clone(),
        SharedSlots::new(),
    )
    .await;
    app.register("exec-01", "w1-example-secret", 2).await;
    let (s, _) = app.call("GET", "/healthz", None, None).await;
    assert_eq!(s, StatusCode::OK);
    store.fail_every_commit_with(xce_store::StoreError::Io {
        no_space: true,
        message: "No space left on device (os error 28)".into(),
    });
    let (s, v) = app
        .submit("admin-example-secret", web("web", "default", 1))
        .await;
    assert_eq!(s, StatusCode::INSUFFICIENT_STORAGE, "{v}");
    assert_eq!(v["error"]["code"], "insufficient_storage");
    let reason = tokio::time::timeout(testkit::patience(), app.ctl.failed())
        .await
        .expect("the controller reports that it stopped");
    assert_eq!(
        reason,
        "store I/O error (no space left on device): No space left on device (os error 28)"
    );
    let (s, _) = app.call("GET", "/healthz", None, None).await;
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "healthz says it cannot commit"
    );
    // Nothing acknowledged was lost: the store has no trace of the refused service.
    let services = store
        .load_all()
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.ns == "service")
        .count();
    assert_eq!(services, 0);
}

// === property: the rollout through the whole core ===

#[derive(Debug, Clone)]
enum Step {
    Put(u8),
    Scale(u32),
    Restart,
    Start(usize),
    Ready(usize, bool),
    Exit(usize),
    Pass(u64),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        1 => (0u8..4).prop_map(Step::Put),
        1 => (1u32..5).prop_map(Step::Scale),
        1 => Just(Step::Restart),
        4 => any::<usize>().prop_map(Step::Start),
        4 => (any::<usize>(), proptest::bool::weighted(0.8)).prop_map(|(i, r)| Step::Ready(i, r)),
        2 => any::<usize>().prop_map(Step::Exit),
        3 => (1u64..3).prop_map(Step::Pass),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Random interleavings of new profiles, scales, restarts, worker starts, readiness
    /// and exits, and time, through the real core: a job that ran gets SIGTERM
    /// (`Stopping`) only after it was `Draining` for the service's whole `drain`; a
    /// draining job never serves again; no slot grant is held twice (the plugin refuses
    /// that); and once workers behave, the service settles complete.
    #[test]
    fn drain_always_precedes_stop_through_the_core(steps in proptest::collection::vec(step(), 1..60)) {
        const DRAIN: Duration = Duration::from_secs(2);
        let key = ServiceKey::new("default", "web");
        let mut sim = Sim::new();
        let hosts = ["exec-01", "exec-02", "exec-03"];
        sim.register_all(&hosts, 6);
        sim.put(versioned(3, "v0"));
        let mut ran: BTreeSet<JobId> = BTreeSet::new();
        let mut draining_since: BTreeMap<JobId, Instant> = BTreeMap::new();
        let mut stopped: BTreeSet<JobId> = BTreeSet::new();
        let mut check = |sim: &mut Sim| -> Result<(), proptest::test_runner::TestCaseError> {
            for e in sim.raw.take() {
                if let ClusterEvent::Job { job, .. } = e {
                    match job.state {
                        JobState::Running if job.ready || ran.contains(&job.job) => {
                            proptest::prop_assert!(!draining_since.contains_key(&job.job) && !stopped.contains(&job.job),
                                "{} serves again after it left", job.job);
                            ran.insert(job.job.clone());
                        }
                        JobState::Running => { ran.insert(job.job.clone()); }
                        JobState::Draining => {
                            draining_since.entry(job.job.clone()).or_insert(sim.now);
                        }
                        JobState::Stopping => {
                            if ran.contains(&job.job) {
                                let since = draining_since.get(&job.job);
                                proptest::prop_assert!(since.is_some(), "{} stopped without draining", job.job);
                                let drained = sim.now - *since.unwrap();
                                proptest::prop_assert!(drained >= DRAIN, "{} drained {drained:?} only", job.job);
                            }
                            stopped.insert(job.job.clone());
                        }
                        _ => {}
                    }
                }
            }
            Ok(())
        };
        let jobs = |sim: &Sim| -> Vec<(JobId, HostId, JobState, bool)> {
            let v = sim.core.view();
            let v = v.borrow();
            v.services.get(&key).map(|s| s.jobs.iter().map(|j| (j.info.job.clone(), j.info.host.clone(), j.info.state, j.info.ready)).collect()).unwrap_or_default()
        };
        check(&mut sim)?;
        for st in steps {
            let js = jobs(&sim);
            let pick = |i: usize| (!js.is_empty()).then(|| js[i % js.len()].clone());
            match st {
                Step::Put(v) => sim.put(versioned(3, &format!("v{v}"))),
                Step::Scale(n) => {
                    let r = sim.core.scale(&key, u64::from(n), &admin(), sim.now).map(|_| ());
                    sim.settle("scale", r);
                }
                Step::Restart => {
                    let r = sim.core.restart(&key, &admin(), sim.now);
                    sim.settle("restart", r);
                }
                Step::Start(i) => if let Some((j, h, s, _)) = pick(i) {
                    if s == JobState::Placed { sim.events(&h, vec![started(&j)]); }
                },
                Step::Ready(i, r) => if let Some((j, h, _, _)) = pick(i) {
                    sim.events(&h, vec![ready(&j, r)]);
                },
                Step::Exit(i) => if let Some((j, h, _, _)) = pick(i) {
                    sim.events(&h, vec![exited(&j)]);
                },
                Step::Pass(secs) => {
                    // One second at a time, checked after each: the check stamps events
                    // with the clock it reads.
                    for _ in 1..secs {
                        sim.run_for(1, &hosts);
                        check(&mut sim)?;
                    }
                    sim.run_for(1, &hosts);
                }
            }
            check(&mut sim)?;
        }
        // Workers behave from here on: start what is placed, report ready, exit on stop.
        for _ in 0..40 {
            let js = jobs(&sim);
            for (j, h, s, r) in &js {
                match s {
                    JobState::Placed => sim.events(h, vec![started(j), ready(j, true)]),
                    JobState::Running if !r => sim.events(h, vec![ready(j, true)]),
                    JobState::Stopping => sim.events(h, vec![exited(j)]),
                    _ => {}
                }
                check(&mut sim)?;
            }
            sim.run_for(1, &hosts);
            check(&mut sim)?;
        }
        let v = sim.core.view();
        let v = v.borrow();
        let s = &v.services[&key];
        // Complete; or reverted, with the rollback itself done.
        let done = match s.rollout.state.as_str() {
            "complete" => true,
            "reverted" => s.rollout.stable.as_ref().map(|st| st.generation) == Some(s.info.generation),
            _ => false,
        };
        proptest::prop_assert!(done, "{:?}", s.rollout);
        proptest::prop_assert_eq!(s.counts.ready, s.info.replicas);
    }
}

// === host and cluster identity (issue 12, bugs 2 and 3) ===

/// Another worker instance for `host` (a second worker with the same host id).
fn duplicate() -> Caller {
    Caller {
        instance: Some("i-dup".into()),
        peer: Some("127.0.0.99".into()),
        ..Caller::default()
    }
}

impl Sim {
    /// What a refused worker request must not change: the stored records, the hosts'
    /// facts and states, the plugin's grants, the host's assignments.
    fn footprint(&mut self, host: &str) -> String {
        let view = self.core.view();
        let hosts: Vec<String> = view
            .borrow()
            .hosts
            .iter()
            .map(|h| format!("{} {:?} {:?}", h.info.id, h.info.state, h.info.facts))
            .collect();
        let assignments = self.assignments(host);
        format!(
            "store: {}\nhosts: {hosts:?}\nslots: {:?}\n{assignments}",
            xce_store::testing::dump(&*self.store),
            self.slots.used()
        )
    }

    /// Heartbeat, facts, events and an assignments query from `caller`: their errors.
    fn worker_calls_as(&mut self, caller: &Caller, host: &str) -> Vec<String> {
        let host = host.to_owned();
        let now = self.now;
        let mut out = vec![
            self.core.heartbeat(&host, caller, now).map(drop),
            self.core.facts(&host, caller, facts_of(&host, 7), now),
            self.core.events(&host, caller, vec![exited("j-1")], now),
            self.core.assignments(&host, caller).map(drop),
        ]
        .into_iter()
        .map(|r| r.err().map_or("ok".to_owned(), |e| e.to_string()))
        .collect::<Vec<_>>();
        self.core.settle(now);
        out.dedup();
        out
    }
}

#[test]
fn a_second_worker_for_a_live_host_is_refused_and_changes_nothing() {
    let mut s = Sim::new();
    s.register("exec-01", 2, &[]);
    s.submit(web("web", "default", 1));
    s.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
    let before = s.footprint("exec-01");
    // Its own facts (5 slots, another address) and nothing running: accepted, it would
    // end j-1 and change the host's capacity.
    let mut dup = RegisterRequest {
        facts: facts_at("127.0.0.77", 5),
        running: Vec::new(),
    };
    let r = s
        .core
        .register(&"exec-01".to_owned(), &duplicate(), dup.clone(), s.now);
    s.settle(
        "register exec-01 as i-dup (facts: 5 slots, 127.0.0.77)",
        r.map(drop),
    );
    let calls = s.worker_calls_as(&duplicate(), "exec-01");
    s.note(format!(
        "i-dup's heartbeat, facts, events, assignments: {calls:?}"
    ));
    assert_eq!(
        s.footprint("exec-01"),
        before,
        "a refused worker changed nothing"
    );
    // A live holder is live across a controller restart too (a fresh window for all).
    let mut s = s.restart(1);
    dup.facts = facts_of("exec-01", 2);
    let r = s
        .core
        .register(&"exec-01".to_owned(), &duplicate(), dup, s.now);
    s.settle("after a restart: register exec-01 as i-dup", r.map(drop));
    // The holder goes on as before.
    s.heartbeat("exec-01");
    let a = s.assignments("exec-01");
    s.note(a);
    s.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > submit
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          4 job j-1 web/0 exec-01 Running ready=false
          5 job j-1 web/0 exec-01 Running ready=true
          6 service web rev=6
        > register exec-01 as i-dup (facts: 5 slots, 127.0.0.77)
          error: host exec-01 is held by another live worker (instance i-exec-01); check for a second worker with the same host id
          = i-dup's heartbeat, facts, events, assignments: ["host exec-01 is held by another live worker (instance i-exec-01); check for a second worker with the same host id"]
        > load
          resync rev=6 services=1 jobs=[j-1@exec-01:Running] hosts=1
          plugin: restore exec-01 j-1 0
        > after a restart: register exec-01 as i-dup
          error: host exec-01 is held by another live worker (instance i-exec-01); check for a second worker with the same host id
        > heartbeat exec-01
          = exec-01 index=6 [j-1:Run]"#]]);
}

#[test]
fn a_new_worker_instance_takes_over_a_host_whose_worker_is_gone() {
    let mut s = Sim::new();
    s.register("exec-01", 2, &[]);
    s.submit(web("web", "default", 1));
    s.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
    // The first worker stops heartbeating (its machine was reinstalled: a new data dir,
    // a new instance); past `unreachable_after` the host is free to take over.
    s.run_for(3, &[]);
    s.register_as(&duplicate(), "exec-01", 2, &["j-1"]);
    let calls = s.worker_calls_as(&worker("exec-01"), "exec-01");
    s.note(format!("the old instance's calls: {calls:?}"));
    let r = s.core.heartbeat(&"exec-01".to_owned(), &duplicate(), s.now);
    s.settle("heartbeat exec-01 as i-dup", r);
    s.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > submit
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          4 job j-1 web/0 exec-01 Running ready=false
          5 job j-1 web/0 exec-01 Running ready=true
          6 service web rev=6
        > 3s pass, heartbeats from []
          7 job j-1 web/0 exec-01 Unknown ready=true
          8 host exec-01 Unreachable ["web"]
        > register exec-01 as i-dup running=["j-1"]
          9 job j-1 web/0 exec-01 Running ready=true
          10 host exec-01 Ready ["web"]
          = the old instance's calls: ["host exec-01 is held by another live worker (instance i-dup); check for a second worker with the same host id"]
        > heartbeat exec-01 as i-dup"#]]);
}

#[test]
fn a_worker_of_another_cluster_is_refused() {
    let mut s = Sim::new();
    let ours = s.core.cluster_id().to_owned();
    assert_eq!(ours.len(), 16, "{ours}");
    let foreign = Caller {
        instance: Some("i-exec-01".into()),
        cluster: Some("0123456789abcdef".into()),
        peer: Some("127.0.0.11".into()),
    };
    let before = xce_store::testing::dump(&*s.store);
    s.register_as(&foreign, "exec-01", 2, &["j-5"]);
    assert_eq!(xce_store::testing::dump(&*s.store), before);
    // Its own cluster's worker (and one that has not joined any yet) is welcome.
    let member = Caller {
        cluster: Some(ours.clone()),
        ..worker("exec-01")
    };
    s.register_as(&member, "exec-01", 2, &[]);
    let calls = s.worker_calls_as(&foreign, "exec-01");
    s.note(format!("the foreign worker's calls: {calls:?}"));
    // The id is the store's: the same after a restart.
    let s = s.restart(0);
    assert_eq!(s.core.cluster_id(), ours);
    expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 as i-exec-01 running=["j-5"]
          error: this controller serves cluster <cluster>, the worker belongs to cluster 0123456789abcdef
        > register exec-01 as i-exec-01 running=[]
          1 host exec-01 Ready []
          = the foreign worker's calls: ["this controller serves cluster <cluster>, the worker belongs to cluster 0123456789abcdef"]
        > load
          resync rev=1 services=0 jobs=[] hosts=1"#]].assert_eq(&s.out.join("\n").replace(&ours, "<cluster>"));
}

// === the controller README's "Numbers" ===

/// A store that counts the batches committed to it.
struct Counting {
    inner: Arc<dyn Store>,
    commits: std::sync::atomic::AtomicUsize,
    /// What it answers to `journals_events` (as etcd when true).
    journals: bool,
}

impl Counting {
    /// A core with one slots plugin on a counting `inner`.
    fn core(inner: Arc<dyn Store>, journals: bool, now: Instant) -> (Arc<Counting>, Core) {
        let store = Arc::new(Counting {
            inner,
            commits: 0.into(),
            journals,
        });
        let wiring = Wiring {
            resources: vec![Box::new(SharedSlots::new())],
            policies: vec![Arc::new(Policy)],
            listeners: vec![],
        };
        let core = Core::load(TIMING, store.clone(), wiring, Metrics::default(), now).unwrap();
        (store, core)
    }
}

impl Store for Counting {
    fn load_all(&self) -> Result<Vec<(Key, Vec<u8>)>, StoreError> {
        self.inner.load_all()
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.commits
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.commit(batch)
    }
    fn put_if_absent(&self, key: Key, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        self.inner.put_if_absent(key, value)
    }
    fn journals_events(&self) -> bool {
        self.journals
    }
}

/// Each batch carries its events (`meta/events`) only to a store others follow: an
/// embedded store has no reader for them. In the followed one they are the last batch's.
#[test]
fn only_a_followed_store_gets_the_batches_events() {
    for journals in [false, true] {
        let inner = Arc::new(MemStore::new());
        let now = Instant::now();
        let (store, mut core) = Counting::core(inner.clone(), journals, now);
        let req = RegisterRequest {
            facts: facts_of("exec-01", 10),
            running: vec![],
        };
        core.register(&"exec-01".into(), &worker("exec-01"), req, now)
            .unwrap();
        core.submit(web("web", "default", 3), None, &admin(), now)
            .unwrap();
        core.settle(now);
        let stored = inner.load_all().unwrap();
        let events = stored.iter().find(|(k, _)| *k == xce_model::events_key());
        match (journals, events) {
            (false, None) => {}
            (true, Some((_, bytes))) => {
                let last = xce_model::decode_events(bytes).unwrap();
                let placed = last
                    .iter()
                    .filter(|e| matches!(e, ClusterEvent::Job { .. }))
                    .count();
                assert_eq!(placed, 3, "the placing batch's events: {last:?}");
            }
            (j, e) => panic!("journals_events={j}: meta/events stored: {}", e.is_some()),
        }
        assert!(store.commits.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    }
}

/// A 1000-replica service on 10 hosts is placed by one scheduling pass that commits one
/// batch, not one per placement; then 10 worker event batches of 100 `Started` each are
/// settled. On both stores. The times it prints are the controller README's "Numbers"
/// (run in a release build: `cargo test --release -p xce-controller --lib
/// numbers_ -- --nocapture`); only the counts are asserted.
#[test]
fn numbers_a_thousand_replicas_are_placed_with_one_batch_per_pass() {
    let dir = tempfile::tempdir().unwrap();
    let stores: [(&str, Arc<dyn Store>); 2] = [
        ("MemStore", Arc::new(MemStore::new())),
        (
            "RedbStore",
            Arc::new(xce_store::RedbStore::open(dir.path().join("n.redb")).unwrap()),
        ),
    ];
    let hosts: Vec<String> = (1..=10).map(|i| format!("exec-{i:02}")).collect();
    for (name, inner) in stores {
        let now = Instant::now();
        let (store, mut core) = Counting::core(inner, false, now);
        for h in &hosts {
            let req = RegisterRequest {
                facts: facts_of(h, 100),
                running: vec![],
            };
            core.register(h, &worker(h), req, now).unwrap();
            core.settle(now);
        }
        let commits = || store.commits.load(std::sync::atomic::Ordering::SeqCst);
        let before = commits();
        let t = std::time::Instant::now();
        core.submit(web("web", "default", 1000), None, &admin(), now)
            .unwrap();
        core.settle(now);
        let placed_in = t.elapsed();
        let placed_commits = commits() - before;
        let jobs: Vec<(String, String)> = core.view().borrow().services
            [&ServiceKey::new("default", "web")]
            .jobs
            .iter()
            .map(|j| (j.info.host.clone(), j.info.job.clone()))
            .collect();
        assert_eq!(jobs.len(), 1000, "{name}: every replica placed");
        assert!(
            placed_commits <= 2,
            "{name}: the submit and one pass, not a batch per placement: {placed_commits}"
        );

        let t = std::time::Instant::now();
        let mut batches = 0;
        for h in &hosts {
            let events = jobs
                .iter()
                .filter(|(host, _)| host == h)
                .map(|(_, j)| started(j))
                .collect();
            core.events(h, &worker(h), events, now).unwrap();
            core.settle(now);
            batches += 1;
        }
        let events_in = t.elapsed();
        let running = core.view().borrow().services[&ServiceKey::new("default", "web")]
            .jobs
            .iter()
            .filter(|j| j.info.state == JobState::Running)
            .count();
        assert_eq!(running, 1000, "{name}: every Started applied");
        println!(
            "FIGURE {name}: {} replicas on {} hosts placed in {:.1} ms ({placed_commits} \
             commits); {batches} event batches of {} Started settled in {:.1} ms",
            jobs.len(),
            hosts.len(),
            placed_in.as_secs_f64() * 1e3,
            jobs.len() / batches,
            events_in.as_secs_f64() * 1e3,
        );
    }

    // Why one batch per pass: the same 1000 placements as 1000 redb commits, side by side
    // with one commit of all of them.
    let redb = xce_store::RedbStore::open(dir.path().join("ratio.redb")).unwrap();
    let key = |i: usize| Key {
        ns: "job".into(),
        key: format!("j-{i}"),
    };
    let value = vec![b'x'; 200];
    let t = std::time::Instant::now();
    for i in 0..1000 {
        let mut b = Batch::default();
        b.put(key(i), value.clone());
        redb.commit(b).unwrap();
    }
    let one_each = t.elapsed();
    let t = std::time::Instant::now();
    let mut b = Batch::default();
    for i in 1000..2000 {
        b.put(key(i), value.clone());
    }
    redb.commit(b).unwrap();
    let one_batch = t.elapsed();
    assert_eq!(redb.load_all().unwrap().len(), 2000);
    println!(
        "FIGURE redb: 1000 puts as 1000 commits {:.1} ms, as one commit {:.1} ms (x{:.0})",
        one_each.as_secs_f64() * 1e3,
        one_batch.as_secs_f64() * 1e3,
        one_each.as_secs_f64() / one_batch.as_secs_f64()
    );
}

mod etcd;
mod reports;
mod scale;

/// Commands queued together are applied first and answered after one settle (per
/// `COMMANDS_PER_SETTLE`): with a settle after each, placing n replicas reported by many
/// workers at once costs O(n²) and heartbeats queue behind the rebuilds. On a paused
/// clock, as the next test.
#[tokio::test(start_paused = true)]
async fn a_burst_of_queued_commands_is_answered_after_one_settle_per_batch() {
    use super::task::{self, Command, COMMANDS_PER_SETTLE};
    use tokio::sync::{mpsc, oneshot, watch};
    const BURST: usize = 300;
    let mut sim = Sim::new();
    sim.register("h1", BURST as u64, &[]);
    let metrics = sim.metrics.clone();
    let before = metrics.settles.get();
    let placed = metrics.placements.get();
    let (tx, rx) = mpsc::channel(BURST);
    let mut replies = Vec::new();
    for i in 0..BURST {
        let (reply, answer) = oneshot::channel();
        tx.send(Command::Submit {
            doc: web(&format!("s{i}"), "default", 1),
            path: None,
            who: admin(),
            reply,
        })
        .await
        .unwrap();
        replies.push(answer);
    }
    let (stop, stopped) = watch::channel(false);
    let (fatal, _) = watch::channel(None);
    let state = tokio::spawn(task::run(sim.core, rx, stopped, fatal));
    for (i, answer) in replies.into_iter().enumerate() {
        let (key, _) = answer
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("submit {i}: {e}"));
        assert_eq!(key.to_string(), format!("default/s{i}"));
    }
    let settles = metrics.settles.get() - before;
    assert_eq!(
        settles,
        BURST.div_ceil(COMMANDS_PER_SETTLE) as u64,
        "{BURST} queued submits settled {settles} times"
    );
    // Every answer came after its service was placed: the last settle placed them all.
    assert_eq!((metrics.placements.get() - placed) as usize, BURST);
    stop.send(true).unwrap();
    state.await.unwrap();
}

/// A burst of queued worker reports also ends its batch once `EVENTS_PER_SETTLE` events
/// wait for the settle that announces them (each holds a copy of a job's record): 17
/// reports of 256 events settle twice, not once. On a paused clock: the hosts'
/// heartbeat deadlines must not come due while a slow (debug, loaded) run works.
#[tokio::test(start_paused = true)]
async fn queued_reports_settle_once_their_events_reach_the_bound() {
    use super::task::{self, Command, EVENTS_PER_SETTLE};
    use tokio::sync::{mpsc, oneshot, watch};
    const PER_REPORT: usize = 128; // jobs: a start and a readiness each
    let jobs = EVENTS_PER_SETTLE / 2 + PER_REPORT / 2;
    let mut sim = Sim::new();
    sim.register("h1", jobs as u64, &[]);
    sim.submit(web("web", "default", jobs as u32));
    let ids: Vec<String> = sim.core.view().borrow().services[&ServiceKey::new("default", "web")]
        .jobs
        .iter()
        .map(|j| j.info().job.clone())
        .collect();
    assert_eq!(ids.len(), jobs);
    let metrics = sim.metrics.clone();
    let before = metrics.settles.get();
    let reports = ids.chunks(PER_REPORT).count();
    let (tx, rx) = mpsc::channel(reports);
    let mut replies = Vec::new();
    for chunk in ids.chunks(PER_REPORT) {
        let (reply, answer) = oneshot::channel();
        let events = chunk
            .iter()
            .flat_map(|j| [started(j), ready(j, true)])
            .collect();
        tx.send(Command::Events {
            report: crate::core::Report {
                host: "h1".into(),
                caller: worker("h1"),
                events,
            },
            reply,
        })
        .await
        .unwrap();
        replies.push(answer);
    }
    assert_eq!(reports, EVENTS_PER_SETTLE / (2 * PER_REPORT) + 1);
    let (stop, stopped) = watch::channel(false);
    let (fatal, _) = watch::channel(None);
    let state = tokio::spawn(task::run(sim.core, rx, stopped, fatal));
    for (i, answer) in replies.into_iter().enumerate() {
        answer
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("report {i}: {e}"));
    }
    let settles = metrics.settles.get() - before;
    assert_eq!(
        settles, 2,
        "{reports} queued reports settled {settles} times"
    );
    stop.send(true).unwrap();
    state.await.unwrap();
}

/// A scheduling pass visits only the services something happened to (`core/sched.rs`):
/// a commit changed their shape, replicas of theirs wait for room, their last replica
/// became available, or time alone changes them. That nothing is missed is checked at
/// every settle of every test here: under `cfg(test)`, `Core::check_skipped` asserts that
/// no service a pass leaves out has a replica to place, a job to drain or a rollout to
/// complete.
#[test]
fn a_pass_visits_only_the_services_something_happened_to() {
    let visits = |s: &Sim| s.metrics.pass_visits.get();
    let mut s = Sim::new();
    s.register("exec-01", 8, &[]);
    s.submit(web("a", "default", 2));
    s.submit(web("b", "default", 2));
    s.start_ready(&[
        ("exec-01", "j-1"),
        ("exec-01", "j-2"),
        ("exec-01", "j-3"),
        ("exec-01", "j-4"),
    ]);
    assert!(
        s.rollout("a").contains("rollout=complete"),
        "{}",
        s.rollout("a")
    );
    assert!(
        s.rollout("b").contains("rollout=complete"),
        "{}",
        s.rollout("b")
    );

    // A readiness report for a complete service: nothing to do, nothing visited.
    let v = visits(&s);
    s.events("exec-01", vec![ready("j-1", false)]);
    assert_eq!(
        visits(&s) - v,
        0,
        "a is complete: its readiness changes nothing"
    );

    // A timer with nothing due: nothing is visited.
    let v = visits(&s);
    s.core.mark_dirty();
    s.settle("timer", Ok(()));
    assert_eq!(visits(&s) - v, 0, "nothing happened to any service");

    // c does not fit whole (4 of 8 slots are taken): two of its replicas wait, and
    // every pass visits it until they are placed.
    s.submit(web("c", "default", 6));
    assert_eq!(
        s.metrics.pending.get(),
        2,
        "two of c's replicas wait for room"
    );
    let v = visits(&s);
    s.events("exec-01", vec![ready("j-1", true)]);
    assert_eq!(visits(&s) - v, 1, "c, waiting for room");

    // Room appears on a new host: c places the rest, and waits no more.
    s.register("exec-02", 8, &[]);
    assert_eq!(s.metrics.pending.get(), 0);

    // c's six replicas start and become ready one report at a time: c is visited once,
    // when the last one is ready (its rollout completes then, not before).
    let v = visits(&s);
    s.start_ready(&[("exec-01", "j-5"), ("exec-01", "j-6"), ("exec-01", "j-7")]);
    assert!(
        s.rollout("c").contains("rollout=progressing"),
        "{}",
        s.rollout("c")
    );
    s.start_ready(&[("exec-01", "j-8"), ("exec-02", "j-9"), ("exec-02", "j-10")]);
    assert!(
        s.rollout("c").contains("rollout=complete"),
        "{}",
        s.rollout("c")
    );
    assert_eq!(visits(&s) - v, 1, "c, once its last replica is ready");

    // A replica of b exits: b is visited and, once its backoff is over, replaced.
    let v = visits(&s);
    s.events("exec-01", vec![exited("j-3")]);
    assert_eq!(visits(&s) - v, 1, "only b");
    assert_eq!(
        s.metrics.pending.get(),
        1,
        "b's replica waits for its backoff"
    );
    let placed = s.metrics.placements.get();
    s.run_for(2, &["exec-01", "exec-02"]);
    assert_eq!(
        s.metrics.placements.get() - placed,
        1,
        "b's replica replaced"
    );
    assert_eq!(s.metrics.pending.get(), 0);
}

#[test]
fn a_job_id_is_one_allocation_shared_by_the_model_and_its_indexes() {
    use xce_model::{Cluster, JobRec};
    let rec = |state, ready| JobRec {
        info: plugin_api::JobInfo {
            job: "j-7".into(),
            service: "web".into(),
            project: "default".into(),
            replica: 0,
            host: "exec-01".into(),
            state,
            ready,
            grants: plugin_api::Grants::new(),
            generation: 1,
        },
        held: None,
        held_ready: None,
        log: None,
    };
    let mut c = Cluster::default();
    c.insert_job(rec(JobState::Placed, false));
    let key = c.job_key("j-7").expect("inserted").clone();
    // The job map's key, the host index and the service index (and this test's clone).
    assert_eq!(Arc::strong_count(&key), 4);
    // A change replaces the record, not the key.
    c.insert_job(rec(JobState::Running, true));
    assert!(Arc::ptr_eq(&key, c.job_key("j-7").expect("still live")));
    assert_eq!(Arc::strong_count(&key), 4);
    assert_eq!(c.jobs_on("exec-01").count(), 1);
    c.remove_job("j-7");
    assert!(c.job_key("j-7").is_none());
    assert_eq!(
        Arc::strong_count(&key),
        1,
        "no index keeps an ended job's id"
    );
}

/// The service detail is written straight into the answer (no `Value` tree of every
/// job): the text is the one the tree gives, key order included, with jobs, a pending
/// replica and a slot's last exit in it.
#[test]
fn the_service_detail_written_directly_is_the_text_of_its_tree() {
    let mut s = Sim::new();
    s.register("exec-01", 2, &[]);
    s.submit(web("web", "default", 3));
    s.events("exec-01", vec![started("j-1"), exited("j-2")]);
    let v = s.core.view();
    let v = v.borrow();
    let svc = &v.services[&ServiceKey::new("default", "web")];
    assert!(!svc.jobs.is_empty() && !svc.pending.is_empty() && !svc.slots.is_empty());
    let detail = api::services::service_detail(svc);
    let direct = serde_json::to_string(&detail).unwrap();
    let tree = serde_json::to_value(&detail).unwrap();
    assert_eq!(direct, tree.to_string());
    assert_eq!(tree["jobs"].as_array().map(Vec::len), Some(svc.jobs.len()));
    assert_eq!(tree["replica_status"].as_array().map(Vec::len), Some(3));
}

/// A resource plugin named like a field of a job (or a host) in the answers would have its
/// summaries dropped there, since they are keys beside those fields: the controller
/// refuses to start with it, naming the plugin and the field.
#[tokio::test]
async fn a_plugin_named_like_a_field_of_the_answers_is_refused_at_start() {
    let start = |name: &'static str| async move {
        let plugins = ControllerPlugins {
            resources: vec![Box::new(Slots::new(name))],
            ..ControllerPlugins::default()
        };
        let keyring = xce_serve::keyring::Keyring::new(Tokens::parse(TOKENS).unwrap());
        let store = store_of_cluster("c1c1c1c1c1c1c1c1");
        Controller::new(&ControllerConfig::default(), keyring, plugins, store).await
    };
    let err = start("state").await.expect_err("a plugin named state");
    expect![[r#"cannot load the controller's resource plugins: plugin "state" cannot be loaded: its name is the field jobs[].state of GET /v1/services/{name}, and the API shows each plugin's summary under the plugin's name beside that field; rename the plugin"#]]
        .assert_eq(&format!("{err:#}"));
    for (name, field) in [
        ("job", "jobs[].job"),
        ("log", "jobs[].log"),
        ("id", "hosts[].id"),
    ] {
        let err = start(name).await.expect_err(name);
        assert!(format!("{err:#}").contains(field), "{name}: {err:#}");
    }
    let ok = start("slots").await.expect("another name is fine");
    ok.shutdown().await;
}

/// On a multi-threaded runtime the state task runs on a blocking-pool thread of its own
/// (`task::spawn`: one malloc arena for the model): it answers, places and applies worker
/// reports there, on the runtime's timers, stops on `shutdown`, and the runtime then drops
/// (a state task still running would hold the runtime's drop, which waits for its
/// blocking threads).
#[test]
fn on_a_multi_threaded_runtime_the_state_task_serves_from_its_own_thread_and_stops() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let app = app().await;
        web_of_4_on_2_hosts_one_ready(&app).await;
        let (_, detail) = app
            .json("GET", "/v1/services/web", "admin-example-secret", None)
            .await;
        let jobs: Vec<(&str, &str, bool)> = detail["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| {
                let s = |k: &str| j[k].as_str().unwrap();
                (s("job"), s("state"), j["ready"].as_bool().unwrap())
            })
            .collect();
        assert_eq!(
            jobs,
            [
                ("j-1", "running", true),
                ("j-2", "placed", false),
                ("j-3", "placed", false)
            ],
            "{detail}"
        );
        app.ctl.shutdown().await;
    });
    drop(rt);
}
