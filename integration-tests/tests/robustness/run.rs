//! One run: a shape, a seed, recorded traffic under a fault schedule, then the wait for
//! convergence once the faults stop, then the validators; a report on failure.

use crate::harness::{monotonic_ns, patience, Api};
use crate::history::{Fault, Final, History, ReadKind, Recorder, SEC};
use crate::nemesis::{self, Planned};
use crate::replica::Replicas;
use crate::shapes::Shape;
use crate::traffic::{self, Ctx, Service};
use crate::validators::{self, Violation, Windows};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How long each schedule runs, and how many: the short mode of CI, or
/// `ROBUSTNESS_MINUTES=N` (schedules of 60 s until N minutes are used up), or one
/// schedule when `XCE_TEST_SEED` replays one.
pub struct Mode {
    pub schedule_s: u64,
    pub budget_s: u64,
}

impl Mode {
    pub fn from_env(short_s: u64) -> Self {
        match std::env::var("ROBUSTNESS_MINUTES")
            .ok()
            .and_then(|m| m.parse::<u64>().ok())
        {
            Some(m) => Self {
                schedule_s: 60,
                budget_s: m * 60,
            },
            None => Self {
                schedule_s: short_s,
                budget_s: short_s,
            },
        }
    }
}

/// What one schedule did and found.
pub struct Outcome {
    pub seed: u64,
    pub history: History,
    pub plan: Vec<Planned>,
    pub violations: Vec<Violation>,
    /// Seconds from the last fault's end to convergence (`None`: never).
    pub converge_s: Option<f64>,
    pub report: Option<PathBuf>,
    /// Ports still held once every service was stopped (0 unless the wait timed out).
    pub leaked_ports: u64,
}

/// The services of every run: two ordinary ones, one whose replicas ignore SIGTERM (the
/// worker's SIGKILL ends them), and one that crash-loops.
fn services() -> Vec<Service> {
    vec![
        Service {
            name: "web-a".into(),
            mode: "normal",
            replicas: 2,
        },
        Service {
            name: "web-b".into(),
            mode: "normal",
            replicas: 3,
        },
        Service {
            name: "stubborn".into(),
            mode: "ignore-term",
            replicas: 2,
        },
        Service {
            name: "crashy".into(),
            mode: "crash",
            replicas: 1,
        },
    ]
}

/// Starts every traffic task on `ctx`; the writer gets a stop of its own (it stops first,
/// so the cluster can converge to what it last wrote).
fn start_traffic(
    ctx: &Ctx,
    writer_ctx: &Ctx,
    apis: &[Api],
    reps: &Arc<Replicas>,
    rng: &mut fastrand::Rng,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = vec![tokio::spawn(traffic::writer(
        writer_ctx.clone(),
        reps.clone(),
        services(),
        rng.fork(),
    ))];
    tasks.push(tokio::spawn(traffic::sampler(ctx.clone())));
    tasks.push(tokio::spawn(traffic::liveness(ctx.clone(), reps.clone())));
    tasks.push(tokio::spawn(traffic::assignments(ctx.clone())));
    tasks.push(tokio::spawn(traffic::sockets(ctx.clone())));
    tasks.push(tokio::spawn(traffic::streamer(
        ctx.clone(),
        None,
        rng.fork(),
    )));
    // The readers and load clients of a shape with several APIs spread over them in
    // turn, each staying on one (its index order is judged per reader).
    let mut turn = (0..).map(|k| ctx.with_api(apis[k % apis.len()].clone()));
    let mut next = || turn.next().expect("an endless turn");
    for s in services() {
        for kind in [ReadKind::Plain, ReadKind::Get, ReadKind::Blocking] {
            tasks.push(tokio::spawn(traffic::reader(
                next(),
                s.name.clone(),
                kind,
                rng.fork(),
            )));
        }
        tasks.push(tokio::spawn(traffic::streamer(
            next(),
            Some(s.name.clone()),
            rng.fork(),
        )));
        tasks.push(tokio::spawn(traffic::load(
            next(),
            s.name.clone(),
            rng.fork(),
        )));
    }
    tasks
}

/// `ROBUSTNESS_FREEZE_PCT=N`: N % of the faults freeze an etcd member under an apiserver
/// (the etcd shape; 0 unless set).
fn freeze_pct() -> u8 {
    std::env::var("ROBUSTNESS_FREEZE_PCT")
        .ok()
        .and_then(|v| v.parse::<u8>().ok())
        .map_or(0, |p| p.min(100))
}

