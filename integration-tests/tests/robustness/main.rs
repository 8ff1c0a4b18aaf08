//! The robustness suite (issue 33): real clusters under recorded, randomized traffic and
//! faults drawn from a printed seed, checked by validators that are pure functions of the
//! recorded history — the way etcd's `tests/robustness` and Jepsen test a system.
//!
//! - `history.rs`: what is recorded (CLOCK_MONOTONIC, shared by every process);
//! - `replica.rs`: the replica program, which logs its own start, SIGTERM and exit;
//! - `traffic.rs`: the writer, the readers, the load client, the sampler;
//! - `nemesis.rs`: the fault schedule and its application;
//! - `shapes.rs`: the cluster shapes (`etcd_shape.rs`: the etcd HA one); `run.rs`: one run; `report.rs`: the failure report;
//! - `validators.rs`: the validators, unit-tested on hand-made histories.
//!
//! Short mode (CI): one schedule of `SHORT_S` seconds per shape. Long mode:
//! `ROBUSTNESS_MINUTES=N`. Replay: `XCE_TEST_SEED=<schedule seed>`.
#![allow(unreachable_pub, missing_docs, dead_code)]

#[allow(unused_imports)]
#[path = "../e2e/harness.rs"]
mod harness;

#[allow(unused_imports)]
#[path = "../e2e/daemons.rs"]
mod daemons;

mod etcd_shape;
mod history;
mod nemesis;
mod planted;
mod proxy;
mod replica;
mod report;
mod run;
mod shapes;
mod traffic;
mod validators;

use run::{Mode, Outcome};
use shapes::Shape;
use validators::{Violation, Windows};

/// Seconds of one schedule in the short mode.
const SHORT_S: u64 = 40;

/// Violations the suite finds on the code as it is, each an open finding of
/// RELIABILITY.md ("Robustness suite", by its id): the suite passes when these, and only
/// these, fire on their shape. `(shape, validator, finding id)`.
pub const KNOWN_FINDINGS: &[(&str, &str, &str)] = &[];

/// Whether `v` on `shape` is a known open finding.
fn known(shape: &str, v: &Violation) -> Option<&'static str> {
    KNOWN_FINDINGS
        .iter()
        .find(|(s, validator, _)| *s == shape && *validator == v.validator)
        .map(|(_, _, id)| *id)
}

/// Runs the mode's schedules on `shape` and prints its SUMMARY line; returns the outcomes.
async fn schedules(shape: &mut dyn Shape, mode: &Mode, w: &Windows) -> Vec<Outcome> {
    let mut master = testkit::seeded_rng(&format!("robustness shape={}", shape.name()));
    let replay = std::env::var("XCE_TEST_SEED").is_ok();
    let mut seed = master.get_seed();
    let start = std::time::Instant::now();
    let mut outcomes = Vec::new();
    loop {
        outcomes.push(run::one(shape, fastrand::Rng::with_seed(seed), mode.schedule_s, w).await);
        if replay || start.elapsed().as_secs() + mode.schedule_s > mode.budget_s {
            break;
        }
        seed = master.u64(..);
    }
    summary(shape.name(), &outcomes);
    outcomes
}

/// `SUMMARY robustness shape=… seeds=N faults=N reads=N requests=N violations=N …`,
/// every figure counted from the runs' histories.
fn summary(shape: &str, outcomes: &[Outcome]) {
    let count = |f: &dyn Fn(&Outcome) -> usize| outcomes.iter().map(f).sum::<usize>();
    let faults = count(&|o| o.history.faults.iter().filter(|f| f.of_daemons()).count());
    let reads = count(&|o| o.history.reads.len());
    let requests = count(&|o| o.history.requests.len());
    let writes = count(&|o| o.history.ops.iter().filter(|op| op.acked()).count());
    let processes = count(&|o| o.history.processes().len());
    let violations = count(&|o| o.violations.len());
    let leaked: u64 = outcomes.iter().map(|o| o.leaked_ports).sum();
    let known_n = count(&|o| {
        o.violations
            .iter()
            .filter(|v| known(shape, v).is_some())
            .count()
    });
    let mut conv: Vec<f64> = outcomes.iter().filter_map(|o| o.converge_s).collect();
    conv.sort_by(f64::total_cmp);
    let p99 = conv.get((conv.len().max(1) - 1) * 99 / 100).copied();
    let never = outcomes.len() - conv.len();
    println!(
        "SUMMARY robustness shape={shape} seeds={} faults={faults} reads={reads} requests={requests} violations={violations} converge_p99_s={} known_findings={known_n} not_converged={never} writes={writes} processes={processes} leaked_ports={leaked}",
        outcomes.len(),
        p99.map_or("none".to_owned(), |s| format!("{s:.1}")),
    );
}

/// Fails on any violation that is not a known open finding.
fn assert_clean(shape: &str, outcomes: &[Outcome]) {
    let mut unknown = Vec::new();
    for o in outcomes {
        for v in &o.violations {
            match known(shape, v) {
                Some(id) => println!(
                    "KNOWN FINDING {id} (seed {}): {} {}",
                    o.seed, v.validator, v.what
                ),
                None => unknown.push(format!(
                    "seed {}: {} {} (report: {:?})",
                    o.seed, v.validator, v.what, o.report
                )),
            }
        }
    }
    let first: Vec<&str> = unknown.iter().take(10).map(String::as_str).collect();
    assert!(
        unknown.is_empty(),
        "{} violation(s) on shape {shape}, the first {}:\n{}",
        unknown.len(),
        first.len(),
        first.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shape_dev() {
    let mut shape = shapes::Dev::start().expect("dev cluster");
    let outcomes = schedules(&mut shape, &Mode::from_env(SHORT_S), &Windows::default()).await;
    assert_clean("dev", &outcomes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shape_redb() {
    let mut shape = shapes::Redb::start(&[]).expect("redb cluster");
    let outcomes = schedules(&mut shape, &Mode::from_env(SHORT_S), &Windows::default()).await;
    assert_clean("redb", &outcomes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shape_etcd() {
    let mut shape = etcd_shape::EtcdHa::start().await.expect("etcd HA cluster");
    let outcomes = schedules(&mut shape, &Mode::from_env(SHORT_S), &Windows::default()).await;
    assert_clean("etcd", &outcomes);
}

/// Every known finding is tracked in RELIABILITY.md by its id.
#[test]
fn known_findings_are_tracked_in_reliability_md() {
    let text = std::fs::read_to_string(harness::workspace_root().join("RELIABILITY.md"))
        .expect("RELIABILITY.md");
    for (shape, validator, id) in KNOWN_FINDINGS {
        assert!(
            text.contains(id),
            "{id} ({shape}, {validator}) is not in RELIABILITY.md"
        );
    }
}
