//! The sim host's controller: hosts, services, jobs, the scheduler, the store, and the
//! plugins it loads through `plugin-api` only. Synchronous and single-threaded, like a
//! controller's state task; every change is committed to the store in one batch and then
//! announced to the listeners, each event with the next revision.

use crate::config::Fault;
use crate::phases::Phases;
use crate::reserve::reserve_all;
use crate::sched::Scheduler;
use crate::store::{Batch, Store};
use crate::worker::Workers;
use plugin_api::{
    ClusterEvent, ClusterListener, ClusterSnapshot, EndReason, Grants, HostFactsPolicy, HostId,
    HostInfo, HostState, JobInfo, JobState, PlacementRequest, ResourcePlugin, ServiceInfo,
    ServiceKey,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

mod host_jobs;
mod job_table;
mod jobs;

use host_jobs::HostJobs;
use job_table::JobTable;

/// What the host did, reported to the scenario (and from there to the model).
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// A job was placed and its grants committed (read them with
    /// [`Cluster::grants`]: a placement's grants are not copied for the report).
    Placed {
        job: String,
        service: ServiceKey,
        slot: u32,
        host: u32,
    },
    /// A worker ran the launch hooks and would have spawned the replica with `env`.
    Started {
        job: String,
        env: BTreeMap<String, String>,
    },
    /// The job ended (exited, stopped, refused, or its host lost); its grants released.
    Ended { job: String },
}

#[derive(Debug)]
struct JobRec {
    info: JobInfo,
    host: u32,
}

#[derive(Debug)]
struct ServiceRec {
    info: ServiceInfo,
    /// Each plugin's section of the profile, in plugin order.
    sections: Vec<Option<serde_json::Value>>,
    /// Live jobs per slot (old and new generation side by side during a roll).
    slots: Vec<Vec<u64>>,
}

#[derive(Debug)]
struct HostRec {
    info: HostInfo,
    jobs: HostJobs,
}

/// Builds the resource plugins of a (re)started controller.
pub(crate) type Plugins = Box<dyn Fn() -> Vec<Box<dyn ResourcePlugin>>>;

/// The controller of the simulated cluster.
pub(crate) struct Cluster {
    make_plugins: Plugins,
    plugins: Vec<Box<dyn ResourcePlugin>>,
    policy: Box<dyn HostFactsPolicy>,
    listeners: Vec<Box<dyn ClusterListener>>,
    pub(crate) workers: Workers,
    store: Store,
    sched: Scheduler,
    hosts: Vec<HostRec>,
    services: BTreeMap<ServiceKey, ServiceRec>,
    jobs: JobTable<JobRec>,
    next_job: u64,
    /// Slots waiting for a placement: (service, slot).
    pending: Vec<(ServiceKey, u32)>,
    fault: Option<Fault>,
    pub(crate) phases: Phases,
    pub(crate) placements: u64,
    pub(crate) unplaced: u64,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("hosts", &self.hosts.len())
            .field("services", &self.services.len())
            .field("jobs", &self.jobs.len())
            .finish_non_exhaustive()
    }
}

/// A host's id: `h-00042`.
pub(crate) fn host_id(i: u32) -> HostId {
    format!("h-{i:05}")
}

// === impl Cluster ===

impl Cluster {
    pub(crate) fn new(
        make_plugins: Plugins,
        policy: Box<dyn HostFactsPolicy>,
        listeners: Vec<Box<dyn ClusterListener>>,
        workers: Workers,
        hosts: u32,
        seed: u64,
        fault: Option<Fault>,
    ) -> Self {
        let cluster = Self {
            plugins: make_plugins(),
            make_plugins,
            policy,
            listeners,
            workers,
            store: Store::default(),
            sched: Scheduler::new(hosts as usize, seed),
            hosts: (0..hosts)
                .map(|i| HostRec {
                    info: HostInfo {
                        id: host_id(i),
                        state: HostState::Lost,
                        facts: Default::default(),
                    },
                    jobs: HostJobs::default(),
                })
                .collect(),
            services: BTreeMap::new(),
            jobs: JobTable::default(),
            next_job: 1,
            pending: Vec::new(),
            fault,
            phases: Phases::default(),
            placements: 0,
            unplaced: 0,
        };
        // The listeners start from the (empty) state, as after a controller start.
        cluster.resync();
        cluster
    }

