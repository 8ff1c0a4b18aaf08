//! The wire formats of the endpoint routes (docs/api.md). This crate owns them; clients
//! (`xcecli-ext`) may deserialize answers with these types.

use crate::entry::{Entry, Replica};
use plugin_api::JobState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;
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

// === impl EndpointsAnswer ===

impl EndpointsAnswer {
    /// The answer for `entry`: non-ready replicas included (with `ready` and `state`) when
    /// `all`; with `port`, only the replicas that have that port, each with that port
    /// only (during a rollout that adds a port, the old replicas lack it).
    pub fn new(entry: &Entry, port: Option<&str>, all: bool) -> Self {
        let endpoints = entry
            .replicas
            .iter()
            .filter(|r| all || r.is_endpoint())
            .filter(|r| port.is_none_or(|p| r.ports.contains_key(p)))
            .map(|r| EndpointAnswer::new(r, port, all))
            .collect();
        Self {
            service: entry.service.clone(),
            project: entry.project.clone(),
            index: entry.index,
            meta: entry.meta.clone(),
            endpoints,
        }
    }
}

impl EndpointAnswer {
    fn new(r: &Replica, port: Option<&str>, all: bool) -> Self {
        let ports = r
            .ports
            .iter()
            .filter(|(name, _)| port.is_none_or(|p| p == *name))
            .map(|(name, port)| (name.to_owned(), *port))
            .collect();
        Self {
            replica: r.replica,
            job: r.job.to_string(),
            host: r.host.to_string(),
            generation: r.generation,
            address: r.address,
            ports,
            ready: all.then(|| r.is_endpoint()),
            state: all.then_some(r.state),
        }
    }
}

/// The plain-text answer: one `address:port` line per ready replica that has the port
/// named `port` (IPv6 bracketed).
pub fn plain(entry: &Entry, port: &str) -> String {
    let mut out = String::new();
    for addr in entry.endpoints().filter_map(|r| r.socket_addr(port)) {
        let _ = writeln!(out, "{addr}");
    }
    out
}

/// The Prometheus HTTP SD answer: one target group per ready replica that has `port`.
pub fn prometheus_sd(entry: &Entry, port: &str) -> Vec<SdTargetGroup> {
    entry
        .endpoints()
        .filter_map(|r| {
            let addr = r.socket_addr(port)?;
            let labels = [
                ("service", entry.service.clone()),
                ("project", entry.project.clone()),
                ("replica", r.replica.to_string()),
                ("host", r.host.to_string()),
                ("job", r.job.to_string()),
                ("generation", r.generation.to_string()),
                ("port", port.to_owned()),
            ]
            .into_iter()
            .map(|(k, v)| (format!("__meta_xce_{k}"), v))
            .chain(
                entry
                    .meta
                    .iter()
                    .map(|(k, v)| (format!("__meta_xce_meta_{k}"), v.clone())),
            )
            .collect();
            Some(SdTargetGroup {
                targets: vec![addr.to_string()],
                labels,
            })
        })
        .collect()
}
