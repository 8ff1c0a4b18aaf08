//! The host's desired set against what runs: which jobs to launch, stop, or report gone.
//! Pure, so every case is a table test.

use plugin_api::JobId;
use std::collections::{BTreeMap, BTreeSet};

use xce_proto::worker::{Assignment, Desired};

/// Where a job the worker runs is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunState {
    /// Its process runs.
    Running,
    /// It was signalled to stop; its exit will be reported when it happens.
    Stopping,
}

/// One thing to do.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Action {
    /// Start the job (it is wanted and does not run).
    Launch(JobId),
    /// Stop the job's process group (SIGTERM, SIGKILL after the grace); its exit is
    /// reported when it happens.
    Stop(JobId),
    /// The controller wants the job stopped but the worker does not run it (e.g. its exit
    /// was reported before a controller restart): report it `Exited` once.
    ReportGone(JobId),
    /// The controller lists (to run or to stop) a job that already ended here: a job id
    /// runs at most once, so it is not started again; unless its exit is still on its way,
    /// the controller forgot it (its store went back: a restored backup), and the end is
    /// reported again, saying why, so the controller replaces the job instead of waiting
    /// for it forever.
    AlreadyEnded(JobId),
    /// A running job the controller does not list (its store does not know it: a
    /// restored backup, a host declared lost): it stays out of every endpoint, so it is
    /// drained, then stopped.
    Orphan(JobId),
}

/// Compares the desired set with what runs. `ended` holds the jobs this worker already
/// saw end (exited, refused, reported gone): a job runs at most once, so those are never
/// launched again nor reported again. Actions come out sorted by kind, then job.
pub(crate) fn reconcile(
    desired: &[Assignment],
    running: &BTreeMap<JobId, RunState>,
    ended: &BTreeSet<JobId>,
) -> Vec<Action> {
    let mut out = Vec::new();
    let mut listed = BTreeSet::new();
    for a in desired {
        listed.insert(&a.job);
        match (a.desired, running.get(&a.job)) {
            (_, None) if ended.contains(&a.job) => out.push(Action::AlreadyEnded(a.job.clone())),
            (Desired::Run, None) => out.push(Action::Launch(a.job.clone())),
            (Desired::Stop, Some(RunState::Running)) => out.push(Action::Stop(a.job.clone())),
            (Desired::Stop, None) => out.push(Action::ReportGone(a.job.clone())),
            // Running as wanted, already stopping, or already ended.
            _ => {}
        }
    }
    for (job, state) in running {
        if !listed.contains(job) && *state == RunState::Running {
            out.push(Action::Orphan(job.clone()));
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment(job: &str, desired: Desired) -> Assignment {
        Assignment {
            job: job.into(),
            service: "web".into(),
            project: "default".into(),
            replica: 0,
            command: vec!["true".into()].into(),
            readiness: None,
            env: Default::default(),
            grants: plugin_api::Grants::new(),
            desired,
        }
    }

    /// `desired`: `job=run|stop`; `running`: `job=running|stopping`; `ended`: job ids.
    fn check(desired: &str, running: &str, ended: &str, expect: expect_test::Expect) {
        let desired: Vec<_> = desired
            .split_whitespace()
            .map(|kv| {
                let (job, d) = kv.split_once('=').unwrap();
                let d = match d {
                    "run" => Desired::Run,
                    "stop" => Desired::Stop,
                    other => panic!("bad desired {other}"),
                };
                assignment(job, d)
            })
            .collect();
        let running: BTreeMap<_, _> = running
            .split_whitespace()
            .map(|kv| {
                let (job, s) = kv.split_once('=').unwrap();
                let s = match s {
                    "running" => RunState::Running,
                    "stopping" => RunState::Stopping,
                    other => panic!("bad state {other}"),
                };
                (job.to_owned(), s)
            })
            .collect();
        let ended: BTreeSet<_> = ended.split_whitespace().map(str::to_owned).collect();
        let out = reconcile(&desired, &running, &ended)
            .iter()
            .map(|a| format!("{a:?}"))
            .collect::<Vec<_>>()
            .join("\n");
        expect.assert_eq(&out);
    }

    #[test]
    fn launches_wanted_jobs_that_do_not_run() {
        check(
            "j-1=run j-2=run",
            "j-2=running",
            "",
            expect_test::expect![[r#"Launch("j-1")"#]],
        );
    }

    #[test]
    fn never_relaunches_an_ended_job_and_says_so() {
        check(
            "j-1=run",
            "",
            "j-1",
            expect_test::expect![[r#"AlreadyEnded("j-1")"#]],
        );
    }

    #[test]
    fn stops_jobs_asked_to_stop_once() {
        check(
            "j-1=stop j-2=stop",
            "j-1=running j-2=stopping",
            "",
            expect_test::expect![[r#"Stop("j-1")"#]],
        );
    }

    #[test]
    fn reports_a_stop_of_an_unknown_job_as_gone_once() {
        check(
            "j-1=stop j-2=stop",
            "",
            "j-2",
            expect_test::expect![[r#"
                ReportGone("j-1")
                AlreadyEnded("j-2")"#]],
        );
    }

    #[test]
    fn stops_orphans() {
        check(
            "j-2=run",
            "j-1=running j-2=running j-3=stopping",
            "",
            expect_test::expect![[r#"Orphan("j-1")"#]],
        );
    }

    #[test]
    fn a_stopping_job_listed_as_run_is_left_to_finish() {
        check("j-1=run", "j-1=stopping", "", expect_test::expect![""]);
    }

    #[test]
    fn empty_desired_set_stops_everything() {
        check(
            "",
            "j-1=running j-2=running",
            "",
            expect_test::expect![[r#"
                Orphan("j-1")
                Orphan("j-2")"#]],
        );
    }
}
