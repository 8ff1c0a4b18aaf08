//! The `unreachable_after` rule (an unreachable host's replicas leave the endpoints and
//! come back when it is heard), a lost host's replicas drained before its worker may stop
//! them, and pause detection with no blind spot (issue 28, findings 2, 4 and 6).

use super::*;
use crate::core::pulse::Pulse;

/// Whether a step of the log marks a host unreachable.
fn declared_unreachable(out: &[String]) -> bool {
    out.iter().any(|l| l.contains("Unreachable"))
}

/// Three hosts heard a moment ago, then this controller paused for `pause`, its timer
/// armed for the hosts' `unreachable_after` deadline; with `pulse`, its beat thread
/// woke `pause` late. Whether the tick after the pause declared a host unreachable.
fn paused_for(pause: Duration, pulse: bool) -> bool {
    let (mut sim, _) = Sim::spread_ready(TIMING, 3);
    sim.run_for(1, &["exec-01", "exec-02", "exec-03"]);
    if pulse {
        let beats = Pulse::manual(std::time::Instant::now());
        sim.core.watch_pauses_with(beats.clone());
        beats.beat(std::time::Instant::now() + pause);
    }
    let armed = sim.now + TIMING.unreachable_after;
    sim.out.clear();
    sim.now += pause;
    sim.core.tick(sim.now, Some(armed));
    sim.core.mark_dirty();
    sim.settle("resumed", Ok(()));
    declared_unreachable(&sim.out)
}

/// Finding 4: a pause shorter than `unreachable_after` + the timer's 2 s tolerance went
/// unseen (the timer was armed up to `unreachable_after` ahead and measured only its own
/// lateness), and every host was declared unreachable. The beat thread sees them all.
#[test]
fn pauses_from_two_to_six_seconds_declare_no_host_unreachable() {
    for ms in [2_000, 2_500, 3_000, 3_500, 4_000, 4_500, 5_000, 6_000] {
        let pause = Duration::from_millis(ms);
        assert!(
            !paused_for(pause, true),
            "a pause of {pause:?} seen by the beat thread declared a host unreachable"
        );
    }
    // The blind spot the beat thread closes: the timer alone misses 3-5 s pauses.
    for ms in [3_500, 4_000, 5_000] {
        let pause = Duration::from_millis(ms);
        assert!(
            paused_for(pause, false),
            "the timer alone was expected to miss a pause of {pause:?}"
        );
    }
}

/// A host silent for real is still judged on its own silence: a pause credits the hosts
/// with its length only, not a fresh window.
#[test]
fn a_pause_does_not_hide_a_host_that_was_silent_before_it() {
    let (mut sim, _) = Sim::spread_ready(TIMING, 3);
    let beats = Pulse::manual(std::time::Instant::now());
    sim.core.watch_pauses_with(beats.clone());
    // exec-03 falls silent; 2 s later the controller pauses for 2 s.
    sim.run_for(2, &["exec-01", "exec-02"]);
    sim.out.clear();
    beats.beat(std::time::Instant::now() + Duration::from_secs(2));
    sim.now += Duration::from_secs(2);
    sim.heartbeat("exec-01");
    sim.heartbeat("exec-02");
    sim.core.tick(sim.now, Some(sim.now));
    sim.settle("resumed after 2 s", Ok(()));
    assert!(!declared_unreachable(&sim.out), "{:#?}", sim.out);
    // 4 s of silence, 2 of them the controller's own: unreachable 1 s later.
    sim.run_for(1, &["exec-01", "exec-02"]);
    assert!(declared_unreachable(&sim.out), "{:#?}", sim.out);
}

