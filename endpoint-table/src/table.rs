//! The pure core: the endpoint table, fed by the controller's events, producing one
//! [`Change`] per service whose entry really changed.

use crate::entry::{DeclaredPort, Entry, PortShapes, Replica};
use plugin_api::{ClusterEvent, ClusterSnapshot, HostInfo, JobInfo, ServiceInfo, ServiceKey};
use port_resource::grant::{PortGrantRef, Protocol};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

/// One change of the table, as it travels from the controller side to the apiserver side.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "change")]
pub enum Change {
    /// The service's entry is now this one (new, or changed with a higher index).
    Upsert {
        /// The whole new entry.
        entry: Arc<Entry>,
    },
    /// The service is gone from the table. Only that project's service of that name: a
    /// service of the same name in another project is another service.
    Removed {
        /// Its name.
        service: String,
        /// Its project.
        project: String,
        /// The cluster revision of the removal (of the resync that found it gone).
        #[serde(default)]
        index: u64,
    },
}

impl Change {
    /// The service the change is about.
    pub fn key(&self) -> ServiceKey {
        match self {
            Change::Upsert { entry } => entry.key(),
            Change::Removed {
                service, project, ..
            } => ServiceKey::new(project, service),
        }
    }

    /// The cluster revision of the change: the entry's index, or the removal's revision.
    pub fn index(&self) -> u64 {
        match self {
            Change::Upsert { entry } => entry.index,
            Change::Removed { index, .. } => *index,
        }
    }
}

/// What the table keeps of a service, known or not: a job may name a service the table
/// does not know (yet, or any more), and its replica waits here until the service exists.
#[derive(Debug)]
struct Svc {
    /// Its key, shared with its jobs' records.
    key: Arc<ServiceKey>,
    /// Whether the service exists, so its entry is served.
    known: bool,
    /// The entry, patched in place by each event (copied first if it was published and is
    /// still shared: an entry is immutable once published). While the service is unknown
    /// only its replicas mean anything.
    entry: Arc<Entry>,
}

/// What the table keeps of a live job besides its replica in the entry: where to find it
/// (the key shared, not copied: this is per endpoint; the host is the replica's own).
#[derive(Debug, Clone)]
struct JobRec {
    service: Arc<ServiceKey>,
    replica: u32,
}

/// What a batch of events did to one service.
#[derive(Debug)]
struct Touch {
    /// The revision of the last event of the batch that touched it.
    rev: u64,
    /// Whether its entry's content changed (an index alone is not content).
    changed: bool,
    /// Whether it was served when the batch began, and with which index.
    was_known: bool,
    start_index: u64,
    /// The revision of its (last) removal in the batch.
    removed_at: u64,
}

/// The services a batch touched, by key.
#[derive(Debug, Default)]
struct Touches(BTreeMap<ServiceKey, Touch>);

impl Touches {
    /// Notes that the event at `rev` touched `key`; the first touch of the batch records
    /// the state the service was in before it.
    fn touch(&mut self, services: &BTreeMap<ServiceKey, Svc>, key: &ServiceKey, rev: u64) {
        if let Some(t) = self.0.get_mut(key) {
            t.rev = rev;
            return;
        }
        let svc = services.get(key);
        let touch = Touch {
            rev,
            changed: false,
            was_known: svc.is_some_and(|s| s.known),
            start_index: svc.map_or(0, |s| s.entry.index),
            removed_at: 0,
        };
        self.0.insert(key.clone(), touch);
    }

    /// Notes that `key`'s content changed (it must have been touched).
    fn changed(&mut self, key: &ServiceKey) {
        if let Some(t) = self.0.get_mut(key) {
            t.changed = true;
        }
    }
}

