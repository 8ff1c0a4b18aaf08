//! The controller's persisted records, the in-memory cluster they load into, and the
//! transaction that changes both: a [`Txn`] collects new record values and the events
//! they cause, is committed to the store as one batch, and only then applied in memory.

pub mod events;
pub mod job_key;
pub mod job_rev;
pub mod maintenance;
pub mod rollout;
pub mod slots;

#[cfg(test)]
mod format_tests;
#[cfg(test)]
mod maintenance_tests;

use crate::job_key::JobKey;
use crate::job_rev::{StoredJob, StoredRev};
use crate::rollout::Rollout;
use crate::slots::SlotRec;
use plugin_api::{
    ClusterEvent, ClusterSnapshot, EndReason, HostId, HostInfo, JobId, JobInfo, JobState,
    ServiceInfo, ServiceKey,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use xce_store::{Batch, Key, Store, StoreError};

const NS_META: &str = "meta";
const NS_SERVICE: &str = "service";
const NS_JOB: &str = "job";
/// The namespace of the job records (`job/<id>`), which format 3's events refer to.
pub const JOB_NAMESPACE: &str = NS_JOB;
const NS_HOST: &str = "host";
/// `meta/events`: the events of the last committed batch, rewritten by every batch that
/// has any, in a store that others follow (etcd; see `Store::journals_events`). Nobody reads it back at start; a follower of the store's change history (a
/// separate apiserver watching etcd) reads every version of it, in order, to learn the
/// events without a controller to push them.
const EVENTS: &str = "events";
/// `meta/cluster_id`: the cluster's identity, created once with the store (see
/// [`Store::put_if_absent`]) and never changed; not part of any batch.
const CLUSTER_ID: &str = "cluster_id";
/// `meta/restored`: written by `xced store restore` with the restored records; while it
/// is there, the controller makes every worker register again (reporting what really
/// runs) before it trusts the restored jobs, and removes it once all have.
const RESTORED: &str = "restored";

/// `meta/format`: the format of the stored records and of the events record (see
/// [`FORMAT`]); absent in a store written before formats were numbered (format 1).
const FORMAT_KEY: &str = "format";

/// The format of the records and events this build writes. A release that changes what a
/// record or an event means (a new enum variant, a field whose absence means something
/// else) raises it by one and migrates older formats at load ([`Cluster::from_records`]
/// reads them, the controller writes them back in this format); a reader that finds a
/// newer format refuses the store rather than misread it.
///
/// - 1: the records before formats were numbered (no `meta/format`; service records may
///   be keyed by name alone, see [`Cluster::legacy_keys`]).
/// - 2: `meta/format` is written; services are keyed by `project/name`.
/// - 3: a job event in `meta/events` refers to the job's record written in the same batch
///   instead of repeating it ([`events`]); the records themselves are as in format 2.
///
/// A controller writes [`DEFAULT_STORE_FORMAT`] unless its `store_format` setting asks
/// for a newer one: readers of the previous release (apiservers, which are upgraded after
/// the controllers) read format 2 only, and a store never goes back to an older format.
pub const FORMAT: u64 = 3;

/// The format a controller writes unless told otherwise (see [`FORMAT`]): the newest one
/// the previous release reads, so that its apiservers keep following the store during an
/// upgrade.
pub const DEFAULT_STORE_FORMAT: u64 = 2;

/// The oldest format a controller may be told to write (`store_format`).
pub const OLDEST_WRITABLE_FORMAT: u64 = 2;

/// The format of a store without `meta/format`.
const UNNUMBERED_FORMAT: u64 = 1;

/// The key of the store format (see [`FORMAT`]).
pub fn format_key() -> Key {
    Key::new(NS_META, FORMAT_KEY)
}

/// The format a stored `meta/format` value names.
pub fn decode_format(bytes: &[u8]) -> Result<u64, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// The key of the cluster id (see `CLUSTER_ID`).
pub fn cluster_id_key() -> Key {
    Key::new(NS_META, CLUSTER_ID)
}

/// The key of the last batch's events (see `EVENTS`).
pub fn events_key() -> Key {
    Key::new(NS_META, EVENTS)
}

/// The key `xced store restore` writes last (see `RESTORED`): a follower of the store that
/// sees it written knows the records were replaced without events and reloads them all.
pub fn restored_key() -> Key {
    Key::new(NS_META, RESTORED)
}

/// The store key of a service: `project/name` (both `[a-z0-9-]`, so `/` separates).
fn service_key_str(k: &ServiceKey) -> String {
    format!("{}/{}", k.project, k.name)
}

/// A job id: `j-<n>`, or `j-<n>-<tag>` with a load's [`job_tag`].
pub fn job_id(n: u64, tag: &str) -> JobId {
    if tag.is_empty() {
        format!("j-{n}")
    } else {
        format!("j-{n}-{tag}")
    }
}

/// The number of a job id made by [`job_id`] (`None` for any other id).
pub fn job_number(id: &str) -> Option<u64> {
    let rest = id.strip_prefix("j-")?;
    rest.split_once('-').map_or(rest, |(n, _)| n).parse().ok()
}

/// Letters of a [`job_tag`]: digits and lower-case letters without `i`, `l`, `o`, `u`
/// (nothing to misread in a log line).
const TAG_ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";
/// Letters in a [`job_tag`]: 25 random bits. Two loads of one store copy (the only way
/// a number is counted twice) share a tag once in 33 million.
const TAG_LEN: usize = 5;

/// A fresh random tag for the job ids of one load of the store (see
/// [`Cluster::job_tag`]).
pub fn job_tag() -> String {
    let mut seed = [0u8; 8];
    let bits = match getrandom::fill(&mut seed) {
        Ok(()) => u64::from_le_bytes(seed),
        // Without entropy, the clock and the pid still tell two loads apart.
        Err(_) => {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ (u64::from(std::process::id()) << 32)
        }
    };
    (0..TAG_LEN)
        .map(|i| char::from(TAG_ALPHABET[((bits >> (5 * i)) & 31) as usize]))
        .collect()
}

/// What `xced store restore` writes: the backup's records with every job not ready
/// (its worker has not said it runs yet: no endpoint lists it until it has) and
/// `meta/restored`, which makes the controller ask every worker to register again;
/// without the last batch's events (they were announced long ago). Records this
/// version cannot read are refused, naming the first.
pub fn restored_records(records: Vec<(Key, Vec<u8>)>) -> Result<Vec<(Key, Vec<u8>)>, LoadError> {
    // Checked whole first: a restore writes nothing a controller would refuse to load.
    Cluster::from_records(records.clone())?;
    let mut out = Vec::with_capacity(records.len() + 1);
    for (key, bytes) in records {
        match (key.ns.as_str(), key.key.as_str()) {
            (NS_META, EVENTS) | (NS_META, RESTORED) => {}
            (NS_JOB, _) => {
                let decode = |err| LoadError::Decode {
                    key: key.clone(),
                    err,
                };
                let mut rec: JobRec = serde_json::from_slice(&bytes).map_err(decode)?;
                let StoredRev { rev } = serde_json::from_slice(&bytes).map_err(decode)?;
                rec.info.ready = false;
                let bytes = serde_json::to_vec(&StoredJob { rec: &rec, rev })
                    .expect("records serialize to JSON");
                out.push((key, bytes));
            }
            _ => out.push((key, bytes)),
        }
    }
    // Last: in a restore cut into several batches (etcd) it marks the end.
    out.push((restored_key(), b"true".to_vec()));
    Ok(out)
}

pub use events::{decode_events, decode_stored_events, EventsError, StoredEvent};

/// Whether a service runs or is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceState {
    Active,
    Stopping,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceRec {
    pub info: ServiceInfo,
    pub state: ServiceState,
    /// Where the latest change (new generation, restart, scale) stands.
    #[serde(default)]
    pub rollout: Rollout,
    /// The profiles of older generations that still have jobs (their assignments need
    /// their own command and readiness until the last of them has ended).
    #[serde(default)]
    pub older: BTreeMap<u64, serde_json::Value>,
    /// What happened to each replica slot across its jobs (restarts, the last exit and
    /// its cause, the last log), for `GET /v1/services/{name}`; slots without history are
    /// absent. Records written before it read as empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub slots: BTreeMap<u32, SlotRec>,
    /// A stopping service was stopped with `?now=true`: its jobs skip the drain, also
    /// those the stop command's own batch had no room for (the scheduling passes move
    /// them out later).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop_now: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRec {
    pub info: JobInfo,
    /// While `Unknown`: the state to return to when the host is heard from again.
    #[serde(default)]
    pub held: Option<JobState>,
    /// While `Unknown` out of the endpoints (its host unreachable: from
    /// `unreachable_after` on, or past its grace period during a full disruption, when
    /// the host is not declared lost): the readiness to return to when the host is heard
    /// from again. Meanwhile `info.ready` is false, so the job is no endpoint: nobody has
    /// heard from it for that long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_ready: Option<bool>,
    /// Where the replica's output goes on its host, as its worker reported at the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
}

impl JobRec {
    /// The state the job is in as far as the worker is concerned (`Unknown` looks
    /// through to the state it will return to).
    pub fn effective_state(&self) -> JobState {
        match (self.info.state, self.held) {
            (JobState::Unknown, Some(s)) => s,
            (s, _) => s,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostRec {
    pub info: HostInfo,
    /// Jobs the worker runs that the controller does not know; the host takes no new
    /// placements until the worker reported all of them exited.
    #[serde(default)]
    pub orphans: BTreeSet<JobId>,
    /// The grants of the jobs that ended on the host most recently, oldest first (at most
    /// [`RELEASE_HISTORY`]). A controller that loads the store (a restart, a new leader)
    /// replays them into the plugins after restoring the live grants, so a plugin's
    /// release order survives: a port freed just before a failover is not the first one
    /// handed out after it (docs/profile.md#port-allocation).
    #[serde(default)]
    pub released: std::collections::VecDeque<Released>,
    /// The worker instance that holds the host (its last accepted registration); `None`
    /// for a record from before instance ids, or a worker that sends none. Persisted, so
    /// a restarted controller or a new leader refuses a second worker for the host too.
    #[serde(default)]
    pub instance: Option<String>,
    /// The SHA-256 (hex) of the session secret the holder's registration was handed
    /// (`xce_proto::worker::RegisterResponse::session`): every worker call for the host
    /// must present that secret. Only the hash is stored, so the store (or a backup of it)
    /// holds nothing a caller could present; it is in the store so that a restarted
    /// controller or a new leader accepts the live worker at once. `None`: a holder
    /// without a session (a worker of an older release, a record from before sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_sha256: Option<String>,
    /// An operator's cordon or drain of the host (or its worker's leave): it takes no new
    /// placements, and with a drain its replicas move elsewhere. Absent (and not
    /// written) for a host in service, so the records of hosts nobody cordoned keep the
    /// shape they had before maintenance existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<maintenance::Maintenance>,
}

/// How many ended jobs' grants a host record keeps for [`HostRec::released`].
pub const RELEASE_HISTORY: usize = 64;

/// An ended job's grants, as a plugin was told to release them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Released {
    pub job: JobId,
    pub grants: plugin_api::Grants,
}

/// Everything the controller knows, as loaded from the store.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    pub rev: u64,
    /// The format the records were stored in (see [`FORMAT`]); older than [`FORMAT`]
    /// until the controller has written the migration back.
    pub format: u64,
    /// The cluster id as stored (`None` in a store no controller has opened since cluster
    /// ids exist).
    pub cluster_id: Option<String>,
    pub next_job: u64,
    /// Appended to the job ids this controller hands out (`j-<n>-<tag>`): chosen anew
    /// at every load ([`job_tag`]) and never stored, so a store that went back (a
    /// restored backup, a copied data dir) counts `n` again under another tag and no id
    /// repeats. Empty: plain `j-<n>` (the controller's own unit tests).
    pub job_tag: String,
    /// `meta/restored` is stored: the records come from `xced store restore`.
    pub restored: bool,
    pub services: BTreeMap<ServiceKey, ServiceRec>,
    /// Service records stored under a key that is not their canonical `project/name`
    /// (written before services were keyed by project): the next commit moves them.
    pub legacy_keys: Vec<(String, ServiceKey)>,
    /// Live jobs. Changed only through [`Cluster::insert_job`] and
    /// [`Cluster::remove_job`], which keep the indexes below. Each record is shared
    /// with the readers' view (`core/view.rs` keeps the same `Arc`): one copy per job,
    /// not one in the model and one in the view; a change replaces the `Arc`.
    pub jobs: BTreeMap<JobKey, Arc<JobRec>>,
    pub hosts: BTreeMap<HostId, HostRec>,
    /// The ids of `jobs` by host and by service: `jobs_on` and `jobs_of` read a host's or a
    /// service's jobs without a scan of every job (at 50,000 jobs on 1,000 hosts a scan
    /// per host made each publish 50 million steps).
    by_host: HashMap<HostId, BTreeSet<JobKey>>,
    by_service: HashMap<ServiceKey, BTreeSet<JobKey>>,
}

/// Why the stored state could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stored record {key} is unreadable: {err}")]
    Decode { key: Key, err: serde_json::Error },
    #[error("stored record {0} is in an unknown namespace")]
    Unknown(Key),
    /// Written by a newer release: refused whole rather than misread.
    #[error(
        "the store holds records of format {found}, newer than this build ({build}) \
         understands (format {FORMAT} and older): it was written by a newer release; upgrade \
         this process (see UPGRADING.md)"
    )]
    NewerFormat { found: u64, build: String },
}

