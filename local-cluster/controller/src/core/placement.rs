//! The scheduling pass that runs after every committed change or due timer (`settle`):
//! places the replicas each service's rollout asks for, drains the jobs it lets go, and
//! moves rollouts on (complete, failed, rolled back). A pass writes one store batch, or
//! several when the store's batch limit cuts it: each is committed (atomic) when the next
//! record has no room, and the pass carries on with what it computed. A visit's set-up
//! (the service's rollout facts, what to place, the spread order) costs about as much as
//! the service has jobs: paid once per visit, not once per batch (a 10,000-replica
//! service placed in etcd's batches of ~120 jobs was otherwise visited ~85 times:
//! quadratic, the visits 42 % of the controller's CPU in a profile, the commits 3 %).

use super::commit::{encoded_len, Budget};
use super::sched::Visit;
use super::{round_up_secs, stored_profile, Core, CoreError};
use crate::scheduler::{self, Placement, Request};
use plugin_api::{HostId, HostState, JobId, JobInfo, JobState, ResourcePlugin, ServiceKey};
use std::collections::BTreeSet;
use std::iter::Peekable;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use xce_model::rollout::{self, Counts, JobFacts, Phase, Rollout, RolloutState, Stable};
use xce_model::{Cluster, JobRec, ServiceRec, ServiceState, Txn};
use xce_proto::worker::ExitCause;
use xce_store::BatchLimit;

/// Ready hosts in spread order, as `(the service's jobs, all jobs, host index)`.
type SpreadOrder = BTreeSet<(usize, usize, usize)>;

/// What one scheduling pass did, as far as its batches were committed.
#[derive(Debug, Default)]
struct Pass {
    /// It drained a replica (a further round may place a surge replica).
    drained: bool,
    /// A commit failed: nothing of that batch was applied, and the pass ended there (the
    /// batches committed before it stand).
    failed: bool,
    /// The rollbacks its committed batches decided: (service, why).
    reverts: Vec<(ServiceKey, String)>,
}

