//! The table's value type: one service's entry, as the controller side computes it and the
//! apiserver side serves it. Serializable so a remote feed can ship it.

use axum::body::Bytes;
use plugin_api::{JobState, ServiceKey};
use port_resource::grant::Protocol;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

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

/// A lazily filled cache of an entry's renderings (`crate::render`: its JSON answers, plain
/// answers and stream events, each built at most once per version of the entry). Compares
/// equal to any other, so it never affects whether two entries are the same; a clone
/// starts empty, so an entry copied in order to be changed never carries the old renderings.
#[derive(Default)]
pub(crate) struct Rendered {
    /// The JSON answer: `[default, ?include=all]`.
    pub(crate) json: [OnceLock<Bytes>; 2],
    /// The per-service stream's event, per view as `json`.
    pub(crate) stream: [OnceLock<Bytes>; 2],
    /// The plain answer for each declared port.
    pub(crate) plain: OnceLock<PlainAnswers>,
}

/// Plain answers by port name.
pub(crate) type PlainAnswers = Box<[(Box<str>, Bytes)]>;

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
        f.write_str(if self.has_json() {
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
        // Test-only planted bug (debug builds): a drain whose SIGTERM comes before the
        // announce: the replica leaves its endpoint only once it has stopped.
        let late_announce = plugin_api::planted_bug("drain-sigterm-before-announce")
            && matches!(self.state, JobState::Draining | JobState::Stopping);
        (late_announce || self.ready && matches!(self.state, JobState::Running | JobState::Unknown))
            && self.address.is_some()
    }

    /// `address:port` of the port named `port` (IPv6 bracketed), if both are known.
    pub fn socket_addr(&self, port: &str) -> Option<SocketAddr> {
        Some(SocketAddr::new(self.address?, *self.ports.get(port)?))
    }
}

/// A replica's granted ports by name, in name order. Serialized as a JSON object.
///
/// 16 bytes and, for up to `INLINE_PORTS` ports, no allocation of its own: the names
/// live in a `PortShape` that the table shares between every replica granted the same
/// names (a service's replicas, mostly), and the port numbers inline. A
/// `BTreeMap<String, u16>` spent a 300-byte B-tree node on a replica's one to three ports
/// plus a copy of each name, and a boxed slice of `(shared name, port)` still 48 bytes in
/// an allocation of its own per replica: most of the table's memory per endpoint (issue
/// 14's goal: at most 500 bytes). A map with more ports keeps the rest in its own shape.
#[derive(Clone, Default)]
pub struct PortMap {
    /// `None`: no ports.
    shape: Option<Arc<PortShape>>,
    /// The first [`INLINE_PORTS`] ports, in name order (unused slots 0).
    inline: [u16; INLINE_PORTS],
}

/// How many ports a [`PortMap`] holds without an allocation of its own.
const INLINE_PORTS: usize = 4;

/// The names of a [`PortMap`], in order, and its ports past the inline ones.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PortShape {
    names: Box<[Arc<str>]>,
    /// Empty unless there are more than [`INLINE_PORTS`] names (then the shape is the
    /// map's own, not shared).
    more: Box<[u16]>,
}

/// The [`PortShape`]s of a table, one per set of names, so replicas share them.
#[derive(Debug, Default)]
pub(crate) struct PortShapes {
    /// Port names, one copy each (a cluster uses a handful).
    names: std::collections::BTreeSet<Arc<str>>,
    shapes: BTreeMap<Vec<Arc<str>>, Arc<PortShape>>,
    /// The shape the last shared map got. Maps come in runs of one service's replicas
    /// (a placement pass, a tick of starts), mostly of one shape: comparing the names
    /// with it first spares interning each name and looking the shape up in `shapes`
    /// (string compares in two trees and a vector per map: the string compares under
    /// `Table::replica_of` were a fifth of indexing a placed job in the sim host's
    /// profile, and this took about half of them away).
    last: Option<Arc<PortShape>>,
}

