//! The scheduler's consumable-resource extension point.

use crate::facts::HostFacts;
use crate::vocab::{FieldError, Grant, HostId, JobId};
use std::fmt;

/// What a plugin learned from validating its section of a service profile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SectionInfo {
    /// Names of the sockets the section declares, in declaration order. Readiness probes
    /// of the profile may reference them by name (e.g. `tcp = "http"`); the host checks
    /// such references against this list without knowing what the names mean.
    pub socket_names: Vec<String>,
    /// What one replica of the service takes of the plugin's resources, by resource name
    /// (e.g. `{"ports": 4}`): the host's per-project quotas limit these sums without
    /// knowing what they mean.
    pub quantities: std::collections::BTreeMap<String, u64>,
}

/// One replica the scheduler wants to place.
#[derive(Debug, Clone, Copy)]
pub struct PlacementRequest<'a> {
    /// Service name.
    pub service: &'a str,
    /// The service's project (RBAC scope).
    pub project: &'a str,
    /// Replica index, 0-based.
    pub replica: u32,
    /// The job that would run the replica.
    pub job: &'a str,
    /// The plugin's section of the profile (`service.<name>`), already validated;
    /// `None` when the profile has no such section.
    pub section: Option<&'a serde_json::Value>,
}

/// Why a replica does not fit a host, in two parts so the host can aggregate the same
/// reason over many hosts (`port metrics/tcp 9100` + `is taken` → "port metrics/tcp 9100
/// is taken on all 3 hosts").
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Unfit {
    /// The resource that could not be satisfied, e.g. `port metrics/tcp 9100`.
    pub resource: String,
    /// Why, as a predicate, e.g. `is taken` or `is reserved`.
    pub why: String,
}

impl fmt::Display for Unfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.resource, self.why)
    }
}

/// A consumable resource the scheduler allocates per host (ports are one).
///
/// **Who calls it**: the controller's single state task, sequentially; hence `&mut self`
/// and no internal locking is needed. All methods are synchronous, deterministic and
/// must not block: they run inside the scheduler loop.
///
/// **Lifecycle of a reservation**: [`reserve`](Self::reserve) during placement, together
/// with the placement (the host persists the returned [`Grant`] in the same store
/// transaction as the job; if that transaction fails it calls [`release`](Self::release)).
/// The host calls `release` exactly when the job has ended (exited, stopped and confirmed
/// gone, or its host lost past the grace period) — never before. After a controller
/// restart the host calls [`host_up`](Self::host_up) for every known host and then
/// [`restore`](Self::restore) for every live job, before any new placement.
pub trait ResourcePlugin: Send + Sync + 'static {
    /// The plugin's name: the key of its section in the profile's `[service]` table, in
    /// [`HostFacts::sections`], and in a job's grants. Constant.
    fn name(&self) -> &'static str;

    /// Validates the plugin's profile section (`None` when absent) against what the plugin
    /// knows of the cluster. Returns every problem, with field paths from the profile root
    /// (`service.<name>...`). Pure; may be called any number of times.
    fn validate(&self, section: Option<&serde_json::Value>)
        -> Result<SectionInfo, Vec<FieldError>>;

    /// The socket names the section declares, when they can be told although
    /// [`validate`](Self::validate) refused the section (e.g. it asks for more ports than
    /// any host holds): the host checks a readiness probe's socket name against them, so
    /// a refused section does not also make a correct probe reference look wrong. `None`
    /// when the names cannot be told (the section is unreadable); the host then leaves
    /// probe references unchecked, the section's own problems being reported anyway.
    /// Called only after `validate` refused. Pure; the default says `None`.
    fn socket_names(&self, section: Option<&serde_json::Value>) -> Option<Vec<String>> {
        let _ = section;
        None
    }

    /// Says whether `replicas` replicas of a service with this (validated) section could
    /// ever be held together by the hosts the plugin knows, were they all empty: the
    /// host calls it when a service is submitted or scaled (not when a stored service is
    /// loaded), and refuses the change with these problems (field paths from the profile
    /// root). Only input the user can fix belongs here (more than the whole cluster
    /// offers); what merely does not fit *now* stays pending with a reason. Pure; the
    /// default accepts everything.
    fn check_replicas(
        &self,
        section: Option<&serde_json::Value>,
        replicas: u32,
    ) -> Result<(), Vec<FieldError>> {
        let _ = (section, replicas);
        Ok(())
    }

    /// Learns or updates a host's capacity from its facts (registration or a re-report).
    /// May repeat for the same host; existing reservations on the host stay. An `Err`
    /// means the facts are unusable for this plugin (the host then gets no placements
    /// needing it); the host logs the reason.
    fn host_up(&mut self, host: &HostId, facts: &HostFacts) -> Result<(), FieldError>;

    /// Forgets a host entirely (decommissioned). Its reservations are dropped. Idempotent.
    fn host_removed(&mut self, host: &HostId);

    /// Says whether the replica fits `host` now, without changing anything.
    fn fits(&self, host: &HostId, request: &PlacementRequest<'_>) -> Result<(), Unfit>;

    /// Reserves what the replica needs on `host`, all or nothing. On `Err` nothing
    /// changed. The returned grant is persisted by the host with the placement.
    fn reserve(&mut self, host: &HostId, request: &PlacementRequest<'_>) -> Result<Grant, Unfit>;

    /// Releases the job's reservation on `host`. Idempotent; releasing an unknown job is a
    /// no-op.
    fn release(&mut self, host: &HostId, job: &JobId);

    /// Re-installs a persisted reservation after a restart. Must accept exactly what
    /// [`reserve`](Self::reserve) returned. An `Err` means the grant conflicts with one
    /// already restored (a bug or a corrupted store); the host logs it loudly.
    fn restore(&mut self, host: &HostId, job: &JobId, grant: &Grant) -> Result<(), String>;

    /// A worker's launch hook refused to start `job` (e.g. a granted port is held by a
    /// process outside xce). `detail` is [`LaunchRefusal::detail`](crate::LaunchRefusal).
    /// The plugin should avoid the cause on that host in later placements. The host
    /// releases the job afterwards as usual.
    fn launch_refused(&mut self, host: &HostId, job: &JobId, detail: &serde_json::Value) {
        let _ = (host, job, detail);
    }

    /// Registers the plugin's metrics (e.g. pool usage) in the host's registry. Called once.
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let _ = registry;
    }

    /// A JSON summary of one job's grant for the REST answers about the job (e.g.
    /// `{"http": 20417}`), shown under the plugin's name. `None` hides it.
    fn grant_summary(&self, grant: &Grant) -> Option<serde_json::Value> {
        let _ = grant;
        None
    }

    /// A JSON summary of the plugin's view of `host` for the host API (e.g. pool usage),
    /// shown under the plugin's name. `None` when the plugin has nothing to say.
    fn host_summary(&self, host: &HostId) -> Option<serde_json::Value> {
        let _ = host;
        None
    }
}

