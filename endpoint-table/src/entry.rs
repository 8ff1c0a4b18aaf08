//! The table's value type: one service's entry, as the controller side computes it and the
//! apiserver side serves it. Serializable so a remote feed can ship it.

use plugin_api::{JobState, ServiceKey};
use port_resource::grant::Protocol;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

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
    /// Job id.
    pub job: String,
    /// The host the job is on.
    pub host: String,
    /// The host's advertised address, when it reported one.
    pub address: Option<IpAddr>,
    /// Granted ports by name. During a rollout that adds or removes a port, replicas of
    /// different generations have different ports.
    pub ports: BTreeMap<String, u16>,
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
