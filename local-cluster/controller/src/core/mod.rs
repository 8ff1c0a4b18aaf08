//! The controller's state machine: owns the cluster, the resource plugins and the store,
//! and applies one command at a time. Synchronous; the state task (`task.rs`) drives it
//! and passes the current time in.
//!
//! Every mutation is built as a [`Txn`], persisted, and only then applied in memory,
//! announced to listeners and answered. Plugin releases happen after the commit.
//!
//! This file holds the state and its loading; each concern is an `impl Core` of its own:
//! `commands.rs` (user commands, RBAC and quotas), `worker.rs` (the worker protocol),
//! `timers.rs` (deadlines, host liveness, drains), `placement.rs` (the scheduling pass
//! and rollouts), `publish.rs` (assignments, the readers' view, metrics, listeners) and
//! `commit.rs` (a `Txn` persisted, applied and noted).

mod acks;
mod assign;
mod commands;
mod commit;
mod host_action;
mod jobs;
mod kept;
mod maintenance;
mod placement;
mod publish;
pub(crate) mod pulse;
mod report;
mod sched;
mod timers;
mod view;
mod waits;
mod worker;

use super::config::DisruptionThreshold;
use super::metrics::Metrics;
use super::quota::{self, Quotas};
pub(crate) use assign::HostAssignments;
pub(crate) use host_action::{HostAction, LeaveStatus};
pub(crate) use jobs::{JobView, Jobs};
use plugin_api::{
    ClusterEvent, ClusterListener, FieldError, HostFactsPolicy, HostId, HostInfo, JobId, JobState,
    ResourcePlugin, ServiceInfo, ServiceKey,
};
pub(crate) use report::Report;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{error, info, warn};
use xce_model::job_key::JobMap;
use xce_model::rollout::{self, Counts, JobFacts, Phase, Rollout};
use xce_model::slots::SlotRec;
use xce_model::{Cluster, JobRec, LoadError, ServiceState, Txn};
use xce_proto::profile::{self, Profile};
use xce_store::{Store, StoreError};

