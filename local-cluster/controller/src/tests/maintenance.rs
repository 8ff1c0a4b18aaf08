//! Host maintenance through the core: a drain moves every replica by the rollout rules
//! (its replacement placed elsewhere and available before it drains, never below
//! `replicas - max_unavailable`), a drained or cordoned host takes nothing until
//! uncordoned, the state survives a controller restart, a worker's leave drains its
//! host and its return takes it back; and replicas spread by service (draining ones not
//! counted).

use super::*;
use crate::core::HostAction;

/// `name` with `replicas` replicas, a 2 s drain, one surge and none unavailable.
fn svc(name: &str, replicas: u32) -> Value {
    json!({"service": {"name": name, "replicas": replicas, "command": ["sleep", "1000"],
                       "drain": "2s", "update": {"max_surge": 1, "max_unavailable": 0}}})
}

impl Sim {
    fn maintain(&mut self, host: &str, action: HostAction) {
        let r = self
            .core
            .maintain(&host.to_owned(), action, &admin(), self.now);
        self.settle(&format!("{} {host}", action.as_str()), r);
    }

    /// The live jobs of `name` as `(job, host, state, ready)`.
    fn live(&self, name: &str) -> Vec<(String, String, JobState, bool)> {
        self.core.view().borrow().services[&ServiceKey::new("default", name)]
            .jobs
            .iter()
            .map(|j| {
                let i = &j.rec.info;
                (i.job.clone(), i.host.clone(), i.state, i.ready)
            })
            .collect()
    }

    /// Ready replicas of `name` (its endpoints).
    fn ready_count(&self, name: &str) -> usize {
        self.live(name).iter().filter(|j| j.3).count()
    }

    /// Every job of every service placed on `host` (its desired set).
    fn on_host(&self, host: &str) -> usize {
        let v = self.core.view();
        let v = v.borrow();
        v.hosts
            .iter()
            .find(|h| h.info.id == host)
            .map_or(0, |h| h.jobs)
    }

    /// Every placed job starts and is ready (each host reports its own).
    fn start_all_placed(&mut self, names: &[&str]) {
        for n in names {
            for (job, host, state, _) in self.live(n) {
                if state == JobState::Placed {
                    self.events(&host, vec![started(&job), ready(&job, true)]);
                }
            }
        }
    }

    /// Every stopping job exits (its host reports it).
    fn exit_stopping(&mut self, names: &[&str]) {
        for n in names {
            for (job, host, state, _) in self.live(n) {
                if state == JobState::Stopping {
                    self.events(&host, vec![exited(&job)]);
                }
            }
        }
    }
}

/// 3 hosts, `web` (3 replicas) and `api` (2) running, all ready.
fn three_hosts_two_services() -> Sim {
    let mut sim = Sim::new();
    sim.register_all(&host_names(3), 10);
    sim.submit(svc("web", 3));
    sim.submit(svc("api", 2));
    sim.start_all_placed(&["web", "api"]);
    sim
}

#[test]
fn a_drain_replaces_every_replica_elsewhere_before_it_leaves_and_the_host_takes_none_until_uncordoned(
) {
    let mut sim = three_hosts_two_services();
    let hosts = host_names(3);
    let names = ["web", "api"];
    let on_02 = sim.on_host("exec-02");
    assert!(on_02 > 0, "the fixture puts replicas on exec-02");
    sim.maintain("exec-02", HostAction::Drain);
    let mut rounds = 0;
    while sim.on_host("exec-02") > 0 {
        rounds += 1;
        assert!(
            rounds < 20,
            "the drain never finished: {:?}",
            sim.live("web")
        );
        // No replica is placed on the draining host, and no service drops below its
        // replicas (max_unavailable = 0) at any step.
        for (n, replicas) in [("web", 3), ("api", 2)] {
            assert!(sim.ready_count(n) >= replicas, "{n}: {:?}", sim.live(n));
            let placed_there = sim
                .live(n)
                .iter()
                .any(|j| j.1 == "exec-02" && j.2 == JobState::Placed);
            assert!(!placed_there, "{n}: placed on the draining host");
        }
        sim.start_all_placed(&names);
        sim.run_for(2, &["exec-01", "exec-02", "exec-03"]);
        sim.exit_stopping(&names);
    }
    for (n, replicas) in [("web", 3usize), ("api", 2)] {
        assert_eq!(sim.ready_count(n), replicas, "{n}");
    }
    let v = sim.core.view().borrow().clone();
    let h = v.hosts.iter().find(|h| h.info.id == "exec-02").unwrap();
    let m = h.maintenance.as_ref().expect("still under maintenance");
    assert!(m.drains() && h.left.is_empty() && h.jobs == 0);
    // Drained: a scale-up places nothing there.
    let r = sim
        .core
        .scale(&ServiceKey::new("default", "web"), 6, &admin(), sim.now);
    sim.settle("scale web 6", r);
    assert!(sim.live("web").iter().all(|j| j.1 != "exec-02"));
    assert_eq!(sim.live("web").len(), 6);
    // Uncordoned: the next placements may go there again.
    sim.maintain("exec-02", HostAction::Uncordon);
    let r = sim
        .core
        .scale(&ServiceKey::new("default", "web"), 9, &admin(), sim.now);
    sim.settle("scale web 9", r);
    let there = sim.live("web").iter().filter(|j| j.1 == "exec-02").count();
    assert_eq!(there, 3, "the uncordoned host takes its share: {hosts:?}");
}

