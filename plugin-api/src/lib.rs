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
//! | apiserver  | [`Authenticator`]      | the host (`xce-serve`)          |
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod auth;
mod error_body;
mod events;
mod facts;
mod grant;
mod grants;
mod launch;
mod name;
mod resource;
#[cfg(feature = "server")]
mod server;
mod vocab;

pub use auth::{
    ApiContext, ApiError, AuthError, Authenticator, Credential, LiveGrants, Permission, Principal,
    PrincipalKind,
};
pub use error_body::{ErrorBody, ErrorInfo};
pub use events::{
    first_generation, resolve_service, ClusterEvent, ClusterListener, ClusterSnapshot, EndReason,
    HostInfo, HostState, JobInfo, JobState, Resolved, ServiceInfo, ServiceKey,
};
pub use facts::{FactsError, HostAddress, HostFacts, HostFactsPolicy, HostFactsProvider};
pub use launch::{LaunchContext, LaunchHook, LaunchPlan, LaunchRefusal};
pub use name::{check_name, InvalidName, MAX_NAME_LEN};
pub use resource::{PlacementRequest, ResourcePlugin, SectionInfo, Unfit};
#[cfg(feature = "server")]
pub use server::{ApiExtension, Parked};
pub use vocab::{FieldError, Grant, GrantError, Grants, HostId, JobId};

/// **Test-only.** Whether the robustness suite planted bug `name` in this process: the
/// comma-separated list in the environment variable `E2E_PLANT_BUG`. The suite switches a
/// planted bug on to show that its validators catch it (see
/// `integration-tests/tests/robustness/planted.rs`); nothing else may. Only debug builds
/// read the variable: in a release build this is always `false`.
pub fn planted_bug(name: &str) -> bool {
    #[cfg(debug_assertions)]
    {
        static PLANTED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        PLANTED
            .get_or_init(|| {
                std::env::var("E2E_PLANT_BUG")
                    .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect())
                    .unwrap_or_default()
            })
            .iter()
            .any(|p| p == name)
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = name;
        false
    }
}
