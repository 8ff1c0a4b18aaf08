//! The controller's change feed: job lifecycle, readiness transitions, host changes.

use crate::{Grant, HostFacts, HostId, JobId};
use std::collections::BTreeMap;

/// A service as the controller knows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ServiceInfo {
    /// Service name.
    pub name: String,
    /// Project (RBAC scope).
    pub project: String,
    /// Desired replica count.
    pub replicas: u32,
    /// The validated profile's `[service]` table as JSON (plugin sections included).
    pub profile: serde_json::Value,
    /// The revision of the last change of anything belonging to this service (the service
    /// itself, one of its jobs, or the address of a host one of its jobs is on). Persisted;
    /// never decreases, across controller restarts too. Listeners use it as the service's
    /// change index.
    pub rev: u64,
    /// The generation of the service's current profile: 1 at creation, one more for every
    /// changed profile and every restart (a rollout). Records written before generations
    /// existed read as 1.
    #[serde(default = "first_generation")]
    pub generation: u64,
}

/// The generation of a service's first profile (and of records older than generations).
pub fn first_generation() -> u64 {
    1
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Placed on a host, its resources reserved; the worker has not started it yet.
    Placed,
    /// The worker started the process.
    Running,
    /// Leaving: the replica has left every endpoint and keeps running for its service's
    /// `drain`, so clients holding an old list finish their requests; then it is
    /// `Stopping` (SIGTERM). Never an endpoint; still holds its resources.
    Draining,
    /// Asked to stop; the process may still run and still holds its resources.
    Stopping,
    /// The host missed heartbeats; within the grace period the job is kept as it was.
    Unknown,
    /// Ended: the process exited or was stopped. Resources released.
    Exited,
    /// Ended: its host was lost past the grace period. Resources released.
    Lost,
}

impl JobState {
    /// Whether the job has ended (its resources are released).
    pub fn is_ended(self) -> bool {
        matches!(self, JobState::Exited | JobState::Lost)
    }
}

/// One job (one run of one replica).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobInfo {
    /// Job id.
    pub job: JobId,
    /// Service name.
    pub service: String,
    /// Service project.
    pub project: String,
    /// Replica index, 0-based.
    pub replica: u32,
    /// The host it is placed on.
    pub host: HostId,
    /// State.
    pub state: JobState,
    /// Whether the replica passes its readiness probe (only ever true while `Running`, or
    /// `Unknown` within the grace period).
    pub ready: bool,
    /// Resource grants, keyed by plugin name.
    pub grants: BTreeMap<String, Grant>,
    /// The generation of the service profile this job runs (see
    /// [`ServiceInfo::generation`]).
    #[serde(default = "first_generation")]
    pub generation: u64,
}

/// Why a job ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum EndReason {
    /// The process exited by itself (code when known).
    Exited {
        /// Exit code, when known.
        code: Option<i32>,
    },
    /// The process was stopped (service stopped or scaled down) and is gone.
    Stopped,
    /// The host was lost past the grace period.
    HostLost,
    /// A launch hook refused to start it.
    Refused {
        /// The refusal's reason.
        reason: String,
    },
}

/// A host's liveness as the controller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    /// Heartbeating.
    Ready,
    /// Missed heartbeats, within the grace period: its jobs are kept.
    Unreachable,
    /// Silent past the grace period: its jobs are lost.
    Lost,
}

/// A host as the controller knows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostInfo {
    /// Host id.
    pub id: HostId,
    /// Liveness.
    pub state: HostState,
    /// The last accepted facts.
    pub facts: HostFacts,
}

/// One committed change. `rev` is the controller's global revision after the change:
/// strictly increasing across events, persisted, never reused after a restart.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "event")]
pub enum ClusterEvent {
    /// A service was created or changed. Its `rev` equals the event's.
    Service {
        /// Revision.
        rev: u64,
        /// The service.
        service: ServiceInfo,
    },
    /// A service was deleted (its jobs have ended or end through `Job` events first).
    ServiceRemoved {
        /// Revision.
        rev: u64,
        /// Its name.
        name: String,
        /// Its project.
        project: String,
    },
    /// A job was placed or changed state or readiness (readiness changes only on a
    /// transition reported by the worker). Its service's `rev` became the event's.
    Job {
        /// Revision.
        rev: u64,
        /// The job after the change.
        job: JobInfo,
    },
    /// A job ended; it is gone from the controller's live set. Its service's `rev` became
    /// the event's.
    JobEnded {
        /// Revision.
        rev: u64,
        /// The job as it was last.
        job: JobInfo,
        /// Why.
        reason: EndReason,
    },
    /// A host registered, changed state, or its facts changed. `services` lists the
    /// services with live jobs on the host, whose `rev` became the event's.
    Host {
        /// Revision.
        rev: u64,
        /// The host after the change.
        host: HostInfo,
        /// Services affected (names), whose `rev` became the event's.
        services: Vec<String>,
    },
}

impl ClusterEvent {
    /// The event's revision.
    pub fn rev(&self) -> u64 {
        match self {
            ClusterEvent::Service { rev, .. }
            | ClusterEvent::ServiceRemoved { rev, .. }
            | ClusterEvent::Job { rev, .. }
            | ClusterEvent::JobEnded { rev, .. }
            | ClusterEvent::Host { rev, .. } => *rev,
        }
    }
}

/// The controller's whole live state at one revision.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClusterSnapshot {
    /// The global revision of this snapshot.
    pub rev: u64,
    /// All services.
    pub services: Vec<ServiceInfo>,
    /// All live (not ended) jobs.
    pub jobs: Vec<JobInfo>,
    /// All hosts.
    pub hosts: Vec<HostInfo>,
}

/// Receives the controller's committed changes.
///
/// **Who calls it**: the controller's state task, after each change is persisted, in
/// revision order, never concurrently. First [`resync`](Self::resync) with the full state
/// restored from the store (at start and after a restart — before the controller serves
/// anything), then [`on_event`](Self::on_event) for every later change. The listener must
/// not block: it copies what it needs and hands work to its own task.
///
/// The controller sends no event for a readiness probe that did not change the outcome:
/// workers report transitions only.
pub trait ClusterListener: Send + Sync + 'static {
    /// Replaces everything the listener knows with `snapshot`.
    fn resync(&self, snapshot: &ClusterSnapshot);
    /// Applies one change.
    fn on_event(&self, event: &ClusterEvent);
}

impl<T: ClusterListener + ?Sized> ClusterListener for std::sync::Arc<T> {
    fn resync(&self, snapshot: &ClusterSnapshot) {
        (**self).resync(snapshot)
    }
    fn on_event(&self, event: &ClusterEvent) {
        (**self).on_event(event)
    }
}