    /// Hands every listener the whole state from the store.
    pub(crate) fn resync(&self) {
        let snapshot = ClusterSnapshot {
            rev: self.store.rev(),
            services: self.store.services(),
            jobs: self.store.jobs(),
            hosts: self.store.hosts(),
        };
        for l in &self.listeners {
            l.resync(&snapshot);
        }
    }

    /// A controller restart: fresh plugins learn every known host (`host_up`) and then
    /// every live job's grant as the store holds it (`restore`, from bytes), before any new
    /// placement; the listeners are resynced from the store. Returns what the plugins
    /// refused (a grant that conflicts with another is a corrupted store: reported, the
    /// rest restored).
    pub(crate) fn restart(&mut self) -> Vec<String> {
        let mut refused = Vec::new();
        let mut plugins = (self.make_plugins)();
        for host in self.store.hosts() {
            for p in &mut plugins {
                if let Err(e) = p.host_up(&host.id, &host.facts) {
                    refused.push(format!("host {}: {}: {e}", host.id, p.name()));
                }
            }
        }
        for job in self.store.jobs() {
            for p in &mut plugins {
                if let Some(grant) = job.grants.get(p.name()) {
                    if let Err(e) = p.restore(&job.host, &job.job, grant) {
                        tracing::error!(job = %job.job, plugin = p.name(), error = %e, "restore refused");
                        refused.push(format!("restore by {}: {e}", p.name()));
                    }
                }
            }
        }
        self.plugins = plugins;
        self.resync();
        refused
    }

    pub(crate) fn commits(&self) -> u64 {
        self.store.commits()
    }

    /// Makes room for `jobs` more jobs at once (the run's size is known): grown one
    /// placement at a time, the job table moved every record each time it doubled,
    /// inside the placement passes.
    pub(crate) fn expect_jobs(&mut self, jobs: usize) {
        self.jobs.reserve(jobs);
    }

    pub(crate) fn live_jobs(&self) -> usize {
        self.jobs.len()
    }

