//! The pure core: the endpoint table, fed by the controller's events, producing one
//! [`Change`] per service whose entry really changed.

use crate::entry::{DeclaredPort, Entry, Replica};
use plugin_api::{
    ClusterEvent, ClusterSnapshot, HostInfo, JobInfo, JobState, ServiceInfo, ServiceKey,
};
use port_resource::grant::{PortGrant, Protocol};
use std::collections::{BTreeMap, BTreeSet};
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

/// What the table keeps of a service.
#[derive(Debug, Clone)]
struct ServiceRec {
    ports: Vec<DeclaredPort>,
    meta: BTreeMap<String, String>,
}

/// What the table keeps of a live job.
#[derive(Debug, Clone)]
struct JobRec {
    service: ServiceKey,
    replica: u32,
    host: String,
    state: JobState,
    ready: bool,
    generation: u64,
    ports: BTreeMap<String, u16>,
}

/// The endpoint table: services, their live jobs, host addresses, and the entries derived
/// from them. Synchronous and deterministic; the controller side owns one.
///
/// A service is identified by its [`ServiceKey`] (project, name): two projects may each
/// have a service of the same name, and they are two services with two entries. A job
/// belongs to [`JobInfo::service_key`].
///
/// Invariants: an entry exists exactly for every known service; its index is at least 1,
/// never lowered (resyncs included), and is the revision of the last event that touched
/// the service (its profile, one of its jobs, a host with one of its jobs): exactly the
/// revision the controller stores with the service. So every table that follows the same
/// history — the controller's, a separate apiserver's that resynced from the store midway,
/// the next leader's — serves the same index for the same entry. An event that touches a
/// service without changing what its entry says (rare: a host state change, a job field
/// the entry does not show) still raises the index; a steady cluster sends no events.
#[derive(Debug, Default)]
pub struct Table {
    services: BTreeMap<ServiceKey, ServiceRec>,
    jobs: BTreeMap<String, JobRec>,
    by_service: BTreeMap<ServiceKey, BTreeSet<String>>,
    by_host: BTreeMap<String, BTreeSet<String>>,
    hosts: BTreeMap<String, Option<IpAddr>>,
    entries: BTreeMap<ServiceKey, Arc<Entry>>,
}

