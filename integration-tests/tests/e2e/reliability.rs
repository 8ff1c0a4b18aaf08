//! Issue 7, faults: controller kill -9 at random moments with many replicas on separate
//! worker processes (scenario 1), ports held by a stopping replica until it has exited
//! (scenario 4), ports held outside xce (scenario 5), and no leaked port after each (6).

use crate::harness::*;
use anyhow::{Context, Result};
use futures_util::StreamExt;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn index_of(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    headers.get("x-xce-index")?.to_str().ok()?.parse().ok()
}

/// A job as the service detail shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Job {
    service: String,
    host: String,
    state: String,
    ports: Vec<u64>,
}

/// Every job of every service the token sees, by job id.
async fn all_jobs(api: &Api) -> Result<BTreeMap<String, Job>> {
    let list = api.get_json("/v1/services").await?;
    let mut out = BTreeMap::new();
    for s in list["services"].as_array().context("services")? {
        let name = s["name"].as_str().context("name")?;
        let (status, _, body) = api.get(&format!("/v1/services/{name}")).await?;
        if status == 404 {
            continue; // stopped between the two calls
        }
        let svc: Value = serde_json::from_str(&body)?;
        for j in svc["jobs"].as_array().context("jobs")? {
            let ports = j["ports"]
                .as_object()
                .map(|m| m.values().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            out.insert(
                j["job"].as_str().context("job")?.to_owned(),
                Job {
                    service: name.to_owned(),
                    host: j["host"].as_str().unwrap_or("").to_owned(),
                    state: j["state"].as_str().unwrap_or("").to_owned(),
                    ports,
                },
            );
        }
    }
    Ok(out)
}

/// (host, port) pairs held by two jobs at once.
fn collisions(jobs: &BTreeMap<String, Job>) -> Vec<String> {
    let mut seen: BTreeMap<(String, u64), String> = BTreeMap::new();
    let mut out = Vec::new();
    for (id, j) in jobs {
        for &p in &j.ports {
            if let Some(other) = seen.insert((j.host.clone(), p), id.clone()) {
                out.push(format!("{}:{p} held by {other} and {id}", j.host));
            }
        }
    }
    out
}

fn web(name: &str, replicas: u32) -> String {
    http_service(name, replicas).interval("500ms").toml()
}

#[derive(Default, Debug)]
struct PollStats {
    polls: u64,
    full: u64,
    unavailable: u64,
    refused: u64,
    partial: Vec<String>,
    regressions: Vec<String>,
    max_index: u64,
}

/// Scenario 1: 20 kill -9 of the controller at random moments (some right after a submit
/// or a stop), 30 replicas on 3 separate worker processes, a poller and a blocking watcher
/// reading the table throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_kill_9_twenty_times_under_30_replicas() {
    const REPLICAS: usize = 30;
    const CYCLES: usize = 20;
    let mut c = Cluster::new(3, "30s").expect("cluster");
    let api = c.api.clone();
    assert_eq!(
        api.submit_toml(&web("web", REPLICAS as u32))
            .await
            .unwrap()
            .0,
        201
    );
    let mut want = api.wait_ready("web", REPLICAS).await;
    want.sort();
    let web_jobs: BTreeMap<String, Job> = all_jobs(&api)
        .await
        .unwrap()
        .into_iter()
        .filter(|(_, j)| j.service == "web")
        .collect();
    assert_eq!(web_jobs.len(), REPLICAS);
    let hosts_before: BTreeSet<String> = ports_used(&api).await.unwrap().into_keys().collect();
    assert_eq!(hosts_before.len(), 3);

    // Readers that run through every restart: a poller (every answer 200 must be the whole
    // table) and a blocking watcher (the index never goes back).
    let stats = Arc::new(Mutex::new(PollStats::default()));
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (api, stats, done, want) = (api.clone(), stats.clone(), done.clone(), want.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                let r = api.get("/v1/services/web/endpoints?format=plain").await;
                {
                    let mut s = stats.lock().unwrap();
                    s.polls += 1;
                    match r {
                        Err(_) => s.refused += 1,
                        Ok((503, _, _)) => s.unavailable += 1,
                        Ok((200, h, body)) => {
                            let mut got: Vec<String> = body.lines().map(str::to_owned).collect();
                            got.sort();
                            if got == want {
                                s.full += 1;
                            } else {
                                s.partial.push(format!(
                                    "{} of {} endpoints",
                                    got.len(),
                                    want.len()
                                ));
                            }
                            let i = index_of(&h).unwrap_or(0);
                            if i < s.max_index {
                                let m = s.max_index;
                                s.regressions.push(format!("poll: {m} → {i}"));
                            }
                            s.max_index = s.max_index.max(i);
                        }
                        Ok((st, _, body)) => s.partial.push(format!("HTTP {st}: {body}")),
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let watcher = {
        let (api, done) = (api.clone(), done.clone());
        tokio::spawn(async move {
            let mut index = 0u64;
            let mut answers = 0u64;
            let mut regressions = Vec::new();
            while !done.load(Ordering::Relaxed) {
                match api
                    .get(&format!(
                        "/v1/services/web/endpoints?index={index}&wait=300ms"
                    ))
                    .await
                {
                    Ok((200, h, _)) => {
                        answers += 1;
                        let i = index_of(&h).unwrap_or(0);
                        if i < index {
                            regressions.push(format!("watch: {index} → {i}"));
                        }
                        index = index.max(i);
                    }
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            (answers, regressions)
        })
    };

    let mut rng = testkit::seeded_rng("reliability");
    let mut live_side: BTreeSet<String> = BTreeSet::new();
    let mut stopped_side: BTreeSet<String> = BTreeSet::new();
    let (mut services_lost, mut jobs_lost, mut hosts_lost, mut reassigned) =
        (0usize, 0usize, 0usize, 0usize);
    let mut first_answer_partial = 0usize;
    let mut first_event_partial = 0usize;
    let mut replicas_killed = 0usize;
    let mut to_full_table = Vec::new();
    for cycle in 0..CYCLES {
        // Something in flight when the kill lands, some of the time.
        match rng.u64(0..4) {
            1 => {
                let name = format!("side-{cycle}");
                assert_eq!(
                    api.submit_toml(&web(&name, 1)).await.unwrap().0,
                    201,
                    "cycle {cycle}"
                );
                live_side.insert(name);
            }
            2 => {
                if let Some(name) = live_side.pop_first() {
                    assert_eq!(
                        api.delete(&format!("/v1/services/{name}")).await.unwrap(),
                        202,
                        "cycle {cycle}"
                    );
                    stopped_side.insert(name);
                }
            }
            3 => {
                // A replica dies: its exit report races the kill.
                if let Some(name) = live_side.iter().next() {
                    let eps = api.wait_ready(name, 1).await;
                    kill_replica_listening_on(&eps[0]).expect("the side replica");
                    replicas_killed += 1;
                }
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(0..700))).await; // the random moment
        let killed = Instant::now();
        c.kill_controller();
        c.start_controller().expect("controller restart");

        // The first answer after the restart is the whole table.
        let (status, _, body) = api
            .get("/v1/services/web/endpoints?format=plain")
            .await
            .unwrap();
        to_full_table.push(killed.elapsed());
        let mut got: Vec<String> = body.lines().map(str::to_owned).collect();
        got.sort();
        if status != 200 || got != want {
            first_answer_partial += 1;
            eprintln!(
                "cycle {cycle}: first answer HTTP {status}: {} of {} endpoints",
                got.len(),
                want.len()
            );
        }
        // So is the first event of a stream opened right after it.
        let mut stream = sse_open(&api, "/v1/services/web/endpoints/stream", None)
            .await
            .unwrap()
            .bytes_stream();
        let mut parser = SseParser::default();
        let first = loop {
            let chunk = stream.next().await.expect("a first event").unwrap();
            if let Some(e) = parser.push(&chunk).into_iter().next() {
                break e;
            }
        };
        drop(stream);
        let entry: Value = serde_json::from_str(&first.1).unwrap();
        let mut streamed: Vec<String> = entry_endpoints(&entry).into_iter().map(|e| e.2).collect();
        streamed.sort();
        if streamed != want {
            first_event_partial += 1;
            eprintln!(
                "cycle {cycle}: first stream event: {} of {} endpoints",
                streamed.len(),
                want.len()
            );
        }

        let jobs = all_jobs(&api).await.unwrap();
        let clash = collisions(&jobs);
        reassigned += clash.len();
        assert!(clash.is_empty(), "cycle {cycle}: {clash:?}");
        for (id, j) in &web_jobs {
            if jobs.get(id) != Some(j) {
                jobs_lost += 1;
                eprintln!(
                    "cycle {cycle}: web job {id} was {j:?}, now {:?}",
                    jobs.get(id)
                );
            }
        }
        for name in &live_side {
            let (st, _, _) = api.get(&format!("/v1/services/{name}")).await.unwrap();
            if st != 200 {
                services_lost += 1;
                eprintln!("cycle {cycle}: acknowledged service {name} answers {st}");
            }
        }
        let hosts: BTreeSet<String> = ports_used(&api).await.unwrap().into_keys().collect();
        hosts_lost += hosts_before.difference(&hosts).count();
    }
    // Every acknowledged stop completes; every acknowledged submit becomes ready.
    for name in &stopped_side {
        eventually(&format!("{name} stopped"), || async {
            Ok((api.get(&format!("/v1/services/{name}")).await?.0 == 404).then_some(()))
        })
        .await;
    }
    for name in &live_side {
        api.wait_ready(name, 1).await;
    }
    let final_jobs = all_jobs(&api).await.unwrap();
    assert!(
        collisions(&final_jobs).is_empty(),
        "{:?}",
        collisions(&final_jobs)
    );
    for ep in &want {
        assert!(http_ok(ep).await.unwrap(), "{ep} still serves");
    }
    done.store(true, Ordering::Relaxed);
    poller.await.unwrap();
    let (watch_answers, watch_regressions) = watcher.await.unwrap();
    let s = std::mem::take(&mut *stats.lock().unwrap());
    assert!(
        s.partial.is_empty(),
        "served a partial table: {:?}",
        s.partial
    );
    assert!(
        s.regressions.is_empty() && watch_regressions.is_empty(),
        "{:?} {watch_regressions:?}",
        s.regressions
    );
    assert_eq!(
        (first_answer_partial, first_event_partial),
        (0, 0),
        "first answers or stream events after a restart were partial"
    );
    assert_eq!(
        (services_lost, jobs_lost, hosts_lost, reassigned),
        (0, 0, 0, 0)
    );
    let (polls, full, unavailable, refused) = (s.polls, s.full, s.unavailable, s.refused);
    let controller_rss = c.controller_pid().map_or(0, rss_kib);
    to_full_table.sort();
    let leaked = stop_all_and_count_leaks(&api).await;
    println!(
        "FIGURE scenario 1 controller kill -9: cycles={CYCLES} replicas={REPLICAS} workers=3 side_services={} side_replicas_killed={replicas_killed} ports_reassigned={reassigned} services_lost={services_lost} jobs_lost={jobs_lost} hosts_lost={hosts_lost} index_regressions=0 partial_or_empty_tables=0 first_answers_and_stream_events_after_restart=whole polls={polls} (full={full} 503={unavailable} refused_while_down={refused}) blocking_answers={watch_answers} kill_to_full_table_p50={:?} max={:?} controller_rss_kib={controller_rss} leaked_ports={leaked}",
        live_side.len() + stopped_side.len(),
        pct(&to_full_table, 50),
        pct(&to_full_table, 100),
    );
}

/// Scenario 4: a replica that drains for 3 s after SIGTERM keeps its port until it has
/// exited; with a 2-port range, a service submitted right after the stop must wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_replica_keeps_its_port_until_it_has_exited() {
    let rd = ReplicaDir::new();
    let c =
        DevCluster::start_with(1, false, &["--port-range", "30200-30201"]).expect("dev cluster");
    let api = &c.api;
    assert_eq!(
        api.submit_toml(&(rd.profile("draining", 2, "3", "200ms", 0) + UNDER_LOAD_TIMEOUT))
            .await
            .unwrap()
            .0,
        201
    );
    api.wait_ready("draining", 2).await;
    let old = all_jobs(api).await.unwrap();
    assert_eq!(old.len(), 2);

    assert_eq!(api.delete("/v1/services/draining").await.unwrap(), 202);
    let stop_at = monotonic_ns();
    assert_eq!(
        api.submit_toml(&(rd.profile("newcomer", 1, "0", "200ms", 0) + UNDER_LOAD_TIMEOUT))
            .await
            .unwrap()
            .0,
        201
    );

    // While the old processes drain, the newcomer pends with a reason (the range is full).
    let svc = eventually("newcomer scheduled or pending", || async {
        let svc = api.get_json("/v1/services/newcomer").await?;
        let decided = svc["pending"].as_array().is_some_and(|p| !p.is_empty())
            || svc["jobs"].as_array().is_some_and(|j| !j.is_empty());
        Ok(decided.then_some(svc))
    })
    .await;
    let pending_seen = svc["pending"].as_array().map_or(0, Vec::len);
    let old_alive_then = old
        .keys()
        .filter(|j| {
            replica_log(&rd.ctl, "draining", j)
                .iter()
                .all(|l| l.0 != "exit")
        })
        .count();

    let eps = api.wait_ready("newcomer", 1).await;
    let new_port: u64 = eps[0].rsplit_once(':').unwrap().1.parse().unwrap();
    let new = all_jobs(api).await.unwrap();
    let (new_job, _) = new.iter().find(|(_, j)| j.service == "newcomer").unwrap();
    let new_log = replica_log(&rd.ctl, "newcomer", new_job);
    let new_start = new_log
        .iter()
        .find(|l| l.0 == "start")
        .expect("newcomer start line")
        .1;

    // The old replica that held the newcomer's port exited (on its own, after draining)
    // before the newcomer started.
    let (old_job, _) = old
        .iter()
        .find(|(_, j)| j.ports.contains(&new_port))
        .expect("the port was an old one");
    let old_log = replica_log(&rd.ctl, "draining", old_job);
    let old_exit = old_log
        .iter()
        .find(|l| l.0 == "exit")
        .expect("old replica drained and exited")
        .1;
    let early_reuse = u64::from(new_start < old_exit);
    assert_eq!(
        early_reuse, 0,
        "newcomer started on {new_port} before {old_job} exited"
    );
    // No launch was refused by the worker's bind check: the scheduler itself waited.
    let refused = c.log().matches("launch refused").count();
    assert_eq!(refused, 0, "the worker had to refuse a launch: {}", c.log());
    assert!(
        old_alive_then > 0 && pending_seen == 1,
        "newcomer pended while {old_alive_then} old replicas drained: {svc}"
    );
    let leaked = stop_all_and_count_leaks(api).await;
    println!(
        "FIGURE scenario 4 stopping replica: range=2 ports, drain=3s, ports_reused_before_exit={early_reuse} launches_refused_by_bind_check={refused} newcomer_pending_while_draining=yes newcomer_started_after_stop={:?} (after old exit +{:?}) leaked_ports={leaked}",
        Duration::from_nanos(new_start - stop_at),
        Duration::from_nanos(new_start - old_exit),
    );
}

/// Scenario 5: ports of the range held by an outside process: no replica is started on
/// one, each is placed again until it lands on a free port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_held_outside_xce_never_get_a_replica() {
    let rd = ReplicaDir::new();
    let c =
        DevCluster::start_with(1, false, &["--port-range", "30300-30305"]).expect("dev cluster");
    let ip = c.host_ip(0);
    let held_ports = [30300u16, 30302, 30304];
    let _held: Vec<std::net::TcpListener> = held_ports
        .iter()
        .map(|&p| std::net::TcpListener::bind((ip, p)).expect("hold a port"))
        .collect();
    assert_eq!(
        c.api
            .submit_toml(&(rd.profile("squat", 3, "0", "200ms", 0) + UNDER_LOAD_TIMEOUT))
            .await
            .unwrap()
            .0,
        201
    );
    let eps = c.api.wait_ready("squat", 3).await;
    let mut got: Vec<u16> = eps
        .iter()
        .map(|e| e.rsplit_once(':').unwrap().1.parse().unwrap())
        .collect();
    got.sort();
    assert_eq!(got, [30301, 30303, 30305]);
    for ep in &eps {
        assert!(http_ok(ep).await.unwrap(), "{ep} answers");
    }
    // Every replica process that ever ran: none on a held port, none failed to bind.
    let mut starts_on_held = 0;
    let mut bind_failures = 0;
    let mut processes = 0;
    for entry in std::fs::read_dir(&rd.ctl).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(job) = name
            .strip_prefix("squat-")
            .and_then(|n| n.strip_suffix(".log"))
        else {
            continue;
        };
        processes += 1;
        let log = replica_log(&rd.ctl, "squat", job);
        match log.iter().find(|l| l.0 == "start") {
            Some(l) if held_ports.contains(&(l.2[0] as u16)) => starts_on_held += 1,
            Some(_) => {}
            None => bind_failures += 1,
        }
    }
    assert_eq!((starts_on_held, bind_failures), (0, 0));
    // The controller logs each refusal it acts on once (the worker logs it too).
    let refused = c
        .log()
        .matches("launch refused; placing the replica again")
        .count();
    let hosts = c.api.get_json("/v1/hosts").await.unwrap();
    let unavailable = hosts["hosts"][0]["ports"]["unavailable"]
        .as_u64()
        .unwrap_or(0);
    let leaked = stop_all_and_count_leaks(&c.api).await;
    println!(
        "FIGURE scenario 5 outside port holder: held=3 of 6 ports, replicas=3, replica_processes={processes} started_on_held_port={starts_on_held} bind_failures={bind_failures} launches_refused_and_replaced={refused} marked_unavailable={unavailable} leaked_ports={leaked}"
    );
}