    /// Every plugin's view of host `i` (pool usage), by plugin name.
    pub(crate) fn host_summary(&self, i: u32) -> BTreeMap<&'static str, serde_json::Value> {
        let id = &self.hosts[i as usize].info.id;
        self.plugins
            .iter()
            .filter_map(|p| Some((p.name(), p.host_summary(id)?)))
            .collect()
    }

    /// The live jobs of a service: (job id, slot, generation, state, ready, host).
    pub(crate) fn service_jobs(&self, key: &ServiceKey) -> Vec<(String, u32, u64, JobState, bool)> {
        let Some(svc) = self.services.get(key) else {
            return Vec::new();
        };
        svc.slots
            .iter()
            .flatten()
            .map(|n| {
                let j = &self.jobs[n].info;
                (j.job.clone(), j.replica, j.generation, j.state, j.ready)
            })
            .collect()
    }

    /// The grants of a live job, as committed.
    pub(crate) fn grants(&self, job: &str) -> Option<&Grants> {
        self.jobs.get(&job_number(job)).map(|r| &r.info.grants)
    }

    pub(crate) fn service(&self, key: &ServiceKey) -> Option<&ServiceInfo> {
        self.services.get(key).map(|s| &s.info)
    }

    // --- hosts ---

    /// A worker registers (or comes back): it collects its facts with its providers, the
    /// policy checks them, every plugin learns the host.
    pub(crate) fn register(&mut self, i: u32) -> Result<(), String> {
        let facts = self.workers.collect(i).map_err(|e| e.to_string())?;
        let id = host_id(i);
        self.policy.check(&id, &facts).map_err(|errors| {
            let all: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            all.join("; ")
        })?;
        for p in &mut self.plugins {
            p.host_up(&id, &facts)
                .map_err(|e| format!("{}: {e}", p.name()))?;
        }
        let host = &mut self.hosts[i as usize];
        host.info.facts = facts;
        host.info.state = HostState::Ready;
        self.sched.enable(i);
        self.host_changed(i);
        Ok(())
    }

    /// The host stops heartbeating: its jobs are kept as `unknown` (still endpoints when
    /// ready), nothing new goes there.
    pub(crate) fn unreachable(&mut self, i: u32) {
        self.sched.disable(i);
        self.hosts[i as usize].info.state = HostState::Unreachable;
        let mut events = Vec::new();
        let mut batch = Batch::default();
        let jobs: Vec<u64> = self.hosts[i as usize].jobs.iter().copied().collect();
        for n in jobs {
            let job = self.jobs.get_mut(&n).expect("a host's jobs are live");
            job.info.state = JobState::Unknown;
            batch.job(&job.info);
            events.push(n);
        }
        self.host_changed(i);
        self.commit_jobs(batch, &events);
    }

    /// The host stays silent past the grace period: its jobs end, their grants are
    /// released, their slots wait for a placement elsewhere.
    pub(crate) fn lost(&mut self, i: u32) -> Vec<Outcome> {
        self.sched.disable(i);
        self.hosts[i as usize].info.state = HostState::Lost;
        self.host_changed(i);
        // The controller's one decision ends every job of the host: one batch.
        let jobs: Vec<u64> = self.hosts[i as usize].jobs.iter().copied().collect();
        self.end_all(&jobs, &EndReason::HostLost, true)
    }

    /// Commits and announces a host's state and facts.
    fn host_changed(&mut self, i: u32) -> u64 {
        let rev = self.store.next_rev();
        let host = &self.hosts[i as usize];
        let mut services: Vec<ServiceKey> = host
            .jobs
            .iter()
            .map(|n| self.jobs[n].info.service_key())
            .collect();
        services.sort();
        services.dedup();
        let mut batch = Batch::default();
        for key in &services {
            if let Some(s) = self.services.get_mut(key) {
                s.info.rev = rev;
                batch.service(&s.info);
            }
        }
        batch.host(&self.hosts[i as usize].info);
        let event = ClusterEvent::Host {
            rev,
            host: self.hosts[i as usize].info.clone(),
            services,
        };
        self.commit_and_announce(batch, vec![event]);
        rev
    }

    // --- services ---

    /// Validates and creates a service; its slots wait for [`schedule`](Self::schedule).
    pub(crate) fn create(
        &mut self,
        key: &ServiceKey,
        replicas: u32,
        profile: serde_json::Value,
    ) -> Result<(), String> {
        for p in &self.plugins {
            p.validate(profile.get(p.name())).map_err(|errors| {
                errors
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            })?;
        }
        let info = ServiceInfo {
            name: key.name.clone(),
            project: key.project.clone(),
            replicas,
            profile,
            rev: 0,
            generation: 1,
        };
        self.services.insert(
            key.clone(),
            ServiceRec {
                sections: self
                    .plugins
                    .iter()
                    .map(|p| info.profile.get(p.name()).cloned())
                    .collect(),
                info,
                slots: vec![Vec::new(); replicas as usize],
            },
        );
        self.service_changed(key);
        self.pending.extend((0..replicas).map(|s| (key.clone(), s)));
        Ok(())
    }

    /// A new generation of the same profile (a restart/roll): announced, no job touched.
    pub(crate) fn new_generation(&mut self, key: &ServiceKey) -> u64 {
        let svc = self.services.get_mut(key).expect("rolling a known service");
        svc.info.generation += 1;
        let g = svc.info.generation;
        self.service_changed(key);
        g
    }

    /// Asks for one more job in `slot` of the current generation (a surge, or a new slot).
    pub(crate) fn want(&mut self, key: &ServiceKey, slot: u32) {
        self.pending.push((key.clone(), slot));
    }

    /// Sets the desired replica count; new slots wait for a placement. Scaling down is
    /// the caller's: it drains and stops the jobs of the slots that go.
    pub(crate) fn scale(&mut self, key: &ServiceKey, replicas: u32) {
        let svc = self.services.get_mut(key).expect("scaling a known service");
        let old = svc.info.replicas;
        svc.info.replicas = replicas;
        if svc.slots.len() < replicas as usize {
            svc.slots.resize(replicas as usize, Vec::new());
        }
        self.service_changed(key);
        self.pending
            .extend((old..replicas).map(|s| (key.clone(), s)));
    }

    /// Removes a service whose jobs have all ended.
    pub(crate) fn remove(&mut self, key: &ServiceKey) {
        let svc = self.services.remove(key).expect("removing a known service");
        assert!(
            svc.slots.iter().all(|s| s.is_empty()),
            "a service is removed after its jobs ended"
        );
        self.pending.retain(|(k, _)| k != key);
        let rev = self.store.next_rev();
        let mut batch = Batch::default();
        batch.service_gone(&key.project, &key.name);
        let event = ClusterEvent::ServiceRemoved {
            rev,
            name: key.name.clone(),
            project: key.project.clone(),
        };
        self.commit_and_announce(batch, vec![event]);
    }

    fn service_changed(&mut self, key: &ServiceKey) {
        let rev = self.store.next_rev();
        let svc = self.services.get_mut(key).expect("a known service");
        svc.info.rev = rev;
        let mut batch = Batch::default();
        batch.service(&svc.info);
        let event = ClusterEvent::Service {
            rev,
            service: svc.info.clone(),
        };
        self.commit_and_announce(batch, vec![event]);
    }

    // --- jobs ---

    /// Places every pending slot, all placements in one batch; a slot that fits nowhere
    /// stays pending. Returns what was placed.
    pub(crate) fn schedule(&mut self) -> Vec<Outcome> {
        let mut pass = Pass::default();
        for (key, slot) in std::mem::take(&mut self.pending) {
            self.place(key, slot, &mut pass);
        }
        if !pass.placed.is_empty() {
            self.commit_pass(pass.batch, pass.placed);
        }
        pass.out
    }

    /// Places one pending slot in `pass`, or puts it back when it fits nowhere. A slot of
    /// a service that is gone, or above its replicas (scaled down meanwhile), is dropped.
    fn place(&mut self, key: ServiceKey, slot: u32, pass: &mut Pass) {
        let Some(svc) = self.services.get(&key) else {
            return;
        };
        if slot >= svc.info.replicas {
            return;
        }
        let n = self.next_job;
        let job = format!("j-{n}");
        let generation = svc.info.generation;
        let reqs = placement_requests(&key, slot, &job, &svc.sections);
        // Field by field: the service's sections stay borrowed by the requests.
        let found = Placer {
            plugins: &mut self.plugins,
            hosts: &self.hosts,
            sched: &mut self.sched,
            phases: &mut self.phases,
        }
        .pick_and_reserve(&reqs);
        drop(reqs);
        let Some((h, mut grants)) = found else {
            self.unplaced += 1;
            self.pending_again(key, slot);
            return;
        };
        if let Some(Fault::DuplicatePort) = self.fault {
            self.inject_duplicate_port(h, &mut grants, &pass.placed);
        }
        self.next_job += 1;
        self.placements += 1;
        let info = JobInfo {
            job: job.clone(),
            service: key.name.clone(),
            project: key.project.clone(),
            replica: slot,
            host: self.hosts[h as usize].info.id.clone(),
            state: JobState::Placed,
            ready: false,
            grants,
            generation,
        };
        pass.batch.job(&info);
        // The host's load counts at once: the next pick of this pass sees it.
        self.sched.add(h, 1);
        pass.placed.push(PlacedJob { n, host: h, info });
        pass.out.push(Outcome::Placed {
            job,
            service: key,
            slot,
            host: h,
        });
    }

    /// The fault [`Fault::DuplicatePort`]: hands this job a port one of the host's other
    /// jobs holds (once: the fault is then spent).
    fn inject_duplicate_port(&mut self, h: u32, grants: &mut Grants, placed: &[PlacedJob]) {
        // The host's jobs: those committed before this pass, and this pass's.
        let committed = self.hosts[h as usize].jobs.iter();
        let others = (committed.map(|n| &self.jobs[n].info))
            .chain(placed.iter().filter(|p| p.host == h).map(|p| &p.info));
        if crate::fault::duplicate_port(grants, others) {
            tracing::warn!(host = h, "fault injected: a port handed out twice");
            self.fault = None;
        }
    }

    /// Commits a pass's placements, announces them, then applies them in memory: the
    /// events own the job records, and they move into the host's state after the
    /// announcement instead of being copied for it (a copy and a drop of every placed
    /// job's grants cost 12 % of a pass).
    fn commit_pass(&mut self, mut batch: Batch, placed: Vec<PlacedJob>) {
        let announced = self.job_events(placed);
        // The services' revisions are persisted with the batch that raised them.
        for key in announced
            .touched
            .iter()
            .filter(|k| self.services.contains_key(*k))
        {
            batch.service(&self.services[key].info);
        }
        self.publish(batch, &announced.events);
        self.apply_placed(announced.events, announced.homes);
    }

    /// One event per placed job, each with the next revision, which its service takes.
    fn job_events(&mut self, placed: Vec<PlacedJob>) -> JobEvents {
        let mut touched = BTreeSet::new();
        let mut events = Vec::with_capacity(placed.len());
        let mut homes = Vec::with_capacity(placed.len());
        // A pass places runs of one service's replicas: the key (two strings) is built and
        // looked up once per run, not per job (per job it was a tenth of a pass).
        let mut last: Option<ServiceKey> = None;
        for PlacedJob { n, host, info } in placed {
            let rev = self.store.next_rev();
            let same = last
                .as_ref()
                .is_some_and(|k| k.name == info.service && k.project == info.project);
            if !same {
                if let Some(k) = last.take() {
                    touched.insert(k);
                }
                last = Some(info.service_key());
            }
            let key = last.as_ref().expect("set above");
            if let Some(s) = self.services.get_mut(key) {
                s.info.rev = rev;
            }
            homes.push((n, host));
            events.push(ClusterEvent::Job { rev, job: info });
        }
        touched.extend(last);
        JobEvents {
            events,
            homes,
            touched,
        }
    }

    /// Moves the announced jobs into the services' slots, their hosts and the job table.
    fn apply_placed(&mut self, events: Vec<ClusterEvent>, homes: Vec<(u64, u32)>) {
        // Runs of one service again: its record is looked up once per run, not per job.
        let mut svc: Option<&mut ServiceRec> = None;
        for (event, (n, h)) in events.into_iter().zip(homes) {
            let ClusterEvent::Job { job: info, .. } = event else {
                unreachable!("a pass announces job events only")
            };
            let same = svc
                .as_ref()
                .is_some_and(|s| s.info.name == info.service && s.info.project == info.project);
            if !same {
                svc = self.services.get_mut(&info.service_key());
            }
            let s = svc.as_mut().expect("placed for a known service");
            s.slots[info.replica as usize].push(n);
            self.hosts[h as usize].jobs.insert(n);
            self.jobs.insert(n, JobRec { info, host: h });
        }
    }

    fn pending_again(&mut self, key: ServiceKey, slot: u32) {
        self.pending.push((key, slot));
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// What one scheduling pass gathers before it commits.
#[derive(Default)]
struct Pass {
    /// The placed jobs' records, committed together.
    batch: Batch,
    /// The placed jobs, in placement order.
    placed: Vec<PlacedJob>,
    /// What the pass reports.
    out: Vec<Outcome>,
}

/// A job a pass placed, not yet committed.
struct PlacedJob {
    /// Its number (`j-<n>`).
    n: u64,
    host: u32,
    info: JobInfo,
}

/// A pass's placements as announced.
struct JobEvents {
    /// One `ClusterEvent::Job` per placed job, in placement order.
    events: Vec<ClusterEvent>,
    /// Each event's job number and host.
    homes: Vec<(u64, u32)>,
    /// The services whose revision the events raised.
    touched: BTreeSet<ServiceKey>,
}

/// What picking a host and reserving on it need of the cluster, borrowed field by field.
struct Placer<'a> {
    plugins: &'a mut [Box<dyn ResourcePlugin>],
    hosts: &'a [HostRec],
    sched: &'a mut Scheduler,
    phases: &'a mut Phases,
}