// === impl Cluster ===

impl Cluster {
    pub fn load(store: &dyn Store) -> Result<Self, LoadError> {
        Self::from_records(store.load_all()?)
    }

    /// The cluster the records of [`Store::load_all`] describe.
    /// A store of a newer [`FORMAT`] is refused before any record is read: its records
    /// may not decode, or decode into something else.
    pub fn from_records(records: Vec<(Key, Vec<u8>)>) -> Result<Self, LoadError> {
        let format = stored_format(&records)?;
        let mut c = Cluster {
            next_job: 1,
            format,
            ..Cluster::default()
        };
        // The newest job `rev` per service (see [`StoredJob`]).
        let mut revs: HashMap<ServiceKey, u64> = HashMap::new();
        for (key, bytes) in records {
            macro_rules! de {
                () => {
                    serde_json::from_slice(&bytes).map_err(|err| LoadError::Decode {
                        key: key.clone(),
                        err,
                    })?
                };
            }
            match (key.ns.as_str(), key.key.as_str()) {
                (NS_META, "rev") => c.rev = de!(),
                (NS_META, "next_job") => c.next_job = de!(),
                (NS_META, EVENTS | FORMAT_KEY) => {}
                (NS_META, CLUSTER_ID) => c.cluster_id = Some(de!()),
                (NS_META, RESTORED) => c.restored = true,
                (NS_SERVICE, stored) => {
                    let rec: ServiceRec = de!();
                    let k = rec.info.key();
                    if stored != service_key_str(&k) {
                        c.legacy_keys.push((stored.to_owned(), k.clone()));
                    }
                    c.services.insert(k, rec);
                }
                (NS_JOB, _) => {
                    let j: JobRec = de!();
                    let StoredRev { rev } = de!();
                    if rev > 0 {
                        let newest = revs.entry(j.info.service_key()).or_insert(0);
                        *newest = (*newest).max(rev);
                    }
                    c.insert_job(j);
                }
                (NS_HOST, id) => {
                    c.hosts.insert(id.to_owned(), de!());
                }
                _ => return Err(LoadError::Unknown(key)),
            }
        }
        // A service's `rev` is the revision of the last event that touched it: a job
        // write keeps it in the job's record only (`Txn::put_job`), everything else (the
        // service itself, a job's end, a host change, a quiet job write) in the service's.
        for (key, rev) in revs {
            if let Some(s) = c.services.get_mut(&key) {
                s.info.rev = s.info.rev.max(rev);
            }
        }
        Ok(c)
    }

