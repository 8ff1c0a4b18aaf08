//! Rollouts through the core: `min_ready`, a rolling update with drain and a broken
//! generation rolled back, a rollout without room to surge, a drain across a controller
//! restart, random interleavings (drain always precedes stop), and the passes that visit
//! only the services something happened to.

use super::*;

/// The readers' rollout counts follow `min_ready` with time alone: a ready replica of the
/// current generation counts as available once it has been ready that long, with no event
/// (the service's part is patched then; every publish is compared with a full rebuild).
#[test]
fn a_replica_counts_as_available_once_ready_for_min_ready() {
    let mut sim = Sim::one_host(10);
    let mut doc = versioned(2, "v1");
    doc["service"]["update"]["min_ready"] = json!("3s");
    sim.put(doc);
    let counts = |sim: &Sim| {
        let v = sim.core.view();
        let v = v.borrow();
        let s = &v.services[&ServiceKey::new("default", "web")];
        (s.counts.ready, s.counts.available)
    };
    assert_eq!(counts(&sim), (0, 0));
    sim.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
    sim.run_for(1, &["exec-01"]);
    sim.events("exec-01", vec![started("j-2"), ready("j-2", true)]);
    assert_eq!(counts(&sim), (2, 0), "ready, not for min_ready yet");
    sim.run_for(2, &["exec-01"]);
    assert_eq!(counts(&sim), (2, 1), "j-1 ready for 3s, j-2 for 2s");
    sim.run_for(1, &["exec-01"]);
    assert_eq!(counts(&sim), (2, 2), "both ready for 3s");
    sim.events("exec-01", vec![ready("j-1", false)]);
    assert_eq!(counts(&sim), (1, 1), "j-1 no longer ready");
    sim.events("exec-01", vec![ready("j-1", true)]);
    assert_eq!(counts(&sim), (2, 1), "j-1 waits for min_ready again");
}

