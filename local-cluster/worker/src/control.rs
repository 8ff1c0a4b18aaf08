//! The tasks that talk to the controller on the agent's behalf: registration (retried
//! until it is accepted), heartbeats, facts reports and the assignments blocking query,
//! which hands each new desired set to the state task.

use plugin_api::{HostFacts, JobId};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify};

use super::client::{heartbeat_timeout, sleep_or_answer, CallError, Client};
use super::config::{collect_facts, WorkerPlugins};
use super::events::Outbox;
use super::identity::Identity;
use super::msg::Msg;
use retry_backoff::Backoff;
use xce_proto::worker::{
    Heartbeat, HeartbeatAnswer, RegisterRequest, RegisterResponse, RunningJob,
};

/// What the worker has reported, as the state task publishes it, and how it reports
/// again: the heartbeats assert it (their digests) and re-send what the controller holds
/// otherwise.
#[derive(Clone)]
pub(super) struct Reported {
    /// The facts the controller last accepted.
    pub(super) facts: watch::Sender<HostFacts>,
    /// What runs, for a registration.
    pub(super) running: watch::Sender<Vec<RunningJob>>,
    /// The readiness of every job that runs and is not being stopped.
    pub(super) ready: watch::Sender<BTreeMap<JobId, bool>>,
    /// The event queue: a readiness re-sent goes through it, in order with transitions.
    pub(super) outbox: Arc<Outbox>,
    /// Wakes the facts loop to report the facts again.
    pub(super) resend_facts: Arc<Notify>,
    /// The assignments the worker holds, asserted on each heartbeat.
    pub(super) poll: Arc<AssignmentsPoll>,
}

/// What the assignments loop holds, shared with the heartbeats: the index of the last
/// assignments received, and a way to make the loop ask again at once. A heartbeat whose
/// answer says the host's index is another (the query missed a change: it waits on a
/// connection that died in a partition, for up to its 30 s wait plus the call timeout),
/// or a registration (the host may have been lost meanwhile), makes it ask again on a
/// new connection, so the worker hears of the change (stops its orphans) within a
/// heartbeat. Nothing more is sent while the query is in sync.
#[derive(Debug, Default)]
pub(super) struct AssignmentsPoll {
    /// The index received last; `0` before the first.
    index: std::sync::atomic::AtomicU64,
    again: Notify,
}

impl AssignmentsPoll {
    fn held(&self) -> Option<u64> {
        Some(self.index.load(std::sync::atomic::Ordering::SeqCst)).filter(|i| *i != 0)
    }

    fn received(&self, index: u64) {
        self.index.store(index, std::sync::atomic::Ordering::SeqCst);
    }

    /// The query in flight is given up and asked again at once.
    fn ask_again(&self) {
        self.again.notify_one();
    }
}

/// The smallest heartbeat period the worker accepts from the controller.
const MIN_HEARTBEAT: Duration = Duration::from_millis(100);

/// Registers with the controller, retrying with capped backoff until it answers.
/// Returns the heartbeat period. Joins the controller's cluster if this worker has none
/// yet. A refusal (another live worker holds the host, or the controller serves another
/// cluster) is retried the same way: nothing is launched or stopped meanwhile, as
/// assignments are only asked for once registered.
pub(super) async fn register(
    client: &Client,
    identity: &Identity,
    plugins: &WorkerPlugins,
    facts: &watch::Sender<HostFacts>,
    running: &watch::Sender<Vec<RunningJob>>,
) -> Duration {
    let mut backoff = Backoff::jittered(Duration::from_millis(200), Duration::from_secs(10));
    // A refused credential needs an operator: retried slower, up to twice a minute.
    let mut refused = Backoff::jittered(REFUSED_BACKOFF_START, REFUSED_BACKOFF_MAX);
    loop {
        let req = RegisterRequest {
            facts: facts.borrow().clone(),
            running: running.borrow().clone(),
            wants_session: true,
        };
        let e = match client.register(&req).await {
            Ok(resp) => return registered(identity, &req, &resp),
            Err(e) => e,
        };
        let wait = if e.version_skew() {
            // Retried slowly: the fix is an upgrade (of this worker, or of the controller
            // when the worker went first), after which this worker registers at once.
            let wait = refused.next_pause();
            tracing::error!(
                problem = %e.message(),
                retry_in = %format_args!("{:.1}s", wait.as_secs_f64()),
                "controller refused this worker's protocol version; the replicas keep running untouched"
            );
            wait
        } else if e.refused() {
            let wait = refused.next_pause();
            tracing::error!(
                problem = %e,
                fix = refusal_fix(&e),
                retry_in = %format_args!("{:.1}s", wait.as_secs_f64()),
                "controller refused the worker credential"
            );
            wait
        } else {
            refused.reset();
            let wait = backoff.next_pause();
            if explain_failure(&e, identity, wait) == Retry::WithFreshFacts {
                refresh_facts(plugins, facts).await;
            }
            wait
        };
        tokio::time::sleep(wait).await;
    }
}