/// The endpoint table: services, their live jobs, host addresses, and the entries derived
/// from them. Synchronous and deterministic; the controller side owns one.
///
/// A service is identified by its [`ServiceKey`] (project, name): two projects may each
/// have a service of the same name, and they are two services with two entries. A job
/// belongs to [`JobInfo::service_key`].
///
/// Invariants: an entry exists exactly for every known service; its replicas are ordered
/// by replica index, then job id; its index is at least 1, never lowered (resyncs
/// included), and is the revision of the last event that touched the service (its
/// profile, one of its jobs, a host with one of its jobs): exactly the revision the
/// controller stores with the service. So every table that follows the same history — the
/// controller's, a separate apiserver's that resynced from the store midway, the next
/// leader's — serves the same index for the same entry. An event that touches a service
/// without changing what its entry says (rare: a host state change, a job field the entry
/// does not show) still raises the index; a steady cluster sends no events.
///
/// An event costs O(log) lookups plus, when it changes a published entry, one copy of that
/// entry (the published one stays immutable for its readers); [`apply_batch`] copies each
/// touched entry once per batch, so placing a service of n replicas in one batch is O(n),
/// not O(n²).
///
/// [`apply_batch`]: Table::apply_batch
#[derive(Debug, Default)]
pub struct Table {
    services: BTreeMap<ServiceKey, Svc>,
    // The hash maps hash with FxHash, not SipHash: their keys (job and host ids) come from
    // the controller, not from clients, and hashing (and rehashing as they grow) the ids
    // of every placed job was a large part of announcing a placement.
    /// Keyed by the job id its replica holds (shared, not copied: this is per endpoint).
    /// Hashed, not ordered: nothing walks it in order, and every event about a job looks
    /// its id up (in a tree, a dozen string compares each).
    jobs: HashMap<Arc<str>, JobRec>,
    /// The live jobs on each host. Hashed, not ordered: only a host event walks a host's
    /// jobs, and what it does to each (touch its service, patch its address) does not
    /// depend on the order; as trees, the string compares of indexing every placed job
    /// were the largest cost of announcing a placement (the sim host's profile).
    by_host: HashMap<Arc<str>, HashSet<Arc<str>>>,
    hosts: HashMap<String, Option<IpAddr>>,
    /// Host ids, shared by the replicas and the per-host index.
    host_ids: HashSet<Arc<str>>,
    /// Port names and shapes, shared by the replicas' [`PortMap`](crate::PortMap)s (a
    /// cluster uses a handful).
    port_shapes: PortShapes,
}

