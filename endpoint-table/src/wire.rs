//! The wire formats of the endpoint routes (docs/api.md): the types are `xce-wire`'s
//! (`xce_wire::endpoints`, re-exported here), which clients (`xcecli-ext`) read answers
//! with; this module turns the table's entries into them.

use crate::entry::{Entry, Replica};
use std::fmt::Write;

pub use xce_wire::endpoints::{
    DeletedAnswer, EndpointAnswer, EndpointsAnswer, EndpointsList, SdTargetGroup, INDEX_HEADER,
    RESET_EVENT,
};

/// The answer for `entry`: non-ready replicas included (with `ready` and `state`) when
/// `all`; with `port`, only the replicas that have that port, each with that port
/// only (during a rollout that adds a port, the old replicas lack it).
pub fn answer(entry: &Entry, port: Option<&str>, all: bool) -> EndpointsAnswer {
    let endpoints = entry
        .replicas
        .iter()
        .filter(|r| all || r.is_endpoint())
        .filter(|r| port.is_none_or(|p| r.ports.contains_key(p)))
        .map(|r| endpoint(r, port, all))
        .collect();
    EndpointsAnswer {
        service: entry.service.clone(),
        project: entry.project.clone(),
        index: entry.index,
        meta: entry.meta.clone(),
        endpoints,
    }
}

fn endpoint(r: &Replica, port: Option<&str>, all: bool) -> EndpointAnswer {
    let ports = r
        .ports
        .iter()
        .filter(|(name, _)| port.is_none_or(|p| p == *name))
        .map(|(name, port)| (name.to_owned(), *port))
        .collect();
    EndpointAnswer {
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
