//! Issue 12, bug 6 through `xced`: a controller whose data dir's filesystem fills up.
//!
//! The controller's data dir is a small tmpfs (mounted when this runs as root, as CI does;
//! otherwise the test prints `SKIPPED: …` and checks nothing). With a worker and a ready
//! service, a filler file takes the rest of the filesystem; then writes (service
//! submissions) until one answers 507 with the cause; the controller exits with a clear
//! log line (fail-stop) instead of running on wedged; a replica killed meanwhile is served
//! by nobody; with the filler gone the controller starts clean, every acknowledged change
//! is there, and the service converges again.

use crate::harness::*;
use anyhow::{Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use testkit::small_fs::SmallFs;

fn count(path: &std::path::Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .matches(needle)
        .count()
}

/// A service that is acknowledged (stored) but never placed: its one port is fixed to
/// `port`, which a live replica of `web` holds, so it stays pending and causes no job
/// commits of its own (the only writes are the test's).
fn pending_service(n: usize, port: &str) -> String {
    format!(
        "[service]\nname = \"keep-{n}\"\ncommand = [\"true\"]\n[[service.ports]]\nname = \"held\"\nport = {port}\n"
    )
}

/// Every service as (name → generation, replicas).
async fn services(api: &Api) -> Result<BTreeMap<String, (u64, u64)>> {
    let l = api.get_json("/v1/services").await?;
    Ok(l["services"]
        .as_array()
        .context("services")?
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or("").to_owned(),
                (
                    s["generation"].as_u64().unwrap_or(0),
                    s["replicas"].as_u64().unwrap_or(0),
                ),
            )
        })
        .collect())
}

