//! How a [`Txn`] becomes the state: persisted as one store batch first, then applied in
//! memory; its events are logged and counted, start the restart backoffs and the
//! in-memory clocks they imply, and are queued for the listeners; then the plugin calls
//! it made due (releases, launch refusals).

use super::{blocking, Core, CoreError, RestartBackoff};
use plugin_api::{ClusterEvent, EndReason, JobInfo, JobState, ResourcePlugin, ServiceKey};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};
use xce_model::{After, ServiceState, Txn};
use xce_proto::profile::{self};
use xce_store::{BatchLimit, StoreError};

/// First restart delay of a crash-looping replica; doubled per exit up to the cap.
const BACKOFF_MIN: Duration = Duration::from_secs(1);

const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A replica that ran this long starts over at [`BACKOFF_MIN`].
const BACKOFF_RESET: Duration = Duration::from_secs(60);

/// How long timers wait after a failed commit before trying again.
const STORE_RETRY: Duration = Duration::from_secs(1);

/// What is left of the store's [`BatchLimit`] while a transaction is built: big changes
/// (placing, draining or stopping thousands of replicas) are cut into batches within it,
/// each committed on its own (atomic), the next one continuing where it stopped.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    limit: BatchLimit,
    /// Estimated key and value bytes so far (records and their events).
    bytes: usize,
}

/// Room kept for what a batch adds besides its jobs: `meta/rev`, `meta/next_job`,
/// `meta/events` and a service record, and their bytes' share not counted per job.
const RESERVE_OPS: usize = 4;
const RESERVE_BYTES: usize = 4096;

impl Budget {
    pub(super) fn new(limit: BatchLimit) -> Self {
        Budget { limit, bytes: 0 }
    }

    /// Counts a record of `bytes` written by the transaction: its value, and its event
    /// in `meta/events`, about as big.
    pub(super) fn add(&mut self, bytes: usize) {
        self.bytes += 2 * bytes + 32;
    }

    /// Takes back an [`add`](Self::add) of a record the transaction did not write after all.
    pub(super) fn remove(&mut self, bytes: usize) {
        self.bytes = self.bytes.saturating_sub(2 * bytes + 32);
    }

    /// Whether `txn` may take one more record of about `next` bytes.
    pub(super) fn room(&self, txn: &Txn, next: usize) -> bool {
        txn.ops() + 1 + RESERVE_OPS <= self.limit.ops
            && self.bytes + 2 * next + 32 + RESERVE_BYTES <= self.limit.bytes
    }
}

/// The length of `v` as JSON, without building it.
pub(super) fn encoded_len<T: serde::Serialize>(v: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    serde_json::to_writer(&mut c, v).expect("records serialize to JSON");
    c.0
}

impl Core {
    /// Persists, applies, announces, then makes the plugin calls due.
    pub(super) fn commit(&mut self, txn: Txn, now: Instant) -> Result<(), CoreError> {
        if txn.is_empty() {
            return Ok(());
        }
        let batch = txn.batch_for(self.store.journals_events());
        let limit = self.store.batch_limit();
        if !limit.admits(&batch) {
            // Only changes the controller does not cut (a worker's report, a host lost)
            // get here; the store still commits them (etcd: as a journal).
            warn!(
                ops = batch.ops.len(),
                bytes = batch.bytes(),
                limit_ops = limit.ops,
                limit_bytes = limit.bytes,
                "a store batch is above the store's batch limit"
            );
        }
        if let Err(e) = blocking(|| self.store.commit(batch)) {
            error!(error = %e, "store commit failed; change not applied");
            // A stale view, or a store that cannot write (a full disk: redb then refuses
            // every later write until reopened): stop, so a supervisor or a standby takes
            // over with a fresh one, instead of running on, refusing every change while
            // looking healthy.
            if matches!(e, StoreError::Stale(_) | StoreError::Io { .. }) {
                self.fatal.get_or_insert_with(|| e.to_string());
            }
            self.store_retry = Some(now + STORE_RETRY);
            return Err(e.into());
        }
        self.store_retry = None;
        self.parts.touch(&txn, &self.cluster);
        self.note_assign(&txn);
        self.note_kept(&txn);
        self.touch_sched(&txn, now);
        let (events, after) = txn.apply(&mut self.cluster);
        self.dirty = true;
        let mut changed = JobsChanged::default();
        for e in &events {
            log_committed(e);
            self.count_committed(e);
            // Before `keep_in_memory`: it reads how long an ended job ran.
            self.back_off_restart(e, now);
            self.keep_in_memory(e, now);
            changed.add(e);
        }
        changed.log(self.cluster.rev);
        self.planted_early_release(&events);
        self.outbox.extend(events);
        for a in after {
            match a {
                After::Refused {
                    host,
                    job,
                    plugin,
                    detail,
                } => {
                    if let Some(p) = self.plugins.iter_mut().find(|p| p.name() == plugin) {
                        p.launch_refused(&host, &job, &detail);
                    }
                }
                After::Release { host, job } => {
                    for p in &mut self.plugins {
                        p.release(&host, &job);
                    }
                }
            }
        }
        Ok(())
    }

