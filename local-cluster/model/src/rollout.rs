//! Changing a running service without an outage (docs/design.md): which replica slots get a
//! job of the current generation, which jobs drain, and where the rollout stands.
//!
//! Pure and synchronous: no store, no clock, no plugins. The core describes a service's
//! jobs as [`JobFacts`] (it knows the time, so it says which new replicas have been ready
//! for `min_ready`), asks [`to_place`] and [`to_drain`], makes the placements and drains
//! as store batches, and asks again after every change. The same functions serve a
//! rolling update, a restart, a scale and a rollback; a service at rest gets nothing from
//! them but the replacement of a replica that ended.
//!
//! A service has `replicas` **slots** (the replica indexes `0..replicas`, what a replica
//! sees as `XCE_REPLICA`). During a rollout a slot may hold an old-generation job and a
//! new one side by side (a surge); otherwise one job.

use plugin_api::JobId;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use xce_proto::profile::UpdatePolicy;

/// Exits of current-generation replicas during one rollout that fail it ("new replicas
/// keep exiting"), all slots together: a command that dies at once fails its rollout
/// within the restart backoff of a few exits (about 1 s when several new replicas start
/// at once, up to about 7 s for one replica: 1 s, 2 s, 4 s).
pub const MAX_NEW_EXITS: u32 = 3;

/// Where a service's latest change stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    /// Replacing, adding or removing replicas.
    Progressing,
    /// Every slot runs the current generation, ready; no older replica is live.
    Complete,
    /// No progress for `deadline`, or new replicas kept exiting; not rolled back.
    Failed,
    /// The rollout failed and the service rolled back to the last complete generation's
    /// profile, as a new generation (which may itself still be rolling out).
    Reverted,
}

impl RolloutState {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Progressing => "progressing",
            RolloutState::Complete => "complete",
            RolloutState::Failed => "failed",
            RolloutState::Reverted => "reverted",
        }
    }
}

/// A generation that completed, and the profile it ran: what a failed rollout reverts to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stable {
    pub generation: u64,
    pub profile: Value,
}

/// The persisted rollout record of a service (part of its service record, so it changes
/// in the same store batches as the jobs it drives).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollout {
    pub state: RolloutState,
    /// Why it waits, why it failed, what was reverted.
    #[serde(default)]
    pub reason: Option<String>,
    /// The last generation that completed.
    #[serde(default)]
    pub stable: Option<Stable>,
    /// Exits of current-generation replicas since this rollout began.
    #[serde(default)]
    pub exits: u32,
    /// The current generation is a rollback: when it fails too, nothing is reverted.
    #[serde(default)]
    pub revert: bool,
}

impl Default for Rollout {
    /// Services stored before rollouts existed: complete (the next pass records their
    /// generation as the stable one).
    fn default() -> Self {
        Rollout {
            state: RolloutState::Complete,
            reason: None,
            stable: None,
            exits: 0,
            revert: false,
        }
    }
}

impl Rollout {
    /// A new rollout (a changed profile, a restart or a scale) begins.
    pub fn begin(&mut self) {
        self.state = RolloutState::Progressing;
        self.reason = None;
        self.exits = 0;
        self.revert = false;
    }

    /// Whether the rollout still acts: it may complete, fail or wait.
    pub fn is_running(&self, generation: u64) -> bool {
        match self.state {
            RolloutState::Progressing => true,
            RolloutState::Reverted => {
                self.stable.as_ref().map(|s| s.generation) != Some(generation)
            }
            RolloutState::Complete | RolloutState::Failed => false,
        }
    }
}

/// Where a job is, as far as the rollout cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Placed, not started yet (never an endpoint).
    Placed,
    /// Running (ready or not).
    Running,
    /// Draining or stopping: on its way out, counts for nothing.
    Leaving,
}

/// One live job of a service, as the rollout sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFacts {
    /// The model's shared id (no copy of its own: a service's facts are kept, see the
    /// controller's `kept.rs`).
    pub job: crate::job_key::JobKey,
    pub replica: u32,
    pub generation: u64,
    pub phase: Phase,
    /// Passes its readiness probe (an endpoint).
    pub ready: bool,
    /// Counts as available: an older-generation job when ready; a current-generation one
    /// when it has been ready for `min_ready`.
    pub available: bool,
    /// On a host being drained: replaced like an older generation's job (a job of the
    /// current generation placed elsewhere first, this one drained once that one is
    /// available, within `max_unavailable`), whatever its generation.
    pub moving: bool,
    /// It has been ready at some point of its life (an endpoint once). A job never ready
    /// was never handed to a reader: there is nothing to drain.
    pub ever_ready: bool,
}

