//! The controller's state machine: owns the cluster, the resource plugins and the store,
//! and applies one command at a time. Synchronous; the state task (`task.rs`) drives it
//! and passes the current time in.
//!
//! Every mutation is built as a [`Txn`], persisted, and only then applied in memory,
//! announced to listeners and answered. Plugin releases happen after the commit.

use super::metrics::Metrics;
use super::model::{
    After, Cluster, HostRec, JobRec, LastExit, LoadError, Released, ServiceRec, ServiceState,
    SlotRec, Txn,
};
use super::quota::{self, Quotas};
use super::rollout::{self, Counts, JobFacts, Phase, Rollout, RolloutState, Stable};
use super::scheduler::{self, Candidate, Request};
use super::DisruptionThreshold;
use crate::profile::{self, Profile};
use crate::proto::{
    Assignment, Assignments, Caller, Desired, ExitCause, RegisterRequest, RegisterResponse,
    WorkerEvent,
};
use crate::store::{Store, StoreError};
use plugin_api::{
    ClusterEvent, ClusterListener, EndReason, FieldError, HostFacts, HostFactsPolicy, HostId,
    HostInfo, HostState, JobId, JobInfo, JobState, Permission, Principal, ResourcePlugin,
    ServiceInfo, ServiceKey,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

/// Timing of host liveness.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) heartbeat_interval: Duration,
    pub(crate) unreachable_after: Duration,
    pub(crate) grace_period: Duration,
    /// See [`DisruptionThreshold`].
    pub(crate) disruption_threshold: DisruptionThreshold,
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
    /// A change the service's state does not allow (e.g. updating a stopping service).
    #[error("{0}")]
    Refused(String),
    #[error("invalid profile")]
    Invalid(Vec<FieldError>),
    #[error("{0}")]
    Quota(quota::Exceeded),
    #[error("host facts refused")]
    FactsRefused(Vec<FieldError>),
    #[error("address {ip} is advertised by live host {other}")]
    AddressTaken { ip: String, other: HostId },
    #[error("host {0:?} is not registered")]
    UnknownHost(HostId),
    /// Another worker instance holds the host (a second worker with the same host id).
    #[error("host {host} is held by another live worker (instance {holder}); check for a second worker with the same host id")]
    HostTaken { host: HostId, holder: String },
    /// The worker joined another cluster (it was pointed at the wrong controller).
    #[error("this controller serves cluster {ours}, the worker belongs to cluster {theirs}")]
    WrongCluster { ours: String, theirs: String },
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
    pub(crate) services: BTreeMap<ServiceKey, ServiceView>,
    pub(crate) hosts: Vec<HostView>,
}

#[derive(Debug, Clone)]
pub(crate) struct ServiceView {
    pub(crate) info: ServiceInfo,
    pub(crate) state: ServiceState,
    pub(crate) jobs: Vec<JobView>,
    /// `(replica, reason)` of replicas without a live job.
    pub(crate) pending: Vec<(u32, String)>,
    pub(crate) rollout: Rollout,
    pub(crate) counts: Counts,
    /// The history of each replica slot that has one (restarts, last exit, last log).
    pub(crate) slots: BTreeMap<u32, SlotRec>,
}

/// What a create-or-update did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    Created,
    /// A new generation (a rollout started), or new settings or replica count in place.
    Updated,
    Unchanged,
}

