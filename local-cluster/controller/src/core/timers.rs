//! Deadlines instead of scans: the next instant something is due (`next_deadline`), and
//! what `tick` does when it comes: drains that are over end, silent hosts become
//! unreachable (their replicas leave the endpoints) and then lost, and the
//! full-disruption rule keeps hosts from being declared lost (and their replicas in the
//! endpoints) when most of them fall silent at once. Silence that was this controller's
//! own (a pause, seen by the beat thread of [`pulse`](super::pulse)) is not held against
//! the hosts.

use super::commit::{encoded_len, Budget};
use super::{round_up_secs, Core};
use plugin_api::{EndReason, HostId, HostState, JobId, JobState};
use std::time::Duration;
use tokio::time::Instant;
use tracing::warn;
use xce_model::{JobRec, Txn};
use xce_proto::profile;

impl Core {
    /// The live separate apiservers, as their registrations say now (the whole fleet):
    /// what each drain waits for (`acks.rs`).
    pub(crate) fn fleet(&mut self, registrations: &[xce_store::etcd::fleet::Registration]) {
        self.acks.fleet(
            registrations.iter().map(|r| {
                let m = super::acks::Member {
                    applied: r.applied,
                    max_lag: Duration::from_millis(r.max_lag_ms),
                };
                (r.id.clone(), m)
            }),
            Instant::now(),
        );
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
                        && now.saturating_duration_since(heard) >= self.lost_after(&h.info.id)
                        && self.withheld.contains(&h.info.id) =>
                {
                    None
                }
                HostState::Unreachable => Some(heard + self.lost_after(&h.info.id)),
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

    /// Starts the beat thread that tells this process's pauses (see
    /// [`notice_pause`](Self::notice_pause)); a core without one judges pauses only by its
    /// timer's lateness.
    pub(crate) fn watch_pauses(&mut self) -> std::io::Result<()> {
        self.pulse = Some(super::pulse::Pulse::start()?);
        Ok(())
    }

    /// A beat clock the tests drive themselves.
    #[cfg(test)]
    pub(crate) fn watch_pauses_with(&mut self, pulse: super::pulse::Pulse) {
        self.pulse = Some(pulse);
    }

    /// How late a timer may fire before the controller counts itself as not having run:
    /// a couple of heartbeats (a busy machine delays timers a little; a paused process by
    /// far more).
    fn lag_tolerance(&self) -> Duration {
        (self.timing.heartbeat_interval * 2).max(Duration::from_secs(1))
    }

    /// Credits the hosts with the silence that was this controller's own, before they are
    /// judged. Called at every turn of the state task, by [`tick`](Self::tick), and by the
    /// state task before it applies a command that woke it past a due deadline (a queued
    /// heartbeat applied first would move the deadline on).
    ///
    /// Two kinds of evidence:
    /// - the beat thread ([`Pulse`](super::pulse::Pulse)) beat late: the process did not
    ///   run (SIGSTOP, a frozen VM, a starved machine) for that long. Every host's last
    ///   heard instant moves on by the pause (never past `now`), so a host silent before
    ///   the pause is judged on its own silence only. No blind spot: every pause longer
    ///   than [`pulse::PERIOD`](super::pulse::PERIOD) + [`pulse::SLACK`](super::pulse::SLACK)
    ///   is seen, whatever deadline the state task slept until.
    /// - the state task woke `now` far past the deadline it was `armed` with while the
    ///   beat thread kept beating: the state task itself was blocked (most likely in a
    ///   store commit on a slow store), so heartbeats were queued, not handled; every
    ///   host gets a fresh window.
    pub(crate) fn notice_pause(&mut self, now: Instant, armed: Option<Instant>) {
        let paused = self.pulse.as_ref().map_or(Duration::ZERO, |p| p.take());
        if !paused.is_zero() {
            warn!(paused = %humantime::format_duration(round_up_ms(paused)), "the controller was not running for a while (the process was stopped, frozen or starved: its beat thread woke late); the hosts' silence meanwhile is not held against them");
            for t in self.heard.values_mut() {
                *t = (*t + paused).min(now);
            }
            self.metrics.controller_paused();
        }
        let lag = armed.map_or(Duration::ZERO, |d| now.saturating_duration_since(d));
        if lag > self.lag_tolerance() {
            if self.pulse.is_some() && paused + self.lag_tolerance() < lag {
                warn!(late = %humantime::format_duration(round_up_secs(lag)), "the state task ran late while the process kept running (blocked, most likely in a store commit on a slow store); every host gets a fresh window before it is judged");
            } else if self.pulse.is_none() {
                warn!(lag = %humantime::format_duration(round_up_secs(lag)), "the controller's timer fired late (the controller was paused or blocked); every host gets a fresh window before it is judged");
            }
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
    /// `armed` is the deadline the state task slept until (see
    /// [`notice_pause`](Self::notice_pause): silence that was this controller's own is
    /// not held against the hosts).
    ///
    /// An unreachable host's replicas leave the endpoints at once (their readiness is
    /// kept aside, their ports held, nothing placed instead) and come back as soon as it
    /// is heard. It is lost once silent for `grace_period`, and no sooner than
    /// `unreachable_after` plus the longest `drain` of its replicas, so that a worker that
    /// still hears the controller (an asymmetric partition) stops them only after they
    /// drained ([`lost_after`](Self::lost_after)).
    ///
    /// When most hosts are unreachable at once (a full disruption, see
    /// [`DisruptionThreshold`](crate::config::DisruptionThreshold)), the likelier cause is
    /// this controller or its network: no host is declared lost meanwhile, and the
    /// unreachable hosts' replicas stay in the endpoints (taking them all out would be an
    /// outage of this controller's making) until their grace period, then leave them
    /// ([`withhold`](Self::withhold)) with their jobs kept.
    pub(crate) fn tick(&mut self, now: Instant, armed: Option<Instant>) {
        self.notice_pause(now, armed);
        self.end_drains(now);
        let ids: Vec<HostId> = self.cluster.hosts.keys().cloned().collect();
        let newly: Vec<(HostId, Duration)> = ids
            .iter()
            .filter(|id| self.host_state(id) == Some(HostState::Ready))
            .map(|id| (id.clone(), self.silence(id, now)))
            .filter(|(_, silent)| *silent >= self.timing.unreachable_after)
            .collect();
        if !newly.is_empty() {
            // Judged with every host falling silent now: the first of several hosts cut
            // off together must not leave the endpoints when the rest make it a full
            // disruption.
            let (unreachable, hosts) = self.unreachable_count();
            let full = self
                .timing
                .disruption_threshold
                .is_full_disruption(unreachable + newly.len(), hosts);
            for (id, silent) in &newly {
                self.host_unreachable(id, *silent, now, !full);
            }
        }
        self.judge_disruption(now);
        for id in &ids {
            let silent = self.silence(id, now);
            let unreachable = self.host_state(id) == Some(HostState::Unreachable);
            if unreachable && silent >= self.lost_after(id) {
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

    /// How long `id` may be silent before it is lost: the grace period, and at least
    /// `unreachable_after` (when its replicas left the endpoints) plus the longest `drain`
    /// of its running replicas. A worker that still hears the controller stops its
    /// replicas when they leave its desired set, at the loss: by then they have been out
    /// of every endpoint for their drain.
    pub(crate) fn lost_after(&self, id: &HostId) -> Duration {
        let drain = self
            .cluster
            .jobs_on(id)
            .filter(|j| j.effective_state() == JobState::Running)
            .map(|j| {
                self.profiles
                    .get(&j.info.service_key())
                    .map_or(profile::DEFAULT_DRAIN, |p| p.drain)
            })
            .max()
            .unwrap_or_default();
        self.timing
            .grace_period
            .max(self.timing.unreachable_after + drain)
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
    /// At the start, the unreachable hosts' replicas that left the endpoints come back
    /// into them (with the readiness kept aside): the rule's premise is that the hosts
    /// are fine and this controller is cut off from them.
    ///
    /// At the end, every host still unreachable gets a fresh grace period from now
    /// (Kubernetes resets its hosts' timers the same way when it leaves its all-zones
    /// disruption mode): hosts come back one by one as a network heals, and judging the
    /// late ones on their silence during the disruption would declare them lost at the
    /// moment the threshold is crossed, and pile their replicas onto the few hosts back
    /// first. The cost: a host that really died with the others is replaced one grace
    /// period after the disruption ends, not at once. Their replicas leave the endpoints
    /// again (the rule for an unreachable host).
    fn judge_disruption(&mut self, now: Instant) {
        let full = self.full_disruption_now();
        if full == self.disrupted {
            return;
        }
        let (unreachable, hosts) = self.unreachable_count();
        self.disrupted = full;
        self.metrics.full_disruption.set(i64::from(full));
        let silent: Vec<HostId> = self
            .cluster
            .hosts
            .values()
            .filter(|h| h.info.state == HostState::Unreachable)
            .map(|h| h.info.id.clone())
            .collect();
        if full {
            warn!(unreachable, hosts, threshold = self.timing.disruption_threshold.get(), "full disruption: most hosts are unreachable at once; suspecting this controller or its network, no host is declared lost (their replicas are not replaced) until fewer are, and their replicas stay in the endpoints until their grace period");
            for id in std::mem::take(&mut self.withheld) {
                self.relist(&id, now);
            }
        } else {
            self.withheld.clear();
            for id in &silent {
                if let Some(t) = self.heard.get_mut(id) {
                    *t = (*t).max(now);
                }
            }
            warn!(unreachable, hosts, "full disruption over: hosts are judged again; those still unreachable get a fresh grace period, their replicas out of the endpoints");
            for id in &silent {
                self.withhold(id, self.silence(id, now), now);
            }
        }
    }

    /// A silent host becomes unreachable: its jobs are `unknown`, kept (ports held,
    /// nothing placed instead) for the grace period. With `withdraw` (no full disruption),
    /// its ready jobs leave the endpoints in the same commit (see [`withhold`]).
    ///
    /// [`withhold`]: Self::withhold
    fn host_unreachable(&mut self, id: &HostId, silent: Duration, now: Instant, withdraw: bool) {
        let Some(mut h) = self.cluster.hosts.get(id).cloned() else {
            return;
        };
        let mut txn = Txn::new(&self.cluster);
        let mut out = 0;
        for mut j in self.cluster.jobs_on(id).cloned().collect::<Vec<_>>() {
            j.held = Some(j.info.state);
            j.info.state = JobState::Unknown;
            if withdraw && withdraws(&j) {
                j.held_ready = Some(true);
                j.info.ready = false;
                out += 1;
            }
            txn.put_job(&self.cluster, j);
        }
        h.info.state = HostState::Unreachable;
        txn.put_host(&self.cluster, h);
        if self.commit(txn, now).is_ok() {
            let silent = humantime::format_duration(round_up_secs(silent));
            if withdraw {
                self.withheld.insert(id.clone());
                warn!(host = %id, %silent, replicas_out = out, "host unreachable; its replicas leave the endpoints until it is heard again, their jobs are kept (ports held, nothing placed instead) for the grace period");
            } else {
                warn!(host = %id, %silent, "host unreachable during a full disruption; its replicas stay in the endpoints, their jobs kept, for the grace period");
            }
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

    /// An unreachable host's ready jobs leave the endpoints (their readiness is kept for
    /// when the host is heard again, and readiness it reports meanwhile is kept aside
    /// too): after the grace period during a full disruption, or when a disruption ends.
    /// Once per host and disruption (a failed commit is tried again).
    fn withhold(&mut self, id: &HostId, silent: Duration, now: Instant) {
        let mut txn = Txn::new(&self.cluster);
        let mut n = 0;
        for mut j in self.cluster.jobs_on(id).cloned().collect::<Vec<_>>() {
            if withdraws(&j) {
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
            let silent = humantime::format_duration(round_up_secs(silent));
            if self.disrupted {
                warn!(host = %id, %silent, replicas = n, "host silent past the grace period during a full disruption: not declared lost, its replicas are kept (not replaced) but leave the endpoints");
            } else {
                warn!(host = %id, %silent, replicas = n, "unreachable host's replicas leave the endpoints; their jobs are kept (not replaced) until it is lost or heard again");
            }
        }
    }

    /// The start of a full disruption: an unreachable host's replicas that left the
    /// endpoints come back into them with the readiness kept aside.
    fn relist(&mut self, id: &HostId, now: Instant) {
        let mut txn = Txn::new(&self.cluster);
        let mut n = 0;
        for mut j in self.cluster.jobs_on(id).cloned().collect::<Vec<_>>() {
            if j.info.state == JobState::Unknown {
                if let Some(ready) = j.held_ready.take() {
                    j.info.ready = ready;
                    txn.put_job(&self.cluster, j);
                    n += 1;
                }
            }
        }
        if n > 0 && self.commit(txn, now).is_ok() {
            warn!(host = %id, replicas = n, "full disruption: the unreachable host's replicas are back in the endpoints until its grace period");
        }
    }
}

/// Whether an unreachable host's job leaves the endpoints now: it is one (running,
/// ready) and its readiness is not kept aside already.
fn withdraws(j: &JobRec) -> bool {
    j.info.state == JobState::Unknown
        && j.effective_state() == JobState::Running
        && j.held_ready.is_none()
        && j.info.ready
}

/// `d` to the millisecond, for logs.
fn round_up_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis().min(u128::from(u64::MAX)) as u64 + 1)
}