/// Timing of host liveness.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) heartbeat_interval: Duration,
    pub(crate) unreachable_after: Duration,
    pub(crate) grace_period: Duration,
    /// See [`DisruptionThreshold`].
    pub(crate) disruption_threshold: DisruptionThreshold,
    /// How long a drain waits for the separate apiservers' acknowledgements (`acks.rs`).
    pub(crate) drain_ack_timeout: Duration,
}

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
    /// Another live worker holds the host (a second worker with the same host id, or a
    /// caller with the host's credential but not its session). Names no instance: an
    /// instance id is nobody else's business.
    #[error("host {host} is held by another live worker; check for a second worker with the same host id (a worker that lost its session registers again once the host has gone unheard for {}s)", .free_after.as_secs_f64())]
    HostTaken { host: HostId, free_after: Duration },
    /// A call for a host held by a session, without the session secret.
    #[error("host {0} is held by a worker session: a worker call must carry the session secret its registration returned (header x-xce-worker-session)")]
    SessionRequired(HostId),
    /// A call for a host held by a session, with another secret or instance.
    #[error("the worker session presented for host {0} is not the host's (another worker took the host over, or the session was never issued): register again")]
    SessionInvalid(HostId),
    /// A heartbeat without its digests from a host held by a session.
    #[error(
        "a heartbeat from a worker with a session must carry its state digests (facts, ready)"
    )]
    DigestRequired,
    /// No session secret could be made (no entropy): nothing was registered.
    #[error("{0}")]
    NoEntropy(#[from] xce_proto::worker::NoEntropy),
    /// The worker joined another cluster (it was pointed at the wrong controller).
    #[error("this controller serves cluster {ours}, the worker belongs to cluster {theirs}")]
    WrongCluster { ours: String, theirs: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The restart delay of one replica slot.
#[derive(Debug, Clone, Copy)]
struct RestartBackoff {
    /// The delays: the next exit waits `pauses.next_pause()` (exact, no jitter: one controller).
    pauses: retry_backoff::Backoff,
    not_before: Instant,
    /// The generation whose exits earned it: a replica of another generation (an update,
    /// or the rollback from a broken one) neither waits for it nor continues it.
    generation: u64,
    /// A scheduling pass has seen the backoff over (and placed the replica, or said why
    /// not, or found it not wanted any more). Until then the backoff keeps a timer armed,
    /// even once its instant is past:
    /// a pass that ran with a `now` taken before a slow store commit may have seen it
    /// still running, and nothing else would wake the controller for it.
    over: bool,
}

/// The last published parts of the [`View`] and what must be rebuilt of them (kept and
/// used by `view.rs`; declared here so that the core names no file that names it back).
#[derive(Debug, Default)]
pub(super) struct Parts {
    services: BTreeMap<ServiceKey, Arc<ServiceView>>,
    hosts: BTreeMap<HostId, Arc<HostView>>,
    /// Services whose records a commit changed since the last publish, with the jobs
    /// (replica, id) it wrote: a publish patches those jobs into the service's part.
    dirty: BTreeMap<ServiceKey, Vec<(u32, JobId)>>,
    /// Services whose rollout counts change with time alone, and when next.
    timed: BTreeMap<ServiceKey, Instant>,
    /// What each service's counts were computed with, for a patch to update them.
    books: HashMap<ServiceKey, Book>,
    /// The job gauges, kept from each commit's writes rather than counted at every
    /// publish (kept by `publish.rs`).
    tally: Tally,
}

/// What a service's part counted its rollout counts with: a patch updates the counts
/// from the jobs that changed if these are the same, else rebuilds them.
#[derive(Debug, Clone, PartialEq, Default)]
struct Book {
    min_ready: Duration,
    /// Live ready current-generation jobs not available yet (`min_ready` not over, or
    /// no `ready_since`): the only jobs whose counts time alone changes.
    waiting: BTreeSet<JobId>,
}

/// The jobs by state, for the gauges: `by_state` in the order of `publish.rs`'s
/// `STATES`, `draining` by effective state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Tally {
    draining: i64,
    by_state: [i64; 5],
}

/// Which active services the next scheduling pass visits (kept by `sched.rs`; declared
/// here for the same reason as [`Parts`]). A service nothing happened to since its last
/// visit is not visited: its outcome would be the same.
#[derive(Debug, Default)]
pub(super) struct Sched {
    /// Written by a commit (or loaded, or due by time) since a pass last visited them.
    marked: BTreeSet<ServiceKey>,
    /// Left with replicas that did not fit (pending, a blocked surge): visited by every
    /// pass, since room may appear on any host (a job ended, a host registered).
    waiting: BTreeSet<ServiceKey>,
    /// When a service's outcome changes with time alone (its rollout's deadline, a
    /// replica reaching `min_ready`), if it does.
    timed: BTreeMap<ServiceKey, Instant>,
    /// Services whose last visit left them in a shape a readiness change cannot alter
    /// (every slot one live current-generation job, nothing else live, `min_ready` 0 or
    /// every replica available):
    /// how many of their replicas are not available yet. A commit that only starts jobs
    /// or changes their readiness visits such a service only when that count reaches 0
    /// (its rollout completes), and keeps its progress deadline current meanwhile.
    quiet: HashMap<ServiceKey, u32>,
}

/// A service's job facts kept from one scheduling pass to the next (kept by `kept.rs`;
/// declared here for the same reason as [`Parts`]): patched with the jobs the commits
/// since wrote, instead of rebuilt from every job of the service at every visit.
#[derive(Debug, Default)]
pub(super) struct KeptFacts {
    /// The facts in the order of the service's jobs (`Cluster::jobs_of`: by job id);
    /// empty while a visit holds them (`out`).
    facts: Vec<JobFacts>,
    /// A visit took the facts and did not give them back (its pass failed): rebuilt at
    /// the next use.
    out: bool,
    /// What the facts were built with: another generation or `min_ready` rebuilds them.
    generation: u64,
    min_ready: Duration,
    /// The latest `now` the facts are true at (a use at an earlier one rebuilds them).
    now: Option<Instant>,
    /// The jobs the commits wrote since (ids, in commit order, repeats possible).
    stale: Vec<JobId>,
    /// How many facts there are (also while a visit holds them).
    size: usize,
    /// The earliest instant a ready current-generation job that is not available yet
    /// becomes available by time alone (`ready_since + min_ready`: the only facts time
    /// alone changes), or earlier (a job counted here may have changed since). One
    /// instant, not one per job: an instant per job waiting for `min_ready` was 70 bytes
    /// a replica while a placement's replicas wait.
    ripe_at: Option<Instant>,
}

/// The controller's in-memory notes on jobs, for its rollouts (kept by `waits.rs`;
/// declared here for the same reason as [`Parts`]).
#[derive(Debug, Default)]
pub(super) struct Notes {
    /// The last failing probe of each live job that is not ready, as its worker said it.
    probes: HashMap<JobId, String>,
    /// The live jobs that have been ready at some point.
    ever_ready: JobMap<()>,
}

/// What readers see: a consistent snapshot after a command. Its parts are shared with
/// the views before and after it: a settle rebuilds only what changed (see `view.rs`).
#[derive(Debug, Clone, Default)]
pub(crate) struct View {
    pub(crate) services: BTreeMap<ServiceKey, Arc<ServiceView>>,
    pub(crate) hosts: Vec<Arc<HostView>>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ServiceView {
    pub(crate) info: ServiceInfo,
    pub(crate) state: ServiceState,
    /// In replica, then job number order (see `jobs.rs`).
    pub(crate) jobs: Jobs,
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

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HostView {
    pub(crate) info: HostInfo,
    pub(crate) jobs: usize,
    /// A cordon or drain (`maintenance.rs`), and then the live jobs left on the host per
    /// service (empty otherwise).
    pub(crate) maintenance: Option<xce_model::maintenance::Maintenance>,
    pub(crate) left: Vec<(ServiceKey, usize)>,
    /// Plugin host summaries by plugin name.
    pub(crate) summaries: BTreeMap<String, Value>,
}

/// The plugins and listeners the core drives.
pub(crate) struct Wiring {
    pub(crate) resources: Vec<Box<dyn ResourcePlugin>>,
    pub(crate) policies: Vec<Arc<dyn HostFactsPolicy>>,
    pub(crate) listeners: Vec<Arc<dyn ClusterListener>>,
    /// The tag of this load's job ids: [`xce_model::job_tag`] (random) in a real
    /// controller, so a store that went back repeats no id; the unit tests pass one that
    /// keeps plain `j-<n>` ids, which their expectations name.
    pub(crate) job_tag: fn() -> String,
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
    ready_since: JobMap<Instant>,
    /// When each draining job's drain ends (not persisted: a restart drains in full again,
    /// so a restart never shortens a drain).
    drain_until: HashMap<JobId, Instant>,
    /// What the separate apiservers have applied, and what each drain waits for.
    acks: acks::DrainAcks,
    /// Each running rollout's last progress (see [`rollout::progress_mark`]) and when it
    /// changed (not persisted: a restart gives a rollout a fresh `deadline`).
    progress: HashMap<ServiceKey, (rollout::Mark, Instant)>,
    /// When each host was last heard from (not persisted: a restart hears from all).
    heard: HashMap<HostId, Instant>,
    /// A full disruption is on: so many hosts are unreachable at once that this controller
    /// suspects itself or its network, and declares no host lost (see [`Core::tick`]).
    /// Not persisted: a restart gives every host a fresh window anyway.
    disrupted: bool,
    /// Unreachable hosts whose jobs are out of the endpoints (see [`Core::withhold`]):
    /// from `unreachable_after` on, or past the grace period during a full disruption
    /// (then they arm no timer until heard, lost, or the disruption ends).
    withheld: BTreeSet<HostId>,
    /// The beat thread that tells this process's pauses (see [`Core::notice_pause`]);
    /// none in the unit tests that drive time themselves.
    pulse: Option<pulse::Pulse>,
    /// Hosts that must register again before their heartbeats and assignment queries are
    /// heard: every host of a store just restored (`meta/restored`), whose stored jobs
    /// say what ran when the backup was taken, not what runs now. A registration reports
    /// what runs, and reconciles it (see `Core::register`). Not persisted: the mark is.
    reregister: BTreeSet<HostId>,
    /// When each running job started running (for the backoff reset).
    running_since: JobMap<Instant>,
    /// Per-job notes for the rollouts: last failing probes, jobs ever ready (`waits.rs`).
    notes: Notes,
    backoff: HashMap<(ServiceKey, u32), RestartBackoff>,
    pending: BTreeMap<ServiceKey, BTreeMap<u32, String>>,
    assign: HashMap<HostId, watch::Sender<Arc<HostAssignments>>>,
    /// The jobs each commit wrote since the last publish, by host (see
    /// [`Core::note_assign`]).
    assign_touched: HashMap<HostId, Vec<JobId>>,
    view: watch::Sender<Arc<View>>,
    /// The parts of the last published view, and which of them a commit changed since.
    parts: Parts,
    /// Which services the next scheduling pass visits.
    sched: Sched,
    /// Each visited service's job facts, kept across passes.
    kept: HashMap<ServiceKey, KeptFacts>,
    /// Something changed since the last [`Core::settle`].
    dirty: bool,
    /// Committed events not yet announced: listeners hear of a change only after the
    /// readers' view includes it (see [`Core::publish`]), so no read path is ahead of
    /// the controller's own (`/v1/hosts` never behind the endpoints).
    outbox: Vec<ClusterEvent>,
    /// Per-project limits on what services declare.
    quotas: Quotas,
    /// After a failed commit in a timer: do not retry before this (no busy loop while the
    /// store is down).
    store_retry: Option<Instant>,
    /// Why the store refuses every commit until this controller reloads (see
    /// [`StoreError::Stale`]): it must stop rather than run on a view it cannot change.
    fatal: Option<String>,
    /// The wall clock, for the times operators read (a replica's last exit); everything
    /// the controller decides runs on the monotonic `now` it is given instead.
    wall: fn() -> SystemTime,
    /// How many job facts the core built (tests pin what a settle costs).
    #[cfg(test)]
    facts_built: std::cell::Cell<usize>,
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
    /// How many committed events wait for the next settle to announce them.
    pub(crate) fn unannounced(&self) -> usize {
        self.outbox.len()
    }

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
        let mut cluster = Cluster::load(&*store)?;
        let Wiring {
            resources: mut plugins,
            policies,
            listeners,
            job_tag,
        } = wiring;
        cluster.job_tag = job_tag();
        hosts_up(&cluster, &mut plugins);
        restore_grants(&cluster, &mut plugins);
        let (profiles, older) = parse_profiles(&cluster, &plugins);
        let clocks = Clocks::loaded(&cluster, &profiles, now);
        let snapshot = cluster.snapshot();
        for l in &listeners {
            l.resync(&snapshot);
        }
        info!(
            cluster = %cluster_id,
            rev = cluster.rev,
            services = cluster.services.len(),
            jobs = cluster.jobs.len(),
            hosts = cluster.hosts.len(),
            "controller state loaded"
        );
        let mut core = Core::new(
            timing,
            Loaded {
                cluster_id,
                cluster,
                profiles,
                older,
                clocks,
            },
            Wiring {
                resources: plugins,
                policies,
                listeners,
                job_tag,
            },
            store,
            metrics,
        );
        core.after_restore();
        core.migrate(now);
        // The first view is built whole, and the first pass visits every service.
        core.parts.touch_all(&core.cluster);
        core.sched.mark_all(&core.cluster);
        core.publish(now);
        Ok(core)
    }

    /// A core on the loaded state, with nothing published, pending or timed yet.
    fn new(
        timing: Timing,
        loaded: Loaded,
        wiring: Wiring,
        store: Arc<dyn Store>,
        metrics: Metrics,
    ) -> Self {
        let Loaded {
            cluster_id,
            cluster,
            profiles,
            older,
            clocks,
        } = loaded;
        let (view, _) = watch::channel(Arc::new(View::default()));
        let acks = acks::DrainAcks::new(timing.drain_ack_timeout, cluster.rev, Instant::now());
        let notes = Notes::loaded(&cluster);
        Core {
            acks,
            timing,
            cluster_id,
            cluster,
            plugins: wiring.resources,
            policies: wiring.policies,
            listeners: wiring.listeners,
            store,
            metrics,
            profiles,
            older,
            ready_since: clocks.ready_since,
            drain_until: clocks.drain_until,
            progress: HashMap::new(),
            quotas: Quotas::default(),
            heard: clocks.heard,
            disrupted: false,
            withheld: BTreeSet::new(),
            pulse: None,
            reregister: BTreeSet::new(),
            running_since: clocks.running_since,
            notes,
            backoff: HashMap::new(),
            pending: BTreeMap::new(),
            assign: HashMap::new(),
            assign_touched: HashMap::new(),
            view,
            parts: Parts::default(),
            sched: Sched::default(),
            kept: HashMap::new(),
            dirty: true,
            store_retry: None,
            fatal: None,
            outbox: Vec::new(),
            wall: SystemTime::now,
            #[cfg(test)]
            facts_built: std::cell::Cell::new(0),
        }
    }

    /// Records of an older format ([`xce_model::FORMAT`]) are written back in the current
    /// one once, in one batch (service records written before services were keyed by
    /// project move to `project/name`, and `meta/format` is written); a failed migration
    /// is tried again at the next start (the records read the same meanwhile).
    fn migrate(&mut self, now: Instant) {
        if !self.cluster.needs_migration() {
            return;
        }
        let from = self.cluster.format;
        let moved = self.cluster.legacy_keys.len();
        let mut txn = Txn::new(&self.cluster);
        txn.migrate(&self.cluster);
        match self.commit(txn, now) {
            Ok(()) => info!(
                from,
                to = xce_model::FORMAT,
                moved_service_keys = moved,
                "stored records migrated to the current format"
            ),
            Err(e) => {
                warn!(error = %e, from, to = xce_model::FORMAT, "migrating the stored records failed; trying again at the next start")
            }
        }
    }

    /// The operator's switch to a newer store format (`store_format`): a store in an
    /// older format than `target` moves to it in one batch (only `meta/format` changes;
    /// later batches write the new format's events). A store already in a newer format
    /// stays in it. A failed upgrade is tried again at the next start.
    pub(crate) fn upgrade_format(&mut self, target: u64, now: Instant) {
        let from = self.cluster.format;
        if target < from {
            info!(
                format = from,
                store_format = target,
                "the store is in a newer format than store_format asks for; it stays in it"
            );
        }
        if target <= from {
            return;
        }
        let mut txn = Txn::new(&self.cluster);
        txn.upgrade_format(target);
        match self.commit(txn, now) {
            Ok(()) => info!(
                from,
                to = target,
                "stored records migrated to the format store_format asks for"
            ),
            Err(e) => {
                warn!(error = %e, from, to = target, "moving the store to a newer format failed; trying again at the next start")
            }
        }
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

    /// Why this controller must stop, once the store has said its view is stale.
    pub(crate) fn fatal(&self) -> Option<&str> {
        self.fatal.as_deref()
    }

    /// Makes the next [`settle`](Self::settle) run (a timer fired: a backoff may be over).
    pub(crate) fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    /// How many job facts the core built so far (for the scheduling passes and the
    /// view; the safety net of `check_skipped` not counted).
    #[cfg(test)]
    pub(crate) fn facts_built(&self) -> usize {
        self.facts_built.get()
    }

    /// The metrics the core keeps (tests read its counters).
    #[cfg(test)]
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// What the rollout logic sees of `jobs` (a service's jobs) at `now`.
    fn job_facts<'a>(
        &self,
        s: &ServiceInfo,
        jobs: impl IntoIterator<Item = &'a JobRec>,
        now: Instant,
    ) -> Vec<JobFacts> {
        let min_ready = self.min_ready_of(&s.key());
        // Once per call, not a host lookup per job (see `any_host_drains`).
        let any_drains = self.any_host_drains();
        jobs.into_iter()
            .filter_map(|j| self.fact_of(s, j, now, min_ready, any_drains))
            .collect()
    }

    /// The `min_ready` of the service's current profile.
    fn min_ready_of(&self, key: &ServiceKey) -> Duration {
        self.profiles
            .get(key)
            .map_or(Duration::ZERO, |p| p.update.min_ready)
    }

    /// What the rollout logic sees of job `j` of `s` at `now` (`None`: not live),
    /// with the service's `min_ready` and whether any host drains.
    fn fact_of(
        &self,
        s: &ServiceInfo,
        j: &JobRec,
        now: Instant,
        min_ready: Duration,
        any_drains: bool,
    ) -> Option<JobFacts> {
        #[cfg(test)]
        self.facts_built.set(self.facts_built.get() + 1);
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
            // The model's shared id (a job just placed is not in the model yet).
            job: match self.cluster.job_key(&j.info.job) {
                Some(k) => k.clone(),
                None => j.info.job.as_str().into(),
            },
            replica: j.info.replica,
            generation: j.info.generation,
            phase,
            ready,
            available,
            moving: any_drains && self.on_draining_host(j),
            ever_ready: ready || self.notes.ever_ready(&j.info.job),
        })
    }
}

