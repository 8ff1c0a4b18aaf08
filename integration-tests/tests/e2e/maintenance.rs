//! Issue 28, findings 6 and 9: host maintenance under load. Three services on three
//! hosts (a controller and three workers as separate processes), the stream-following
//! load client of the rollout test sending requests to all of them on fresh connections:
//!
//! 1. `xcecli host drain exec-02 --wait`: no failed request, every service stays at or
//!    above `replicas - max_unavailable` on its endpoint stream, the host ends with no
//!    replica and takes none (a scale-up) until `xcecli host uncordon exec-02`;
//! 2. spreading: two restarts of 3 replicas on 3 hosts leave one on each host;
//! 3. a planned reboot of exec-02 the old way (SIGTERM the worker, the reboot kills what
//!    ran there, the worker comes back): requests fail;
//! 4. the same reboot with `xced worker --leave`: the worker drains its host before it
//!    exits, nothing is left to kill, it comes back and takes placements again: no failed
//!    request.

use crate::harness::*;
use crate::rollout::{cli, report, Ep, Follower, Load, Shot, Web};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// (name, replicas, max_surge, max_unavailable): one rolls with a surge, one without
/// (a replica leaves first, within `max_unavailable`), one small.
const SERVICES: [(&str, usize, u32, u32); 3] =
    [("web", 3, 1, 0), ("api", 3, 0, 1), ("db", 2, 1, 0)];
/// The host that is drained and rebooted (worker index 1).
const HOST: &str = "exec-02";
const WORKER: usize = 1;

/// The profile of service `name`: the rollout test's web-v2 program, under another name
/// and update policy.
fn profile(web: &Web, name: &str, replicas: usize, surge: u32, unavailable: u32) -> String {
    let p =
        web.profile("v1", replicas)
            .replacen("name = \"web\"", &format!("name = \"{name}\""), 1);
    let policy = "max_surge = 1\nmax_unavailable = 0";
    assert!(
        p.contains(policy),
        "the rollout test's profile changed: {p}"
    );
    p.replacen(
        policy,
        &format!("max_surge = {surge}\nmax_unavailable = {unavailable}"),
        1,
    )
}

/// One follower per service, and one list of all their endpoints for the load client.
struct Followers {
    each: Vec<(&'static str, usize, Follower)>,
    all: watch::Receiver<Arc<Vec<Ep>>>,
    merge: tokio::task::JoinHandle<()>,
}

impl Followers {
    async fn start(api: &Api) -> Self {
        let mut each = Vec::new();
        for (name, replicas, _, _) in SERVICES {
            let f = Follower::start_for(api, name).await;
            f.wait_for(&format!("{replicas} ready {name}"), |l| l.len() == replicas)
                .await;
            each.push((name, replicas, f));
        }
        let lists: Vec<_> = each.iter().map(|(_, _, f)| f.list.clone()).collect();
        let (tx, all) = watch::channel(Arc::new(Vec::new()));
        let merge = tokio::spawn(merge(lists, tx));
        Self { each, all, merge }
    }

