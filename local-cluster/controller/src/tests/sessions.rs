//! Worker sessions (issue 27, finding 4): a host is held by the session secret its
//! worker's registration was handed, not by an instance id anyone may learn; and each
//! heartbeat's digest shows a forged facts or readiness report at once.

use super::*;
use xce_proto::worker::{sha256_hex, Heartbeat, HeartbeatAnswer};

const HOST: &str = "exec-01";

/// A registration of `HOST` by `caller` that wants a session, with 2 slots and `running`.
fn register(s: &mut Sim, caller: &Caller, running: &[&str]) -> Result<Option<String>, String> {
    let req = RegisterRequest {
        facts: facts_of(HOST, 2),
        running: running
            .iter()
            .map(|j| RunningJob {
                job: (*j).into(),
                pid: 1,
                ready: true,
            })
            .collect(),
        wants_session: true,
    };
    let r = s.core.register(&HOST.to_owned(), caller, req, s.now);
    s.core.settle(s.now);
    r.map(|a| a.session).map_err(|e| e.to_string())
}

/// `caller` with session secret `secret`.
fn with_secret(caller: Caller, secret: &str) -> Caller {
    Caller {
        session: Some(secret.to_owned()),
        ..caller
    }
}

/// A heartbeat by `caller` asserting `facts` and `ready`: the answer, or the error.
fn beat(s: &mut Sim, caller: &Caller, facts: &HostFacts, ready: &[(&str, bool)]) -> String {
    let b = Heartbeat::of(facts, ready.iter().copied());
    let r = s.core.heartbeat(&HOST.to_owned(), caller, Some(&b), s.now);
    s.core.settle(s.now);
    match r {
        Ok(None) => "in sync".to_owned(),
        Ok(Some(HeartbeatAnswer {
            facts_differ,
            ready,
            ..
        })) => format!("differs: facts={facts_differ} ready={ready:?}"),
        Err(e) => format!("error: {e}"),
    }
}

/// Heartbeat, facts, readiness event and assignments query by `caller`: their outcomes.
fn calls(s: &mut Sim, caller: &Caller) -> Vec<String> {
    let host = HOST.to_owned();
    let now = s.now;
    let mut out = vec![beat(s, caller, &facts_of(HOST, 2), &[])];
    let others = [
        s.core.facts(&host, caller, facts_at("127.0.78.99", 2), now),
        s.core.events(&host, caller, vec![ready("j-1", false)], now),
        s.core.assignments(&host, caller).map(drop),
    ];
    out.extend(
        others
            .into_iter()
            .map(|r| r.err().map_or("ok".to_owned(), |e| format!("error: {e}"))),
    );
    s.core.settle(now);
    out.dedup();
    out
}