/// Takes in an accepted registration: keeps the session it hands out, joins the
/// controller's cluster if this worker has none yet, says so, and returns the heartbeat
/// period.
fn registered(identity: &Identity, req: &RegisterRequest, resp: &RegisterResponse) -> Duration {
    let session = match (&resp.session, identity.session()) {
        (Some(secret), _) => {
            if let Err(e) = identity.set_session(secret) {
                tracing::error!(error = %e, "cannot keep the worker session on disk; a restart of this worker will wait for the host's session to expire (unreachable_after)")
            }
            "new"
        }
        (None, Some(_)) => "kept",
        (None, None) => "none (a controller that hands out none)",
    };
    if let Some(cluster) = &resp.cluster {
        match identity.join(cluster) {
            Ok(true) => {
                tracing::info!(cluster = %cluster, "joined the cluster; this worker serves it from now on")
            }
            Ok(false) => {}
            // Remembered in memory for this run; the next start joins again.
            Err(e) => {
                tracing::error!(cluster = %cluster, error = %e, "cannot remember the cluster joined")
            }
        }
    }
    tracing::info!(
        running = req.running.len(),
        heartbeat_ms = resp.heartbeat_ms,
        cluster = %resp.cluster.as_deref().unwrap_or("none"),
        instance = %identity.instance(),
        session,
        "registered with the controller"
    );
    Duration::from_millis(resp.heartbeat_ms).max(MIN_HEARTBEAT)
}

/// How the next registration attempt goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// With the same facts.
    AsItWas,
    /// With facts read again: the controller refused the registration as invalid, and
    /// the facts may have been the problem.
    WithFreshFacts,
}

/// Logs why a registration failed (its credential accepted), the retry `wait` with it.
fn explain_failure(e: &CallError, identity: &Identity, wait: Duration) -> Retry {
    match e.status().map(|s| s.as_u16()) {
        _ if matches!(e, CallError::WrongCluster { .. }) => {
            tracing::error!(error = %e, retry_in = ?wait, "registration refused: the controller belongs to another cluster; the replicas keep running untouched")
        }
        Some(409) if e.code().as_deref() == Some("host_taken") => {
            tracing::error!(error = %e.message(), instance = %identity.instance(), retry_in = ?wait, "registration refused: another live worker holds this host; nothing is launched or stopped until it is gone")
        }
        Some(409) if e.code().as_deref() == Some("wrong_cluster") => {
            tracing::error!(error = %e.message(), retry_in = ?wait, "registration refused: the controller belongs to another cluster; the replicas keep running untouched")
        }
        Some(400) => {
            let body = match e {
                CallError::Status { body, .. } => body.as_str(),
                _ => "",
            };
            for problem in problems(body) {
                tracing::error!(%problem, retry_in = ?wait, "controller refused the registration");
            }
            return Retry::WithFreshFacts;
        }
        _ => {
            tracing::warn!(error = %e, retry_in = ?wait, "registration failed; retrying")
        }
    }
    Retry::AsItWas
}

/// Reads the host facts again into `facts` (the last ones stay when that fails).
async fn refresh_facts(plugins: &WorkerPlugins, facts: &watch::Sender<HostFacts>) {
    match collect_facts(plugins).await {
        Ok(fresh) => {
            facts.send_replace(fresh);
        }
        Err(e) => tracing::warn!(error = %e, "re-reading host facts failed"),
    }
}