/// Whether a job the rollout lets go ([`to_drain`]) stops at once instead of draining:
/// a superseded generation's replica that was never ready was never an endpoint, so no
/// reader can hold it. Back-to-back rollouts otherwise kept every superseded surge
/// replica running for the full `drain` (20 rollouts of a 4-replica service ran 18
/// processes).
pub fn stops_at_once(s: &Service, j: &JobFacts) -> bool {
    !s.is_new(j) && !j.ready && !j.ever_ready
}

/// Whether a replica that ended by itself counts as an exit of the running rollout
/// ([`Rollout::exits`], failing it at [`MAX_NEW_EXITS`]): it runs the generation being
/// rolled out (`job_generation == generation`) and was not on its way out. Such a
/// replica was not available yet when it ended in every case that matters: it exited
/// before it became ready, or within `min_ready` of becoming ready (a rollout completes
/// only once every new replica has been ready for `min_ready`, so with no readiness
/// check and the default `min_ready` a command that dies after a few seconds fails its
/// rollout instead of completing it).
pub fn exit_counts(r: &Rollout, generation: u64, job_generation: u64, leaving: bool) -> bool {
    !leaving && job_generation == generation && r.is_running(generation)
}

/// A service as the rollout sees it.
#[derive(Debug, Clone, Copy)]
pub struct Service<'a> {
    pub replicas: u32,
    pub generation: u64,
    pub policy: UpdatePolicy,
    pub jobs: &'a [JobFacts],
}

/// What `xcecli service status` shows of a rollout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Live (not leaving) jobs of the current generation in the service's slots.
    pub updated: u32,
    /// Ready jobs of any generation.
    pub ready: u32,
    /// Live jobs of an older generation.
    pub outdated: u32,
    /// Current-generation jobs that are available.
    pub available: u32,
    /// Live jobs in slots the service no longer has (a scale-down not yet drained).
    pub excess: u32,
}

impl Service<'_> {
    fn live(&self) -> impl Iterator<Item = &JobFacts> + '_ {
        self.jobs.iter().filter(|j| j.phase != Phase::Leaving)
    }

    fn in_slots(&self) -> impl Iterator<Item = &JobFacts> + '_ {
        self.live().filter(|j| j.replica < self.replicas)
    }

    pub fn is_new(&self, j: &JobFacts) -> bool {
        j.generation >= self.generation && !j.moving
    }

    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for j in self.live() {
            c.ready += u32::from(j.ready);
            if j.replica >= self.replicas {
                c.excess += 1;
            } else if self.is_new(j) {
                c.updated += 1;
                c.available += u32::from(j.available);
            } else {
                c.outdated += 1;
            }
        }
        c
    }

    /// Every slot runs an available current-generation job, and nothing else is live.
    pub fn is_complete(&self) -> bool {
        let c = self.counts();
        c.outdated == 0
            && c.excess == 0
            && c.updated == self.replicas
            && c.available == self.replicas
    }

    /// Available jobs in the service's slots (what clients can use, and what the rollout
    /// must keep at `replicas - max_unavailable`).
    fn available(&self) -> u32 {
        self.in_slots().filter(|j| j.available).count() as u32
    }
}

/// The slots that should get a current-generation job now, best first: empty slots (they
/// restore capacity), then slots that hold only an older job (a surge), lowest first.
/// Never more live jobs in the service's slots than `replicas + max_surge`.
///
/// The caller drops slots whose restart backoff runs and slots no host can take.
pub fn to_place(s: &Service) -> Vec<u32> {
    // By slot (whether it holds any job, a current-generation one), not sets: this runs
    // at every visit of a service, and a set of 10,000 slots was a visit's cost of its own.
    let mut any = vec![false; s.replicas as usize];
    let mut new = vec![false; s.replicas as usize];
    let mut total = 0u32;
    for j in s.in_slots() {
        total += 1;
        any[j.replica as usize] = true;
        if s.is_new(j) {
            new[j.replica as usize] = true;
        }
    }
    let budget = (s.replicas + s.policy.max_surge).saturating_sub(total) as usize;
    let empty = (0..s.replicas).filter(|r| !any[*r as usize]);
    let surge = (0..s.replicas).filter(|r| any[*r as usize] && !new[*r as usize]);
    empty.chain(surge).take(budget).collect()
}