// === impl Table ===

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The entry of service `key`, if the table knows the service.
    pub fn entry(&self, key: &ServiceKey) -> Option<&Arc<Entry>> {
        self.services.get(key).filter(|s| s.known).map(|s| &s.entry)
    }

    /// Every entry, by project, then service name.
    pub fn entries(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.services.values().filter(|s| s.known).map(|s| &s.entry)
    }

    /// Applies one controller event; returns the changes it caused (at most one per service).
    pub fn apply(&mut self, event: &ClusterEvent) -> Vec<Change> {
        self.apply_batch(std::slice::from_ref(event))
    }

    /// Applies controller events in order; returns the changes they caused together, at
    /// most one per service (its entry after the last of them, indexed by the revision of
    /// the last event that touched it; exactly what applying them one by one leaves in the
    /// table, without the intermediate entries).
    pub fn apply_batch(&mut self, events: &[ClusterEvent]) -> Vec<Change> {
        let mut touches = Touches::default();
        for event in events {
            self.apply_one(event, &mut touches);
        }
        self.publish(touches)
    }

    fn apply_one(&mut self, event: &ClusterEvent, t: &mut Touches) {
        let rev = event.rev();
        match event {
            ClusterEvent::Service { service, .. } => self.put_service(service, rev, t),
            ClusterEvent::ServiceRemoved { name, project, .. } => {
                let key = ServiceKey::new(project, name);
                if !self.services.get(&key).is_some_and(|s| s.known) {
                    return;
                }
                t.touch(&self.services, &key, rev);
                let svc = self.services.get_mut(&key).expect("known");
                svc.known = false;
                if svc.entry.replicas.is_empty() {
                    self.services.remove(&key);
                }
                t.changed(&key);
                if let Some(touch) = t.0.get_mut(&key) {
                    touch.removed_at = rev;
                }
            }
            ClusterEvent::Job { job, .. } => {
                // The key is built once per event and moved into the table if the service
                // is new (built three times, its two strings were a tenth of indexing a
                // placed job). Touched first: a touch records the state before the event.
                let key = job.service_key();
                t.touch(&self.services, &key, rev);
                if job.state.is_ended() {
                    self.remove_job(&job.job, rev, t);
                } else {
                    self.put_job(job, key, rev, t);
                }
            }
            ClusterEvent::JobEnded { job, .. } => {
                self.remove_job(&job.job, rev, t);
                t.touch(&self.services, &job.service_key(), rev);
            }
            ClusterEvent::Host { host, services, .. } => {
                for key in services {
                    t.touch(&self.services, key, rev);
                }
                self.put_host(host, rev, t);
            }
        }
    }

    /// The changes of a batch, from what it touched; raises the touched entries' indexes.
    fn publish(&mut self, touches: Touches) -> Vec<Change> {
        let mut changes = Vec::new();
        for (key, t) in touches.0 {
            match self.services.get_mut(&key) {
                Some(svc) if svc.known => {
                    // Nothing new: a repeated event.
                    if t.was_known && !t.changed && t.rev <= t.start_index {
                        continue;
                    }
                    // Raised to the revision, never lowered: revisions only grow, but a
                    // source that repeats one must still not make two different entries
                    // share an index.
                    let index = if t.was_known {
                        t.rev.max(t.start_index + 1)
                    } else {
                        t.rev.max(1)
                    };
                    if svc.entry.index != index {
                        entry_mut(&mut svc.entry).index = index;
                    }
                    // Patched during the batch, so not shared: give back what inserting
                    // replicas over-allocated (a placement grows the list by doubling).
                    if let Some(entry) = Arc::get_mut(&mut svc.entry) {
                        entry.replicas.shrink_to_fit();
                    }
                    changes.push(Change::Upsert {
                        entry: svc.entry.clone(),
                    });
                }
                _ if t.was_known => changes.push(Change::Removed {
                    service: key.name,
                    project: key.project,
                    index: t.removed_at,
                }),
                _ => {}
            }
        }
        changes
    }

    /// Replaces everything with `snapshot`; returns the changes against what the table held
    /// before (none for a service whose entry is the same).
    pub fn resync(&mut self, snapshot: &ClusterSnapshot) -> Vec<Change> {
        let old = std::mem::take(&mut self.services);
        self.jobs.clear();
        self.by_host.clear();
        self.hosts.clear();
        for host in &snapshot.hosts {
            self.hosts.insert(host.id.clone(), host.facts.ip_addr);
        }
        let built = self.build_entries(snapshot);
        let mut changes = removals(&old, &built, snapshot.rev);
        let revs: BTreeMap<ServiceKey, u64> =
            snapshot.services.iter().map(|s| (s.key(), s.rev)).collect();
        for (key, Built { known, mut entry }) in built {
            entry.replicas.sort_by(order);
            // Built by pushing: without the growth slack, kept as long as the entry.
            entry.replicas.shrink_to_fit();
            let old = old.get(&key).filter(|s| s.known).map(|s| &s.entry);
            let entry = if known {
                resynced_entry(entry, old, revs[&key])
            } else {
                Arc::new(entry)
            };
            let key = Arc::new(key);
            let svc = Svc {
                key: key.clone(),
                known,
                entry,
            };
            self.services.insert(ServiceKey::clone(&key), svc);
        }
        self.index_all_jobs();
        // In snapshot order, as the services were listed.
        for service in &snapshot.services {
            let entry = &self.services[&service.key()].entry;
            let old = old.get(&service.key()).filter(|s| s.known);
            if !old.is_some_and(|o| Arc::ptr_eq(&o.entry, entry)) {
                changes.push(Change::Upsert {
                    entry: entry.clone(),
                });
            }
        }
        changes
    }

    /// Every service's entry built from scratch as an owned one (to be compared with the
    /// table's old ones): the snapshot's services, and the services its live jobs name.
    fn build_entries(&mut self, snapshot: &ClusterSnapshot) -> BTreeMap<ServiceKey, Built> {
        let mut built = BTreeMap::new();
        for service in &snapshot.services {
            let mut entry = empty_entry(&service.key());
            entry.ports = declared_ports(service);
            entry.meta = meta_labels(service);
            built.insert(service.key(), Built { known: true, entry });
        }
        // The same job twice: the later one wins.
        let live: BTreeMap<&str, &JobInfo> = snapshot
            .jobs
            .iter()
            .filter(|j| !j.state.is_ended())
            .map(|j| (j.job.as_str(), j))
            .collect();
        for job in live.values() {
            let key = job.service_key();
            let replica = self.replica_of(job);
            built
                .entry(key.clone())
                .or_insert_with(|| Built {
                    known: false,
                    entry: empty_entry(&key),
                })
                .entry
                .replicas
                .push(replica);
        }
        built
    }

    /// Indexes the job of every replica in the table (by id and by host).
    fn index_all_jobs(&mut self) {
        let mut records = Vec::new();
        for svc in self.services.values() {
            for r in &svc.entry.replicas {
                records.push((r.job.clone(), r.replica, r.host.clone(), svc.key.clone()));
            }
        }
        for (id, replica, host, key) in records {
            self.index_job(id, replica, host, key);
        }
    }

    fn put_service(&mut self, service: &ServiceInfo, rev: u64, t: &mut Touches) {
        let key = service.key();
        t.touch(&self.services, &key, rev);
        let ports = declared_ports(service);
        let meta = meta_labels(service);
        let svc = self
            .services
            .entry(key.clone())
            .or_insert_with(|| new_svc(&key));
        if svc.known && svc.entry.ports == ports && svc.entry.meta == meta {
            return;
        }
        svc.known = true;
        let entry = entry_mut(&mut svc.entry);
        entry.ports = ports;
        entry.meta = meta;
        t.changed(&key);
    }

    /// A new address for `host`: every replica on it gets it, and its services are touched.
    fn put_host(&mut self, host: &HostInfo, rev: u64, t: &mut Touches) {
        let address = host.facts.ip_addr;
        let moved = self.hosts.insert(host.id.clone(), address) != Some(address);
        let Some(jobs) = self.by_host.get(host.id.as_str()) else {
            return;
        };
        for job in jobs {
            let rec = &self.jobs[job];
            t.touch(&self.services, &rec.service, rev);
            if !moved {
                continue;
            }
            let svc = self
                .services
                .get_mut(&rec.service)
                .expect("a job's service");
            let Some(pos) = position(&svc.entry, rec.replica, job) else {
                continue;
            };
            if svc.entry.replicas[pos].address != address {
                entry_mut(&mut svc.entry).replicas[pos].address = address;
                t.changed(&rec.service);
            }
        }
    }

    /// The replica `job` is, as its entry shows it (its job id the one the table holds
    /// already, if it does; its host id the shared one).
    fn replica_of(&mut self, job: &JobInfo) -> Replica {
        let ports = self.port_shapes.map(granted_ports(job));
        let id = match self.jobs.get_key_value(job.job.as_str()) {
            Some((id, _)) => id.clone(),
            None => job.job.as_str().into(),
        };
        Replica {
            replica: job.replica,
            job: id,
            host: intern(&mut self.host_ids, &job.host),
            address: self.hosts.get(&job.host).copied().flatten(),
            ports,
            generation: job.generation,
            state: job.state,
            ready: job.ready,
        }
    }

    fn index_job(&mut self, id: Arc<str>, replica: u32, host: Arc<str>, service: Arc<ServiceKey>) {
        self.by_host
            .entry(host.clone())
            .or_default()
            .insert(id.clone());
        let rec = JobRec { service, replica };
        self.jobs.insert(id, rec);
    }

    /// A live job, new or changed: patches its replica in its service's entry.
    fn put_job(&mut self, job: &JobInfo, key: ServiceKey, rev: u64, t: &mut Touches) {
        let replica = self.replica_of(job);
        match self.jobs.get(job.job.as_str()) {
            // The same slot: replaced in place, if it says anything new.
            Some(old) if *old.service == key && old.replica == job.replica => {
                t.touch(&self.services, &key, rev);
                let svc = self.services.get_mut(&key).expect("a job's service");
                let pos = position(&svc.entry, job.replica, &job.job).expect("a job's replica");
                let current = &svc.entry.replicas[pos];
                if *current == replica {
                    return;
                }
                let old_host = current.host.clone();
                let moved = (old_host != replica.host).then(|| {
                    let r = &replica;
                    (r.job.clone(), r.replica, r.host.clone(), svc.key.clone())
                });
                entry_mut(&mut svc.entry).replicas[pos] = replica;
                t.changed(&key);
                if let Some((id, replica, host, key)) = moved {
                    remove_from(&mut self.by_host, &old_host, &job.job);
                    self.index_job(id, replica, host, key);
                }
            }
            // Moved to another service or replica index (not what a controller does, but
            // the table must follow any history): out of the old slot, into the new one.
            Some(_) => {
                self.remove_job(&job.job, rev, t);
                self.insert_job(key, replica, rev, t);
            }
            None => self.insert_job(key, replica, rev, t),
        }
    }

    fn insert_job(&mut self, key: ServiceKey, replica: Replica, rev: u64, t: &mut Touches) {
        t.touch(&self.services, &key, rev);
        let svc = self.services.entry(key).or_insert_with_key(new_svc);
        let key = svc.key.clone();
        let record = (
            replica.job.clone(),
            replica.replica,
            replica.host.clone(),
            svc.key.clone(),
        );
        let entry = entry_mut(&mut svc.entry);
        match entry.replicas.binary_search_by(|r| order(r, &replica)) {
            Ok(pos) => entry.replicas[pos] = replica,
            Err(pos) => entry.replicas.insert(pos, replica),
        }
        let (id, replica, host, service) = record;
        self.index_job(id, replica, host, service);
        t.changed(&key);
    }

    fn remove_job(&mut self, job: &str, rev: u64, t: &mut Touches) {
        let Some(rec) = self.jobs.remove(job) else {
            return;
        };
        t.touch(&self.services, &rec.service, rev);
        let svc = self
            .services
            .get_mut(&*rec.service)
            .expect("a job's service");
        // A live job's replica is always in its service's entry.
        if let Some(pos) = position(&svc.entry, rec.replica, job) {
            let gone = entry_mut(&mut svc.entry).replicas.remove(pos);
            remove_from(&mut self.by_host, &gone.host, job);
            t.changed(&rec.service);
        }
        if !svc.known && svc.entry.replicas.is_empty() {
            self.services.remove(&*rec.service);
        }
    }
}