/// The first and the longest pause between registrations the controller refused (401,
/// 403): exponential between them.
const REFUSED_BACKOFF_START: Duration = Duration::from_secs(1);
const REFUSED_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// What the operator changes to fix a refused credential, by the controller's error code.
fn refusal_fix(e: &CallError) -> &'static str {
    match (e.status().map(|s| s.as_u16()), e.code().as_deref()) {
        (_, Some("no_worker_entry")) => {
            "add a [[worker]] entry for this host, with this worker's credential as its secret, to the controller's tokens file and send the controller SIGHUP (it re-reads the file)"
        }
        (Some(401), _) => {
            "set `credential` in this worker's config to the secret of this host's [[worker]] entry in the controller's tokens file"
        }
        _ => "set `credential` to this host's own [[worker]] secret, not another host's or a user token",
    }
}

/// Heartbeats every `period`, counted from the start of the previous one (a beat that
/// timed out on a frozen controller is followed at once by the next, which starts at
/// another controller). Each waits at most [`heartbeat_timeout`] for its answer, and
/// asserts what the worker has reported ([`Heartbeat`]): when the controller holds
/// something else, it is reported again ([`report_again`]).
pub(super) async fn heartbeat_loop(
    client: Client,
    identity: Arc<Identity>,
    plugins: WorkerPlugins,
    mut period: Duration,
    reported: Reported,
) {
    // Only the first failure of a streak is a warning (the period may be short).
    let mut failing = false;
    let mut next = tokio::time::Instant::now() + period;
    loop {
        tokio::time::sleep_until(next).await;
        next = tokio::time::Instant::now() + period;
        let beat = {
            let facts = reported.facts.borrow();
            let ready = reported.ready.borrow();
            let mut beat = Heartbeat::of(&facts, ready.iter().map(|(j, r)| (j.as_str(), *r)));
            beat.assignments = reported.poll.held();
            beat
        };
        let e = match client.heartbeat(heartbeat_timeout(period), &beat).await {
            Ok(answer) => {
                if std::mem::take(&mut failing) {
                    tracing::info!("heartbeats go through again");
                }
                if let Some(a) = answer {
                    report_again(&reported, a);
                }
                continue;
            }
            Err(e) => e,
        };
        if !must_register(&e, failing) {
            failing = true;
            continue;
        }
        let (facts, running) = (&reported.facts, &reported.running);
        period = register(&client, &identity, &plugins, facts, running).await;
        // The host may have been lost meanwhile (its jobs now orphans to stop): the
        // assignments query may wait on a connection that died.
        reported.poll.ask_again();
        next = tokio::time::Instant::now() + period;
    }
}

/// Whether a failed heartbeat means registering again (logged), or retrying it (logged
/// as a warning for the first failure of a streak, `failing` says whether one is on).
fn must_register(e: &CallError, failing: bool) -> bool {
    let code = e.code();
    match e.status().map(|s| s.as_u16()) {
        Some(404) => {
            tracing::warn!("controller does not know this host; registering again");
        }
        // Another instance took the host over (this one was gone too long), or the
        // controller is another cluster's: registering again says so, and waits.
        Some(409) => tracing::error!(error = %e, "heartbeat refused; registering again"),
        _ if matches!(e, CallError::WrongCluster { .. }) => {
            tracing::error!(error = %e, "heartbeat refused; registering again")
        }
        // The session is not the host's any more (another worker took the host over,
        // or the controller's store was restored): a registration gets a new one once
        // the host is free.
        Some(401)
            if matches!(
                code.as_deref(),
                Some("session_required" | "session_invalid")
            ) =>
        {
            tracing::warn!(error = %e.message(), "heartbeat refused for its worker session; registering again")
        }
        // The credential is refused now (the tokens file changed): registering again
        // says why, once per retry, and backs off, instead of a refused heartbeat every
        // period.
        _ if e.refused() => tracing::debug!(error = %e, "heartbeat refused; registering again"),
        _ if failing => {
            tracing::debug!(error = %e, "heartbeat failed");
            return false;
        }
        _ => {
            tracing::warn!(error = %e, "heartbeat failed");
            return false;
        }
    }
    true
}

