//! Named ports as a per-host consumable resource (docs/profile.md).
//!
//! Owns the `service.ports` profile section ([`profile`]), the per-host port pools
//! ([`pool`]), the scheduler's [`plugin_api::ResourcePlugin`] ([`PortsPlugin`]), the
//! worker's [`plugin_api::HostFactsProvider`] ([`PortFactsProvider`]) and
//! [`plugin_api::LaunchHook`] ([`PortsLaunchHook`], the `XCE_PORT_*` environment), and the
//! port grant format ([`grant`]).
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod facts;
pub mod grant;
mod hook;
pub mod name;
mod plugin;
pub mod pool;
mod portset;
pub mod profile;
mod proto_pool;
pub mod range;

pub use facts::{HostPortsFacts, PortFactsProvider, PortsConfigError, WorkerPortsConfig};
pub use grant::{GrantedPort, GrantedPortRef, PortGrant, PortGrantRef, Protocol, PLUGIN_NAME};
pub use hook::PortsLaunchHook;
pub use plugin::PortsPlugin;
pub use range::{InvalidRange, PortRange};