// === impl Table ===

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The entry of service `key`, if the table knows the service.
    pub fn entry(&self, key: &ServiceKey) -> Option<&Arc<Entry>> {
        self.entries.get(key)
    }

    /// Every entry, by project, then service name.
    pub fn entries(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.entries.values()
    }

    /// Applies one controller event; returns the changes it caused (at most one per service).
    pub fn apply(&mut self, event: &ClusterEvent) -> Vec<Change> {
        let rev = event.rev();
        let mut touched = BTreeSet::new();
        let mut changes = Vec::new();
        match event {
            ClusterEvent::Service { service, .. } => {
                self.put_service(service);
                touched.insert(service.key());
            }
            ClusterEvent::ServiceRemoved { name, project, .. } => {
                let key = ServiceKey::new(project, name);
                self.services.remove(&key);
                if self.entries.remove(&key).is_some() {
                    changes.push(Change::Removed {
                        service: key.name,
                        project: key.project,
                        index: rev,
                    });
                }
            }
            ClusterEvent::Job { job, .. } => {
                if let Some(old) = self.jobs.get(&job.job) {
                    touched.insert(old.service.clone());
                }
                if job.state.is_ended() {
                    self.remove_job(&job.job);
                } else {
                    self.put_job(job);
                }
                touched.insert(job.service_key());
            }
            ClusterEvent::JobEnded { job, .. } => {
                if let Some(old) = self.remove_job(&job.job) {
                    touched.insert(old.service);
                }
                touched.insert(job.service_key());
            }
            ClusterEvent::Host { host, services, .. } => {
                self.put_host(host);
                touched.extend(services.iter().cloned());
                if let Some(jobs) = self.by_host.get(&host.id) {
                    touched.extend(jobs.iter().map(|j| self.jobs[j].service.clone()));
                }
            }
        }
        changes.extend(touched.iter().filter_map(|s| self.refresh(s, rev)));
        changes
    }

    /// Replaces everything with `snapshot`; returns the changes against what the table held
    /// before (none for a service whose entry is the same).
    pub fn resync(&mut self, snapshot: &ClusterSnapshot) -> Vec<Change> {
        self.services.clear();
        self.jobs.clear();
        self.by_service.clear();
        self.by_host.clear();
        self.hosts.clear();
        for host in &snapshot.hosts {
            self.put_host(host);
        }
        for service in &snapshot.services {
            self.put_service(service);
        }
        for job in snapshot.jobs.iter().filter(|j| !j.state.is_ended()) {
            self.put_job(job);
        }
        let gone: Vec<ServiceKey> = self
            .entries
            .keys()
            .filter(|k| !self.services.contains_key(*k))
            .cloned()
            .collect();
        let mut changes: Vec<Change> = gone
            .into_iter()
            .map(|key| {
                self.entries.remove(&key);
                Change::Removed {
                    service: key.name,
                    project: key.project,
                    index: snapshot.rev,
                }
            })
            .collect();
        for service in &snapshot.services {
            changes.extend(self.refresh(&service.key(), service.rev));
        }
        changes
    }

    /// Recomputes the entry of `service` after an event at revision `rev` touched it.
    fn refresh(&mut self, service: &ServiceKey, rev: u64) -> Option<Change> {
        let mut entry = self.compute(service)?;
        match self.entries.get(service) {
            // Nothing new: a resync of what the table holds, or a repeated event.
            Some(old) if old.same_content(&entry) && rev <= old.index => return None,
            // Raised to the revision, never lowered: revisions only grow, but a source
            // that repeats one must still not make two different entries share an index.
            Some(old) => entry.index = rev.max(old.index + 1),
            None => entry.index = rev.max(1),
        }
        let entry = Arc::new(entry);
        self.entries.insert(service.clone(), entry.clone());
        Some(Change::Upsert { entry })
    }

    /// The entry of `service` from scratch, index 0.
    fn compute(&self, service: &ServiceKey) -> Option<Entry> {
        let rec = self.services.get(service)?;
        let mut replicas: Vec<Replica> = self
            .by_service
            .get(service)
            .into_iter()
            .flatten()
            .map(|id| {
                let job = &self.jobs[id];
                Replica {
                    replica: job.replica,
                    job: id.clone(),
                    host: job.host.clone(),
                    address: self.hosts.get(&job.host).copied().flatten(),
                    ports: job.ports.clone(),
                    generation: job.generation,
                    state: job.state,
                    ready: job.ready,
                }
            })
            .collect();
        replicas.sort_by(|a, b| (a.replica, &a.job).cmp(&(b.replica, &b.job)));
        Some(Entry {
            service: service.name.clone(),
            project: service.project.clone(),
            index: 0,
            ports: rec.ports.clone(),
            meta: rec.meta.clone(),
            replicas,
            rendered: Default::default(),
        })
    }

    fn put_service(&mut self, service: &ServiceInfo) {
        let rec = ServiceRec {
            ports: declared_ports(service),
            meta: meta_labels(service),
        };
        self.services.insert(service.key(), rec);
    }

    fn put_host(&mut self, host: &HostInfo) {
        self.hosts.insert(host.id.clone(), host.facts.ip_addr);
    }

    fn put_job(&mut self, job: &JobInfo) {
        self.remove_job(&job.job);
        let rec = JobRec {
            service: job.service_key(),
            replica: job.replica,
            host: job.host.clone(),
            state: job.state,
            ready: job.ready,
            generation: job.generation,
            ports: granted_ports(job),
        };
        let by_service = self.by_service.entry(rec.service.clone()).or_default();
        by_service.insert(job.job.clone());
        let by_host = self.by_host.entry(rec.host.clone()).or_default();
        by_host.insert(job.job.clone());
        self.jobs.insert(job.job.clone(), rec);
    }

    fn remove_job(&mut self, job: &str) -> Option<JobRec> {
        let rec = self.jobs.remove(job)?;
        remove_from(&mut self.by_service, &rec.service, job);
        remove_from(&mut self.by_host, &rec.host, job);
        Some(rec)
    }
}

fn remove_from<K: Ord>(index: &mut BTreeMap<K, BTreeSet<String>>, key: &K, job: &str) {
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

/// The ports granted to a job by the port plugin, by name.
fn granted_ports(job: &JobInfo) -> BTreeMap<String, u16> {
    let Some(grant) = job.grants.get(port_resource::PLUGIN_NAME) else {
        return BTreeMap::new();
    };
    match PortGrant::from_value(grant) {
        Ok(grant) => grant.ports.into_iter().map(|p| (p.name, p.port)).collect(),
        Err(error) => {
            tracing::warn!(job = %job.job, service = %job.service_key(), %error, "ignoring port grant");
            BTreeMap::new()
        }
    }
}

#[cfg(test)]
mod tests;