#[test]
fn a_rolling_update_drains_before_stop_and_a_broken_one_is_rolled_back() {
    let mut sim = Sim::two_v1_ready(10);
    let s = sim.rollout("web");
    sim.note(s);
    // v2: one surge replica; the old one of its slot drains only once it is ready.
    sim.put(versioned(2, "v2"));
    sim.events("exec-01", vec![started("j-3")]);
    let s = sim.rollout("web");
    sim.note(s);
    sim.events("exec-01", vec![ready("j-3", true)]);
    let a = sim.assignments("exec-01");
    sim.note(a);
    // The drain (2s) ends: only now is j-1 told to stop.
    sim.run_for(2, &["exec-01"]);
    let a = sim.assignments("exec-01");
    sim.note(a);
    sim.events(
        "exec-01",
        vec![exited("j-1"), started("j-4"), ready("j-4", true)],
    );
    sim.run_for(2, &["exec-01"]);
    sim.events("exec-01", vec![exited("j-2")]);
    let s = sim.rollout("web");
    sim.note(s);
    // v3 dies at once, three times: the rollout fails and rolls back to v2's profile as
    // generation 4; the v2 replicas are generation 4 and were never touched.
    sim.put(versioned(2, "exit 1"));
    for _ in 0..3 {
        let j = sim.core.view().borrow().services[&ServiceKey::new("default", "web")]
            .jobs
            .iter()
            .find(|j| j.info.generation == 3)
            .map(|j| j.info.job.clone());
        if let Some(j) = j {
            sim.events("exec-01", vec![started(&j), exited(&j)]);
        }
        sim.run_for(4, &["exec-01"]);
    }
    let s = sim.rollout("web");
    sim.note(s);
    sim.check(expect![[r#"
        > Sim::two_v1_ready: as checked by the fixture
          = web generation=1 rollout=complete updated=2 ready=2 outdated=0 reason=""
          applied Updated
        > put web
          10 service web rev=10
          11 job j-3 web/0 exec-01 Placed ready=false gen=2
          plugin: reserve exec-01 j-3 2
        > events exec-01 [{"event":"started","job":"j-3","pid":7}]
          12 job j-3 web/0 exec-01 Running ready=false gen=2
          = web generation=2 rollout=progressing updated=1 ready=2 outdated=2 reason="replica 0 (j-3 on exec-01) is not ready yet"
        > events exec-01 [{"event":"readiness","job":"j-3","ready":true}]
          13 job j-3 web/0 exec-01 Running ready=true gen=2
          14 job j-1 web/0 exec-01 Draining ready=false
          15 job j-4 web/1 exec-01 Placed ready=false gen=2
          plugin: reserve exec-01 j-4 3
          = exec-01 index=15 [j-1:Run j-2:Run j-3:Run j-4:Run]
        > 2s pass, heartbeats from ["exec-01"]
          16 job j-1 web/0 exec-01 Stopping ready=false
          = exec-01 index=16 [j-1:Stop j-2:Run j-3:Run j-4:Run]
        > events exec-01 [{"event":"exited","job":"j-1","code":1},{"event":"started","job":"j-4","pid":7},{"event":"readiness","job":"j-4","ready":true}]
          17 ended j-1 web/0 Stopped
          18 job j-4 web/1 exec-01 Running ready=false gen=2
          19 job j-4 web/1 exec-01 Running ready=true gen=2
          20 job j-2 web/1 exec-01 Draining ready=false
          21 service web rev=21
          plugin: release exec-01 j-1
        > 2s pass, heartbeats from ["exec-01"]
          22 job j-2 web/1 exec-01 Stopping ready=false
        > events exec-01 [{"event":"exited","job":"j-2","code":1}]
          23 ended j-2 web/1 Stopped
          plugin: release exec-01 j-2
          = web generation=2 rollout=complete updated=2 ready=2 outdated=0 reason=""
          applied Updated
        > put web
          24 service web rev=24
          25 job j-5 web/0 exec-01 Placed ready=false gen=3
          plugin: reserve exec-01 j-5 0
        > events exec-01 [{"event":"started","job":"j-5","pid":7},{"event":"exited","job":"j-5","code":1}]
          26 job j-5 web/0 exec-01 Running ready=false gen=3
          27 ended j-5 web/0 Exited { code: Some(1) }
          plugin: release exec-01 j-5
        > 4s pass, heartbeats from ["exec-01"]
          28 job j-6 web/0 exec-01 Placed ready=false gen=3
          plugin: reserve exec-01 j-6 0
        > events exec-01 [{"event":"started","job":"j-6","pid":7},{"event":"exited","job":"j-6","code":1}]
          29 job j-6 web/0 exec-01 Running ready=false gen=3
          30 ended j-6 web/0 Exited { code: Some(1) }
          plugin: release exec-01 j-6
        > 4s pass, heartbeats from ["exec-01"]
          31 job j-7 web/0 exec-01 Placed ready=false gen=3
          plugin: reserve exec-01 j-7 0
        > events exec-01 [{"event":"started","job":"j-7","pid":7},{"event":"exited","job":"j-7","code":1}]
          32 job j-7 web/0 exec-01 Running ready=false gen=3
          33 ended j-7 web/0 Exited { code: Some(1) }
          34 job j-3 web/0 exec-01 Running ready=true gen=4
          35 job j-4 web/1 exec-01 Running ready=true gen=4
          36 service web rev=36
          plugin: release exec-01 j-7
        > 4s pass, heartbeats from ["exec-01"]
          37 service web rev=37
          = web generation=4 rollout=reverted updated=2 ready=2 outdated=0 reason="generation 3 failed: new replicas keep exiting (3 exits of generation 3); rolled back to generation 2's profile as generation 4""#]]);
}

#[test]
fn a_rollout_without_room_to_surge_says_why_it_waits_or_uses_max_unavailable() {
    // One host with room for exactly the two replicas (like a fixed port on every host).
    let mut sim = Sim::two_v1_ready(2);
    sim.put(versioned(2, "v2"));
    let s = sim.rollout("web");
    sim.note(s);
    // max_unavailable = 1: one old replica drains first, its slot frees when it is gone.
    let mut doc = versioned(2, "v2");
    doc["service"]["update"] = json!({"max_surge": 1, "max_unavailable": 1});
    sim.put(doc);
    sim.run_for(2, &["exec-01"]);
    sim.events("exec-01", vec![exited("j-2")]);
    let s = sim.rollout("web");
    sim.note(s);
    sim.check(expect![[r#"
        > Sim::two_v1_ready: as checked by the fixture
          applied Updated
        > put web
          10 service web rev=10
          = web generation=2 rollout=progressing updated=0 ready=2 outdated=2 reason="waiting: no new replica fits beside the old ones (slots is full on exec-01); with max_unavailable = 0 no old replica leaves first"
          applied Updated
        > put web
          11 service web rev=11
          12 job j-2 web/1 exec-01 Draining ready=false
        > 2s pass, heartbeats from ["exec-01"]
          13 job j-2 web/1 exec-01 Stopping ready=false
        > events exec-01 [{"event":"exited","job":"j-2","code":1}]
          14 ended j-2 web/1 Stopped
          15 job j-3 web/1 exec-01 Placed ready=false gen=2
          plugin: release exec-01 j-2
          plugin: reserve exec-01 j-3 1
          = web generation=2 rollout=progressing updated=1 ready=1 outdated=1 reason="replica 0 has no new replica yet (max_surge 1 is taken)""#]]);
}

#[test]
fn a_controller_restart_during_a_drain_drains_in_full_again() {
    let mut sim = Sim::one_host(10);
    sim.put(versioned(1, "v1"));
    sim.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
    sim.delete("web");
    sim.run_for(1, &["exec-01"]);
    // The controller dies 1s into the 2s drain and is back 0s later: j-1 still runs for
    // a full drain from the restart before it is told to stop.
    let mut sim = sim.restart(0);
    sim.register("exec-01", 10, &["j-1"]);
    sim.run_for(1, &["exec-01"]);
    let a = sim.assignments("exec-01");
    sim.note(a);
    sim.run_for(1, &["exec-01"]);
    let a = sim.assignments("exec-01");
    sim.note(a);
    sim.check(expect![[r#"
        > Sim::one_host: as checked by the fixture
          applied Created
        > put web
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          4 job j-1 web/0 exec-01 Running ready=false
          5 job j-1 web/0 exec-01 Running ready=true
          6 service web rev=6
        > delete web
          7 service web rev=7
          8 job j-1 web/0 exec-01 Draining ready=false
        > 1s pass, heartbeats from ["exec-01"]
        > load
          resync rev=8 services=1 jobs=[j-1@exec-01:Draining] hosts=1
          plugin: restore exec-01 j-1 0
        > register exec-01 running=["j-1"]
          9 host exec-01 Ready ["web"]
        > 1s pass, heartbeats from ["exec-01"]
          = exec-01 index=8 [j-1:Run]
        > 1s pass, heartbeats from ["exec-01"]
          10 job j-1 web/0 exec-01 Stopping ready=false
          = exec-01 index=10 [j-1:Stop]"#]]);
}

#[derive(Debug, Clone)]
enum Step {
    Put(u8),
    Scale(u32),
    Restart,
    Start(usize),
    Ready(usize, bool),
    Exit(usize),
    Pass(u64),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        1 => (0u8..4).prop_map(Step::Put),
        1 => (1u32..5).prop_map(Step::Scale),
        1 => Just(Step::Restart),
        4 => any::<usize>().prop_map(Step::Start),
        4 => (any::<usize>(), proptest::bool::weighted(0.8)).prop_map(|(i, r)| Step::Ready(i, r)),
        2 => any::<usize>().prop_map(Step::Exit),
        3 => (1u64..3).prop_map(Step::Pass),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Random interleavings of new profiles, scales, restarts, worker starts, readiness
    /// and exits, and time, through the real core: a job that was ever ready gets SIGTERM
    /// (`Stopping`) only after it was `Draining` for the service's whole `drain`; a
    /// draining job never serves again; no slot grant is held twice (the plugin refuses
    /// that); and once workers behave, the service settles complete. `tiny`: on a store
    /// whose batches hold two records, so each visit goes on over several batches.
    #[test]
    fn drain_always_precedes_stop_through_the_core(
        steps in proptest::collection::vec(step(), 1..60),
        tiny in proptest::bool::ANY,
    ) {
        const DRAIN: Duration = Duration::from_secs(2);
        let key = ServiceKey::new("default", "web");
        let mut sim = if tiny {
            let limit = xce_store::BatchLimit { ops: 7, ..xce_store::BatchLimit::EMBEDDED };
            Sim::load(Arc::new(MemStore::with_limit(limit)), Instant::now())
        } else {
            Sim::new()
        };
        let hosts = ["exec-01", "exec-02", "exec-03"];
        sim.register_all(&hosts, 6);
        sim.put(versioned(3, "v0"));
        let mut ran: BTreeSet<JobId> = BTreeSet::new();
        // Jobs that were ever ready (endpoints once): only they have anything to drain.
        let mut served: BTreeSet<JobId> = BTreeSet::new();
        let mut draining_since: BTreeMap<JobId, Instant> = BTreeMap::new();
        let mut stopped: BTreeSet<JobId> = BTreeSet::new();
        let mut check = |sim: &mut Sim| -> Result<(), proptest::test_runner::TestCaseError> {
            for e in sim.raw.take() {
                if let ClusterEvent::Job { job, .. } = e {
                    match job.state {
                        JobState::Running if job.ready || ran.contains(&job.job) => {
                            proptest::prop_assert!(!draining_since.contains_key(&job.job) && !stopped.contains(&job.job),
                                "{} serves again after it left", job.job);
                            ran.insert(job.job.clone());
                            if job.ready {
                                served.insert(job.job.clone());
                            }
                        }
                        JobState::Running => { ran.insert(job.job.clone()); }
                        JobState::Draining => {
                            draining_since.entry(job.job.clone()).or_insert(sim.now);
                        }
                        JobState::Stopping => {
                            // A job never ready may stop at once (a superseded surge
                            // replica: nothing to drain).
                            if served.contains(&job.job) {
                                let since = draining_since.get(&job.job);
                                proptest::prop_assert!(since.is_some(), "{} stopped without draining", job.job);
                                let drained = sim.now - *since.unwrap();
                                proptest::prop_assert!(drained >= DRAIN, "{} drained {drained:?} only", job.job);
                            }
                            stopped.insert(job.job.clone());
                        }
                        _ => {}
                    }
                }
            }
            Ok(())
        };
        let jobs = |sim: &Sim| -> Vec<(JobId, HostId, JobState, bool)> {
            let v = sim.core.view();
            let v = v.borrow();
            v.services.get(&key).map(|s| s.jobs.iter().map(|j| (j.info.job.clone(), j.info.host.clone(), j.info.state, j.info.ready)).collect()).unwrap_or_default()
        };
        check(&mut sim)?;
        for st in steps {
            let js = jobs(&sim);
            let pick = |i: usize| (!js.is_empty()).then(|| js[i % js.len()].clone());
            match st {
                Step::Put(v) => sim.put(versioned(3, &format!("v{v}"))),
                Step::Scale(n) => {
                    let r = sim.core.scale(&key, u64::from(n), &admin(), sim.now).map(|_| ());
                    sim.settle("scale", r);
                }
                Step::Restart => {
                    let r = sim.core.restart(&key, &admin(), sim.now);
                    sim.settle("restart", r);
                }
                Step::Start(i) => if let Some((j, h, s, _)) = pick(i) {
                    if s == JobState::Placed { sim.events(&h, vec![started(&j)]); }
                },
                Step::Ready(i, r) => if let Some((j, h, _, _)) = pick(i) {
                    sim.events(&h, vec![ready(&j, r)]);
                },
                Step::Exit(i) => if let Some((j, h, _, _)) = pick(i) {
                    sim.events(&h, vec![exited(&j)]);
                },
                Step::Pass(secs) => {
                    // One second at a time, checked after each: the check stamps events
                    // with the clock it reads.
                    for _ in 1..secs {
                        sim.run_for(1, &hosts);
                        check(&mut sim)?;
                    }
                    sim.run_for(1, &hosts);
                }
            }
            check(&mut sim)?;
        }
        // Workers behave from here on: start what is placed, report ready, exit on stop.
        for _ in 0..40 {
            let js = jobs(&sim);
            for (j, h, s, r) in &js {
                match s {
                    JobState::Placed => sim.events(h, vec![started(j), ready(j, true)]),
                    JobState::Running if !r => sim.events(h, vec![ready(j, true)]),
                    JobState::Stopping => sim.events(h, vec![exited(j)]),
                    _ => {}
                }
                check(&mut sim)?;
            }
            sim.run_for(1, &hosts);
            check(&mut sim)?;
        }
        let v = sim.core.view();
        let v = v.borrow();
        let s = &v.services[&key];
        // Complete; or reverted, with the rollback itself done.
        let done = match s.rollout.state.as_str() {
            "complete" => true,
            "reverted" => s.rollout.stable.as_ref().map(|st| st.generation) == Some(s.info.generation),
            _ => false,
        };
        proptest::prop_assert!(done, "{:?}", s.rollout);
        proptest::prop_assert_eq!(s.counts.ready, s.info.replicas);
    }
}

/// A scheduling pass visits only the services something happened to (`core/sched.rs`):
/// a commit changed their shape, replicas of theirs wait for room, their last replica
/// became available, or time alone changes them. That nothing is missed is checked at
/// every settle of every test here: under `cfg(test)`, `Core::check_skipped` asserts that
/// no service a pass leaves out has a replica to place, a job to drain or a rollout to
/// complete.
#[test]
fn a_pass_visits_only_the_services_something_happened_to() {
    let visits = |s: &Sim| s.metrics.pass_visits.get();
    let mut s = Sim::one_host(8);
    s.submit(web("a", "default", 2));
    s.submit(web("b", "default", 2));
    s.start_ready(&[
        ("exec-01", "j-1"),
        ("exec-01", "j-2"),
        ("exec-01", "j-3"),
        ("exec-01", "j-4"),
    ]);
    assert!(
        s.rollout("a").contains("rollout=complete"),
        "{}",
        s.rollout("a")
    );
    assert!(
        s.rollout("b").contains("rollout=complete"),
        "{}",
        s.rollout("b")
    );

    // A readiness report for a complete service: nothing to do, nothing visited.
    let v = visits(&s);
    s.events("exec-01", vec![ready("j-1", false)]);
    assert_eq!(
        visits(&s) - v,
        0,
        "a is complete: its readiness changes nothing"
    );

    // A timer with nothing due: nothing is visited.
    let v = visits(&s);
    s.core.mark_dirty();
    s.settle("timer", Ok(()));
    assert_eq!(visits(&s) - v, 0, "nothing happened to any service");

    // c does not fit whole (4 of 8 slots are taken): two of its replicas wait, and
    // every pass visits it until they are placed.
    s.submit(web("c", "default", 6));
    assert_eq!(
        s.metrics.pending.get(),
        2,
        "two of c's replicas wait for room"
    );
    let v = visits(&s);
    s.events("exec-01", vec![ready("j-1", true)]);
    assert_eq!(visits(&s) - v, 1, "c, waiting for room");

    // Room appears on a new host: c places the rest, and waits no more.
    s.register("exec-02", 8, &[]);
    assert_eq!(s.metrics.pending.get(), 0);

    // c's six replicas start and become ready one report at a time: c is visited once,
    // when the last one is ready (its rollout completes then, not before).
    let v = visits(&s);
    s.start_ready(&[("exec-01", "j-5"), ("exec-01", "j-6"), ("exec-01", "j-7")]);
    assert!(
        s.rollout("c").contains("rollout=progressing"),
        "{}",
        s.rollout("c")
    );
    s.start_ready(&[("exec-01", "j-8"), ("exec-02", "j-9"), ("exec-02", "j-10")]);
    assert!(
        s.rollout("c").contains("rollout=complete"),
        "{}",
        s.rollout("c")
    );
    assert_eq!(visits(&s) - v, 1, "c, once its last replica is ready");

    // A replica of b exits: b is visited and, once its backoff is over, replaced.
    let v = visits(&s);
    s.events("exec-01", vec![exited("j-3")]);
    assert_eq!(visits(&s) - v, 1, "only b");
    assert_eq!(
        s.metrics.pending.get(),
        1,
        "b's replica waits for its backoff"
    );
    let placed = s.metrics.placements.get();
    s.run_for(2, &["exec-01", "exec-02"]);
    assert_eq!(
        s.metrics.placements.get() - placed,
        1,
        "b's replica replaced"
    );
    assert_eq!(s.metrics.pending.get(), 0);
}

/// Every rollout counted as ended was counted as started: a new service and a scale
/// start one each (a scale used to end as `complete` without ever starting).
#[test]
fn every_rollout_that_ends_was_counted_as_started() {
    let mut sim = Sim::one_host(10);
    sim.put(versioned(1, "v1"));
    sim.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
    sim.run_for(11, &["exec-01"]);
    let key = ServiceKey::new("default", "web");
    let r = sim.core.scale(&key, 2, &admin(), sim.now).map(|_| ());
    sim.settle("scale 2", r);
    sim.events("exec-01", vec![started("j-2"), ready("j-2", true)]);
    sim.run_for(11, &["exec-01"]);
    let ended = |outcome: &str| {
        sim.metrics
            .rollouts
            .get_or_create(&vec![("outcome".to_owned(), outcome.to_owned())])
            .get()
    };
    let state = sim.rollout("web");
    assert!(state.contains("rollout=complete"), "{state}");
    assert_eq!(
        (sim.metrics.rollouts_started.get(), ended("complete")),
        (2, 2),
        "started vs complete"
    );
}

/// A rollback places its replacement at its next pass: the restart backoff the broken
/// generation's exits earned belongs to that generation, not to the profile rolled back
/// to. Found by the robustness suite (`xced dev`, seed 17747317416028647204): one replica,
/// `max_unavailable = 1`, a broken update; the rolled-back replica waited out the broken
/// replicas' 16 s backoff (longer after more broken updates), so the service had no ready
/// replica for that long after the rollback.
#[test]
fn a_rollback_does_not_wait_for_the_broken_generations_backoff() {
    let mut sim = Sim::one_host(10);
    let one = |command: &str| {
        let mut doc = versioned(1, command);
        doc["service"]["update"] = json!({"max_surge": 0, "max_unavailable": 1, "min_ready": "0s"});
        doc
    };
    sim.put(one("v1"));
    sim.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
    sim.put(one("exit 1"));
    sim.run_for(2, &["exec-01"]);
    sim.events("exec-01", vec![exited("j-1")]);
    let jobs_of = |sim: &Sim, generation: u64| -> Vec<String> {
        sim.core.view().borrow().services[&ServiceKey::new("default", "web")]
            .jobs
            .iter()
            .filter(|j| j.info.generation == generation)
            .map(|j| j.info.job.clone())
            .collect()
    };
    // Generation 2 dies at once, three times (backoffs of 1 s, 2 s, then 4 s).
    for exit in 0..3 {
        let j = jobs_of(&sim, 2);
        assert_eq!(j.len(), 1, "exit {exit}: one replica of generation 2");
        sim.events("exec-01", vec![started(&j[0]), exited(&j[0])]);
        if exit < 2 {
            sim.run_for(4, &["exec-01"]);
        }
    }
    assert!(
        sim.rollout("web").contains("rollout=reverted")
            || sim.rollout("web").contains("rolled back"),
        "the broken generation was rolled back: {}",
        sim.rollout("web")
    );
    // The next pass (a second later; generation 2's last backoff was 4 s) places it.
    sim.run_for(1, &["exec-01"]);
    assert_eq!(
        jobs_of(&sim, 3).len(),
        1,
        "the rollback's replica is placed at the next pass, not after generation 2's backoff: {}",
        sim.rollout("web")
    );
}
