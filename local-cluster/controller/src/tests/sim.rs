//! `Sim`: the state machine (`Core`) driven on a fake clock as the state task drives it,
//! every step's events and plugin calls written to a log the tests compare.

use super::*;

pub(super) const TIMING: Timing = Timing {
    heartbeat_interval: Duration::from_secs(1),
    unreachable_after: Duration::from_secs(3),
    grace_period: Duration::from_secs(30),
    disruption_threshold: DisruptionThreshold::DEFAULT,
    drain_ack_timeout: Duration::from_secs(10),
};

/// The job-id tag of the tests' loads: none, so ids are the plain `j-<n>` their
/// expectations name (a real controller tags every load: `xce_model::job_tag`).
pub(super) fn plain_ids() -> String {
    String::new()
}

/// Drives a [`Core`] like the state task does, with a clock the test moves.
pub(super) struct Sim {
    pub(super) core: Core,
    pub(super) now: Instant,
    pub(super) rec: Recorder,
    /// Every event as it was announced (for property checks).
    pub(super) raw: RawEvents,
    pub(super) slots: SharedSlots,
    pub(super) store: Arc<MemStore>,
    /// The core's metrics (the same gauges).
    pub(super) metrics: Metrics,
    pub(super) out: Vec<String>,
}

impl Sim {
    pub(super) fn new() -> Self {
        Self::load(Arc::new(MemStore::new()), Instant::now())
    }

    pub(super) fn load(store: Arc<MemStore>, now: Instant) -> Self {
        Self::load_with(TIMING, store, now)
    }

    pub(super) fn load_with(timing: Timing, store: Arc<MemStore>, now: Instant) -> Self {
        Self::load_tagged(timing, store, now, plain_ids)
    }

