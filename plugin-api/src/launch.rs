//! The worker's launch extension point.

use crate::vocab::{Grants, HostId, JobId};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

/// What a launch hook knows about the replica about to start.
#[derive(Debug, Clone)]
pub struct LaunchContext {
    /// The job id.
    pub job: JobId,
    /// Service name.
    pub service: String,
    /// The service's project.
    pub project: String,
    /// Replica index, 0-based.
    pub replica: u32,
    /// The host the worker runs.
    pub host: HostId,
    /// The host's advertised address as last reported.
    pub host_ip: Option<IpAddr>,
    /// The grants of every resource plugin, keyed by plugin name.
    pub grants: Grants,
}

/// What the worker will start: filled in by the launch hooks, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchPlan {
    /// Environment variables to add to the replica's environment.
    pub env: BTreeMap<String, String>,
    /// Sockets the replica is expected to listen on, by the name the profile declares.
    /// Readiness probes that name a socket (`tcp = "http"`) connect to this address.
    pub sockets: BTreeMap<String, SocketAddr>,
}

/// A launch hook's refusal to start a replica.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LaunchRefusal {
    /// The refusing hook's name (the resource plugin that gets `detail`).
    pub plugin: String,
    /// Human-readable reason, lowercase, e.g. `port http/tcp 20417 is in use on the host`.
    pub reason: String,
    /// Machine-readable detail for the plugin's
    /// [`ResourcePlugin::launch_refused`](crate::ResourcePlugin::launch_refused).
    pub detail: serde_json::Value,
}

/// Prepares a replica's launch on the worker.
///
/// **Who calls it**: the worker, once per job start (and again if the same job is started
/// again after a refusal was lost, so it must be idempotent), in registration order, just
/// before spawning the process. It adds environment and sockets to `plan`, or refuses the
/// launch. A refusal is reported to the controller, which releases the job's grants and
/// places the replica again. The hook holds nothing after it returns: anything it probes
/// (e.g. binding a port to check it is free) it must release before returning.
#[async_trait]
pub trait LaunchHook: Send + Sync + 'static {
    /// The hook's name (the same as its resource plugin's, when it has one).
    fn name(&self) -> &'static str;

    /// Adds to `plan`, or refuses.
    async fn prepare(&self, cx: &LaunchContext, plan: &mut LaunchPlan)
        -> Result<(), LaunchRefusal>;
}

#[async_trait]
impl<T: LaunchHook + ?Sized> LaunchHook for std::sync::Arc<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    async fn prepare(
        &self,
        cx: &LaunchContext,
        plan: &mut LaunchPlan,
    ) -> Result<(), LaunchRefusal> {
        (**self).prepare(cx, plan).await
    }
}
