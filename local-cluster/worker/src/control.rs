//! The tasks that talk to the controller on the agent's behalf: registration (retried
//! until it is accepted), heartbeats, facts reports and the assignments blocking query,
//! which hands each new desired set to the state task.

use plugin_api::HostFacts;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

use super::client::{heartbeat_timeout, sleep_or_answer, CallError, Client};
use super::config::{collect_facts, WorkerPlugins};
use super::identity::Identity;
use super::msg::Msg;
use retry_backoff::Backoff;
use xce_proto::worker::{RegisterRequest, RegisterResponse, RunningJob};

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

/// Takes in an accepted registration: joins the controller's cluster if this worker has
/// none yet, says so, and returns the heartbeat period.
fn registered(identity: &Identity, req: &RegisterRequest, resp: &RegisterResponse) -> Duration {
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
/// another controller). Each waits at most [`heartbeat_timeout`] for its answer.
pub(super) async fn heartbeat_loop(
    client: Client,
    identity: Arc<Identity>,
    plugins: WorkerPlugins,
    mut period: Duration,
    facts: watch::Sender<HostFacts>,
    running: watch::Sender<Vec<RunningJob>>,
) {
    // Only the first failure of a streak is a warning (the period may be short).
    let mut failing = false;
    let mut next = tokio::time::Instant::now() + period;
    loop {
        tokio::time::sleep_until(next).await;
        next = tokio::time::Instant::now() + period;
        match client.heartbeat(heartbeat_timeout(period)).await {
            Ok(()) => {
                if std::mem::take(&mut failing) {
                    tracing::info!("heartbeats go through again");
                }
            }
            Err(e) if e.status().map(|s| s.as_u16()) == Some(404) => {
                tracing::warn!("controller does not know this host; registering again");
                period = register(&client, &identity, &plugins, &facts, &running).await;
                next = tokio::time::Instant::now() + period;
            }
            // Another instance took the host over (this one was gone too long), or the
            // controller is another cluster's: registering again says so, and waits.
            Err(e)
                if matches!(e, CallError::WrongCluster { .. })
                    || e.status().map(|s| s.as_u16()) == Some(409) =>
            {
                tracing::error!(error = %e, "heartbeat refused; registering again");
                period = register(&client, &identity, &plugins, &facts, &running).await;
                next = tokio::time::Instant::now() + period;
            }
            // The credential is refused now (the tokens file changed): registering again
            // says why, once per retry, and backs off, instead of a refused heartbeat
            // every period.
            Err(e) if e.refused() => {
                tracing::debug!(error = %e, "heartbeat refused; registering again");
                period = register(&client, &identity, &plugins, &facts, &running).await;
                next = tokio::time::Instant::now() + period;
            }
            Err(e) if failing => tracing::debug!(error = %e, "heartbeat failed"),
            Err(e) => {
                failing = true;
                tracing::warn!(error = %e, "heartbeat failed");
            }
        }
    }
}

/// Re-reads the facts every `interval` and reports them when they differ from the last
/// report (accepted or refused: a refused report is not repeated until the facts change).
pub(super) async fn facts_loop(
    client: Client,
    plugins: WorkerPlugins,
    interval: Duration,
    accepted: watch::Sender<HostFacts>,
) {
    let mut last_sent = accepted.borrow().clone();
    loop {
        tokio::time::sleep(interval).await;
        let facts = match collect_facts(&plugins).await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "re-reading host facts failed; keeping the last ones");
                continue;
            }
        };
        if facts == last_sent {
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
/// leader), so it does not lag a takeover by a whole backoff.
pub(super) async fn assignments_loop(client: Client, owner: mpsc::Sender<Msg>) {
    let mut index = 0;
    let mut backoff = Backoff::jittered(Duration::from_millis(200), Duration::from_secs(10));
    let mut answers = client.answers();
    loop {
        answers.borrow_and_update();
        match client.assignments(index).await {
            Ok(a) => {
                backoff.reset();
                // Any other index is news; a lower one means the controller started over.
                if a.index != index {
                    index = a.index;
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
