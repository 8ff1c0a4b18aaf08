//! Host and cluster identity (issue 12, bugs 2 and 3): a host is held by one worker
//! instance, a controller serves one cluster.

use super::*;

impl Sim {
    /// What a refused worker request must not change: the stored records, the hosts'
    /// facts and states, the plugin's grants, the host's assignments.
    fn footprint(&mut self, host: &str) -> String {
        let view = self.core.view();
        let hosts: Vec<String> = view
            .borrow()
            .hosts
            .iter()
            .map(|h| format!("{} {:?} {:?}", h.info.id, h.info.state, h.info.facts))
            .collect();
        let assignments = self.assignments(host);
        format!(
            "store: {}\nhosts: {hosts:?}\nslots: {:?}\n{assignments}",
            xce_store::testing::dump(&*self.store),
            self.slots.used()
        )
    }

    /// Heartbeat, facts, events and an assignments query from `caller`: their errors.
    fn worker_calls_as(&mut self, caller: &Caller, host: &str) -> Vec<String> {
        let host = host.to_owned();
        let now = self.now;
        let mut out = vec![
            self.core.heartbeat(&host, caller, None, now).map(drop),
            self.core.facts(&host, caller, facts_of(&host, 7), now),
            self.core.events(&host, caller, vec![exited("j-1")], now),
            self.core.assignments(&host, caller).map(drop),
        ]
        .into_iter()
        .map(|r| r.err().map_or("ok".to_owned(), |e| e.to_string()))
        .collect::<Vec<_>>();
        self.core.settle(now);
        out.dedup();
        out
    }
}

#[test]
fn a_second_worker_for_a_live_host_is_refused_and_changes_nothing() {
    let mut s = Sim::one_web_ready();
    let before = s.footprint("exec-01");
    // Its own facts (5 slots, another address) and nothing running: accepted, it would
    // end j-1 and change the host's capacity.
    let mut dup = RegisterRequest {
        facts: facts_at("127.0.0.77", 5),
        running: Vec::new(),
        wants_session: false,
    };
    let r = s
        .core
        .register(&"exec-01".to_owned(), &duplicate(), dup.clone(), s.now);
    s.settle(
        "register exec-01 as i-dup (facts: 5 slots, 127.0.0.77)",
        r.map(drop),
    );
    let calls = s.worker_calls_as(&duplicate(), "exec-01");
    s.note(format!(
        "i-dup's heartbeat, facts, events, assignments: {calls:?}"
    ));
    assert_eq!(
        s.footprint("exec-01"),
        before,
        "a refused worker changed nothing"
    );
    // A live holder is live across a controller restart too (a fresh window for all).
    let mut s = s.restart(1);
    dup.facts = facts_of("exec-01", 2);
    let r = s
        .core
        .register(&"exec-01".to_owned(), &duplicate(), dup, s.now);
    s.settle("after a restart: register exec-01 as i-dup", r.map(drop));
    // The holder goes on as before.
    s.heartbeat("exec-01");
    let a = s.assignments("exec-01");
    s.note(a);
    s.check(expect![[r#"
        > Sim::one_web_ready: as checked by the fixture
        > register exec-01 as i-dup (facts: 5 slots, 127.0.0.77)
          error: host exec-01 is held by another live worker; check for a second worker with the same host id (a worker that lost its session registers again once the host has gone unheard for 3s)
          = i-dup's heartbeat, facts, events, assignments: ["host exec-01 is held by another live worker; check for a second worker with the same host id (a worker that lost its session registers again once the host has gone unheard for 3s)"]
        > load
          resync rev=6 services=1 jobs=[j-1@exec-01:Running] hosts=1
          plugin: restore exec-01 j-1 0
        > after a restart: register exec-01 as i-dup
          error: host exec-01 is held by another live worker; check for a second worker with the same host id (a worker that lost its session registers again once the host has gone unheard for 3s)
        > heartbeat exec-01
          = exec-01 index=6 [j-1:Run]"#]]);
}

#[test]
fn a_new_worker_instance_takes_over_a_host_whose_worker_is_gone() {
    let mut s = Sim::one_web_ready();
    // The first worker stops heartbeating (its machine was reinstalled: a new data dir,
    // a new instance); past `unreachable_after` the host is free to take over.
    s.run_for(3, &[]);
    s.register_as(&duplicate(), "exec-01", 2, &["j-1"]);
    let calls = s.worker_calls_as(&worker("exec-01"), "exec-01");
    s.note(format!("the old instance's calls: {calls:?}"));
    let r = s
        .core
        .heartbeat(&"exec-01".to_owned(), &duplicate(), None, s.now)
        .map(drop);
    s.settle("heartbeat exec-01 as i-dup", r);
    s.check(expect![[r#"
        > Sim::one_web_ready: as checked by the fixture
        > 3s pass, heartbeats from []
          7 job j-1 web/0 exec-01 Unknown ready=false
          8 host exec-01 Unreachable ["web"]
        > register exec-01 as i-dup running=["j-1"]
          9 job j-1 web/0 exec-01 Running ready=true
          10 host exec-01 Ready ["web"]
          = the old instance's calls: ["host exec-01 is held by another live worker; check for a second worker with the same host id (a worker that lost its session registers again once the host has gone unheard for 3s)"]
        > heartbeat exec-01 as i-dup"#]]);
}

#[test]
fn a_worker_of_another_cluster_is_refused() {
    let mut s = Sim::new();
    let ours = s.core.cluster_id().to_owned();
    assert_eq!(ours.len(), 16, "{ours}");
    let foreign = Caller {
        instance: Some("i-exec-01".into()),
        cluster: Some("0123456789abcdef".into()),
        peer: Some("127.0.0.11".into()),
        session: None,
    };
    let before = xce_store::testing::dump(&*s.store);
    s.register_as(&foreign, "exec-01", 2, &["j-5"]);
    assert_eq!(xce_store::testing::dump(&*s.store), before);
    // Its own cluster's worker (and one that has not joined any yet) is welcome.
    let member = Caller {
        cluster: Some(ours.clone()),
        ..worker("exec-01")
    };
    s.register_as(&member, "exec-01", 2, &[]);
    let calls = s.worker_calls_as(&foreign, "exec-01");
    s.note(format!("the foreign worker's calls: {calls:?}"));
    // The id is the store's: the same after a restart.
    let s = s.restart(0);
    assert_eq!(s.core.cluster_id(), ours);
    expect![[r#"
        > load
          resync rev=0 services=0 jobs=[] hosts=0
        > register exec-01 as i-exec-01 running=["j-5"]
          error: this controller serves cluster <cluster>, the worker belongs to cluster 0123456789abcdef
        > register exec-01 as i-exec-01 running=[]
          1 host exec-01 Ready []
          = the foreign worker's calls: ["this controller serves cluster <cluster>, the worker belongs to cluster 0123456789abcdef"]
        > load
          resync rev=1 services=0 jobs=[] hosts=1"#]].assert_eq(&s.out.join("\n").replace(&ours, "<cluster>"));
}
