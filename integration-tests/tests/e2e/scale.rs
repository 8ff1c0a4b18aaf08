//! Scale out on etcd (issue #8): a 3-member etcd on loopback, two controllers (one
//! leads, one waits), two `xced apiserver`s serving the endpoint table from their own etcd
//! watch and forwarding everything else to the leader, two workers that talk to the
//! leader through the apiservers. The active controller is killed with SIGKILL in the
//! middle of a rolling replacement of the replicas, then one etcd member.

use crate::daemons::*;
use crate::harness::*;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const REPLICAS: usize = 4;

/// The cluster has settled on `REPLICAS` ready replicas, none of them a job in `gone`:
/// the leader lists them running and ready, and the endpoints answer is the same byte
/// for byte on both apiservers and on the leader's own listener.
async fn converged(s: &Fleet, leader: usize, gone: &BTreeSet<String>) -> Result<Option<Snap>> {
    let svc = s.apiserver(0).get_json("/v1/services/web").await?;
    let jobs = jobs(&svc)?;
    if jobs.len() != REPLICAS
        || jobs.values().any(|j| !j.ready || j.state != "running")
        || jobs.keys().any(|j| gone.contains(j))
    {
        bail!(
            "not settled: jobs {jobs:?}, pending {}, gone {gone:?}",
            svc["pending"]
        );
    }
    let mut answers = Vec::new();
    for api in [s.apiserver(0), s.apiserver(1), s.controller_api(leader)] {
        let (status, headers, body) = api.get("/v1/services/web/endpoints").await?;
        if status != 200 {
            bail!("{}: HTTP {status}: {body}", api.base);
        }
        let index = headers
            .get("x-xce-index")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .with_context(|| format!("{}: no X-Xce-Index", api.base))?;
        answers.push((api.base, index, body));
    }
    let (_, index, body) = answers[0].clone();
    if answers.iter().any(|(_, i, b)| *i != index || *b != body) {
        return Err(anyhow!("the endpoint answers differ: {answers:#?}"));
    }
    let entry: Value = serde_json::from_str(&body)?;
    if entry["index"].as_u64() != Some(index) {
        bail!("body index differs from X-Xce-Index {index}: {body}");
    }
    let eps = entry_endpoints(&entry);
    let ep_jobs: BTreeSet<String> = eps.iter().map(|(_, j, _)| j.clone()).collect();
    if eps.len() != REPLICAS || ep_jobs != jobs.keys().cloned().collect() {
        bail!("endpoints {eps:?} are not those of the jobs {jobs:?}");
    }
    Ok(Some(Snap {
        jobs,
        addrs: eps.into_iter().map(|(_, j, a)| (j, a)).collect(),
        index,
    }))
}

/// One settled state of the service.
#[derive(Debug, Clone)]
struct Snap {
    /// job → where it runs.
    jobs: BTreeMap<String, Job>,
    /// job → `address:port` of its `http` endpoint.
    addrs: BTreeMap<String, String>,
    index: u64,
}

#[derive(Debug, Clone, PartialEq)]
struct Job {
    host: String,
    port: u64,
    state: String,
    ready: bool,
}

/// The jobs of a service's `GET /v1/services/{name}` answer.
fn jobs(svc: &Value) -> Result<BTreeMap<String, Job>> {
    svc["jobs"]
        .as_array()
        .context("jobs")?
        .iter()
        .map(|j| {
            Ok((
                j["job"].as_str().context("job")?.to_owned(),
                Job {
                    host: j["host"].as_str().context("host")?.to_owned(),
                    port: j["ports"]["http"].as_u64().unwrap_or(0),
                    state: j["state"].as_str().unwrap_or("").to_owned(),
                    ready: j["ready"] == true,
                },
            ))
        })
        .collect()
}

/// Every (host, port) and `address:port` a job was ever seen with: a job seen at another
/// place later counts as a reassigned port, as does a place two live jobs share.
#[derive(Default)]
struct Places {
    seen: BTreeMap<String, ((String, u64), String)>,
    reassigned: BTreeSet<String>,
    shared: usize,
}

