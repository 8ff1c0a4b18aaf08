//! The rollout logic against random interleavings of readiness, exits, host loss, scale
//! and new profiles; and a few worked examples.

use super::*;
use proptest::prelude::*;
use std::time::Duration;

/// A service the property drives: its jobs, as the core would describe them.
#[derive(Debug, Clone)]
struct Model {
    replicas: u32,
    generation: u64,
    policy: UpdatePolicy,
    jobs: Vec<JobFacts>,
    next_id: u32,
    /// Every job that was ever ready (an endpoint once), kept apart from the facts.
    endpoints: BTreeSet<JobId>,
    /// The host (of 3; a job's host is its id modulo 3) being drained: its jobs are
    /// `moving`, and nothing is placed there.
    draining: Option<u32>,
}

/// The host (of 3) job `id` runs on.
fn host_of(id: &str) -> u32 {
    id[2..].parse::<u32>().unwrap() % 3
}

impl Model {
    fn new(replicas: u32, max_surge: u32, max_unavailable: u32) -> Self {
        Model {
            replicas,
            generation: 1,
            policy: UpdatePolicy {
                max_surge,
                max_unavailable,
                min_ready: Duration::from_secs(1),
                deadline: Duration::from_secs(60),
                auto_revert: true,
            },
            jobs: Vec::new(),
            next_id: 1,
            draining: None,
            endpoints: BTreeSet::new(),
        }
    }

    fn service(&self) -> Service<'_> {
        Service {
            replicas: self.replicas,
            generation: self.generation,
            policy: self.policy,
            jobs: &self.jobs,
        }
    }

    fn in_slots_live(&self) -> u32 {
        self.jobs
            .iter()
            .filter(|j| j.phase != Phase::Leaving && j.replica < self.replicas)
            .count() as u32
    }

    /// The slots served by an available job that is not leaving. Slots, not jobs: when
    /// a host's drain ends (or moves to another host), a job that was moving off it and
    /// its replacement are both current in one slot, and rule 2 of `to_drain` lets the
    /// worse one go whatever the floor, because the slot stays served. Counting jobs
    /// called that a drain below the floor (a proptest case of 2026-12-06, `cc 24b2074f…`).
    fn available_in_slots(&self) -> u32 {
        self.jobs
            .iter()
            .filter(|j| j.phase != Phase::Leaving && j.replica < self.replicas && j.available)
            .map(|j| j.replica)
            .collect::<BTreeSet<u32>>()
            .len() as u32
    }

    /// One pass of the core: placements (`fits` says which succeed), then drains; checks
    /// the invariants of both.
    fn pass(&mut self, fits: &[bool]) -> Result<(), TestCaseError> {
        let before = self.in_slots_live();
        let slots = to_place(&self.service());
        let unique: BTreeSet<u32> = slots.iter().copied().collect();
        prop_assert_eq!(unique.len(), slots.len(), "a slot placed twice in one pass");
        for (i, r) in slots.into_iter().enumerate() {
            prop_assert!(r < self.replicas, "placement outside the service's slots");
            if !fits.get(i).copied().unwrap_or(true) {
                continue;
            }
            // Placements go to the other hosts only (a drained host is cordoned).
            while self.draining == Some(self.next_id % 3) {
                self.next_id += 1;
            }
            let id = format!("j-{}", self.next_id);
            self.next_id += 1;
            self.jobs.push(JobFacts {
                job: id.into(),
                replica: r,
                generation: self.generation,
                phase: Phase::Placed,
                ready: false,
                available: false,
                moving: false,
                ever_ready: false,
            });
        }
        let limit = self.replicas + self.policy.max_surge;
        prop_assert!(
            self.in_slots_live() <= limit.max(before),
            "placements took the live jobs to {} (limit {limit}, before {before})",
            self.in_slots_live()
        );

        let floor = self.replicas.saturating_sub(self.policy.max_unavailable);
        let avail_before = self.available_in_slots();
        let drain = to_drain(&self.service());
        for id in &drain {
            let f = self.jobs.iter().find(|j| *j.job == **id);
            let f = f.ok_or_else(|| TestCaseError::fail("drained an unknown job"))?;
            if stops_at_once(&self.service(), f) {
                prop_assert!(
                    !self.endpoints.contains(id),
                    "{id} stops at once without a drain, but it was an endpoint"
                );
                // Let go at once: a superseded generation's, or one moving off a draining
                // host (replaced like an older generation's); never ready either way.
                prop_assert!(
                    f.generation < self.generation || f.moving,
                    "{id} is neither superseded nor moving off a draining host"
                );
            }
        }
        for id in &drain {
            let j = self.jobs.iter_mut().find(|j| *j.job == **id);
            let j = j.ok_or_else(|| TestCaseError::fail("drained an unknown job"))?;
            prop_assert_ne!(j.phase, Phase::Leaving, "a leaving job drained again");
            j.phase = Phase::Leaving;
            j.ready = false;
            j.available = false;
        }
        let avail_after = self.available_in_slots();
        prop_assert!(
            avail_after >= avail_before.min(floor),
            "drains took available replicas from {avail_before} to {avail_after} (floor {floor})"
        );
        Ok(())
    }

    fn apply(&mut self, a: &Action) {
        let n = self.jobs.len();
        match *a {
            Action::Ready(i, ready) if n > 0 => {
                let j = &mut self.jobs[i % n];
                if j.phase != Phase::Leaving {
                    j.phase = Phase::Running;
                    j.ready = ready;
                    j.available &= ready;
                    j.ever_ready |= ready;
                    if ready {
                        self.endpoints.insert(j.job.to_string());
                    }
                }
            }
            Action::Available(i) if n > 0 => {
                let j = &mut self.jobs[i % n];
                j.available = j.ready;
            }
            Action::Exit(i) if n > 0 => {
                self.jobs.remove(i % n);
            }
            Action::HostLost(h) => {
                // Jobs are spread over 3 hosts by id.
                self.jobs.retain(|j| host_of(&j.job) != h % 3);
            }
            Action::Drain(h) => {
                self.draining = Some(h % 3);
                for j in &mut self.jobs {
                    j.moving = host_of(&j.job) == h % 3;
                }
            }
            Action::Stopped => self.jobs.retain(|j| j.phase != Phase::Leaving),
            Action::Scale(r) => self.replicas = r,
            Action::NewGeneration => self.generation += 1,
            _ => {}
        }
    }

    /// The indexes of the live jobs of `generation`.
    fn live_of(&self, generation: u64) -> Vec<usize> {
        (0..self.jobs.len())
            .filter(|k| {
                self.jobs[*k].generation == generation && self.jobs[*k].phase != Phase::Leaving
            })
            .collect()
    }

    /// Everything goes well from here on: placements fit, replicas start, get ready and
    /// available, drained ones end.
    fn calm(&mut self) -> Result<u32, TestCaseError> {
        for round in 0..(4 * (self.replicas + 8)) {
            if self.service().is_complete() {
                return Ok(round);
            }
            self.pass(&[])?;
            for j in &mut self.jobs {
                if j.phase == Phase::Placed || j.phase == Phase::Running {
                    j.phase = Phase::Running;
                    j.ready = true;
                    j.available = true;
                    j.ever_ready = true;
                    self.endpoints.insert(j.job.to_string());
                }
            }
            self.jobs.retain(|j| j.phase != Phase::Leaving);
        }
        Err(TestCaseError::fail(format!(
            "the rollout never completed: {:?}",
            self.service().counts()
        )))
    }
}