impl PortShapes {
    /// The port map of `ports` (in any order; of two with one name, the last wins), its
    /// shape shared with every other map of the same names.
    pub(crate) fn map<N: AsRef<str>>(
        &mut self,
        ports: impl IntoIterator<Item = (N, u16)>,
    ) -> PortMap {
        let ports = sorted(ports.into_iter());
        if let Some(last) = &self.last {
            let same = last.names.len() == ports.len()
                && (last.names.iter().zip(&ports)).all(|(a, (b, _))| **a == *b.as_ref());
            if same {
                return PortMap::with_shape(last.clone(), ports.iter().map(|(_, p)| *p));
            }
        }
        let ports: Vec<(Arc<str>, u16)> = ports
            .into_iter()
            .map(|(name, port)| {
                let name = match self.names.get(name.as_ref()) {
                    Some(shared) => shared.clone(),
                    None => {
                        let name: Arc<str> = name.as_ref().into();
                        self.names.insert(name.clone());
                        name
                    }
                };
                (name, port)
            })
            .collect();
        if ports.len() > INLINE_PORTS {
            return PortMap::own(ports);
        }
        let names: Vec<Arc<str>> = ports.iter().map(|(n, _)| n.clone()).collect();
        let shape = match self.shapes.get(names.as_slice()) {
            Some(shape) => shape.clone(),
            None if names.is_empty() => return PortMap::default(),
            None => {
                let shape = Arc::new(PortShape {
                    names: names.clone().into_boxed_slice(),
                    more: Box::default(),
                });
                self.shapes.insert(names, shape.clone());
                shape
            }
        };
        self.last = Some(shape.clone());
        PortMap::with_shape(shape, ports.iter().map(|(_, p)| *p))
    }
}

/// `(name, port)` pairs in name order; of two with one name, the last kept (as a map
/// insert would).
fn sorted<N: AsRef<str>>(ports: impl Iterator<Item = (N, u16)>) -> Vec<(N, u16)> {
    let mut ports: Vec<(N, u16)> = ports.collect();
    // Stable: equal names keep their order, so the last one is kept below.
    ports.sort_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
    ports.reverse();
    ports.dedup_by(|a, b| a.0.as_ref() == b.0.as_ref());
    ports.reverse();
    ports
}

impl PortMap {
    /// A map over `shape`'s names with these ports (as many, in name order), the first
    /// [`INLINE_PORTS`] inline.
    fn with_shape(shape: Arc<PortShape>, ports: impl Iterator<Item = u16>) -> Self {
        let mut inline = [0; INLINE_PORTS];
        for (slot, port) in inline.iter_mut().zip(ports) {
            *slot = port;
        }
        Self {
            shape: Some(shape),
            inline,
        }
    }

    /// A map with a shape of its own (not shared), from sorted, distinct names.
    fn own(ports: Vec<(Arc<str>, u16)>) -> Self {
        if ports.is_empty() {
            return Self::default();
        }
        let more = ports.iter().skip(INLINE_PORTS).map(|(_, p)| *p).collect();
        let names = ports.iter().map(|(n, _)| n.clone()).collect();
        let shape = Arc::new(PortShape { names, more });
        Self::with_shape(shape, ports.into_iter().map(|(_, p)| p))
    }

    fn names(&self) -> &[Arc<str>] {
        self.shape.as_deref().map_or(&[], |s| &s.names)
    }

    /// The `i`-th port, in name order (`i` < [`len`](Self::len)).
    fn port(&self, i: usize) -> &u16 {
        match self.inline.get(i) {
            Some(port) => port,
            None => &self.shape.as_deref().expect("a map with ports").more[i - INLINE_PORTS],
        }
    }

    /// The port named `name`.
    pub fn get(&self, name: &str) -> Option<&u16> {
        let i = self.names().binary_search_by(|n| (**n).cmp(name)).ok()?;
        Some(self.port(i))
    }

    /// Whether a port named `name` is granted.
    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The names, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.names().iter().map(|n| &**n)
    }

    /// The ports, in name order.
    pub fn values(&self) -> impl Iterator<Item = &u16> {
        (0..self.len()).map(|i| self.port(i))
    }

    /// `(name, port)`, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &u16)> {
        self.keys().zip(self.values())
    }

    /// How many ports.
    pub fn len(&self) -> usize {
        self.names().len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.names().is_empty()
    }
}

impl PartialEq for PortMap {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}
impl Eq for PortMap {}

impl std::hash::Hash for PortMap {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_usize(self.len());
        for (name, port) in self.iter() {
            name.hash(state);
            port.hash(state);
        }
    }
}

