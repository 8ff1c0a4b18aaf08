//! The scheduling pass that runs after every committed change or due timer (`settle`):
//! places the replicas each service's rollout asks for, drains the jobs it lets go, and
//! moves rollouts on (complete, failed, rolled back). One store batch per pass.

use super::commit::{encoded_len, Budget};
use super::{round_up_secs, stored_profile, Core, CoreError};
use crate::scheduler::{self, Request};
use plugin_api::{HostId, HostState, JobId, JobInfo, JobState, ResourcePlugin, ServiceKey};
use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use xce_model::rollout::{self, Phase, RolloutState, Stable};
use xce_model::{JobRec, ServiceRec, ServiceState, Txn};
use xce_proto::worker::ExitCause;

/// Ready hosts in spread order, as `(the service's jobs, all jobs, host index)`.
type SpreadOrder = BTreeSet<(usize, usize, usize)>;

/// What one scheduling pass did.
#[derive(Debug, Default)]
struct Pass {
    /// It drained a replica (a further round may place a surge replica).
    drained: bool,
    /// The store's batch limit cut it short at this service: the next pass continues
    /// there.
    cut: Option<ServiceKey>,
    /// Its commit failed: nothing it did was applied.
    failed: bool,
    /// It committed a batch.
    committed: bool,
}

impl Core {
    /// Removes stopped services, moves stopping services' jobs out, places missing
    /// replicas, and publishes the result.
    ///
    /// Big changes are cut into passes within the store's batch limit (see
    /// [`Budget`]), each one batch, committed before the next pass starts: the next pass
    /// runs at once (no timer) and continues with the service the last one stopped at.
    pub(crate) fn settle(&mut self, now: Instant) {
        if !self.dirty {
            return;
        }
        self.metrics.settles.inc();
        self.stop_leftovers(now);
        let done: Vec<ServiceRec> = self
            .cluster
            .services
            .values()
            .filter(|s| s.state == ServiceState::Stopping)
            .filter(|s| self.cluster.jobs_of(&s.info.key()).next().is_none())
            .cloned()
            .collect();
        for s in done {
            let mut txn = Txn::new(&self.cluster);
            txn.remove_service(&s);
            let _ = self.commit(txn, now);
        }
        // A round that drained a replica may have made room for a surge replica: place it
        // now rather than at the next wake-up (bounded: each extra round needs a drain).
        for _ in 0..4 {
            let mut from: Option<ServiceKey> = None;
            let mut drained = false;
            let failed = loop {
                let pass = self.schedule(now, from.as_ref());
                drained |= pass.drained;
                if pass.failed {
                    break true;
                }
                match pass.cut {
                    // A cut pass committed something (it is cut only once its batch
                    // holds a change), so each pass makes progress.
                    Some(key) if pass.committed => from = Some(key),
                    _ => break false,
                }
            };
            if failed || !drained {
                break;
            }
        }
        #[cfg(test)]
        self.check_skipped(now);
        self.publish(now);
        self.dirty = false;
    }

    /// Puts the jobs of stopping services that are not on their way out yet on their way
    /// (a stop of more jobs than one batch holds left them to the passes), in batches
    /// within the store's limit.
    fn stop_leftovers(&mut self, now: Instant) {
        let stopping: Vec<ServiceKey> = self
            .cluster
            .services
            .values()
            .filter(|s| s.state == ServiceState::Stopping)
            .map(|s| s.info.key())
            .collect();
        for key in stopping {
            loop {
                let drain = self.stop_drain(&key);
                let left: Vec<JobRec> = self
                    .cluster
                    .jobs_of(&key)
                    .filter(|j| stays(j, drain))
                    .cloned()
                    .collect();
                if left.is_empty() {
                    break;
                }
                let mut txn = Txn::new(&self.cluster);
                self.leave_within(&mut txn, left, drain);
                if self.commit(txn, now).is_err() {
                    return;
                }
            }
        }
    }

    /// Puts `jobs` on their way out (see `leave`) as far as the store's batch limit
    /// allows; returns how many.
    pub(super) fn leave_within(&self, txn: &mut Txn, jobs: Vec<JobRec>, drain: Duration) -> usize {
        let mut budget = Budget::new(self.store.batch_limit());
        let mut size = 0;
        let mut n = 0;
        for j in jobs {
            if size == 0 {
                size = encoded_len(&j);
            }
            if n > 0 && !budget.room(txn, size) {
                break;
            }
            self.leave(txn, j, drain);
            budget.add(size);
            n += 1;
        }
        n
    }

