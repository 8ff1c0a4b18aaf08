//! The controller's change feed: job lifecycle, readiness transitions, host changes.

use crate::facts::HostFacts;
use crate::vocab::{Grants, HostId, JobId};

/// What identifies a service: its project and its name. Two projects may each have a
/// service of the same name; nothing else tells them apart.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ServiceKey {
    /// The project (RBAC scope).
    pub project: String,
    /// The service name, unique within its project.
    pub name: String,
}

impl ServiceKey {
    /// The key of service `name` in `project`.
    pub fn new(project: impl Into<String>, name: impl Into<String>) -> Self {
        ServiceKey {
            project: project.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.project, self.name)
    }
}

/// How a path's service name is resolved for a caller (docs/api.md): among the projects the
/// caller may view, or exactly `project` when given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The one visible service of that name.
    Found(ServiceKey),
    /// None the caller may view: the same answer as for a name nobody uses.
    NotFound,
    /// Several visible projects have a service of that name (listed): the caller must
    /// pick one with `?project=`.
    Ambiguous(Vec<String>),
}

/// Resolves service `name` for a caller who may view the projects `visible` accepts;
/// `projects` are the projects that have a service of that name. A project the caller
/// cannot view is never named and never changes the answer.
pub fn resolve_service<'a>(
    name: &str,
    project: Option<&str>,
    projects: impl IntoIterator<Item = &'a str>,
    visible: impl Fn(&str) -> bool,
) -> Resolved {
    let mut mine: Vec<&str> = projects.into_iter().filter(|p| visible(p)).collect();
    mine.sort_unstable();
    mine.dedup();
    match (project, mine.as_slice()) {
        (Some(p), _) if mine.contains(&p) => Resolved::Found(ServiceKey::new(p, name)),
        (Some(_), _) | (None, []) => Resolved::NotFound,
        (None, [one]) => Resolved::Found(ServiceKey::new(*one, name)),
        (None, _) => Resolved::Ambiguous(mine.iter().map(|p| (*p).to_owned()).collect()),
    }
}

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

impl ServiceInfo {
    /// What identifies the service.
    pub fn key(&self) -> ServiceKey {
        ServiceKey::new(&self.project, &self.name)
    }
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

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JobState::Placed => "placed",
            JobState::Running => "running",
            JobState::Draining => "draining",
            JobState::Stopping => "stopping",
            JobState::Unknown => "unknown",
            JobState::Exited => "exited",
            JobState::Lost => "lost",
        })
    }
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
    pub grants: Grants,
    /// The generation of the service profile this job runs (see
    /// [`ServiceInfo::generation`]).
    #[serde(default = "first_generation")]
    pub generation: u64,
}

impl JobInfo {
    /// The key of the job's service.
    pub fn service_key(&self) -> ServiceKey {
        ServiceKey::new(&self.project, &self.service)
    }
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

impl std::fmt::Display for EndReason {
    /// `exited code=0`, `exited` (code unknown), `stopped`, `host lost`, `refused: …`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndReason::Exited { code: Some(c) } => write!(f, "exited code={c}"),
            EndReason::Exited { code: None } => f.write_str("exited"),
            EndReason::Stopped => f.write_str("stopped"),
            EndReason::HostLost => f.write_str("host lost"),
            EndReason::Refused { reason } => write!(f, "refused: {reason}"),
        }
    }
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

impl std::fmt::Display for HostState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HostState::Ready => "ready",
            HostState::Unreachable => "unreachable",
            HostState::Lost => "lost",
        })
    }
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
        /// Services affected, whose `rev` became the event's.
        services: Vec<ServiceKey>,
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
    /// Applies changes in order, as the host committed them together (one store batch).
    /// The default applies them one by one; a listener whose per-event work is large
    /// (the endpoint table: a new entry per touched service) overrides it to do that work
    /// once per batch. A host may call either; it must not call both for one event.
    fn on_events(&self, events: &[ClusterEvent]) {
        for event in events {
            self.on_event(event);
        }
    }
    /// [`on_events`](Self::on_events) for changes that reached this process late: `since`
    /// is when they were first known to exist (a separate apiserver learns of a revision
    /// before its store watch delivers it), so that a listener measuring how long changes
    /// take to reach its readers counts from there. The default ignores `since`.
    fn on_events_since(&self, events: &[ClusterEvent], since: std::time::Instant) {
        let _ = since;
        self.on_events(events);
    }
    /// The host can no longer follow the changes: it met a stored record or an event it
    /// does not understand (written by a newer release), and reloads. What the listener
    /// holds may be out of date from now on, so it must stop serving it (fail closed:
    /// readers get an error naming `reason`, never the old state) until the next
    /// [`resync`](Self::resync). The default does nothing (a listener that serves
    /// nobody).
    fn stale(&self, reason: &str) {
        let _ = reason;
    }
}

impl<T: ClusterListener + ?Sized> ClusterListener for std::sync::Arc<T> {
    fn resync(&self, snapshot: &ClusterSnapshot) {
        (**self).resync(snapshot)
    }
    fn on_event(&self, event: &ClusterEvent) {
        (**self).on_event(event)
    }
    fn on_events(&self, events: &[ClusterEvent]) {
        (**self).on_events(events)
    }
    fn on_events_since(&self, events: &[ClusterEvent], since: std::time::Instant) {
        (**self).on_events_since(events, since)
    }
    fn stale(&self, reason: &str) {
        (**self).stale(reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_resolves_among_the_callers_projects_only() {
        let has = ["team-a", "team-b", "team-c"];
        let mine = |p: &str| p != "team-c";
        let r = |project| resolve_service("web", project, has, mine);
        assert_eq!(
            r(None),
            Resolved::Ambiguous(vec!["team-a".into(), "team-b".into()])
        );
        assert_eq!(
            r(Some("team-b")),
            Resolved::Found(ServiceKey::new("team-b", "web"))
        );
        // Invisible and unknown answer alike.
        assert_eq!(r(Some("team-c")), Resolved::NotFound);
        assert_eq!(r(Some("team-z")), Resolved::NotFound);
        let only_c = resolve_service("web", None, ["team-c"], mine);
        assert_eq!(only_c, Resolved::NotFound);
        let one = resolve_service("web", None, ["team-a", "team-c"], mine);
        assert_eq!(one, Resolved::Found(ServiceKey::new("team-a", "web")));
    }
}
