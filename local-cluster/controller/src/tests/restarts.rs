//! What a controller restart finds: grants restored (in their release order), the
//! revision continued, a worker's registration reconciled, old records moved.

use super::*;

#[test]
fn a_restart_replays_the_release_order_into_the_plugins() {
    let mut sim = Sim::two_v1_placed(3);
    sim.events("exec-01", vec![started("j-1"), started("j-2")]);
    // j-1 ends: its slot is the most recently freed one.
    sim.events("exec-01", vec![exited("j-1")]);
    // After a restart (or a takeover) the plugins learn the live grants, then the ended
    // ones again, released in the order they ended: their free order is what it was.
    let sim = sim.restart(0);
    sim.check(expect![[r#"
        > Sim::two_v1_placed: as checked by the fixture
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"started","job":"j-2","pid":7}]
          5 job j-1 web/0 exec-01 Running ready=false
          6 job j-2 web/1 exec-01 Running ready=false
        > events exec-01 [{"event":"exited","job":"j-1","code":1}]
          7 ended j-1 web/0 Exited { code: Some(1) }
          plugin: release exec-01 j-1
        > load
          resync rev=7 services=1 jobs=[j-2@exec-01:Running] hosts=1
          8 job j-3 web/0 exec-01 Placed ready=false
          plugin: restore exec-01 j-2 1
          plugin: restore exec-01 j-1 0
          plugin: release exec-01 j-1
          plugin: reserve exec-01 j-3 0"#]]);
}

#[test]
fn register_reconciles_and_refused_facts_keep_the_old_ones() {
    let mut s = Sim::one_host(3);
    s.submit(web("web", "default", 3));
    s.events("exec-01", vec![started("j-1"), started("j-2")]);
    s.delete("web");
    // Worker restarted: j-1 (stopping) still runs, j-2 is gone, j-3 never started.
    s.register("exec-01", 3, &["j-1"]);
    let bad = HostFacts {
        ip_addr: Some("0.0.0.0".parse().unwrap()),
        ..HostFacts::default()
    };
    let r = s
        .core
        .facts(&"exec-01".into(), &worker("exec-01"), bad, s.now);
    s.settle("facts 0.0.0.0", r);
    let ip = s.core.view().borrow().hosts[0].info.facts.ip_addr;
    s.note(format!("ip_addr still {ip:?}"));
    s.check(expect![[r#"
        > Sim::one_host: as checked by the fixture
        > submit
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          4 job j-2 web/1 exec-01 Placed ready=false
          5 job j-3 web/2 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-01 j-2 1
          plugin: reserve exec-01 j-3 2
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"started","job":"j-2","pid":7}]
          6 job j-1 web/0 exec-01 Running ready=false
          7 job j-2 web/1 exec-01 Running ready=false
        > delete web
          8 service web rev=8
          9 job j-1 web/0 exec-01 Draining ready=false
          10 job j-2 web/1 exec-01 Draining ready=false
          11 job j-3 web/2 exec-01 Stopping ready=false
        > register exec-01 running=["j-1"]
          12 ended j-2 web/1 Stopped
          13 ended j-3 web/2 Stopped
          14 host exec-01 Ready ["web"]
          plugin: release exec-01 j-2
          plugin: release exec-01 j-3
        > facts 0.0.0.0
          error: host facts refused
          = ip_addr still Some(127.0.0.11)"#]],
    );
}

#[test]
fn restart_restores_grants_and_continues_the_revision() {
    let mut s = Sim::one_host(3);
    s.submit(web("web", "default", 2));
    s.events("exec-01", vec![started("j-1"), ready("j-1", true)]);
    // A failed commit changes nothing: no event, no grant kept.
    s.store.fail_next_commit();
    s.submit(web("api", "default", 1));
    // The service commits, its placement fails: the reservation is rolled back and the
    // replica stays pending.
    s.store.fail_commit_after(1);
    s.submit(web("api", "default", 1));
    let pending = s.core.view().borrow().services[&ServiceKey::new("default", "api")]
        .pending
        .clone();
    s.note(format!(
        "api pending {pending:?}, used {:?}",
        s.slots.used()
    ));
    let mut s = s.restart(100);
    s.note(format!("used {:?}", s.slots.used()));
    s.events("exec-01", vec![started("j-2")]);
    s.check(expect![[r#"
        > Sim::one_host: as checked by the fixture
        > submit
          2 service web rev=2
          3 job j-1 web/0 exec-01 Placed ready=false
          4 job j-2 web/1 exec-01 Placed ready=false
          plugin: reserve exec-01 j-1 0
          plugin: reserve exec-01 j-2 1
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true}]
          5 job j-1 web/0 exec-01 Running ready=false
          6 job j-1 web/0 exec-01 Running ready=true
        > submit
          error: store failure injected for a test
        > submit
          7 service api rev=7
          plugin: reserve exec-01 j-3 2
          plugin: release exec-01 j-3
          = api pending [(0, "the controller's store failed")], used ["exec-01:0=j-1", "exec-01:1=j-2"]
        > load
          resync rev=7 services=2 jobs=[j-1@exec-01:Running j-2@exec-01:Placed] hosts=1
          8 job j-3 api/0 exec-01 Placed ready=false
          plugin: restore exec-01 j-1 0
          plugin: restore exec-01 j-2 1
          plugin: reserve exec-01 j-3 2
          = used ["exec-01:0=j-1", "exec-01:1=j-2", "exec-01:2=j-3"]
        > events exec-01 [{"event":"started","job":"j-2","pid":7}]
          9 job j-2 web/1 exec-01 Running ready=false"#]]);
}

#[test]
fn service_records_stored_by_name_alone_move_to_project_keys() {
    let store = Arc::new(MemStore::new());
    let rec = json!({"info": {"name": "web", "project": "team-a", "replicas": 1,
                              "profile": {"name": "web", "project": "team-a", "command": ["x"]},
                              "rev": 1},
                     "state": "active"});
    let mut b = xce_store::Batch::default();
    b.put(
        xce_store::Key::new("service", "web"),
        serde_json::to_vec(&rec).unwrap(),
    );
    store.commit(b).unwrap();
    let sim = Sim::load(store.clone(), Instant::now());
    let keys: Vec<String> = store
        .load_all()
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.ns == "service")
        .map(|(k, _)| k.key)
        .collect();
    assert_eq!(keys, vec!["team-a/web".to_owned()]);
    let v = sim.core.view();
    let s = &v.borrow().services[&ServiceKey::new("team-a", "web")];
    assert_eq!((s.info.generation, s.info.rev), (1, 1));
}

#[tokio::test]
async fn restart_on_redb_hands_nothing_out_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let slots = SharedSlots::new();
    let store: Arc<dyn Store> = Arc::new(xce_store::RedbStore::open(&path).unwrap());
    let app = app_tagged(
        ControllerConfig::default(),
        store,
        slots.clone(),
        xce_model::job_tag,
    )
    .await;
    app.register("exec-01", W1, 3).await;
    let (_, a) = app.submit(ADMIN, web("web", "default", 2)).await;
    let App {
        ctl, app: router, ..
    } = app;
    drop(router);
    ctl.shutdown().await;
    let first = slots.take_log();

    let slots2 = SharedSlots::new();
    let store: Arc<dyn Store> = Arc::new(xce_store::RedbStore::open(&path).unwrap());
    let app = app_tagged(
        ControllerConfig::default(),
        store,
        slots2.clone(),
        xce_model::job_tag,
    )
    .await;
    let restored = slots2.take_log();
    let (_, b) = app.submit(ADMIN, web("api", "default", 1)).await;
    let (_, w) = app.get("/v1/services/web", ADMIN).await;
    expect![[r#"
        before: ["reserve exec-01 j-1-A 0", "reserve exec-01 j-2-A 1"] index 4
        restored: ["restore exec-01 j-1-A 0", "restore exec-01 j-2-A 1"]
        after: ["reserve exec-01 j-3-B 2"] index 6, web index 4
        used: ["exec-01:0=j-1-A", "exec-01:1=j-2-A", "exec-01:2=j-3-B"]"#]]
    .assert_eq(&letter_tags(&format!(
        "before: {first:?} index {}\nrestored: {restored:?}\nafter: {:?} index {}, web index {}\nused: {:?}",
        a["index"],
        slots2.take_log(),
        b["index"],
        w["index"],
        slots2.used()
    )));
    app.ctl.shutdown().await;
}

/// `text` with the tag of every job id (`j-<n>-<tag>`) named by a letter in the order
/// the tags first appear: each load of the store draws a random one, and the
/// expectations say which load handed an id out.
fn letter_tags(text: &str) -> String {
    let mut seen: Vec<String> = Vec::new();
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("j-") {
        out.push_str(&rest[..at + 2]);
        rest = &rest[at + 2..];
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        out.push_str(&rest[..digits]);
        rest = &rest[digits..];
        let tag_len = rest.strip_prefix('-').map_or(0, |t| {
            t.len()
                - t.trim_start_matches(|c: char| c.is_ascii_alphanumeric())
                    .len()
        });
        if digits == 0 || tag_len == 0 {
            continue;
        }
        let tag = rest[1..1 + tag_len].to_owned();
        let n = seen.iter().position(|t| *t == tag).unwrap_or_else(|| {
            seen.push(tag);
            seen.len() - 1
        });
        out.push('-');
        out.push(char::from(b'A' + n as u8));
        rest = &rest[1 + tag_len..];
    }
    out.push_str(rest);
    out
}

/// A store restored from a backup lists the jobs that ran at the backup: none of them is
/// an endpoint, and the workers are not heard, until each worker registered again and
/// reported what runs now. A job no worker runs is then replaced, one the store does not
/// know is an orphan (no placements on its host until it exited), and the mark goes.
#[test]
fn a_restored_store_is_trusted_only_after_every_worker_registered_again() {
    let mut s = Sim::two_v1_ready(3);
    let backup = s.store.load_all().unwrap();
    // After the backup: j-1 exits, and the worker runs a replica the backup never saw.
    s.events("exec-01", vec![exited("j-1")]);
    let restored = Arc::new(MemStore::new());
    let mut batch = xce_store::Batch::default();
    for (k, v) in xce_model::restored_records(backup).unwrap() {
        batch.put(k, v);
    }
    restored.commit(batch).unwrap();
    let mut s = Sim::load(restored, s.now + Duration::from_secs(1));
    let ready = |s: &Sim| {
        let view = s.core.view().borrow().clone();
        let jobs: Vec<String> = view
            .services
            .values()
            .flat_map(|svc| svc.jobs.iter())
            .filter(|j| j.info.ready)
            .map(|j| j.info.job.clone())
            .collect();
        format!("ready: {jobs:?}")
    };
    let r = ready(&s);
    s.note(r);
    s.heartbeat("exec-01");
    s.register("exec-01", 3, &["j-2", "j-9"]);
    let r = ready(&s);
    s.note(r);
    s.heartbeat("exec-01");
    let marked = xce_model::Cluster::load(&*s.store).unwrap().restored;
    s.note(format!("restored mark stored: {marked}"));
    s.check(expect![[r#"
        > load
          resync rev=9 services=1 jobs=[j-1@exec-01:Running j-2@exec-01:Running] hosts=1
          plugin: restore exec-01 j-1 0
          plugin: restore exec-01 j-2 1
          = ready: []
        > heartbeat exec-01
          error: host "exec-01" is not registered
        > register exec-01 running=["j-2", "j-9"]
          10 ended j-1 web/0 Exited { code: None }
          11 job j-2 web/1 exec-01 Running ready=true
          12 host exec-01 Ready ["web"]
          plugin: release exec-01 j-1
          = ready: ["j-2"]
        > heartbeat exec-01
          = restored mark stored: false"#]]);
}

/// Every load of a store tags the job ids it hands out, so two loads of one copy (a
/// restore, or a store that went back) never hand out the same id, even for the same
/// job number. With untagged ids both loads would place `j-1` and `j-2`.
#[test]
fn two_loads_of_one_store_copy_hand_out_no_job_id_twice() {
    let s = Sim::one_host(3);
    let copy = s.store.load_all().unwrap();
    let place = || {
        let store = Arc::new(MemStore::new());
        let mut batch = xce_store::Batch::default();
        for (k, v) in copy.clone() {
            batch.put(k, v);
        }
        store.commit(batch).unwrap();
        let mut s = Sim::load_tagged(TIMING, store, s.now, xce_model::job_tag);
        s.register("exec-01", 3, &[]);
        s.put(versioned(2, "v1"));
        let ids: Vec<String> = s.jobs("web").into_iter().map(|(_, j)| j).collect();
        ids
    };
    let (first, second) = (place(), place());
    assert_eq!((first.len(), second.len()), (2, 2), "{first:?} {second:?}");
    assert!(
        first.iter().all(|id| !second.contains(id)),
        "one id handed out by both loads: {first:?} {second:?}"
    );
    let numbers = |ids: &[String]| -> Vec<Option<u64>> {
        ids.iter().map(|id| xce_model::job_number(id)).collect()
    };
    assert_eq!(numbers(&first), numbers(&second), "the same job numbers");
}