    /// One scheduling pass over the active services from `from` on (all when `None`):
    /// places the replicas each service's rollout asks for, drains the jobs it lets go,
    /// and moves the rollout on (complete, failed, a rollback). One store batch for all of
    /// it, within the store's batch limit; on failure nothing is applied and every
    /// reservation is released.
    fn schedule(&mut self, now: Instant, from: Option<&ServiceKey>) -> Pass {
        // Only the services something happened to (see `sched.rs`); keys only: a cut
        // pass stops early, and the next one clones from where it was.
        let services = self.visit_list(now, from);
        // This pass sees these backoffs over: no timer for them any more (see `over`);
        // `visit_list` took their services.
        for b in self.backoff.values_mut() {
            b.over |= b.not_before <= now;
        }
        let mut pass = Pass::default();
        if services.is_empty() {
            return pass;
        }
        // Hosts that may take placements (by id), and their load: computed once per pass
        // and kept current as replicas are placed.
        let ready: Vec<HostId> = self
            .cluster
            .hosts
            .values()
            .filter(|h| h.info.state == HostState::Ready && h.orphans.is_empty())
            .map(|h| h.info.id.clone())
            .collect();
        let index: HashMap<&HostId, usize> =
            ready.iter().enumerate().map(|(i, h)| (h, i)).collect();
        let mut total: Vec<usize> = ready.iter().map(|h| self.cluster.count_on(h)).collect();
        let mut budget = Budget::new(self.store.batch_limit());
        let mut txn = Txn::new(&self.cluster);
        let mut placed: Vec<(HostId, JobId, ServiceKey, u32)> = Vec::new();
        let mut reverts: Vec<(ServiceKey, String)> = Vec::new();
        // The services visited in full, and whether each drained (see below).
        let mut visited: Vec<(ServiceKey, bool)> = Vec::new();
        for key in services {
            let s = self.cluster.services[&key].clone();
            let name = &s.info.name;
            let Some(profile) = self.profiles.get(&key) else {
                // Nothing to act on without a profile; visited again when written.
                self.sched.marked.remove(&key);
                continue;
            };
            let (policy, drain) = (profile.update, profile.drain);
            // The service's record may change in this batch (its rev, its rollout): room
            // for it first, counted until the service turns out untouched.
            let record = encoded_len(&s);
            if !txn.is_empty() && !budget.room(&txn, record) {
                pass.cut = Some(key);
                break;
            }
            budget.add(record);
            self.pending.remove(&key);
            // Borrowed, cloned only when this pass changes one (most services change
            // nothing in most passes: cloning every job per settle was a fifth of it).
            let mut jobs: Vec<Cow<'_, JobRec>> =
                self.cluster.jobs_of(&key).map(Cow::Borrowed).collect();
            let facts = self.job_facts(&s.info, jobs.iter().map(|j| &**j), now);
            // Without its jobs: each view below borrows the facts of its moment.
            let base = rollout::Service {
                replicas: s.info.replicas,
                generation: s.info.generation,
                policy,
                jobs: &[],
            };
            let view = rollout::Service {
                jobs: &facts,
                ..base
            };
            let occupied: BTreeSet<u32> = facts
                .iter()
                .filter(|f| f.phase != Phase::Leaving)
                .map(|f| f.replica)
                .collect();
            // Why a surge replica (one beside an old job) could not be placed.
            let mut blocked: Option<String> = None;
            // The ready hosts in spread order for this service (fewest of its jobs, then
            // fewest jobs, then id), kept sorted as it places: built at its first
            // placement, so a service with nothing to place costs nothing here.
            let mut order: Option<(Vec<usize>, SpreadOrder)> = None;
            let mut size = 0;
            // Placed here (the facts change), and whether a replica did not fit.
            let mut placed_here = false;
            let mut waiting = false;
            for replica in rollout::to_place(&view) {
                if let Some(b) = self.backoff.get(&(key.clone(), replica)) {
                    if b.not_before > now {
                        let cause = s.slots.get(&replica).and_then(|r| r.last_exit.as_ref());
                        let reason = restart_reason(
                            cause.map(|e| &e.cause),
                            round_up_secs(b.not_before - now),
                        );
                        self.pending
                            .entry(key.clone())
                            .or_default()
                            .insert(replica, reason);
                        continue;
                    }
                }
                if size > 0 && !budget.room(&txn, size) {
                    pass.cut = Some(key.clone());
                    break;
                }
                let (mine, sorted) = order.get_or_insert_with(|| {
                    let mut mine = vec![0; ready.len()];
                    for j in &jobs {
                        if let Some(i) = index.get(&j.info.host) {
                            mine[*i] += 1;
                        }
                    }
                    let sorted = (0..ready.len()).map(|i| (mine[i], total[i], i)).collect();
                    (mine, sorted)
                });
                let job = txn.peek_job_id(&self.cluster);
                let req = Request {
                    service: name,
                    project: &s.info.project,
                    replica,
                    job: &job,
                    profile: &s.info.profile,
                };
                let hosts = sorted.iter().map(|&(_, _, i)| &ready[i]);
                match scheduler::place_ordered(&mut self.plugins, hosts, ready.len(), &req) {
                    Ok(p) => {
                        let taken = txn.new_job_id(&self.cluster);
                        debug_assert_eq!(taken, job);
                        let i = index[&p.host];
                        sorted.remove(&(mine[i], total[i], i));
                        mine[i] += 1;
                        total[i] += 1;
                        sorted.insert((mine[i], total[i], i));
                        placed.push((p.host.clone(), job.clone(), key.clone(), replica));
                        let rec = JobRec {
                            info: JobInfo {
                                job,
                                service: name.clone(),
                                project: s.info.project.clone(),
                                replica,
                                host: p.host,
                                state: JobState::Placed,
                                ready: false,
                                grants: p.grants,
                                generation: s.info.generation,
                            },
                            held: None,
                            held_ready: None,
                            log: None,
                        };
                        if size == 0 {
                            // A service's job records differ little in size (the same
                            // grants, ids a digit longer): measured once.
                            size = encoded_len(&rec) + 16;
                        }
                        budget.add(size);
                        txn.put_job(&self.cluster, rec.clone());
                        jobs.push(Cow::Owned(rec));
                        placed_here = true;
                    }
                    Err(reason) => {
                        debug!(service = %name, replica, reason = %reason, "replica pending");
                        waiting = true;
                        if occupied.contains(&replica) {
                            blocked.get_or_insert_with(|| reason.clone());
                        } else {
                            self.pending
                                .entry(key.clone())
                                .or_default()
                                .insert(replica, reason);
                        }
                    }
                }
            }
            // Drains, seeing this pass's placements, as far as the batch has room (the
            // facts are built again only when they changed).
            let facts = if placed_here {
                self.job_facts(&s.info, jobs.iter().map(|j| &**j), now)
            } else {
                facts
            };
            let view = rollout::Service {
                jobs: &facts,
                ..base
            };
            let leaving: BTreeSet<JobId> = rollout::to_drain(&view).into_iter().collect();
            let mut drained_here = false;
            for j in jobs.iter_mut().filter(|j| leaving.contains(&j.info.job)) {
                if size == 0 {
                    size = encoded_len(&*j) + 16;
                }
                if !txn.is_empty() && !budget.room(&txn, size) {
                    pass.cut = Some(key.clone());
                    break;
                }
                debug!(service = %name, job = %j.info.job, replica = j.info.replica, generation = j.info.generation, "replica leaves (rollout or scale-down)");
                self.leave(&mut txn, JobRec::clone(j), drain);
                budget.add(size);
                pass.drained = true;
                drained_here = true;
                if let Some(now_rec) = txn.job(&self.cluster, &j.info.job) {
                    *j = Cow::Owned(now_rec);
                }
            }
            let facts = if drained_here {
                self.job_facts(&s.info, jobs.iter().map(|j| &**j), now)
            } else {
                facts
            };
            // Older generations' profiles are kept while any of their jobs is left.
            let gens: BTreeSet<u64> = jobs.iter().map(|j| j.info.generation).collect();
            drop(jobs);
            let view = rollout::Service {
                jobs: &facts,
                ..base
            };
            if let Some(why) = self.advance_rollout(&mut txn, &s, &view, blocked, now) {
                reverts.push((key.clone(), why));
            }
            if let Some(mut rec) = txn.service(&self.cluster, &key) {
                let before = rec.older.len();
                rec.older.retain(|g, _| gens.contains(g));
                if rec.older.len() != before {
                    self.older
                        .retain(|(n, g), _| *n != key || rec.older.contains_key(g));
                    txn.put_service_quiet(rec);
                }
            }
            if !txn.has_service(&key) {
                budget.remove(record);
            }
            if pass.cut.is_some() {
                // Not visited in full: it stays marked (or waiting) for the next pass.
                break;
            }
            self.visited(
                &key,
                (s.info.replicas, s.info.generation),
                &facts,
                (waiting, drained_here),
                now,
            );
            visited.push((key, drained_here));
        }
        if !txn.is_empty() {
            if self.commit(txn, now).is_err() {
                // Nothing of it applied: every service it visited is visited again.
                for (key, _) in visited {
                    self.sched.mark(key);
                }
                for (host, job, service, replica) in placed {
                    for pl in &mut self.plugins {
                        pl.release(&host, &job);
                    }
                    self.pending
                        .entry(service)
                        .or_default()
                        .insert(replica, "the controller's store failed".into());
                }
                // The slots the cut-short service did not get to wait for the same
                // retry: say so rather than nothing.
                if let Some(key) = &pass.cut {
                    if let Some(svc) = self.cluster.services.get(key) {
                        let taken: BTreeSet<u32> =
                            self.cluster.jobs_of(key).map(|j| j.info.replica).collect();
                        let pending = self.pending.entry(key.clone()).or_default();
                        for r in (0..svc.info.replicas).filter(|r| !taken.contains(r)) {
                            pending
                                .entry(r)
                                .or_insert_with(|| "the controller's store failed".into());
                        }
                    }
                }
                pass.failed = true;
                pass.drained = false;
                return pass;
            }
            self.metrics.placements.inc_by(placed.len() as u64);
            pass.committed = true;
            // The commit marked the services it wrote, but this pass saw its own changes:
            // a visit again would find nothing, except after a drain (the slot it freed
            // may take a surge replica: the next round).
            for (key, drained) in visited {
                if !drained {
                    self.sched.marked.remove(&key);
                }
            }
        }
        for (name, why) in reverts {
            if let Err(e) = self.revert(&name, &why, now) {
                self.sched.mark(name.clone());
                warn!(service = %name, error = %e, "rollback could not be committed; trying again on the next pass");
            }
        }
        pass
    }