/// The jobs to drain now, in order:
/// 1. jobs in slots the service no longer has (scale-down: the highest-numbered go);
/// 2. a second current-generation job in one slot (never made here, but a restore may
///    find one): the one that is not available; likewise several older jobs in one slot
///    (rollouts in quick succession) keep the best one, within the floor of 3.;
/// 3. an older job whose slot has an available current-generation job, while the
///    available count stays at `replicas - max_unavailable` or above;
/// 4. an older job that is not ready, in a slot that has a current-generation job (it
///    serves nobody, and the new one takes its place);
/// 5. with `max_unavailable > 0`: further older jobs (not ready first, then the highest
///    slots), within the same floor, so a rollout can proceed where no surge fits.
pub fn to_drain(s: &Service) -> Vec<JobId> {
    if settled(s) {
        return Vec::new();
    }
    let mut d = Drains::new(s);
    d.excess(s);
    let slots = Slots::of(s);
    d.second_new_jobs(&slots);
    d.older_crowds(&slots);
    let old: Vec<&JobFacts> = s
        .in_slots()
        .filter(|j| !s.is_new(j) && !d.gone.contains(&*j.job))
        .collect();
    d.replaced_or_idle(&slots, &old);
    if s.policy.max_unavailable > 0 {
        d.further_old(&old);
    }
    d.out
}

/// Whether every live job of `s` is a current-generation one in a slot of its own: then
/// [`to_drain`] has nothing to let go (no excess, no second job in a slot, no older job).
/// Checked first, without the slots' map (a vector per slot): most visits of a big
/// service find it so.
fn settled(s: &Service) -> bool {
    let mut taken = vec![false; s.replicas as usize];
    for j in s.live() {
        if j.replica >= s.replicas || !s.is_new(j) {
            return false;
        }
        let t = &mut taken[j.replica as usize];
        if *t {
            return false;
        }
        *t = true;
    }
    true
}

/// The jobs [`to_drain`] chose so far, in order, and the available count they leave.
struct Drains {
    /// What the available count must not fall below: `replicas - max_unavailable`.
    floor: u32,
    available: u32,
    out: Vec<JobId>,
    gone: BTreeSet<JobId>,
}

/// A service's live jobs in its slots, each slot's once (a scan per slot made a
/// 10,000-replica service's pass quadratic), split into current and older generations.
struct Slots<'a> {
    new_of: BTreeMap<u32, Vec<&'a JobFacts>>,
    old_of: BTreeMap<u32, Vec<&'a JobFacts>>,
}

impl<'a> Slots<'a> {
    fn of(s: &'a Service<'_>) -> Self {
        let mut slots = Slots {
            new_of: BTreeMap::new(),
            old_of: BTreeMap::new(),
        };
        for j in s.in_slots() {
            let of = if s.is_new(j) {
                &mut slots.new_of
            } else {
                &mut slots.old_of
            };
            of.entry(j.replica).or_default().push(j);
        }
        slots
    }

    /// Whether slot `r` has a current-generation job (an available one with
    /// `need_available`).
    fn has_new(&self, r: u32, need_available: bool) -> bool {
        self.new_of
            .get(&r)
            .is_some_and(|js| js.iter().any(|j| j.available || !need_available))
    }
}

impl Drains {
    fn new(s: &Service) -> Self {
        Drains {
            floor: s.replicas.saturating_sub(s.policy.max_unavailable),
            available: s.available(),
            out: Vec::new(),
            gone: BTreeSet::new(),
        }
    }

    fn drain(&mut self, j: &JobFacts) {
        self.out.push(j.job.to_string());
        self.gone.insert(j.job.to_string());
    }

    /// Drains `j` unless it is available and the available count is at the floor.
    fn drain_above_floor(&mut self, j: &JobFacts) {
        if !j.available || self.available > self.floor {
            self.available -= u32::from(j.available);
            self.drain(j);
        }
    }

    /// 1. Jobs in slots the service no longer has, the highest-numbered first.
    fn excess(&mut self, s: &Service) {
        let mut excess: Vec<&JobFacts> = s.live().filter(|j| j.replica >= s.replicas).collect();
        excess.sort_by_key(|j| std::cmp::Reverse(j.replica));
        for j in excess {
            self.drain(j);
        }
    }

    /// 2. A second current-generation job in one slot: the best one (available, then
    ///    ready) stays, whatever the floor (the slot stays served).
    fn second_new_jobs(&mut self, slots: &Slots) {
        for mine in slots.new_of.values().filter(|m| m.len() > 1) {
            let mut mine = mine.clone();
            mine.sort_by_key(|j| std::cmp::Reverse((j.available, j.ready)));
            for j in &mine[1..] {
                self.available -= u32::from(j.available);
                self.drain(j);
            }
        }
    }

