//! The controller's state machine: owns the cluster, the resource plugins and the store,
//! and applies one command at a time. Synchronous; the state task (`task.rs`) drives it
//! and passes the current time in.
//!
//! Every mutation is built as a [`Txn`], persisted, and only then applied in memory,
//! announced to listeners and answered. Plugin releases happen after the commit.

use super::metrics::Metrics;
use super::model::{After, Cluster, HostRec, JobRec, LoadError, ServiceRec, ServiceState, Txn};
use super::scheduler::{self, Candidate, Request};
use crate::profile::{self, Profile};
use crate::proto::{
    Assignment, Assignments, Desired, RegisterRequest, RegisterResponse, WorkerEvent,
};
use crate::store::{Store, StoreError};
use plugin_api::{
    ClusterEvent, ClusterListener, EndReason, FieldError, HostFacts, HostFactsPolicy, HostId,
    HostInfo, HostState, JobId, JobInfo, JobState, Permission, Principal, ResourcePlugin,
    ServiceInfo,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

/// Timing of host liveness.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) heartbeat_interval: Duration,
    pub(crate) unreachable_after: Duration,
    pub(crate) grace_period: Duration,
}

/// First restart delay of a crash-looping replica; doubled per exit up to the cap.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A replica that ran this long starts over at [`BACKOFF_MIN`].
const BACKOFF_RESET: Duration = Duration::from_secs(60);

/// How long timers wait after a failed commit before trying again.
const STORE_RETRY: Duration = Duration::from_secs(1);

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CoreError {
    /// Unknown service, or one the caller may not view.
    #[error("service {0:?} not found")]
    ServiceNotFound(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("service {0:?} already exists")]
    Conflict(String),
    #[error("invalid profile")]
    Invalid(Vec<FieldError>),
    #[error("host facts refused")]
    FactsRefused(Vec<FieldError>),
    #[error("host {0:?} is not registered")]
    UnknownHost(HostId),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, Clone, Copy)]
struct Backoff {
    delay: Duration,
    not_before: Instant,
    /// A scheduling pass has seen the backoff over (and placed the replica, or said why
    /// not, or found it not wanted any more). Until then the backoff keeps a timer armed,
    /// even once its instant is past:
    /// a pass that ran with a `now` taken before a slow store commit may have seen it
    /// still running, and nothing else would wake the controller for it.
    over: bool,
}

/// What readers see: a consistent snapshot after a command.
#[derive(Debug, Clone, Default)]
pub(crate) struct View {
    pub(crate) services: BTreeMap<String, ServiceView>,
    pub(crate) hosts: Vec<HostView>,
}

#[derive(Debug, Clone)]
pub(crate) struct ServiceView {
    pub(crate) info: ServiceInfo,
    pub(crate) state: ServiceState,
    pub(crate) jobs: Vec<JobView>,
    /// `(replica, reason)` of replicas without a live job.
    pub(crate) pending: Vec<(u32, String)>,
}

#[derive(Debug, Clone)]
pub(crate) struct JobView {
    pub(crate) info: JobInfo,
    /// Plugin grant summaries by plugin name.
    pub(crate) summaries: BTreeMap<String, Value>,
}

#[derive(Debug, Clone)]
pub(crate) struct HostView {
    pub(crate) info: HostInfo,
    pub(crate) jobs: usize,
    /// Plugin host summaries by plugin name.
    pub(crate) summaries: BTreeMap<String, Value>,
}

/// The plugins and listeners the core drives.
pub(crate) struct Wiring {
    pub(crate) resources: Vec<Box<dyn ResourcePlugin>>,
    pub(crate) policies: Vec<Arc<dyn HostFactsPolicy>>,
    pub(crate) listeners: Vec<Arc<dyn ClusterListener>>,
}

