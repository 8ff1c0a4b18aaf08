//! The state task: queued commands and reports answered after one settle per batch, and
//! on a multi-threaded runtime a thread of its own.

use super::*;

/// Commands queued together are applied first and answered after one settle (per
/// `COMMANDS_PER_SETTLE`): with a settle after each, placing n replicas reported by many
/// workers at once costs O(n²) and heartbeats queue behind the rebuilds. On a paused
/// clock, as the next test.
#[tokio::test(start_paused = true)]
async fn a_burst_of_queued_commands_is_answered_after_one_settle_per_batch() {
    use super::task::{self, Command, COMMANDS_PER_SETTLE};
    use tokio::sync::{mpsc, oneshot, watch};
    const BURST: usize = 300;
    let mut sim = Sim::new();
    sim.register("h1", BURST as u64, &[]);
    let metrics = sim.metrics.clone();
    let before = metrics.settles.get();
    let placed = metrics.placements.get();
    let (tx, rx) = mpsc::channel(BURST);
    let mut replies = Vec::new();
    for i in 0..BURST {
        let (reply, answer) = oneshot::channel();
        tx.send(Command::Submit {
            doc: web(&format!("s{i}"), "default", 1),
            path: None,
            who: admin(),
            reply,
        })
        .await
        .unwrap();
        replies.push(answer);
    }
    let (stop, stopped) = watch::channel(false);
    let (fatal, _) = watch::channel(None);
    let state = tokio::spawn(task::run(sim.core, rx, stopped, fatal));
    for (i, answer) in replies.into_iter().enumerate() {
        let (key, _) = answer
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("submit {i}: {e}"));
        assert_eq!(key.to_string(), format!("default/s{i}"));
    }
    let settles = metrics.settles.get() - before;
    assert_eq!(
        settles,
        BURST.div_ceil(COMMANDS_PER_SETTLE) as u64,
        "{BURST} queued submits settled {settles} times"
    );
    // Every answer came after its service was placed: the last settle placed them all.
    assert_eq!((metrics.placements.get() - placed) as usize, BURST);
    stop.send(true).unwrap();
    state.await.unwrap();
}

/// A burst of queued worker reports also ends its batch once `EVENTS_PER_SETTLE` events
/// wait for the settle that announces them (each holds a copy of a job's record): 17
/// reports of 256 events settle twice, not once. On a paused clock: the hosts'
/// heartbeat deadlines must not come due while a slow (debug, loaded) run works.
#[tokio::test(start_paused = true)]
async fn queued_reports_settle_once_their_events_reach_the_bound() {
    use super::task::{self, Command, EVENTS_PER_SETTLE};
    use tokio::sync::{mpsc, oneshot, watch};
    const PER_REPORT: usize = 128; // jobs: a start and a readiness each
    let jobs = EVENTS_PER_SETTLE / 2 + PER_REPORT / 2;
    let mut sim = Sim::new();
    sim.register("h1", jobs as u64, &[]);
    sim.submit(web("web", "default", jobs as u32));
    let ids: Vec<String> = sim.core.view().borrow().services[&ServiceKey::new("default", "web")]
        .jobs
        .iter()
        .map(|j| j.info().job.clone())
        .collect();
    assert_eq!(ids.len(), jobs);
    let metrics = sim.metrics.clone();
    let before = metrics.settles.get();
    let reports = ids.chunks(PER_REPORT).count();
    let (tx, rx) = mpsc::channel(reports);
    let mut replies = Vec::new();
    for chunk in ids.chunks(PER_REPORT) {
        let (reply, answer) = oneshot::channel();
        let events = chunk
            .iter()
            .flat_map(|j| [started(j), ready(j, true)])
            .collect();
        tx.send(Command::Events {
            report: crate::core::Report {
                host: "h1".into(),
                caller: worker("h1"),
                events,
            },
            reply,
        })
        .await
        .unwrap();
        replies.push(answer);
    }
    assert_eq!(reports, EVENTS_PER_SETTLE / (2 * PER_REPORT) + 1);
    let (stop, stopped) = watch::channel(false);
    let (fatal, _) = watch::channel(None);
    let state = tokio::spawn(task::run(sim.core, rx, stopped, fatal));
    for (i, answer) in replies.into_iter().enumerate() {
        answer
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("report {i}: {e}"));
    }
    let settles = metrics.settles.get() - before;
    assert_eq!(
        settles, 2,
        "{reports} queued reports settled {settles} times"
    );
    stop.send(true).unwrap();
    state.await.unwrap();
}

/// On a multi-threaded runtime the state task runs on a blocking-pool thread of its own
/// (`task::spawn`: one malloc arena for the model): it answers, places and applies worker
/// reports there, on the runtime's timers, stops on `shutdown`, and the runtime then drops
/// (a state task still running would hold the runtime's drop, which waits for its
/// blocking threads).
#[test]
fn on_a_multi_threaded_runtime_the_state_task_serves_from_its_own_thread_and_stops() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let app = app().await;
        web_of_4_on_2_hosts_one_ready(&app).await;
        let (_, detail) = app.get("/v1/services/web", ADMIN).await;
        let jobs: Vec<(&str, &str, bool)> = detail["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| {
                let s = |k: &str| j[k].as_str().unwrap();
                (s("job"), s("state"), j["ready"].as_bool().unwrap())
            })
            .collect();
        assert_eq!(
            jobs,
            [
                ("j-1", "running", true),
                ("j-2", "placed", false),
                ("j-3", "placed", false)
            ],
            "{detail}"
        );
        app.ctl.shutdown().await;
    });
    drop(rt);
}