/// Finding 6: an unreachable host's ready replicas leave the endpoints at
/// `unreachable_after` (not at the grace period), keep their jobs and ports, and come
/// back as they were when the host is heard again.
#[test]
fn an_unreachable_hosts_replicas_leave_the_endpoints_and_come_back_when_heard() {
    let (mut sim, _) = Sim::spread_ready(TIMING, 3);
    sim.run_for(3, &["exec-01", "exec-02"]);
    sim.run_for(5, &["exec-01", "exec-02"]);
    sim.events("exec-03", vec![ready("j-3", false), ready("j-3", true)]);
    sim.heartbeat("exec-03");
    sim.run_for(1, &["exec-01", "exec-02", "exec-03"]);
    let out = sim
        .out
        .split_off(sim.out.iter().position(|l| l.starts_with("> 3s")).unwrap());
    expect![[r#"
        > 3s pass, heartbeats from ["exec-01", "exec-02"]
          15 job j-3 web/2 exec-03 Unknown ready=false
          16 host exec-03 Unreachable ["web"]
        > 5s pass, heartbeats from ["exec-01", "exec-02"]
        > events exec-03 [{"event":"readiness","job":"j-3","ready":false},{"event":"readiness","job":"j-3","ready":true}]
        > heartbeat exec-03
          17 job j-3 web/2 exec-03 Running ready=true
          18 host exec-03 Ready ["web"]
        > 1s pass, heartbeats from ["exec-01", "exec-02", "exec-03"]
    "#]]
    .assert_eq(&(out.join("\n") + "\n"));
}

/// Finding 2: a host silent past its grace period is lost (and its worker, if it still
/// hears the controller, stops its replicas) only once they have been out of the
/// endpoints for their drain: with a 4 s grace period and the default 5 s drain, at
/// `unreachable_after` + 5 s = 8 s.
#[test]
fn a_host_is_lost_only_after_its_replicas_drained_out_of_the_endpoints() {
    let timing = Timing {
        grace_period: Duration::from_secs(4),
        ..TIMING
    };
    let (mut sim, _) = Sim::spread_ready(timing, 3);
    sim.run_for(3, &["exec-01", "exec-02"]);
    sim.out.clear();
    sim.run_for(4, &["exec-01", "exec-02"]);
    assert!(
        !sim.out.iter().any(|l| l.contains("Lost")),
        "lost before its replicas drained: {:#?}",
        sim.out
    );
    sim.run_for(1, &["exec-01", "exec-02"]);
    assert!(
        sim.out.iter().any(|l| l.contains("host exec-03 Lost")),
        "{:#?}",
        sim.out
    );
}

/// The full-disruption rule keeps its behaviour: a host that left the endpoints alone
/// comes back into them when most hosts turn out to be unreachable at once.
#[test]
fn a_full_disruption_lists_the_unreachable_hosts_replicas_again() {
    let (mut sim, _) = Sim::spread_ready(TIMING, 3);
    sim.run_for(3, &["exec-01", "exec-02"]);
    sim.out.clear();
    sim.run_for(3, &["exec-01"]);
    let v = sim.core.view();
    let ready: Vec<bool> = v.borrow().services[&ServiceKey::new("default", "web")]
        .jobs
        .iter()
        .map(|j| j.info.ready)
        .collect();
    assert_eq!(ready, [true, true, true], "{:#?}", sim.out);
    assert_eq!(sim.metrics.full_disruption.get(), 1);
}

/// Finding 3: a worker whose assignments query missed a change (it waits on a connection
/// that died in a partition) learns it from its next heartbeat's answer, which names the
/// host's index; a worker in sync gets no answer body (nothing more is sent).
#[test]
fn a_heartbeat_naming_older_assignments_is_told_the_hosts_index() {
    let (mut sim, _) = Sim::spread_ready(TIMING, 1);
    let host = "exec-01".to_owned();
    let index = sim
        .core
        .assignments(&host, &worker(&host))
        .unwrap()
        .borrow()
        .index;
    let mut beat = xce_proto::worker::Heartbeat::of(&facts_of(&host, 3), [("j-1", true)]);
    let mut answer = |held: Option<u64>| {
        beat.assignments = held;
        let a = sim
            .core
            .heartbeat(&host, &worker(&host), Some(&beat), sim.now);
        a.unwrap().and_then(|a| a.assignments)
    };
    assert_eq!(answer(Some(index)), None);
    assert_eq!(answer(None), None, "a worker that predates the field");
    assert_eq!(answer(Some(index - 1)), Some(index));
}
