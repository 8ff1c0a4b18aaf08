//! Host liveness through the core: unreachable, back, lost and replaced; a controller
//! paused past the grace period; the full-disruption rule.

use super::*;

#[test]
fn a_controller_paused_past_the_grace_period_stops_nothing() {
    let mut sim = Sim::new();
    let hosts = ["exec-01", "exec-02", "exec-03"];
    sim.register_all(&hosts, 3);
    sim.put(versioned(3, "v1"));
    sim.start_ready(&[(hosts[0], "j-1"), (hosts[1], "j-2"), (hosts[2], "j-3")]);
    sim.run_for(1, &hosts);
    // SIGSTOP for twice the grace period: the timer armed for `unreachable_after` from
    // now fires 60 s late, before any heartbeat queued meanwhile is handled.
    let armed = sim.now + TIMING.unreachable_after;
    sim.now += TIMING.grace_period * 2;
    sim.core.tick(sim.now, Some(armed));
    sim.core.mark_dirty();
    sim.settle("resumed after 60 s", Ok(()));
    // The hosts are heard again within their fresh window.
    sim.run_for(2, &hosts);
    let s = sim.rollout("web");
    sim.note(s);
    sim.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > register exec-02 running=[]
          2 host exec-02 Ready []
        > register exec-03 running=[]
          3 host exec-03 Ready []
          applied Created
        > put web
          4 service web rev=4
          5 job j-1 web/0 exec-01 Placed ready=false
          6 job j-2 web/1 exec-02 Placed ready=false
          7 job j-3 web/2 exec-03 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-02 j-2 0
          plugin: reserve exec-03 j-3 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          8 job j-1 web/0 exec-01 Running ready=false
          9 job j-1 web/0 exec-01 Running ready=true
        > events exec-02 [{"event":"started","job":"j-2","pid":7},{"event":"readiness","job":"j-2","ready":true}]
          10 job j-2 web/1 exec-02 Running ready=false
          11 job j-2 web/1 exec-02 Running ready=true
        > events exec-03 [{"event":"started","job":"j-3","pid":7},{"event":"readiness","job":"j-3","ready":true}]
          12 job j-3 web/2 exec-03 Running ready=false
          13 job j-3 web/2 exec-03 Running ready=true
          14 service web rev=14
        > 1s pass, heartbeats from ["exec-01", "exec-02", "exec-03"]
        > resumed after 60 s
        > 2s pass, heartbeats from ["exec-01", "exec-02", "exec-03"]
          = web generation=1 rollout=complete updated=3 ready=3 outdated=0 reason="""#]]);
}

/// The full-disruption rule: 2 of 3 hosts go silent at once, past the grace period. The
/// controller suspects itself or its network: nothing is lost or replaced, the silent
/// hosts' replicas leave the endpoints (ready=false) but keep their slots. One comes back
/// (readiness as it was, no restart); the disruption is over, and the other is judged
/// again from then on: lost a whole grace period later, and only then replaced.
#[test]
fn most_hosts_silent_at_once_lose_nothing_until_fewer_are() {
    let (mut sim, _) = Sim::spread_ready(TIMING, 3);
    sim.run_for(35, &["exec-01"]);
    let m = sim.metrics.full_disruption.get();
    sim.note(format!("xce_full_disruption {m}"));
    let next = sim.core.next_deadline(sim.now).map(|d| d - sim.now);
    sim.note(format!(
        "next deadline in {next:?} (exec-01's own; no busy timer)"
    ));
    sim.run_for(60, &["exec-01"]);
    sim.heartbeat("exec-02");
    sim.run_for(1, &["exec-01", "exec-02"]);
    let m = sim.metrics.full_disruption.get();
    sim.note(format!("xce_full_disruption {m}"));
    sim.run_for(28, &["exec-01", "exec-02"]);
    sim.note("exec-03 silent for 2 minutes, but only 29 s since the disruption ended".into());
    sim.run_for(2, &["exec-01", "exec-02"]);
    let a = sim.assignments("exec-01");
    sim.note(a);
    sim.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > register exec-02 running=[]
          2 host exec-02 Ready []
        > register exec-03 running=[]
          3 host exec-03 Ready []
        > submit
          4 service web rev=4
          5 job j-1 web/0 exec-01 Placed ready=false
          6 job j-2 web/1 exec-02 Placed ready=false
          7 job j-3 web/2 exec-03 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-02 j-2 0
          plugin: reserve exec-03 j-3 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          8 job j-1 web/0 exec-01 Running ready=false
          9 job j-1 web/0 exec-01 Running ready=true
        > events exec-02 [{"event":"started","job":"j-2","pid":7},{"event":"readiness","job":"j-2","ready":true}]
          10 job j-2 web/1 exec-02 Running ready=false
          11 job j-2 web/1 exec-02 Running ready=true
        > events exec-03 [{"event":"started","job":"j-3","pid":7},{"event":"readiness","job":"j-3","ready":true}]
          12 job j-3 web/2 exec-03 Running ready=false
          13 job j-3 web/2 exec-03 Running ready=true
          14 service web rev=14
        > 35s pass, heartbeats from ["exec-01"]
          15 job j-2 web/1 exec-02 Unknown ready=true
          16 host exec-02 Unreachable ["web"]
          17 job j-3 web/2 exec-03 Unknown ready=true
          18 host exec-03 Unreachable ["web"]
          19 job j-2 web/1 exec-02 Unknown ready=false
          20 job j-3 web/2 exec-03 Unknown ready=false
          = xce_full_disruption 1
          = next deadline in Some(3s) (exec-01's own; no busy timer)
        > 60s pass, heartbeats from ["exec-01"]
        > heartbeat exec-02
          21 job j-2 web/1 exec-02 Running ready=true
          22 host exec-02 Ready ["web"]
        > 1s pass, heartbeats from ["exec-01", "exec-02"]
          = xce_full_disruption 0
        > 28s pass, heartbeats from ["exec-01", "exec-02"]
          = exec-03 silent for 2 minutes, but only 29 s since the disruption ended
        > 2s pass, heartbeats from ["exec-01", "exec-02"]
          23 ended j-3 web/2 HostLost
          24 host exec-03 Lost []
          25 job j-4 web/2 exec-01 Placed ready=false
          plugin: release exec-03 j-3
          plugin: reserve exec-01 j-4 1
          = exec-01 index=25 [j-1:Run j-4:Run]"#]]);
}

/// A host that comes back during a full disruption past its grace period, while the
/// others stay silent: its replicas are endpoints again at once, readiness as it was
/// (the worker reports transitions only and would never report `ready` again), and a
/// readiness change reported meanwhile is the one kept.
#[test]
fn a_host_back_during_a_full_disruption_serves_again_as_it_was() {
    let (mut sim, _) = Sim::spread_ready(TIMING, 4);
    sim.run_for(31, &["exec-01"]);
    // exec-04's replica turned unready while its host was out: that is what it returns to.
    sim.events("exec-04", vec![ready("j-4", false)]);
    sim.heartbeat("exec-04");
    sim.heartbeat("exec-02");
    // 2 of 4 unreachable is not more than 55 %: the disruption is judged over at once.
    let m = sim.metrics.full_disruption.get();
    let next = sim.core.next_deadline(sim.now).map(|d| d - sim.now);
    sim.note(format!(
        "xce_full_disruption {m}, next deadline in {next:?}"
    ));
    sim.run_for(1, &["exec-01", "exec-02", "exec-04"]);
    let m = sim.metrics.full_disruption.get();
    sim.note(format!("xce_full_disruption {m}"));
    sim.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > register exec-02 running=[]
          2 host exec-02 Ready []
        > register exec-03 running=[]
          3 host exec-03 Ready []
        > register exec-04 running=[]
          4 host exec-04 Ready []
        > submit
          5 service web rev=5
          6 job j-1 web/0 exec-01 Placed ready=false
          7 job j-2 web/1 exec-02 Placed ready=false
          8 job j-3 web/2 exec-03 Placed ready=false
          9 job j-4 web/3 exec-04 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-02 j-2 0
          plugin: reserve exec-03 j-3 0
          plugin: reserve exec-04 j-4 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          10 job j-1 web/0 exec-01 Running ready=false
          11 job j-1 web/0 exec-01 Running ready=true
        > events exec-02 [{"event":"started","job":"j-2","pid":7},{"event":"readiness","job":"j-2","ready":true}]
          12 job j-2 web/1 exec-02 Running ready=false
          13 job j-2 web/1 exec-02 Running ready=true
        > events exec-03 [{"event":"started","job":"j-3","pid":7},{"event":"readiness","job":"j-3","ready":true}]
          14 job j-3 web/2 exec-03 Running ready=false
          15 job j-3 web/2 exec-03 Running ready=true
        > events exec-04 [{"event":"started","job":"j-4","pid":7},{"event":"readiness","job":"j-4","ready":true}]
          16 job j-4 web/3 exec-04 Running ready=false
          17 job j-4 web/3 exec-04 Running ready=true
          18 service web rev=18
        > 31s pass, heartbeats from ["exec-01"]
          19 job j-2 web/1 exec-02 Unknown ready=true
          20 host exec-02 Unreachable ["web"]
          21 job j-3 web/2 exec-03 Unknown ready=true
          22 host exec-03 Unreachable ["web"]
          23 job j-4 web/3 exec-04 Unknown ready=true
          24 host exec-04 Unreachable ["web"]
          25 job j-2 web/1 exec-02 Unknown ready=false
          26 job j-3 web/2 exec-03 Unknown ready=false
          27 job j-4 web/3 exec-04 Unknown ready=false
        > events exec-04 [{"event":"readiness","job":"j-4","ready":false}]
        > heartbeat exec-04
          28 job j-4 web/3 exec-04 Running ready=false
          29 host exec-04 Ready ["web"]
        > heartbeat exec-02
          30 job j-2 web/1 exec-02 Running ready=true
          31 host exec-02 Ready ["web"]
          = xce_full_disruption 1, next deadline in Some(0ns)
        > 1s pass, heartbeats from ["exec-01", "exec-02", "exec-04"]
          = xce_full_disruption 0"#]]);
}

/// The rule against a random cluster: `silent` of `hosts` hosts go quiet at once past the
/// grace period, with a random threshold. Either it is a full disruption (by the pure
/// rule) and no host is lost, no replica placed elsewhere, no timer is left in the past;
/// or every silent host is lost. Then all come back: in a disruption, every replica is as
/// it was (same job, ready), and nothing was released.
#[test]
fn the_full_disruption_rule_through_the_core() {
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    });
    let strategy = (1usize..=7, 0usize..=7, 1u32..=20);
    runner
        .run(&strategy, |(n, silent, tenths)| {
            let silent = silent.min(n);
            let threshold = DisruptionThreshold::try_new(f64::from(tenths) / 20.0).unwrap();
            let timing = Timing {
                disruption_threshold: threshold,
                ..TIMING
            };
            let (mut sim, jobs) = Sim::spread_ready(timing, n);
            let names = host_names(n);
            let talking: Vec<&str> = names[silent..].iter().map(String::as_str).collect();
            sim.raw.take();
            sim.run_for(TIMING.grace_period.as_secs() + 5, &talking);
            let events = sim.raw.take();
            let lost = events
                .iter()
                .filter(|e| matches!(e, ClusterEvent::Host { host, .. } if host.state == HostState::Lost))
                .count();
            let placed = events
                .iter()
                .filter(|e| matches!(e, ClusterEvent::Job { job, .. } if job.state == JobState::Placed))
                .count();
            let full = threshold.is_full_disruption(silent, n);
            prop_assert_eq!(sim.metrics.full_disruption.get(), i64::from(full));
            if full {
                prop_assert_eq!((lost, placed), (0, 0));
                let next = sim.core.next_deadline(sim.now);
                prop_assert!(next.is_none_or(|t| t > sim.now), "a timer in the past");
                for h in &names[..silent] {
                    sim.heartbeat(h);
                }
                sim.run_for(1, &names.iter().map(String::as_str).collect::<Vec<_>>());
                let v = sim.core.view();
                let v = v.borrow();
                let now: Vec<(String, String, bool)> = v.services
                    [&ServiceKey::new("default", "web")]
                    .jobs
                    .iter()
                    .map(|j| (j.info.host.clone(), j.info.job.clone(), j.info.ready))
                    .collect();
                let before: Vec<(String, String, bool)> =
                    jobs.iter().map(|(h, j)| (h.clone(), j.clone(), true)).collect();
                prop_assert_eq!(now, before);
                prop_assert!(!sim.out.iter().any(|l| l.contains("plugin: release")));
            } else {
                // Each talking host has 2 free slots for the lost hosts' replicas.
                prop_assert_eq!((lost, placed), (silent, silent.min(2 * (n - silent))));
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn unreachable_host_keeps_jobs_and_lost_host_is_replaced() {
    let mut s = Sim::new();
    s.register("exec-01", 2, &[]);
    s.register("exec-02", 2, &[]);
    s.submit(web("web", "default", 2));
    s.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
    s.events("exec-02", vec![started("j-2")]);
    s.run_for(5, &["exec-02"]);
    // Back within the grace period: jobs as before, readiness kept.
    s.heartbeat("exec-01");
    s.run_for(35, &["exec-02"]);
    let a = s.assignments("exec-02");
    s.note(a);
    // The lost worker comes back still running j-1: an orphan; exec-01 takes nothing new
    // until it reported j-1 exited.
    s.heartbeat("exec-01");
    s.register("exec-01", 2, &["j-1"]);
    let a = s.assignments("exec-01");
    s.note(a);
    s.submit(web("api", "default", 2));
    s.events("exec-01", vec![exited("j-1")]);
    s.check(expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 running=[]
          1 host exec-01 Ready []
        > register exec-02 running=[]
          2 host exec-02 Ready []
        > submit
          3 service web rev=3
          4 job j-1 web/0 exec-01 Placed ready=false
          5 job j-2 web/1 exec-02 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-02 j-2 0
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          6 job j-1 web/0 exec-01 Running ready=false
          7 job j-1 web/0 exec-01 Running ready=true
        > events exec-02 [{"event":"started","job":"j-2","pid":7}]
          8 job j-2 web/1 exec-02 Running ready=false
        > 5s pass, heartbeats from ["exec-02"]
          9 job j-1 web/0 exec-01 Unknown ready=false
          10 host exec-01 Unreachable ["web"]
        > heartbeat exec-01
          11 job j-1 web/0 exec-01 Running ready=true
          12 host exec-01 Ready ["web"]
        > 35s pass, heartbeats from ["exec-02"]
          13 job j-1 web/0 exec-01 Unknown ready=false
          14 host exec-01 Unreachable ["web"]
          15 ended j-1 web/0 HostLost
          16 host exec-01 Lost []
          17 job j-3 web/0 exec-02 Placed ready=false
          plugin: release exec-01 j-1
          plugin: reserve exec-02 j-3 1
          = exec-02 index=17 [j-2:Run j-3:Run]
        > heartbeat exec-01
          error: host "exec-01" is not registered
        > register exec-01 running=["j-1"]
          18 host exec-01 Ready []
          = exec-01 index=17 []
        > submit
          19 service api rev=19
        > events exec-01 [{"event":"exited","job":"j-1","code":1}]
          20 job j-4 api/0 exec-01 Placed ready=false
          21 job j-5 api/1 exec-01 Placed ready=false
          plugin: reserve exec-01 j-4 0
          plugin: reserve exec-01 j-5 1"#]]);
}
