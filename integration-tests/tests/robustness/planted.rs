//! The validators can fail: each test plants one bug in the daemons (a test-only switch,
//! `E2E_PLANT_BUG`, which only debug builds read: `plugin_api::planted_bug`), runs one
//! schedule of the redb shape, and requires the validator that should catch the bug to
//! fire. The seed is printed; `XCE_TEST_SEED=N` replays it.

use crate::run::{self, Outcome};
use crate::shapes::{Redb, Shape};
use crate::validators::Windows;

/// Seconds of a planted bug's schedule.
const PLANTED_S: u64 = 30;
/// How many schedules a planted bug gets to show itself in. One random schedule can leave
/// a bug nothing to be seen by: in a full `./test.sh` beside two CPU burners, the
/// `stream-skips-revision` schedule ended with no violation at all, where the same seed
/// replayed on a quieter machine is caught (its history was not kept; one way to hide
/// the skipped revisions is a reader that resumes with a reset, whose whole snapshot
/// holds them). Each schedule has its own seed (printed); the test fails when none of
/// them is caught.
const ATTEMPTS: usize = 3;

/// Runs one schedule with `bug` planted; returns the outcome after printing which
/// validators fired.
async fn with_bug(bug: &str, attempt: usize) -> Outcome {
    let mut shape = Redb::start(&[("E2E_PLANT_BUG", bug)]).expect("redb cluster");
    let rng = testkit::seeded_rng(&format!("robustness planted={bug} attempt={attempt}"));
    let o = run::one(&mut shape, rng, PLANTED_S, &Windows::default()).await;
    let fired: std::collections::BTreeSet<&str> =
        o.violations.iter().map(|v| v.validator).collect();
    println!(
        "PLANTED bug={bug} shape={} seed={} fired={fired:?} violations={} report={:?}",
        shape.name(),
        o.seed,
        o.violations.len(),
        o.report
    );
    o
}

/// Runs schedules with `bug` planted until `validator` fires, at most [`ATTEMPTS`].
async fn assert_caught(bug: &str, validator: &str) {
    let mut missed = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let o = with_bug(bug, attempt).await;
        if o.violations.iter().any(|v| v.validator == validator) {
            return;
        }
        let fired: Vec<&str> = o.violations.iter().map(|v| v.validator).collect();
        missed.push(format!("seed {}: fired {fired:?}", o.seed));
    }
    panic!("planted bug {bug} was not caught by {validator} in {ATTEMPTS} schedules: {missed:?}");
}

/// A drain that sends SIGTERM before the announce: readers are handed replicas that
/// already got their SIGTERM (validator 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_drain_sigterm_before_announce_is_caught() {
    let bug = "drain-sigterm-before-announce";
    assert_caught(bug, "1-handed-after-sigterm").await;
}

/// A port released one commit early (when its replica is told to stop, not when it has
/// exited): the next replica given it cannot bind it while the old one drains (validator
/// 2; the redb shape's small port range makes the pool hand it out again soon).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_port_released_early_is_caught() {
    let bug = "port-released-early";
    assert_caught(bug, "2-one-holder-per-port").await;
}

/// An all-services stream that skips the changes of three revisions in four: a reader ends without
/// a service's last change (validator 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_stream_skips_a_revision_is_caught() {
    let bug = "stream-skips-revision";
    assert_caught(bug, "3-all-stream-gap").await;
}