    /// Counts a committed event in the metrics: a removed service's counters go, and a
    /// replica of an active service that ended by itself (the ends `record_end` counted)
    /// is a restart.
    fn count_committed(&self, e: &ClusterEvent) {
        match e {
            ClusterEvent::ServiceRemoved { name, project, .. } => {
                self.metrics.service_removed(project, name)
            }
            ClusterEvent::JobEnded { job, reason, .. } => {
                let by_itself =
                    matches!(reason, EndReason::Exited { .. } | EndReason::Refused { .. });
                if by_itself && self.is_active(&job.service_key()) {
                    self.metrics.replica_restarted(&job.project, &job.service);
                }
            }
            ClusterEvent::Service { .. } | ClusterEvent::Job { .. } | ClusterEvent::Host { .. } => {
            }
        }
    }

    /// Decides the restart backoff of a replica whose job exited by itself while its
    /// service is active: the slot's delay doubles from [`BACKOFF_MIN`] up to
    /// [`BACKOFF_MAX`], and starts over once the job had run for [`BACKOFF_RESET`] or was
    /// of another generation than the exits before it. Other
    /// events change no backoff. Reads when the job started running, so it comes before
    /// [`keep_in_memory`](Self::keep_in_memory) forgets that.
    fn back_off_restart(&mut self, e: &ClusterEvent, now: Instant) {
        let ClusterEvent::JobEnded {
            job,
            reason: EndReason::Exited { .. },
            ..
        } = e
        else {
            return;
        };
        if !self.is_active(&job.service_key()) {
            return;
        }
        let key = (job.service_key(), job.replica);
        let ran_long = self
            .running_since
            .get(&job.job)
            .is_some_and(|t| now.duration_since(*t) >= BACKOFF_RESET);
        let mut pauses = match self.backoff.get(&key) {
            Some(b) if !ran_long && b.generation == job.generation => b.pauses,
            _ => retry_backoff::Backoff::new(BACKOFF_MIN, BACKOFF_MAX),
        };
        let delay = pauses.next_pause();
        info!(service = %job.service, replica = job.replica, delay = ?delay, "replica exited; restarting after backoff");
        self.backoff.insert(
            key,
            RestartBackoff {
                pauses,
                not_before: now + delay,
                generation: job.generation,
                over: false,
            },
        );
    }

    /// Keeps the in-memory state (never persisted) that a committed event changes: what
    /// the core kept of a removed service goes; a job's clocks (running since, ready
    /// since, drain until) start with its state and end with it.
    fn keep_in_memory(&mut self, e: &ClusterEvent, now: Instant) {
        match e {
            ClusterEvent::ServiceRemoved { name, project, .. } => {
                self.forget_service(&ServiceKey::new(project, name))
            }
            ClusterEvent::Job { job, rev } => self.keep_job_clocks(job, *rev, now),
            ClusterEvent::JobEnded { job, .. } => {
                self.notes.ended(&job.job);
                self.running_since.remove(&job.job);
                self.ready_since.remove(&job.job);
                self.drain_until.remove(&job.job);
                self.acks.forget(&job.job);
            }
            ClusterEvent::Service { .. } | ClusterEvent::Host { .. } => {}
        }
    }