/// The shared copy of `name`.
fn intern(names: &mut HashSet<Arc<str>>, name: &str) -> Arc<str> {
    if let Some(shared) = names.get(name) {
        return shared.clone();
    }
    let name: Arc<str> = name.into();
    names.insert(name.clone());
    name
}

/// A service's entry as a resync builds it.
#[derive(Debug)]
struct Built {
    /// Whether the snapshot lists the service (else only its jobs name it).
    known: bool,
    entry: Entry,
}

/// The removals a resync finds: services the table served that the snapshot (at `rev`)
/// does not list.
fn removals(
    old: &BTreeMap<ServiceKey, Svc>,
    built: &BTreeMap<ServiceKey, Built>,
    rev: u64,
) -> Vec<Change> {
    old.iter()
        .filter(|(k, s)| s.known && !built.get(*k).is_some_and(|b| b.known))
        .map(|(key, _)| Change::Removed {
            service: key.name.clone(),
            project: key.project.clone(),
            index: rev,
        })
        .collect()
}

/// The entry a resync serves for a listed service at revision `rev`: the `old` one when
/// nothing is new (so no change is published), else the built one, its index raised past
/// the old one's (an index is never lowered).
fn resynced_entry(mut entry: Entry, old: Option<&Arc<Entry>>, rev: u64) -> Arc<Entry> {
    match old {
        Some(old) if old.same_content(&entry) && rev <= old.index => old.clone(),
        old => {
            entry.index = old.map_or(rev.max(1), |o| rev.max(o.index + 1));
            Arc::new(entry)
        }
    }
}