impl Places {
    fn note(&mut self, snap: &Snap) {
        let mut taken = BTreeSet::new();
        for (job, j) in &snap.jobs {
            let place = (
                (j.host.clone(), j.port),
                snap.addrs.get(job).cloned().unwrap_or_default(),
            );
            if !taken.insert(place.0.clone()) {
                self.shared += 1;
            }
            match self.seen.get(job) {
                Some(before) if *before != place => {
                    self.reassigned.insert(job.clone());
                }
                Some(_) => {}
                None => {
                    self.seen.insert(job.clone(), place);
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_and_two_apiservers_on_a_3_member_etcd_survive_losing_the_leader_and_an_etcd_member(
) {
    let etcd = EtcdCluster::start(3).await.expect("etcd");
    let mut s = Fleet::new(etcd, 2, 2).expect("cluster dir");

    // Controller 0 leads; controller 1 waits as a standby.
    s.start_controller(0).unwrap();
    eventually("controller 0 announces its listener", || async {
        Ok(s.announced_at(0).map(|_| ()))
    })
    .await;
    s.start_controller(1).unwrap();
    let standby_log = s.log("controller-1");
    let leader0 = format!("@127.0.0.1:{})", s.controller_ports[0]);
    eventually("controller 1 waits as a standby", || async {
        let text = std::fs::read_to_string(&standby_log).unwrap_or_default();
        Ok(
            (text.contains("standby: waiting for leadership (leader: ") && text.contains(&leader0))
                .then_some(()),
        )
    })
    .await;

    // Two apiservers on the same etcd; the workers reach the leader through them.
    for a in 0..2 {
        s.start_apiserver(a).unwrap();
    }
    for a in 0..2 {
        eventually(&format!("apiserver {a} announces its listener"), || async {
            Ok(s.apiservers[a]
                .as_ref()
                .and_then(Daemon::announced_at)
                .map(|_| ()))
        })
        .await;
    }
    s.start_workers(2).unwrap();
    let a1 = s.apiserver(0);
    let a2 = s.apiserver(1);
    eventually("2 ready hosts (through apiserver 2)", || async {
        let h = a2.get_json("/v1/hosts").await?;
        let ready = h["hosts"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|h| h["state"] == "ready").count());
        Ok((ready == 2).then_some(()))
    })
    .await;

    // `web` through apiserver 1; both apiservers serve its 4 endpoints.
    let web = http_service("web", REPLICAS as u32)
        .interval("500ms")
        .toml();
    let (status, body) = a1.submit_toml(&web).await.unwrap();
    assert_eq!(status, 201, "submit through apiserver 1: {body}");
    let none = BTreeSet::new();
    let first = eventually("4 ready endpoints, the same on every listener", || async {
        converged(&s, 0, &none).await
    })
    .await;
    for a in [&a1, &a2] {
        assert_eq!(a.plain("web").await.unwrap().len(), REPLICAS);
    }
    // The first rollout completes (every replica ready for `min_ready`) before replicas
    // are killed: a kill inside it would count as an exit of the rollout, and its later
    // completion would be one more change for the blocking query below to answer.
    a1.wait_settled("web", REPLICAS).await;
    let mut places = Places::default();
    places.note(&first);
    let originals: Vec<String> = first.jobs.keys().cloned().collect();

    // Rolling replacement: the original replicas die one at a time, each replaced before
    // the next dies. Right after the second one dies, the active controller gets kill -9.
    let mut gone = BTreeSet::new();
    let mut snap = first.clone();
    let mut replacement_ms = Vec::new();
    let mut announce = Duration::ZERO;
    for (n, victim) in originals.iter().enumerate() {
        let addr = snap.addrs[victim].clone();
        kill_replica_listening_on(&addr).unwrap();
        let mut from = Instant::now();
        gone.insert(victim.clone());
        if n == 1 {
            s.kill_9_controller(0);
            from = Instant::now();
            eventually("controller 1 takes over", || async {
                Ok(s.announced_at(1).map(|_| ()))
            })
            .await;
            announce = s.announced_at(1).unwrap().duration_since(from);
        }
        let leader = usize::from(n > 0);
        snap = eventually(&format!("replica {n} ({addr}) replaced"), || async {
            converged(&s, leader, &gone).await
        })
        .await;
        replacement_ms.push(from.elapsed().as_millis());
        places.note(&snap);
    }
    let converged_after_kill_ms = replacement_ms[1];
    assert_eq!(
        places.reassigned,
        BTreeSet::new(),
        "jobs that moved to another host or port"
    );
    assert_eq!(places.shared, 0, "live jobs sharing a (host, port)");
    assert!(
        snap.jobs.keys().all(|j| !originals.contains(j)),
        "every original replica replaced: {snap:?}"
    );
    for addr in snap.addrs.values() {
        assert!(http_ok(addr).await.unwrap(), "{addr} answers HTTP");
    }
    assert!(
        s.controllers[1]
            .as_mut()
            .is_some_and(|d| matches!(d.child.try_wait(), Ok(None))),
        "the new leader runs"
    );

    // An operator brings the killed controller back: it waits as a standby, so that the
    // cluster survives losing its leader again.
    s.start_controller(0).unwrap();
    let log0 = s.log("controller-0");
    eventually("controller 0 is back as a standby", || async {
        let text = std::fs::read_to_string(&log0).unwrap_or_default();
        Ok(text
            .contains("standby: waiting for leadership")
            .then_some(()))
    })
    .await;

    // One etcd member dies: the first endpoint every daemon tries, made the raft leader
    // first (the worst case: an election and a client failover at once). A blocking query on
    // apiserver 2, opened before, answers the change that a replica killed next makes.
    let etcd_member = 0;
    s.etcd.as_ref().unwrap().make_leader(etcd_member).await;
    let blocking = {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(45))
            .build()
            .unwrap();
        let url = format!(
            "{}/v1/services/web/endpoints?index={}&wait=30s",
            a2.base, snap.index
        );
        tokio::spawn(async move {
            let r = http.get(url).bearer_auth(ADMIN).send().await?;
            let status = r.status().as_u16();
            let body = r.text().await?;
            Ok::<_, anyhow::Error>((status, body, Instant::now()))
        })
    };
    s.etcd.as_mut().unwrap().kill_9(etcd_member);
    let member_killed = Instant::now();
    let victim = snap.jobs.keys().next().unwrap().clone();
    let addr = snap.addrs[&victim].clone();
    kill_replica_listening_on(&addr).unwrap();
    gone.insert(victim.clone());
    let (status, body, answered) = blocking.await.unwrap().unwrap();
    assert_eq!(status, 200, "blocking query on apiserver 2: {body}");
    let changed: Value = serde_json::from_str(&body).unwrap();
    assert!(
        changed["index"].as_u64().unwrap_or(0) > snap.index,
        "the blocking query answered without a change: {body}"
    );
    assert!(
        !entry_endpoints(&changed)
            .iter()
            .any(|(_, j, _)| *j == victim),
        "the change the blocking query answered still lists the killed replica: {body}"
    );
    let blocking_ms = answered.duration_since(member_killed).as_millis();
    // The leader may have stopped itself meanwhile: its lease renewals cannot get through
    // while etcd elects a new raft leader, and a leader that cannot be sure of its lease
    // stops (fail-stop). Then the standby takes over; either way the service goes on.
    let after = eventually(
        "the replica killed after the etcd member replaced",
        || async { converged(&s, s.serving_controller()?, &gone).await },
    )
    .await;
    let leader_after = s.serving_controller().unwrap();
    let member_loss_recovery_ms = member_killed.elapsed().as_millis();
    places.note(&after);
    let jobs_total = places.seen.len();
    assert_eq!(
        places.reassigned,
        BTreeSet::new(),
        "jobs that moved to another host or port"
    );
    assert_eq!(places.shared, 0, "live jobs sharing a (host, port)");
    for addr in after.addrs.values() {
        assert!(http_ok(addr).await.unwrap(), "{addr} answers HTTP");
    }

    // A client given both apiservers keeps working when the first one is gone.
    s.kill_9_apiserver(0);
    let client_config = s.dir.path().join("xcecli.toml");
    std::fs::write(
        &client_config,
        format!("api = \"{},{}\"\ntoken = \"{ADMIN}\"\n", a1.base, a2.base),
    )
    .unwrap();
    let out = xcecli_with(
        &client_config,
        &["service", "endpoints", "web", "-o", "plain"],
        &[],
    );
    assert!(out.status.success(), "xcecli --api A1,A2: {}", stderr(&out));
    let mut lines: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    lines.sort();
    let mut want: Vec<String> = after.addrs.values().cloned().collect();
    want.sort();
    assert_eq!(lines, want, "xcecli through the second apiserver");

    println!(
        "FIGURE scale-out takeover after kill -9 of the active controller mid rolling replacement: standby announced after {} ms, endpoints converged on 2 apiservers + leader after {converged_after_kill_ms} ms (leader_ttl {LEADER_TTL}), jobs={jobs_total} ports_reassigned={} shared_places={}",
        announce.as_millis(),
        places.reassigned.len(),
        places.shared,
    );
    println!(
        "FIGURE scale-out replacement times (ms, kill to identical answers everywhere; #2 spans the takeover): {replacement_ms:?}"
    );
    println!(
        "FIGURE etcd member loss (kill -9 of 1 of 3 members, the raft leader; a replica killed at once): blocking query on apiserver 2 answered after {blocking_ms} ms, recovered (replacement ready, identical answers) after {member_loss_recovery_ms} ms, leader_changed={}",
        leader_after != 1
    );
}