impl Placer<'_> {
    /// Picks a host every plugin fits the replica on, and reserves there; `None` when no
    /// host fits or a reservation failed (nothing is then held).
    fn pick_and_reserve(&mut self, reqs: &[PlacementRequest<'_>]) -> Option<(u32, Grants)> {
        let at = Instant::now();
        let (plugins, hosts) = (&*self.plugins, self.hosts);
        let picked = self.sched.pick(|h| {
            let id = &hosts[h as usize].info.id;
            plugins.iter().zip(reqs).all(|(p, r)| p.fits(id, r).is_ok())
        });
        self.phases.pick += at.elapsed();
        let h = picked?;
        let at = Instant::now();
        let grants = reserve_all(self.plugins, &self.hosts[h as usize].info.id, reqs);
        self.phases.reserve += at.elapsed();
        Some((h, grants?))
    }
}

/// Each plugin's placement request for replica `slot` of `key` as job `job`.
fn placement_requests<'a>(
    key: &'a ServiceKey,
    slot: u32,
    job: &'a str,
    sections: &'a [Option<serde_json::Value>],
) -> Vec<PlacementRequest<'a>> {
    sections
        .iter()
        .map(|section| PlacementRequest {
            service: &key.name,
            project: &key.project,
            replica: slot,
            job,
            section: section.as_ref(),
        })
        .collect()
}

/// The number in a job id `j-17`.
fn job_number(job: &str) -> u64 {
    job.strip_prefix("j-")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a sim job id: {job}"))
}