    /// [`load_with`](Self::load_with), the job ids tagged by `job_tag`.
    pub(super) fn load_tagged(
        timing: Timing,
        store: Arc<MemStore>,
        now: Instant,
        job_tag: fn() -> String,
    ) -> Self {
        let rec = Recorder::default();
        let raw = RawEvents::default();
        let slots = SharedSlots::new();
        let wiring = Wiring {
            resources: vec![Box::new(slots.clone())],
            policies: vec![Arc::new(Policy)],
            listeners: vec![Arc::new(rec.clone()), Arc::new(raw.clone())],
            job_tag,
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
    pub(super) fn settle(&mut self, step: &str, r: Result<(), core::CoreError>) {
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

    pub(super) fn submit(&mut self, doc: Value) {
        let r = self.core.submit(doc, None, &admin(), self.now).map(|_| ());
        self.settle("submit", r);
    }

    pub(super) fn put(&mut self, doc: Value) {
        let name = doc["service"]["name"].as_str().unwrap().to_owned();
        let r = self
            .core
            .submit(doc, Some(&name), &admin(), self.now)
            .map(|(_, a)| self.out.push(format!("  applied {a:?}")));
        self.settle(&format!("put {name}"), r);
    }

    pub(super) fn rollout(&self, name: &str) -> String {
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

    pub(super) fn delete(&mut self, name: &str) {
        let r = self
            .core
            .delete(&ServiceKey::new("default", name), false, &admin(), self.now)
            .map(|_| ());
        self.settle(&format!("delete {name}"), r);
    }

    pub(super) fn register(&mut self, host: &str, slots: u64, running: &[&str]) {
        self.register_as(&worker(host), host, slots, running);
    }

    /// Registers every host with `slots` free and nothing running.
    pub(super) fn register_all<H: AsRef<str>>(&mut self, hosts: &[H], slots: u64) {
        for h in hosts {
            self.register(h.as_ref(), slots, &[]);
        }
    }

    /// Each `(host, job)`: the host reports the job started, then ready.
    pub(super) fn start_ready<H: AsRef<str>, J: AsRef<str>>(&mut self, placed: &[(H, J)]) {
        for (h, j) in placed {
            let j = j.as_ref();
            self.events(h.as_ref(), vec![started(j), ready(j, true)]);
        }
    }

    /// A registration by the worker instance `caller`.
    pub(super) fn register_as(
        &mut self,
        caller: &Caller,
        host: &str,
        slots: u64,
        running: &[&str],
    ) {
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
            wants_session: false,
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

    pub(super) fn heartbeat(&mut self, host: &str) {
        let r = self
            .core
            .heartbeat(&host.to_owned(), &worker(host), None, self.now)
            .map(drop);
        self.settle(&format!("heartbeat {host}"), r);
    }

    pub(super) fn events(&mut self, host: &str, events: Vec<WorkerEvent>) {
        let what = format!("events {host} {}", serde_json::to_string(&events).unwrap());
        let r = self
            .core
            .events(&host.to_owned(), &worker(host), events, self.now);
        self.settle(&what, r);
    }

    /// Lets `secs` seconds pass one by one, the listed hosts heartbeating each second
    /// and due timers firing, like the state task.
    pub(super) fn run_for(&mut self, secs: u64, heartbeating: &[&str]) {
        for _ in 0..secs {
            self.now += Duration::from_secs(1);
            for h in heartbeating {
                self.core
                    .heartbeat(&(*h).to_owned(), &worker(h), None, self.now)
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
    pub(super) fn restart(mut self, secs: u64) -> Sim {
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

    pub(super) fn assignments(&mut self, host: &str) -> String {
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

    pub(super) fn note(&mut self, s: String) {
        self.out.push(format!("  = {s}"));
    }

    pub(super) fn check(&self, expect: Expect) {
        expect.assert_eq(&self.out.join("\n"));
    }
}

// === fixtures: the setups several tests share, their logs checked once, here ===

impl Sim {
    /// Ends a fixture: checks the log so far (the fixture's setup) against `expect`,
    /// then replaces it with one line naming the fixture, so a test's own expectation
    /// starts where the fixture ends and the setup's log is written (and checked) once.
    fn fixture(&mut self, name: &str, expect: Expect) {
        self.check(expect);
        self.out = vec![format!("> {name}: as checked by the fixture")];
    }

    /// A controller with one host, `exec-01`, of `slots` slots.
    pub(super) fn one_host(slots: u64) -> Sim {
        let mut s = Sim::new();
        s.register("exec-01", slots, &[]);
        s.fixture(
            "Sim::one_host",
            expect![[r#"
                > load
                  resync rev=0 services=0 jobs=[] hosts=0
                > register exec-01 running=[]
                  1 host exec-01 Ready []"#]],
        );
        s
    }

    /// [`one_host`](Self::one_host) of 2 slots and `web` of one replica submitted: `j-1`
    /// placed there.
    pub(super) fn one_web() -> Sim {
        let mut s = Sim::one_host(2);
        s.submit(web("web", "default", 1));
        s.fixture(
            "Sim::one_web",
            expect![[r#"
                > Sim::one_host: as checked by the fixture
                > submit
                  2 service web rev=2
                  3 job j-1 web/0 exec-01 Placed ready=false
                  plugin: reserve exec-01 j-1 0"#]],
        );
        s
    }

    /// [`one_web`](Self::one_web) with `j-1` reported started and ready.
    pub(super) fn one_web_ready() -> Sim {
        let mut s = Sim::one_web();
        s.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
        s.fixture(
            "Sim::one_web_ready",
            expect![[r#"
                > Sim::one_web: as checked by the fixture
                > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
                  4 job j-1 web/0 exec-01 Running ready=false
                  5 job j-1 web/0 exec-01 Running ready=true
                  6 service web rev=6"#]],
        );
        s
    }

    /// [`one_web`](Self::one_web) with `j-1` reported started and then exited (code 1):
    /// its replica waits for its first restart backoff (1 s).
    pub(super) fn one_web_crashed() -> Sim {
        let mut s = Sim::one_web();
        s.events("exec-01", vec![started("j-1"), exited("j-1")]);
        s.fixture(
            "Sim::one_web_crashed",
            expect![[r#"
                > Sim::one_web: as checked by the fixture
                > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"exited","job":"j-1","code":1}]
                  4 job j-1 web/0 exec-01 Running ready=false
                  5 ended j-1 web/0 Exited { code: Some(1) }
                  plugin: release exec-01 j-1"#]],
        );
        s
    }

    /// [`one_host`](Self::one_host) of `slots` slots and `web` put as `v1` (2 replicas,
    /// a 2 s drain, one surge replica and none unavailable): `j-1` and `j-2` placed.
    pub(super) fn two_v1_placed(slots: u64) -> Sim {
        let mut s = Sim::one_host(slots);
        s.put(versioned(2, "v1"));
        s.fixture(
            "Sim::two_v1_placed",
            expect![[r#"
                > Sim::one_host: as checked by the fixture
                  applied Created
                > put web
                  2 service web rev=2
                  3 job j-1 web/0 exec-01 Placed ready=false
                  4 job j-2 web/1 exec-01 Placed ready=false
                  plugin: reserve exec-01 j-1 0
                  plugin: reserve exec-01 j-2 1"#]],
        );
        s
    }

    /// [`two_v1_placed`](Self::two_v1_placed) with both replicas reported started and
    /// ready in one report (the rollout completes).
    pub(super) fn two_v1_ready(slots: u64) -> Sim {
        let mut s = Sim::two_v1_placed(slots);
        s.events(
            "exec-01",
            vec![
                started("j-1"),
                ready("j-1", true),
                started("j-2"),
                ready("j-2", true),
            ],
        );
        s.fixture(
            "Sim::two_v1_ready",
            expect![[r#"
                > Sim::two_v1_placed: as checked by the fixture
                > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true},{"event":"started","job":"j-2","pid":7},{"event":"readiness","job":"j-2","ready":true}]
                  5 job j-1 web/0 exec-01 Running ready=false
                  6 job j-1 web/0 exec-01 Running ready=true
                  7 job j-2 web/1 exec-01 Running ready=false
                  8 job j-2 web/1 exec-01 Running ready=true
                  9 service web rev=9"#]],
        );
        s
    }

    /// `n` hosts (`exec-01`…) of 3 slots each and `web` of `n` replicas submitted, one
    /// on each host, each reported started then ready by its host (one report each).
    /// Returns the `(host, job)` of each replica.
    pub(super) fn spread_ready(timing: Timing, n: usize) -> (Sim, Vec<(String, String)>) {
        let mut s = Sim::load_with(timing, Arc::new(MemStore::new()), Instant::now());
        s.register_all(&host_names(n), 3);
        s.submit(web("web", "default", n as u32));
        let jobs = s.jobs("web");
        s.start_ready(&jobs);
        (s, jobs)
    }

    /// The `(host, job)` of each job of the service `name` (project `default`), in
    /// replica order.
    pub(super) fn jobs(&self, name: &str) -> Vec<(String, String)> {
        self.core.view().borrow().services[&ServiceKey::new("default", name)]
            .jobs
            .iter()
            .map(|j| (j.info.host.clone(), j.info.job.clone()))
            .collect()
    }
}

// === a bare core, without the log ===

/// A core on `store` with the slots plugin `slots`, the facts policy and `listeners`.
pub(super) fn core_with(
    store: Arc<dyn Store>,
    slots: SharedSlots,
    listeners: Vec<Arc<dyn ClusterListener>>,
    now: Instant,
) -> Core {
    let wiring = Wiring {
        resources: vec![Box::new(slots)],
        policies: vec![Arc::new(Policy)],
        listeners,
        job_tag: plain_ids,
    };
    Core::load(TIMING, store, wiring, Metrics::default(), now).unwrap()
}

/// `host`'s worker registers with `facts`, nothing running.
pub(super) fn register_on(core: &mut Core, host: &str, facts: HostFacts, now: Instant) {
    let req = RegisterRequest {
        facts,
        running: vec![],
        wants_session: false,
    };
    core.register(&host.to_owned(), &worker(host), req, now)
        .unwrap();
}

/// Submits `doc` as the admin, then settles (its replicas are placed).
pub(super) fn submit_on(core: &mut Core, doc: Value, now: Instant) {
    core.submit(doc, None, &admin(), now).unwrap();
    core.settle(now);
}
