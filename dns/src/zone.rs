//! The zone: every name the endpoint table gives rise to, built once per change of the
//! table (not per query), keyed by lower-case labels. Every project is in it; who may see
//! which is decided per query ([`crate::View`]), so one zone serves every principal.

use endpoint_table::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

/// The label under the apex that holds the hosts: `<host>.host.<domain>.`. A project
/// named like it is not served in DNS (its names would be the hosts').
pub const HOSTS_LABEL: &str = "host";

/// SRV targets by `(_port, _proto)` labels: `(host, port)` pairs.
pub(crate) type SrvTargets = BTreeMap<(String, String), Vec<(Arc<str>, u16)>>;

/// One service's records.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ServiceRecords {
    /// The distinct addresses of its endpoints, sorted.
    pub(crate) addrs: Vec<IpAddr>,
    /// By `(_port, _proto)` labels (lower case, with their underscores): the endpoints'
    /// `(host, port)`, sorted.
    pub(crate) srv: SrvTargets,
}

/// One host's record: its address and the projects of the endpoints on it (a host's name
/// is visible to whoever may view one of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostRecord {
    pub(crate) addr: IpAddr,
    pub(crate) projects: BTreeSet<String>,
}

/// The zone as built from one snapshot of the endpoint table.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Zone {
    /// `None`: the table is not serving (catching up, or stale): every answer in the
    /// zone is SERVFAIL.
    pub(crate) live: Option<Names>,
    /// Its answers as encoded for the queries asked so far (empty in a new zone).
    pub(crate) answers: crate::encoded::AnswerCache,
}

/// The names of a live zone.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Names {
    /// By project, then service (lower case).
    pub(crate) services: HashMap<String, HashMap<String, ServiceRecords>>,
    /// By host name (lower case).
    pub(crate) hosts: HashMap<String, HostRecord>,
}

impl Zone {
    /// A zone that answers SERVFAIL (the table is not serving).
    pub fn unavailable() -> Self {
        Self {
            live: None,
            answers: Default::default(),
        }
    }

    /// The zone of `entries` (a snapshot of the endpoint table). Only endpoints count
    /// ([`endpoint_table::Replica::is_endpoint`]: ready, not draining or stopping, on a
    /// host with an address), so a replica leaves DNS the moment it starts draining.
    pub fn build<'a>(entries: impl IntoIterator<Item = &'a Arc<Entry>>) -> Self {
        let mut names = Names::default();
        for entry in entries {
            let project = entry.project.to_ascii_lowercase();
            if project == HOSTS_LABEL {
                continue;
            }
            let recs = service_records(entry, &project, &mut names.hosts);
            names
                .services
                .entry(project)
                .or_default()
                .insert(entry.service.to_ascii_lowercase(), recs);
        }
        Self {
            live: Some(names),
            answers: Default::default(),
        }
    }

    /// How many services the zone holds (for logs).
    pub fn services(&self) -> usize {
        self.live
            .as_ref()
            .map_or(0, |n| n.services.values().map(HashMap::len).sum())
    }
}

fn service_records(
    entry: &Entry,
    project: &str,
    hosts: &mut HashMap<String, HostRecord>,
) -> ServiceRecords {
    let mut recs = ServiceRecords::default();
    for replica in entry.endpoints() {
        let Some(addr) = replica.address else {
            continue;
        };
        recs.addrs.push(addr);
        let host = hosts
            .entry(replica.host.to_ascii_lowercase())
            .or_insert_with(|| HostRecord {
                addr,
                projects: BTreeSet::new(),
            });
        host.projects.insert(project.to_owned());
        for (name, port) in replica.ports.iter() {
            // A port no longer declared (a rollout removing it) keeps its old replicas'
            // protocol unknown: it is not served, like the endpoint table's default.
            let Some(declared) = entry.ports.iter().find(|p| p.name == name) else {
                continue;
            };
            let key = (
                format!("_{}", name.to_ascii_lowercase()),
                format!("_{}", declared.protocol),
            );
            let host_name: Arc<str> = replica.host.to_ascii_lowercase().into();
            recs.srv.entry(key).or_default().push((host_name, *port));
        }
    }
    recs.addrs.sort();
    recs.addrs.dedup();
    for targets in recs.srv.values_mut() {
        targets.sort();
        targets.dedup();
    }
    recs
}