    /// Waits until every service lists all its replicas again.
    async fn settled(&self) {
        for (name, replicas, f) in &self.each {
            f.wait_for(&format!("{replicas} ready {name}"), |l| {
                l.len() == *replicas
            })
            .await;
        }
    }
}

impl Drop for Followers {
    fn drop(&mut self) {
        self.merge.abort();
    }
}

/// Publishes the concatenation of `lists` whenever one changes.
async fn merge(mut lists: Vec<watch::Receiver<Arc<Vec<Ep>>>>, tx: watch::Sender<Arc<Vec<Ep>>>) {
    loop {
        let all: Vec<Ep> = lists
            .iter_mut()
            .flat_map(|l| l.borrow_and_update().iter().cloned().collect::<Vec<_>>())
            .collect();
        tx.send_replace(Arc::new(all));
        let changed = lists.iter_mut().map(|l| Box::pin(l.changed()));
        if futures_util::future::select_all(changed).await.0.is_err() {
            return;
        }
    }
}

/// What the load client and the streams showed during one phase.
#[derive(Debug)]
struct Figures {
    requests: usize,
    failed: usize,
    rate: f64,
    failures: Vec<String>,
    /// Per service: (name, lowest ready count on its stream, its floor).
    floors: Vec<(&'static str, usize, usize)>,
    listed_after_term: Vec<String>,
    secs: f64,
}

/// Runs `phase` under load and measures it.
async fn under_load<F: std::future::Future<Output = ()>>(
    fs: &Followers,
    web: &Web,
    phase: F,
) -> Figures {
    let load = Load::start(fs.all.clone());
    let from = monotonic_ns();
    let t0 = Instant::now();
    phase.await;
    let secs = t0.elapsed().as_secs_f64();
    let shots: Vec<Shot> = load.finish().await;
    let terms = web.term_times();
    let all = report(&shots, &[], &terms, from);
    let mut floors = Vec::new();
    let mut listed_after_term = Vec::new();
    for ((name, replicas, f), (_, _, surge, unavailable)) in fs.each.iter().zip(SERVICES) {
        let _ = surge;
        let r = report(&[], &f.history(), &terms, from);
        floors.push((*name, r.min_ready, replicas - unavailable as usize));
        listed_after_term.extend(r.listed_after_term);
    }
    Figures {
        requests: all.requests,
        failed: all.failed,
        rate: all.rate,
        failures: all.failures,
        floors,
        listed_after_term,
        secs,
    }
}

/// The host's entry in `GET /v1/hosts`.
async fn host(api: &Api, id: &str) -> Value {
    let v = api.get_json("/v1/hosts").await.expect("GET /v1/hosts");
    v["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|h| h["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("host {id} not listed: {v}"))
}

/// The hosts of a service's live jobs, counted.
async fn per_host(api: &Api, service: &str) -> BTreeMap<String, usize> {
    let d = api
        .get_json(&format!("/v1/services/{service}"))
        .await
        .expect("service detail");
    let mut out = BTreeMap::new();
    for j in d["jobs"].as_array().into_iter().flatten() {
        if j["state"] == "running" || j["state"] == "placed" {
            *out.entry(j["host"].as_str().unwrap_or("").to_owned())
                .or_default() += 1;
        }
    }
    out
}

/// Processes running in a job directory of worker `dir` (its replicas).
fn replicas_in(dir: &Path) -> Vec<u32> {
    let jobs = dir.join("jobs");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_link(e.path().join("cwd")).is_ok_and(|c| c.starts_with(&jobs)) {
            out.push(pid);
        }
    }
    out
}

fn client_config(c: &Cluster) -> PathBuf {
    let p = c.dir.path().join("xcecli.toml");
    std::fs::write(
        &p,
        format!("api = \"{}\"\ntoken = \"{ADMIN}\"\n", c.api.base),
    )
    .unwrap();
    p
}

/// `xcecli ARGS` must exit 0; its stdout and stderr.
async fn ok(cfg: &Path, args: &[&str]) -> String {
    let (code, out, err) = cli(cfg, args).await;
    println!(
        "maintenance: xcecli {} -> exit {code}\n{out}{err}",
        args.join(" ")
    );
    assert_eq!(code, 0, "xcecli {}:\n{out}{err}", args.join(" "));
    format!("{out}{err}")
}

fn check_clean(name: &str, f: &Figures) {
    assert!(
        f.rate >= 100.0,
        "{name}: the load client sent {:.0} requests/s",
        f.rate
    );
    assert_eq!(
        f.failed, 0,
        "{name}: failed requests (first 20): {:#?}",
        f.failures
    );
    for (svc, min, floor) in &f.floors {
        assert!(
            min >= floor,
            "{name}: {svc} went down to {min} ready (floor {floor})"
        );
    }
    assert!(
        f.listed_after_term.is_empty(),
        "{name}: listed after their SIGTERM: {:?}",
        f.listed_after_term
    );
}

fn floors_text(f: &Figures) -> String {
    f.floors
        .iter()
        .map(|(s, min, floor)| format!("{s}={min}/{floor}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_and_planned_reboot_lose_no_request() {
    let web = Web::new();
    let mut c = Cluster::new(3, "30s").expect("cluster");
    let api = c.api.clone();
    let cfg = client_config(&c);
    for (name, replicas, surge, unavailable) in SERVICES {
        let (st, body) = api
            .submit_toml(&profile(&web, name, replicas, surge, unavailable))
            .await
            .unwrap();
        assert_eq!(st, 201, "submit {name}: {body}");
    }
    let fs = Followers::start(&api).await;
    for (name, _, _, _) in SERVICES {
        let on = per_host(&api, name).await;
        assert!(
            on.contains_key(HOST),
            "{name} has no replica on {HOST}: {on:?}"
        );
    }

    // 1. Drain under load.
    let drain = under_load(&fs, &web, async {
        let out = ok(&cfg, &["host", "drain", HOST, "--wait"]).await;
        assert!(out.contains(&format!("host {HOST} drained")), "{out}");
    })
    .await;
    let h = host(&api, HOST).await;
    assert_eq!(
        (h["jobs"].as_u64(), &h["maintenance"]["state"]),
        (Some(0), &Value::from("drained")),
        "{h}"
    );
    check_clean("drain", &drain);
    // It takes nothing until uncordoned.
    ok(&cfg, &["service", "scale", "web", "5", "--wait"]).await;
    let on = per_host(&api, "web").await;
    assert!(
        !on.contains_key(HOST),
        "a drained host took a replica: {on:?}"
    );
    ok(&cfg, &["host", "uncordon", HOST]).await;
    ok(&cfg, &["service", "scale", "web", "3", "--wait"]).await;

    // 2. Spreading: two restarts of 3 replicas on 3 hosts leave one per host.
    let mut spread = Vec::new();
    for round in 0..2 {
        for name in ["web", "api"] {
            ok(&cfg, &["service", "restart", name, "--wait"]).await;
            let on = per_host(&api, name).await;
            assert_eq!(
                on.values().copied().collect::<Vec<_>>(),
                [1, 1, 1],
                "{name} after restart {round}: {on:?}"
            );
            spread.push(on.len());
        }
    }
    fs.settled().await;

    // 3. A planned reboot the old way: SIGTERM, the reboot kills what ran, back later.
    let worker_dir = c.dir.path().join(format!("worker-{WORKER}"));
    let naive = under_load(&fs, &web, async {
        terminate(c.workers[WORKER].as_mut().unwrap());
        let left = replicas_in(&worker_dir);
        for pid in &left {
            signal(*pid, libc::SIGKILL);
        }
        eventually("the controller to see the host unreachable", || async {
            Ok((host(&api, HOST).await["state"] != "ready").then_some(()))
        })
        .await;
        c.start_worker_with(
            WORKER,
            &c.dir.path().join(format!("worker-{WORKER}.toml")),
            |cmd| {
                cmd.arg("--leave");
            },
        )
        .expect("worker back");
        fs.settled().await;
    })
    .await;
    for name in ["web", "api"] {
        ok(&cfg, &["service", "restart", name, "--wait"]).await;
    }
    fs.settled().await;
    assert!(
        per_host(&api, "web").await.contains_key(HOST),
        "web has a replica on {HOST} again"
    );

    // 4. The same reboot with --leave.
    let child = c.workers[WORKER].as_mut().unwrap();
    let leave = under_load(&fs, &web, async {
        signal(child.id(), libc::SIGTERM);
        let t0 = Instant::now();
        // The worker exits on its own once its host is drained (leave_timeout 10m).
        while child.try_wait().unwrap().is_none() {
            assert!(t0.elapsed() < patience(), "the leaving worker did not exit");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let left = replicas_in(&worker_dir);
        assert!(
            left.is_empty(),
            "replicas left running by the leave: {left:?}"
        );
    })
    .await;
    let h = host(&api, HOST).await;
    assert_eq!(h["maintenance"]["leave"], true, "{h}");
    check_clean("leave", &leave);
    // Back from the reboot: it takes placements again by itself (it drained itself).
    c.start_worker(WORKER).expect("worker back");
    eventually("the returning worker to take its host back", || async {
        let h = host(&api, HOST).await;
        Ok((h["state"] == "ready" && h["maintenance"].is_null()).then_some(()))
    })
    .await;
    ok(&cfg, &["service", "restart", "web", "--wait"]).await;
    assert!(
        per_host(&api, "web").await.contains_key(HOST),
        "the host takes replicas again"
    );

    println!(
        "SUMMARY maintenance drain_requests={} drain_failed={} drain_rate={:.0} drain_secs={:.1} drain_min_ready={} spread_hosts={:?}",
        drain.requests, drain.failed, drain.rate, drain.secs, floors_text(&drain), spread
    );
    println!(
        "SUMMARY reboot leave_requests={} leave_failed={} leave_secs={:.1} leave_min_ready={} naive_requests={} naive_failed={} naive_secs={:.1}",
        leave.requests, leave.failed, leave.secs, floors_text(&leave), naive.requests, naive.failed, naive.secs
    );
    assert!(naive.failed > 0, "the old way lost nothing?");
    assert_eq!(stop_all_and_count_leaks(&api).await, 0, "leaked ports");
}