    /// Whether the records are older than [`DEFAULT_STORE_FORMAT`]: the controller writes
    /// them back (in that format, or the stored one if newer: see [`Txn::migrate`]).
    pub fn needs_migration(&self) -> bool {
        self.format < DEFAULT_STORE_FORMAT || !self.legacy_keys.is_empty()
    }

    pub fn snapshot(&self) -> ClusterSnapshot {
        ClusterSnapshot {
            rev: self.rev,
            services: self.services.values().map(|s| s.info.clone()).collect(),
            jobs: self.jobs.values().map(|j| j.info.clone()).collect(),
            hosts: self.hosts.values().map(|h| h.info.clone()).collect(),
        }
    }

    /// The live jobs on `host`, by job id.
    pub fn jobs_on<'a>(&'a self, host: &'a str) -> impl Iterator<Item = &'a JobRec> + 'a {
        self.indexed(self.by_host.get(host)).map(|j| &**j)
    }

    /// The live jobs on `host` as the shared records (for the assignments).
    pub fn shared_jobs_on<'a>(
        &'a self,
        host: &'a str,
    ) -> impl Iterator<Item = &'a Arc<JobRec>> + 'a {
        self.indexed(self.by_host.get(host))
    }

    /// How many live jobs `host` has.
    pub fn count_on(&self, host: &str) -> usize {
        self.by_host.get(host).map_or(0, BTreeSet::len)
    }

    /// How many live jobs `service` has.
    pub fn count_of(&self, service: &ServiceKey) -> usize {
        self.by_service.get(service).map_or(0, BTreeSet::len)
    }

    /// The live jobs of `service`, by job id.
    pub fn jobs_of<'a>(&'a self, service: &'a ServiceKey) -> impl Iterator<Item = &'a JobRec> + 'a {
        self.indexed(self.by_service.get(service)).map(|j| &**j)
    }

    /// The live jobs of `service` as the shared records (for the readers' view).
    pub fn shared_jobs_of<'a>(
        &'a self,
        service: &'a ServiceKey,
    ) -> impl Iterator<Item = &'a Arc<JobRec>> + 'a {
        self.indexed(self.by_service.get(service))
    }

    fn indexed<'a>(
        &'a self,
        ids: Option<&'a BTreeSet<JobKey>>,
    ) -> impl Iterator<Item = &'a Arc<JobRec>> + 'a {
        ids.into_iter().flatten().map(|id| &self.jobs[&**id])
    }

    /// The shared id of a live job (see [`JobKey`]).
    pub fn job_key(&self, id: &str) -> Option<&JobKey> {
        self.jobs.get_key_value(id).map(|(k, _)| k)
    }

    /// Adds or replaces a job (its host and service never change).
    pub fn insert_job(&mut self, j: impl Into<Arc<JobRec>>) {
        let j = j.into();
        if let Some(rec) = self.jobs.get_mut(j.info.job.as_str()) {
            *rec = j;
            return;
        }
        let id = JobKey::from(j.info.job.as_str());
        self.by_host
            .entry(j.info.host.clone())
            .or_default()
            .insert(id.clone());
        self.by_service
            .entry(j.info.service_key())
            .or_default()
            .insert(id.clone());
        self.jobs.insert(id, j);
    }

    /// Removes a job, if present.
    pub fn remove_job(&mut self, id: &str) {
        let Some(j) = self.jobs.remove(id) else {
            return;
        };
        if let Some(set) = self.by_host.get_mut(&j.info.host) {
            set.remove(id);
            if set.is_empty() {
                self.by_host.remove(&j.info.host);
            }
        }
        let key = j.info.service_key();
        if let Some(set) = self.by_service.get_mut(&key) {
            set.remove(id);
            if set.is_empty() {
                self.by_service.remove(&key);
            }
        }
    }
}

