//! The election against a real etcd of its own per test (see `etcd::tests::TestEtcd`).
//! Every wait is bounded by a channel receive with a deadline; nothing sleeps and hopes.

use super::*;
use crate::testing::TestEtcd;
use crate::tests::batch;
use crate::Store;
use expect_test::{expect, Expect};

/// How long a test waits for something etcd makes happen (a lease running out takes
/// the TTL; the rest is slack for a loaded machine).
const PATIENCE: Duration = Duration::from_secs(60);

fn check(transcript: &[String], expect: Expect) {
    expect.assert_eq(&transcript.join("\n"));
}

fn candidate(etcd: &TestEtcd, id: &str, ttl_s: u64) -> Election {
    Election::new(
        vec![etcd.endpoint.clone()],
        "/xce/",
        id,
        Duration::from_secs(ttl_s),
    )
    .unwrap()
}

/// Campaigns on a thread: the ids it was told are leading arrive on the first channel,
/// the result on the second.
fn campaign_in_background(
    e: Election,
) -> (
    mpsc::Receiver<String>,
    mpsc::Receiver<Result<Leadership, ElectionError>>,
) {
    let (told, standby) = mpsc::channel();
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let r = e.campaign(|leader| {
            let _ = told.send(leader.to_owned());
        });
        let _ = done.send(r);
    });
    (standby, result)
}

fn lost_reason(e: ElectionError) -> String {
    // Lease ids and revisions differ per run.
    let s = e.to_string();
    match s.find("the lease ") {
        Some(_) => "leadership lost: the lease has expired".into(),
        None => s,
    }
}