impl Core {
    /// Removes stopped services, moves stopping services' jobs out, places missing
    /// replicas, and publishes the result.
    ///
    /// Big changes are cut into batches within the store's batch limit (see
    /// [`Budget`]), each committed before the pass goes on (see the module
    /// documentation).
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
            let pass = self.schedule(now);
            if pass.failed || !pass.drained {
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
            let drain = self.stop_drain(&key);
            // Listed once, then batch after batch (a commit changes only the jobs it puts
            // on their way out; listing them again per batch made a stop quadratic).
            let mut left = self
                .cluster
                .jobs_of(&key)
                .filter(|j| stays(j, drain))
                .cloned()
                .collect::<Vec<JobRec>>()
                .into_iter()
                .peekable();
            while left.peek().is_some() {
                let mut txn = Txn::new(&self.cluster);
                self.leave_within(&mut txn, &mut left, drain);
                if self.commit(txn, now).is_err() {
                    return;
                }
            }
        }
    }

    /// Puts the next of `jobs` on their way out (see `leave`) as far as the store's
    /// batch limit allows (one at least); returns how many.
    pub(super) fn leave_within(
        &self,
        txn: &mut Txn,
        jobs: &mut Peekable<impl Iterator<Item = JobRec>>,
        drain: Duration,
    ) -> usize {
        let mut budget = Budget::new(self.store.batch_limit());
        let mut size = 0;
        let mut n = 0;
        while let Some(j) = jobs.next_if(|j| {
            if size == 0 {
                size = encoded_len(j);
            }
            n == 0 || budget.room(txn, size)
        }) {
            self.leave(txn, j, drain);
            budget.add(size);
            n += 1;
        }
        n
    }

    /// One scheduling pass over the active services: places the replicas each service's
    /// rollout asks for, drains the jobs it lets go, and moves the rollout on (complete,
    /// failed, a rollback). Store batches within the store's batch limit, each committed
    /// once the next record has no room in it; a failed commit ends the pass, and
    /// releases the reservations of its batch (the batches committed before stand).
    fn schedule(&mut self, now: Instant) -> Pass {
        // Only the services something happened to (see `sched.rs`); keys only: a failed
        // pass stops early.
        let services = self.visit_list(now);
        self.see_backoffs_over(now);
        if services.is_empty() {
            return Pass::default();
        }
        let mut hosts = ReadyHosts::of(&self.cluster);
        let mut batch = Batch::new(&self.cluster, self.store.batch_limit());
        for key in services {
            self.visit(&mut batch, &mut hosts, key, now);
            if batch.pass.failed {
                break;
            }
        }
        if !batch.pass.failed {
            self.commit_batch(&mut batch, None, now);
        }
        let mut pass = batch.pass;
        self.roll_back(std::mem::take(&mut pass.reverts), now);
        pass
    }

    /// Whether `batch` may take one more record of about `next` bytes: when it may not,
    /// the batch so far is committed first (`cut`: the service being visited, for
    /// [`pass_failed`](Self::pass_failed)). False when that commit failed: the pass is
    /// over. A batch always takes its first record.
    fn room(&mut self, batch: &mut Batch, next: usize, cut: &ServiceKey, now: Instant) -> bool {
        if batch.txn.is_empty() || batch.budget.room(&batch.txn, next) {
            return true;
        }
        self.commit_batch(batch, Some(cut), now);
        !batch.pass.failed
    }

    /// Marks the restart backoffs that are over at `now` as seen by a pass: no timer for
    /// them any more (see `RestartBackoff::over`); `visit_list` took their services.
    fn see_backoffs_over(&mut self, now: Instant) {
        for b in self.backoff.values_mut() {
            b.over |= b.not_before <= now;
        }
    }

    /// Visits one service in the pass: places what its rollout asks for, drains what it
    /// lets go, moves the rollout on and drops the profiles of generations that have no
    /// job left, into the pass's batches (see [`room`](Self::room)).
    fn visit(&mut self, batch: &mut Batch, hosts: &mut ReadyHosts, key: ServiceKey, now: Instant) {
        let s = self.cluster.services[&key].clone();
        let Some(profile) = self.profiles.get(&key) else {
            // Nothing to act on without a profile; visited again when written.
            self.sched.marked.remove(&key);
            return;
        };
        let (policy, drain) = (profile.update, profile.drain);
        // The service's record may change in the last batch of the visit (its rev, its
        // rollout): room for it first, kept in every batch of the visit, counted until
        // the service turns out untouched.
        let record = encoded_len(&s);
        if !self.room(batch, record, &key, now) {
            return;
        }
        batch.budget.add(record);
        batch.kept = record;
        self.pending.remove(&key);
        let base = rollout::Service {
            replicas: s.info.replicas,
            generation: s.info.generation,
            policy,
            jobs: &[],
        };
        let acted = self.place_and_drain(batch, hosts, &s, base, drain, now);
        if batch.pass.failed {
            // Not visited in full: it stays marked (or waiting) for the next pass (and
            // its facts, not given back, are built whole then).
            return;
        }
        let view = rollout::Service {
            jobs: &acted.facts,
            ..base
        };
        if let Some(why) = self.advance_rollout(&mut batch.txn, &s, &view, acted.blocked, now) {
            batch.reverts.push((key.clone(), why));
        }
        self.drop_unused_generations(&mut batch.txn, &key, &acted.generations);
        if !batch.txn.has_service(&key) {
            batch.budget.remove(record);
        }
        batch.kept = 0;
        let visit = Visit {
            replicas: s.info.replicas,
            generation: s.info.generation,
            facts: &acted.facts,
            waiting: acted.waiting,
            drained: acted.drained,
        };
        self.visited(&key, visit, now);
        self.give_back(&key, acted.facts, acted.kept, acted.drained_ids);
        batch.visited.push((key, acted.drained));
    }

    /// Places the replicas of `s` its rollout asks for, then drains the jobs it lets go
    /// (seeing those placements), into the pass's batches; `base` is the rollout's view
    /// of the service without its jobs. The service's facts are built once, then patched
    /// with each job placed or drained (the others' facts do not change: nothing but
    /// this visit writes in the meantime, and `now` stays).
    fn place_and_drain(
        &mut self,
        batch: &mut Batch,
        hosts: &mut ReadyHosts,
        s: &ServiceRec,
        base: rollout::Service<'static>,
        drain: Duration,
        now: Instant,
    ) -> Acted {
        let key = s.info.key();
        let mut facts = self.take_facts(&s.info, now);
        let kept = facts.len();
        let mut generations = self.generations(&key, &facts);
        let mut job_size = 0;
        let view = rollout::Service {
            jobs: &facts,
            ..base
        };
        let placing = self.place_replicas(batch, hosts, s, &view, &mut job_size, now);
        if !placing.facts.is_empty() {
            generations.insert(s.info.generation);
        }
        // After the others, as the service's jobs were listed when they were rebuilt.
        facts.extend(placing.facts);
        let drained_ids = if batch.pass.failed {
            Vec::new()
        } else {
            self.drain_released(batch, s, &mut facts, base, drain, &mut job_size, now)
        };
        Acted {
            facts,
            kept,
            blocked: placing.blocked,
            waiting: placing.waiting,
            drained: !drained_ids.is_empty(),
            drained_ids,
            generations,
        }
    }

    /// The generations the jobs of service `key` run; `facts`: those jobs' facts. From
    /// the facts when every job has one (a lookup of each job in the cluster's map was a
    /// visit's cost of its own), else from the jobs (an exited or unknown job has none).
    fn generations(&self, key: &ServiceKey, facts: &[JobFacts]) -> BTreeSet<u64> {
        let mut out = BTreeSet::new();
        let mut last = None;
        let mut add = |g: u64| {
            // Mostly one generation: a set insert per job only when it changes.
            if last != Some(g) {
                out.insert(g);
                last = Some(g);
            }
        };
        if facts.len() == self.cluster.count_of(key) {
            facts.iter().for_each(|f| add(f.generation));
        } else {
            self.cluster
                .jobs_of(key)
                .for_each(|j| add(j.info.generation));
        }
        out
    }

    /// Places the replicas the rollout asks for (`view`) but those waiting for their
    /// restart backoff (their pending reason says how long), each on the first host in
    /// spread order that takes it, into the pass's batches. `job_size` is the
    /// service's job records' size, measured once (they differ little: the same grants,
    /// ids a digit longer).
    fn place_replicas(
        &mut self,
        batch: &mut Batch,
        hosts: &mut ReadyHosts,
        s: &ServiceRec,
        view: &rollout::Service,
        job_size: &mut usize,
        now: Instant,
    ) -> Placing {
        let key = s.info.key();
        // By slot, not a set: built at every visit.
        let mut occupied = vec![false; s.info.replicas as usize];
        for f in view.jobs.iter().filter(|f| f.phase != Phase::Leaving) {
            if let Some(o) = occupied.get_mut(f.replica as usize) {
                *o = true;
            }
        }
        let mut out = Placing::default();
        // Whether any host drains: asked once, at the first placement.
        let mut drains: Option<bool> = None;
        let min_ready = self.min_ready_of(&key);
        // Built at the service's first placement, so a service with nothing to place
        // costs nothing here.
        let mut spread: Option<Spread> = None;
        for replica in rollout::to_place(view) {
            if let Some(reason) = self.backoff_wait(&key, s, replica, now) {
                self.pending
                    .entry(key.clone())
                    .or_default()
                    .insert(replica, reason);
                continue;
            }
            if *job_size > 0 && !self.room(batch, *job_size, &key, now) {
                break;
            }
            let spread = spread.get_or_insert_with(|| {
                Spread::new(hosts, self.cluster.jobs_of(&key), s.info.generation)
            });
            match self.place_replica(batch, hosts, spread, s, replica) {
                Ok(rec) => {
                    if *job_size == 0 {
                        *job_size = encoded_len(&rec) + 16;
                    }
                    batch.budget.add(*job_size);
                    let drains = *drains.get_or_insert_with(|| self.any_host_drains());
                    out.facts
                        .extend(self.fact_of(&s.info, &rec, now, min_ready, drains));
                    batch.txn.put_job(&self.cluster, rec);
                }
                Err(reason) => {
                    debug!(service = %s.info.name, replica, reason = %reason, "replica pending");
                    out.waiting = true;
                    if occupied.get(replica as usize).copied().unwrap_or(false) {
                        out.blocked.get_or_insert_with(|| reason.clone());
                    } else {
                        self.pending
                            .entry(key.clone())
                            .or_default()
                            .insert(replica, reason);
                    }
                }
            }
        }
        out
    }

    /// Why replica `replica` of `s` waits, while its restart backoff (earned by exits of
    /// the generation it would be placed with) runs.
    fn backoff_wait(
        &self,
        key: &ServiceKey,
        s: &ServiceRec,
        replica: u32,
        now: Instant,
    ) -> Option<String> {
        let b = self.backoff.get(&(key.clone(), replica))?;
        // A backoff another generation's exits earned is not this one's to wait for.
        if b.not_before <= now || b.generation != s.info.generation {
            return None;
        }
        let cause = s.slots.get(&replica).and_then(|r| r.last_exit.as_ref());
        Some(restart_reason(
            cause.map(|e| &e.cause),
            round_up_secs(b.not_before - now),
        ))
    }

    /// Places replica `replica` of `s` on the first ready host in spread order that takes
    /// it (reserved with every plugin, noted for a release should the commit fail); or
    /// says why it fits nowhere. The caller writes the returned job into the batch.
    fn place_replica(
        &mut self,
        batch: &mut Batch,
        hosts: &mut ReadyHosts,
        spread: &mut Spread,
        s: &ServiceRec,
        replica: u32,
    ) -> Result<JobRec, String> {
        let job = batch.txn.peek_job_id(&self.cluster);
        let req = Request {
            service: &s.info.name,
            project: &s.info.project,
            replica,
            job: &job,
            profile: &s.info.profile,
        };
        let p = scheduler::place_ordered(
            &mut self.plugins,
            spread.order(hosts),
            hosts.ids.len(),
            &req,
        )?;
        let taken = batch.txn.new_job_id(&self.cluster);
        debug_assert_eq!(taken, job);
        let i = hosts.index(&p.host).expect("placed on a ready host");
        spread.took(hosts, i);
        batch.placed.push(Reserved {
            host: p.host.clone(),
            job: job.clone(),
            service: s.info.key(),
            replica,
        });
        Ok(placed_job(s, job, replica, p))
    }

    /// Puts the jobs the rollout lets go (the service `s` as `base` and `facts` show
    /// it, after this visit's placements) on their way out, into the pass's batches; each
    /// drained job's facts become its new record's. Returns the jobs drained.
    #[allow(clippy::too_many_arguments)]
    fn drain_released(
        &mut self,
        batch: &mut Batch,
        s: &ServiceRec,
        facts: &mut [JobFacts],
        base: rollout::Service<'static>,
        drain: Duration,
        job_size: &mut usize,
        now: Instant,
    ) -> Vec<JobId> {
        let key = s.info.key();
        let view = rollout::Service {
            jobs: &*facts,
            ..base
        };
        let leaving: BTreeSet<JobId> = rollout::to_drain(&view).into_iter().collect();
        if leaving.is_empty() {
            return Vec::new();
        }
        // In the service's job order, each with whether it stops at once (never ready,
        // superseded: nothing to drain, so no process held for `drain`).
        let order: Vec<(usize, bool)> = view
            .jobs
            .iter()
            .enumerate()
            .filter(|(_, f)| leaving.contains(&*f.job))
            .map(|(i, f)| (i, rollout::stops_at_once(&view, f)))
            .collect();
        let mut drained = Vec::new();
        for (i, at_once) in order {
            let Some(j) = batch.txn.job(&self.cluster, &facts[i].job) else {
                continue;
            };
            if *job_size == 0 {
                *job_size = encoded_len(&j) + 16;
            }
            if !self.room(batch, *job_size, &key, now) {
                break;
            }
            debug!(service = %j.info.service, job = %j.info.job, replica = j.info.replica, generation = j.info.generation, at_once, "replica leaves (rollout or scale-down)");
            let drain = if at_once { Duration::ZERO } else { drain };
            self.leave(&mut batch.txn, j, drain);
            batch.budget.add(*job_size);
            batch.drained = true;
            drained.push(facts[i].job.to_string());
            if let Some(now_rec) = batch.txn.job(&self.cluster, &facts[i].job) {
                if let Some(f) = self.job_facts(&s.info, [&now_rec], now).pop() {
                    facts[i] = f;
                }
            }
        }
        drained
    }

    /// Drops the profiles of the service's older generations that no job runs any more
    /// (`gens`: the generations its jobs run) from its record and from memory.
    fn drop_unused_generations(&mut self, txn: &mut Txn, key: &ServiceKey, gens: &BTreeSet<u64>) {
        let Some(mut rec) = txn.service(&self.cluster, key) else {
            return;
        };
        let before = rec.older.len();
        rec.older.retain(|g, _| gens.contains(g));
        if rec.older.len() != before {
            self.older
                .retain(|(n, g), _| n != key || rec.older.contains_key(g));
            txn.put_service_quiet(rec);
        }
    }

    /// Commits the pass's batch so far (if it holds anything) and starts its next one,
    /// with the room kept for the record of the service being visited; `cut`: that
    /// service, when the batch limit cut its visit. A failed commit ends the pass
    /// (`batch.pass.failed`).
    fn commit_batch(&mut self, batch: &mut Batch, cut: Option<&ServiceKey>, now: Instant) {
        let txn = std::mem::replace(&mut batch.txn, Txn::new(&self.cluster));
        let placed = std::mem::take(&mut batch.placed);
        let visited = std::mem::take(&mut batch.visited);
        let reverts = std::mem::take(&mut batch.reverts);
        let drained = std::mem::take(&mut batch.drained);
        batch.budget = Budget::new(self.store.batch_limit());
        if txn.is_empty() {
            batch.pass.reverts.extend(reverts);
            return;
        }
        let placements = placed.len() as u64;
        if self.commit(txn, now).is_err() {
            self.pass_failed(visited, placed, cut);
            batch.pass.failed = true;
            return;
        }
        // The next batch's ids and revisions follow the committed ones.
        batch.txn = Txn::new(&self.cluster);
        if batch.kept > 0 {
            batch.budget.add(batch.kept);
        }
        self.metrics.placements.inc_by(placements);
        batch.pass.drained |= drained;
        batch.pass.reverts.extend(reverts);
        // The commit marked the services it wrote, but this pass saw its own changes:
        // a visit again would find nothing, except after a drain (the slot it freed
        // may take a surge replica: the next round).
        for (key, drained) in visited {
            if !drained {
                self.sched.marked.remove(&key);
            }
        }
    }

    /// After a pass's commit failed (nothing of its batch applied): every service the
    /// batch visited is visited again, its reservations are released, and the slots it
    /// placed, and those of the service it was cut short at, say that the store failed.
    fn pass_failed(
        &mut self,
        visited: Vec<(ServiceKey, bool)>,
        placed: Vec<Reserved>,
        cut: Option<&ServiceKey>,
    ) {
        for (key, _) in visited {
            self.sched.mark(key);
        }
        for r in placed {
            for pl in &mut self.plugins {
                pl.release(&r.host, &r.job);
            }
            self.pending
                .entry(r.service)
                .or_default()
                .insert(r.replica, STORE_FAILED.into());
        }
        // The slots the cut-short service did not get to wait for the same retry: say
        // so rather than nothing.
        if let Some(key) = cut {
            if let Some(svc) = self.cluster.services.get(key) {
                let taken: BTreeSet<u32> =
                    self.cluster.jobs_of(key).map(|j| j.info.replica).collect();
                let pending = self.pending.entry(key.clone()).or_default();
                for r in (0..svc.info.replicas).filter(|r| !taken.contains(r)) {
                    pending.entry(r).or_insert_with(|| STORE_FAILED.into());
                }
            }
        }
    }

    /// Makes the rollbacks a committed pass decided: a service whose rollback cannot be
    /// committed is visited again by the next pass.
    fn roll_back(&mut self, reverts: Vec<(ServiceKey, String)>, now: Instant) {
        for (name, why) in reverts {
            if let Err(e) = self.revert(&name, &why, now) {
                self.sched.mark(name.clone());
                warn!(service = %name, error = %e, "rollback could not be committed; trying again on the next pass");
            }
        }
    }

    /// Moves a rollout on: a running one completes when every slot runs the current
    /// generation, fails (or is to be rolled back: returned as its reason) when it made
    /// no progress for `deadline` or its new replicas keep exiting, and otherwise says
    /// why it waits (`blocked`: why a surge replica did not fit); one that no longer runs
    /// is kept true to the jobs (see [`settle_idle_rollout`](Self::settle_idle_rollout)).
    fn advance_rollout(
        &mut self,
        txn: &mut Txn,
        s: &ServiceRec,
        view: &rollout::Service,
        blocked: Option<String>,
        now: Instant,
    ) -> Option<String> {
        let key = s.info.key();
        let mut rec = txn.service(&self.cluster, &key)?;
        let mut r = rec.rollout.clone();
        let mut revert = None;
        if !r.is_running(s.info.generation) {
            self.progress.remove(&key);
            self.settle_idle_rollout(&mut r, s, view);
        } else {
            match self.drive_rollout(&mut r, s, view, now) {
                Drive::Revert(why) => revert = Some(why),
                Drive::Waits if r.state == RolloutState::Progressing => {
                    r.reason =
                        waiting_reason(blocked, view).or_else(|| self.waiting_for(txn, s, view))
                }
                Drive::Waits | Drive::Ended => {}
            }
        }
        if r != rec.rollout {
            // A new waiting reason alone (a replica started, got ready, its probe failed
            // another way) is no change the readers of the event feed need: it moves
            // neither the service's `rev` nor its endpoints' index. The view shows it.
            let reason_only = r.state == rec.rollout.state
                && Rollout {
                    reason: rec.rollout.reason.clone(),
                    ..r.clone()
                } == rec.rollout;
            rec.rollout = r;
            if reason_only {
                txn.put_service_quiet(rec);
            } else {
                txn.put_service(rec);
            }
        }
        revert
    }

    /// A rollout that no longer acts: a failed one that was not rolled back keeps
    /// reconciling, and once every slot runs its generation after all it is complete (the
    /// failure was passing); a service stored before rollouts existed gets its stable
    /// generation.
    fn settle_idle_rollout(&self, r: &mut Rollout, s: &ServiceRec, view: &rollout::Service) {
        let generation = s.info.generation;
        if r.state == RolloutState::Failed && view.is_complete() {
            r.state = RolloutState::Complete;
            r.reason = None;
            r.stable = Some(stable_of(s));
            self.metrics.rollout_ended("complete");
            info!(service = %s.info.name, project = %s.info.project, generation, "failed rollout completed after all");
        } else if r.state == RolloutState::Complete
            && r.stable.as_ref().map(|st| st.generation) != Some(generation)
        {
            r.stable = Some(stable_of(s));
        }
    }

    /// A running rollout: complete, failed, to be rolled back, or waiting.
    fn drive_rollout(
        &mut self,
        r: &mut Rollout,
        s: &ServiceRec,
        view: &rollout::Service,
        now: Instant,
    ) -> Drive {
        let key = s.info.key();
        let counts = view.counts();
        let since = self.progress_since(&key, &counts, now);
        if view.is_complete() {
            self.complete_rollout(r, s);
            return Drive::Ended;
        }
        let Some(why) = stall_reason(r, view, &counts, s.info.generation, since, now) else {
            return Drive::Waits;
        };
        self.progress.remove(&key);
        match self.fail_rollout(r, s, view, why) {
            Some(why) => Drive::Revert(why),
            None => Drive::Ended,
        }
    }

    /// When the rollout last made progress: `now` if its counts moved since the last
    /// visit (the deadline starts again), else when they last did.
    fn progress_since(&mut self, key: &ServiceKey, counts: &Counts, now: Instant) -> Instant {
        let mark = rollout::progress_mark(counts);
        match self.progress.get(key) {
            Some((m, t)) if *m == mark => *t,
            _ => {
                self.progress.insert(key.clone(), (mark, now));
                now
            }
        }
    }

    /// Every slot runs the current generation: it is the stable one now.
    fn complete_rollout(&mut self, r: &mut Rollout, s: &ServiceRec) {
        r.stable = Some(stable_of(s));
        if r.state == RolloutState::Progressing {
            r.state = RolloutState::Complete;
            r.reason = None;
            self.metrics.rollout_ended("complete");
        }
        self.progress.remove(&s.info.key());
        info!(service = %s.info.name, generation = s.info.generation, state = r.state.as_str(), "rollout done");
    }

    /// A rollout that stalled (`why`): returned for a rollback when it may roll back
    /// (progressing, `auto_revert`, a stable generation other than this one), else
    /// failed with the reason why nothing is rolled back.
    fn fail_rollout(
        &self,
        r: &mut Rollout,
        s: &ServiceRec,
        view: &rollout::Service,
        why: String,
    ) -> Option<String> {
        let generation = s.info.generation;
        let target = r.stable.as_ref().map(|st| st.generation);
        if r.state == RolloutState::Progressing
            && view.policy.auto_revert
            && target.is_some_and(|g| g != generation)
        {
            return Some(why);
        }
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
        warn!(service = %s.info.name, generation, reason = %why, "rollout failed");
        None
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

/// What a pending slot says when the pass that placed it, or did not get to it, failed
/// to commit.
const STORE_FAILED: &str = "the controller's store failed";

/// The hosts that may take placements (ready, without orphans) in id order, and each
/// one's job count: computed once per pass and kept current as it places.
struct ReadyHosts {
    ids: Vec<HostId>,
    /// All jobs on each host (by index in `ids`).
    total: Vec<usize>,
}

impl ReadyHosts {
    fn of(cluster: &Cluster) -> Self {
        let ids: Vec<HostId> = cluster
            .hosts
            .values()
            // A cordoned or draining host takes nothing new (`maintenance.rs`).
            .filter(|h| {
                h.info.state == HostState::Ready && h.orphans.is_empty() && h.maintenance.is_none()
            })
            .map(|h| h.info.id.clone())
            .collect();
        debug_assert!(ids.windows(2).all(|w| w[0] < w[1]), "hosts in id order");
        let total = ids.iter().map(|h| cluster.count_on(h)).collect();
        ReadyHosts { ids, total }
    }

    /// The index of a ready host (the ids are sorted: the hosts map's order).
    fn index(&self, id: &str) -> Option<usize> {
        self.ids.binary_search_by(|h| h.as_str().cmp(id)).ok()
    }
}

/// The ready hosts in spread order for one service (fewest of its jobs, then fewest
/// jobs, then id), kept sorted as it places.
struct Spread {
    /// The service's jobs on each ready host (by index in [`ReadyHosts`]).
    mine: Vec<usize>,
    sorted: SpreadOrder,
}

impl Spread {
    /// The order for a service of `generation` whose jobs are `jobs`. Only the jobs
    /// that stay count: not those on their way out (draining, stopping), nor those of an
    /// older generation a rollout is replacing. Counting them piled a restart's
    /// replacements onto the hosts the old ones had left (two on one host, none on
    /// another).
    fn new<'a>(
        hosts: &ReadyHosts,
        jobs: impl Iterator<Item = &'a JobRec>,
        generation: u64,
    ) -> Self {
        let mut mine = vec![0; hosts.ids.len()];
        for j in jobs.filter(|j| !leaving(j) && j.info.generation >= generation) {
            if let Some(i) = hosts.index(&j.info.host) {
                mine[i] += 1;
            }
        }
        let sorted = (0..hosts.ids.len())
            .map(|i| (mine[i], hosts.total[i], i))
            .collect();
        Spread { mine, sorted }
    }

    fn order<'h>(&'h self, hosts: &'h ReadyHosts) -> impl Iterator<Item = &'h HostId> + 'h {
        self.sorted.iter().map(|&(_, _, i)| &hosts.ids[i])
    }

    /// Host `i` took one more job of the service.
    fn took(&mut self, hosts: &mut ReadyHosts, i: usize) {
        self.sorted.remove(&(self.mine[i], hosts.total[i], i));
        self.mine[i] += 1;
        hosts.total[i] += 1;
        self.sorted.insert((self.mine[i], hosts.total[i], i));
    }
}

