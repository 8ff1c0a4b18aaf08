//! The test doubles of the plugin traits and the store, and the small values every
//! test builds: host facts, profiles, principals, worker callers and events.

use super::*;

/// The slot plugin of the scheduler tests, shared so a test can look inside while the
/// controller owns it.
#[derive(Debug, Clone)]
pub(super) struct SharedSlots(pub(super) Arc<Mutex<Slots>>);

impl SharedSlots {
    pub(super) fn new() -> Self {
        Self(Arc::new(Mutex::new(Slots::new("slots"))))
    }
    pub(super) fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap().log)
    }
    pub(super) fn used(&self) -> Vec<String> {
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
pub(super) struct WhoAmI;

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
pub(super) struct Policy;

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
pub(super) struct Recorder(pub(super) Arc<Mutex<Vec<String>>>);

impl Recorder {
    pub(super) fn take(&self) -> Vec<String> {
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

/// Every announced event, as it was.
#[derive(Clone, Default)]
pub(super) struct RawEvents(pub(super) Arc<Mutex<Vec<ClusterEvent>>>);

impl RawEvents {
    pub(super) fn take(&self) -> Vec<ClusterEvent> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

impl ClusterListener for RawEvents {
    fn resync(&self, _: &ClusterSnapshot) {}
    fn on_event(&self, e: &ClusterEvent) {
        self.0.lock().unwrap().push(e.clone());
    }
}

pub(super) fn facts(slots: u64) -> HostFacts {
    facts_at("127.0.0.11", slots)
}

/// The facts of host `exec-NN`: its own address, 127.0.0.(10 + NN).
pub(super) fn facts_of(host: &str, slots: u64) -> HostFacts {
    let n: u8 = host.trim_start_matches("exec-").parse().unwrap_or(1);
    facts_at(&format!("127.0.0.{}", 10 + n), slots)
}

pub(super) fn facts_at(ip: &str, slots: u64) -> HostFacts {
    HostFacts {
        ip_addr: Some(ip.parse().unwrap()),
        addresses: vec![plugin_api::HostAddress {
            ip: ip.parse().unwrap(),
            interface: Some("lo".into()),
        }],
        sections: [("slots".to_owned(), json!(slots))].into(),
    }
}

/// The hosts `exec-01`, `exec-02`, … up to `n`.
pub(super) fn host_names(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("exec-{i:02}")).collect()
}

/// A service of `replicas` replicas; `min_ready` 0 (the tests of `min_ready` and its
/// default set their own), so a ready replica counts at once.
pub(super) fn web(name: &str, project: &str, replicas: u32) -> Value {
    json!({"service": {"name": name, "project": project, "replicas": replicas, "command": ["sleep", "1000"],
                       "update": {"min_ready": "0s"}}})
}

pub(super) fn versioned(replicas: u32, command: &str) -> Value {
    json!({"service": {"name": "web", "replicas": replicas, "command": ["sh", "-c", command],
                       "drain": "2s", "update": {"max_surge": 1, "max_unavailable": 0, "min_ready": "0s"}}})
}

pub(super) fn admin() -> Principal {
    Principal {
        credential: Default::default(),
        name: "admin".into(),
        kind: PrincipalKind::User,
        grants: vec![(Permission::Admin, vec!["*".into()])],
    }
}

/// The one worker instance of `host` the simulations use, of no cluster yet.
pub(super) fn worker(host: &str) -> Caller {
    Caller {
        instance: Some(format!("i-{host}")),
        ..Caller::default()
    }
}

/// Another worker instance for `host` (a second worker with the same host id).
pub(super) fn duplicate() -> Caller {
    Caller {
        instance: Some("i-dup".into()),
        peer: Some("127.0.0.99".into()),
        ..Caller::default()
    }
}

pub(super) fn started(job: &str) -> WorkerEvent {
    WorkerEvent::Started {
        job: job.into(),
        pid: 7,
        log: None,
    }
}

pub(super) fn ready(job: &str, ready: bool) -> WorkerEvent {
    WorkerEvent::Readiness {
        job: job.into(),
        ready,
        probe: None,
    }
}

pub(super) fn exited(job: &str) -> WorkerEvent {
    WorkerEvent::exited(job.into(), xce_proto::worker::ExitCause::code(1), None)
}