/// What `Core::load` read and rebuilt from the store.
struct Loaded {
    cluster_id: String,
    cluster: Cluster,
    profiles: HashMap<ServiceKey, Profile>,
    older: HashMap<(ServiceKey, u64), Profile>,
    clocks: Clocks,
}

/// The in-memory clocks a load starts afresh (none is persisted): every running job runs,
/// and every ready job is ready, from the load on; every draining job drains in full
/// again (a restart never shortens a drain); every host is heard at the load.
struct Clocks {
    running_since: JobMap<Instant>,
    ready_since: JobMap<Instant>,
    drain_until: HashMap<JobId, Instant>,
    heard: HashMap<HostId, Instant>,
}

impl Clocks {
    fn loaded(cluster: &Cluster, profiles: &HashMap<ServiceKey, Profile>, now: Instant) -> Self {
        let mut clocks = Clocks {
            running_since: JobMap::default(),
            ready_since: JobMap::default(),
            drain_until: HashMap::new(),
            heard: cluster.hosts.keys().map(|h| (h.clone(), now)).collect(),
        };
        for (id, j) in &cluster.jobs {
            if j.effective_state() == JobState::Running {
                clocks.running_since.insert(id.clone(), now);
            }
            if j.info.ready {
                clocks.ready_since.insert(id.clone(), now);
            }
            if j.effective_state() == JobState::Draining {
                let drain = profiles
                    .get(&j.info.service_key())
                    .map_or(profile::DEFAULT_DRAIN, |p| p.drain);
                clocks.drain_until.insert(j.info.job.clone(), now + drain);
            }
        }
        clocks
    }
}