/// What one scheduling pass builds: its store batch and what the commit (or its
/// failure) must finish, and what its batches committed before did.
struct Batch {
    txn: Txn,
    budget: Budget,
    /// The reservations made: released if the commit fails.
    placed: Vec<Reserved>,
    /// The rollbacks to make once the batch is committed: (service, why).
    reverts: Vec<(ServiceKey, String)>,
    /// The services visited in full, and whether each drained.
    visited: Vec<(ServiceKey, bool)>,
    /// Some service drained a replica.
    drained: bool,
    /// The size of the record of the service being visited, whose room is kept in each
    /// batch of its visit (0 between visits).
    kept: usize,
    /// What the pass's committed batches did.
    pass: Pass,
}

impl Batch {
    fn new(cluster: &Cluster, limit: BatchLimit) -> Self {
        Batch {
            txn: Txn::new(cluster),
            budget: Budget::new(limit),
            placed: Vec::new(),
            reverts: Vec::new(),
            visited: Vec::new(),
            drained: false,
            kept: 0,
            pass: Pass::default(),
        }
    }
}

/// A replica placed by a pass (its reservation held until the commit).
struct Reserved {
    host: HostId,
    job: JobId,
    service: ServiceKey,
    replica: u32,
}

/// What placing a service's replicas did.
#[derive(Default)]
struct Placing {
    /// The facts of the jobs placed (written into the pass's batches).
    facts: Vec<JobFacts>,
    /// Why a surge replica (one beside an old job) could not be placed.
    blocked: Option<String>,
    /// A replica did not fit.
    waiting: bool,
}

