//! Deadlines instead of scans: the next instant something is due (`next_deadline`), and
//! what `tick` does when it comes: drains that are over end, silent hosts become
//! unreachable and then lost, and the full-disruption rule keeps hosts from being
//! declared lost when most of them fall silent at once.

use super::commit::{encoded_len, Budget};
use super::{round_up_secs, Core};
use plugin_api::{EndReason, HostId, HostState, JobId, JobState};
use std::time::Duration;
use tokio::time::Instant;
use tracing::warn;
use xce_model::{JobRec, Txn};

impl Core {
    /// The live separate apiservers, as their registrations say now (the whole fleet):
    /// what each drain waits for (`acks.rs`).
    pub(crate) fn fleet(&mut self, registrations: &[xce_store::etcd::fleet::Registration]) {
        self.acks.fleet(registrations.iter().map(|r| {
            let m = super::acks::Member {
                applied: r.applied,
                max_lag: Duration::from_millis(r.max_lag_ms),
            };
            (r.id.clone(), m)
        }));
    }

    /// The next instant something is due (a host deadline or a backoff), if any.
    pub(crate) fn next_deadline(&self, now: Instant) -> Option<Instant> {
        // A full disruption that the hosts heard from since have ended is judged at once.
        let disruption = (self.disrupted && !self.full_disruption_now()).then_some(now);
        let hosts = self.cluster.hosts.values().filter_map(|h| {
            let heard = self.heard.get(&h.info.id).copied().unwrap_or(now);
            match h.info.state {
                HostState::Ready => Some(heard + self.timing.unreachable_after),
                // During a full disruption a host past its grace period waits to be
                // heard (or for the disruption to end): no timer, or it would fire
                // again and again.
                HostState::Unreachable
                    if self.disrupted
                        && now.saturating_duration_since(heard) >= self.timing.grace_period
                        && self.withheld.contains(&h.info.id) =>
                {
                    None
                }
                HostState::Unreachable => Some(heard + self.timing.grace_period),
                HostState::Lost => None,
            }
        });
        let backoffs = self
            .backoff
            .values()
            .filter(|b| !b.over)
            .map(|b| b.not_before);
        // A drain ends when it has passed and the separate apiservers have applied it
        // (or the wait for them ran out): `acks.rs`.
        let drains = self
            .drain_until
            .iter()
            .map(|(job, end)| self.acks.stop_at(job, *end));
        // Rollout deadlines and replicas reaching `min_ready`: kept per service by the
        // pass that visited it last (`sched.rs`), always after that pass's `now`. (Walking
        // every rolling-out service's jobs here, at every turn of the state task, cost as
        // much as the jobs.)
        let rollouts = self.sched.next_timed();
        let next = hosts
            .chain(disruption)
            .chain(backoffs)
            .chain(drains)
            .chain(rollouts)
            .min()?;
        Some(match self.store_retry {
            Some(r) => next.max(r),
            None => next,
        })
    }

    /// How late a timer may fire before the controller counts itself as not having run:
    /// a couple of heartbeats (a busy machine delays timers a little; a paused process by
    /// far more).
    fn lag_tolerance(&self) -> Duration {
        (self.timing.heartbeat_interval * 2).max(Duration::from_secs(1))
    }

    /// Whether the loop woke `now` far past the deadline it was `armed` with: then the
    /// controller itself did not run (paused, suspended), and every host gets a fresh
    /// window before it is judged. Called by [`tick`](Self::tick), and by the state task
    /// before it applies a command that woke it past a due deadline: a queued heartbeat
    /// applied first would move the deadline on and hide the pause.
    pub(crate) fn notice_pause(&mut self, now: Instant, armed: Option<Instant>) {
        let lag = armed.map_or(Duration::ZERO, |d| now.saturating_duration_since(d));
        if lag > self.lag_tolerance() {
            warn!(lag = %humantime::format_duration(round_up_secs(lag)), "the controller was not running for a while; every host gets a fresh window before it is judged");
            for t in self.heard.values_mut() {
                *t = (*t).max(now);
            }
        }
    }

