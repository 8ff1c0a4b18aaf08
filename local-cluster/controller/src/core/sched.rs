//! Which active services a scheduling pass visits. Visiting a service costs about as much
//! as it has jobs (its rollout facts, what to place and drain), and most services have
//! nothing to do in most passes: at 50,000 replicas a pass over every service after each
//! burst of worker reports was the larger part of the scheduling time.
//!
//! A service's outcome (what the pass places, drains, or does to its rollout) depends on
//! its records, the hosts' room, and time. So a pass visits a service when:
//!
//! - a commit wrote it or one of its jobs since its last visit (marked by
//!   [`Core::commit`] from the transaction, quiet writes included), or the state was just
//!   loaded — except a commit that only starts jobs or changes their readiness in a
//!   service whose shape that cannot alter (`quiet`: every slot holds one live
//!   current-generation job and nothing else is live, `min_ready` is 0 or every replica
//!   is available already): then nothing
//!   can change but its rollout's progress, counted here (its deadline kept current),
//!   and it is visited when its last replica becomes available (the rollout completes).
//!   A wave of readiness reports for a 10,000-replica service costs one visit, not one
//!   per settle;
//! - its last visit left replicas that did not fit (`waiting`): room can appear on any
//!   host (a job ended, a host registered, orphans exited), so it is visited by every
//!   pass until it has nothing left to place;
//! - time alone changed it: a restart backoff is over, its rollout's progress deadline
//!   passed, or a current-generation replica reached `min_ready` (`timed`, the instant
//!   kept from its last visit; [`Core::next_deadline`] wakes the state task for it).
//!
//! Under `cfg(test)` every settle checks that no service left out had something to do
//! (`Core::check_skipped`).

use super::{Core, Sched};
use plugin_api::{JobState, ServiceKey};
use std::collections::{BTreeSet, HashMap};
use tokio::time::Instant;
use xce_model::rollout::{JobFacts, Phase};
use xce_model::{Cluster, JobRec, ServiceRec, ServiceState, Txn};

/// What a pass's visit left of a service, as [`Core::visited`] records it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Visit<'a> {
    pub(super) replicas: u32,
    pub(super) generation: u64,
    /// Its jobs as the rollout sees them after the visit.
    pub(super) facts: &'a [JobFacts],
    /// Replicas of it did not fit.
    pub(super) waiting: bool,
    /// The visit drained a job.
    pub(super) drained: bool,
}

impl Sched {
    /// Marks every service (the first pass after a load).
    pub(super) fn mark_all(&mut self, c: &Cluster) {
        self.marked.extend(c.services.keys().cloned());
    }

    /// Marks one service for the next pass (a pass that did not get to finish it).
    pub(super) fn mark(&mut self, key: ServiceKey) {
        self.marked.insert(key);
    }

    /// The earliest instant some service's outcome changes with time alone.
    pub(super) fn next_timed(&self) -> Option<Instant> {
        self.timed.values().min().copied()
    }
}

/// Whether a job counts as ready for the rollout (as `Core::job_facts` says).
fn ready(j: &JobRec) -> bool {
    j.effective_state() == JobState::Running && j.held_ready.unwrap_or(j.info.ready)
}

/// Whether two records of a service differ in nothing but their `rev`.
fn same_but_rev(old: &ServiceRec, new: &ServiceRec) -> bool {
    // (A quiet write keeps the `rev` and may change the rest: compared whole.)
    let mut o = old.clone();
    o.info.rev = new.info.rev;
    o == *new
}

/// Whether `new` differs from `old` only in what cannot change a quiet service's shape:
/// started, its readiness, its log.
fn progress_only(old: &JobRec, new: &JobRec) -> bool {
    let live = |j: &JobRec| matches!(j.effective_state(), JobState::Placed | JobState::Running);
    // A readiness held through a full disruption counts as ready without being
    // available (no `ready_since`): such changes get a visit.
    live(old)
        && live(new)
        && old.held_ready.is_none()
        && new.held_ready.is_none()
        && old.info.generation == new.info.generation
        && old.info.replica == new.info.replica
        && old.info.host == new.info.host
        && old.info.service == new.info.service
        && old.info.project == new.info.project
}