    /// Drops what the core keeps of a removed service besides its records.
    fn forget_service(&mut self, key: &ServiceKey) {
        self.profiles.remove(key);
        self.kept.remove(key);
        self.pending.remove(key);
        self.progress.remove(key);
        self.older.retain(|(k, _), _| k != key);
        self.backoff.retain(|(s, _), _| s != key);
    }

    /// A live job's clocks after a committed change: when it started running and when
    /// it became ready (the first time only: kept while it stays so), and when its drain
    /// ends (from the drain's start).
    /// `rev`: the event's revision (for a drain, the one that took the job out of the
    /// endpoint, which the separate apiservers must apply before its SIGTERM).
    fn keep_job_clocks(&mut self, job: &JobInfo, rev: u64, now: Instant) {
        // Keyed by the model's own id (a job ended later in the same batch is gone from
        // it, and its `JobEnded` clears the rest).
        let id = self.cluster.job_key(&job.job);
        if let (JobState::Running, Some(id)) = (job.state, id) {
            self.running_since.keep_first(id, now);
        }
        match id {
            Some(id) if job.ready => {
                self.notes.ready(id);
                self.ready_since.keep_first(id, now)
            }
            _ => _ = self.ready_since.remove(&job.job),
        }
        let draining = self
            .cluster
            .jobs
            .get(job.job.as_str())
            .is_some_and(|j| j.effective_state() == JobState::Draining);
        if draining {
            let drain = self
                .profiles
                .get(&job.service_key())
                .map_or(profile::DEFAULT_DRAIN, |p| p.drain);
            self.drain_until
                .entry(job.job.clone())
                .or_insert(now + drain);
            self.acks.removed(&job.job, rev, now);
        } else {
            self.drain_until.remove(&job.job);
            self.acks.forget(&job.job);
        }
    }

    /// Test-only planted bug (debug builds): a replica's ports go back to the pool when it
    /// is told to stop, one commit before it has exited.
    fn planted_early_release(&mut self, events: &[ClusterEvent]) {
        if !plugin_api::planted_bug("port-released-early") {
            return;
        }
        for e in events {
            if let ClusterEvent::Job { job, .. } = e {
                if job.state == JobState::Stopping {
                    for p in &mut self.plugins {
                        p.release(&job.host, &job.job);
                    }
                }
            }
        }
    }

    /// Whether the service is there and active (not stopping).
    fn is_active(&self, key: &ServiceKey) -> bool {
        self.cluster
            .services
            .get(key)
            .is_some_and(|s| s.state == ServiceState::Active)
    }
}

/// Logs a committed event: services, hosts and job ends at info, each job change at
/// debug (placing 50,000 replicas wrote 100,000 of these lines, 7 % of the controller's
/// CPU in a profile; a batch's [`JobsChanged`] summary is at info).
fn log_committed(e: &ClusterEvent) {
    match e {
        ClusterEvent::Service { rev, service } => {
            info!(service = %service.name, project = %service.project, rev, "service changed")
        }
        ClusterEvent::ServiceRemoved { rev, name, project } => {
            info!(service = %name, project = %project, rev, "service removed")
        }
        ClusterEvent::Job { rev, job } => {
            debug!(service = %job.service, job = %job.job, host = %job.host, replica = job.replica, state = %job.state, ready = job.ready, rev, "job changed")
        }
        ClusterEvent::JobEnded { rev, job, reason } => {
            info!(service = %job.service, job = %job.job, host = %job.host, replica = job.replica, reason = %reason, rev, "job ended")
        }
        ClusterEvent::Host { rev, host, .. } => {
            info!(host = %host.id, state = %host.state, ip_addr = %display_ip(host.facts.ip_addr), rev, "host changed")
        }
    }
}