#[test]
fn one_leader_and_a_standby_takes_over_when_the_leader_resigns() {
    let etcd = TestEtcd::start();
    let mut log = Vec::new();
    let a = candidate(&etcd, "a", 5)
        .campaign(|l| panic!("a found {l} leading an empty etcd"))
        .unwrap();
    log.push(format!("{} leads", a.id()));
    let (standby, result) = campaign_in_background(candidate(&etcd, "b", 5));
    log.push(format!(
        "b waits for {}",
        standby.recv_timeout(PATIENCE).unwrap()
    ));
    // b is a standby now; a is still the leader and renews.
    let mut a_again = clone_of(&a);
    a_again.keep_alive().unwrap();
    assert!(result.try_recv().is_err(), "b leads while a does");
    a.resign().unwrap();
    log.push("a resigned".into());
    let b = result.recv_timeout(PATIENCE).unwrap().unwrap();
    log.push(format!("{} leads", b.id()));
    log.push(format!(
        "a renews: {}",
        lost_reason(a_again.keep_alive().unwrap_err())
    ));
    check(
        &log,
        expect![[r#"
            a leads
            b waits for a
            a resigned
            b leads
            a renews: leadership lost: the lease has expired"#]],
    );
}

/// A second handle on the same lease (what the leader process holds).
fn clone_of(l: &Leadership) -> Leadership {
    Leadership {
        election: l.election.clone(),
        lease: l.lease,
        create_revision: l.create_revision,
        ttl: l.ttl,
        expires: l.expires,
        renewed: l.renewed,
    }
}

#[test]
fn a_standby_takes_over_when_the_leader_stops_renewing() {
    let etcd = TestEtcd::start();
    let mut log = Vec::new();
    // a leads and never renews: its lease runs out after the TTL (as when it is killed).
    let mut a = candidate(&etcd, "a", 2).campaign(|_| {}).unwrap();
    let (standby, result) = campaign_in_background(candidate(&etcd, "b", 2));
    log.push(format!(
        "b waits for {}",
        standby.recv_timeout(PATIENCE).unwrap()
    ));
    let b = result.recv_timeout(PATIENCE).unwrap().unwrap();
    log.push(format!("{} leads", b.id()));
    assert!(
        Instant::now() >= a.expires(),
        "b took over before a's own estimate of its lease ran out"
    );
    log.push(format!(
        "a renews: {}",
        lost_reason(a.keep_alive().unwrap_err())
    ));
    // b's key is the one its store is guarded by.
    let mut b = b;
    b.keep_alive().unwrap();
    check(
        &log,
        expect![[r#"
            b waits for a
            b leads
            a renews: leadership lost: the lease has expired"#]],
    );
}

#[test]
fn a_maintained_leader_is_told_when_its_key_is_gone_and_its_store_stops_committing() {
    let etcd = TestEtcd::start();
    let mut log = Vec::new();
    let a = candidate(&etcd, "a", 2).campaign(|_| {}).unwrap();
    let a_store = etcd
        .store("/xce/")
        .with_leader_guard(a.key(), a.create_revision());
    a_store.load_all().unwrap();
    a_store
        .commit(batch(&[("job", "j-1", Some("by-a"))]))
        .unwrap();
    let a_rev = a.create_revision().to_string();
    let (told, lost) = mpsc::channel();
    let kept = a.maintain(move |e| {
        let _ = told.send(e);
    });
    // Renewals keep a leading past several TTLs: b stays a standby until a is deposed.
    let (standby, result) = campaign_in_background(candidate(&etcd, "b", 2));
    log.push(format!(
        "b waits for {}",
        standby.recv_timeout(PATIENCE).unwrap()
    ));
    // Someone deletes the leader key (an operator, or etcd losing the lease).
    let gw = Gateway::new(vec![etcd.endpoint.clone()], Duration::from_secs(5));
    gateway::wait(gw.call(
        "/v3/kv/deleterange",
        &json!({ "key": b64(b"/xce/.leader") }),
        Limits::each(Duration::from_secs(5)),
    ))
    .unwrap();
    log.push("leader key deleted".into());
    let b = result.recv_timeout(PATIENCE).unwrap().unwrap();
    log.push(format!("{} leads", b.id()));
    log.push(format!(
        "a is told: {}",
        lost.recv_timeout(PATIENCE).unwrap()
    ));
    drop(kept);
    // a's store cannot commit any more; b's can.
    let err = a_store
        .commit(batch(&[("job", "j-2", Some("by-a"))]))
        .unwrap_err()
        .to_string();
    log.push(format!("a commits: {}", err.replace(&a_rev, "R")));
    let b_store = etcd
        .store("/xce/")
        .with_leader_guard(b.key(), b.create_revision());
    let loaded = b_store.load_all().unwrap();
    log.push(format!("b loads {} key(s)", loaded.len()));
    b_store
        .commit(batch(&[("job", "j-2", Some("by-b"))]))
        .unwrap();
    log.push("b commits".into());
    check(
        &log,
        expect![[r#"
            b waits for a
            leader key deleted
            b leads
            a is told: leadership lost: the leader key "/xce/.leader" is no longer this leader's (held by b)
            a commits: the store changed under this controller: this controller is no longer the leader (its leader key "/xce/.leader" of revision R is gone or replaced): it must not commit
            b loads 1 key(s)
            b commits"#]],
    );
}

#[test]
fn a_leader_that_cannot_renew_steps_down_at_its_renew_deadline_before_its_lease_ends() {
    let etcd = TestEtcd::start();
    // 3 s lease: 2 s renew deadline, 400 ms retries.
    let a = candidate(&etcd, "a", 3).campaign(|_| {}).unwrap();
    let lease_end = a.expires();
    let (told, lost) = mpsc::channel();
    let kept = a.maintain(move |e| {
        let _ = told.send((e, Instant::now()));
    });
    // Renewals keep it leading past its first lease's end.
    let renewed = lost
        .recv_timeout(lease_end.saturating_duration_since(Instant::now()) + Duration::from_secs(1));
    assert!(renewed.is_err(), "lost while etcd answers: {renewed:?}");
    // etcd frozen: every renewal times out.
    let freeze = |sig| {
        let pid = rustix::process::Pid::from_raw(etcd.pid() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, sig);
    };
    freeze(rustix::process::Signal::STOP);
    let frozen = Instant::now();
    let (e, at) = lost.recv_timeout(PATIENCE).unwrap();
    freeze(rustix::process::Signal::CONT);
    drop(kept);
    // Told at the renew deadline (2 s after the last renewal that went through, before
    // the freeze), so before the lease (3 s after it) could run out and a standby lead.
    assert!(at - frozen < Duration::from_secs(3), "{:?}", at - frozen);
    let reason = e.to_string();
    check(
        &[reason[..reason.find(": /v3").unwrap_or(reason.len())].to_owned()],
        expect![[r#"leadership lost: no lease renewal got through for the renew deadline (2s)"#]],
    );
}

#[test]
fn config_is_checked() {
    let bad = |eps: Vec<&str>, prefix: &str, id: &str, ttl: u64| {
        Election::new(
            eps.into_iter().map(str::to_owned).collect(),
            prefix,
            id,
            Duration::from_millis(ttl),
        )
        .unwrap_err()
        .to_string()
    };
    let log = vec![
        bad(vec![], "/xce/", "a", 5000),
        bad(vec!["nope"], "/xce/", "a", 5000),
        bad(vec!["127.0.0.1:2379"], "/xce", "a", 5000),
        bad(vec!["127.0.0.1:2379"], "/xce/", "", 5000),
        bad(vec!["127.0.0.1:2379"], "/xce/", "a", 500),
    ];
    check(
        &log,
        expect![[r#"
            invalid election config: no etcd endpoint given
            invalid election config: etcd endpoint "nope" has no :PORT
            invalid election config: key prefix "/xce" must end with /
            invalid election config: the candidate id is empty
            invalid election config: leader ttl 500ms is below 1s"#]],
    );
}

#[test]
fn lease_timings_follow_kubernetes_and_every_problem_is_named() {
    let t = |ttl: u64, renew_ms: u64, retry_ms: u64| LeaseTimings {
        ttl: Duration::from_millis(ttl),
        renew_deadline: Duration::from_millis(renew_ms),
        retry_period: Duration::from_millis(retry_ms),
    };
    let mut log = vec![
        format!("default: {:?}", LeaseTimings::default()),
        format!(
            "from 15s: {}",
            LeaseTimings::from_ttl(Duration::from_secs(15)) == LeaseTimings::default()
        ),
        format!(
            "from 3s: {:?}",
            LeaseTimings::from_ttl(Duration::from_secs(3))
        ),
    ];
    for bad in [
        t(1500, 1000, 200),
        t(3000, 3000, 3000),
        t(3000, 0, 0),
        t(15000, 10000, 10000),
    ] {
        log.push(bad.problems().join(" | "));
    }
    log.push(format!("ok: {:?}", LeaseTimings::default().problems()));
    log.push(
        Election::with_timings(
            vec!["127.0.0.1:2379".into()],
            "/xce/",
            "a",
            t(3000, 5000, 100),
        )
        .unwrap_err()
        .to_string(),
    );
    check(
        &log,
        expect![[r#"
        default: LeaseTimings { ttl: 15s, renew_deadline: 10s, retry_period: 2s }
        from 15s: true
        from 3s: LeaseTimings { ttl: 3s, renew_deadline: 2s, retry_period: 400ms }
        leader_ttl (1.5s) must be whole seconds, at least 1s (an etcd lease's TTL)
        renew_deadline (3s) must be shorter than leader_ttl (3s): a leader must step down before its lease can run out and a standby take over | retry_period (3s) must be shorter than renew_deadline (3s): a leader must get more than one try before it steps down
        renew_deadline must be greater than zero | retry_period must be greater than zero
        retry_period (10s) must be shorter than renew_deadline (10s): a leader must get more than one try before it steps down
        ok: []
        invalid election config: renew_deadline (5s) must be shorter than leader_ttl (3s): a leader must step down before its lease can run out and a standby take over"#]],
    );
}

#[test]
fn candidates_starting_together_elect_exactly_one_and_the_rest_follow_the_next() {
    let etcd = TestEtcd::start();
    let mut log = Vec::new();
    // One channel for every result, so the test waits on whoever wins.
    let (done, results) = mpsc::channel();
    let standbys: Vec<mpsc::Receiver<String>> = (0..3)
        .map(|i| {
            let e = candidate(&etcd, &format!("c{i}"), 5);
            let (told, standby) = mpsc::channel();
            let done = done.clone();
            std::thread::spawn(move || {
                let r = e.campaign(|leader| {
                    let _ = told.send(leader.to_owned());
                });
                let _ = done.send((i, r));
            });
            standby
        })
        .collect();
    let next_leader = || {
        let (i, r): (usize, Result<Leadership, ElectionError>) =
            results.recv_timeout(PATIENCE).unwrap();
        (i, r.unwrap())
    };
    // Exactly one wins; the two others name it and stay standbys.
    let (w, winner) = next_leader();
    let mut others: Vec<usize> = (0..3).filter(|&i| i != w).collect();
    for &i in &others {
        let named = standbys[i].recv_timeout(PATIENCE).unwrap();
        log.push(format!(
            "a standby names the winner: {}",
            named == winner.id()
        ));
    }
    assert!(results.try_recv().is_err(), "two leaders at once");
    winner.resign().unwrap();
    log.push("the winner resigned".into());
    // One of the two others takes over; the last one names it.
    let (n, next) = next_leader();
    others.retain(|&i| i != n);
    let last = others[0];
    let named = standbys[last].recv_timeout(PATIENCE).unwrap();
    log.push(format!("the last names the next: {}", named == next.id()));
    assert!(results.try_recv().is_err(), "two leaders at once");
    next.resign().unwrap();
    let (l, _) = next_leader();
    log.push(format!("the last leads: {}", l == last));
    check(
        &log,
        expect![[r#"
            a standby names the winner: true
            a standby names the winner: true
            the winner resigned
            the last names the next: true
            the last leads: true"#]],
    );
}

/// Issue 28, finding 5: a leader that stepped down while etcd did not answer (its lease
/// could not be revoked, and etcd extends every lease when it elects a leader again)
/// keeps trying to revoke it: a standby takes over as soon as etcd answers again, not
/// when the lease runs out.
#[test]
fn a_stepped_down_leader_revokes_its_lease_once_etcd_answers_and_a_standby_leads_at_once() {
    let etcd = TestEtcd::start();
    // A long lease, a short renew deadline: waiting for the lease would take a minute.
    let timings = LeaseTimings {
        ttl: Duration::from_secs(60),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(400),
    };
    let with = |id: &str| {
        Election::with_timings(vec![etcd.endpoint.clone()], "/xce/", id, timings).unwrap()
    };
    let a = with("a").campaign(|_| {}).unwrap();
    let lease_end = a.expires();
    let (told, lost) = mpsc::channel();
    let kept = a.maintain(move |e| {
        let _ = told.send(e);
    });
    let (standby, b) = campaign_in_background(with("b"));
    assert_eq!(standby.recv_timeout(PATIENCE).unwrap(), "a");
    let signal = |sig| {
        let pid = rustix::process::Pid::from_raw(etcd.pid() as i32).unwrap();
        let _ = rustix::process::kill_process(pid, sig);
    };
    signal(rustix::process::Signal::STOP);
    let e = lost.recv_timeout(PATIENCE).unwrap();
    assert!(matches!(e, ElectionError::Lost(_)), "{e}");
    // Stepped down; etcd answers again a moment later.
    let revoking = std::thread::spawn(move || kept.revoke_until_gone(PATIENCE));
    signal(rustix::process::Signal::CONT);
    assert!(revoking.join().unwrap().unwrap(), "the lease was revoked");
    let b = b.recv_timeout(PATIENCE).unwrap().unwrap();
    assert!(
        Instant::now() < lease_end,
        "the standby led only once the old lease ran out"
    );
    drop(b);
}

/// Finding 5: a controller whose stepped-down term left its key behind campaigns again
/// without following itself: it revokes its own old lease and leads.
#[test]
fn a_candidate_never_follows_its_own_key_from_an_earlier_term() {
    let etcd = TestEtcd::start();
    let first = candidate(&etcd, "a", 60).campaign(|_| {}).unwrap();
    let old_lease_end = first.expires();
    // The term ends without revoking (etcd was unreachable then): the key stays.
    drop(first.maintain(|_| {}));
    let (standby, again) = campaign_in_background(candidate(&etcd, "a", 60));
    let led = again.recv_timeout(PATIENCE).unwrap().unwrap();
    assert!(Instant::now() < old_lease_end);
    assert!(
        standby.try_recv().is_err(),
        "told to follow itself: {:?}",
        standby.try_recv()
    );
    assert_eq!(
        candidate(&etcd, "x", 60).leader().unwrap().as_deref(),
        Some("a")
    );
    drop(led);
}

/// The lease clock says a leader may lead until the lease's end it was given (moved on by
/// each renewal), and not a moment after: a check that needs no thread to have run,
/// for a leader that runs again after a freeze.
#[test]
fn the_lease_clock_ends_at_the_leases_end() {
    let clock = LeaseClock::new(Instant::now() + Duration::from_secs(3600));
    assert_eq!(clock.leading(), Ok(()));
    clock.extend(Instant::now());
    let why = clock.leading().unwrap_err();
    assert!(why.contains("another controller may lead now"), "{why}");
    clock.extend(Instant::now() + Duration::from_secs(3600));
    assert_eq!(clock.leading(), Ok(()));
}