    /// Moves a running rollout on: complete when every slot runs the current generation,
    /// failed (or a rollback, returned as its reason) when it made no progress for
    /// `deadline` or its new replicas keep exiting; otherwise it says why it waits.
    fn advance_rollout(
        &mut self,
        txn: &mut Txn,
        s: &ServiceRec,
        view: &rollout::Service,
        blocked: Option<String>,
        now: Instant,
    ) -> Option<String> {
        let name = &s.info.name;
        let key = s.info.key();
        let generation = s.info.generation;
        let mut rec = txn.service(&self.cluster, &key)?;
        let mut r = rec.rollout.clone();
        let mut revert = None;
        if !r.is_running(generation) {
            self.progress.remove(&key);
            if r.state == RolloutState::Failed && view.is_complete() {
                // A failed rollout that was not rolled back keeps reconciling; once every
                // slot runs it after all, it is complete (the failure was passing).
                r.state = RolloutState::Complete;
                r.reason = None;
                r.stable = Some(Stable {
                    generation,
                    profile: s.info.profile.clone(),
                });
                self.metrics.rollout_ended("complete");
                info!(service = %name, project = %key.project, generation, "failed rollout completed after all");
            } else if r.state == RolloutState::Complete
                && r.stable.as_ref().map(|st| st.generation) != Some(generation)
            {
                // A service stored before rollouts existed.
                r.stable = Some(Stable {
                    generation,
                    profile: s.info.profile.clone(),
                });
            }
        } else {
            let counts = view.counts();
            let mark = rollout::progress_mark(&counts);
            let since = match self.progress.get(&key) {
                Some((m, t)) if *m == mark => *t,
                _ => {
                    self.progress.insert(key.clone(), (mark, now));
                    now
                }
            };
            if view.is_complete() {
                r.stable = Some(Stable {
                    generation,
                    profile: s.info.profile.clone(),
                });
                if r.state == RolloutState::Progressing {
                    r.state = RolloutState::Complete;
                    r.reason = None;
                    self.metrics.rollout_ended("complete");
                }
                self.progress.remove(&key);
                info!(service = %name, generation, state = r.state.as_str(), "rollout done");
            } else if r.exits >= rollout::MAX_NEW_EXITS
                || now.saturating_duration_since(since) >= view.policy.deadline
            {
                let why = if r.exits >= rollout::MAX_NEW_EXITS {
                    format!(
                        "new replicas keep exiting ({} exits of generation {generation})",
                        r.exits
                    )
                } else {
                    format!(
                        "no progress for {} ({} of {} updated, {} ready, {} outdated)",
                        humantime::format_duration(view.policy.deadline),
                        counts.updated,
                        view.replicas,
                        counts.ready,
                        counts.outdated
                    )
                };
                let target = r.stable.as_ref().map(|st| st.generation);
                self.progress.remove(&key);
                if r.state == RolloutState::Progressing
                    && view.policy.auto_revert
                    && target.is_some_and(|g| g != generation)
                {
                    revert = Some(why);
                } else {
                    let suffix = if r.revert {
                        "; this was a rollback: nothing is rolled back further"
                    } else if !view.policy.auto_revert {
                        "; auto_revert is off"
                    } else {
                        "; no complete generation to roll back to"
                    };
                    r.state = RolloutState::Failed;
                    r.reason = Some(format!("generation {generation} failed: {why}{suffix}"));
                    self.metrics.rollout_ended("failed");
                    warn!(service = %name, generation, reason = %why, "rollout failed");
                }
            } else if r.state == RolloutState::Progressing {
                r.reason = blocked
                    .filter(|_| view.policy.max_unavailable == 0)
                    .map(|why| {
                        format!(
                            "waiting: no new replica fits beside the old ones ({why}); with \
                         max_unavailable = 0 no old replica leaves first"
                        )
                    });
            }
        }
        if r != rec.rollout {
            rec.rollout = r;
            txn.put_service(rec);
        }
        revert
    }

