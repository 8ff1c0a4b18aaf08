//! The table's value type: one service's entry, as the controller side computes it and the
//! apiserver side serves it. Serializable so a remote feed can ship it.

use plugin_api::{JobState, ServiceKey};
use port_resource::grant::Protocol;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// One service's entry in the endpoint table. A service is identified by its project and
/// its name together ([`Entry::key`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Service name.
    pub service: String,
    /// The service's project (the RBAC scope every read is checked against).
    pub project: String,
    /// The change index: at least 1, raised on every change of the entry, never lowered.
    pub index: u64,
    /// The ports the service declares, in declaration order.
    pub ports: Vec<DeclaredPort>,
    /// Every live (not ended) job of the service, ordered by replica index then job id.
    pub replicas: Vec<Replica>,
    /// The service's `[service.meta]` labels (validated by the host: keys `[a-z0-9_]`,
    /// 1-63 characters, at most 32 pairs, values at most 256 bytes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    /// The default JSON answer, rendered at most once per version of the entry (an entry
    /// is immutable once published; a change publishes a new one). Not part of the value.
    #[serde(skip)]
    pub(crate) rendered: Rendered,
}

/// A lazily filled cache of an entry's default JSON answer. Compares equal to any other,
/// so it never affects whether two entries are the same; a clone starts empty, so an entry
/// copied in order to be changed never carries the old rendering.
#[derive(Default)]
pub(crate) struct Rendered(pub(crate) std::sync::OnceLock<axum::body::Bytes>);

impl Clone for Rendered {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for Rendered {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Rendered {}

impl std::fmt::Debug for Rendered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Rendered(cached)"
        } else {
            "Rendered(empty)"
        })
    }
}

/// A port a service declares (`service.ports[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredPort {
    /// The port's name.
    pub name: String,
    /// Its protocol.
    pub protocol: Protocol,
}

/// One live job of a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    /// Replica index, 0-based.
    pub replica: u32,
    /// Job id (shared with the table's own records of the job).
    pub job: Arc<str>,
    /// The host the job is on (one copy per host, shared by its replicas).
    pub host: Arc<str>,
    /// The host's advertised address, when it reported one.
    pub address: Option<IpAddr>,
    /// Granted ports by name. During a rollout that adds or removes a port, replicas of
    /// different generations have different ports.
    pub ports: PortMap,
    /// The generation of the service profile the job runs ([`JobInfo::generation`]).
    ///
    /// [`JobInfo::generation`]: plugin_api::JobInfo::generation
    #[serde(default = "plugin_api::first_generation")]
    pub generation: u64,
    /// The job's state.
    pub state: JobState,
    /// Whether the job passes its readiness probe (as the controller reports it).
    pub ready: bool,
}

// === impl Entry ===

impl Entry {
    /// What identifies the service: (project, name).
    pub fn key(&self) -> ServiceKey {
        ServiceKey::new(&self.project, &self.service)
    }

    /// The replicas that are endpoints (see [`Replica::is_endpoint`]).
    pub fn endpoints(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.iter().filter(|r| r.is_endpoint())
    }

    /// Whether the service declares a port named `name`.
    pub fn declares(&self, name: &str) -> bool {
        self.ports.iter().any(|p| p.name == name)
    }

    /// Whether a port named `name` may be asked for: the service declares it, or a live
    /// replica still has it (a rollout that removes a port: the old replicas keep it until
    /// they are gone).
    pub fn knows_port(&self, name: &str) -> bool {
        self.declares(name) || self.replicas.iter().any(|r| r.ports.contains_key(name))
    }

    /// Whether `self` and `other` say the same thing, whatever their indexes.
    pub(crate) fn same_content(&self, other: &Entry) -> bool {
        self.service == other.service
            && self.project == other.project
            && self.ports == other.ports
            && self.meta == other.meta
            && self.replicas == other.replicas
    }
}

// === impl Replica ===

impl Replica {
    /// Whether the replica is an endpoint: ready, running (or unknown within the host's
    /// grace period, which keeps readiness) and on a host with an advertised address.
    /// A draining or stopping replica is never one.
    pub fn is_endpoint(&self) -> bool {
        self.ready
            && matches!(self.state, JobState::Running | JobState::Unknown)
            && self.address.is_some()
    }

    /// `address:port` of the port named `port` (IPv6 bracketed), if both are known.
    pub fn socket_addr(&self, port: &str) -> Option<SocketAddr> {
        Some(SocketAddr::new(self.address?, *self.ports.get(port)?))
    }
}

/// A replica's granted ports by name, in name order: a boxed slice of `(name, port)`,
/// the names shared between replicas. A `BTreeMap<String, u16>` spent a 300-byte B-tree
/// node on a replica's one to three ports, plus a copy of each name: most of the table's
/// memory per endpoint (issue 14's goal: at most 500 bytes). Serialized as a JSON object.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct PortMap(Box<[(Arc<str>, u16)]>);

impl PortMap {
    /// The port named `name`.
    pub fn get(&self, name: &str) -> Option<&u16> {
        let i = self.0.binary_search_by(|(n, _)| (**n).cmp(name)).ok()?;
        Some(&self.0[i].1)
    }

    /// Whether a port named `name` is granted.
    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The names, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(n, _)| &**n)
    }

    /// The ports, in name order.
    pub fn values(&self) -> impl Iterator<Item = &u16> {
        self.0.iter().map(|(_, p)| p)
    }

    /// `(name, port)`, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &u16)> {
        self.0.iter().map(|(n, p)| (&**n, p))
    }

    /// How many ports.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// From `(name, port)` pairs in any order; of two with one name, the last wins (as a map
/// insert would).
impl<N: Into<Arc<str>>> FromIterator<(N, u16)> for PortMap {
    fn from_iter<I: IntoIterator<Item = (N, u16)>>(iter: I) -> Self {
        let mut ports: Vec<(Arc<str>, u16)> =
            iter.into_iter().map(|(n, p)| (n.into(), p)).collect();
        // Stable: equal names keep their order, so the last one is kept below.
        ports.sort_by(|a, b| a.0.cmp(&b.0));
        ports.reverse();
        ports.dedup_by(|a, b| a.0 == b.0);
        ports.reverse();
        Self(ports.into_boxed_slice())
    }
}

impl From<BTreeMap<String, u16>> for PortMap {
    fn from(map: BTreeMap<String, u16>) -> Self {
        map.into_iter().collect()
    }
}

impl std::fmt::Debug for PortMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for PortMap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for PortMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(BTreeMap::<String, u16>::deserialize(d)?.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_map_reads_and_serializes_as_a_map() {
        let map: PortMap = [("metrics", 2), ("http", 1), ("metrics", 3)]
            .into_iter()
            .collect();
        assert_eq!((map.get("metrics"), map.get("http")), (Some(&3), Some(&1)));
        assert!(!map.contains_key("grpc"));
        assert_eq!(map.keys().collect::<Vec<_>>(), ["http", "metrics"]);
        let json = serde_json::to_string(&map).unwrap();
        assert_eq!(json, r#"{"http":1,"metrics":3}"#);
        assert_eq!(serde_json::from_str::<PortMap>(&json).unwrap(), map);
    }
}