/// The format `records` are in (see [`FORMAT`]); a newer one is an error.
fn stored_format(records: &[(Key, Vec<u8>)]) -> Result<u64, LoadError> {
    let Some((key, bytes)) = records
        .iter()
        .find(|(k, _)| k.ns == NS_META && k.key == FORMAT_KEY)
    else {
        return Ok(UNNUMBERED_FORMAT);
    };
    let found = decode_format(bytes).map_err(|err| LoadError::Decode {
        key: key.clone(),
        err,
    })?;
    check_format(found)?;
    Ok(found)
}

/// Refuses a format newer than [`FORMAT`], naming both and this build.
pub fn check_format(found: u64) -> Result<(), LoadError> {
    if found > FORMAT {
        return Err(LoadError::NewerFormat {
            found,
            build: xce_wire::version::build().to_string(),
        });
    }
    Ok(())
}

/// Plugin calls due once a transaction is committed.
#[derive(Debug, Clone)]
pub enum After {
    /// `launch_refused` on the named plugin (before the release that always follows).
    Refused {
        host: HostId,
        job: JobId,
        plugin: String,
        detail: serde_json::Value,
    },
    /// `release` on every plugin.
    Release { host: HostId, job: JobId },
}

/// A set of changes, committed to the store as one batch and then applied in memory.
///
/// Reads go through the transaction (`service`, `job`, `host`) so later steps of one
/// command see earlier ones.
#[derive(Debug, Default)]
pub struct Txn {
    rev: u64,
    /// The format to record (a migration, see [`Txn::migrate`]).
    format: Option<u64>,
    /// The format the store is in: the shape of `meta/events` (see [`events`]).
    stored_format: u64,
    next_job: Option<u64>,
    services: BTreeMap<ServiceKey, Option<ServiceRec>>,
    /// Services whose `rev` moves without their record being written: a job write
    /// keeps the new `rev` in the job's record (see [`StoredJob::rev`]).
    bumped: BTreeMap<ServiceKey, u64>,
    /// Stored keys to delete (see [`Cluster::legacy_keys`]).
    legacy: Vec<String>,
    jobs: BTreeMap<JobId, Option<JobRec>>,
    /// The `rev` each job's record is written with: its last event's (see [`StoredJob`]);
    /// none for a quiet write.
    job_revs: BTreeMap<JobId, u64>,
    hosts: BTreeMap<HostId, Option<HostRec>>,
    /// Deletes `meta/restored` (see [`Txn::clear_restored`]).
    clear_restored: bool,
    pub events: Vec<ClusterEvent>,
    pub after: Vec<After>,
}

