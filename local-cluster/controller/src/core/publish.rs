//! What the others see of the state, after each command: every host's desired set (the
//! workers' assignments), the readers' [`View`], the metrics, and last the
//! committed events for the `ClusterListener`s (so no listener is ahead of the view).

use super::assign::{HostAssignments, JobAssignment};
use super::{Core, Tally, View};
use plugin_api::{ClusterEvent, HostId, HostState, JobId, JobState};
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;
use xce_model::{Cluster, JobRec, Txn};
use xce_proto::worker::Desired;

impl Core {
    pub(crate) fn view(&self) -> watch::Receiver<Arc<View>> {
        self.view.subscribe()
    }

    /// `j`'s entry in its host's desired set; `None` when its service's profile is gone.
    fn assignment(&self, j: &Arc<JobRec>) -> Option<JobAssignment> {
        // A job runs its own generation's command and probe: during a rollout the older
        // replicas keep theirs (a restarted worker must not start an old job with the
        // new command).
        let key = j.info.service_key();
        let current = self.cluster.services.get(&key).map(|s| s.info.generation);
        let p = match current {
            Some(g) if g != j.info.generation => self
                .older
                .get(&(key.clone(), j.info.generation))
                .or_else(|| self.profiles.get(&key)),
            _ => self.profiles.get(&key),
        }?;
        // Shared, not copied: the record is the model's, command and probe the
        // generation's.
        Some(JobAssignment {
            rec: j.clone(),
            command: p.command.clone(),
            readiness: p.readiness.clone(),
            env: p.env.clone(),
            desired: if j.effective_state() == JobState::Stopping {
                Desired::Stop
            } else {
                Desired::Run
            },
        })
    }

    /// `host`'s desired set built from all its jobs, by job id.
    fn desired(&self, host: &str) -> Vec<JobAssignment> {
        self.cluster
            .shared_jobs_on(host)
            .filter_map(|j| self.assignment(j))
            .collect()
    }

    /// Rebuilds `host`'s desired set from all its jobs (a host without one yet, or whose
    /// own record changed).
    pub(super) fn publish_host(&mut self, host: &str) {
        let jobs = self.desired(host);
        let rev = self.cluster.rev.max(1);
        match self.assign.get(host) {
            Some(tx) => {
                tx.send_if_modified(|cur| {
                    // Replaced even when the worker would read the same: the set then
                    // holds the model's current records, not ones the model let go of
                    // (a readiness report changes no assignment, and the old set kept
                    // a second copy of every record).
                    let same = cur.same_jobs(&jobs);
                    let index = if same { cur.index } else { rev };
                    *cur = Arc::new(HostAssignments { index, jobs });
                    !same
                });
            }
            None => {
                let (tx, _) = watch::channel(Arc::new(HostAssignments { index: rev, jobs }));
                self.assign.insert(host.to_owned(), tx);
            }
        }
    }

    /// Notes the jobs `txn` writes, by host, before it is applied: their entries in the
    /// hosts' desired sets are patched at the next [`publish`](Self::publish). Quiet
    /// writes too (they announce nothing, but the set must hold the current record).
    pub(super) fn note_assign(&mut self, txn: &Txn) {
        for (id, rec) in txn.jobs_written() {
            let host = match rec {
                Some(j) => Some(&j.info.host),
                None => self.cluster.jobs.get(id.as_str()).map(|j| &j.info.host),
            };
            if let Some(host) = host {
                let ids = match self.assign_touched.get_mut(host.as_str()) {
                    Some(ids) => ids,
                    None => self.assign_touched.entry(host.clone()).or_default(),
                };
                ids.push(id.clone());
            }
        }
    }

    /// Patches `host`'s desired set with the current entries of the jobs `ids` (added,
    /// replaced or removed): O(ids · log jobs) instead of a rebuild from all its jobs,
    /// which at 50 jobs a host was most of a settle's cost. Workers are told only when
    /// what they read changed.
    fn patch_host(&self, host: &str, ids: &[JobId]) {
        let Some(tx) = self.assign.get(host) else {
            return;
        };
        let rev = self.cluster.rev.max(1);
        tx.send_if_modified(|cur| {
            // In place when no worker's answer holds the set at the moment.
            let set = Arc::make_mut(cur);
            let mut changed = false;
            for id in ids {
                let now = self
                    .cluster
                    .jobs
                    .get(id.as_str())
                    .filter(|j| j.info.host == host)
                    .and_then(|j| self.assignment(j));
                let at = set
                    .jobs
                    .binary_search_by(|a| a.rec.info.job.as_str().cmp(id.as_str()));
                match (at, now) {
                    (Ok(i), Some(a)) => {
                        changed |= !set.jobs[i].same(&a);
                        set.jobs[i] = a;
                    }
                    (Ok(i), None) => {
                        set.jobs.remove(i);
                        changed = true;
                    }
                    (Err(i), Some(a)) => {
                        set.jobs.insert(i, a);
                        changed = true;
                    }
                    (Err(_), None) => {}
                }
            }
            if changed {
                set.index = rev;
            }
            changed
        });
    }