/// One log line at info for the job changes of a committed batch (each change is a
/// `job changed` line at debug): how many, by state, and the services they belong to.
#[derive(Debug, Default)]
struct JobsChanged {
    jobs: usize,
    /// By state, in [`JobState`]'s order of first appearance.
    states: Vec<(JobState, usize)>,
    ready: usize,
    /// Distinct services, in order of first appearance (a batch's jobs come by service).
    services: Vec<(String, String)>,
}

/// The services a [`JobsChanged`] line names; the rest are counted.
const SERVICES_NAMED: usize = 4;

impl JobsChanged {
    fn add(&mut self, e: &ClusterEvent) {
        let ClusterEvent::Job { job, .. } = e else {
            return;
        };
        self.jobs += 1;
        self.ready += usize::from(job.ready);
        match self.states.iter_mut().find(|(s, _)| *s == job.state) {
            Some((_, n)) => *n += 1,
            None => self.states.push((job.state, 1)),
        }
        let known = self
            .services
            .iter()
            .rev()
            .any(|(p, s)| *s == job.service && *p == job.project);
        if !known {
            self.services
                .push((job.project.clone(), job.service.clone()));
        }
    }

    /// `placed=3 running=2 ready=2`, the states in order of first appearance.
    fn counts(&self) -> String {
        let mut out = String::new();
        for (state, n) in &self.states {
            out.push_str(&format!("{state}={n} "));
        }
        out.push_str(&format!("ready={}", self.ready));
        out
    }

    /// `team-a/web team-a/api`, at most [`SERVICES_NAMED`], then `+N more`.
    fn service_list(&self) -> String {
        let mut names: Vec<String> = self
            .services
            .iter()
            .take(SERVICES_NAMED)
            .map(|(p, s)| format!("{p}/{s}"))
            .collect();
        if self.services.len() > SERVICES_NAMED {
            names.push(format!("+{} more", self.services.len() - SERVICES_NAMED));
        }
        names.join(" ")
    }

    /// `counts="placed=3 ready=0" services="team-a/web team-a/api"`: quoted (`Debug`), so
    /// the spaces inside stay inside one field.
    fn log(&self, rev: u64) {
        if self.jobs > 0 {
            info!(rev, jobs = self.jobs, counts = ?self.counts(), services = ?self.service_list(), "jobs changed");
        }
    }
}

/// An optional address for a log line: the address, or `none`.
fn display_ip(ip: Option<std::net::IpAddr>) -> String {
    ip.map_or_else(|| "none".to_owned(), |ip| ip.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::JobInfo;

    fn job(project: &str, service: &str, id: &str, state: &str, ready: bool) -> ClusterEvent {
        let job: JobInfo = serde_json::from_value(serde_json::json!({
            "job": id, "service": service, "project": project, "replica": 0,
            "host": "exec-01", "state": state, "ready": ready, "grants": {},
        }))
        .expect("a job info");
        ClusterEvent::Job { rev: 1, job }
    }

    /// The summary counts jobs by state and names each service once, the first few only.
    #[test]
    fn jobs_changed_counts_by_state_and_names_services_once() {
        let mut c = JobsChanged::default();
        c.add(&job("a", "web", "j-1", "placed", false));
        c.add(&job("a", "web", "j-2", "placed", false));
        c.add(&job("a", "web", "j-3", "running", true));
        c.add(&job("b", "web", "j-4", "running", true));
        c.add(&job("a", "api", "j-5", "draining", false));
        c.add(&job("a", "web", "j-6", "running", false));
        assert_eq!(c.jobs, 6);
        assert_eq!(c.counts(), "placed=2 running=3 draining=1 ready=2");
        assert_eq!(c.service_list(), "a/web b/web a/api");
        for (i, s) in ["x", "y", "z"].iter().enumerate() {
            c.add(&job("c", s, &format!("k-{i}"), "placed", false));
        }
        assert_eq!(c.service_list(), "a/web b/web a/api c/x +2 more");
        // Not a job change: not counted.
        c.add(&ClusterEvent::ServiceRemoved {
            rev: 2,
            name: "web".into(),
            project: "a".into(),
        });
        assert_eq!(c.jobs, 9);
    }
}