/// The controller holds another state than the heartbeat asserted: the facts are
/// reported again (by the facts loop), and a readiness event is queued for each job whose
/// readiness the controller holds differently, unless one is on its way. A job only one
/// side lists is starting or ending: its own events tell. What differs is most likely a
/// forged report (a stolen credential and session), or one that crossed the heartbeat.
fn report_again(reported: &Reported, answer: HeartbeatAnswer) {
    if answer.facts_differ {
        tracing::warn!(
            "the controller holds other host facts than this worker reported; reporting them again"
        );
        reported.resend_facts.notify_one();
    }
    if let Some(index) = answer.assignments {
        tracing::warn!(
            held = ?reported.poll.held(),
            index,
            "the controller holds newer assignments than this worker received (its query missed them); asking again"
        );
        reported.poll.ask_again();
    }
    let Some(held) = answer.ready else {
        return;
    };
    let ours = reported.ready.borrow().clone();
    for (job, ready) in &ours {
        if held.get(job).is_some_and(|h| h != ready)
            && reported.outbox.reassert_readiness(job, *ready)
        {
            tracing::warn!(job = %job, ready, "the controller holds another readiness of the job than this worker reported; reporting it again");
        }
    }
}

/// Re-reads the facts every `interval` and reports them when they differ from the last
/// report (accepted or refused: a refused report is not repeated until the facts change),
/// or at once, whatever they are, when `resend` is notified (the controller holds others).
pub(super) async fn facts_loop(
    client: Client,
    plugins: WorkerPlugins,
    interval: Duration,
    accepted: watch::Sender<HostFacts>,
    resend: Arc<Notify>,
) {
    let mut last_sent = accepted.borrow().clone();
    loop {
        let again = tokio::select! {
            () = tokio::time::sleep(interval) => false,
            () = resend.notified() => true,
        };
        let facts = match collect_facts(&plugins).await {
            Ok(f) => f,
            // The controller holds others than the last accepted: those, then.
            Err(_) if again => accepted.borrow().clone(),
            Err(e) => {
                tracing::warn!(error = %e, "re-reading host facts failed; keeping the last ones");
                continue;
            }
        };
        if facts == last_sent && !again {
            continue;
        }
        match client.put_facts(&facts).await {
            Ok(()) => {
                tracing::info!(ip_addr = %facts.ip_addr.map_or_else(|| "none".to_owned(), |ip| ip.to_string()), "host facts changed; reported");
                last_sent = facts.clone();
                accepted.send_replace(facts);
            }
            Err(CallError::Status { status, body }) if status.as_u16() == 400 => {
                for problem in problems(&body) {
                    tracing::error!(%problem, "controller refused the host facts");
                }
                last_sent = facts;
            }
            Err(e) if e.refused() => {
                tracing::debug!(error = %e, "reporting host facts refused; will retry")
            }
            Err(e) => tracing::warn!(error = %e, "reporting host facts failed; will retry"),
        }
    }
}

/// The problems of an `ApiError` body (`{"error": {"message", "details": [...]}}`), or the
/// raw body when it is not one.
fn problems(body: &str) -> Vec<String> {
    let Some(b) = plugin_api::ErrorBody::parse(body.as_bytes()) else {
        return vec![body.to_owned()];
    };
    if !b.error.details.is_empty() {
        return b.error.details.iter().map(|p| p.to_string()).collect();
    }
    if b.error.message.is_empty() {
        vec![body.to_owned()]
    } else {
        vec![b.error.message]
    }
}