// === impl Txn ===

impl Txn {
    pub fn new(c: &Cluster) -> Self {
        Txn {
            rev: c.rev,
            stored_format: c.format,
            ..Txn::default()
        }
    }

    /// The operations (distinct keys) its batch will have.
    pub fn ops(&self) -> usize {
        self.services.len()
            + self.legacy.len()
            + self.jobs.len()
            + self.hosts.len()
            + usize::from(self.next_job.is_some())
            + usize::from(self.format.is_some())
            + usize::from(self.clear_restored)
            + usize::from(!self.events.is_empty())
            + 1 // meta/rev
    }

    /// Whether the transaction writes (or removes) the service's record.
    pub fn has_service(&self, key: &ServiceKey) -> bool {
        self.services.contains_key(key)
    }

    pub fn is_empty(&self) -> bool {
        self.next_job.is_none()
            && self.format.is_none()
            && !self.clear_restored
            && self.services.is_empty()
            && self.bumped.is_empty()
            && self.legacy.is_empty()
            && self.jobs.is_empty()
            && self.hosts.is_empty()
    }

    fn next_rev(&mut self) -> u64 {
        self.rev += 1;
        self.rev
    }

    pub fn service(&self, c: &Cluster, key: &ServiceKey) -> Option<ServiceRec> {
        match self.services.get(key) {
            Some(s) => s.clone(),
            None => {
                let mut s = c.services.get(key).cloned()?;
                if let Some(rev) = self.bumped.get(key) {
                    s.info.rev = *rev;
                }
                Some(s)
            }
        }
    }