/// From `(name, port)` pairs in any order; of two with one name, the last wins (as a map
/// insert would). The shape is the map's own; the table shares shapes (`PortShapes`).
impl<N: Into<Arc<str>>> FromIterator<(N, u16)> for PortMap {
    fn from_iter<I: IntoIterator<Item = (N, u16)>>(iter: I) -> Self {
        Self::own(sorted(iter.into_iter().map(|(n, p)| (n.into(), p))))
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

    /// The table holds one `Replica` per live job in its entry's list: its size is most of
    /// the table's memory per endpoint (see the README's breakdown).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_replica_is_80_bytes() {
        assert_eq!(std::mem::size_of::<Replica>(), 80);
    }

    #[test]
    fn a_port_map_is_small_and_shares_its_names() {
        assert_eq!(std::mem::size_of::<PortMap>(), 16);
        let mut shapes = PortShapes::default();
        let a = shapes.map([("metrics".to_owned(), 2), ("http".to_owned(), 1)]);
        let b = shapes.map([("http".to_owned(), 3), ("metrics".to_owned(), 4)]);
        let (sa, sb) = (a.shape.as_ref().unwrap(), b.shape.as_ref().unwrap());
        assert!(Arc::ptr_eq(sa, sb), "one shape for one set of names");
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            [("http", &1), ("metrics", &2)]
        );
        assert_ne!(a, b);
        assert_eq!(b, [("metrics", 4), ("http", 3)].into_iter().collect());
        assert!(shapes.map::<&str>([]).is_empty());
        // Another shape in between (the last shape is remembered): each set of names
        // still gets its one shape, and a map never takes the shape of other names.
        let c = shapes.map([("grpc", 5)]);
        let d = shapes.map([("http", 6), ("metrics", 7)]);
        let e = shapes.map([("grpc", 8), ("http", 9)]);
        assert!(Arc::ptr_eq(sa, d.shape.as_ref().unwrap()));
        assert!(!Arc::ptr_eq(c.shape.as_ref().unwrap(), sa));
        assert_eq!(e.iter().collect::<Vec<_>>(), [("grpc", &8), ("http", &9)]);
        assert_eq!(c.iter().collect::<Vec<_>>(), [("grpc", &5)]);
    }

    proptest::proptest! {
        /// Whichever way it is built (shared shapes or its own), with or past the inline
        /// ports, a port map answers as the `BTreeMap` it replaced (the last of two ports
        /// with one name wins) and serializes the same.
        #[test]
        fn a_port_map_is_the_map_it_replaced(
            ports in proptest::collection::vec((0..7usize, proptest::num::u16::ANY), 0..10),
        ) {
            const NAMES: [&str; 7] = ["a", "b", "c", "d", "e", "f", "http"];
            let pairs = || ports.iter().map(|&(n, p)| (NAMES[n].to_owned(), p));
            let map: BTreeMap<String, u16> = pairs().collect();
            let mut shapes = PortShapes::default();
            // Twice from one table: the second shares the first's shape.
            let shared = [shapes.map(pairs()), shapes.map(pairs())];
            for built in shared.into_iter().chain([pairs().collect::<PortMap>()]) {
                proptest::prop_assert!(built.iter().eq(map.iter().map(|(n, p)| (n.as_str(), p))));
                proptest::prop_assert_eq!(built.len(), map.len());
                for name in NAMES {
                    proptest::prop_assert_eq!(built.get(name), map.get(name));
                }
                proptest::prop_assert_eq!(
                    serde_json::to_string(&built).unwrap(),
                    serde_json::to_string(&map).unwrap()
                );
                proptest::prop_assert_eq!(&built, &PortMap::from(map.clone()));
            }
        }
    }

    #[test]
    fn a_port_map_past_the_inline_ports_keeps_them_all() {
        let names = ["a", "b", "c", "d", "e", "f"];
        let pairs = || names.iter().zip(1..).map(|(n, p)| (n.to_string(), p));
        let mut shapes = PortShapes::default();
        for map in [shapes.map(pairs()), pairs().collect::<PortMap>()] {
            assert_eq!(map.len(), 6);
            assert_eq!(
                map.values().copied().collect::<Vec<_>>(),
                [1, 2, 3, 4, 5, 6]
            );
            assert_eq!(
                (map.get("a"), map.get("f"), map.get("g")),
                (Some(&1), Some(&6), None)
            );
            let json = serde_json::to_string(&map).unwrap();
            assert_eq!(serde_json::from_str::<PortMap>(&json).unwrap(), map);
        }
    }
}
