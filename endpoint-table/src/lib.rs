//! The endpoint table: a service's name resolves to the `host:port` of its ready replicas,
//! change-driven, under RBAC (docs/api.md, rbac.md, design.md). A service is identified by its project
//! and name ([`plugin_api::ServiceKey`]); a name resolves among the caller's projects.
//!
//! Two halves, joined by a stream of [`Update`]s:
//!
//! - [`TableFeed`] (controller side) is the controller's [`plugin_api::ClusterListener`]. It
//!   owns the pure [`Table`], applies each event, and queues one [`Change`] per service whose
//!   entry really changed — without ever waiting for the other side.
//! - [`EndpointApi`] (apiserver side) is an [`plugin_api::ApiExtension`]. It serves from its
//!   own copy of the entries, with one watch channel per service, so a blocking query or a
//!   stream wakes only when its own service changed.
//!
//! [`endpoint_table`] builds both, joined in-process by a coalescing queue (at most one
//! pending change per service). A remote feed can replace the queue: build the apiserver
//! side with [`EndpointApi::standalone`] and call [`EndpointApi::apply`].
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod allstream;
mod api;
mod config;
mod delivery;
mod entry;
mod feed;
mod journal;
mod lag;
mod metrics;
mod query;
mod queue;
mod render;
mod routes;
mod shared;
mod stream;
mod table;
mod ui;
pub mod wire;

#[cfg(test)]
mod testutil;

pub use api::EndpointApi;
pub use config::{ConfigError, TableConfig};
pub use entry::{DeclaredPort, Entry, PortMap, Replica};
pub use feed::TableFeed;
pub use queue::Update;
pub use shared::Authority;
pub use table::{Change, Table};

use std::sync::Arc;

/// Builds the two halves of an endpoint table, joined in-process.
///
/// Register the [`TableFeed`] as the controller's cluster listener and the [`EndpointApi`]
/// as an apiserver extension. The API side starts applying the feed's changes when its
/// router is built ([`plugin_api::ApiExtension::router`]); until the first resync reached
/// it, its routes answer 503.
pub fn endpoint_table(cfg: TableConfig) -> (TableFeed, EndpointApi) {
    let metrics = Arc::new(metrics::Metrics::new());
    let queue = Arc::new(queue::Queue::default());
    let feed = TableFeed::new(queue.clone(), metrics.clone());
    let api = EndpointApi::new(cfg, metrics, Some(queue));
    (feed, api)
}
