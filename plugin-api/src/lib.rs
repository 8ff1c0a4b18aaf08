//! The extension points of xce's scheduler, worker, controller and apiserver.
//!
//! This crate is the only thing plugin crates and hosts share. It holds small traits and
//! the vocabulary they speak (ids, host facts, grants, cluster events, principals). It
//! knows nothing of ports, addresses-as-resources or endpoints: a plugin's own data travels
//! through it as opaque JSON sections keyed by the plugin's name.
//!
//! | component  | trait                  | implemented by (today)          |
//! |------------|------------------------|---------------------------------|
//! | scheduler  | [`ResourcePlugin`]     | `port-resource`                 |
//! | worker     | [`HostFactsProvider`]  | `host-address`, `port-resource` |
//! | worker     | [`LaunchHook`]         | `port-resource`                 |
//! | controller | [`HostFactsPolicy`]    | `host-address`                  |
//! | controller | [`ClusterListener`]    | `endpoint-table`                |
//! | apiserver  | [`ApiExtension`]       | `endpoint-table`                |
//! | apiserver  | [`Authenticator`]      | the host (`local-cluster`)      |
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod auth;
mod error_body;
mod events;
mod facts;
pub mod http2;
mod launch;
mod resource;

pub use auth::{
    ApiContext, ApiError, ApiExtension, AuthError, Authenticator, Credential, LiveGrants,
    Permission, Principal, PrincipalKind,
};
pub use error_body::{ErrorBody, ErrorInfo};
pub use events::{
    first_generation, resolve_service, ClusterEvent, ClusterListener, ClusterSnapshot, EndReason,
    HostInfo, HostState, JobInfo, JobState, Resolved, ServiceInfo, ServiceKey,
};
pub use facts::{FactsError, HostAddress, HostFacts, HostFactsPolicy, HostFactsProvider};
pub use launch::{LaunchContext, LaunchHook, LaunchPlan, LaunchRefusal};
pub use resource::{PlacementRequest, ResourcePlugin, SectionInfo, Unfit};

use std::fmt;

/// The id of an exec host, e.g. `exec-01`.
pub type HostId = String;
/// The id of a job (one run of one replica), e.g. `j-17`.
pub type JobId = String;

/// A plugin's opaque, persisted record of what it granted one job (e.g. the ports it
/// reserved). The host stores it atomically with the placement, hands it to the worker's
/// launch hooks, to listeners, and back to the plugin on restore.
pub type Grant = serde_json::Value;

/// One problem with a piece of input: where it is and why it is wrong.
///
/// `path` uses dotted TOML/JSON notation from the profile root, e.g. `service.ports[1].name`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FieldError {
    /// Where the problem is, e.g. `service.ports[0].port`.
    // Defaults: a client reads whatever an error body holds (see [`ErrorBody`]).
    #[serde(default)]
    pub field: String,
    /// Why it is a problem, lowercase, no full stop.
    #[serde(default)]
    pub reason: String,
}

impl FieldError {
    /// Builds a field error.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}