/// The blocking query loop: one outstanding request; the controller answers when the
/// host's desired set changes (or the wait runs out). After a failure it backs off, but
/// retries at once when a controller answers another call (the heartbeats found the new
/// leader), so it does not lag a takeover by a whole backoff. A query the heartbeats
/// found out of date is given up and asked again at once ([`AssignmentsPoll`]).
pub(super) async fn assignments_loop(
    client: Client,
    owner: mpsc::Sender<Msg>,
    poll: Arc<AssignmentsPoll>,
) {
    let mut index = 0;
    let mut backoff = Backoff::jittered(Duration::from_millis(200), Duration::from_secs(10));
    let mut answers = client.answers();
    loop {
        answers.borrow_and_update();
        let answered = tokio::select! {
            r = client.assignments(index) => r,
            // Dropping the query drops its connection: the next one opens another.
            () = poll.again.notified() => {
                tracing::debug!(index, "assignments query given up; asking again");
                continue;
            }
        };
        match answered {
            Ok(a) => {
                backoff.reset();
                // Any other index is news; a lower one means the controller started over.
                if a.index != index {
                    index = a.index;
                    poll.received(index);
                    if owner.send(Msg::Assignments(a)).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let wait = backoff.next_pause();
                if e.refused() {
                    // The registration loop the heartbeats fall back to says why.
                    tracing::debug!(error = %e, retry_in = ?wait, "assignments query refused");
                } else {
                    tracing::warn!(error = %e, retry_in = ?wait, "assignments query failed");
                }
                if sleep_or_answer(wait, &mut answers).await {
                    backoff.reset();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xce_proto::worker::WorkerEvent;

    /// A heartbeat's answer says what the controller holds otherwise: the facts are
    /// reported again, and a readiness event is queued for exactly the jobs whose
    /// readiness differs and is not on its way already.
    #[tokio::test]
    async fn what_the_controller_holds_otherwise_is_reported_again() {
        let reported = Reported {
            facts: watch::Sender::new(HostFacts::default()),
            running: watch::Sender::new(Vec::new()),
            ready: watch::Sender::new(
                [("j-1", true), ("j-2", false), ("j-3", true), ("j-5", true)]
                    .map(|(j, r)| (j.to_owned(), r))
                    .into(),
            ),
            outbox: Outbox::new(),
            resend_facts: Arc::new(Notify::new()),
            poll: Arc::new(AssignmentsPoll::default()),
        };
        // j-3 became ready just now: its event is on its way.
        reported.outbox.push(WorkerEvent::Readiness {
            job: "j-3".into(),
            ready: true,
            probe: None,
        });
        let held = [
            ("j-1", false),
            ("j-2", false),
            ("j-3", false),
            ("j-4", true),
        ]
        .map(|(j, r)| (j.to_owned(), r))
        .into();
        report_again(
            &reported,
            HeartbeatAnswer {
                facts_differ: true,
                ready: Some(held),
                assignments: None,
            },
        );
        // j-1 (forged not ready) is re-sent; j-2 agrees; j-3's event is queued; j-4 and
        // j-5 are listed by one side only.
        let queued = |jobs: &[(&str, bool)]| -> Vec<WorkerEvent> {
            jobs.iter()
                .map(|(j, r)| WorkerEvent::Readiness {
                    job: (*j).into(),
                    ready: *r,
                    probe: None,
                })
                .collect()
        };
        assert_eq!(
            reported.outbox.queued(),
            queued(&[("j-3", true), ("j-1", true)])
        );
        let woken = tokio::time::timeout(Duration::ZERO, reported.resend_facts.notified()).await;
        assert!(woken.is_ok(), "the facts loop was not told to report again");
        // In sync: nothing more.
        report_again(&reported, HeartbeatAnswer::default());
        assert_eq!(reported.outbox.queued().len(), 2);
        let woken = tokio::time::timeout(Duration::ZERO, reported.resend_facts.notified()).await;
        assert!(woken.is_err());
    }

    /// A heartbeat answer naming the host's assignment index makes the assignments loop
    /// ask again (finding 3: its query waited on a connection that died).
    #[tokio::test]
    async fn an_answer_naming_other_assignments_makes_the_query_ask_again() {
        let reported = Reported {
            facts: watch::Sender::new(HostFacts::default()),
            running: watch::Sender::new(Vec::new()),
            ready: watch::Sender::new(BTreeMap::new()),
            outbox: Outbox::new(),
            resend_facts: Arc::new(Notify::new()),
            poll: Arc::new(AssignmentsPoll::default()),
        };
        reported.poll.received(7);
        assert_eq!(reported.poll.held(), Some(7));
        let asked = |p: &AssignmentsPoll| {
            let notified = p.again.notified();
            tokio::pin!(notified);
            notified.as_mut().enable()
        };
        report_again(&reported, HeartbeatAnswer::default());
        assert!(!asked(&reported.poll), "asked again while in sync");
        report_again(
            &reported,
            HeartbeatAnswer {
                assignments: Some(9),
                ..HeartbeatAnswer::default()
            },
        );
        assert!(asked(&reported.poll), "not asked again");
    }

    fn check(body: &str, expect: expect_test::Expect) {
        expect.assert_eq(&problems(body).join("\n"));
    }

    #[test]
    fn lists_every_problem_of_a_refusal() {
        check(
            r#"{"error": {"code": "invalid", "message": "bad facts", "details": [
                {"field": "ip_addr", "reason": "not an address of the host"},
                {"field": "sections.ports.range", "reason": "empty"}]}}"#,
            expect_test::expect![[r#"
                ip_addr: not an address of the host
                sections.ports.range: empty"#]],
        );
        check(
            r#"{"error": {"code": "invalid", "message": "bad facts", "details": []}}"#,
            expect_test::expect!["bad facts"],
        );
        check("oops", expect_test::expect!["oops"]);
    }
}
