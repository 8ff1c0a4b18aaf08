//! What the others see of the state, after each command: every host's desired set (the
//! workers' assignments), the readers' [`View`](super::View), the metrics, and last the
//! committed events for the `ClusterListener`s (so no listener is ahead of the view).

use super::assign::{HostAssignments, JobAssignment};
use super::{Core, Tally, View};
use crate::controller::model::{Cluster, JobRec};
use crate::proto::Desired;
use plugin_api::{ClusterEvent, HostId, HostState, JobState};
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;

impl Core {
    pub(crate) fn view(&self) -> watch::Receiver<Arc<View>> {
        self.view.subscribe()
    }

    fn desired(&self, host: &str) -> Vec<JobAssignment> {
        let mut out = Vec::new();
        for j in self.cluster.shared_jobs_on(host) {
            // A job runs its own generation's command and probe: during a rollout the
            // older replicas keep theirs (a restarted worker must not start an old job
            // with the new command).
            let key = j.info.service_key();
            let current = self.cluster.services.get(&key).map(|s| s.info.generation);
            let p = match current {
                Some(g) if g != j.info.generation => self
                    .older
                    .get(&(key.clone(), j.info.generation))
                    .or_else(|| self.profiles.get(&key)),
                _ => self.profiles.get(&key),
            };
            let Some(p) = p else {
                continue;
            };
            // Shared, not copied: the record is the model's, command and probe the
            // generation's.
            out.push(JobAssignment {
                rec: j.clone(),
                command: p.command.clone(),
                readiness: p.readiness.clone(),
                desired: if j.effective_state() == JobState::Stopping {
                    Desired::Stop
                } else {
                    Desired::Run
                },
            });
        }
        out
    }

    pub(super) fn publish_host(&mut self, host: &str) {
        let jobs = self.desired(host);
        let index = self.cluster.rev.max(1);
        match self.assign.get(host) {
            Some(tx) => {
                tx.send_if_modified(|cur| {
                    if cur.same_jobs(&jobs) {
                        return false;
                    }
                    *cur = Arc::new(HostAssignments { index, jobs });
                    true
                });
            }
            None => {
                let (tx, _) = watch::channel(Arc::new(HostAssignments { index, jobs }));
                self.assign.insert(host.to_owned(), tx);
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
        for e in &self.outbox {
            match e {
                ClusterEvent::Job { job, .. } | ClusterEvent::JobEnded { job, .. } => {
                    hosts.insert(job.host.clone());
                }
                ClusterEvent::Host { host, .. } => {
                    hosts.insert(host.id.clone());
                }
                ClusterEvent::Service { .. } | ClusterEvent::ServiceRemoved { .. } => {}
            }
        }
        for h in &hosts {
            if self.cluster.hosts.contains_key(h) {
                self.publish_host(h);
            }
        }
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