#[derive(Debug, Clone)]
enum Action {
    Pass(Vec<bool>),
    Ready(usize, bool),
    Available(usize),
    Exit(usize),
    HostLost(u32),
    Stopped,
    Scale(u32),
    NewGeneration,
    /// An operator drains a host (of 3).
    Drain(u32),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => proptest::collection::vec(any::<bool>(), 0..6).prop_map(Action::Pass),
        5 => (any::<usize>(), prop::bool::weighted(0.8)).prop_map(|(i, r)| Action::Ready(i, r)),
        4 => any::<usize>().prop_map(Action::Available),
        1 => any::<usize>().prop_map(Action::Exit),
        1 => (0u32..3).prop_map(Action::HostLost),
        2 => Just(Action::Stopped),
        1 => (1u32..8).prop_map(Action::Scale),
        1 => Just(Action::NewGeneration),
        1 => (0u32..3).prop_map(Action::Drain),
    ]
}

fn surge_unavailable() -> impl Strategy<Value = (u32, u32)> {
    (0u32..3, 0u32..3).prop_filter("not both 0", |(s, u)| *s + *u > 0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Never more than `replicas + max_surge` live jobs by the rollout's placements; the
    /// available count never pushed below `replicas - max_unavailable` by its drains; a
    /// job drains once; and once the chaos stops, every rollout completes.
    #[test]
    fn rollouts_keep_their_bounds_and_complete(
        replicas in 1u32..7,
        (surge, unavailable) in surge_unavailable(),
        actions in proptest::collection::vec(action(), 0..80),
    ) {
        let mut m = Model::new(replicas, surge, unavailable);
        for a in &actions {
            match a {
                Action::Pass(fits) => m.pass(fits)?,
                a => m.apply(a),
            }
        }
        m.calm()?;
        let c = m.service().counts();
        prop_assert_eq!((c.updated, c.outdated, c.excess), (m.replicas, 0, 0));
        // A drained host ends with nothing live on it (what drains there is leaving).
        if let Some(h) = m.draining {
            let stayed = m.jobs.iter().any(|j| j.phase != Phase::Leaving && host_of(&j.job) == h);
            prop_assert!(!stayed, "a job stayed on the drained host");
        }
    }
}

/// What a new generation's replica does before it exits, when it never lasts `min_ready`.
#[derive(Debug, Clone)]
enum Broken {
    Pass(Vec<bool>),
    /// A current-generation job starts, and is ready (or not).
    Runs(usize, bool),
    /// A current-generation job exits (before it was ready for `min_ready`).
    Exits(usize),
    /// Drained jobs end.
    Stopped,
}

fn broken() -> impl Strategy<Value = Broken> {
    prop_oneof![
        4 => proptest::collection::vec(any::<bool>(), 0..4).prop_map(Broken::Pass),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(i, r)| Broken::Runs(i, r)),
        3 => any::<usize>().prop_map(Broken::Exits),
        1 => Just(Broken::Stopped),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A new generation whose replicas all exit within `min_ready` of becoming ready (or
    /// before): the rollout never completes, its drains never take the available old
    /// replicas below `replicas - max_unavailable` (never all of them), every such exit
    /// counts against the rollout, and MAX_NEW_EXITS of them fail it.
    #[test]
    fn new_replicas_that_never_last_min_ready_never_replace_the_old_ones(
        replicas in 1u32..6,
        (surge, unavailable) in surge_unavailable(),
        steps in proptest::collection::vec(broken(), 1..60),
    ) {
        let mut m = Model::new(replicas, surge, unavailable);
        m.jobs = (0..replicas).map(|r| job(r + 1, r, 1, true)).collect();
        m.next_id = replicas + 1;
        m.generation = 2;
        let mut r = Rollout::default();
        r.begin();
        let floor = replicas.saturating_sub(unavailable);
        for step in &steps {
            match step {
                Broken::Pass(fits) => m.pass(fits)?,
                Broken::Runs(i, ready) => {
                    let new = m.live_of(2);
                    if let Some(&k) = new.get(i % new.len().max(1)) {
                        let j = &mut m.jobs[k];
                        j.phase = Phase::Running;
                        j.ready = *ready;
                        j.ever_ready |= *ready;
                        // Ready, but not for `min_ready`: never available.
                        j.available = false;
                    }
                }
                Broken::Exits(i) => {
                    let new = m.live_of(2);
                    if let Some(&k) = new.get(i % new.len().max(1)) {
                        let j = m.jobs.remove(k);
                        prop_assert!(exit_counts(&r, 2, j.generation, false), "an exit of a new replica that was not available did not count");
                        r.exits += 1;
                    }
                }
                Broken::Stopped => m.jobs.retain(|j| j.phase != Phase::Leaving),
            }
            prop_assert!(!m.service().is_complete(), "the rollout completed without an available new replica");
            let old_available = m.jobs.iter()
                .filter(|j| j.generation == 1 && j.phase != Phase::Leaving && j.available)
                .count() as u32;
            prop_assert!(old_available >= floor.min(replicas), "old replicas available: {} (floor {})", old_available, floor);
            // (With max_unavailable < replicas the floor is above 0: never all replaced.)
        }
        prop_assert_eq!(r.exits >= MAX_NEW_EXITS, r.exits >= 3);
    }
}

#[test]
fn an_exit_counts_only_for_the_generation_rolling_out_and_not_when_leaving() {
    let mut r = Rollout::default();
    r.begin();
    assert!(exit_counts(&r, 2, 2, false));
    assert!(!exit_counts(&r, 2, 2, true), "a replica on its way out");
    assert!(!exit_counts(&r, 2, 1, false), "an old replica");
    r.state = RolloutState::Complete;
    assert!(!exit_counts(&r, 2, 2, false), "a rollout that completed");
}

#[test]
fn a_superseded_surge_replica_never_ready_stops_at_once() {
    // Three rollouts in quick succession: slot 0 holds the available v1 job, v2's surge
    // (never ready) and nothing else; v3 arrives.
    let mut m = Model::new(2, 1, 0);
    m.jobs = vec![job(1, 0, 1, true), job(2, 1, 1, true), job(3, 0, 2, false)];
    m.generation = 3;
    let drain = to_drain(&m.service());
    assert_eq!(drain, vec!["j-3".to_owned()], "the v2 surge leaves");
    assert!(stops_at_once(&m.service(), &m.jobs[2]));
    // One that was ready once drains as usual, and so does any old replica that is ready.
    m.jobs[2].ever_ready = true;
    assert!(!stops_at_once(&m.service(), &m.jobs[2]));
    assert!(!stops_at_once(&m.service(), &m.jobs[0]));
}

#[test]
fn the_first_wait_names_the_lowest_slot_not_done() {
    let mut m = Model::new(3, 1, 0);
    m.generation = 2;
    let mut placed = job(5, 1, 2, false);
    placed.phase = Phase::Placed;
    let mut min_ready = job(4, 0, 2, true);
    min_ready.available = false;
    m.jobs = vec![
        job(1, 0, 1, true),
        job(2, 1, 1, true),
        job(3, 2, 1, true),
        min_ready.clone(),
        placed,
    ];
    assert_eq!(first_wait(&m.service()), Some(Wait::MinReady(&min_ready)));
    m.jobs[3].available = true;
    assert!(matches!(first_wait(&m.service()), Some(Wait::Start(j)) if &*j.job == "j-5"));
    m.jobs[4].phase = Phase::Running;
    assert!(matches!(first_wait(&m.service()), Some(Wait::Ready(j)) if &*j.job == "j-5"));
    m.jobs[4].ready = true;
    m.jobs[4].available = true;
    assert_eq!(first_wait(&m.service()), Some(Wait::Placement(2)));
}

// --- examples ---

fn job(id: u32, replica: u32, generation: u64, ready: bool) -> JobFacts {
    JobFacts {
        job: format!("j-{id}").into(),
        replica,
        generation,
        phase: Phase::Running,
        ready,
        available: ready,
        moving: false,
        ever_ready: ready,
    }
}

#[test]
fn a_rolling_update_surges_one_then_drains_the_old_one_it_replaced() {
    let mut m = Model::new(3, 1, 0);
    m.jobs = (0..3).map(|r| job(r + 1, r, 1, true)).collect();
    m.next_id = 4;
    m.generation = 2;
    assert_eq!(
        to_place(&m.service()),
        vec![0],
        "one surge, lowest slot first"
    );
    assert!(
        to_drain(&m.service()).is_empty(),
        "nothing drains before a new one is ready"
    );
    m.jobs.push(job(4, 0, 2, true));
    assert_eq!(to_drain(&m.service()), vec!["j-1".to_owned()]);
}

#[test]
fn a_replica_on_a_draining_host_is_replaced_elsewhere_before_it_drains() {
    let mut m = Model::new(3, 1, 0);
    m.jobs = (0..3).map(|r| job(r + 1, r, 1, true)).collect();
    m.next_id = 4;
    // Slot 1 runs on the host being drained; same generation, no rollout running.
    m.jobs[1].moving = true;
    assert_eq!(
        to_place(&m.service()),
        vec![1],
        "a surge for the moving slot"
    );
    assert!(
        to_drain(&m.service()).is_empty(),
        "it stays until its replacement is available"
    );
    let mut new = job(4, 1, 1, true);
    new.available = false;
    m.jobs.push(new);
    assert!(
        to_drain(&m.service()).is_empty(),
        "ready is not yet available"
    );
    m.jobs[3].available = true;
    assert_eq!(to_drain(&m.service()), vec!["j-2".to_owned()]);
}

#[test]
fn with_max_unavailable_old_replicas_leave_first_when_no_surge_is_allowed() {
    let mut m = Model::new(3, 0, 1);
    m.jobs = (0..3).map(|r| job(r + 1, r, 1, true)).collect();
    m.generation = 2;
    assert!(to_place(&m.service()).is_empty(), "no surge allowed");
    assert_eq!(
        to_drain(&m.service()),
        vec!["j-3".to_owned()],
        "the highest slot, one only"
    );
}

#[test]
fn scale_down_drains_the_highest_numbered_replicas() {
    let mut m = Model::new(2, 1, 0);
    m.jobs = (0..5).map(|r| job(r + 1, r, 1, true)).collect();
    assert_eq!(
        to_drain(&m.service()),
        vec!["j-5".to_owned(), "j-4".to_owned(), "j-3".to_owned()]
    );
}

#[test]
fn a_crashing_new_replica_never_costs_an_old_one() {
    let mut m = Model::new(2, 1, 0);
    m.jobs = vec![job(1, 0, 1, true), job(2, 1, 1, true), job(3, 0, 2, false)];
    m.generation = 2;
    assert!(to_drain(&m.service()).is_empty());
    assert!(
        to_place(&m.service()).is_empty(),
        "the surge budget is used"
    );
}

#[test]
fn templates_ignore_replicas_drain_update_and_meta() {
    let a = serde_json::json!({"name": "web", "replicas": 3, "command": ["a"]});
    let b = serde_json::json!({"name": "web", "replicas": 5, "command": ["a"], "drain": "1s",
                               "update": {"max_surge": 2}, "meta": {"team": "b"}});
    let c = serde_json::json!({"name": "web", "replicas": 3, "command": ["b"]});
    assert!(same_template(&a, &b));
    assert!(!same_template(&a, &c));
}