/// Where a running rollout stands after a visit.
enum Drive {
    /// Complete, or failed without a rollback.
    Ended,
    /// Failed, to be rolled back (why).
    Revert(String),
    /// Neither complete nor stalled.
    Waits,
}

/// What a service's placements and drains in a pass left.
struct Acted {
    /// Its jobs as the rollout sees them now.
    facts: Vec<JobFacts>,
    /// How many of `facts` were taken from the kept ones (the rest were placed).
    kept: usize,
    /// Why a surge replica (one beside an old job) could not be placed.
    blocked: Option<String>,
    /// A replica did not fit.
    waiting: bool,
    /// A job drained.
    drained: bool,
    /// The jobs drained (their facts patched in `facts`).
    drained_ids: Vec<JobId>,
    /// The generations its jobs run (older generations' profiles are kept while any of
    /// their jobs is left).
    generations: BTreeSet<u64>,
}

/// The record of a job just placed: replica `replica` of `s` where `p` says.
fn placed_job(s: &ServiceRec, job: JobId, replica: u32, p: Placement) -> JobRec {
    JobRec {
        info: JobInfo {
            job,
            service: s.info.name.clone(),
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
    }
}

/// The current generation of `s` as the stable one.
fn stable_of(s: &ServiceRec) -> Stable {
    Stable {
        generation: s.info.generation,
        profile: s.info.profile.clone(),
    }
}

/// Why a running rollout (of `generation`) failed, if it did: its new replicas kept
/// exiting, or it made no progress since `since` for its `deadline`.
fn stall_reason(
    r: &Rollout,
    view: &rollout::Service,
    counts: &Counts,
    generation: u64,
    since: Instant,
    now: Instant,
) -> Option<String> {
    if r.exits >= rollout::MAX_NEW_EXITS {
        return Some(format!(
            "new replicas keep exiting ({} exits of generation {generation})",
            r.exits
        ));
    }
    if now.saturating_duration_since(since) < view.policy.deadline {
        return None;
    }
    Some(format!(
        "no progress for {} ({} of {} updated, {} ready, {} outdated)",
        humantime::format_duration(view.policy.deadline),
        counts.updated,
        view.replicas,
        counts.ready,
        counts.outdated
    ))
}

/// Why a progressing rollout waits: with `max_unavailable = 0`, a new replica that
/// fits nowhere beside the old ones (`blocked`) holds it up.
fn waiting_reason(blocked: Option<String>, view: &rollout::Service) -> Option<String> {
    blocked
        .filter(|_| view.policy.max_unavailable == 0)
        .map(|why| {
            format!(
                "waiting: no new replica fits beside the old ones ({why}); with \
                 max_unavailable = 0 no old replica leaves first"
            )
        })
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

/// Whether a job is on its way out (draining or stopping).
fn leaving(j: &JobRec) -> bool {
    matches!(j.effective_state(), JobState::Draining | JobState::Stopping)
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