    /// Rolls a failed rollout back: the last complete generation's profile becomes the
    /// next generation, and the jobs still running that profile are that generation's
    /// (they are not replaced by identical ones).
    fn revert(&mut self, key: &ServiceKey, why: &str, now: Instant) -> Result<(), CoreError> {
        let name = &key.name;
        let Some(mut svc) = self.cluster.services.get(key).cloned() else {
            return Ok(());
        };
        let Some(stable) = svc.rollout.stable.clone() else {
            return Ok(());
        };
        let failed = svc.info.generation;
        let raw = rollout::revert_profile(&stable, svc.info.replicas);
        let profile = stored_profile(&self.plugins, &svc.info, &raw);
        self.next_generation(&mut svc);
        let generation = svc.info.generation;
        svc.rollout.state = RolloutState::Reverted;
        svc.rollout.revert = true;
        svc.rollout.reason = Some(format!(
            "generation {failed} failed: {why}; rolled back to generation {}'s profile as generation {generation}",
            stable.generation
        ));
        svc.info.profile = raw;
        let adopted: Vec<JobRec> = self
            .cluster
            .jobs_of(key)
            .filter(|j| j.info.generation == stable.generation)
            .cloned()
            .map(|mut j| {
                j.info.generation = generation;
                j
            })
            .collect();
        warn!(service = %name, failed, generation, reason = %why, "rollout failed; rolling back");
        self.metrics.rollout_ended("reverted");
        self.commit_service_with(svc, profile, adopted, now)
    }
}