#[test]
fn a_cordon_stops_new_placements_but_moves_nothing() {
    let mut sim = three_hosts_two_services();
    let before = sim.live("web");
    sim.maintain("exec-01", HostAction::Cordon);
    assert_eq!(sim.live("web"), before, "a cordon moves nothing");
    let r = sim
        .core
        .scale(&ServiceKey::new("default", "web"), 5, &admin(), sim.now);
    sim.settle("scale web 5", r);
    let new: Vec<_> = sim
        .live("web")
        .into_iter()
        .filter(|j| !before.contains(j))
        .collect();
    assert_eq!(new.len(), 2);
    assert!(new.iter().all(|j| j.1 != "exec-01"), "{new:?}");
    // A cordon asked of a drained host keeps the drain.
    sim.maintain("exec-02", HostAction::Drain);
    sim.maintain("exec-02", HostAction::Cordon);
    let v = sim.core.view().borrow().clone();
    let h = v.hosts.iter().find(|h| h.info.id == "exec-02").unwrap();
    assert!(h.maintenance.as_ref().unwrap().drains());
}

#[test]
fn a_drain_goes_on_after_a_controller_restart() {
    let mut sim = three_hosts_two_services();
    sim.maintain("exec-03", HostAction::Drain);
    let mut sim = sim.restart(1);
    let v = sim.core.view().borrow().clone();
    let h = v.hosts.iter().find(|h| h.info.id == "exec-03").unwrap();
    let m = h.maintenance.clone().expect("persisted");
    assert_eq!((m.by.as_str(), m.drains()), ("admin", true));
    for _ in 0..20 {
        if sim.on_host("exec-03") == 0 {
            break;
        }
        sim.start_all_placed(&["web", "api"]);
        sim.run_for(2, &["exec-01", "exec-02", "exec-03"]);
        sim.exit_stopping(&["web", "api"]);
    }
    assert_eq!(sim.on_host("exec-03"), 0);
    assert_eq!(sim.ready_count("web") + sim.ready_count("api"), 5);
}

#[test]
fn a_leaving_worker_drains_its_host_and_takes_it_back_when_it_registers_again() {
    let mut sim = three_hosts_two_services();
    let host = "exec-01".to_owned();
    let first = sim
        .core
        .worker_leaves(&host, &worker(&host), sim.now)
        .unwrap();
    sim.settle("leave exec-01", Ok(()));
    assert!(first.left > 0);
    // Another host's credential cannot make it leave.
    let err = sim
        .core
        .worker_leaves(&host, &duplicate(), sim.now)
        .unwrap_err();
    assert!(matches!(err, core::CoreError::HostTaken { .. }), "{err}");
    for _ in 0..20 {
        if sim
            .core
            .worker_leaves(&host, &worker(&host), sim.now)
            .unwrap()
            .left
            == 0
        {
            break;
        }
        sim.start_all_placed(&["web", "api"]);
        sim.run_for(2, &["exec-01", "exec-02", "exec-03"]);
        sim.exit_stopping(&["web", "api"]);
    }
    assert_eq!(sim.on_host("exec-01"), 0, "the leave drained the host");
    assert_eq!(sim.ready_count("web") + sim.ready_count("api"), 5);
    // The worker comes back (a reboot): the host is in service again.
    sim.register("exec-01", 10, &[]);
    let v = sim.core.view().borrow().clone();
    let h = v.hosts.iter().find(|h| h.info.id == "exec-01").unwrap();
    assert_eq!(
        h.maintenance, None,
        "a leave's drain ends when its worker returns"
    );
    // An operator's cordon is kept across a worker's return (until uncordon).
    sim.maintain("exec-01", HostAction::Cordon);
    sim.register("exec-01", 10, &[]);
    let v = sim.core.view().borrow().clone();
    let h = v.hosts.iter().find(|h| h.info.id == "exec-01").unwrap();
    assert!(h.maintenance.is_some(), "an operator's cordon stays");
}