pub(crate) struct Core {
    timing: Timing,
    cluster: Cluster,
    plugins: Vec<Box<dyn ResourcePlugin>>,
    policies: Vec<Arc<dyn HostFactsPolicy>>,
    listeners: Vec<Arc<dyn ClusterListener>>,
    store: Arc<dyn Store>,
    metrics: Metrics,
    /// Parsed profiles of the services (command, readiness) for the assignments.
    profiles: HashMap<String, Profile>,
    /// When each host was last heard from (not persisted: a restart hears from all).
    heard: HashMap<HostId, Instant>,
    /// When each running job started running (for the backoff reset).
    running_since: HashMap<JobId, Instant>,
    backoff: HashMap<(String, u32), Backoff>,
    pending: BTreeMap<String, BTreeMap<u32, String>>,
    assign: HashMap<HostId, watch::Sender<Arc<Assignments>>>,
    view: watch::Sender<Arc<View>>,
    /// Something changed since the last [`Core::settle`].
    dirty: bool,
    /// Committed events not yet announced: listeners hear of a change only after the
    /// readers' view includes it (see [`Core::publish`]), so no read path is ahead of
    /// the controller's own (`/v1/hosts` never behind the endpoints).
    outbox: Vec<ClusterEvent>,
    /// After a failed commit in a timer: do not retry before this (no busy loop while the
    /// store is down).
    store_retry: Option<Instant>,
    /// Why the store refuses every commit until this controller reloads (see
    /// [`StoreError::Stale`]): it must stop rather than run on a view it cannot change.
    fatal: Option<String>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("rev", &self.cluster.rev)
            .finish_non_exhaustive()
    }
}

// === impl Core ===

impl Core {
    /// Loads the stored state and brings the plugins and listeners up to it: `host_up`
    /// for every known host, `restore` for every live job's grants, then `resync` — all
    /// before the first placement and before anything is served.
    pub(crate) fn load(
        timing: Timing,
        store: Arc<dyn Store>,
        wiring: Wiring,
        metrics: Metrics,
        now: Instant,
    ) -> Result<Self, LoadError> {
        let cluster = Cluster::load(&*store)?;
        let Wiring {
            resources: mut plugins,
            policies,
            listeners,
        } = wiring;
        for h in cluster.hosts.values() {
            for p in &mut plugins {
                if let Err(e) = p.host_up(&h.info.id, &h.info.facts) {
                    warn!(host = %h.info.id, plugin = p.name(), reason = %e, "plugin refused stored host facts");
                }
            }
        }
        let mut running_since = HashMap::new();
        for j in cluster.jobs.values() {
            for p in &mut plugins {
                if let Some(g) = j.info.grants.get(p.name()) {
                    if let Err(e) = p.restore(&j.info.host, &j.info.job, g) {
                        error!(job = %j.info.job, host = %j.info.host, plugin = p.name(), reason = %e, "stored grant conflicts with another; the store may be corrupt");
                    }
                }
            }
            if j.effective_state() == JobState::Running {
                running_since.insert(j.info.job.clone(), now);
            }
        }
        let mut profiles = HashMap::new();
        {
            let refs: Vec<&dyn ResourcePlugin> = plugins.iter().map(|p| &**p as _).collect();
            for s in cluster.services.values() {
                let doc = serde_json::json!({ "service": s.info.profile });
                let p = match profile::validate(&doc, &refs) {
                    Ok(p) => p,
                    Err(errs) => {
                        error!(service = %s.info.name, problems = ?errs, "stored profile no longer validates; running it without readiness");
                        fallback_profile(&s.info)
                    }
                };
                profiles.insert(s.info.name.clone(), p);
            }
        }
        let snapshot = cluster.snapshot();
        for l in &listeners {
            l.resync(&snapshot);
        }
        let heard = cluster.hosts.keys().map(|h| (h.clone(), now)).collect();
        info!(
            rev = cluster.rev,
            services = cluster.services.len(),
            jobs = cluster.jobs.len(),
            hosts = cluster.hosts.len(),
            "controller state loaded"
        );
        let (view, _) = watch::channel(Arc::new(View::default()));
        let mut core = Core {
            timing,
            cluster,
            plugins,
            policies,
            listeners,
            store,
            metrics,
            profiles,
            heard,
            running_since,
            backoff: HashMap::new(),
            pending: BTreeMap::new(),
            assign: HashMap::new(),
            view,
            dirty: true,
            store_retry: None,
            fatal: None,
            outbox: Vec::new(),
        };
        core.publish();
        Ok(core)
    }

    pub(crate) fn view(&self) -> watch::Receiver<Arc<View>> {
        self.view.subscribe()
    }

    /// The host's desired-set watch, if the host is known.
    pub(crate) fn assignments(&mut self, host: &str) -> Option<watch::Receiver<Arc<Assignments>>> {
        if !self.cluster.hosts.contains_key(host) {
            return None;
        }
        self.publish_host(host);
        self.assign.get(host).map(|tx| tx.subscribe())
    }