#[test]
fn a_host_held_by_a_session_hears_only_its_secret() {
    let mut s = Sim::new();
    let w = worker(HOST);
    let secret = register(&mut s, &w, &[]).unwrap().expect("a session");
    assert_eq!(secret.len(), 64, "{secret}");
    let holder = with_secret(w.clone(), &secret);
    let dump = xce_store::testing::dump(&*s.store);
    assert!(
        !dump.contains(&secret),
        "the store holds the secret:\n{dump}"
    );
    assert!(dump.contains(&sha256_hex(secret.as_bytes())), "{dump}");
    let mut out = Vec::new();
    let guessed = "0".repeat(64);
    let hash = sha256_hex(secret.as_bytes());
    for (who, caller) in [
        ("its instance id, no secret", w.clone()),
        (
            "its instance id, a guessed secret",
            with_secret(w.clone(), &guessed),
        ),
        (
            "its instance id, the stored hash",
            with_secret(w.clone(), &hash),
        ),
        (
            "its secret, another instance",
            with_secret(duplicate(), &secret),
        ),
        ("the holder", holder.clone()),
    ] {
        out.push(format!("{who}: {:?}", calls(&mut s, &caller)));
    }
    // Registrations that do not prove the session, while the holder is live.
    for (who, caller) in [
        ("another instance", duplicate()),
        ("its instance id", w.clone()),
    ] {
        let r = register(&mut s, &caller, &[]);
        out.push(format!("register as {who}: {r:?}"));
    }
    // The holder itself (a restarted worker with its data dir) keeps its session.
    out.push(format!(
        "register as the holder: {:?}",
        register(&mut s, &holder, &[])
    ));
    // A new controller (a restart, a new leader) knows the session from the store.
    let mut s = s.restart(1);
    out.push(format!(
        "after a restart, the holder: {:?}",
        calls(&mut s, &holder)
    ));
    out.push(format!(
        "after a restart, its instance id: {:?}",
        calls(&mut s, &w)
    ));
    // Past `unreachable_after` unheard, the instance (which lost its secret) registers
    // again with a new session; the old secret is refused from then on.
    s.run_for(4, &[]);
    let fresh = register(&mut s, &w, &[]).unwrap().expect("a new session");
    assert_ne!(fresh, secret);
    out.push(format!(
        "the old secret after a takeover: {:?}",
        calls(&mut s, &holder)
    ));
    let text = out.join("\n");
    assert!(!text.contains("i-exec-01"), "an answer names the instance");
    expect![[r#"
        its instance id, no secret: ["error: host exec-01 is held by a worker session: a worker call must carry the session secret its registration returned (header x-xce-worker-session)"]
        its instance id, a guessed secret: ["error: the worker session presented for host exec-01 is not the host's (another worker took the host over, or the session was never issued): register again"]
        its instance id, the stored hash: ["error: the worker session presented for host exec-01 is not the host's (another worker took the host over, or the session was never issued): register again"]
        its secret, another instance: ["error: the worker session presented for host exec-01 is not the host's (another worker took the host over, or the session was never issued): register again"]
        the holder: ["in sync", "ok"]
        register as another instance: Err("host exec-01 is held by another live worker; check for a second worker with the same host id (a worker that lost its session registers again once the host has gone unheard for 3s)")
        register as its instance id: Err("host exec-01 is held by another live worker; check for a second worker with the same host id (a worker that lost its session registers again once the host has gone unheard for 3s)")
        register as the holder: Ok(None)
        after a restart, the holder: ["in sync", "ok"]
        after a restart, its instance id: ["error: host exec-01 is held by a worker session: a worker call must carry the session secret its registration returned (header x-xce-worker-session)"]
        the old secret after a takeover: ["error: the worker session presented for host exec-01 is not the host's (another worker took the host over, or the session was never issued): register again"]"#]]
    .assert_eq(&text);
    let refused = |reason: &str| {
        s.metrics
            .worker_calls_refused
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .get()
    };
    // Counted since the restart (a new controller counts afresh).
    assert_eq!(
        (refused("session_required"), refused("session_invalid")),
        (4, 4)
    );
}

#[test]
fn a_forged_report_differs_from_the_next_heartbeats_digest() {
    let mut s = Sim::new();
    let secret = register(&mut s, &worker(HOST), &[])
        .unwrap()
        .expect("a session");
    let w = with_secret(worker(HOST), &secret);
    let host = HOST.to_owned();
    s.submit(web("web", "default", 1));
    let truth = facts_of(HOST, 2);
    let mut out = Vec::new();
    out.push(format!(
        "j-1 placed, the worker runs nothing yet: {}",
        beat(&mut s, &w, &truth, &[])
    ));
    out.push(format!(
        "the worker runs j-1, not reported yet: {}",
        beat(&mut s, &w, &truth, &[("j-1", true)])
    ));
    s.core
        .events(&host, &w, vec![started("j-1"), ready("j-1", true)], s.now)
        .unwrap();
    out.push(format!(
        "reported: {}",
        beat(&mut s, &w, &truth, &[("j-1", true)])
    ));
    // A forged facts report (the whole session stolen): the next heartbeat shows it.
    s.core
        .facts(&host, &w, facts_at("127.0.78.99", 2), s.now)
        .unwrap();
    out.push(format!(
        "forged facts: {}",
        beat(&mut s, &w, &truth, &[("j-1", true)])
    ));
    s.core.facts(&host, &w, truth.clone(), s.now).unwrap();
    out.push(format!(
        "facts re-sent: {}",
        beat(&mut s, &w, &truth, &[("j-1", true)])
    ));
    // A forged readiness event: the same.
    s.core
        .events(&host, &w, vec![ready("j-1", false)], s.now)
        .unwrap();
    out.push(format!(
        "forged readiness: {}",
        beat(&mut s, &w, &truth, &[("j-1", true)])
    ));
    s.core
        .events(&host, &w, vec![ready("j-1", true)], s.now)
        .unwrap();
    out.push(format!(
        "readiness re-sent: {}",
        beat(&mut s, &w, &truth, &[("j-1", true)])
    ));
    // A worker with a session must send its digests; one without need not.
    let bare = s.core.heartbeat(&host, &w, None, s.now).map(drop);
    out.push(format!("no digest: {bare:?}"));
    s.register("exec-02", 2, &[]);
    let old = s
        .core
        .heartbeat(&"exec-02".to_owned(), &worker("exec-02"), None, s.now);
    out.push(format!("no digest, a worker without a session: {old:?}"));
    expect![[r#"
        j-1 placed, the worker runs nothing yet: in sync
        the worker runs j-1, not reported yet: differs: facts=false ready=Some({})
        reported: in sync
        forged facts: differs: facts=true ready=None
        facts re-sent: in sync
        forged readiness: differs: facts=false ready=Some({"j-1": false})
        readiness re-sent: in sync
        no digest: Err(DigestRequired)
        no digest, a worker without a session: Ok(None)"#]]
    .assert_eq(&out.join("\n"));
    let mismatches = |part: &str| {
        s.metrics
            .digest_mismatches
            .get_or_create(&vec![("part".to_owned(), part.to_owned())])
            .get()
    };
    assert_eq!((mismatches("facts"), mismatches("readiness")), (1, 2));
}