/// For a service whose live jobs (`facts`) are exactly one of the current `generation`
/// in each of its `replicas` slots: how many are not available. `None` for any other
/// shape (a slot empty or doubled, an older or excess job live).
fn quiet_unavailable(replicas: u32, generation: u64, facts: &[JobFacts]) -> Option<u32> {
    let mut taken = vec![false; replicas as usize];
    let mut unavailable = replicas;
    for f in facts.iter().filter(|f| f.phase != Phase::Leaving) {
        let slot = taken.get_mut(f.replica as usize)?;
        // A job on a draining host is to move: not quiet.
        if *slot || f.generation < generation || f.moving {
            return None;
        }
        *slot = true;
        unavailable -= u32::from(f.available);
    }
    taken.iter().all(|t| *t).then_some(unavailable)
}

impl Core {
    /// Marks the services `txn` writes for the next pass (before it is applied: the old
    /// records are still in the cluster), but for what only starts or readies jobs of
    /// quiet services (counted instead; see the module documentation).
    pub(super) fn touch_sched(&mut self, txn: &Txn, now: Instant) {
        // A service record written with only its `rev` new (every job write bumps it)
        // changes nothing a pass acts on.
        let mut changed: BTreeSet<ServiceKey> = txn
            .services_written()
            .filter(|(k, new)| match (self.cluster.services.get(*k), new) {
                (Some(old), Some(new)) => !same_but_rev(old, new),
                _ => true,
            })
            .map(|(k, _)| k.clone())
            .collect();
        // Readiness moves of the rest, per service: (became ready, no longer ready).
        let mut moved: HashMap<ServiceKey, (u32, u32)> = HashMap::new();
        for (id, new) in txn.jobs_written() {
            let old = self.cluster.jobs.get(id.as_str()).map(|j| &**j);
            let key = match (old, new) {
                (Some(o), Some(n)) if progress_only(o, n) => {
                    let m = moved.entry(n.info.service_key()).or_default();
                    match (ready(o), ready(n)) {
                        (false, true) => m.0 += 1,
                        (true, false) => m.1 += 1,
                        _ => {}
                    }
                    continue;
                }
                (Some(j), _) | (None, Some(j)) => j.info.service_key(),
                (None, None) => continue,
            };
            changed.insert(key);
        }
        for (key, (up, down)) in moved {
            if changed.contains(&key) || self.sched.marked.contains(&key) {
                continue;
            }
            let Some(unavailable) = self.sched.quiet.get(&key).copied() else {
                changed.insert(key);
                continue;
            };
            if unavailable == 0 {
                // Complete: its rollout does not act, readiness changes nothing here.
                continue;
            }
            let left = (unavailable + down).saturating_sub(up);
            if left == 0 {
                // Every replica available: the rollout completes in a visit.
                self.sched.quiet.remove(&key);
                changed.insert(key);
                continue;
            }
            self.sched.quiet.insert(key.clone(), left);
            if left != unavailable {
                // What a visit would do: the rollout made progress (its mark is
                // (available, updated, outdated, excess)), its deadline starts again.
                let (Some(svc), Some(p)) =
                    (self.cluster.services.get(&key), self.profiles.get(&key))
                else {
                    continue;
                };
                let replicas = svc.info.replicas;
                if let Some(progress) = self.progress.get_mut(&key) {
                    *progress = ((replicas - left, replicas, 0, 0), now);
                    self.sched.timed.insert(key, now + p.update.deadline);
                }
            }
        }
        self.sched.marked.extend(changed);
    }