    /// Persists, applies, announces, then makes the plugin calls due.
    fn commit(&mut self, txn: Txn, now: Instant) -> Result<(), CoreError> {
        if txn.is_empty() {
            return Ok(());
        }
        let batch = txn.batch();
        if let Err(e) = blocking(|| self.store.commit(batch)) {
            error!(error = %e, "store commit failed; change not applied");
            if matches!(e, StoreError::Stale(_)) {
                self.fatal.get_or_insert_with(|| e.to_string());
            }
            self.store_retry = Some(now + STORE_RETRY);
            return Err(e.into());
        }
        self.store_retry = None;
        let (events, after) = txn.apply(&mut self.cluster);
        self.dirty = true;
        for e in &events {
            self.note(e, now);
        }
        self.outbox.extend(events);
        for a in after {
            match a {
                After::Refused {
                    host,
                    job,
                    plugin,
                    detail,
                } => {
                    if let Some(p) = self.plugins.iter_mut().find(|p| p.name() == plugin) {
                        p.launch_refused(&host, &job, &detail);
                    }
                }
                After::Release { host, job } => {
                    for p in &mut self.plugins {
                        p.release(&host, &job);
                    }
                }
            }
        }
        Ok(())
    }

    /// Logs a committed event and keeps the in-memory bookkeeping it implies.
    fn note(&mut self, e: &ClusterEvent, now: Instant) {
        match e {
            ClusterEvent::Service { rev, service } => {
                info!(service = %service.name, project = %service.project, rev, "service changed")
            }
            ClusterEvent::ServiceRemoved { rev, name, .. } => {
                info!(service = %name, rev, "service removed");
                self.profiles.remove(name);
                self.pending.remove(name);
                self.backoff.retain(|(s, _), _| s != name);
            }
            ClusterEvent::Job { rev, job } => {
                info!(service = %job.service, job = %job.job, host = %job.host, replica = job.replica, state = ?job.state, ready = job.ready, rev, "job changed");
                if job.state == JobState::Running {
                    self.running_since.entry(job.job.clone()).or_insert(now);
                }
            }
            ClusterEvent::JobEnded { rev, job, reason } => {
                info!(service = %job.service, job = %job.job, host = %job.host, replica = job.replica, reason = ?reason, rev, "job ended");
                let since = self.running_since.remove(&job.job);
                if let EndReason::Exited { .. } = reason {
                    let active = self
                        .cluster
                        .services
                        .get(&job.service)
                        .is_some_and(|s| s.state == ServiceState::Active);
                    if active {
                        let key = (job.service.clone(), job.replica);
                        let ran_long =
                            since.is_some_and(|t| now.duration_since(t) >= BACKOFF_RESET);
                        let delay = match self.backoff.get(&key) {
                            Some(b) if !ran_long => (b.delay * 2).min(BACKOFF_MAX),
                            _ => BACKOFF_MIN,
                        };
                        info!(service = %job.service, replica = job.replica, delay = ?delay, "replica exited; restarting after backoff");
                        self.backoff.insert(
                            key,
                            Backoff {
                                delay,
                                not_before: now + delay,
                                over: false,
                            },
                        );
                    }
                }
            }
            ClusterEvent::Host { rev, host, .. } => {
                info!(host = %host.id, state = ?host.state, ip_addr = ?host.facts.ip_addr, rev, "host changed")
            }
        }
    }

    // --- API commands ---

