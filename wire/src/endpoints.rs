//! The wire formats of the endpoint routes (`docs/api.md`, "Endpoints"). The endpoint
//! table (`endpoint-table`) writes them from its entries (its `wire` module holds the
//! conversions); clients deserialize answers with them.

use plugin_api::JobState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The header carrying a service's index on every endpoint answer.
pub const INDEX_HEADER: &str = "x-xce-index";

/// `GET /v1/services/{name}/endpoints` (and each stream event's data):
/// `{"service":"web","project":"default","index":42,"endpoints":[...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointsAnswer {
    /// Service name.
    pub service: String,
    /// The service's project: with the name, what identifies the service (empty from a
    /// server that predates projects in entries).
    #[serde(default)]
    pub project: String,
    /// The service's index.
    pub index: u64,
    /// The service's `[service.meta]` labels (absent when it has none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// Ready replicas (all live ones with `?include=all`), by replica index; with `?port=P`
    /// only those that have port P.
    pub endpoints: Vec<EndpointAnswer>,
}

/// One replica in an [`EndpointsAnswer`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointAnswer {
    /// Replica index, 0-based.
    pub replica: u32,
    /// Job id.
    pub job: String,
    /// Host id.
    pub host: String,
    /// The generation of the service profile the replica runs (1 from a server that
    /// predates generations).
    #[serde(default = "plugin_api::first_generation")]
    pub generation: u64,
    /// The host's advertised address (absent only for a non-ready replica whose host has
    /// not reported one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    /// Ports by name (only the one named by `?port=` when given).
    pub ports: BTreeMap<String, u16>,
    /// With `?include=all` only: whether the replica is an endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// With `?include=all` only: the job's state (`placed`, `running`, `draining`,
    /// `stopping`, `unknown`). A `draining` replica has left the endpoint (`ready` is
    /// false) and still runs for its service's `drain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<JobState>,
}

/// `GET /v1/endpoints`: the entries of every service the caller may view, by name, then
/// project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointsList {
    /// The entries.
    pub services: Vec<EndpointsAnswer>,
}

/// The event of `GET /v1/endpoints/stream` for a service that is gone:
/// `{"service":"web","project":"default","deleted":true,"index":57}` (every other event of
/// that stream is an [`EndpointsAnswer`]). `index` is the cluster revision of the removal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedAnswer {
    /// Service name.
    pub service: String,
    /// The service's project.
    pub project: String,
    /// Always true.
    pub deleted: bool,
    /// The cluster revision of the removal.
    pub index: u64,
}

/// The event type of the all-services stream's `event: reset`: what the client holds may
/// have a gap; drop it, a full snapshot follows.
pub const RESET_EVENT: &str = "reset";

/// One target group of Prometheus' HTTP service discovery (`GET /v1/sd/prometheus`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SdTargetGroup {
    /// `address:port` of one ready replica.
    pub targets: Vec<String>,
    /// `__meta_xce_{service,project,replica,host,job,generation,port}`, and
    /// `__meta_xce_meta_<key>` for each of the service's `meta` labels.
    pub labels: BTreeMap<String, String>,
}