    /// 2b. Several older jobs in one slot (rollouts in quick succession): the slot keeps
    ///     the best one (available, then the newest generation); the others drain, within
    ///     the floor. Without this a full surge budget could wait forever.
    fn older_crowds(&mut self, slots: &Slots) {
        for mine in slots.old_of.values().filter(|m| m.len() > 1) {
            let mut mine = mine.clone();
            mine.sort_by_key(|j| std::cmp::Reverse((j.available, j.ready, j.generation)));
            for j in &mine[1..] {
                self.drain_above_floor(j);
            }
        }
    }

    /// 3. and 4. An older job whose slot has an available current-generation job
    ///    (within the floor), or that is not ready where a current-generation job stands.
    fn replaced_or_idle(&mut self, slots: &Slots, old: &[&JobFacts]) {
        for j in old {
            let replaced = slots.has_new(j.replica, true);
            let idle = !j.ready && slots.has_new(j.replica, false);
            if replaced && (!j.available || self.available > self.floor) || idle {
                self.available -= u32::from(j.available);
                self.drain(j);
            }
        }
    }

    /// 5. With `max_unavailable > 0`: the other older jobs, not ready first, then the
    ///    highest slots, within the floor.
    fn further_old(&mut self, old: &[&JobFacts]) {
        let mut rest: Vec<&&JobFacts> = old
            .iter()
            .filter(|j| !self.gone.contains(&*j.job))
            .collect();
        rest.sort_by_key(|j| (j.ready, std::cmp::Reverse(j.replica)));
        for j in rest {
            self.drain_above_floor(j);
        }
    }
}

/// What a progressing rollout waits for, in its lowest slot that is not done yet (the
/// core says it in words in the rollout's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait<'a> {
    /// Slot `.0` has no current-generation job yet (no room, a restart backoff, or the
    /// surge budget is taken).
    Placement(u32),
    /// The slot's current-generation job is placed and not running yet.
    Start(&'a JobFacts),
    /// It runs and is not ready (its probe fails).
    Ready(&'a JobFacts),
    /// It is ready, not for `min_ready` yet.
    MinReady(&'a JobFacts),
    /// Every slot's current-generation job is available: older or excess jobs are still
    /// to leave.
    Leaving,
}

/// The first thing the rollout of `s` waits for (see [`Wait`]); `None` when it is
/// complete. In each slot the best current-generation job counts (available, then
/// ready, then running).
pub fn first_wait<'a>(s: &Service<'a>) -> Option<Wait<'a>> {
    if s.is_complete() {
        return None;
    }
    // By slot, not a map: this runs at every visit of a progressing service.
    let mut best: Vec<Option<&'a JobFacts>> = vec![None; s.replicas as usize];
    for j in s.jobs.iter().filter(|j| j.phase != Phase::Leaving) {
        if j.replica >= s.replicas || !s.is_new(j) {
            continue;
        }
        let rank = |j: &JobFacts| (j.available, j.ready, j.phase == Phase::Running);
        let e = best[j.replica as usize].get_or_insert(j);
        if rank(j) > rank(e) {
            *e = j;
        }
    }
    for r in 0..s.replicas {
        match best[r as usize] {
            None => return Some(Wait::Placement(r)),
            Some(j) if j.available => continue,
            Some(j) if j.ready => return Some(Wait::MinReady(j)),
            Some(j) if j.phase == Phase::Running => return Some(Wait::Ready(j)),
            Some(j) => return Some(Wait::Start(j)),
        }
    }
    Some(Wait::Leaving)
}

/// A progress signature (available, updated, outdated, excess): the deadline counts from
/// the last time it changed.
pub type Mark = (u32, u32, u32, u32);

/// The [`Mark`] of `c`.
pub fn progress_mark(c: &Counts) -> Mark {
    (c.available, c.updated, c.outdated, c.excess)
}

/// The profile a rollback runs: the stable profile with the current replica count (a
/// scale made since is kept).
pub fn revert_profile(stable: &Stable, replicas: u32) -> Value {
    let mut p = stable.profile.clone();
    if let Some(m) = p.as_object_mut() {
        m.insert("replicas".into(), Value::from(replicas));
    }
    p
}

/// Whether two profiles run the same thing: equal but for the keys that do not change
/// a replica (`replicas`, `drain`, `update`).
pub fn same_template(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            for k in xce_proto::profile::NOT_TEMPLATE_KEYS {
                m.remove(*k);
            }
        }
        v
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests;