/// A service the table has not seen yet: unknown, no replicas.
fn new_svc(key: &ServiceKey) -> Svc {
    Svc {
        key: Arc::new(key.clone()),
        known: false,
        entry: Arc::new(empty_entry(key)),
    }
}

/// An entry to patch: copied if it is shared (published: readers keep the old one), its
/// cached rendering dropped (the content is about to change).
fn entry_mut(entry: &mut Arc<Entry>) -> &mut Entry {
    let entry = Arc::make_mut(entry);
    entry.rendered = Default::default();
    entry
}

/// The order of an entry's replicas: by replica index, then job id.
fn order(a: &Replica, b: &Replica) -> std::cmp::Ordering {
    (a.replica, &a.job).cmp(&(b.replica, &b.job))
}

/// Where replica `replica` of job `job` is in `entry`.
fn position(entry: &Entry, replica: u32, job: &str) -> Option<usize> {
    entry
        .replicas
        .binary_search_by(|r| (r.replica, &*r.job).cmp(&(replica, job)))
        .ok()
}

/// A service's entry with nothing in it yet, index 0.
fn empty_entry(key: &ServiceKey) -> Entry {
    Entry {
        service: key.name.clone(),
        project: key.project.clone(),
        index: 0,
        ports: Vec::new(),
        meta: BTreeMap::new(),
        replicas: Vec::new(),
        rendered: Default::default(),
    }
}