    /// Ends the drains that are over: those jobs get SIGTERM now (`Stopping`), in batches
    /// within the store's limit (a 10,000-replica stop ends 10,000 drains at once).
    fn end_drains(&mut self, now: Instant) {
        let mut over: Vec<JobId> = self
            .drain_until
            .iter()
            .filter(|(j, t)| self.acks.stop_at(j, **t) <= now)
            .map(|(j, _)| j.clone())
            .collect();
        over.sort();
        for chunk in over.chunks(self.store.batch_limit().ops.saturating_sub(8).max(1)) {
            let mut txn = Txn::new(&self.cluster);
            let mut budget = Budget::new(self.store.batch_limit());
            let mut done = Vec::new();
            for id in chunk {
                let Some(mut j) = self.cluster.jobs.get(id.as_str()).map(|j| JobRec::clone(j))
                else {
                    done.push(id.clone());
                    continue;
                };
                if j.effective_state() != JobState::Draining {
                    done.push(id.clone());
                    continue;
                }
                let size = encoded_len(&j);
                if !done.is_empty() && !budget.room(&txn, size) {
                    // The next tick (due at once: the drain is over) takes the rest.
                    break;
                }
                if j.info.state == JobState::Unknown {
                    j.held = Some(JobState::Stopping);
                } else {
                    j.info.state = JobState::Stopping;
                }
                budget.add(size);
                txn.put_job(&self.cluster, j);
                done.push(id.clone());
            }
            if self.commit(txn, now).is_err() {
                return;
            }
            for id in done {
                let unacked = self.acks.unacked(&id);
                if !unacked.is_empty() {
                    warn!(job = %id, apiservers = ?unacked, "drain_ack_timeout ran out: SIGTERM without these apiservers' acknowledgement (they are behind by more than their max_lag, failing closed)");
                }
                self.acks.forget(&id);
                self.drain_until.remove(&id);
            }
        }
    }

    /// Ends drains that are over; moves silent hosts to unreachable, then lost.
    ///
    /// `armed` is the deadline the state task slept until. Waking much later than that
    /// means this controller was not running (paused, starved, a frozen VM, a clock jump):
    /// hosts could not be heard meanwhile, so every host gets a fresh `unreachable_after`
    /// window instead of being judged on silence that was this controller's own.
    ///
    /// When most hosts are unreachable at once (a full disruption, see
    /// [`DisruptionThreshold`](crate::config::DisruptionThreshold)), the likelier cause is this controller or its network:
    /// no host is declared lost meanwhile. A host silent past its grace period then stays
    /// unreachable with its jobs kept (grants held, nothing placed elsewhere) but out of
    /// the endpoints.
    pub(crate) fn tick(&mut self, now: Instant, armed: Option<Instant>) {
        self.notice_pause(now, armed);
        self.end_drains(now);
        let ids: Vec<HostId> = self.cluster.hosts.keys().cloned().collect();
        for id in &ids {
            let silent = self.silence(id, now);
            let ready = self.host_state(id) == Some(HostState::Ready);
            if ready && silent >= self.timing.unreachable_after {
                self.host_unreachable(id, silent, now);
            }
        }
        self.judge_disruption(now);
        for id in &ids {
            let silent = self.silence(id, now);
            let unreachable = self.host_state(id) == Some(HostState::Unreachable);
            if unreachable && silent >= self.timing.grace_period {
                if self.disrupted {
                    if !self.withheld.contains(id) {
                        self.withhold(id, silent, now);
                    }
                } else {
                    self.host_lost(id, silent, now);
                }
            }
        }
    }

    fn host_state(&self, id: &HostId) -> Option<HostState> {
        self.cluster.hosts.get(id).map(|h| h.info.state)
    }

    /// How long `id` has not been heard from.
    fn silence(&self, id: &HostId, now: Instant) -> Duration {
        let heard = self.heard.get(id).copied().unwrap_or(now);
        now.saturating_duration_since(heard)
    }

    /// (unreachable, not lost) hosts: what the full-disruption rule judges.
    fn unreachable_count(&self) -> (usize, usize) {
        let live = self
            .cluster
            .hosts
            .values()
            .filter(|h| h.info.state != HostState::Lost);
        live.fold((0, 0), |(u, n), h| {
            (
                u + usize::from(h.info.state == HostState::Unreachable),
                n + 1,
            )
        })
    }

    /// Whether the unreachable hosts now make a full disruption.
    fn full_disruption_now(&self) -> bool {
        let (unreachable, hosts) = self.unreachable_count();
        self.timing
            .disruption_threshold
            .is_full_disruption(unreachable, hosts)
    }