impl<T: ResourcePlugin + ?Sized> ResourcePlugin for Box<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn validate(
        &self,
        section: Option<&serde_json::Value>,
    ) -> Result<SectionInfo, Vec<FieldError>> {
        (**self).validate(section)
    }
    fn socket_names(&self, section: Option<&serde_json::Value>) -> Option<Vec<String>> {
        (**self).socket_names(section)
    }
    fn check_replicas(
        &self,
        section: Option<&serde_json::Value>,
        replicas: u32,
    ) -> Result<(), Vec<FieldError>> {
        (**self).check_replicas(section, replicas)
    }
    fn host_up(&mut self, host: &HostId, facts: &HostFacts) -> Result<(), FieldError> {
        (**self).host_up(host, facts)
    }
    fn host_removed(&mut self, host: &HostId) {
        (**self).host_removed(host)
    }
    fn fits(&self, host: &HostId, request: &PlacementRequest<'_>) -> Result<(), Unfit> {
        (**self).fits(host, request)
    }
    fn reserve(&mut self, host: &HostId, request: &PlacementRequest<'_>) -> Result<Grant, Unfit> {
        (**self).reserve(host, request)
    }
    fn release(&mut self, host: &HostId, job: &JobId) {
        (**self).release(host, job)
    }
    fn restore(&mut self, host: &HostId, job: &JobId, grant: &Grant) -> Result<(), String> {
        (**self).restore(host, job, grant)
    }
    fn launch_refused(&mut self, host: &HostId, job: &JobId, detail: &serde_json::Value) {
        (**self).launch_refused(host, job, detail)
    }
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        (**self).register_metrics(registry)
    }
    fn host_summary(&self, host: &HostId) -> Option<serde_json::Value> {
        (**self).host_summary(host)
    }
    fn grant_summary(&self, grant: &Grant) -> Option<serde_json::Value> {
        (**self).grant_summary(grant)
    }
}