/// Tells the plugins of every stored host and its facts (`host_up`); a refusal is
/// logged, the host kept.
fn hosts_up(cluster: &Cluster, plugins: &mut [Box<dyn ResourcePlugin>]) {
    for h in cluster.hosts.values() {
        for p in plugins.iter_mut() {
            if let Err(e) = p.host_up(&h.info.id, &h.info.facts) {
                warn!(host = %h.info.id, plugin = p.name(), reason = %e, "plugin refused stored host facts");
            }
        }
    }
}

/// Gives the plugins back the grants they made: the live jobs' first, then the recently
/// ended jobs' again, restored and released in the order they ended, so the plugins'
/// free order (a just-released port is handed out last) survives a restart or a
/// takeover. A grant now held by a live job is refused by `restore` and skipped.
fn restore_grants(cluster: &Cluster, plugins: &mut [Box<dyn ResourcePlugin>]) {
    for j in cluster.jobs.values() {
        for p in plugins.iter_mut() {
            if let Some(g) = j.info.grants.get(p.name()) {
                if let Err(e) = p.restore(&j.info.host, &j.info.job, g) {
                    error!(job = %j.info.job, host = %j.info.host, plugin = p.name(), reason = %e, "stored grant conflicts with another; the store may be corrupt");
                }
            }
        }
    }
    for h in cluster.hosts.values() {
        for r in &h.released {
            for p in plugins.iter_mut() {
                if let Some(g) = r.grants.get(p.name()) {
                    if p.restore(&h.info.id, &r.job, g).is_ok() {
                        p.release(&h.info.id, &r.job);
                    }
                }
            }
        }
    }
}