    /// Every host's desired set equals a rebuild from its jobs and holds the model's
    /// current records (tests: the patches miss nothing).
    #[cfg(test)]
    fn check_assign(&self) {
        for (host, tx) in &self.assign {
            if !self.cluster.hosts.contains_key(host) {
                continue;
            }
            let cur = tx.borrow();
            let full = self.desired(host);
            assert!(
                cur.same_jobs(&full),
                "host {host}: the patched desired set differs from a rebuild"
            );
            for (a, b) in cur.jobs.iter().zip(&full) {
                assert!(
                    Arc::ptr_eq(&a.rec, &b.rec),
                    "host {host}: job {} holds a record the model replaced",
                    a.rec.info.job
                );
            }
        }
    }

    /// Publishes the assignments, the readers' view (its rollout counts at `now`, the
    /// time the core runs on, as the scheduling pass's) and the metrics.
    pub(super) fn publish(&mut self, now: Instant) {
        // A host's desired set changes only with its jobs (each change is an event on
        // the outbox) or its own record: rebuild those hosts' sets, and those of hosts
        // without one yet, rather than every host's (at 1,000 hosts, 50 times the work
        // for a worker's report of its own jobs).
        let mut hosts: BTreeSet<HostId> = self
            .cluster
            .hosts
            .keys()
            .filter(|h| !self.assign.contains_key(*h))
            .cloned()
            .collect();
        // Hosts without a set yet, and those whose own record changed, are built whole;
        // the others have the jobs their commits wrote patched in.
        let mut rebuild = hosts.clone();
        for e in &self.outbox {
            match e {
                ClusterEvent::Job { job, .. } | ClusterEvent::JobEnded { job, .. } => {
                    hosts.insert(job.host.clone());
                }
                ClusterEvent::Host { host, .. } => {
                    hosts.insert(host.id.clone());
                    rebuild.insert(host.id.clone());
                }
                ClusterEvent::Service { .. } | ClusterEvent::ServiceRemoved { .. } => {}
            }
        }
        let touched = std::mem::take(&mut self.assign_touched);
        for (h, ids) in &touched {
            if !rebuild.contains(h) && self.cluster.hosts.contains_key(h) {
                self.patch_host(h, ids);
            }
        }
        for h in &rebuild {
            if self.cluster.hosts.contains_key(h) {
                self.publish_host(h);
            }
        }
        #[cfg(test)]
        self.check_assign();
        let view = self.build_view(&hosts, now);
        #[cfg(test)]
        self.check_view(&view, now);
        self.view.send_replace(Arc::new(view));
        let c = &self.cluster;

        let m = &self.metrics;
        // The job gauges are kept by each commit (`Parts::touch`), not counted here: a
        // count of every job at every publish was O(jobs) per settle.
        #[cfg(test)]
        assert_eq!(
            self.parts.tally,
            Tally::of(c),
            "the job gauges kept by the commits differ from a count"
        );
        let tally = self.parts.tally;
        m.draining.set(tally.draining);
        for ((_, name), n) in STATES.iter().zip(tally.by_state) {
            m.set_jobs(name, usize::try_from(n).unwrap_or(0));
        }
        for (state, name) in [
            (HostState::Ready, "ready"),
            (HostState::Unreachable, "unreachable"),
            (HostState::Lost, "lost"),
        ] {
            m.set_hosts(
                name,
                c.hosts.values().filter(|h| h.info.state == state).count(),
            );
        }
        self.count_maintenance();
        m.pending
            .set(self.pending.values().map(|p| p.len()).sum::<usize>() as i64);
        m.revision.set(c.rev as i64);
        // Announce last: the readers' view above already includes these changes.
        let events = std::mem::take(&mut self.outbox);
        for l in &self.listeners {
            l.on_events(&events);
        }
    }
}

/// The states the `xce_jobs` gauge counts, in [`Tally::by_state`]'s order.
const STATES: [(JobState, &str); 5] = [
    (JobState::Placed, "placed"),
    (JobState::Running, "running"),
    (JobState::Draining, "draining"),
    (JobState::Stopping, "stopping"),
    (JobState::Unknown, "unknown"),
];

impl Tally {
    /// Every job of `c` counted.
    pub(super) fn of(c: &Cluster) -> Tally {
        let mut t = Tally::default();
        for j in c.jobs.values() {
            t.count(Some(j), 1);
        }
        t
    }

    /// Counts `j` (if any) `by` times: 1 for a job's new record, -1 for its old one.
    pub(super) fn count(&mut self, j: Option<&JobRec>, by: i64) {
        let Some(j) = j else {
            return;
        };
        if j.effective_state() == JobState::Draining {
            self.draining += by;
        }
        if let Some(i) = STATES.iter().position(|(s, _)| *s == j.info.state) {
            self.by_state[i] += by;
        }
    }
}
