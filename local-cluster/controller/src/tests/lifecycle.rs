//! A replica's life through the core: placed, started, ready, stopped; exits and their
//! restart backoff, the slot's history, refused launches.

use super::*;

#[test]
fn lifecycle_readiness_stop_and_release() {
    let mut s = Sim::one_web();
    s.events(
        "exec-01",
        vec![started("j-1"), ready("j-1", true), ready("j-1", true)],
    );
    // Repeats are idempotent.
    s.events("exec-01", vec![started("j-1")]);
    s.delete("web");
    let a = s.assignments("exec-01");
    s.note(a);
    s.events("exec-01", vec![exited("j-1"), exited("j-1")]);
    let a = s.assignments("exec-01");
    s.note(a);
    s.check(expect![[r#"
        > Sim::one_web: as checked by the fixture
        > events exec-01 [{"event":"started","job":"j-1","pid":7},{"event":"readiness","job":"j-1","ready":true},{"event":"readiness","job":"j-1","ready":true}]
          4 job j-1 web/0 exec-01 Running ready=false
          5 job j-1 web/0 exec-01 Running ready=true
          6 service web rev=6
        > events exec-01 [{"event":"started","job":"j-1","pid":7}]
        > delete web
          7 service web rev=7
          8 job j-1 web/0 exec-01 Draining ready=false
          = exec-01 index=3 [j-1:Run]
        > events exec-01 [{"event":"exited","job":"j-1","code":1},{"event":"exited","job":"j-1","code":1}]
          9 ended j-1 web/0 Stopped
          10 removed web
          plugin: release exec-01 j-1
          = exec-01 index=10 []"#]],
    );
}

#[test]
fn crash_looping_replica_backs_off_then_resets() {
    let mut s = Sim::one_web_crashed();
    let d = s.core.next_deadline(s.now).map(|d| d - s.now);
    s.note(format!(
        "next deadline in {d:?} (backoff 1s, before the host's 3s)"
    ));
    s.run_for(1, &["exec-01"]);
    s.events("exec-01", vec![started("j-2"), exited("j-2")]);
    s.run_for(1, &["exec-01"]);
    s.note("1s is not enough after the second exit".into());
    s.run_for(1, &["exec-01"]);
    s.events("exec-01", vec![started("j-3"), exited("j-3")]);
    s.run_for(3, &["exec-01"]);
    s.note("third exit: 4s".into());
    s.run_for(1, &["exec-01"]);
    s.events("exec-01", vec![started("j-4")]);
    s.run_for(60, &["exec-01"]);
    s.events("exec-01", vec![exited("j-4")]);
    s.note("ran 60s: backoff starts over at 1s".into());
    s.run_for(1, &["exec-01"]);
    s.check(expect![[r#"
        > Sim::one_web_crashed: as checked by the fixture
          = next deadline in Some(1s) (backoff 1s, before the host's 3s)
        > 1s pass, heartbeats from ["exec-01"]
          6 job j-2 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-2 0
        > events exec-01 [{"event":"started","job":"j-2","pid":7},{"event":"exited","job":"j-2","code":1}]
          7 job j-2 web/0 exec-01 Running ready=false
          8 ended j-2 web/0 Exited { code: Some(1) }
          plugin: release exec-01 j-2
        > 1s pass, heartbeats from ["exec-01"]
          = 1s is not enough after the second exit
        > 1s pass, heartbeats from ["exec-01"]
          9 job j-3 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-3 0
        > events exec-01 [{"event":"started","job":"j-3","pid":7},{"event":"exited","job":"j-3","code":1}]
          10 job j-3 web/0 exec-01 Running ready=false
          11 ended j-3 web/0 Exited { code: Some(1) }
          12 service web rev=12
          plugin: release exec-01 j-3
        > 3s pass, heartbeats from ["exec-01"]
          = third exit: 4s
        > 1s pass, heartbeats from ["exec-01"]
          13 job j-4 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-4 0
        > events exec-01 [{"event":"started","job":"j-4","pid":7}]
          14 job j-4 web/0 exec-01 Running ready=false
        > 60s pass, heartbeats from ["exec-01"]
        > events exec-01 [{"event":"exited","job":"j-4","code":1}]
          15 ended j-4 web/0 Exited { code: Some(1) }
          plugin: release exec-01 j-4
          = ran 60s: backoff starts over at 1s
        > 1s pass, heartbeats from ["exec-01"]
          16 job j-5 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-5 0"#]]);
}

/// A fixed wall clock: 2026-12-03T09:00:00Z.
fn wall() -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_secs(1_796_288_400)
}

/// What `GET /v1/services/{name}` says of a replica (its `replica_status` entry) and its
/// pending reason, on one line.
fn replica_status(s: &Sim, name: &str, replica: u32) -> String {
    let v = s.core.view();
    let v = v.borrow();
    let svc = &v.services[&ServiceKey::new("default", name)];
    let pending = svc
        .pending
        .iter()
        .find(|(r, _)| *r == replica)
        .map_or("-", |(_, why)| why.as_str());
    format!(
        "{} pending={pending:?}",
        api::services::replica_json(svc, replica)
    )
}

/// Each way a replica can end by itself — an exit code, a signal, a program that cannot
/// be started — is kept for its slot with the time and the job, counts as a restart,
/// names the cause in the pending reason, and survives a controller restart (it is in
/// the store, committed with the exit itself).
#[test]
fn a_replicas_last_exit_and_restarts_are_shown_and_survive_a_reload() {
    let mut s = Sim::one_web();
    // The wall clock is read only when a replica ends (none in the fixture).
    s.core.set_wall_clock(wall);
    let status = |s: &mut Sim| {
        let line = replica_status(s, "web", 0);
        s.note(line);
    };
    status(&mut s);
    let log = |job: &str| Some(format!("/var/lib/xce/logs/{job}.log"));
    let start = |job: &str| WorkerEvent::Started {
        job: job.into(),
        pid: 7,
        log: log(job),
    };
    let end = |job: &str, cause| WorkerEvent::exited(job.into(), cause, log(job));
    let report = |s: &mut Sim, events| {
        s.events("exec-01", events);
        status(s);
    };
    report(&mut s, vec![start("j-1")]);
    report(&mut s, vec![end("j-1", ExitCause::code(3))]);
    s.run_for(1, &["exec-01"]);
    report(&mut s, vec![start("j-2"), end("j-2", ExitCause::signal(9))]);
    s.run_for(2, &["exec-01"]);
    let spawn_error = ExitCause {
        code: Some(127),
        signal: None,
        error: Some(
            "cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)".into(),
        ),
        worker_stopped: false,
    };
    report(&mut s, vec![end("j-3", spawn_error)]);
    // A repeated report (its acknowledgement was lost) counts nothing twice.
    report(&mut s, vec![end("j-3", ExitCause::code(127))]);
    // A controller restart: the history is read back from the store.
    let mut s = s.restart(1);
    s.core.set_wall_clock(wall);
    status(&mut s);
    // The replacement's start: its log is shown, the slot's history stays.
    report(&mut s, vec![start("j-4")]);
    s.check(expect![[r#"
        > Sim::one_web: as checked by the fixture
          = {"last_exit":null,"log":null,"log_host":null,"replica":0,"restarts":0} pending="-"
        > events exec-01 [{"event":"started","job":"j-1","pid":7,"log":"/var/lib/xce/logs/j-1.log"}]
          4 job j-1 web/0 exec-01 Running ready=false
          = {"last_exit":null,"log":"/var/lib/xce/logs/j-1.log","log_host":"exec-01","replica":0,"restarts":0} pending="-"
        > events exec-01 [{"event":"exited","job":"j-1","code":3,"log":"/var/lib/xce/logs/j-1.log"}]
          5 ended j-1 web/0 Exited { code: Some(3) }
          plugin: release exec-01 j-1
          = {"last_exit":{"at":"2026-12-03T09:00:00.000Z","code":3,"error":null,"host":"exec-01","job":"j-1","signal":null,"signal_name":null,"summary":"exit 3"},"log":"/var/lib/xce/logs/j-1.log","log_host":"exec-01","replica":0,"restarts":1} pending="restarting after exit 3 in 1s"
        > 1s pass, heartbeats from ["exec-01"]
          6 job j-2 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-2 0
        > events exec-01 [{"event":"started","job":"j-2","pid":7,"log":"/var/lib/xce/logs/j-2.log"},{"event":"exited","job":"j-2","code":null,"signal":9,"log":"/var/lib/xce/logs/j-2.log"}]
          7 job j-2 web/0 exec-01 Running ready=false
          8 ended j-2 web/0 Exited { code: None }
          plugin: release exec-01 j-2
          = {"last_exit":{"at":"2026-12-03T09:00:00.000Z","code":null,"error":null,"host":"exec-01","job":"j-2","signal":9,"signal_name":"SIGKILL","summary":"SIGKILL (signal 9)"},"log":"/var/lib/xce/logs/j-2.log","log_host":"exec-01","replica":0,"restarts":2} pending="restarting after SIGKILL in 2s"
        > 2s pass, heartbeats from ["exec-01"]
          9 job j-3 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-3 0
        > events exec-01 [{"event":"exited","job":"j-3","code":127,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","log":"/var/lib/xce/logs/j-3.log"}]
          10 ended j-3 web/0 Exited { code: Some(127) }
          11 service web rev=11
          plugin: release exec-01 j-3
          = {"last_exit":{"at":"2026-12-03T09:00:00.000Z","code":127,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","host":"exec-01","job":"j-3","signal":null,"signal_name":null,"summary":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"},"log":"/var/lib/xce/logs/j-3.log","log_host":"exec-01","replica":0,"restarts":3} pending="restarting in 4s: cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"
        > events exec-01 [{"event":"exited","job":"j-3","code":127,"log":"/var/lib/xce/logs/j-3.log"}]
          = {"last_exit":{"at":"2026-12-03T09:00:00.000Z","code":127,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","host":"exec-01","job":"j-3","signal":null,"signal_name":null,"summary":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"},"log":"/var/lib/xce/logs/j-3.log","log_host":"exec-01","replica":0,"restarts":3} pending="restarting in 4s: cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"
        > load
          resync rev=11 services=1 jobs=[] hosts=1
          12 job j-4 web/0 exec-01 Placed ready=false
          plugin: restore exec-01 j-1 0
          plugin: release exec-01 j-1
          plugin: restore exec-01 j-2 0
          plugin: release exec-01 j-2
          plugin: restore exec-01 j-3 0
          plugin: release exec-01 j-3
          plugin: reserve exec-01 j-4 0
          = {"last_exit":{"at":"2026-12-03T09:00:00.000Z","code":127,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","host":"exec-01","job":"j-3","signal":null,"signal_name":null,"summary":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"},"log":"/var/lib/xce/logs/j-3.log","log_host":"exec-01","replica":0,"restarts":3} pending="-"
        > events exec-01 [{"event":"started","job":"j-4","pid":7,"log":"/var/lib/xce/logs/j-4.log"}]
          13 job j-4 web/0 exec-01 Running ready=false
          = {"last_exit":{"at":"2026-12-03T09:00:00.000Z","code":127,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","host":"exec-01","job":"j-3","signal":null,"signal_name":null,"summary":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"},"log":"/var/lib/xce/logs/j-4.log","log_host":"exec-01","replica":0,"restarts":3} pending="-""#]]);
}

/// A commit slower than the backoff (etcd electing a new raft leader took 5 s): the pass
/// that ran right after the exit saw the backoff still running, and by the time the
/// controller looks at its timers the backoff's instant is past. It must still wake the
/// controller (the replica used to stay pending until some unrelated change), and once a
/// pass has seen it over it arms nothing more (no busy loop).
#[test]
fn a_backoff_that_ends_during_a_slow_commit_still_places_the_replica() {
    let mut s = Sim::one_web_crashed();
    let exited_at = s.now;
    s.now += Duration::from_secs(5);
    s.core
        .heartbeat(&"exec-01".to_owned(), &worker("exec-01"), None, s.now)
        .unwrap();
    let due = s.core.next_deadline(s.now).expect("a deadline");
    assert_eq!(
        due,
        exited_at + Duration::from_secs(1),
        "the backoff's own instant"
    );
    // The timer fires at once (its instant is past): a pass with the fresh time.
    s.core.tick(s.now, Some(s.now));
    s.core.mark_dirty();
    s.core.settle(s.now);
    s.settle("the timer fires 5s after the exit", Ok(()));
    let next = s.core.next_deadline(s.now).expect("the host's deadline");
    assert!(next > s.now, "nothing past-due is armed any more");
    s.check(expect![[r#"
        > Sim::one_web_crashed: as checked by the fixture
        > the timer fires 5s after the exit
          6 job j-2 web/0 exec-01 Placed ready=false
          plugin: reserve exec-01 j-2 0"#]]);
}

#[test]
fn refused_launch_is_reported_released_and_placed_again() {
    let mut s = Sim::one_web();
    s.events(
        "exec-01",
        vec![WorkerEvent::Refused {
            job: "j-1".into(),
            refusal: LaunchRefusal {
                plugin: "slots".into(),
                reason: "slot 0 is in use on the host".into(),
                detail: json!({"slot": 0}),
            },
        }],
    );
    s.check(expect![[r#"
        > Sim::one_web: as checked by the fixture
        > events exec-01 [{"event":"refused","job":"j-1","refusal":{"plugin":"slots","reason":"slot 0 is in use on the host","detail":{"slot":0}}}]
          4 ended j-1 web/0 Refused { reason: "slot 0 is in use on the host" }
          5 job j-2 web/0 exec-01 Placed ready=false
          plugin: launch_refused exec-01 j-1 {"slot":0}
          plugin: release exec-01 j-1
          plugin: reserve exec-01 j-2 0"#]],
    );
}

/// The service detail is written straight into the answer (no `Value` tree of every
/// job): the text is the one the tree gives, key order included, with jobs, a pending
/// replica and a slot's last exit in it.
#[test]
fn the_service_detail_written_directly_is_the_text_of_its_tree() {
    let mut s = Sim::one_host(2);
    s.submit(web("web", "default", 3));
    s.events("exec-01", vec![started("j-1"), exited("j-2")]);
    let v = s.core.view();
    let v = v.borrow();
    let svc = &v.services[&ServiceKey::new("default", "web")];
    assert!(!svc.jobs.is_empty() && !svc.pending.is_empty() && !svc.slots.is_empty());
    let detail = api::services::service_detail(svc, None);
    let direct = serde_json::to_string(&detail).unwrap();
    let tree = serde_json::to_value(&detail).unwrap();
    assert_eq!(direct, tree.to_string());
    assert_eq!(tree["jobs"].as_array().map(Vec::len), Some(svc.jobs.len()));
    assert_eq!(tree["replica_status"].as_array().map(Vec::len), Some(3));
}

#[test]
fn a_job_id_is_one_allocation_shared_by_the_model_and_its_indexes() {
    use xce_model::{Cluster, JobRec};
    let rec = |state, ready| JobRec {
        info: plugin_api::JobInfo {
            job: "j-7".into(),
            service: "web".into(),
            project: "default".into(),
            replica: 0,
            host: "exec-01".into(),
            state,
            ready,
            grants: plugin_api::Grants::new(),
            generation: 1,
        },
        held: None,
        held_ready: None,
        log: None,
    };
    let mut c = Cluster::default();
    c.insert_job(rec(JobState::Placed, false));
    let key = c.job_key("j-7").expect("inserted").clone();
    // The job map's key, the host index and the service index (and this test's clone).
    assert_eq!(Arc::strong_count(&key), 4);
    // A change replaces the record, not the key.
    c.insert_job(rec(JobState::Running, true));
    assert!(Arc::ptr_eq(&key, c.job_key("j-7").expect("still live")));
    assert_eq!(Arc::strong_count(&key), 4);
    assert_eq!(c.jobs_on("exec-01").count(), 1);
    c.remove_job("j-7");
    assert!(c.job_key("j-7").is_none());
    assert_eq!(
        Arc::strong_count(&key),
        1,
        "no index keeps an ended job's id"
    );
}

/// A replica its worker stopped while shutting down (`xced dev` on Ctrl-C, `xced worker`
/// told to stop its replicas) did not end by itself: it counts no restart, no backoff
/// and no rollout exit, and its slot is placed again at once.
#[test]
fn a_replica_its_worker_stopped_in_a_shutdown_is_no_restart() {
    let mut s = Sim::one_web();
    s.core.set_wall_clock(wall);
    s.events("exec-01", vec![started("j-1")]);
    let cause = ExitCause {
        worker_stopped: true,
        ..ExitCause::signal(15)
    };
    s.events(
        "exec-01",
        vec![WorkerEvent::exited("j-1".into(), cause, None)],
    );
    let line = replica_status(&s, "web", 0);
    s.note(line);
    s.check(expect![[r#"
        > Sim::one_web: as checked by the fixture
        > events exec-01 [{"event":"started","job":"j-1","pid":7}]
          4 job j-1 web/0 exec-01 Running ready=false
        > events exec-01 [{"event":"exited","job":"j-1","code":null,"signal":15,"worker_stopped":true}]
          5 ended j-1 web/0 Stopped
          6 job j-2 web/0 exec-01 Placed ready=false
          plugin: release exec-01 j-1
          plugin: reserve exec-01 j-2 0
          = {"last_exit":null,"log":null,"log_host":null,"replica":0,"restarts":0} pending="-""#]]);
}