/// Runs one schedule of `secs` seconds drawn from `rng` on `shape`.
pub async fn one(shape: &mut dyn Shape, mut rng: fastrand::Rng, secs: u64, w: &Windows) -> Outcome {
    let seed = rng.get_seed();
    let plan = nemesis::schedule(&mut rng, secs * 1000, &shape.caps(), freeze_pct());
    print_plan(shape, seed, &plan);
    let reps = Arc::new(Replicas::new());
    let rec = Recorder::default();
    let ctx = Ctx::new(shape.api(), rec.clone());
    let writer_ctx = ctx.with_own_stop();
    let start_ns = monotonic_ns();
    let tasks = start_traffic(&ctx, &writer_ctx, &shape.reader_apis(), &reps, &mut rng);
    nemesis::apply(shape, &plan, &rec).await;
    // The rest of the schedule's time without faults.
    let left = (start_ns + secs * SEC).saturating_sub(monotonic_ns());
    tokio::time::sleep(Duration::from_nanos(left)).await;
    let faults_end_ns = monotonic_ns();
    rec.with(|h| {
        h.faults.push(Fault {
            start_ns,
            end_ns: faults_end_ns,
            kind: "crash-loop".into(),
            target: "crashy".into(),
        });
    });
    writer_ctx.stop.store(true, Ordering::Relaxed);
    // The writer is the first task: its last write is in before the wait starts.
    let mut tasks = tasks.into_iter();
    let _ = tasks.next().expect("the writer").await;
    let fin = converge(&ctx, faults_end_ns, w).await;
    // The readers go on in the converged cluster until the all-services stream has caught
    // up with what the others saw by then (its "nothing lost" is judged at its end).
    caught_up(&rec).await;
    ctx.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    reps.sample_gone(&rec);
    let mut history = rec.snapshot();
    history.add_replica_log(&reps.read_log());
    history.fin = Some(fin);
    let violations = validators::all(&history, w);
    let converge_s = history
        .fin
        .as_ref()
        .and_then(|f| f.converged_ns)
        .map(|c| c.saturating_sub(faults_end_ns) as f64 / 1e9);
    // `ROBUSTNESS_REPORT=always`: a report of a clean run too (to look at its history).
    let always = std::env::var("ROBUSTNESS_REPORT").is_ok_and(|v| v == "always");
    let report = (always || !violations.is_empty())
        .then(|| crate::report::write(shape, seed, &plan, &history, &violations, &reps));
    // Every service stopped and every port free again before the next schedule (whose
    // replicas run another script), and before this one's replicas are killed.
    let leaked_ports = crate::harness::stop_all_and_count_leaks(&shape.api()).await;
    Outcome {
        leaked_ports,
        seed,
        history,
        plan,
        violations,
        converge_s,
        report,
    }
}

fn print_plan(shape: &dyn Shape, seed: u64, plan: &[Planned]) {
    println!(
        "robustness shape={} schedule seed {seed} (replay: XCE_TEST_SEED={seed}): {} faults",
        shape.name(),
        plan.len()
    );
    let names = shape.daemons();
    for p in plan {
        println!("  {}", p.line(&names));
    }
    println!("  all along: replicas of `stubborn` ignore SIGTERM, `crashy` crash-loops");
}

/// Waits until the all-services stream reader got an event id at least the newest index
/// any reader had seen when the wait began (up to `patience()`: a stream that never gets
/// there is judged as it is, by validator 3).
async fn caught_up(rec: &Recorder) {
    let newest = rec.with(|h| h.reads.iter().map(|r| r.index).max().unwrap_or(0));
    let deadline = tokio::time::Instant::now() + patience();
    while tokio::time::Instant::now() < deadline {
        let reached = rec.with(|h| {
            h.reads
                .iter()
                .filter(|r| r.kind == ReadKind::AllStream)
                .filter_map(|r| r.event_id)
                .any(|id| id >= newest)
        });
        if reached {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every service has what the last acknowledged write asked for (ready,
/// rollout not progressing) and stopped ones are gone, up to the converge window (or
/// `patience()`, if longer); records the final state.
async fn converge(ctx: &Ctx, faults_end_ns: u64, w: &Windows) -> Final {
    let deadline = tokio::time::Instant::now() + Duration::from_nanos(w.converge).max(patience());
    let mut fin = Final {
        faults_end_ns,
        ..Final::default()
    };
    loop {
        let want = validators::expected_state(&ctx.rec.snapshot());
        if let Ok(list) = ctx.api.get_json("/v1/services").await {
            let have = traffic::summaries(&list);
            fin.services = have
                .iter()
                .map(|(n, s)| (n.clone(), (s.replicas, s.ready, s.rollout.clone())))
                .collect();
            let done =
                want.iter()
                    .filter(|(s, _)| *s != "crashy")
                    .all(|(s, n)| match (n, have.get(s)) {
                        (None, None) => true,
                        (Some(n), Some(h)) => {
                            h.replicas == *n && h.ready == *n && h.rollout != "progressing"
                        }
                        _ => false,
                    });
            if done {
                fin.converged_ns = Some(monotonic_ns());
                return fin;
            }
        }
        if tokio::time::Instant::now() > deadline {
            return fin;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
