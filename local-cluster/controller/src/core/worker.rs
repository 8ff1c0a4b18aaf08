//! The worker protocol (`/internal/v1`, `xce_proto::worker`): registration, heartbeats, host
//! facts, job events and the assignments watch. Only this cluster's worker instance that
//! holds a host is heard for it (`check_holder`); a registration reconciles what the
//! worker runs with what the controller stored.

use super::report::Report;
use super::{Core, CoreError, HostAssignments};
use plugin_api::{
    EndReason, HostFacts, HostId, HostInfo, HostState, JobId, JobState, LaunchRefusal,
    ResourcePlugin,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use xce_model::rollout;
use xce_model::slots::LastExit;
use xce_model::{After, HostRec, JobRec, ServiceState, Txn};
use xce_proto::worker::{
    Caller, ExitCause, Heartbeat, HeartbeatAnswer, RegisterRequest, RegisterResponse, RunningJob,
    WorkerEvent,
};

impl Core {
    /// The host's desired-set watch, for the worker instance that holds the host.
    pub(crate) fn assignments(
        &mut self,
        host: &HostId,
        caller: &Caller,
    ) -> Result<watch::Receiver<Arc<HostAssignments>>, CoreError> {
        self.check_holder(host, caller, "assignments query")?;
        self.check_registered_since_restore(host)?;
        // Every publish keeps the set current; a host gets its first at the publish
        // after its registration.
        if !self.assign.contains_key(host) {
            self.publish_host(host);
        }
        self.assign
            .get(host)
            .map(|tx| tx.subscribe())
            .ok_or_else(|| CoreError::UnknownHost(host.clone()))
    }

    fn check_facts(&self, host: &HostId, facts: &HostFacts) -> Result<(), CoreError> {
        // One live host per advertised address: a worker credential must not be able to
        // send another host's endpoint traffic to itself (or anyone's to it).
        if let Some(ip) = facts.ip_addr {
            let other = self.cluster.hosts.values().find(|h| {
                h.info.id != *host
                    && h.info.state != HostState::Lost
                    && h.info.facts.ip_addr == Some(ip)
            });
            if let Some(other) = other {
                warn!(host = %host, ip_addr = %ip, advertised_by = %other.info.id, "host facts refused: the address is another live host's");
                return Err(CoreError::AddressTaken {
                    ip: ip.to_string(),
                    other: other.info.id.clone(),
                });
            }
        }
        let mut problems = Vec::new();
        for p in &self.policies {
            if let Err(mut e) = p.check(host, facts) {
                problems.append(&mut e);
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            let list: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
            warn!(host = %host, problems = %list.join("; "), "host facts refused");
            Err(CoreError::FactsRefused(problems))
        }
    }

    fn host_up(&mut self, host: &HostId, facts: &HostFacts) {
        for p in &mut self.plugins {
            if let Err(e) = p.host_up(host, facts) {
                warn!(host = %host, plugin = p.name(), reason = %e, "plugin cannot use the host's facts");
            }
        }
    }

    /// A worker of another cluster is refused before anything else.
    fn check_cluster(&self, host: &HostId, caller: &Caller, what: &str) -> Result<(), CoreError> {
        match &caller.cluster {
            Some(theirs) if *theirs != self.cluster_id => {
                warn!(host = %host, cluster = %self.cluster_id, worker_cluster = %theirs, instance = %caller.instance_or_none(), peer = %caller.peer.as_deref().unwrap_or("unknown"), "{what} refused: the worker belongs to another cluster (pointed at the wrong controller?)");
                Err(CoreError::WrongCluster {
                    ours: self.cluster_id.clone(),
                    theirs: theirs.clone(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Heartbeats, facts, events and assignment queries: only from this cluster's worker
    /// that holds the host. A host held by a session hears only calls that prove it
    /// ([`session_refusal`]); one held without a session (an older worker) only its
    /// holder instance; one held by no known instance (a record from before instance
    /// ids) any.
    pub(super) fn check_holder(
        &self,
        host: &HostId,
        caller: &Caller,
        what: &str,
    ) -> Result<(), CoreError> {
        self.check_cluster(host, caller, what)?;
        let Some(h) = self.cluster.hosts.get(host) else {
            return Err(CoreError::UnknownHost(host.clone()));
        };
        let refused = match (&h.session_sha256, &h.instance) {
            (Some(stored), holder) => session_refusal(host, stored, holder.as_deref(), caller),
            (None, Some(holder)) if caller.instance.as_ref() != Some(holder) => {
                Some(CoreError::HostTaken {
                    host: host.clone(),
                    free_after: self.timing.unreachable_after,
                })
            }
            (None, _) => None,
        };
        let Some(e) = refused else {
            return Ok(());
        };
        let peer = caller.peer.as_deref().unwrap_or("unknown");
        if let CoreError::HostTaken { .. } = e {
            // Debug only: a refused duplicate repeats these every second; its
            // registration attempts are the warnings.
            debug!(host = %host, instance = %caller.instance_or_none(), peer = %peer, "{what} refused: another worker instance holds the host");
        } else {
            let reason = if caller.session.is_some() {
                "session_invalid"
            } else {
                "session_required"
            };
            self.metrics.worker_call_refused(reason);
            warn!(host = %host, instance = %caller.instance_or_none(), peer = %peer, reason, "{what} refused: the caller has the host's credential but not its worker session (a stolen credential, or a worker whose host was taken over)");
        }
        Err(e)
    }

    /// Whether the host's holder is live: `ready` and heard from within
    /// `unreachable_after` (every host gets a fresh window when the controller loads).
    fn holder_live(&self, h: &HostRec, now: Instant) -> bool {
        h.info.state == HostState::Ready
            && self
                .heard
                .get(&h.info.id)
                .is_some_and(|t| now.saturating_duration_since(*t) < self.timing.unreachable_after)
    }

    /// A worker (re)registers: the holder proving its session, or a new session once the
    /// holder is gone (unreachable or lost). A registration that does not prove the live
    /// holder's session is refused before anything is applied: no facts, no plugin call,
    /// nothing committed.
    pub(crate) fn register(
        &mut self,
        host: &HostId,
        caller: &Caller,
        req: RegisterRequest,
        now: Instant,
    ) -> Result<RegisterResponse, CoreError> {
        let proven = self.admit_registration(host, caller, now)?;
        self.check_facts(host, &req.facts)?;
        let kept = proven.is_some();
        let (session, session_sha256) = match (proven, req.wants_session) {
            (Some(kept), _) => (None, Some(kept)),
            (None, true) => {
                let secret = xce_proto::worker::new_session_secret()?;
                let hash = xce_proto::worker::sha256_hex(secret.as_bytes());
                (Some(secret), Some(hash))
            }
            (None, false) => (None, None),
        };
        self.host_up(host, &req.facts);
        let mut txn = Txn::new(&self.cluster);
        let running: BTreeMap<&JobId, bool> =
            req.running.iter().map(|r| (&r.job, r.ready)).collect();
        for j in self.cluster.jobs_on(host).cloned().collect::<Vec<_>>() {
            match running.get(&j.info.job) {
                Some(&ready) => self.still_running(&mut txn, j, ready),
                None => self.not_running(&mut txn, j),
            }
        }
        let orphans = self.orphans(host, &req.running);
        let mut record = self.registered_host(&txn, host, caller, req.facts, orphans);
        record.session_sha256 = session_sha256;
        txn.put_host(&self.cluster, record);
        let last_after_restore = self.reregister.len() == 1 && self.reregister.contains(host);
        if self.cluster.restored && (self.reregister.is_empty() || last_after_restore) {
            txn.clear_restored();
        }
        self.commit(txn, now)?;
        if self.reregister.remove(host) {
            info!(host = %host, left = self.reregister.len(), "host registered again after the restore; its jobs are reconciled");
        }
        self.heard.insert(host.clone(), now);
        self.withheld.remove(host);
        let how = match (&session, kept) {
            (_, true) => "kept",
            (Some(_), _) => "new",
            (None, _) => "none (the worker wants none)",
        };
        info!(host = %host, instance = %caller.instance_or_none(), session = how, "host registered");
        Ok(RegisterResponse {
            heartbeat_ms: self.timing.heartbeat_interval.as_millis() as u64,
            cluster: Some(self.cluster_id.clone()),
            session,
        })
    }

    /// A store just restored lists the jobs that ran at the backup: until its worker
    /// registered again (reporting what runs now), a host's heartbeats and assignment
    /// queries are answered "unknown host", which makes the worker register.
    fn check_registered_since_restore(&self, host: &HostId) -> Result<(), CoreError> {
        if self.reregister.contains(host) {
            debug!(host = %host, "the store was restored; the worker must register again");
            return Err(CoreError::UnknownHost(host.clone()));
        }
        Ok(())
    }

    /// After loading a restored store: every host not lost must register again (see
    /// [`Core::check_registered_since_restore`]).
    pub(crate) fn after_restore(&mut self) {
        if !self.cluster.restored {
            return;
        }
        self.reregister = self
            .cluster
            .hosts
            .values()
            .filter(|h| h.info.state != HostState::Lost)
            .map(|h| h.info.id.clone())
            .collect();
        warn!(hosts = self.reregister.len(), "the store was restored from a backup: every worker registers again and reports what it runs; jobs no worker runs are replaced, replicas the store does not know are drained and stopped");
    }

    /// Refuses (counted and logged) a registration by a worker of another cluster, or
    /// one that does not prove the live holder's session (or, for a host held without a
    /// session, comes from another instance than the live holder); logs a takeover from
    /// a holder that is gone. `Some(hash)`: the caller proved the host's session, kept.
    fn admit_registration(
        &self,
        host: &HostId,
        caller: &Caller,
        now: Instant,
    ) -> Result<Option<String>, CoreError> {
        if let Err(e) = self.check_cluster(host, caller, "registration") {
            self.metrics.registration_refused("wrong_cluster");
            return Err(e);
        }
        let Some(h) = self.cluster.hosts.get(host) else {
            return Ok(None);
        };
        if let Some(stored) = &h.session_sha256 {
            if session_refusal(host, stored, h.instance.as_deref(), caller).is_none() {
                return Ok(Some(stored.clone()));
            }
        } else if h.instance.is_none() || h.instance == caller.instance {
            // Held without a session by this very instance (or by none known).
            return Ok(None);
        }
        let holder = h.instance.as_deref().unwrap_or("none");
        let peer = caller.peer.as_deref().unwrap_or("unknown");
        let presented = if caller.session.is_some() {
            "wrong"
        } else {
            "none"
        };
        if self.holder_live(h, now) {
            warn!(host = %host, holder = %holder, instance = %caller.instance_or_none(), session = presented, peer = %peer, "registration refused: another live worker instance holds the host (a second worker with the same host id, or the host's credential without its session)");
            self.metrics.registration_refused("host_taken");
            return Err(CoreError::HostTaken {
                host: host.clone(),
                free_after: self.timing.unreachable_after,
            });
        }
        warn!(host = %host, previous = %holder, instance = %caller.instance_or_none(), peer = %peer, "a worker takes the host over with a new session (its previous worker is gone)");
        Ok(None)
    }

    /// A stored job the registering worker runs (`ready` as it last probed): heard again
    /// (nothing held for it any more), running if it was only placed.
    fn still_running(&self, txn: &mut Txn, mut j: JobRec, ready: bool) {
        let before = j.clone();
        j.held = None;
        j.held_ready = None;
        j.info.state = match before.effective_state() {
            JobState::Placed => JobState::Running,
            s => s,
        };
        if j.info.state == JobState::Running {
            j.info.ready = ready;
        }
        if j != before {
            txn.put_job(&self.cluster, j);
        }
    }

    /// A stored job the registering worker does not run: one that ran ended (how, is
    /// unknown: its worker lost its data dir, or it ended while no worker watched), one
    /// on its way out is stopped, one only placed stays for the worker to start it.
    fn not_running(&self, txn: &mut Txn, mut j: JobRec) {
        match j.effective_state() {
            JobState::Running => {
                self.record_end(txn, &j, ExitCause::default(), None);
                txn.end_job(&self.cluster, j, EndReason::Exited { code: None })
            }
            JobState::Stopping | JobState::Draining => {
                txn.end_job(&self.cluster, j, EndReason::Stopped)
            }
            eff => {
                // Placed: not started yet; the worker starts it from its assignments.
                if j.info.state == JobState::Unknown {
                    j.info.state = eff;
                    j.held = None;
                    j.held_ready = None;
                    txn.put_job(&self.cluster, j);
                }
            }
        }
    }

    /// The jobs the worker of `host` runs that the controller does not know there
    /// (logged): the host takes no placements until they exited.
    fn orphans(&self, host: &HostId, running: &[RunningJob]) -> BTreeSet<JobId> {
        let orphans: BTreeSet<JobId> = running
            .iter()
            .filter(|r| {
                self.cluster
                    .jobs
                    .get(r.job.as_str())
                    .is_none_or(|j| j.info.host != *host)
            })
            .map(|r| r.job.clone())
            .collect();
        if !orphans.is_empty() {
            warn!(host = %host, orphans = ?orphans, "worker runs jobs the controller does not know; no placements there until they exited");
        }
        orphans
    }

    /// The record of a host just registered: ready with its new facts, held by the
    /// caller's instance, its released grants kept.
    fn registered_host(
        &self,
        txn: &Txn,
        host: &HostId,
        caller: &Caller,
        facts: HostFacts,
        orphans: BTreeSet<JobId>,
    ) -> HostRec {
        let prev = txn.host(&self.cluster, host);
        let maintenance = self.registered_maintenance(prev.as_ref());
        let released = prev.map(|h| h.released).unwrap_or_default();
        HostRec {
            info: HostInfo {
                id: host.clone(),
                state: HostState::Ready,
                facts,
            },
            orphans,
            released,
            instance: caller.instance.clone(),
            session_sha256: None,
            maintenance,
        }
    }

    /// Whether a heartbeat from `host` would commit (it brings an unreachable host back);
    /// otherwise it only notes that the host was heard.
    pub(crate) fn heartbeat_writes(&self, host: &HostId) -> bool {
        self.cluster
            .hosts
            .get(host)
            .is_some_and(|h| h.info.state == HostState::Unreachable)
    }

    /// A heartbeat: the host is heard. With `beat` (the worker's digests; required from
    /// a host held by a session), the answer says what the controller holds that differs
    /// from it, if anything ([`Self::compare_digests`]).
    pub(crate) fn heartbeat(
        &mut self,
        host: &HostId,
        caller: &Caller,
        beat: Option<&Heartbeat>,
        now: Instant,
    ) -> Result<Option<HeartbeatAnswer>, CoreError> {
        self.check_holder(host, caller, "heartbeat")?;
        self.check_registered_since_restore(host)?;
        let Some(h) = self.cluster.hosts.get(host).cloned() else {
            return Err(CoreError::UnknownHost(host.clone()));
        };
        if h.session_sha256.is_some() && beat.is_none() {
            return Err(CoreError::DigestRequired);
        }
        match h.info.state {
            // A lost host's jobs are gone: it must register again to report what runs.
            HostState::Lost => return Err(CoreError::UnknownHost(host.clone())),
            HostState::Ready => {}
            HostState::Unreachable => self.reachable_again(host, h, now)?,
        }
        self.heard.insert(host.clone(), now);
        Ok(beat.and_then(|b| self.compare_digests(host, b)))
    }

    /// An unreachable host is heard again: its jobs are back as they were.
    fn reachable_again(
        &mut self,
        host: &HostId,
        mut h: HostRec,
        now: Instant,
    ) -> Result<(), CoreError> {
        let mut txn = Txn::new(&self.cluster);
        for mut j in self.cluster.jobs_on(host).cloned().collect::<Vec<_>>() {
            if j.info.state == JobState::Unknown {
                j.info.state = j.effective_state();
                j.held = None;
                // Back in the endpoints if a full disruption took it out.
                if let Some(ready) = j.held_ready.take() {
                    j.info.ready = ready;
                }
                txn.put_job(&self.cluster, j);
            }
        }
        h.info.state = HostState::Ready;
        txn.put_host(&self.cluster, h);
        self.commit(txn, now)?;
        self.withheld.remove(host);
        info!(host = %host, "host reachable again");
        Ok(())
    }

    /// The digest rule: `None` when the worker's digests are those of what the controller
    /// holds (the host's facts; the readiness of every job it has running there, see
    /// [`Self::held_readiness`]); otherwise the parts that differ, counted, with the
    /// readiness the controller holds so the worker re-sends exactly what differs. A
    /// difference is either a forged report (undone by the worker's re-send) or a report
    /// still on its way (a start, an exit, a transition), which the re-send leaves alone.
    pub(crate) fn compare_digests(
        &self,
        host: &HostId,
        beat: &Heartbeat,
    ) -> Option<HeartbeatAnswer> {
        let h = self.cluster.hosts.get(host)?;
        let facts_differ = xce_proto::worker::facts_digest(&h.info.facts) != beat.facts;
        let held = self.held_readiness(host);
        let ready_differs =
            xce_proto::worker::ready_digest(held.iter().map(|(j, r)| (j.as_str(), *r)))
                != beat.ready;
        // The worker's assignments query missed a change (its connection died in a
        // partition, and the query waits on it): told, it asks again at once.
        let current = self.assign.get(host).map(|tx| tx.borrow().index);
        let assignments = match (beat.assignments, current) {
            (Some(theirs), Some(ours)) if theirs != ours => Some(ours),
            _ => None,
        };
        if let Some(ours) = assignments {
            self.metrics.digest_mismatch("assignments");
            debug!(host = %host, worker_index = ?beat.assignments, index = ours, "the worker holds other assignments than the host's; it asks again");
        }
        if !facts_differ && !ready_differs {
            return assignments.map(|a| HeartbeatAnswer {
                assignments: Some(a),
                ..HeartbeatAnswer::default()
            });
        }
        for (part, differs) in [("facts", facts_differ), ("readiness", ready_differs)] {
            if differs {
                self.metrics.digest_mismatch(part);
            }
        }
        debug!(host = %host, facts_differ, ready_differs, "heartbeat digest differs from what the controller holds; the worker reports again");
        Some(HeartbeatAnswer {
            facts_differ,
            ready: ready_differs.then_some(held),
            assignments,
        })
    }

    /// The readiness the controller holds of each job running on `host` (as the worker
    /// last reported it, also while a full disruption holds it out of the endpoints).
    pub(crate) fn held_readiness(&self, host: &HostId) -> BTreeMap<JobId, bool> {
        self.cluster
            .jobs_on(host)
            .filter(|j| j.effective_state() == JobState::Running)
            .map(|j| (j.info.job.clone(), j.held_ready.unwrap_or(j.info.ready)))
            .collect()
    }

    pub(crate) fn facts(
        &mut self,
        host: &HostId,
        caller: &Caller,
        facts: HostFacts,
        now: Instant,
    ) -> Result<(), CoreError> {
        self.check_holder(host, caller, "facts report")?;
        let Some(mut h) = self.cluster.hosts.get(host).cloned() else {
            return Err(CoreError::UnknownHost(host.clone()));
        };
        self.check_facts(host, &facts)?;
        if h.info.facts == facts {
            return Ok(());
        }
        self.host_up(host, &facts);
        h.info.facts = facts;
        let mut txn = Txn::new(&self.cluster);
        txn.put_host(&self.cluster, h);
        self.commit(txn, now)
    }

    /// One worker report alone (the tests' way in; the state task queues reports and
    /// applies them with [`reports`](Self::reports)).
    #[cfg(test)]
    pub(crate) fn events(
        &mut self,
        host: &HostId,
        caller: &Caller,
        events: Vec<WorkerEvent>,
        now: Instant,
    ) -> Result<(), CoreError> {
        let report = Report {
            host: host.clone(),
            caller: caller.clone(),
            events,
        };
        let mut results = self.reports(vec![report], now);
        results.pop().expect("one result per report")
    }

    /// Worker reports queued together, applied in order in as few store batches as the
    /// store's batch limit allows (each report whole in one): a burst of reports is a
    /// few commits, not one each (on etcd each commit is a round trip and a raft write,
    /// and every report was its own). Nothing is applied before its batch is committed;
    /// a failed commit fails every report in it (each is retried by its worker; events
    /// are idempotent). One result per report, in order.
    pub(crate) fn reports(
        &mut self,
        reports: Vec<Report>,
        now: Instant,
    ) -> Vec<Result<(), CoreError>> {
        let limit = self.store.batch_limit().ops;
        let mut results: Vec<Option<Result<(), CoreError>>> = Vec::new();
        let mut txn = Txn::new(&self.cluster);
        // The reports in `txn` (their index in `results`).
        let mut members: Vec<usize> = Vec::new();
        for r in reports {
            results.push(None);
            if let Err(e) = self.check_holder(&r.host, &r.caller, "events report") {
                *results.last_mut().expect("pushed") = Some(Err(e));
                continue;
            }
            let ops = self.report_ops(&r.host, &r.events);
            if !members.is_empty() && txn.ops() + ops > limit {
                let full = std::mem::take(&mut txn);
                self.commit_reports(full, &mut members, &mut results, now);
                // Read again: the commit moved the state on.
                txn = Txn::new(&self.cluster);
            }
            self.note_probes(&r.host, &r.events);
            self.report_into(&mut txn, &r.host, r.events);
            members.push(results.len() - 1);
        }
        self.commit_reports(txn, &mut members, &mut results, now);
        results
            .into_iter()
            .map(|r| r.expect("every report answered"))
            .collect()
    }

    /// Commits the reports `members` of `results` share in `txn`, and answers them.
    fn commit_reports(
        &mut self,
        txn: Txn,
        members: &mut Vec<usize>,
        results: &mut [Option<Result<(), CoreError>>],
        now: Instant,
    ) {
        if members.is_empty() {
            return;
        }
        let failed = match self.commit(txn, now) {
            Ok(()) => None,
            Err(CoreError::Store(e)) => Some(e),
            Err(e) => Some(xce_store::StoreError::Backend(e.to_string())),
        };
        for i in members.drain(..) {
            results[i] = Some(match &failed {
                None => Ok(()),
                Some(e) => Err(CoreError::Store(e.clone())),
            });
        }
    }

    /// At most how many records a report writes (an estimate only: a batch above the
    /// store's limit is still committed whole, on etcd through its journal): its jobs;
    /// the services of the jobs that end or whose readiness is held out of the endpoints
    /// (a quiet write), since a job write only moves its service's `rev`; the host's
    /// record when something ends (its released grants, its orphans).
    fn report_ops(&self, host: &HostId, events: &[WorkerEvent]) -> usize {
        let withheld = self.withheld.contains(host);
        let mut jobs = BTreeSet::new();
        let mut services = BTreeSet::new();
        let mut ends = false;
        for e in events {
            jobs.insert(e.job().as_str());
            let end = matches!(e, WorkerEvent::Exited { .. } | WorkerEvent::Refused { .. });
            ends |= end;
            let Some(j) = self.cluster.jobs.get(e.job().as_str()) else {
                continue;
            };
            let quiet =
                matches!(e, WorkerEvent::Readiness { .. }) && (withheld || j.held_ready.is_some());
            if j.info.host == *host && (end || quiet) {
                services.insert((j.info.project.as_str(), j.info.service.as_str()));
            }
        }
        jobs.len() + services.len() + usize::from(ends)
    }

    /// One report's events into `txn` (which may hold earlier reports: it is read
    /// through, so each sees the ones before it).
    fn report_into(&self, txn: &mut Txn, host: &HostId, events: Vec<WorkerEvent>) {
        // A job whose host a full disruption took out of the endpoints stays out until the
        // host is heard (a heartbeat), whatever readiness it reports meanwhile.
        let withheld = self.withheld.contains(host);
        for ev in events {
            let id = ev.job().clone();
            let Some(j) = txn.job(&self.cluster, &id).filter(|j| j.info.host == *host) else {
                self.event_for_no_job(txn, host, &ev);
                continue;
            };
            match ev {
                WorkerEvent::Started { log, .. } => self.started(txn, j, log),
                WorkerEvent::Readiness { ready, .. } => self.readiness(txn, j, ready, withheld),
                WorkerEvent::Exited {
                    code,
                    signal,
                    error,
                    log,
                    worker_stopped,
                    ..
                } => {
                    let cause = ExitCause {
                        code,
                        signal,
                        error,
                        worker_stopped,
                    };
                    self.exited(txn, j, cause, log)
                }
                WorkerEvent::Refused { refusal, .. } => self.refused(txn, host, j, refusal),
            }
        }
    }

    /// An event for no live job on the host: the exit of one of its orphans (the host
    /// may take placements once they are all gone), else a repeat for an ended job
    /// (events are idempotent), ignored.
    fn event_for_no_job(&self, txn: &mut Txn, host: &HostId, ev: &WorkerEvent) {
        let id = ev.job();
        if let WorkerEvent::Exited { .. } = ev {
            if let Some(mut h) = txn.host(&self.cluster, host) {
                if h.orphans.remove(id) {
                    info!(host = %host, job = %id, "orphaned job exited");
                    txn.put_host_quiet(h);
                    return;
                }
            }
        }
        debug!(host = %host, job = %id, event = ?ev, "event for no live job on the host ignored");
    }

    /// The worker started a placed job (on a host not heard lately, held until it is).
    fn started(&self, txn: &mut Txn, mut j: JobRec, log: Option<String>) {
        if j.effective_state() != JobState::Placed {
            return;
        }
        if j.info.state == JobState::Unknown {
            j.held = Some(JobState::Running);
        } else {
            j.info.state = JobState::Running;
        }
        j.log = log.or(j.log);
        txn.put_job(&self.cluster, j);
    }

    /// A running job's readiness changed. Held out of the endpoints (a full disruption
    /// took it out, or its host is `withheld` and not heard yet), the readiness is kept
    /// for when its host is heard again, quietly.
    fn readiness(&self, txn: &mut Txn, mut j: JobRec, ready: bool, withheld: bool) {
        if j.effective_state() != JobState::Running {
            return;
        }
        let held = j.held_ready.is_some() || (withheld && j.info.state == JobState::Unknown);
        if held {
            if j.held_ready != Some(ready) {
                j.held_ready = Some(ready);
                txn.put_job_quiet(&self.cluster, j);
            }
        } else if j.info.ready != ready {
            j.info.ready = ready;
            txn.put_job(&self.cluster, j);
        }
    }

    /// A job exited: one on its way out is stopped; one that ended by itself is recorded
    /// in its slot and, if it runs the generation being rolled out, counts against the
    /// rollout (persisted with the exit itself).
    fn exited(&self, txn: &mut Txn, j: JobRec, cause: ExitCause, log: Option<String>) {
        let leaving = matches!(j.effective_state(), JobState::Stopping | JobState::Draining);
        let worker_stopped = cause.worker_stopped;
        let reason = if leaving {
            EndReason::Stopped
        } else if worker_stopped {
            // Its worker is shutting down: the replica did nothing wrong, so it ends as
            // stopped (no restart counted, no backoff, no rollout exit); its replica slot
            // is placed again like any other missing one.
            info!(service = %j.info.service, project = %j.info.project, replica = j.info.replica, job = %j.info.job, host = %j.info.host, "replica stopped by its worker's shutdown; a replacement follows");
            EndReason::Stopped
        } else {
            let code = cause.code;
            self.record_end(txn, &j, cause, log);
            EndReason::Exited { code }
        };
        let (service, generation) = (j.info.service_key(), j.info.generation);
        txn.end_job(&self.cluster, j, reason);
        let Some(mut s) = txn.service(&self.cluster, &service) else {
            return;
        };
        let counts = rollout::exit_counts(&s.rollout, s.info.generation, generation, leaving);
        if !worker_stopped && s.state == ServiceState::Active && counts {
            s.rollout.exits += 1;
            txn.put_service_quiet(s);
        }
    }

    /// A launch hook refused to start the job: it ends (recorded in its slot, the
    /// refusing plugin told after the commit) and its replica is placed again.
    fn refused(&self, txn: &mut Txn, host: &HostId, j: JobRec, refusal: LaunchRefusal) {
        let id = j.info.job.clone();
        warn!(host = %host, job = %id, plugin = %refusal.plugin, reason = %refusal.reason, "launch refused; placing the replica again");
        let cause = ExitCause {
            error: Some(format!(
                "launch refused by {}: {}",
                refusal.plugin, refusal.reason
            )),
            ..ExitCause::default()
        };
        self.record_end(txn, &j, cause, None);
        txn.after.push(After::Refused {
            host: host.clone(),
            job: id,
            plugin: refusal.plugin,
            detail: refusal.detail,
        });
        txn.end_job(
            &self.cluster,
            j,
            EndReason::Refused {
                reason: refusal.reason,
            },
        );
    }

    /// Records in its slot (in the same batch as the end itself) that job `j` ended by
    /// itself as `cause` says, its output in `log`: one more restart, the last exit, the
    /// last log. Only for an active service: a stopping one places no replacement.
    fn record_end(&self, txn: &mut Txn, j: &JobRec, cause: ExitCause, log: Option<String>) {
        let key = j.info.service_key();
        let Some(mut s) = txn.service(&self.cluster, &key) else {
            return;
        };
        if s.state != ServiceState::Active {
            return;
        }
        let at = humantime::format_rfc3339_millis((self.wall)()).to_string();
        let log = log.or_else(|| j.log.clone());
        let slot = s.slots.entry(j.info.replica).or_default();
        slot.restarts += 1;
        slot.last_exit = Some(LastExit {
            job: j.info.job.clone(),
            host: j.info.host.clone(),
            at,
            cause: cause.clone(),
        });
        if log.is_some() {
            slot.log = log;
            slot.log_host = Some(j.info.host.clone());
        }
        warn!(service = %key.name, project = %key.project, replica = j.info.replica, job = %j.info.job, host = %j.info.host, cause = %cause, restarts = slot.restarts, log = slot.log.as_deref().unwrap_or("unknown"), "replica ended by itself; a replacement follows");
        txn.put_service_quiet(s);
    }
}

/// The secret check of a call for `host`, held by the session whose secret hashes to
/// `stored` and by instance `holder`: `None` when the caller proves it (the secret, whose
/// hash is compared in constant time, and the same instance), else why not: no secret
/// presented (`SessionRequired`), or another secret or instance (`SessionInvalid`). Both
/// are checked whatever the first says, and the answer does not tell which failed: the
/// instance id is no oracle.
pub(crate) fn session_refusal(
    host: &HostId,
    stored: &str,
    holder: Option<&str>,
    caller: &Caller,
) -> Option<CoreError> {
    let Some(presented) = caller.session.as_deref() else {
        return Some(CoreError::SessionRequired(host.clone()));
    };
    let secret = xce_proto::worker::session_matches(presented, stored);
    let instance = caller.instance.as_deref() == holder;
    if secret & instance {
        None
    } else {
        Some(CoreError::SessionInvalid(host.clone()))
    }
}