/// Finding 9: restarts of 3 replicas on 3 hosts left 2 on one host and 0 on another,
/// because the replicas draining away counted toward their hosts.
#[test]
fn restarts_of_three_replicas_on_three_hosts_leave_one_per_host() {
    let mut sim = Sim::new();
    sim.register_all(&host_names(3), 10);
    sim.submit(svc("web", 3));
    sim.start_all_placed(&["web"]);
    for round in 0..2 {
        let r = sim
            .core
            .restart(&ServiceKey::new("default", "web"), &admin(), sim.now);
        sim.settle(&format!("restart {round}"), r);
        for _ in 0..20 {
            let done =
                sim.rollout("web").contains("rollout=complete") && sim.live("web").len() == 3;
            if done {
                break;
            }
            sim.start_all_placed(&["web"]);
            sim.run_for(2, &["exec-01", "exec-02", "exec-03"]);
            sim.exit_stopping(&["web"]);
        }
        // After each restart: one replica per host (the old code left 2 on exec-01
        // after the first, none on exec-03).
        let mut per_host: BTreeMap<String, usize> = BTreeMap::new();
        for (_, host, _, _) in sim.live("web") {
            *per_host.entry(host).or_default() += 1;
        }
        assert_eq!(
            per_host.values().copied().collect::<Vec<_>>(),
            [1, 1, 1],
            "after restart {round}: {per_host:?}"
        );
    }
}

/// The routes: admin only for users, the host's own worker for its leave; the answer is
/// the host as `GET /v1/hosts` lists it (`since` masked: it is the wall clock).
#[tokio::test]
async fn maintenance_routes_are_admin_only_and_answer_with_the_host() {
    let app = app().await;
    app.register("exec-01", W1, 2).await;
    app.register("exec-02", W2, 2).await;
    let calls: &[(&str, &str, &str)] = &[
        ("POST", "/v1/hosts/exec-01/cordon", OPS),
        ("POST", "/v1/hosts/exec-01/drain", ALICE),
        ("POST", "/v1/hosts/exec-09/drain", ADMIN),
        ("POST", "/v1/hosts/exec-01/cordon", ADMIN),
        ("POST", "/v1/hosts/exec-01/drain", ADMIN),
        ("POST", "/internal/v1/hosts/exec-01/leave", W2),
        ("POST", "/internal/v1/hosts/exec-01/leave", ADMIN),
        ("POST", "/internal/v1/hosts/exec-02/leave", W2),
        ("POST", "/v1/hosts/exec-01/uncordon", ADMIN),
    ];
    let mut out = Vec::new();
    for (m, p, who) in calls {
        let (s, b) = app.call(m, p, Some(who), None).await;
        let mut v: Value = serde_json::from_str(&b).unwrap_or(Value::String(b));
        if let Some(since) = v.pointer_mut("/maintenance/since") {
            *since = json!("…");
        }
        // The addresses and plugin summaries are `GET /v1/hosts`' own test's.
        let what = match v.get("maintenance") {
            Some(m) => format!("{} maintenance={m}", v["id"]),
            None => v.to_string(),
        };
        out.push(format!("{m} {p} -> {} {what}", s.as_u16()));
    }
    let (_, mut hosts) = app.get("/v1/hosts", OPS).await;
    let m = &mut hosts["hosts"][1]["maintenance"];
    m["since"] = json!("…");
    out.push(format!("exec-02 in the list: {m}"));
    expect![[r#"
        POST /v1/hosts/exec-01/cordon -> 403 {"error":{"code":"forbidden","details":[],"message":"POST /v1/hosts/{id}/cordon moves every project's replicas: it needs the admin permission on \"*\", which \"ops\" does not hold"}}
        POST /v1/hosts/exec-01/drain -> 403 {"error":{"code":"forbidden","details":[],"message":"POST /v1/hosts/{id}/drain moves every project's replicas: it needs the admin permission on \"*\", which \"alice\" does not hold"}}
        POST /v1/hosts/exec-09/drain -> 404 {"error":{"code":"not_found","details":[],"message":"host \"exec-09\" is not registered"}}
        POST /v1/hosts/exec-01/cordon -> 200 "exec-01" maintenance={"by":"admin","leave":false,"left":0,"services":[],"since":"…","state":"cordoned"}
        POST /v1/hosts/exec-01/drain -> 200 "exec-01" maintenance={"by":"admin","leave":false,"left":0,"services":[],"since":"…","state":"drained"}
        POST /internal/v1/hosts/exec-01/leave -> 403 {"error":{"code":"forbidden","details":[],"message":"a worker may act for its own host only: this credential is host \"exec-02\"'s, not host \"exec-01\"'s"}}
        POST /internal/v1/hosts/exec-01/leave -> 403 {"error":{"code":"forbidden","details":[],"message":"the worker api needs a worker credential (a [[worker]] secret), not a user token"}}
        POST /internal/v1/hosts/exec-02/leave -> 200 {"left":0}
        POST /v1/hosts/exec-01/uncordon -> 200 "exec-01" maintenance=null
        exec-02 in the list: {"by":"worker:exec-02","leave":true,"left":0,"services":[],"since":"…","state":"drained"}"#]]
    .assert_eq(&out.join("\n"));
    let (_, metrics) = app.call("GET", "/metrics", Some(OPS), None).await;
    for want in [
        "xce_hosts_maintenance{state=\"drained\"} 1",
        "xce_hosts_maintenance{state=\"cordoned\"} 0",
    ] {
        assert!(metrics.contains(want), "{want} in\n{metrics}");
    }
    app.ctl.shutdown().await;
}