async fn web_jobs(api: &Api) -> Result<BTreeSet<String>> {
    let svc = api.get_json("/v1/services/web").await?;
    Ok(svc["jobs"]
        .as_array()
        .context("jobs")?
        .iter()
        .filter_map(|j| j["job"].as_str().map(str::to_owned))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_507_stops_the_controller_and_loses_nothing() {
    let Some(fs) = SmallFs::mount("4m") else {
        println!(
            "SKIPPED: cannot mount a tmpfs here (needs root); the full-disk scenario is not run"
        );
        return;
    };
    let cfg = ClusterConfig {
        controller_data_dir: Some(fs.path().join("controller")),
        ..ClusterConfig::default()
    };
    let mut c = Cluster::start(1, "30s", &cfg).unwrap();
    let log = c.dir.path().join("controller.log");
    let web = http_service("web", 2).interval("500ms").toml();
    assert_eq!(c.api.submit_toml(&web).await.unwrap().0, 201);
    let eps_before = c.api.wait_ready("web", 2).await;
    // `held`: the port the pending services ask for (its replica lives on); `dead`: the
    // replica killed later.
    let (held, dead) = (eps_before[0].clone(), eps_before[1].clone());
    let held_port = held.rsplit_once(':').unwrap().1.to_owned();
    let mut acknowledged = 0;
    for n in 0..2 {
        let (st, body) = c
            .api
            .submit_toml(&pending_service(n, &held_port))
            .await
            .unwrap();
        assert_eq!(st, 201, "{body}");
        acknowledged += 1;
    }
    let jobs_before = web_jobs(&c.api).await.unwrap();
    let before = services(&c.api).await.unwrap();

    let filled = fs.fill("filler");
    // redb may still fit the first writes in pages it freed earlier: write until one
    // finds no space. Each acknowledged write must survive.
    let mut after_fill = BTreeSet::new();
    let (status, body) = loop {
        // No answer at all (status 0) is the third face of the fail-stop: a write of the
        // controller's own found the disk full while this request was in flight, and the
        // process exited before answering it.
        let (st, body) = match c
            .api
            .submit_toml(&pending_service(acknowledged, &held_port))
            .await
        {
            Ok(answer) => answer,
            Err(e) => (
                0,
                serde_json::json!({"error": {"message": format!("{e:#}")}}),
            ),
        };
        if st != 201 {
            break (st, body);
        }
        after_fill.insert(format!("keep-{acknowledged}"));
        acknowledged += 1;
        assert!(
            after_fill.len() < 2000,
            "a full filesystem never refused a write"
        );
    };
    let refused_at = Instant::now();
    let reason = body["error"]["message"].as_str().unwrap_or("").to_owned();

    // Fail-stop: the process exits by itself. Polled (a process exit has no notification
    // a test can wait on), bounded by the harness patience.
    let child = c.controller.as_mut().unwrap();
    let exit = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            refused_at.elapsed() < patience(),
            "the controller still runs after the 507"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let exited_after = refused_at.elapsed();
    c.controller = None;
    let stop_lines = count(&log, "this controller stops");
    let no_space_lines = count(&log, "no space left on device");

    // A replica killed while the controller is down: nobody serves the endpoint table (the
    // controller's port refuses), so nobody can list the dead replica.
    kill_replica_listening_on(&dead).unwrap();
    let served_while_down = c.api.plain("web").await.is_ok();

    // Space back, the same controller again.
    std::fs::remove_file(fs.path().join("filler")).unwrap();
    let restart = Instant::now();
    c.start_controller().unwrap();
    let started = restart.elapsed();
    let after = services(&c.api).await.unwrap();
    // The dead replica: listed right after the start (the stored state says ready) until
    // the worker's report of its exit lands.
    let dead_listed_at_start = c.api.plain("web").await.unwrap().contains(&dead);
    let dead_gone = eventually("the dead replica leaves the endpoints", || async {
        let eps = c.api.plain("web").await?;
        Ok((!eps.contains(&dead)).then(|| restart.elapsed()))
    })
    .await;
    let eps_after = c.api.wait_ready("web", 2).await;
    let converged = restart.elapsed();
    let jobs_after = web_jobs(&c.api).await.unwrap();
    let kept_jobs = jobs_before.intersection(&jobs_after).count();

    println!(
        "FIGURE fulldisk: tmpfs 4 MiB, filler {} KiB; writes acknowledged after the fill {}, then HTTP {status}: {reason}",
        filled / 1024,
        after_fill.len()
    );
    println!(
        "FIGURE fulldisk: controller exited {:.0} ms after the 507 ({exit}); log lines: 'this controller stops' {stop_lines}, 'no space left on device' {no_space_lines}",
        exited_after.as_secs_f64() * 1000.0
    );
    println!(
        "FIGURE fulldisk: replica {dead} killed while the controller was down; endpoint table served meanwhile: {served_while_down}"
    );
    println!(
        "FIGURE fulldisk: restart with space back took {:.1} s; services {} acknowledged, {} after the restart; the dead replica listed at the start: {dead_listed_at_start}, gone {:.0} ms after the restart; 2 ready again after {:.1} s (jobs kept {kept_jobs} of {})",
        started.as_secs_f64(),
        acknowledged + 1,
        after.len(),
        dead_gone.as_secs_f64() * 1000.0,
        converged.as_secs_f64(),
        jobs_before.len()
    );
    // The write that finds no space is answered 507; a write of the controller's own (a
    // worker's report, a rollout's waiting reason) may find it first on a busy machine,
    // and then this client's write meets the controller shutting down (503) or exiting
    // before it answers (no answer). All are the fail-stop; the log below says it was
    // the disk.
    let by_disk = status == 507 && reason.contains("no space left");
    let by_stop = status == 503 && reason.contains("shutting down");
    let unanswered = status == 0;
    assert!(by_disk || by_stop || unanswered, "{status} {body}");
    assert!(!exit.success(), "fail-stop exits with an error: {exit}");
    assert!(
        stop_lines >= 1 && no_space_lines >= 1,
        "see {}",
        log.display()
    );
    assert!(!served_while_down);
    // Every acknowledged service is there as acknowledged; the refused write may have
    // landed too (a failed commit's outcome is unknown), nothing else.
    for (name, v) in &before {
        assert_eq!(after.get(name), Some(v), "{name} after the restart");
    }
    for name in &after_fill {
        assert!(
            after.contains_key(name),
            "{name} acknowledged, missing after the restart"
        );
    }
    let refused = format!("keep-{acknowledged}");
    assert!(
        after
            .keys()
            .all(|n| before.contains_key(n) || after_fill.contains(n) || *n == refused),
        "{after:?}"
    );
    assert!(!eps_after.contains(&dead));
    assert_eq!(kept_jobs, 1, "the live replica kept its job");
}