    /// Starts or ends a full disruption by the current count; each once, with a warning.
    ///
    /// At the end, every host still unreachable gets a fresh grace period from now
    /// (Kubernetes resets its hosts' timers the same way when it leaves its all-zones
    /// disruption mode): hosts come back one by one as a network heals, and judging the
    /// late ones on their silence during the disruption would declare them lost at the
    /// moment the threshold is crossed, and pile their replicas onto the few hosts back
    /// first. The cost: a host that really died with the others is replaced one grace
    /// period after the disruption ends, not at once.
    fn judge_disruption(&mut self, now: Instant) {
        let full = self.full_disruption_now();
        if full == self.disrupted {
            return;
        }
        let (unreachable, hosts) = self.unreachable_count();
        self.disrupted = full;
        self.withheld.clear();
        self.metrics.full_disruption.set(i64::from(full));
        if full {
            warn!(unreachable, hosts, threshold = self.timing.disruption_threshold.get(), "full disruption: most hosts are unreachable at once; suspecting this controller or its network, no host is declared lost (their replicas are not replaced) until fewer are");
        } else {
            for (id, h) in &self.cluster.hosts {
                if h.info.state == HostState::Unreachable {
                    if let Some(t) = self.heard.get_mut(id) {
                        *t = (*t).max(now);
                    }
                }
            }
            warn!(unreachable, hosts, "full disruption over: hosts are judged again; those still unreachable get a fresh grace period");
        }
    }

    /// A silent host becomes unreachable: its jobs are `unknown`, kept (and still
    /// endpoints, with the readiness they had) for the grace period.
    fn host_unreachable(&mut self, id: &HostId, silent: Duration, now: Instant) {
        let Some(mut h) = self.cluster.hosts.get(id).cloned() else {
            return;
        };
        let mut txn = Txn::new(&self.cluster);
        for mut j in self.cluster.jobs_on(id).cloned().collect::<Vec<_>>() {
            j.held = Some(j.info.state);
            j.info.state = JobState::Unknown;
            txn.put_job(&self.cluster, j);
        }
        h.info.state = HostState::Unreachable;
        txn.put_host(&self.cluster, h);
        if self.commit(txn, now).is_ok() {
            warn!(host = %id, silent = %humantime::format_duration(round_up_secs(silent)), "host unreachable; its jobs are kept for the grace period");
        }
    }

    /// An unreachable host past its grace period is lost: its jobs end (grants released)
    /// and its replicas are placed elsewhere.
    fn host_lost(&mut self, id: &HostId, silent: Duration, now: Instant) {
        let mut txn = Txn::new(&self.cluster);
        for j in self.cluster.jobs_on(id).cloned().collect::<Vec<_>>() {
            txn.end_job(&self.cluster, j, EndReason::HostLost);
        }
        let Some(mut h) = txn.host(&self.cluster, id) else {
            return;
        };
        h.info.state = HostState::Lost;
        h.orphans.clear();
        txn.put_host(&self.cluster, h);
        if self.commit(txn, now).is_ok() {
            self.withheld.remove(id);
            warn!(host = %id, silent = %humantime::format_duration(round_up_secs(silent)), "host lost; its replicas are placed elsewhere");
        }
    }

    /// An unreachable host past its grace period during a full disruption: not lost, but
    /// its ready jobs leave the endpoints (their readiness is kept for when the host is
    /// heard again). Once per host and disruption (a failed commit is tried again).
    fn withhold(&mut self, id: &HostId, silent: Duration, now: Instant) {
        let mut txn = Txn::new(&self.cluster);
        let mut n = 0;
        for mut j in self.cluster.jobs_on(id).cloned().collect::<Vec<_>>() {
            if j.info.state == JobState::Unknown && j.held_ready.is_none() && j.info.ready {
                j.held_ready = Some(true);
                j.info.ready = false;
                txn.put_job(&self.cluster, j);
                n += 1;
            }
        }
        if n == 0 {
            self.withheld.insert(id.clone());
        } else if self.commit(txn, now).is_ok() {
            self.withheld.insert(id.clone());
            warn!(host = %id, silent = %humantime::format_duration(round_up_secs(silent)), replicas = n, "host silent past the grace period during a full disruption: not declared lost, its replicas are kept (not replaced) but leave the endpoints");
        }
    }
}
