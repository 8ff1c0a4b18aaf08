//! `Sim`: the state machine (`Core`) driven on a fake clock as the state task drives it,
//! every step's events and plugin calls written to a log the tests compare.

use super::*;

pub(super) const TIMING: Timing = Timing {
    heartbeat_interval: Duration::from_secs(1),
    unreachable_after: Duration::from_secs(3),
    grace_period: Duration::from_secs(30),
    disruption_threshold: DisruptionThreshold::DEFAULT,
};

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
            .heartbeat(&host.to_owned(), &worker(host), self.now);
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