/// The parsed profiles of every service's current generation, and of its older
/// generations that still have jobs.
fn parse_profiles(
    cluster: &Cluster,
    plugins: &[Box<dyn ResourcePlugin>],
) -> (
    HashMap<ServiceKey, Profile>,
    HashMap<(ServiceKey, u64), Profile>,
) {
    let mut profiles = HashMap::new();
    let mut older = HashMap::new();
    for svc in cluster.services.values() {
        profiles.insert(
            svc.info.key(),
            stored_profile(plugins, &svc.info, &svc.info.profile),
        );
        for (g, raw) in &svc.older {
            older.insert(
                (svc.info.key(), *g),
                stored_profile(plugins, &svc.info, raw),
            );
        }
    }
    (profiles, older)
}

/// The store's cluster id: created (at random) by the first controller that opens the
/// store, the same for every later one.
fn ensure_cluster_id(store: &dyn Store) -> Result<String, LoadError> {
    let fresh = xce_proto::worker::random_id();
    let key = xce_model::cluster_id_key();
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

/// The string variables of a stored `env` table that no longer validates as a whole.
fn fallback_env(raw: &Value) -> std::collections::BTreeMap<String, String> {
    raw.get("env")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .filter(|(k, _)| !k.to_ascii_uppercase().starts_with("XCE_"))
                .collect()
        })
        .unwrap_or_default()
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
        command: Arc::new(command),
        readiness: None,
        drain: profile::DEFAULT_DRAIN,
        update: profile::UpdatePolicy::default(),
        meta: Default::default(),
        // What the replicas ran with, as far as it still reads (their environment is
        // part of what they run).
        env: Arc::new(fallback_env(raw)),
        quantities: Default::default(),
        raw: raw.clone(),
    }
}