fn remove_from(index: &mut HashMap<Arc<str>, HashSet<Arc<str>>>, key: &str, job: &str) {
    if let Some(set) = index.get_mut(key) {
        set.remove(job);
        if set.is_empty() {
            index.remove(key);
        }
    }
}

/// The declared ports of a service: the array at `profile["ports"]`, validated by the
/// port plugin before the service was accepted; anything unreadable is skipped.
fn declared_ports(service: &ServiceInfo) -> Vec<DeclaredPort> {
    let Some(ports) = service
        .profile
        .get(port_resource::PLUGIN_NAME)
        .and_then(|p| p.as_array())
    else {
        return Vec::new();
    };
    ports
        .iter()
        .filter_map(|p| {
            let name = p.get("name")?.as_str()?.to_owned();
            let protocol = match p.get("protocol").and_then(|p| p.as_str()) {
                Some("udp") => Protocol::Udp,
                _ => Protocol::Tcp,
            };
            Some(DeclaredPort { name, protocol })
        })
        .collect()
}

/// The `[service.meta]` labels of a service: the table at `profile["meta"]`, validated by
/// the host before the service was accepted; a value that is not a string is skipped.
fn meta_labels(service: &ServiceInfo) -> BTreeMap<String, String> {
    let Some(meta) = service.profile.get("meta").and_then(|m| m.as_object()) else {
        return BTreeMap::new();
    };
    meta.iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

/// The ports granted to a job by the port plugin, names borrowed from its grant.
fn granted_ports(job: &JobInfo) -> Vec<(Cow<'_, str>, u16)> {
    let Some(grant) = job.grants.get(port_resource::PLUGIN_NAME) else {
        return Vec::new();
    };
    match PortGrantRef::from_grant(grant) {
        Ok(grant) => grant.ports.into_iter().map(|p| (p.name, p.port)).collect(),
        Err(error) => {
            tracing::warn!(job = %job.job, service = %job.service_key(), %error, "ignoring port grant");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests;