    /// Writes the records of an older format back in [`DEFAULT_STORE_FORMAT`] (or the
    /// stored format, if newer: a store never goes back): service records under legacy
    /// keys move to their canonical keys, and `meta/format` is written.
    pub fn migrate(&mut self, c: &Cluster) {
        self.migrate_keys(c);
        self.format = Some(c.format.max(DEFAULT_STORE_FORMAT));
    }

    /// Moves the store to `format` (newer than the stored one, at most [`FORMAT`]): only
    /// `meta/format` changes (format 3 changes the shape of later events records, not the
    /// records), and the batches after it write the new shape.
    pub fn upgrade_format(&mut self, format: u64) {
        debug_assert!(format <= FORMAT, "format {format} is unknown here");
        self.format = Some(format);
    }

    /// Moves service records stored under legacy keys to their canonical keys.
    fn migrate_keys(&mut self, c: &Cluster) {
        for (stored, key) in &c.legacy_keys {
            if let Some(rec) = self.service(c, key) {
                self.services.insert(key.clone(), Some(rec));
            }
            self.legacy.push(stored.clone());
        }
    }

    pub fn job(&self, c: &Cluster, id: &str) -> Option<JobRec> {
        match self.jobs.get(id) {
            Some(j) => j.clone(),
            None => c.jobs.get(id).map(|j| JobRec::clone(j)),
        }
    }

    pub fn host(&self, c: &Cluster, id: &str) -> Option<HostRec> {
        match self.hosts.get(id) {
            Some(h) => h.clone(),
            None => c.hosts.get(id).cloned(),
        }
    }

    /// The services with live jobs on `host` as they will be after this transaction.
    fn services_on(&self, c: &Cluster, host: &str) -> BTreeSet<ServiceKey> {
        let stored = c
            .jobs_on(host)
            .filter(|j| !matches!(self.jobs.get(&j.info.job), Some(None)));
        let ours = self.jobs.values().flatten().filter(|j| j.info.host == host);
        stored.chain(ours).map(|j| j.info.service_key()).collect()
    }

