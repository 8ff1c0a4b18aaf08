//! Named ports as a per-host consumable resource.
//!
//! Owns the `service.ports` profile section, the per-host port pools, the scheduler's
//! [`plugin_api::ResourcePlugin`], the worker's [`plugin_api::LaunchHook`] (the `XCE_PORT_*`
//! environment) and the port grant format (`grant`).
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod grant;

/// The plugin's name: its profile section (`service.ports`), host-facts section and grant key.
pub const PLUGIN_NAME: &str = "ports";