    pub(crate) fn submit(
        &mut self,
        doc: Value,
        who: &Principal,
        now: Instant,
    ) -> Result<String, CoreError> {
        let project = doc
            .get("service")
            .and_then(|s| s.get("project"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if !who.may(Permission::JobSubmit, project) {
            return Err(CoreError::Forbidden(format!(
                "no job.submit permission on project {project:?}"
            )));
        }
        let profile = {
            let refs: Vec<&dyn ResourcePlugin> = self.plugins.iter().map(|p| &**p as _).collect();
            profile::validate(&doc, &refs).map_err(CoreError::Invalid)?
        };
        if self.cluster.services.contains_key(&profile.name) {
            return Err(CoreError::Conflict(profile.name));
        }
        let mut txn = Txn::new(&self.cluster);
        txn.put_service(ServiceRec {
            info: ServiceInfo {
                name: profile.name.clone(),
                project: profile.project.clone(),
                replicas: profile.replicas,
                profile: profile.raw.clone(),
                rev: 0,
                generation: 1,
            },
            state: ServiceState::Active,
        });
        let name = profile.name.clone();
        self.profiles.insert(name.clone(), profile);
        if let Err(e) = self.commit(txn, now) {
            self.profiles.remove(&name);
            return Err(e);
        }
        info!(service = %name, principal = %who.name, "service submitted");
        Ok(name)
    }

    /// Stops a service: its jobs go `Stopping` and end when their workers report them
    /// exited. Returns how many jobs are stopping.
    pub(crate) fn delete(
        &mut self,
        name: &str,
        who: &Principal,
        now: Instant,
    ) -> Result<usize, CoreError> {
        let Some(svc) = self.cluster.services.get(name).cloned() else {
            return Err(CoreError::ServiceNotFound(name.to_owned()));
        };
        if !who.may(Permission::JobView, &svc.info.project) {
            return Err(CoreError::ServiceNotFound(name.to_owned()));
        }
        if !who.may(Permission::JobSubmit, &svc.info.project) {
            return Err(CoreError::Forbidden(format!(
                "no job.submit permission on project {:?}",
                svc.info.project
            )));
        }
        let jobs: Vec<JobRec> = self.cluster.jobs_of(name).cloned().collect();
        if svc.state == ServiceState::Stopping {
            return Ok(jobs.len());
        }
        let mut txn = Txn::new(&self.cluster);
        txn.put_service(ServiceRec {
            state: ServiceState::Stopping,
            ..svc.clone()
        });
        for mut j in jobs.iter().cloned() {
            match j.info.state {
                JobState::Placed | JobState::Running | JobState::Draining => {
                    j.info.state = JobState::Stopping
                }
                JobState::Unknown => j.held = Some(JobState::Stopping),
                JobState::Stopping | JobState::Exited | JobState::Lost => continue,
            }
            j.info.ready = false;
            txn.put_job(&self.cluster, j);
        }
        if jobs.is_empty() {
            let s = txn.service(&self.cluster, name).expect("service in txn");
            txn.remove_service(&s);
        }
        self.commit(txn, now)?;
        info!(service = %name, principal = %who.name, jobs = jobs.len(), "service stopping");
        Ok(jobs.len())
    }

    // --- worker commands ---

    fn check_facts(&self, host: &HostId, facts: &HostFacts) -> Result<(), CoreError> {
        let mut problems = Vec::new();
        for p in &self.policies {
            if let Err(mut e) = p.check(host, facts) {
                problems.append(&mut e);
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            let list: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
            warn!(host = %host, problems = %list.join("; "), "host facts refused");
            Err(CoreError::FactsRefused(problems))
        }
    }

    fn host_up(&mut self, host: &HostId, facts: &HostFacts) {
        for p in &mut self.plugins {
            if let Err(e) = p.host_up(host, facts) {
                warn!(host = %host, plugin = p.name(), reason = %e, "plugin cannot use the host's facts");
            }
        }
    }

    pub(crate) fn register(
        &mut self,
        host: &HostId,
        req: RegisterRequest,
        now: Instant,
    ) -> Result<RegisterResponse, CoreError> {
        self.check_facts(host, &req.facts)?;
        self.host_up(host, &req.facts);
        let mut txn = Txn::new(&self.cluster);
        let running: BTreeMap<&JobId, bool> =
            req.running.iter().map(|r| (&r.job, r.ready)).collect();
        let mine: Vec<JobRec> = self.cluster.jobs_on(host).cloned().collect();
        for mut j in mine {
            let eff = j.effective_state();
            match running.get(&j.info.job) {
                Some(&ready) => {
                    let before = j.clone();
                    j.held = None;
                    j.info.state = match eff {
                        JobState::Placed => JobState::Running,
                        s => s,
                    };
                    if j.info.state == JobState::Running {
                        j.info.ready = ready;
                    }
                    if j != before {
                        txn.put_job(&self.cluster, j);
                    }
                }
                None => match eff {
                    JobState::Running => {
                        txn.end_job(&self.cluster, j, EndReason::Exited { code: None }, false)
                    }
                    JobState::Stopping => txn.end_job(&self.cluster, j, EndReason::Stopped, false),
                    _ => {
                        // Placed: not started yet; the worker starts it from its assignments.
                        if j.info.state == JobState::Unknown {
                            j.info.state = eff;
                            j.held = None;
                            txn.put_job(&self.cluster, j);
                        }
                    }
                },
            }
        }
        let orphans: BTreeSet<JobId> = req
            .running
            .iter()
            .filter(|r| {
                self.cluster
                    .jobs
                    .get(&r.job)
                    .is_none_or(|j| j.info.host != *host)
            })
            .map(|r| r.job.clone())
            .collect();
        if !orphans.is_empty() {
            warn!(host = %host, orphans = ?orphans, "worker runs jobs the controller does not know; no placements there until they exited");
        }
        txn.put_host(
            &self.cluster,
            HostRec {
                info: HostInfo {
                    id: host.clone(),
                    state: HostState::Ready,
                    facts: req.facts,
                },
                orphans,
            },
        );
        self.commit(txn, now)?;
        self.heard.insert(host.clone(), now);
        info!(host = %host, "host registered");
        Ok(RegisterResponse {
            heartbeat_ms: self.timing.heartbeat_interval.as_millis() as u64,
        })
    }

    pub(crate) fn heartbeat(&mut self, host: &HostId, now: Instant) -> Result<(), CoreError> {
        let Some(h) = self.cluster.hosts.get(host).cloned() else {
            return Err(CoreError::UnknownHost(host.clone()));
        };
        match h.info.state {
            // A lost host's jobs are gone: it must register again to report what runs.
            HostState::Lost => return Err(CoreError::UnknownHost(host.clone())),
            HostState::Ready => {}
            HostState::Unreachable => {
                let mut txn = Txn::new(&self.cluster);
                for mut j in self.cluster.jobs_on(host).cloned().collect::<Vec<_>>() {
                    if j.info.state == JobState::Unknown {
                        j.info.state = j.effective_state();
                        j.held = None;
                        txn.put_job(&self.cluster, j);
                    }
                }
                let mut h = h;
                h.info.state = HostState::Ready;
                txn.put_host(&self.cluster, h);
                self.commit(txn, now)?;
                info!(host = %host, "host reachable again");
            }
        }
        self.heard.insert(host.clone(), now);
        Ok(())
    }

    pub(crate) fn facts(
        &mut self,
        host: &HostId,
        facts: HostFacts,
        now: Instant,
    ) -> Result<(), CoreError> {
        let Some(mut h) = self.cluster.hosts.get(host).cloned() else {
            return Err(CoreError::UnknownHost(host.clone()));
        };
        self.check_facts(host, &facts)?;
        if h.info.facts == facts {
            return Ok(());
        }
        self.host_up(host, &facts);
        h.info.facts = facts;
        let mut txn = Txn::new(&self.cluster);
        txn.put_host(&self.cluster, h);
        self.commit(txn, now)
    }

    pub(crate) fn events(
        &mut self,
        host: &HostId,
        events: Vec<WorkerEvent>,
        now: Instant,
    ) -> Result<(), CoreError> {
        if !self.cluster.hosts.contains_key(host) {
            return Err(CoreError::UnknownHost(host.clone()));
        }
        let mut txn = Txn::new(&self.cluster);
        for ev in events {
            let id = match &ev {
                WorkerEvent::Started { job, .. }
                | WorkerEvent::Readiness { job, .. }
                | WorkerEvent::Exited { job, .. }
                | WorkerEvent::Refused { job, .. } => job.clone(),
            };
            let Some(mut j) = txn.job(&self.cluster, &id).filter(|j| j.info.host == *host) else {
                if let WorkerEvent::Exited { .. } = ev {
                    if let Some(mut h) = txn.host(&self.cluster, host) {
                        if h.orphans.remove(&id) {
                            info!(host = %host, job = %id, "orphaned job exited");
                            txn.put_host_quiet(h);
                            continue;
                        }
                    }
                }
                // Repeats for ended jobs land here: events are idempotent.
                debug!(host = %host, job = %id, event = ?ev, "event for no live job on the host ignored");
                continue;
            };
            let eff = j.effective_state();
            match ev {
                WorkerEvent::Started { .. } => {
                    if eff == JobState::Placed {
                        if j.info.state == JobState::Unknown {
                            j.held = Some(JobState::Running);
                        } else {
                            j.info.state = JobState::Running;
                        }
                        txn.put_job(&self.cluster, j);
                    }
                }
                WorkerEvent::Readiness { ready, .. } => {
                    if eff == JobState::Running && j.info.ready != ready {
                        j.info.ready = ready;
                        txn.put_job(&self.cluster, j);
                    }
                }
                WorkerEvent::Exited { code, .. } => {
                    let reason = if eff == JobState::Stopping {
                        EndReason::Stopped
                    } else {
                        EndReason::Exited { code }
                    };
                    txn.end_job(&self.cluster, j, reason, false);
                }
                WorkerEvent::Refused { refusal, .. } => {
                    warn!(host = %host, job = %id, plugin = %refusal.plugin, reason = %refusal.reason, "launch refused; placing the replica again");
                    txn.after.push(After::Refused {
                        host: host.clone(),
                        job: id.clone(),
                        plugin: refusal.plugin.clone(),
                        detail: refusal.detail.clone(),
                    });
                    txn.end_job(
                        &self.cluster,
                        j,
                        EndReason::Refused {
                            reason: refusal.reason,
                        },
                        false,
                    );
                }
            }
        }
        self.commit(txn, now)
    }

    // --- timers ---

    /// The next instant something is due (a host deadline or a backoff), if any.
    pub(crate) fn next_deadline(&self, now: Instant) -> Option<Instant> {
        let hosts = self.cluster.hosts.values().filter_map(|h| {
            let heard = self.heard.get(&h.info.id).copied().unwrap_or(now);
            match h.info.state {
                HostState::Ready => Some(heard + self.timing.unreachable_after),
                HostState::Unreachable => Some(heard + self.timing.grace_period),
                HostState::Lost => None,
            }
        });
        let backoffs = self
            .backoff
            .values()
            .filter(|b| !b.over)
            .map(|b| b.not_before);
        let next = hosts.chain(backoffs).min()?;
        Some(match self.store_retry {
            Some(r) => next.max(r),
            None => next,
        })
    }

    /// Moves silent hosts to unreachable, then lost.
    pub(crate) fn tick(&mut self, now: Instant) {
        let hosts: Vec<HostRec> = self.cluster.hosts.values().cloned().collect();
        for h in hosts {
            let heard = self.heard.get(&h.info.id).copied().unwrap_or(now);
            let silent = now.saturating_duration_since(heard);
            let id = h.info.id.clone();
            if h.info.state == HostState::Ready && silent >= self.timing.unreachable_after {
                let mut txn = Txn::new(&self.cluster);
                for mut j in self.cluster.jobs_on(&id).cloned().collect::<Vec<_>>() {
                    j.held = Some(j.info.state);
                    j.info.state = JobState::Unknown;
                    txn.put_job(&self.cluster, j);
                }
                let mut h = h.clone();
                h.info.state = HostState::Unreachable;
                txn.put_host(&self.cluster, h);
                if self.commit(txn, now).is_ok() {
                    warn!(host = %id, silent = ?silent, "host unreachable; its jobs are kept for the grace period");
                }
            }
            let state = self.cluster.hosts.get(&id).map(|h| h.info.state);
            if state == Some(HostState::Unreachable) && silent >= self.timing.grace_period {
                let mut txn = Txn::new(&self.cluster);
                for j in self.cluster.jobs_on(&id).cloned().collect::<Vec<_>>() {
                    txn.end_job(&self.cluster, j, EndReason::HostLost, true);
                }
                let mut h = self.cluster.hosts[&id].clone();
                h.info.state = HostState::Lost;
                h.orphans.clear();
                txn.put_host(&self.cluster, h);
                if self.commit(txn, now).is_ok() {
                    warn!(host = %id, silent = ?silent, "host lost; its replicas are placed elsewhere");
                }
            }
        }
    }

    // --- after every command ---

    /// Removes stopped services, places missing replicas, and publishes the result.
    pub(crate) fn settle(&mut self, now: Instant) {
        if !self.dirty {
            return;
        }
        let done: Vec<ServiceRec> = self
            .cluster
            .services
            .values()
            .filter(|s| s.state == ServiceState::Stopping)
            .filter(|s| self.cluster.jobs_of(&s.info.name).next().is_none())
            .cloned()
            .collect();
        for s in done {
            let mut txn = Txn::new(&self.cluster);
            txn.remove_service(&s);
            let _ = self.commit(txn, now);
        }
        self.schedule(now);
        self.publish();
        self.dirty = false;
    }

    /// Why this controller must stop, once the store has said its view is stale.
    pub(crate) fn fatal(&self) -> Option<&str> {
        self.fatal.as_deref()
    }

    /// Makes the next [`settle`](Self::settle) run (a timer fired: a backoff may be over).
    pub(crate) fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    fn schedule(&mut self, now: Instant) {
        self.pending.clear();
        // This pass sees these backoffs over: no timer for them any more (see `over`).
        for b in self.backoff.values_mut() {
            b.over |= b.not_before <= now;
        }
        let services: Vec<ServiceRec> = self
            .cluster
            .services
            .values()
            .filter(|s| s.state == ServiceState::Active)
            .cloned()
            .collect();
        // Hosts that may take placements, and their load: computed once per pass and kept
        // current as replicas are placed.
        let ready: Vec<HostId> = self
            .cluster
            .hosts
            .values()
            .filter(|h| h.info.state == HostState::Ready && h.orphans.is_empty())
            .map(|h| h.info.id.clone())
            .collect();
        let mut total: HashMap<HostId, usize> = HashMap::new();
        let mut per_service: HashMap<(HostId, String), usize> = HashMap::new();
        for j in self.cluster.jobs.values() {
            *total.entry(j.info.host.clone()).or_default() += 1;
            *per_service
                .entry((j.info.host.clone(), j.info.service.clone()))
                .or_default() += 1;
        }
        // All placements of one pass are one store batch; on failure they are all undone.
        let mut txn = Txn::new(&self.cluster);
        let mut placed: Vec<(HostId, JobId, String, u32)> = Vec::new();
        for s in services {
            let name = &s.info.name;
            let occupied: BTreeSet<u32> = self
                .cluster
                .jobs_of(name)
                .filter(|j| j.effective_state() != JobState::Stopping)
                .map(|j| j.info.replica)
                .collect();
            for replica in 0..s.info.replicas {
                if occupied.contains(&replica) {
                    continue;
                }
                if let Some(b) = self.backoff.get(&(name.clone(), replica)) {
                    if b.not_before > now {
                        let reason = format!(
                            "restarting after exit in {}",
                            humantime::format_duration(round_up_secs(b.not_before - now))
                        );
                        self.pending
                            .entry(name.clone())
                            .or_default()
                            .insert(replica, reason);
                        continue;
                    }
                }
                let candidates: Vec<Candidate> = ready
                    .iter()
                    .map(|h| Candidate {
                        id: h.clone(),
                        service_jobs: per_service
                            .get(&(h.clone(), name.clone()))
                            .copied()
                            .unwrap_or(0),
                        total_jobs: total.get(h).copied().unwrap_or(0),
                    })
                    .collect();
                let job = txn.peek_job_id(&self.cluster);
                let req = Request {
                    service: name,
                    project: &s.info.project,
                    replica,
                    job: &job,
                    profile: &s.info.profile,
                };
                match scheduler::place(&mut self.plugins, &candidates, &req) {
                    Ok(p) => {
                        let taken = txn.new_job_id(&self.cluster);
                        debug_assert_eq!(taken, job);
                        *total.entry(p.host.clone()).or_default() += 1;
                        *per_service
                            .entry((p.host.clone(), name.clone()))
                            .or_default() += 1;
                        placed.push((p.host.clone(), job.clone(), name.clone(), replica));
                        txn.put_job(
                            &self.cluster,
                            JobRec {
                                info: JobInfo {
                                    job,
                                    service: name.clone(),
                                    project: s.info.project.clone(),
                                    replica,
                                    host: p.host,
                                    state: JobState::Placed,
                                    ready: false,
                                    grants: p.grants,
                                    generation: s.info.generation,
                                },
                                held: None,
                            },
                        );
                    }
                    Err(reason) => {
                        debug!(service = %name, replica, reason = %reason, "replica pending");
                        self.pending
                            .entry(name.clone())
                            .or_default()
                            .insert(replica, reason);
                    }
                }
            }
        }
        if placed.is_empty() {
            return;
        }
        if self.commit(txn, now).is_err() {
            for (host, job, service, replica) in placed {
                for pl in &mut self.plugins {
                    pl.release(&host, &job);
                }
                self.pending
                    .entry(service)
                    .or_default()
                    .insert(replica, "the controller's store failed".into());
            }
            return;
        }
        self.metrics.placements.inc_by(placed.len() as u64);
    }

    fn desired(&self, host: &str) -> Vec<Assignment> {
        let mut out = Vec::new();
        for j in self.cluster.jobs_on(host) {
            let Some(p) = self.profiles.get(&j.info.service) else {
                continue;
            };
            out.push(Assignment {
                job: j.info.job.clone(),
                service: j.info.service.clone(),
                project: j.info.project.clone(),
                replica: j.info.replica,
                command: p.command.clone(),
                readiness: p.readiness.clone(),
                grants: j.info.grants.clone(),
                desired: if j.effective_state() == JobState::Stopping {
                    Desired::Stop
                } else {
                    Desired::Run
                },
            });
        }
        out
    }

    fn publish_host(&mut self, host: &str) {
        let jobs = self.desired(host);
        let index = self.cluster.rev.max(1);
        match self.assign.get(host) {
            Some(tx) => {
                tx.send_if_modified(|cur| {
                    if cur.jobs == jobs {
                        return false;
                    }
                    *cur = Arc::new(Assignments { index, jobs });
                    true
                });
            }
            None => {
                let (tx, _) = watch::channel(Arc::new(Assignments { index, jobs }));
                self.assign.insert(host.to_owned(), tx);
            }
        }
    }

    /// Publishes the assignments, the readers' view and the metrics.
    fn publish(&mut self) {
        let hosts: Vec<HostId> = self.cluster.hosts.keys().cloned().collect();
        for h in &hosts {
            self.publish_host(h);
        }
        let c = &self.cluster;
        let mut services = BTreeMap::new();
        for s in c.services.values() {
            let mut jobs: Vec<JobView> = c
                .jobs_of(&s.info.name)
                .map(|j| JobView {
                    info: j.info.clone(),
                    summaries: self.grant_summaries(&j.info),
                })
                .collect();
            jobs.sort_by(|a, b| {
                (a.info.replica, job_num(&a.info.job)).cmp(&(b.info.replica, job_num(&b.info.job)))
            });
            let pending = self
                .pending
                .get(&s.info.name)
                .map(|m| m.iter().map(|(r, why)| (*r, why.clone())).collect())
                .unwrap_or_default();
            services.insert(
                s.info.name.clone(),
                ServiceView {
                    info: s.info.clone(),
                    state: s.state,
                    jobs,
                    pending,
                },
            );
        }
        let hosts = c
            .hosts
            .values()
            .map(|h| HostView {
                info: h.info.clone(),
                jobs: c.jobs_on(&h.info.id).count(),
                summaries: self
                    .plugins
                    .iter()
                    .filter_map(|p| p.host_summary(&h.info.id).map(|v| (p.name().to_owned(), v)))
                    .collect(),
            })
            .collect();
        self.view.send_replace(Arc::new(View { services, hosts }));

        let m = &self.metrics;
        for (state, name) in [
            (JobState::Placed, "placed"),
            (JobState::Running, "running"),
            (JobState::Stopping, "stopping"),
            (JobState::Unknown, "unknown"),
        ] {
            m.set_jobs(
                name,
                c.jobs.values().filter(|j| j.info.state == state).count(),
            );
        }
        for (state, name) in [
            (HostState::Ready, "ready"),
            (HostState::Unreachable, "unreachable"),
            (HostState::Lost, "lost"),
        ] {
            m.set_hosts(
                name,
                c.hosts.values().filter(|h| h.info.state == state).count(),
            );
        }
        m.pending
            .set(self.pending.values().map(|p| p.len()).sum::<usize>() as i64);
        m.revision.set(c.rev as i64);
        // Announce last: the readers' view above already includes these changes.
        let events = std::mem::take(&mut self.outbox);
        for e in &events {
            for l in &self.listeners {
                l.on_event(e);
            }
        }
    }

    fn grant_summaries(&self, job: &JobInfo) -> BTreeMap<String, Value> {
        self.plugins
            .iter()
            .filter_map(|p| {
                let g = job.grants.get(p.name())?;
                p.grant_summary(g).map(|v| (p.name().to_owned(), v))
            })
            .collect()
    }
}

/// Runs a blocking store call; on a multi-threaded runtime it tells tokio first, so the
/// worker thread's other tasks move elsewhere during a disk sync.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Job ids are `j-<n>`: sort numerically.
fn job_num(id: &str) -> u64 {
    id.strip_prefix("j-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}

fn round_up_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// A profile from the stored JSON when it no longer validates (plugins reconfigured):
/// keep running the command, without readiness.
fn fallback_profile(s: &ServiceInfo) -> Profile {
    let command = s
        .profile
        .get("command")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    Profile {
        name: s.name.clone(),
        project: s.project.clone(),
        replicas: s.replicas,
        command,
        readiness: None,
        raw: s.profile.clone(),
    }
}