    /// The services this transaction writes: each one's new record, `None` when removed
    /// (a job's end or a host change also rewrites its service's record, with the new
    /// `rev`; a job write only moves it, see [`services_bumped`](Self::services_bumped)).
    pub fn services_written(
        &self,
    ) -> impl Iterator<Item = (&ServiceKey, Option<&ServiceRec>)> + '_ {
        self.services.iter().map(|(k, s)| (k, s.as_ref()))
    }

    /// The services whose `rev` this transaction moves without writing their record.
    pub fn services_bumped(&self) -> impl Iterator<Item = &ServiceKey> + '_ {
        self.bumped.keys()
    }

    /// The jobs this transaction writes: each one's new record, `None` when it ends.
    pub fn jobs_written(&self) -> impl Iterator<Item = (&JobId, Option<&JobRec>)> + '_ {
        self.jobs.iter().map(|(id, j)| (id, j.as_ref()))
    }

    /// The id [`new_job_id`](Self::new_job_id) would take next.
    pub fn peek_job_id(&self, c: &Cluster) -> JobId {
        job_id(self.next_job.unwrap_or(c.next_job), &c.job_tag)
    }

    /// Takes a fresh job id.
    pub fn new_job_id(&mut self, c: &Cluster) -> JobId {
        let n = self.next_job.unwrap_or(c.next_job);
        self.next_job = Some(n + 1);
        job_id(n, &c.job_tag)
    }

    /// Removes `meta/restored`: every worker has registered since the restore.
    pub fn clear_restored(&mut self) {
        self.clear_restored = true;
    }

    /// Gives the service `rev`. `write`: its record is written with it; otherwise (a job
    /// write, whose record keeps the `rev`) it moves in memory only, unless the record is
    /// written anyway.
    fn touch_service(&mut self, c: &Cluster, key: &ServiceKey, rev: u64, write: bool) {
        // Already in the transaction: bump it there (a pass placing thousands of a
        // service's replicas must not clone its record, profile and all, for each).
        if let Some(entry) = self.services.get_mut(key) {
            if let Some(s) = entry {
                s.info.rev = rev;
            }
            return;
        }
        if !c.services.contains_key(key) {
            return;
        }
        if !write {
            self.bumped.insert(key.clone(), rev);
            return;
        }
        if let Some(mut s) = self.service(c, key) {
            s.info.rev = rev;
            self.bumped.remove(key);
            self.services.insert(key.clone(), Some(s));
        }
    }

    /// A service was created or changed.
    pub fn put_service(&mut self, mut s: ServiceRec) {
        let rev = self.next_rev();
        s.info.rev = rev;
        self.bumped.remove(&s.info.key());
        self.events.push(ClusterEvent::Service {
            rev,
            service: s.info.clone(),
        });
        self.services.insert(s.info.key(), Some(s));
    }

    /// A service record change that readers of the event feed do not need (its rollout
    /// bookkeeping); the service's `rev` is left alone.
    pub fn put_service_quiet(&mut self, mut s: ServiceRec) {
        let key = s.info.key();
        if let Some(rev) = self.bumped.remove(&key) {
            s.info.rev = s.info.rev.max(rev);
        }
        self.services.insert(key, Some(s));
    }

    /// A service is gone.
    pub fn remove_service(&mut self, s: &ServiceRec) {
        let rev = self.next_rev();
        self.events.push(ClusterEvent::ServiceRemoved {
            rev,
            name: s.info.name.clone(),
            project: s.info.project.clone(),
        });
        self.bumped.remove(&s.info.key());
        self.services.insert(s.info.key(), None);
    }

    /// A job was placed or changed.
    pub fn put_job(&mut self, c: &Cluster, j: JobRec) {
        let rev = self.next_rev();
        self.touch_service(c, &j.info.service_key(), rev, false);
        self.job_revs.insert(j.info.job.clone(), rev);
        self.events.push(ClusterEvent::Job {
            rev,
            job: j.info.clone(),
        });
        self.jobs.insert(j.info.job.clone(), Some(j));
    }

    /// A job record change nobody listens to (a readiness kept aside while the job is out
    /// of the endpoints, see [`JobRec::held_ready`]).
    pub fn put_job_quiet(&mut self, c: &Cluster, j: JobRec) {
        // The record is written without the `rev` of the job's last event (unknown here,
        // unless this transaction made it): the service's record keeps it instead.
        if !self.job_revs.contains_key(&j.info.job) {
            let key = j.info.service_key();
            let rev = self.service(c, &key).map(|s| s.info.rev);
            if let Some(rev) = rev {
                self.touch_service(c, &key, rev, true);
            }
        }
        self.jobs.insert(j.info.job.clone(), Some(j));
    }

    /// A job ended: it leaves the live set and its grants are released after the commit.
    /// It ends `Lost` when its host was lost, `Exited` for every other `reason`.
    pub fn end_job(&mut self, c: &Cluster, mut j: JobRec, reason: EndReason) {
        let rev = self.next_rev();
        // Written: the job's record, which may hold the service's newest `rev`, goes.
        self.touch_service(c, &j.info.service_key(), rev, true);
        j.info.state = match reason {
            EndReason::HostLost => JobState::Lost,
            EndReason::Exited { .. } | EndReason::Stopped | EndReason::Refused { .. } => {
                JobState::Exited
            }
        };
        j.info.ready = false;
        self.after.push(After::Release {
            host: j.info.host.clone(),
            job: j.info.job.clone(),
        });
        if let Some(mut h) = self.host(c, &j.info.host) {
            h.released.push_back(Released {
                job: j.info.job.clone(),
                grants: j.info.grants.clone(),
            });
            while h.released.len() > RELEASE_HISTORY {
                h.released.pop_front();
            }
            self.hosts.insert(h.info.id.clone(), Some(h));
        }
        self.jobs.insert(j.info.job.clone(), None);
        self.job_revs.remove(&j.info.job);
        self.events.push(ClusterEvent::JobEnded {
            rev,
            job: j.info,
            reason,
        });
    }

    /// A host registered or changed state or facts: an event, and the services with live
    /// jobs on it get its revision.
    pub fn put_host(&mut self, c: &Cluster, h: HostRec) {
        let rev = self.next_rev();
        let services = self.services_on(c, &h.info.id);
        for s in &services {
            self.touch_service(c, s, rev, true);
        }
        self.events.push(ClusterEvent::Host {
            rev,
            host: h.info.clone(),
            services: services.into_iter().collect(),
        });
        self.hosts.insert(h.info.id.clone(), Some(h));
    }

    /// A host record change nobody listens to (its orphan list).
    pub fn put_host_quiet(&mut self, h: HostRec) {
        self.hosts.insert(h.info.id.clone(), Some(h));
    }

    /// The store batch, with `meta/events` (what followers of the store read; tests that
    /// write a followed store as the controller does).
    #[cfg(any(test, feature = "test-util"))]
    pub fn batch(&self) -> Batch {
        self.batch_for(true)
    }

    /// The store batch; with `meta/events` when `events` (see
    /// [`Store::journals_events`]).
    pub fn batch_for(&self, events: bool) -> Batch {
        fn enc<T: Serialize>(v: &T) -> Vec<u8> {
            serde_json::to_vec(v).expect("records serialize to JSON")
        }
        let mut b = Batch::default();
        let mut section = |ns: &str, key: &str, v: Option<Vec<u8>>| match v {
            Some(v) => b.put(Key::new(ns, key), v),
            None => b.delete(Key::new(ns, key)),
        };
        for stored in &self.legacy {
            section(NS_SERVICE, stored, None);
        }
        for (k, v) in &self.services {
            section(NS_SERVICE, &service_key_str(k), v.as_ref().map(enc));
        }
        for (k, v) in &self.jobs {
            let rev = self.job_revs.get(k).copied().unwrap_or(0);
            section(
                NS_JOB,
                k,
                v.as_ref().map(|rec| enc(&StoredJob { rec, rev })),
            );
        }
        for (k, v) in &self.hosts {
            section(NS_HOST, k, v.as_ref().map(enc));
        }
        if let Some(n) = self.next_job {
            section(NS_META, "next_job", Some(enc(&n)));
        }
        if let Some(f) = self.format {
            section(NS_META, FORMAT_KEY, Some(enc(&f)));
        }
        if self.clear_restored {
            section(NS_META, RESTORED, None);
        }
        section(NS_META, "rev", Some(enc(&self.rev)));
        if events && !self.events.is_empty() {
            let written = |id: &str| self.jobs.get(id)?.as_ref().map(|j| &j.info);
            let record = events::encode_events(&self.events, written, self.stored_format);
            section(NS_META, EVENTS, Some(record));
        }
        b
    }

    /// Applies the (committed) changes in memory; returns the events and plugin calls.
    pub fn apply(self, c: &mut Cluster) -> (Vec<ClusterEvent>, Vec<After>) {
        c.rev = self.rev;
        if !self.legacy.is_empty() {
            c.legacy_keys.clear();
        }
        if let Some(f) = self.format {
            c.format = f;
        }
        if let Some(n) = self.next_job {
            c.next_job = n;
        }
        if self.clear_restored {
            c.restored = false;
        }
        for (k, v) in self.services {
            match v {
                Some(v) => c.services.insert(k, v),
                None => c.services.remove(&k),
            };
        }
        for (k, rev) in self.bumped {
            if let Some(s) = c.services.get_mut(&k) {
                s.info.rev = rev;
            }
        }
        for (k, v) in self.jobs {
            match v {
                Some(v) => c.insert_job(v),
                None => c.remove_job(&k),
            }
        }
        for (k, v) in self.hosts {
            match v {
                Some(v) => c.hosts.insert(k, v),
                None => c.hosts.remove(&k),
            };
        }
        (self.events, self.after)
    }
}

#[cfg(test)]
mod restore_tests;
