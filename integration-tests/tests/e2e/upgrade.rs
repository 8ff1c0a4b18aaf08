//! Issue 29, "an upgrade from the previous release is tested end to end with 0 failed
//! requests": an etcd HA cluster (3 etcd members, 2 controllers, 1 apiserver, 2 workers)
//! runs the previous release, built from git inside the test, while a load client
//! follows the endpoint stream and sends requests to the replicas; every process is
//! replaced by this build one at a time, in UPGRADING.md's order (the standby controller,
//! the leader, the apiserver, the workers); then the service is rolled out once.
//!
//! It builds the previous release's `xced` (about two minutes of CPU on a 2-core machine,
//! cached under `target/previous-release/`), so plain `cargo test` skips it (`#[ignore]`)
//! and `./test.sh` runs it on its own after every other test:
//! `cargo test -p integration-tests --test e2e -- --ignored upgrade --nocapture`.
//! `XCE_UPGRADE_FROM=<commit>` picks another release.

use crate::daemons::{EtcdCluster, Fleet};
use crate::harness::*;
use crate::rollout::{cli, report, Follower, Load, Web};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The previous release: the last submission that landed before this round (it is the
/// commit tagged `release-34` where tags were kept).
const PREVIOUS: &str = "070e0316637d417e49e8db716be0969b279dff1d";

/// The previous release's `xced`, built (or found built) from git under
/// `target/previous-release/`; `None` (with a `SKIPPED:` line) when this checkout does
/// not hold that commit (a shallow clone).
fn previous_xced() -> Option<PathBuf> {
    let commit = std::env::var("XCE_UPGRADE_FROM").unwrap_or_else(|_| PREVIOUS.to_owned());
    let root = workspace_root();
    let known = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .status()
        .is_ok_and(|s| s.success());
    if !known {
        println!("SKIPPED: commit {commit} is not in this repository (a shallow clone?)");
        return None;
    }
    let dir = root.join("target/previous-release");
    let src = dir.join(format!("src-{}", &commit[..8.min(commit.len())]));
    if !src.join(".git").exists() {
        run(Command::new("git")
            .args(["clone", "-q", "--shared"])
            .arg(&root)
            .arg(&src));
        run(Command::new("git")
            .arg("-C")
            .arg(&src)
            .args(["checkout", "-q", "--detach", &commit]));
    }
    let target = dir.join("target");
    eprintln!(
        "upgrade: building the previous release {commit} in {} (cached after the first run)",
        src.display()
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    // Without debug info or incremental state: the build takes a third of the time and
    // of the disk, and nothing here debugs the old binary.
    run(Command::new(cargo)
        .args(["build", "-p", "xced", "--bins"])
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env("CARGO_INCREMENTAL", "0"));
    Some(target.join("debug/xced"))
}

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?}: {status}");
}