    /// The active services the pass at `now` visits, in key order. Forgets what it keeps
    /// of services that are no longer active (a stopping service places nothing, so it
    /// has no pending replicas either).
    pub(super) fn visit_list(&mut self, now: Instant) -> Vec<ServiceKey> {
        let services = &self.cluster.services;
        let active = |k: &ServiceKey| {
            services
                .get(k)
                .is_some_and(|s| s.state == ServiceState::Active)
        };
        let sched = &mut self.sched;
        sched.marked.retain(|k| active(k));
        sched.waiting.retain(|k| active(k));
        sched.timed.retain(|k, _| active(k));
        sched.quiet.retain(|k, _| active(k));
        self.pending.retain(|k, _| active(k));
        // Due by time: marked, so a pass that fails before reaching them keeps them.
        let due: Vec<ServiceKey> = sched
            .timed
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            sched.timed.remove(&k);
            sched.marked.insert(k);
        }
        for ((k, _), b) in &self.backoff {
            if !b.over && b.not_before <= now && active(k) {
                sched.marked.insert(k.clone());
            }
        }
        let visit: BTreeSet<&ServiceKey> = sched.marked.iter().chain(&sched.waiting).collect();
        visit.into_iter().cloned().collect()
    }

    /// Records what a pass's visit of `key` left at `now`: whether it waits for room
    /// (replicas that did not fit), when its outcome changes with time alone (its
    /// rollout's deadline; a current-generation replica reaching `min_ready`),
    /// and whether it is quiet (see the module documentation; not after a drain, whose
    /// freed slot the next round may fill).
    pub(super) fn visited(&mut self, key: &ServiceKey, visit: Visit<'_>, now: Instant) {
        let Visit {
            replicas,
            generation,
            facts,
            waiting,
            drained,
        } = visit;
        let quiet = self
            .profiles
            .get(key)
            .filter(|_| !waiting && !drained)
            .and_then(|p| {
                let n = quiet_unavailable(replicas, generation, facts)?;
                // With `min_ready`, time alone makes a ready replica available, so only a
                // complete service (its rollout no longer acts) is left alone.
                (p.update.min_ready.is_zero() || n == 0).then_some(n)
            });
        match quiet {
            Some(n) => self.sched.quiet.insert(key.clone(), n),
            None => self.sched.quiet.remove(key),
        };
        let next = self.profiles.get(key).and_then(|p| {
            let deadline = self
                .progress
                .get(key)
                .map(|(_, since)| *since + p.update.deadline);
            let min_ready = p.update.min_ready;
            // The kept facts the visit took know it (or an instant before it: a spurious
            // wake-up at worst; see `kept.rs`) without a clock lookup per job.
            let ready = match self.kept.get(key).filter(|k| k.out) {
                Some(k) => k.ripe_at,
                None => facts
                    .iter()
                    .filter(|f| !min_ready.is_zero() && f.ready && !f.available)
                    .filter(|f| f.generation >= generation)
                    .filter_map(|f| self.ready_since.get(&f.job))
                    .map(|t| *t + min_ready)
                    .min(),
            };
            // Only future instants: a past one would wake the state task at once, again
            // and again (a deadline that passed failed the rollout in this visit).
            deadline.into_iter().chain(ready).filter(|t| *t > now).min()
        });
        self.metrics.pass_visits.inc();
        let sched = &mut self.sched;
        sched.marked.remove(key);
        if waiting {
            sched.waiting.insert(key.clone());
        } else {
            sched.waiting.remove(key);
        }
        match next {
            Some(t) => sched.timed.insert(key.clone(), t),
            None => sched.timed.remove(key),
        };
    }

    /// The safety net of the incremental pass (tests only): every active service the next
    /// pass would leave out has nothing to do at `now` — no replica to place (but those
    /// waiting for their restart backoff), nothing to drain, no rollout to complete, and
    /// a timer for its rollout's deadline.
    #[cfg(test)]
    pub(super) fn check_skipped(&self, now: Instant) {
        use xce_model::rollout::{self, RolloutState};
        // What a pass costs is counted without this net.
        let built = self.facts_built.get();
        for (key, s) in &self.cluster.services {
            if s.state != ServiceState::Active
                || self.sched.marked.contains(key)
                || self.sched.waiting.contains(key)
            {
                continue;
            }
            let Some(profile) = self.profiles.get(key) else {
                continue;
            };
            let facts = self.job_facts(&s.info, self.cluster.jobs_of(key), now);
            let view = rollout::Service {
                replicas: s.info.replicas,
                generation: s.info.generation,
                policy: profile.update,
                jobs: &facts,
            };
            for r in rollout::to_place(&view) {
                let deferred = self
                    .backoff
                    .get(&(key.clone(), r))
                    .is_some_and(|b| b.not_before > now);
                assert!(
                    deferred,
                    "{key:?}: replica {r} is to be placed, but no pass visits the service"
                );
            }
            let drain = rollout::to_drain(&view);
            assert!(
                drain.is_empty(),
                "{key:?}: {drain:?} are to drain, but no pass visits the service"
            );
            let generation = s.info.generation;
            let acts = s.rollout.is_running(generation) || s.rollout.state == RolloutState::Failed;
            assert!(
                !(acts && view.is_complete()),
                "{key:?}: its rollout is to complete, but no pass visits the service"
            );
            if self.progress.contains_key(key) {
                assert!(
                    self.sched.timed.contains_key(key),
                    "{key:?}: its rollout has a deadline, but no timer for it"
                );
            }
        }
        self.facts_built.set(built);
    }
}