/// Why a replica waits for its restart: `restarting after exit 127 in 4s`, `restarting
/// after SIGKILL in 4s`, `restarting in 4s: cannot start "x": No such file or directory (os
/// error 2)`, or without a known cause `restarting after exit in 4s`.
fn restart_reason(cause: Option<&ExitCause>, wait: Duration) -> String {
    let wait = humantime::format_duration(wait);
    let Some(c) = cause else {
        return format!("restarting after exit in {wait}");
    };
    match (&c.error, c.signal, c.code) {
        (Some(e), _, _) => format!("restarting in {wait}: {e}"),
        (None, Some(sig), _) => match c.signal_name() {
            Some(name) => format!("restarting after {name} in {wait}"),
            None => format!("restarting after signal {sig} in {wait}"),
        },
        (None, None, Some(code)) => format!("restarting after exit {code} in {wait}"),
        (None, None, None) => format!("restarting after exit in {wait}"),
    }
}

/// Whether a stopping service's job is still to be put on its way out (with `drain`: a
/// `?now=true` stop also cuts running drains short).
fn stays(j: &JobRec, drain: Duration) -> bool {
    match j.effective_state() {
        JobState::Placed | JobState::Running => true,
        JobState::Draining => drain.is_zero(),
        JobState::Unknown | JobState::Stopping | JobState::Exited | JobState::Lost => false,
    }
}