/// How many lines of daemon `name`'s log contain `needle`.
fn lines_with(fleet: &Fleet, name: &str, needle: &str) -> usize {
    std::fs::read_to_string(fleet.log(name))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

/// Waits until daemon `name`'s log holds more than `before` lines with `needle`.
async fn logs_again(fleet: &Fleet, name: &str, needle: &str, before: usize) {
    eventually(&format!("{name} logs {needle:?}"), || async {
        Ok((lines_with(fleet, name, needle) > before).then_some(()))
    })
    .await;
}

/// The service's index as the apiserver answers it, every 50 ms while `on` is set and
/// the apiserver answers (it is down while it is replaced): what a reader there saw.
fn watch_index(api: Api, on: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<u64>> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while on.load(Ordering::Relaxed) {
            if let Ok((200, headers, _)) = api.get("/v1/services/web/endpoints").await {
                if let Some(i) = headers
                    .get("x-xce-index")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                {
                    seen.push(i);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen
    })
}

/// Replaces daemon `name` (kind `kind`) by this build: SIGTERM, wait for its exit,
/// start the new one from the same config.
fn replace(fleet: &mut Fleet, kind: &str, name: &str, slot: Slot) {
    let new = fleet.spawn_from(&bin("xced"), kind, name).unwrap();
    let old = match slot {
        Slot::Controller(c) => fleet.controllers[c].replace(new).map(|d| d.child),
        Slot::Apiserver(a) => fleet.apiservers[a].replace(new).map(|d| d.child),
        Slot::Worker(i) => Some(std::mem::replace(&mut fleet.workers[i], new.child)),
    };
    drop(old);
}

/// Where a daemon of the fleet is kept.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Controller(usize),
    Apiserver(usize),
    Worker(usize),
}

/// SIGTERM daemon `slot` and wait until it has exited (a leader resigns first; a worker
/// leaves its replicas running, to be re-adopted).
fn stop(fleet: &mut Fleet, slot: Slot) {
    let child = match slot {
        Slot::Controller(c) => fleet.controllers[c].as_mut().map(|d| &mut d.child),
        Slot::Apiserver(a) => fleet.apiservers[a].as_mut().map(|d| &mut d.child),
        Slot::Worker(i) => fleet.workers.get_mut(i),
    };
    if let Some(child) = child {
        terminate(child);
    }
}

/// Lists the controllers after the apiserver in every worker's `controller =`, as
/// UPGRADING.md asks: with only the apiserver there, a worker is not heard while the
/// apiserver is replaced, and past the controller's `unreachable_after` (3 s here) its
/// endpoints leave the list. Seen on a loaded machine: a 5 s replacement emptied the
/// list and 11-34 requests found no endpoint.
fn workers_reach_the_controllers_too(fleet: &Fleet) {
    let mut paths: Vec<String> = fleet
        .apiserver_ports
        .iter()
        .chain(&fleet.controller_ports)
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    paths.dedup();
    let only_apiservers = fleet
        .apiserver_ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"));
    let before = format!(
        "controller = \"{}\"",
        only_apiservers.collect::<Vec<_>>().join(",")
    );
    let after = format!("controller = \"{}\"", paths.join(","));
    for i in 0..2 {
        let path = fleet.dir.path().join(format!("worker-{i}.toml"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(&before), "{}: {text}", path.display());
        std::fs::write(&path, text.replace(&before, &after)).unwrap();
    }
}

/// Starts the whole fleet on the previous release and waits until it serves `web` (3
/// replicas of v1) through the apiserver.
async fn start_previous(fleet: &mut Fleet, old: &Path, web: &Web) {
    workers_reach_the_controllers_too(fleet);
    let spawn = |f: &Fleet, kind: &str, name: &str| f.spawn_from(old, kind, name).unwrap();
    fleet.controllers[0] = Some(spawn(fleet, "controller", "controller-0"));
    fleet.wait_announced(0).await;
    fleet.controllers[1] = Some(spawn(fleet, "controller", "controller-1"));
    logs_again(fleet, "controller-1", "standby: waiting for leadership", 0).await;
    fleet.apiservers[0] = Some(spawn(fleet, "apiserver", "apiserver-0"));
    for i in 0..2 {
        let w = spawn(fleet, "worker", &format!("worker-{i}"));
        fleet.workers.push(w.child);
    }
    let api = fleet.apiserver(0);
    let (st, body) = eventually("the old apiserver takes the service", || async {
        match api.submit_toml(&web.profile("v1", 3)).await {
            Ok((st, body)) if st != 503 => Ok(Some((st, body))),
            _ => Ok(None),
        }
    })
    .await;
    assert_eq!(st, 201, "submit v1: {body}");
    api.wait_settled("web", 3).await;
}

/// The hosts of `web`'s jobs, by host: how many each runs.
async fn jobs_per_host(api: &Api) -> std::collections::BTreeMap<String, usize> {
    let d: Value = api.get_json("/v1/services/web").await.unwrap();
    let mut out = std::collections::BTreeMap::new();
    for j in d["jobs"].as_array().into_iter().flatten() {
        *out.entry(j["host"].as_str().unwrap_or("").to_owned())
            .or_default() += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "on demand: builds the previous release from git (minutes); see the module doc"]
async fn upgrade_from_the_previous_release_one_process_at_a_time_loses_no_request() {
    let Some(old) = previous_xced() else { return };
    let web = Web::new();
    let etcd = EtcdCluster::start(3).await.expect("etcd");
    let mut fleet = Fleet::new(etcd, 2, 1).expect("fleet");
    start_previous(&mut fleet, &old, &web).await;
    let api = fleet.apiserver(0);
    let old_builds = lines_with(&fleet, "controller-0", "xced starting");
    println!(
        "upgrade: the previous release serves ({old_builds} controller start) (at {})",
        monotonic_ns()
    );

    // Readers: the stream-following load client (the apiserver first, the controllers
    // after it, as a client's URL list), and the index a reader of the apiserver sees.
    let all = [
        api.clone(),
        fleet.controller_api(0),
        fleet.controller_api(1),
    ];
    println!(
        "upgrade: apiserver-0 {}, controller-0 {}, controller-1 {}",
        all[0].base, all[1].base, all[2].base
    );
    let follower = Follower::start_any(&all).await;
    follower
        .wait_for("3 ready replicas", |l| l.len() == 3)
        .await;
    let load = Load::start(follower.list.clone());
    let from = monotonic_ns();
    let indexing = Arc::new(AtomicBool::new(true));
    let indexes = watch_index(api.clone(), indexing.clone());

    // 1. The standby controller.
    stop(&mut fleet, Slot::Controller(1));
    let waiting = lines_with(&fleet, "controller-1", "standby: waiting for leadership");
    replace(
        &mut fleet,
        "controller",
        "controller-1",
        Slot::Controller(1),
    );
    logs_again(
        &fleet,
        "controller-1",
        "standby: waiting for leadership",
        waiting,
    )
    .await;
    println!(
        "upgrade: standby controller-1 runs this build (at {})",
        monotonic_ns()
    );

    // 2. The leader: it resigns, the upgraded standby takes over, it comes back as one.
    stop(&mut fleet, Slot::Controller(0));
    eventually("the upgraded controller-1 leads", || async {
        Ok(fleet.serving_controller().ok().filter(|&c| c == 1))
    })
    .await;
    let waiting = lines_with(&fleet, "controller-0", "standby: waiting for leadership");
    replace(
        &mut fleet,
        "controller",
        "controller-0",
        Slot::Controller(0),
    );
    logs_again(
        &fleet,
        "controller-0",
        "standby: waiting for leadership",
        waiting,
    )
    .await;
    println!(
        "upgrade: both controllers run this build, controller-1 leads (at {})",
        monotonic_ns()
    );

    // 3. The apiserver.
    stop(&mut fleet, Slot::Apiserver(0));
    replace(&mut fleet, "apiserver", "apiserver-0", Slot::Apiserver(0));
    eventually("the upgraded apiserver serves", || async {
        Ok((api.get("/v1/services/web/endpoints").await?.0 == 200).then_some(()))
    })
    .await;
    println!(
        "upgrade: the apiserver runs this build (at {})",
        monotonic_ns()
    );

    // 4. The workers, one at a time: each re-adopts every replica it ran.
    let mut adopted = 0;
    for i in 0..2 {
        let host = format!("exec-{:02}", i + 1);
        let ran = jobs_per_host(&api).await.get(&host).copied().unwrap_or(0);
        let name = format!("worker-{i}");
        let before = lines_with(&fleet, &name, "re-adopted running replica");
        stop(&mut fleet, Slot::Worker(i));
        replace(&mut fleet, "worker", &name, Slot::Worker(i));
        eventually(&format!("{name} re-adopts its {ran} replicas"), || async {
            let now = lines_with(&fleet, &name, "re-adopted running replica") - before;
            Ok((now >= ran).then_some(now))
        })
        .await;
        adopted += ran;
    }
    println!(
        "upgrade: both workers run this build ({adopted} replicas re-adopted) (at {})",
        monotonic_ns()
    );

    // 5. One rollout on the upgraded cluster.
    let cfg = web.write(
        "xcecli.toml",
        &format!(
            "api = \"{}\"\ntoken = \"{ADMIN}\"\n",
            all.iter()
                .map(|a| a.base.clone())
                .collect::<Vec<_>>()
                .join(",")
        ),
    );
    let v2 = web.write("web-v2.toml", &web.profile("v2", 3));
    let (code, out, err) = cli(&cfg, &["service", "submit", v2.to_str().unwrap(), "--wait"]).await;
    assert_eq!(code, 0, "rollout to v2: {out}{err}");
    follower
        .wait_for("3 replicas of v2", |l| {
            l.len() == 3 && l.iter().all(|e| !e.job.is_empty())
        })
        .await;

    let shots = load.finish().await;
    indexing.store(false, Ordering::Relaxed);
    let indexes = indexes.await.unwrap();
    let r = report(&shots, &follower.history(), &web.term_times(), from);
    let back = indexes.windows(2).filter(|w| w[1] < w[0]).count();
    println!(
        "SUMMARY upgrade from={} requests={} failed={} rate={:.0}/s index_reads={} index_went_back={back} readopted={adopted} listed_after_sigterm={} versions={:?}",
        &PREVIOUS[..12],
        r.requests,
        r.failed,
        r.rate,
        indexes.len(),
        r.listed_after_term.len(),
        r.versions
    );
    assert!(
        r.rate >= 100.0,
        "the load client sent {:.0} requests/s",
        r.rate
    );
    // Which server gave the load client an empty list, and when: the first thing to
    // look at when requests found no endpoint.
    let empties: Vec<String> = follower
        .history()
        .iter()
        .filter(|s| s.eps.is_empty())
        .map(|s| format!("at {} from {}", s.at, s.from))
        .collect();
    assert_eq!(
        r.failed,
        0,
        "failed requests (first 20): {:#?}\nempty lists: {empties:#?}\nstreams ended: {:#?}",
        r.failures,
        follower.ended.lock().unwrap()
    );
    assert_eq!(back, 0, "the index went back: {indexes:?}");
    assert!(r.listed_after_term.is_empty(), "{:?}", r.listed_after_term);
    assert_eq!(r.sent_after_term, 0, "requests sent after a SIGTERM");
    assert_eq!(adopted, 3, "every replica re-adopted");
    assert!(r.versions.contains_key("v2"), "{:?}", r.versions);
}