#[derive(Debug, Clone)]
pub(crate) struct JobView {
    pub(crate) info: JobInfo,
    /// Plugin grant summaries by plugin name.
    pub(crate) summaries: BTreeMap<String, Value>,
    /// Its log file on its host, once the worker reported the start.
    pub(crate) log: Option<String>,
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
    /// The cluster's identity, from the store (created with it).
    cluster_id: String,
    cluster: Cluster,
    plugins: Vec<Box<dyn ResourcePlugin>>,
    policies: Vec<Arc<dyn HostFactsPolicy>>,
    listeners: Vec<Arc<dyn ClusterListener>>,
    store: Arc<dyn Store>,
    metrics: Metrics,
    /// Parsed profiles of the services' current generations (command, readiness, drain,
    /// update policy).
    profiles: HashMap<ServiceKey, Profile>,
    /// Parsed profiles of older generations that still have jobs, by (service, generation).
    older: HashMap<(ServiceKey, u64), Profile>,
    /// When each ready job became ready (not persisted: a restart waits `min_ready` again).
    ready_since: HashMap<JobId, Instant>,
    /// When each draining job's drain ends (not persisted: a restart drains in full again,
    /// so a restart never shortens a drain).
    drain_until: HashMap<JobId, Instant>,
    /// Each running rollout's last progress (see [`rollout::progress_mark`]) and when it
    /// changed (not persisted: a restart gives a rollout a fresh `deadline`).
    progress: HashMap<ServiceKey, (rollout::Mark, Instant)>,
    /// When each host was last heard from (not persisted: a restart hears from all).
    heard: HashMap<HostId, Instant>,
    /// A full disruption is on: so many hosts are unreachable at once that this controller
    /// suspects itself or its network, and declares no host lost (see [`Core::tick`]).
    /// Not persisted: a restart gives every host a fresh window anyway.
    disrupted: bool,
    /// Hosts whose jobs a full disruption took out of the endpoints (see
    /// [`Core::withhold`]); they arm no timer until heard, lost, or the disruption ends.
    withheld: BTreeSet<HostId>,
    /// When each running job started running (for the backoff reset).
    running_since: HashMap<JobId, Instant>,
    backoff: HashMap<(ServiceKey, u32), Backoff>,
    pending: BTreeMap<ServiceKey, BTreeMap<u32, String>>,
    assign: HashMap<HostId, watch::Sender<Arc<Assignments>>>,
    view: watch::Sender<Arc<View>>,
    /// Something changed since the last [`Core::settle`].
    dirty: bool,
    /// Committed events not yet announced: listeners hear of a change only after the
    /// readers' view includes it (see [`Core::publish`]), so no read path is ahead of
    /// the controller's own (`/v1/hosts` never behind the endpoints).
    outbox: Vec<ClusterEvent>,
    /// Per-project limits on what services declare.
    quotas: Quotas,
    /// The `now` of the last scheduling pass (see [`Core::next_deadline`]).
    last_pass: Option<Instant>,
    /// After a failed commit in a timer: do not retry before this (no busy loop while the
    /// store is down).
    store_retry: Option<Instant>,
    /// Why the store refuses every commit until this controller reloads (see
    /// [`StoreError::Stale`]): it must stop rather than run on a view it cannot change.
    fatal: Option<String>,
    /// The wall clock, for the times operators read (a replica's last exit); everything
    /// the controller decides runs on the monotonic `now` it is given instead.
    wall: fn() -> SystemTime,
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
        let cluster_id = ensure_cluster_id(&*store)?;
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
        // Live grants first, then the recently ended jobs' grants again, restored and
        // released in the order they ended: the plugins' free order (a just-released port
        // is handed out last) survives a restart or a takeover. A grant now held by a live
        // job is refused by `restore` and skipped.
        let mut replay: Vec<(HostId, Released)> = Vec::new();
        for h in cluster.hosts.values() {
            for r in &h.released {
                replay.push((h.info.id.clone(), r.clone()));
            }
        }
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
        for (host, r) in &replay {
            for p in &mut plugins {
                if let Some(g) = r.grants.get(p.name()) {
                    if p.restore(host, &r.job, g).is_ok() {
                        p.release(host, &r.job);
                    }
                }
            }
        }
        let mut profiles = HashMap::new();
        let mut older = HashMap::new();
        for svc in cluster.services.values() {
            profiles.insert(
                svc.info.key(),
                stored_profile(&plugins, &svc.info, &svc.info.profile),
            );
            for (g, raw) in &svc.older {
                older.insert(
                    (svc.info.key(), *g),
                    stored_profile(&plugins, &svc.info, raw),
                );
            }
        }
        let mut ready_since = HashMap::new();
        let mut drain_until = HashMap::new();
        for j in cluster.jobs.values() {
            if j.info.ready {
                ready_since.insert(j.info.job.clone(), now);
            }
            if j.effective_state() == JobState::Draining {
                let drain = profiles
                    .get(&j.info.service_key())
                    .map_or(profile::DEFAULT_DRAIN, |p| p.drain);
                drain_until.insert(j.info.job.clone(), now + drain);
            }
        }
        let snapshot = cluster.snapshot();
        for l in &listeners {
            l.resync(&snapshot);
        }
        let heard = cluster.hosts.keys().map(|h| (h.clone(), now)).collect();
        info!(
            cluster = %cluster_id,
            rev = cluster.rev,
            services = cluster.services.len(),
            jobs = cluster.jobs.len(),
            hosts = cluster.hosts.len(),
            "controller state loaded"
        );
        let (view, _) = watch::channel(Arc::new(View::default()));
        let mut core = Core {
            timing,
            cluster_id,
            cluster,
            plugins,
            policies,
            listeners,
            store,
            metrics,
            profiles,
            older,
            ready_since,
            drain_until,
            progress: HashMap::new(),
            last_pass: None,
            quotas: Quotas::default(),
            heard,
            disrupted: false,
            withheld: BTreeSet::new(),
            running_since,
            backoff: HashMap::new(),
            pending: BTreeMap::new(),
            assign: HashMap::new(),
            view,
            dirty: true,
            store_retry: None,
            fatal: None,
            outbox: Vec::new(),
            wall: SystemTime::now,
        };
        if !core.cluster.legacy_keys.is_empty() {
            // Records written before services were keyed by project move to their
            // canonical keys (`project/name`) once, in one batch.
            let mut txn = Txn::new(&core.cluster);
            txn.migrate_keys(&core.cluster);
            match core.commit(txn, now) {
                Ok(()) => info!("service records moved to their project-scoped keys"),
                Err(e) => {
                    warn!(error = %e, "moving service records to project-scoped keys failed; trying again at the next start")
                }
            }
        }
        core.publish();
        Ok(core)
    }

    /// The cluster's identity.
    pub(crate) fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// Replaces the wall clock (tests pin it, so answers that show times are stable).
    #[cfg(test)]
    pub(crate) fn set_wall_clock(&mut self, wall: fn() -> SystemTime) {
        self.wall = wall;
    }

    /// Sets the per-project quotas (checked on every create, update and scale).
    pub(crate) fn set_quotas(&mut self, quotas: Quotas) {
        self.quotas = quotas;
    }

    /// Refuses a change that would take `project` past a quota: `change` is the service
    /// `name` as it would be (`None`: gone), with its replicas and per-replica quantities.
    fn check_quota(
        &self,
        project: &str,
        name: &ServiceKey,
        change: Option<(u32, &BTreeMap<String, u64>)>,
    ) -> Result<(), CoreError> {
        let Some(limits) = self.quotas.of(project) else {
            return Ok(());
        };
        let (mut before, mut after) = (quota::Use::default(), quota::Use::default());
        for s in self.cluster.services.values() {
            if s.info.project != project || s.state == ServiceState::Stopping {
                continue;
            }
            let q = self
                .profiles
                .get(&s.info.key())
                .map(|p| p.quantities.clone())
                .unwrap_or_default();
            before.add(s.info.replicas, &q);
            if s.info.key() != *name {
                after.add(s.info.replicas, &q);
            }
        }
        if let Some((replicas, q)) = change {
            after.add(replicas, q);
        }
        // What the project holds now: every live job (draining and stopping ones keep
        // their ports until they exit, a rollout's surge too) and every service not yet
        // gone. Held beyond what the profiles declare stays counted, so scaling down and
        // up again, or stopping and creating, cannot take a project past its quota while
        // old replicas drain.
        let mut held = quota::Use::default();
        for s in self.cluster.services.values() {
            if s.info.project == project {
                held.add_service();
            }
        }
        for j in self.cluster.jobs.values() {
            if j.info.project == project {
                let q = self
                    .profiles
                    .get(&j.info.service_key())
                    .map(|p| p.quantities.clone())
                    .unwrap_or_default();
                held.add_replica(&q);
            }
        }
        let (before, after) = quota::with_held(&before, &after, &held);
        quota::check(project, limits, &before, &after).map_err(|e| {
            warn!(project = %e.project, quota = %e.quota, limit = e.limit, used = e.used, wanted = e.wanted, "change refused: quota exceeded");
            CoreError::Quota(e)
        })
    }

    pub(crate) fn view(&self) -> watch::Receiver<Arc<View>> {
        self.view.subscribe()
    }

    /// The host's desired-set watch, for the worker instance that holds the host.
    pub(crate) fn assignments(
        &mut self,
        host: &HostId,
        caller: &Caller,
    ) -> Result<watch::Receiver<Arc<Assignments>>, CoreError> {
        self.check_holder(host, caller, "assignments query")?;
        self.publish_host(host);
        self.assign
            .get(host)
            .map(|tx| tx.subscribe())
            .ok_or_else(|| CoreError::UnknownHost(host.clone()))
    }

    /// Persists, applies, announces, then makes the plugin calls due.
    fn commit(&mut self, txn: Txn, now: Instant) -> Result<(), CoreError> {
        if txn.is_empty() {
            return Ok(());
        }
        let batch = txn.batch();
        if let Err(e) = blocking(|| self.store.commit(batch)) {
            error!(error = %e, "store commit failed; change not applied");
            // A stale view, or a store that cannot write (a full disk: redb then refuses
            // every later write until reopened): stop, so a supervisor or a standby takes
            // over with a fresh one, instead of running on, refusing every change while
            // looking healthy.
            if matches!(e, StoreError::Stale(_) | StoreError::Io { .. }) {
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
            ClusterEvent::ServiceRemoved { rev, name, project } => {
                info!(service = %name, project = %project, rev, "service removed");
                let key = ServiceKey::new(project, name);
                self.profiles.remove(&key);
                self.pending.remove(&key);
                self.progress.remove(&key);
                self.older.retain(|(k, _), _| *k != key);
                self.backoff.retain(|(s, _), _| *s != key);
                self.metrics.service_removed(project, name);
            }
            ClusterEvent::Job { rev, job } => {
                info!(service = %job.service, job = %job.job, host = %job.host, replica = job.replica, state = %job.state, ready = job.ready, rev, "job changed");
                if job.state == JobState::Running {
                    self.running_since.entry(job.job.clone()).or_insert(now);
                }
                if job.ready {
                    self.ready_since.entry(job.job.clone()).or_insert(now);
                } else {
                    self.ready_since.remove(&job.job);
                }
                let draining = self
                    .cluster
                    .jobs
                    .get(&job.job)
                    .is_some_and(|j| j.effective_state() == JobState::Draining);
                if draining {
                    let drain = self
                        .profiles
                        .get(&job.service_key())
                        .map_or(profile::DEFAULT_DRAIN, |p| p.drain);
                    self.drain_until
                        .entry(job.job.clone())
                        .or_insert(now + drain);
                } else {
                    self.drain_until.remove(&job.job);
                }
            }
            ClusterEvent::JobEnded { rev, job, reason } => {
                info!(service = %job.service, job = %job.job, host = %job.host, replica = job.replica, reason = %reason, rev, "job ended");
                let since = self.running_since.remove(&job.job);
                self.ready_since.remove(&job.job);
                self.drain_until.remove(&job.job);
                let active = self
                    .cluster
                    .services
                    .get(&job.service_key())
                    .is_some_and(|s| s.state == ServiceState::Active);
                // The ends `record_end` counted as restarts.
                if active && matches!(reason, EndReason::Exited { .. } | EndReason::Refused { .. })
                {
                    self.metrics.replica_restarted(&job.project, &job.service);
                }
                if let EndReason::Exited { .. } = reason {
                    if active {
                        let key = (job.service_key(), job.replica);
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
                info!(host = %host.id, state = %host.state, ip_addr = %display_ip(host.facts.ip_addr), rev, "host changed")
            }
        }
    }

    // --- API commands ---

    /// Creates a service, or with `path` (a `PUT` to that name) creates or updates it: a
    /// changed profile is a new generation (a rollout), a change of only `replicas`,
    /// `drain` or `[service.update]` applies in place, the same profile changes nothing.
    pub(crate) fn submit(
        &mut self,
        doc: Value,
        path: Option<&str>,
        who: &Principal,
        now: Instant,
    ) -> Result<(ServiceKey, Applied), CoreError> {
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
            let mut errs = Vec::new();
            let body_name = doc
                .get("service")
                .and_then(|s| s.get("name"))
                .and_then(Value::as_str);
            if let (Some(path), Some(body)) = (path, body_name) {
                if path != body {
                    errs.push(FieldError::new(
                        "service.name",
                        format!("is {body:?}, but the request is for service {path:?}"),
                    ));
                }
            }
            match profile::validate(&doc, &refs) {
                Ok(p) if errs.is_empty() => p,
                Ok(_) => return Err(CoreError::Invalid(errs)),
                Err(mut e) => {
                    errs.append(&mut e);
                    return Err(CoreError::Invalid(errs));
                }
            }
        };
        let key = ServiceKey::new(&profile.project, &profile.name);
        let name = profile.name.clone();
        let Some(cur) = self.cluster.services.get(&key).cloned() else {
            self.check_quota(
                &profile.project,
                &key,
                Some((profile.replicas, &profile.quantities)),
            )?;
            let mut txn = Txn::new(&self.cluster);
            let mut rollout = Rollout::default();
            rollout.begin();
            txn.put_service(ServiceRec {
                info: ServiceInfo {
                    name: name.clone(),
                    project: profile.project.clone(),
                    replicas: profile.replicas,
                    profile: profile.raw.clone(),
                    rev: 0,
                    generation: plugin_api::first_generation(),
                },
                state: ServiceState::Active,
                rollout,
                older: BTreeMap::new(),
                slots: BTreeMap::new(),
            });
            self.profiles.insert(key.clone(), profile);
            if let Err(e) = self.commit(txn, now) {
                self.profiles.remove(&key);
                return Err(e);
            }
            info!(service = %name, project = %key.project, principal = %who.name, "service submitted");
            return Ok((key, Applied::Created));
        };
        if path.is_none() {
            return Err(CoreError::Conflict(name));
        }
        if !who.may(Permission::JobView, &cur.info.project) {
            return Err(CoreError::Forbidden(format!(
                "no job.view permission on project {:?}",
                cur.info.project
            )));
        }
        if cur.state == ServiceState::Stopping {
            return Err(CoreError::Refused(format!(
                "service {name:?} is stopping; submit it again once it is gone"
            )));
        }
        if cur.info.profile == profile.raw {
            return Ok((key, Applied::Unchanged));
        }
        self.check_quota(
            &profile.project,
            &key,
            Some((profile.replicas, &profile.quantities)),
        )?;
        let mut svc = cur.clone();
        let new_generation = !rollout::same_template(&cur.info.profile, &profile.raw);
        if new_generation {
            self.next_generation(&mut svc);
            info!(service = %name, project = %key.project, generation = svc.info.generation, principal = %who.name, "new profile: rolling out a new generation");
        } else if cur.info.replicas != profile.replicas {
            svc.rollout.begin();
            info!(service = %name, project = %key.project, replicas = profile.replicas, principal = %who.name, "service scaled");
        }
        svc.info.replicas = profile.replicas;
        svc.info.profile = profile.raw.clone();
        self.commit_service(svc, profile, now)?;
        Ok((key, Applied::Updated))
    }

    /// Makes `svc`'s current profile an older generation and starts a rollout of the next.
    fn next_generation(&self, svc: &mut ServiceRec) {
        let g = svc.info.generation;
        if self
            .cluster
            .jobs_of(&svc.info.key())
            .any(|j| j.info.generation == g)
        {
            svc.older.insert(g, svc.info.profile.clone());
        }
        svc.info.generation = g + 1;
        svc.rollout.begin();
        self.metrics.rollouts_started.inc();
    }

    /// Commits a changed service record whose current profile is `profile`.
    fn commit_service(
        &mut self,
        svc: ServiceRec,
        profile: Profile,
        now: Instant,
    ) -> Result<(), CoreError> {
        self.commit_service_with(svc, profile, Vec::new(), now)
    }

    /// [`commit_service`](Self::commit_service), with job changes in the same batch.
    fn commit_service_with(
        &mut self,
        svc: ServiceRec,
        profile: Profile,
        jobs: Vec<JobRec>,
        now: Instant,
    ) -> Result<(), CoreError> {
        let name = svc.info.key();
        let mut svc = svc;
        // Slots scaled away lose their history: scaled up again, they start afresh.
        let replicas = svc.info.replicas;
        svc.slots.retain(|r, _| *r < replicas);
        let mut txn = Txn::new(&self.cluster);
        for j in jobs {
            txn.put_job(&self.cluster, j);
        }
        let moved: Vec<(u64, Value)> = svc
            .older
            .iter()
            .filter(|(g, _)| !self.older.contains_key(&(name.clone(), **g)))
            .map(|(g, v)| (*g, v.clone()))
            .collect();
        txn.put_service(svc);
        let before = self.profiles.insert(name.clone(), profile);
        for (g, raw) in moved {
            let info = &self.cluster.services[&name].info;
            let p = stored_profile(&self.plugins, info, &raw);
            self.older.insert((name.clone(), g), p);
        }
        self.progress.remove(&name);
        if let Err(e) = self.commit(txn, now) {
            match before {
                Some(p) => self.profiles.insert(name.clone(), p),
                None => self.profiles.remove(&name),
            };
            return Err(e);
        }
        Ok(())
    }

    /// The service `name` for a change by `who`: invisible answers as unknown.
    fn service_for_change(
        &self,
        key: &ServiceKey,
        who: &Principal,
    ) -> Result<ServiceRec, CoreError> {
        let Some(svc) = self.cluster.services.get(key).cloned() else {
            return Err(CoreError::ServiceNotFound(key.name.clone()));
        };
        if !who.may(Permission::JobView, &svc.info.project) {
            return Err(CoreError::ServiceNotFound(key.name.clone()));
        }
        if !who.may(Permission::JobSubmit, &svc.info.project) {
            return Err(CoreError::Forbidden(format!(
                "no job.submit permission on project {:?}",
                svc.info.project
            )));
        }
        Ok(svc)
    }

    /// Sets the replica count: new replicas run the current generation; scaling down
    /// drains the highest-numbered replicas.
    pub(crate) fn scale(
        &mut self,
        key: &ServiceKey,
        replicas: u64,
        who: &Principal,
        now: Instant,
    ) -> Result<(), CoreError> {
        let mut svc = self.service_for_change(key, who)?;
        let name = &key.name;
        if !(1..=profile::MAX_REPLICAS).contains(&replicas) {
            return Err(CoreError::Invalid(vec![FieldError::new(
                "replicas",
                format!("must be between 1 and {}", profile::MAX_REPLICAS),
            )]));
        }
        let replicas = replicas as u32;
        if svc.state == ServiceState::Stopping {
            return Err(CoreError::Refused(format!("service {name:?} is stopping")));
        }
        if svc.info.replicas == replicas {
            return Ok(());
        }
        let mut profile = self.profiles[key].clone();
        self.check_quota(
            &svc.info.project,
            key,
            Some((replicas, &profile.quantities)),
        )?;
        profile.replicas = replicas;
        if let Some(m) = profile.raw.as_object_mut() {
            m.insert("replicas".into(), Value::from(replicas));
        }
        svc.info.replicas = replicas;
        svc.info.profile = profile.raw.clone();
        svc.rollout.begin();
        self.commit_service(svc, profile, now)?;
        info!(service = %name, project = %key.project, replicas, principal = %who.name, "service scaled");
        Ok(())
    }

    /// Rolls every replica over to a fresh one: the same profile as a new generation.
    pub(crate) fn restart(
        &mut self,
        key: &ServiceKey,
        who: &Principal,
        now: Instant,
    ) -> Result<(), CoreError> {
        let mut svc = self.service_for_change(key, who)?;
        let name = &key.name;
        if svc.state == ServiceState::Stopping {
            return Err(CoreError::Refused(format!("service {name:?} is stopping")));
        }
        self.next_generation(&mut svc);
        let profile = self.profiles[key].clone();
        let generation = svc.info.generation;
        self.commit_service(svc, profile, now)?;
        info!(service = %name, project = %key.project, generation, principal = %who.name, "service restarting");
        Ok(())
    }

    /// Stops a service: its running jobs drain (leave the endpoint, then get SIGTERM after
    /// `drain`), or with `now` stop at once; they end when their workers report them
    /// exited. Returns how many jobs are leaving.
    pub(crate) fn delete(
        &mut self,
        key: &ServiceKey,
        now_please: bool,
        who: &Principal,
        now: Instant,
    ) -> Result<usize, CoreError> {
        let svc = self.service_for_change(key, who)?;
        let name = &key.name;
        let jobs: Vec<JobRec> = self.cluster.jobs_of(key).cloned().collect();
        let mut txn = Txn::new(&self.cluster);
        if svc.state != ServiceState::Stopping {
            txn.put_service(ServiceRec {
                state: ServiceState::Stopping,
                ..svc.clone()
            });
        }
        let drain = if now_please {
            Duration::ZERO
        } else {
            self.profiles
                .get(key)
                .map_or(profile::DEFAULT_DRAIN, |p| p.drain)
        };
        for j in &jobs {
            // `--now` also cuts short the drains already running.
            if j.effective_state() != JobState::Draining || now_please {
                self.leave(&mut txn, j.clone(), drain);
            }
        }
        if jobs.is_empty() {
            let s = txn.service(&self.cluster, key).expect("service in txn");
            txn.remove_service(&s);
        }
        self.commit(txn, now)?;
        info!(service = %name, project = %key.project, principal = %who.name, jobs = jobs.len(), drain = ?drain, "service stopping");
        Ok(jobs.len())
    }

    /// Puts a job on its way out: a running one drains first (it leaves the endpoint
    /// now and gets SIGTERM after `drain`), anything else stops at once.
    fn leave(&self, txn: &mut Txn, mut j: JobRec, drain: Duration) {
        let eff = j.effective_state();
        let to = match eff {
            JobState::Running if !drain.is_zero() => JobState::Draining,
            JobState::Placed | JobState::Running | JobState::Draining => JobState::Stopping,
            JobState::Unknown | JobState::Stopping | JobState::Exited | JobState::Lost => return,
        };
        if j.info.state == JobState::Unknown {
            j.held = Some(to);
        } else {
            j.info.state = to;
        }
        j.info.ready = false;
        j.held_ready = None;
        txn.put_job(&self.cluster, j);
    }

    // --- worker commands ---

    fn check_facts(&self, host: &HostId, facts: &HostFacts) -> Result<(), CoreError> {
        // One live host per advertised address: a worker credential must not be able to
        // send another host's endpoint traffic to itself (or anyone's to it).
        if let Some(ip) = facts.ip_addr {
            let other = self.cluster.hosts.values().find(|h| {
                h.info.id != *host
                    && h.info.state != HostState::Lost
                    && h.info.facts.ip_addr == Some(ip)
            });
            if let Some(other) = other {
                warn!(host = %host, ip_addr = %ip, advertised_by = %other.info.id, "host facts refused: the address is another live host's");
                return Err(CoreError::AddressTaken {
                    ip: ip.to_string(),
                    other: other.info.id.clone(),
                });
            }
        }
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

    /// A worker of another cluster is refused before anything else.
    fn check_cluster(&self, host: &HostId, caller: &Caller, what: &str) -> Result<(), CoreError> {
        match &caller.cluster {
            Some(theirs) if *theirs != self.cluster_id => {
                warn!(host = %host, cluster = %self.cluster_id, worker_cluster = %theirs, instance = %caller.instance_or_none(), peer = %caller.peer.as_deref().unwrap_or("unknown"), "{what} refused: the worker belongs to another cluster (pointed at the wrong controller?)");
                Err(CoreError::WrongCluster {
                    ours: self.cluster_id.clone(),
                    theirs: theirs.clone(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Heartbeats, facts, events and assignment queries: only from this cluster's worker
    /// instance that holds the host (a second worker with the same host id neither
    /// reports nor takes orders). A host held by no known instance (a record from before
    /// instance ids) accepts any.
    fn check_holder(&self, host: &HostId, caller: &Caller, what: &str) -> Result<(), CoreError> {
        self.check_cluster(host, caller, what)?;
        let Some(h) = self.cluster.hosts.get(host) else {
            return Err(CoreError::UnknownHost(host.clone()));
        };
        match &h.instance {
            Some(holder) if caller.instance.as_ref() != Some(holder) => {
                // Debug only: a refused duplicate repeats these every second; its
                // registration attempts are the warnings.
                debug!(host = %host, holder = %holder, instance = %caller.instance_or_none(), peer = %caller.peer.as_deref().unwrap_or("unknown"), "{what} refused: another worker instance holds the host");
                Err(CoreError::HostTaken {
                    host: host.clone(),
                    holder: holder.clone(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Whether the host's holder is live: `ready` and heard from within
    /// `unreachable_after` (every host gets a fresh window when the controller loads).
    fn holder_live(&self, h: &HostRec, now: Instant) -> bool {
        h.info.state == HostState::Ready
            && self
                .heard
                .get(&h.info.id)
                .is_some_and(|t| now.saturating_duration_since(*t) < self.timing.unreachable_after)
    }

    /// A worker (re)registers: the instance that holds the host, or a new one once the
    /// holder is gone (unreachable or lost). A registration from another instance while
    /// the holder is live is refused before anything is applied: no facts, no plugin
    /// call, nothing committed.
    pub(crate) fn register(
        &mut self,
        host: &HostId,
        caller: &Caller,
        req: RegisterRequest,
        now: Instant,
    ) -> Result<RegisterResponse, CoreError> {
        if let Err(e) = self.check_cluster(host, caller, "registration") {
            self.metrics.registration_refused("wrong_cluster");
            return Err(e);
        }
        let holder = self.cluster.hosts.get(host).and_then(|h| {
            h.instance
                .clone()
                .filter(|i| caller.instance.as_ref() != Some(i))
                .map(|i| (i, self.holder_live(h, now)))
        });
        match &holder {
            Some((holder, true)) => {
                warn!(host = %host, holder = %holder, instance = %caller.instance_or_none(), peer = %caller.peer.as_deref().unwrap_or("unknown"), "registration refused: another live worker instance holds the host (a second worker with the same host id?)");
                self.metrics.registration_refused("host_taken");
                return Err(CoreError::HostTaken {
                    host: host.clone(),
                    holder: holder.clone(),
                });
            }
            Some((holder, false)) => {
                warn!(host = %host, previous = %holder, instance = %caller.instance_or_none(), peer = %caller.peer.as_deref().unwrap_or("unknown"), "a new worker instance takes the host over (its previous worker is gone)");
            }
            None => {}
        }
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
                    j.held_ready = None;
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
                        // The worker no longer has it (its own data dir was lost, or it
                        // ended while no worker watched): how it ended is unknown.
                        self.record_end(&mut txn, &j, ExitCause::default(), None);
                        txn.end_job(&self.cluster, j, EndReason::Exited { code: None }, false)
                    }
                    JobState::Stopping | JobState::Draining => {
                        txn.end_job(&self.cluster, j, EndReason::Stopped, false)
                    }
                    _ => {
                        // Placed: not started yet; the worker starts it from its assignments.
                        if j.info.state == JobState::Unknown {
                            j.info.state = eff;
                            j.held = None;
                            j.held_ready = None;
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
        let released = txn
            .host(&self.cluster, host)
            .map(|h| h.released)
            .unwrap_or_default();
        txn.put_host(
            &self.cluster,
            HostRec {
                info: HostInfo {
                    id: host.clone(),
                    state: HostState::Ready,
                    facts: req.facts,
                },
                orphans,
                released,
                instance: caller.instance.clone(),
            },
        );
        self.commit(txn, now)?;
        self.heard.insert(host.clone(), now);
        self.withheld.remove(host);
        info!(host = %host, instance = %caller.instance_or_none(), "host registered");
        Ok(RegisterResponse {
            heartbeat_ms: self.timing.heartbeat_interval.as_millis() as u64,
            cluster: Some(self.cluster_id.clone()),
        })
    }

    pub(crate) fn heartbeat(
        &mut self,
        host: &HostId,
        caller: &Caller,
        now: Instant,
    ) -> Result<(), CoreError> {
        self.check_holder(host, caller, "heartbeat")?;
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
                        // Back in the endpoints if a full disruption took it out.
                        if let Some(ready) = j.held_ready.take() {
                            j.info.ready = ready;
                        }
                        txn.put_job(&self.cluster, j);
                    }
                }
                let mut h = h;
                h.info.state = HostState::Ready;
                txn.put_host(&self.cluster, h);
                self.commit(txn, now)?;
                self.withheld.remove(host);
                info!(host = %host, "host reachable again");
            }
        }
        self.heard.insert(host.clone(), now);
        Ok(())
    }

    pub(crate) fn facts(
        &mut self,
        host: &HostId,
        caller: &Caller,
        facts: HostFacts,
        now: Instant,
    ) -> Result<(), CoreError> {
        self.check_holder(host, caller, "facts report")?;
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
        caller: &Caller,
        events: Vec<WorkerEvent>,
        now: Instant,
    ) -> Result<(), CoreError> {
        self.check_holder(host, caller, "events report")?;
        // A job whose host a full disruption took out of the endpoints stays out until the
        // host is heard (a heartbeat), whatever readiness it reports meanwhile.
        let withheld = self.withheld.contains(host);
        let mut txn = Txn::new(&self.cluster);
        for ev in events {
            let id = ev.job().clone();
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
                WorkerEvent::Started { log, .. } => {
                    if eff == JobState::Placed {
                        if j.info.state == JobState::Unknown {
                            j.held = Some(JobState::Running);
                        } else {
                            j.info.state = JobState::Running;
                        }
                        j.log = log.or(j.log);
                        txn.put_job(&self.cluster, j);
                    }
                }
                WorkerEvent::Readiness { ready, .. } => {
                    let held =
                        j.held_ready.is_some() || (withheld && j.info.state == JobState::Unknown);
                    if eff == JobState::Running && held {
                        // Out of the endpoints until its host is heard again.
                        if j.held_ready != Some(ready) {
                            j.held_ready = Some(ready);
                            txn.put_job_quiet(j);
                        }
                    } else if eff == JobState::Running && j.info.ready != ready {
                        j.info.ready = ready;
                        txn.put_job(&self.cluster, j);
                    }
                }
                WorkerEvent::Exited {
                    code,
                    signal,
                    error,
                    log,
                    ..
                } => {
                    let leaving = matches!(eff, JobState::Stopping | JobState::Draining);
                    let reason = if leaving {
                        EndReason::Stopped
                    } else {
                        let cause = ExitCause {
                            code,
                            signal,
                            error,
                        };
                        self.record_end(&mut txn, &j, cause, log);
                        EndReason::Exited { code }
                    };
                    let (service, generation) = (j.info.service_key(), j.info.generation);
                    txn.end_job(&self.cluster, j, reason, false);
                    // A replica of the generation being rolled out that dies counts
                    // against the rollout (persisted with the exit itself).
                    if let Some(mut s) = txn.service(&self.cluster, &service) {
                        if !leaving
                            && s.state == ServiceState::Active
                            && s.info.generation == generation
                            && s.rollout.is_running(generation)
                        {
                            s.rollout.exits += 1;
                            txn.put_service_quiet(s);
                        }
                    }
                }
                WorkerEvent::Refused { refusal, .. } => {
                    warn!(host = %host, job = %id, plugin = %refusal.plugin, reason = %refusal.reason, "launch refused; placing the replica again");
                    let cause = ExitCause {
                        error: Some(format!(
                            "launch refused by {}: {}",
                            refusal.plugin, refusal.reason
                        )),
                        ..ExitCause::default()
                    };
                    self.record_end(&mut txn, &j, cause, None);
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

    /// Records in its slot (in the same batch as the end itself) that job `j` ended by
    /// itself as `cause` says, its output in `log`: one more restart, the last exit, the
    /// last log. Only for an active service: a stopping one places no replacement.
    fn record_end(&self, txn: &mut Txn, j: &JobRec, cause: ExitCause, log: Option<String>) {
        let key = j.info.service_key();
        let Some(mut s) = txn.service(&self.cluster, &key) else {
            return;
        };
        if s.state != ServiceState::Active {
            return;
        }
        let at = humantime::format_rfc3339_millis((self.wall)()).to_string();
        let log = log.or_else(|| j.log.clone());
        let slot = s.slots.entry(j.info.replica).or_default();
        slot.restarts += 1;
        slot.last_exit = Some(LastExit {
            job: j.info.job.clone(),
            host: j.info.host.clone(),
            at,
            cause: cause.clone(),
        });
        if log.is_some() {
            slot.log = log;
            slot.log_host = Some(j.info.host.clone());
        }
        warn!(service = %key.name, project = %key.project, replica = j.info.replica, job = %j.info.job, host = %j.info.host, cause = %cause, restarts = slot.restarts, log = slot.log.as_deref().unwrap_or("unknown"), "replica ended by itself; a replacement follows");
        txn.put_service_quiet(s);
    }

    // --- timers ---

    /// The next instant something is due (a host deadline or a backoff), if any.
    pub(crate) fn next_deadline(&self, now: Instant) -> Option<Instant> {
        // A full disruption that the hosts heard from since have ended is judged at once.
        let disruption = (self.disrupted && !self.full_disruption_now()).then_some(now);
        let hosts = self.cluster.hosts.values().filter_map(|h| {
            let heard = self.heard.get(&h.info.id).copied().unwrap_or(now);
            match h.info.state {
                HostState::Ready => Some(heard + self.timing.unreachable_after),
                // During a full disruption a host past its grace period waits to be
                // heard (or for the disruption to end): no timer, or it would fire
                // again and again.
                HostState::Unreachable
                    if self.disrupted
                        && now.saturating_duration_since(heard) >= self.timing.grace_period
                        && self.withheld.contains(&h.info.id) =>
                {
                    None
                }
                HostState::Unreachable => Some(heard + self.timing.grace_period),
                HostState::Lost => None,
            }
        });
        let backoffs = self
            .backoff
            .values()
            .filter(|b| !b.over)
            .map(|b| b.not_before);
        let drains = self.drain_until.values().copied();
        // Rollout timers are due while the last pass has not seen them over (a pass whose
        // `now` was taken before a slow commit may not have): a past one fires at once.
        let seen = self.last_pass;
        let mut rollouts: Vec<Instant> = Vec::new();
        for (name, (_, since)) in &self.progress {
            if let Some(p) = self.profiles.get(name) {
                rollouts.push(*since + p.update.deadline);
                if !p.update.min_ready.is_zero() {
                    let generation = self.cluster.services.get(name).map(|s| s.info.generation);
                    for j in self.cluster.jobs_of(name) {
                        if j.info.ready && Some(j.info.generation) == generation {
                            if let Some(t) = self.ready_since.get(&j.info.job) {
                                rollouts.push(*t + p.update.min_ready);
                            }
                        }
                    }
                }
            }
        }
        let rollouts = rollouts.into_iter().filter(|t| seen.is_none_or(|s| *t > s));
        let next = hosts
            .chain(disruption)
            .chain(backoffs)
            .chain(drains)
            .chain(rollouts)
            .min()?;
        Some(match self.store_retry {
            Some(r) => next.max(r),
            None => next,
        })
    }

    /// How late a timer may fire before the controller counts itself as not having run:
    /// a couple of heartbeats (a busy machine delays timers a little; a paused process by
    /// far more).
    fn lag_tolerance(&self) -> Duration {
        (self.timing.heartbeat_interval * 2).max(Duration::from_secs(1))
    }

    /// Ends the drains that are over: those jobs get SIGTERM now (`Stopping`).
    fn end_drains(&mut self, now: Instant) {
        let over: Vec<JobId> = self
            .drain_until
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(j, _)| j.clone())
            .collect();
        if over.is_empty() {
            return;
        }
        let mut txn = Txn::new(&self.cluster);
        for id in &over {
            let Some(mut j) = self.cluster.jobs.get(id).cloned() else {
                continue;
            };
            if j.effective_state() != JobState::Draining {
                continue;
            }
            if j.info.state == JobState::Unknown {
                j.held = Some(JobState::Stopping);
            } else {
                j.info.state = JobState::Stopping;
            }
            txn.put_job(&self.cluster, j);
        }
        if self.commit(txn, now).is_ok() {
            for id in over {
                self.drain_until.remove(&id);
            }
        }
    }

    /// Ends drains that are over; moves silent hosts to unreachable, then lost.
    ///
    /// `armed` is the deadline the state task slept until. Waking much later than that
    /// means this controller was not running (paused, starved, a frozen VM, a clock jump):
    /// hosts could not be heard meanwhile, so every host gets a fresh `unreachable_after`
    /// window instead of being judged on silence that was this controller's own.
    ///
    /// When most hosts are unreachable at once (a full disruption, see
    /// [`DisruptionThreshold`]), the likelier cause is this controller or its network:
    /// no host is declared lost meanwhile. A host silent past its grace period then stays
    /// unreachable with its jobs kept (grants held, nothing placed elsewhere) but out of
    /// the endpoints.
    pub(crate) fn tick(&mut self, now: Instant, armed: Option<Instant>) {
        let lag = armed.map_or(Duration::ZERO, |d| now.saturating_duration_since(d));
        if lag > self.lag_tolerance() {
            warn!(lag = %humantime::format_duration(round_up_secs(lag)), "the controller was not running for a while; every host gets a fresh window before it is judged");
            for t in self.heard.values_mut() {
                *t = (*t).max(now);
            }
        }
        self.end_drains(now);
        let ids: Vec<HostId> = self.cluster.hosts.keys().cloned().collect();
        for id in &ids {
            let silent = self.silence(id, now);
            let ready = self.host_state(id) == Some(HostState::Ready);
            if ready && silent >= self.timing.unreachable_after {
                self.host_unreachable(id, silent, now);
            }
        }
        self.judge_disruption(now);
        for id in &ids {
            let silent = self.silence(id, now);
            let unreachable = self.host_state(id) == Some(HostState::Unreachable);
            if unreachable && silent >= self.timing.grace_period {
                if self.disrupted {
                    if !self.withheld.contains(id) {
                        self.withhold(id, silent, now);
                    }
                } else {
                    self.host_lost(id, silent, now);
                }
            }
        }
    }

    fn host_state(&self, id: &HostId) -> Option<HostState> {
        self.cluster.hosts.get(id).map(|h| h.info.state)
    }

    /// How long `id` has not been heard from.
    fn silence(&self, id: &HostId, now: Instant) -> Duration {
        let heard = self.heard.get(id).copied().unwrap_or(now);
        now.saturating_duration_since(heard)
    }

    /// (unreachable, not lost) hosts: what the full-disruption rule judges.
    fn unreachable_count(&self) -> (usize, usize) {
        let live = self
            .cluster
            .hosts
            .values()
            .filter(|h| h.info.state != HostState::Lost);
        live.fold((0, 0), |(u, n), h| {
            (
                u + usize::from(h.info.state == HostState::Unreachable),
                n + 1,
            )
        })
    }

    /// Whether the unreachable hosts now make a full disruption.
    fn full_disruption_now(&self) -> bool {
        let (unreachable, hosts) = self.unreachable_count();
        self.timing
            .disruption_threshold
            .is_full_disruption(unreachable, hosts)
    }

    /// Starts or ends a full disruption by the current count; each once, with a warning.
    ///
    /// At the end, every host still unreachable gets a fresh grace period from now
    /// (Kubernetes resets its hosts' timers the same way when it leaves its all-zones
    /// disruption mode): hosts come back one by one as a network heals, and judging the
    /// late ones on their silence during the disruption would declare them lost at the
    /// moment the threshold is crossed, and pile their replicas onto the few hosts back
    /// first. The cost: a host that really died with the others is replaced one grace
    /// period after the disruption ends, not at once.
    fn judge_disruption(&mut self, now: Instant) {
        let full = self.full_disruption_now();
        if full == self.disrupted {
            return;
        }
        let (unreachable, hosts) = self.unreachable_count();
        self.disrupted = full;
        self.withheld.clear();
        self.metrics.full_disruption.set(i64::from(full));
        if full {
            warn!(unreachable, hosts, threshold = self.timing.disruption_threshold.get(), "full disruption: most hosts are unreachable at once; suspecting this controller or its network, no host is declared lost (their replicas are not replaced) until fewer are");
        } else {
            for (id, h) in &self.cluster.hosts {
                if h.info.state == HostState::Unreachable {
                    if let Some(t) = self.heard.get_mut(id) {
                        *t = (*t).max(now);
                    }
                }
            }
            warn!(unreachable, hosts, "full disruption over: hosts are judged again; those still unreachable get a fresh grace period");
        }
    }

    /// A silent host becomes unreachable: its jobs are `unknown`, kept (and still
    /// endpoints, with the readiness they had) for the grace period.
    fn host_unreachable(&mut self, id: &HostId, silent: Duration, now: Instant) {
        let Some(mut h) = self.cluster.hosts.get(id).cloned() else {
            return;
        };
        let mut txn = Txn::new(&self.cluster);
        for mut j in self.cluster.jobs_on(id).cloned().collect::<Vec<_>>() {
            j.held = Some(j.info.state);
            j.info.state = JobState::Unknown;
            txn.put_job(&self.cluster, j);
        }
        h.info.state = HostState::Unreachable;
        txn.put_host(&self.cluster, h);
        if self.commit(txn, now).is_ok() {
            warn!(host = %id, silent = %humantime::format_duration(round_up_secs(silent)), "host unreachable; its jobs are kept for the grace period");
        }
    }

    /// An unreachable host past its grace period is lost: its jobs end (grants released)
    /// and its replicas are placed elsewhere.
    fn host_lost(&mut self, id: &HostId, silent: Duration, now: Instant) {
        let mut txn = Txn::new(&self.cluster);
        for j in self.cluster.jobs_on(id).cloned().collect::<Vec<_>>() {
            txn.end_job(&self.cluster, j, EndReason::HostLost, true);
        }
        let Some(mut h) = txn.host(&self.cluster, id) else {
            return;
        };
        h.info.state = HostState::Lost;
        h.orphans.clear();
        txn.put_host(&self.cluster, h);
        if self.commit(txn, now).is_ok() {
            self.withheld.remove(id);
            warn!(host = %id, silent = %humantime::format_duration(round_up_secs(silent)), "host lost; its replicas are placed elsewhere");
        }
    }

    /// An unreachable host past its grace period during a full disruption: not lost, but
    /// its ready jobs leave the endpoints (their readiness is kept for when the host is
    /// heard again). Once per host and disruption (a failed commit is tried again).
    fn withhold(&mut self, id: &HostId, silent: Duration, now: Instant) {
        let mut txn = Txn::new(&self.cluster);
        let mut n = 0;
        for mut j in self.cluster.jobs_on(id).cloned().collect::<Vec<_>>() {
            if j.info.state == JobState::Unknown && j.held_ready.is_none() && j.info.ready {
                j.held_ready = Some(true);
                j.info.ready = false;
                txn.put_job(&self.cluster, j);
                n += 1;
            }
        }
        if n == 0 {
            self.withheld.insert(id.clone());
        } else if self.commit(txn, now).is_ok() {
            self.withheld.insert(id.clone());
            warn!(host = %id, silent = %humantime::format_duration(round_up_secs(silent)), replicas = n, "host silent past the grace period during a full disruption: not declared lost, its replicas are kept (not replaced) but leave the endpoints");
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
            .filter(|s| self.cluster.jobs_of(&s.info.key()).next().is_none())
            .cloned()
            .collect();
        for s in done {
            let mut txn = Txn::new(&self.cluster);
            txn.remove_service(&s);
            let _ = self.commit(txn, now);
        }
        // A pass that drained a replica may have made room for a surge replica: place it
        // now rather than at the next wake-up (bounded: each extra pass needs a drain).
        for _ in 0..4 {
            if !self.schedule(now) {
                break;
            }
        }
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

    /// What the rollout logic sees of `jobs` (a service's jobs) at `now`.
    fn job_facts(&self, s: &ServiceInfo, jobs: &[JobRec], now: Instant) -> Vec<JobFacts> {
        let min_ready = self
            .profiles
            .get(&s.key())
            .map_or(Duration::ZERO, |p| p.update.min_ready);
        jobs.iter()
            .filter_map(|j| {
                let phase = match j.effective_state() {
                    JobState::Placed => Phase::Placed,
                    JobState::Running => Phase::Running,
                    JobState::Draining | JobState::Stopping => Phase::Leaving,
                    JobState::Unknown | JobState::Exited | JobState::Lost => return None,
                };
                // A job a full disruption took out of the endpoints counts as it was: the
                // rollout does not act on a readiness nobody reported.
                let ready = j.held_ready.unwrap_or(j.info.ready) && phase == Phase::Running;
                let available = ready
                    && (j.info.generation < s.generation
                        || self
                            .ready_since
                            .get(&j.info.job)
                            .is_some_and(|t| now.saturating_duration_since(*t) >= min_ready));
                Some(JobFacts {
                    job: j.info.job.clone(),
                    replica: j.info.replica,
                    generation: j.info.generation,
                    phase,
                    ready,
                    available,
                })
            })
            .collect()
    }

    /// One scheduling pass over every active service: places the replicas its rollout
    /// asks for, drains the jobs it lets go, and moves the rollout on (complete, failed,
    /// a rollback). One store batch for all of it; on failure nothing is applied and every
    /// reservation is released.
    /// Returns whether it drained a replica (a further pass may place one).
    fn schedule(&mut self, now: Instant) -> bool {
        self.last_pass = Some(now);
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
        let mut per_service: HashMap<(HostId, ServiceKey), usize> = HashMap::new();
        let mut by_service: HashMap<ServiceKey, Vec<JobRec>> = HashMap::new();
        for j in self.cluster.jobs.values() {
            *total.entry(j.info.host.clone()).or_default() += 1;
            *per_service
                .entry((j.info.host.clone(), j.info.service_key()))
                .or_default() += 1;
            by_service
                .entry(j.info.service_key())
                .or_default()
                .push(j.clone());
        }
        let mut txn = Txn::new(&self.cluster);
        let mut placed: Vec<(HostId, JobId, ServiceKey, u32)> = Vec::new();
        let mut reverts: Vec<(ServiceKey, String)> = Vec::new();
        let mut drained = false;
        for s in services {
            let name = &s.info.name;
            let key = s.info.key();
            let Some(profile) = self.profiles.get(&key) else {
                continue;
            };
            let (policy, drain) = (profile.update, profile.drain);
            let mut jobs = by_service.remove(&key).unwrap_or_default();
            let facts = self.job_facts(&s.info, &jobs, now);
            let view = rollout::Service {
                replicas: s.info.replicas,
                generation: s.info.generation,
                policy,
                jobs: &facts,
            };
            let occupied: BTreeSet<u32> = facts
                .iter()
                .filter(|f| f.phase != Phase::Leaving)
                .map(|f| f.replica)
                .collect();
            // Why a surge replica (one beside an old job) could not be placed.
            let mut blocked: Option<String> = None;
            for replica in rollout::to_place(&view) {
                if let Some(b) = self.backoff.get(&(key.clone(), replica)) {
                    if b.not_before > now {
                        let cause = s.slots.get(&replica).and_then(|r| r.last_exit.as_ref());
                        let reason = restart_reason(
                            cause.map(|e| &e.cause),
                            round_up_secs(b.not_before - now),
                        );
                        self.pending
                            .entry(key.clone())
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
                            .get(&(h.clone(), key.clone()))
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
                            .entry((p.host.clone(), key.clone()))
                            .or_default() += 1;
                        placed.push((p.host.clone(), job.clone(), key.clone(), replica));
                        let rec = JobRec {
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
                            held_ready: None,
                            log: None,
                        };
                        txn.put_job(&self.cluster, rec.clone());
                        jobs.push(rec);
                    }
                    Err(reason) => {
                        debug!(service = %name, replica, reason = %reason, "replica pending");
                        if occupied.contains(&replica) {
                            blocked.get_or_insert_with(|| reason.clone());
                        } else {
                            self.pending
                                .entry(key.clone())
                                .or_default()
                                .insert(replica, reason);
                        }
                    }
                }
            }
            // Drains, seeing this pass's placements.
            let facts = self.job_facts(&s.info, &jobs, now);
            let view = rollout::Service {
                jobs: &facts,
                ..view
            };
            let leaving = rollout::to_drain(&view);
            drained |= !leaving.is_empty();
            for j in jobs.iter_mut().filter(|j| leaving.contains(&j.info.job)) {
                debug!(service = %name, job = %j.info.job, replica = j.info.replica, generation = j.info.generation, "replica leaves (rollout or scale-down)");
                self.leave(&mut txn, j.clone(), drain);
                if let Some(now_rec) = txn.job(&self.cluster, &j.info.job) {
                    *j = now_rec;
                }
            }
            let facts = self.job_facts(&s.info, &jobs, now);
            let view = rollout::Service {
                jobs: &facts,
                ..view
            };
            if let Some(why) = self.advance_rollout(&mut txn, &s, &view, blocked, now) {
                reverts.push((key.clone(), why));
            }
            // Older generations' profiles are kept while any of their jobs is left.
            let gens: BTreeSet<u64> = jobs.iter().map(|j| j.info.generation).collect();
            if let Some(mut rec) = txn.service(&self.cluster, &key) {
                let before = rec.older.len();
                rec.older.retain(|g, _| gens.contains(g));
                if rec.older.len() != before {
                    self.older
                        .retain(|(n, g), _| *n != key || rec.older.contains_key(g));
                    txn.put_service_quiet(rec);
                }
            }
        }
        if !txn.is_empty() {
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
                return false;
            }
            self.metrics.placements.inc_by(placed.len() as u64);
        }
        for (name, why) in reverts {
            if let Err(e) = self.revert(&name, &why, now) {
                warn!(service = %name, error = %e, "rollback could not be committed; trying again on the next pass");
            }
        }
        drained
    }

    /// Moves a running rollout on: complete when every slot runs the current generation,
    /// failed (or a rollback, returned as its reason) when it made no progress for
    /// `deadline` or its new replicas keep exiting; otherwise it says why it waits.
    fn advance_rollout(
        &mut self,
        txn: &mut Txn,
        s: &ServiceRec,
        view: &rollout::Service,
        blocked: Option<String>,
        now: Instant,
    ) -> Option<String> {
        let name = &s.info.name;
        let key = s.info.key();
        let generation = s.info.generation;
        let mut rec = txn.service(&self.cluster, &key)?;
        let mut r = rec.rollout.clone();
        let mut revert = None;
        if !r.is_running(generation) {
            self.progress.remove(&key);
            if r.state == RolloutState::Failed && view.is_complete() {
                // A failed rollout that was not rolled back keeps reconciling; once every
                // slot runs it after all, it is complete (the failure was passing).
                r.state = RolloutState::Complete;
                r.reason = None;
                r.stable = Some(Stable {
                    generation,
                    profile: s.info.profile.clone(),
                });
                self.metrics.rollout_ended("complete");
                info!(service = %name, project = %key.project, generation, "failed rollout completed after all");
            } else if r.state == RolloutState::Complete
                && r.stable.as_ref().map(|st| st.generation) != Some(generation)
            {
                // A service stored before rollouts existed.
                r.stable = Some(Stable {
                    generation,
                    profile: s.info.profile.clone(),
                });
            }
        } else {
            let counts = view.counts();
            let mark = rollout::progress_mark(&counts);
            let since = match self.progress.get(&key) {
                Some((m, t)) if *m == mark => *t,
                _ => {
                    self.progress.insert(key.clone(), (mark, now));
                    now
                }
            };
            if view.is_complete() {
                r.stable = Some(Stable {
                    generation,
                    profile: s.info.profile.clone(),
                });
                if r.state == RolloutState::Progressing {
                    r.state = RolloutState::Complete;
                    r.reason = None;
                    self.metrics.rollout_ended("complete");
                }
                self.progress.remove(&key);
                info!(service = %name, generation, state = r.state.as_str(), "rollout done");
            } else if r.exits >= rollout::MAX_NEW_EXITS
                || now.saturating_duration_since(since) >= view.policy.deadline
            {
                let why = if r.exits >= rollout::MAX_NEW_EXITS {
                    format!(
                        "new replicas keep exiting ({} exits of generation {generation})",
                        r.exits
                    )
                } else {
                    format!(
                        "no progress for {} ({} of {} updated, {} ready, {} outdated)",
                        humantime::format_duration(view.policy.deadline),
                        counts.updated,
                        view.replicas,
                        counts.ready,
                        counts.outdated
                    )
                };
                let target = r.stable.as_ref().map(|st| st.generation);
                self.progress.remove(&key);
                if r.state == RolloutState::Progressing
                    && view.policy.auto_revert
                    && target.is_some_and(|g| g != generation)
                {
                    revert = Some(why);
                } else {
                    let suffix = if r.revert {
                        "; this was a rollback: nothing is rolled back further"
                    } else if !view.policy.auto_revert {
                        "; auto_revert is off"
                    } else {
                        "; no complete generation to roll back to"
                    };
                    r.state = RolloutState::Failed;
                    r.reason = Some(format!("generation {generation} failed: {why}{suffix}"));
                    self.metrics.rollout_ended("failed");
                    warn!(service = %name, generation, reason = %why, "rollout failed");
                }
            } else if r.state == RolloutState::Progressing {
                r.reason = blocked
                    .filter(|_| view.policy.max_unavailable == 0)
                    .map(|why| {
                        format!(
                            "waiting: no new replica fits beside the old ones ({why}); with \
                         max_unavailable = 0 no old replica leaves first"
                        )
                    });
            }
        }
        if r != rec.rollout {
            rec.rollout = r;
            txn.put_service(rec);
        }
        revert
    }

    /// Rolls a failed rollout back: the last complete generation's profile becomes the
    /// next generation, and the jobs still running that profile are that generation's
    /// (they are not replaced by identical ones).
    fn revert(&mut self, key: &ServiceKey, why: &str, now: Instant) -> Result<(), CoreError> {
        let name = &key.name;
        let Some(mut svc) = self.cluster.services.get(key).cloned() else {
            return Ok(());
        };
        let Some(stable) = svc.rollout.stable.clone() else {
            return Ok(());
        };
        let failed = svc.info.generation;
        let raw = rollout::revert_profile(&stable, svc.info.replicas);
        let profile = stored_profile(&self.plugins, &svc.info, &raw);
        self.next_generation(&mut svc);
        let generation = svc.info.generation;
        svc.rollout.state = RolloutState::Reverted;
        svc.rollout.revert = true;
        svc.rollout.reason = Some(format!(
            "generation {failed} failed: {why}; rolled back to generation {}'s profile as generation {generation}",
            stable.generation
        ));
        svc.info.profile = raw;
        let adopted: Vec<JobRec> = self
            .cluster
            .jobs_of(key)
            .filter(|j| j.info.generation == stable.generation)
            .cloned()
            .map(|mut j| {
                j.info.generation = generation;
                j
            })
            .collect();
        warn!(service = %name, failed, generation, reason = %why, "rollout failed; rolling back");
        self.metrics.rollout_ended("reverted");
        self.commit_service_with(svc, profile, adopted, now)
    }

    fn desired(&self, host: &str) -> Vec<Assignment> {
        let mut out = Vec::new();
        for j in self.cluster.jobs_on(host) {
            // A job runs its own generation's command and probe: during a rollout the
            // older replicas keep theirs (a restarted worker must not start an old job
            // with the new command).
            let key = j.info.service_key();
            let current = self.cluster.services.get(&key).map(|s| s.info.generation);
            let p = match current {
                Some(g) if g != j.info.generation => self
                    .older
                    .get(&(key.clone(), j.info.generation))
                    .or_else(|| self.profiles.get(&key)),
                _ => self.profiles.get(&key),
            };
            let Some(p) = p else {
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
        let mut by_service: HashMap<ServiceKey, Vec<JobRec>> = HashMap::new();
        for j in c.jobs.values() {
            by_service
                .entry(j.info.service_key())
                .or_default()
                .push(j.clone());
        }
        for s in c.services.values() {
            let key = s.info.key();
            let recs = by_service.remove(&key).unwrap_or_default();
            let mut jobs: Vec<JobView> = recs
                .iter()
                .map(|j| JobView {
                    info: j.info.clone(),
                    summaries: self.grant_summaries(&j.info),
                    log: j.log.clone(),
                })
                .collect();
            jobs.sort_by(|a, b| {
                (a.info.replica, job_num(&a.info.job)).cmp(&(b.info.replica, job_num(&b.info.job)))
            });
            let pending = self
                .pending
                .get(&key)
                .map(|m| m.iter().map(|(r, why)| (*r, why.clone())).collect())
                .unwrap_or_default();
            let facts = self.job_facts(&s.info, &recs, Instant::now());
            let counts = rollout::Service {
                replicas: s.info.replicas,
                generation: s.info.generation,
                policy: self
                    .profiles
                    .get(&key)
                    .map(|p| p.update)
                    .unwrap_or_default(),
                jobs: &facts,
            }
            .counts();
            services.insert(
                key,
                ServiceView {
                    info: s.info.clone(),
                    state: s.state,
                    jobs,
                    pending,
                    rollout: s.rollout.clone(),
                    counts,
                    slots: s.slots.clone(),
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
        m.draining.set(
            c.jobs
                .values()
                .filter(|j| j.effective_state() == JobState::Draining)
                .count() as i64,
        );
        for (state, name) in [
            (JobState::Placed, "placed"),
            (JobState::Running, "running"),
            (JobState::Draining, "draining"),
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
/// The store's cluster id: created (at random) by the first controller that opens the
/// store, the same for every later one.
fn ensure_cluster_id(store: &dyn Store) -> Result<String, LoadError> {
    let fresh = crate::proto::random_id();
    let key = super::model::cluster_id_key();
    let stored = blocking(|| {
        store.put_if_absent(
            key.clone(),
            serde_json::to_vec(&fresh).expect("a string serializes"),
        )
    })?;
    let id: String =
        serde_json::from_slice(&stored).map_err(|err| LoadError::Decode { key, err })?;
    if id == fresh {
        info!(cluster = %id, "cluster id created");
    }
    Ok(id)
}

fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// An optional address for a log line: the address, or `none`.
fn display_ip(ip: Option<std::net::IpAddr>) -> String {
    ip.map_or_else(|| "none".to_owned(), |ip| ip.to_string())
}

/// Job ids are `j-<n>`: sort numerically.
fn job_num(id: &str) -> u64 {
    id.strip_prefix("j-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}

/// Why a replica waits for its restart: `restarting after exit 127 in 4s`, `restarting
/// after SIGKILL in 4s`, `restarting in 4s: cannot start "x": No such file or directory (os
/// error 2)`, or without a known cause `restarting after exit in 4s`.
fn restart_reason(cause: Option<&ExitCause>, wait: Duration) -> String {
    let wait = humantime::format_duration(wait);
    let Some(c) = cause else {
        return format!("restarting after exit in {wait}");
    };
    match (&c.error, c.signal, c.code) {
        (Some(e), _, _) => format!("restarting in {wait}: {e}"),
        (None, Some(sig), _) => match c.signal_name() {
            Some(name) => format!("restarting after {name} in {wait}"),
            None => format!("restarting after signal {sig} in {wait}"),
        },
        (None, None, Some(code)) => format!("restarting after exit {code} in {wait}"),
        (None, None, None) => format!("restarting after exit in {wait}"),
    }
}

fn round_up_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// The parsed form of a stored profile (`raw`, the `[service]` table of `s`).
fn stored_profile(plugins: &[Box<dyn ResourcePlugin>], s: &ServiceInfo, raw: &Value) -> Profile {
    let refs: Vec<&dyn ResourcePlugin> = plugins.iter().map(|p| &**p as _).collect();
    let doc = serde_json::json!({ "service": raw });
    match profile::validate(&doc, &refs) {
        Ok(p) => p,
        Err(errs) => {
            error!(service = %s.name, problems = ?errs, "stored profile no longer validates; running it without readiness");
            fallback_profile(s, raw)
        }
    }
}

/// A profile from the stored JSON when it no longer validates (plugins reconfigured):
/// keep running the command, without readiness.
fn fallback_profile(s: &ServiceInfo, raw: &Value) -> Profile {
    let command = raw
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
        drain: profile::DEFAULT_DRAIN,
        update: profile::UpdatePolicy::default(),
        quantities: Default::default(),
        raw: raw.clone(),
    }
}
