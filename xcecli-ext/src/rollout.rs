//! `--wait` of `service submit|scale|restart`: follows the service detail with blocking
//! queries until the rollout is complete, has failed (or failed and was reverted), or the
//! timeout runs out.
//!
//! Like `service endpoints --watch`, the loop is one blocking query after another
//! (`GET /v1/services/{name}?index=<X-Xce-Index>&wait=…`): the apiserver answers when the
//! service changed, so nothing is polled. Progress lines go to stderr, one per change of
//! the line itself (an index change that moves no counter prints nothing), so that stdout
//! holds only the command's result: a script can read it, a person sees both.
//!
//! Which rollout counts: the one of the generation the command's own answer reported, or
//! a later one (someone else's change, or the automatic revert of ours). A complete state
//! of an older generation cannot end the wait.

use crate::client::{Answer, Client, ServiceRef};
use crate::endpoints::{until, BACKOFF_MAX, BACKOFF_START, MIN_UNCHANGED_INTERVAL};
use crate::error::{CliError, ErrorKind};
use crate::format;
use crate::io::{warn, write_out, Io};
use crate::model::{Rollout, RolloutState, ServiceDetail};
use retry_backoff::Backoff;
use std::time::Duration;
use tokio::time::Instant;

/// How long one blocking query may wait on the server (below its 10m cap); a shorter
/// `--timeout` shortens it.
const BLOCK_WAIT: Duration = Duration::from_secs(300);

/// What one detail says about the rollout being followed.
#[derive(Debug)]
enum Verdict {
    /// Not done yet.
    Moving,
    /// Complete at a generation at least the one we started at.
    Complete,
    /// Failed or reverted: the error to exit with (6).
    Failed(CliError),
}

/// Follows the rollout of `svc` from `first` (the answer of the command that started it)
/// until it ends or `timeout` runs out.
///
/// Every query names the project: the one the command picked, else the one `first`
/// reports, so the wait stays on this service even when another of the caller's projects
/// gets a service of the same name meanwhile (an apiserver from before projects reports
/// none, and then the name alone is sent). Hints name `--project` only when the command
/// picked one.
pub(crate) async fn follow(
    client: &Client,
    io: &mut Io,
    svc: ServiceRef<'_>,
    first: Answer<ServiceDetail>,
    timeout: Duration,
) -> Result<(), CliError> {
    let mut follower = Follower::new(client, svc, first, timeout);
    while !follower.judge(io)? {
        follower.next(io).await?;
    }
    Ok(())
}

/// A rollout being followed: what the queries name, and the last answer.
struct Follower<'a> {
    client: &'a Client,
    /// The service's name.
    name: &'a str,
    /// The project the command picked: hints name `--project` only then.
    picked: Option<&'a str>,
    /// The project every query names.
    project: Option<String>,
    deadline: Instant,
    timeout: Duration,
    /// The generation of the command's own answer: an older rollout does not count.
    since: u64,
    /// The index of the last answer; the next blocking query waits for a change from it.
    index: u64,
    /// The last answer.
    detail: ServiceDetail,
    /// The last progress line written (one is written only when it changes).
    last_line: String,
    /// Retry delays while the apiserver is away or failing.
    backoff: Backoff,
    /// The last query failed and is being retried.
    failing: bool,
}

// === impl Follower ===

impl<'a> Follower<'a> {
    fn new(
        client: &'a Client,
        svc: ServiceRef<'a>,
        first: Answer<ServiceDetail>,
        timeout: Duration,
    ) -> Self {
        let reported = Some(first.value.project.to_string()).filter(|p| !p.is_empty());
        Follower {
            client,
            name: svc.name,
            picked: svc.project,
            project: svc.project.map(str::to_owned).or(reported),
            deadline: Instant::now() + timeout,
            timeout,
            since: first.value.generation,
            index: first.index.unwrap_or(first.value.index),
            detail: first.value,
            last_line: String::new(),
            backoff: Backoff::new(BACKOFF_START, BACKOFF_MAX),
            failing: false,
        }
    }

    /// Shows the progress of the last answer and judges it: `true` when the rollout is
    /// complete (said on stdout), an error when it failed.
    fn judge(&mut self, io: &mut Io) -> Result<bool, CliError> {
        let rollout = rollout_of(&self.detail)?;
        let line = format::progress(&self.detail, rollout);
        if line != self.last_line {
            io.stderr.write_all(line.as_bytes()).map_err(CliError::io)?;
            io.stderr.flush().map_err(CliError::io)?;
            self.last_line = line;
        }
        match verdict(&self.detail, rollout, self.since, self.picked) {
            Verdict::Complete => {
                write_out(io, &format::complete(&self.detail, rollout)).map(|_| true)
            }
            Verdict::Failed(e) => Err(e),
            Verdict::Moving => Ok(false),
        }
    }

    /// One blocking query for a newer answer. A failing apiserver is retried after a
    /// pause (the answer stays the last one).
    async fn next(&mut self, io: &mut Io) -> Result<(), CliError> {
        let wait = BLOCK_WAIT.min(self.deadline.saturating_duration_since(Instant::now()));
        let sent = Instant::now();
        let query = ServiceRef {
            name: self.name,
            project: self.project.as_deref(),
        };
        let read = self.client.service(query, Some((self.index, wait)));
        let Some(result) = until(Some(self.deadline), read).await else {
            return Err(self.timed_out());
        };
        let answer = match result {
            Ok(a) => a,
            Err(e) if e.kind == ErrorKind::NotFound => {
                return Err(gone(self.name, self.project.as_deref()))
            }
            // The apiserver restarting or failing over: keep the index and ask again.
            Err(e) if matches!(e.kind, ErrorKind::Server | ErrorKind::Unreachable) => {
                return self.retry_later(io, e).await;
            }
            Err(e) => return Err(e),
        };
        if std::mem::take(&mut self.failing) {
            self.backoff.reset();
            warn(
                io,
                &format!(
                    "the apiserver at {} answers again",
                    self.client.api().as_str().trim_end_matches('/')
                ),
            )?;
        }
        let next = answer.index.unwrap_or(answer.value.index);
        let unchanged = next == self.index;
        self.index = next;
        self.detail = answer.value;
        // A server that ignores `wait` must not make us spin.
        let elapsed = sent.elapsed();
        if unchanged && elapsed < MIN_UNCHANGED_INTERVAL {
            self.sleep(MIN_UNCHANGED_INTERVAL - elapsed).await?;
        }
        Ok(())
    }

    /// A failed query that is retried: said on stderr, then the backoff is waited out.
    async fn retry_later(&mut self, io: &mut Io, e: CliError) -> Result<(), CliError> {
        let pause = self.backoff.next_pause();
        warn(
            io,
            &format!(
                "{}; retrying in {} (resuming from index {})",
                e.message,
                humantime::format_duration(pause),
                self.index
            ),
        )?;
        self.failing = true;
        self.sleep(pause).await
    }

    /// Sleeps `pause`, unless the deadline comes first.
    async fn sleep(&self, pause: Duration) -> Result<(), CliError> {
        until(Some(self.deadline), tokio::time::sleep(pause))
            .await
            .ok_or_else(|| self.timed_out())
    }

    fn timed_out(&self) -> CliError {
        timed_out(&self.detail, self.timeout, self.picked)
    }
}

/// The detail's rollout; an apiserver from before rollouts has none, and then there is
/// nothing to wait for.
fn rollout_of(detail: &ServiceDetail) -> Result<&Rollout, CliError> {
    detail.rollout.as_ref().ok_or_else(|| {
        CliError::new(
            ErrorKind::Server,
            format!(
                "the apiserver reports no rollout for service {}: cannot --wait",
                detail.name
            ),
        )
        .with_hint("the apiserver may be older than this xcecli; run the command without --wait")
    })
}

fn verdict(
    detail: &ServiceDetail,
    rollout: &Rollout,
    since: u64,
    project: Option<&str>,
) -> Verdict {
    if rollout.generation < since {
        // An answer from before our change reached the view (an apiserver that lags):
        // its state is not about our rollout.
        return Verdict::Moving;
    }
    let reason = match rollout.reason.as_deref().map(str::trim) {
        Some(r) if !r.is_empty() => format!(": {}", format::one_line(r)),
        _ => String::new(),
    };
    let hint = format!(
        "`{}` shows the replicas and their generations",
        format::status_command(&detail.name, project)
    );
    match rollout.state {
        RolloutState::Complete => Verdict::Complete,
        RolloutState::Progressing | RolloutState::Unknown => Verdict::Moving,
        RolloutState::Failed => Verdict::Failed(
            CliError::new(
                ErrorKind::RolloutFailed,
                format!(
                    "rollout of service {} to generation {} failed{reason}",
                    detail.name, rollout.generation
                ),
            )
            .with_hint(hint),
        ),
        RolloutState::Reverted => Verdict::Failed(
            CliError::new(
                ErrorKind::RolloutFailed,
                format!(
                    "rollout of service {} failed and was reverted (generation {}){reason}",
                    detail.name, rollout.generation
                ),
            )
            .with_hint(hint),
        ),
    }
}

/// `--timeout` ran out: exit 3. The rollout itself goes on.
fn timed_out(detail: &ServiceDetail, timeout: Duration, project: Option<&str>) -> CliError {
    let mut message = format!(
        "rollout of service {} not complete after {}",
        detail.name,
        humantime::format_duration(timeout)
    );
    let mut details = Vec::new();
    if let Some(r) = &detail.rollout {
        message.push_str(&format!(
            ": generation {} has {}/{} updated, {} ready, {} outdated",
            r.generation, r.updated, detail.replicas, r.ready, r.outdated
        ));
        if let Some(reason) = r.reason.as_deref().filter(|r| !r.trim().is_empty()) {
            details.push(format!("waiting: {}", format::one_line(reason)));
        }
    }
    CliError::new(ErrorKind::Timeout, message)
        .with_details(details)
        .with_hint(format!(
            "the rollout goes on; `{}` shows where it is",
            format::status_command(&detail.name, project)
        ))
}

/// The service went away while we waited: exit 4, as for any service not found.
fn gone(name: &str, project: Option<&str>) -> CliError {
    let service = match project {
        Some(p) => format!("service {name} in project {p}"),
        None => format!("service {name}"),
    };
    CliError::new(
        ErrorKind::NotFound,
        format!("{service} is gone (stopped, or no longer visible) while waiting for its rollout"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    /// `json`: a service detail; prints the progress line and the verdict for a wait that
    /// started at generation `since`.
    fn check(json: &str, since: u64, expect: Expect) {
        let detail: ServiceDetail = serde_json::from_str(json).unwrap();
        let actual = match rollout_of(&detail) {
            Err(e) => format!("exit {}: {e}", e.exit_code()),
            Ok(r) => {
                let verdict = match verdict(&detail, r, since, None) {
                    Verdict::Moving => "moving".to_owned(),
                    Verdict::Complete => format!("complete: {}", format::complete(&detail, r)),
                    Verdict::Failed(e) => format!("exit {}: {e}\n", e.exit_code()),
                };
                format!("{}{verdict}", format::progress(&detail, r))
            }
        };
        expect.assert_eq(&actual);
    }

    fn detail(generation: u64, rollout: &str) -> String {
        format!(
            r#"{{"name":"web","project":"default","replicas":3,"state":"active","index":42,
                "generation":{generation},"rollout":{rollout},"profile":{{}},"pending":[],"jobs":[]}}"#
        )
    }

    #[test]
    fn verdicts() {
        check(
            &detail(
                2,
                r#"{"generation":2,"state":"progressing","updated":2,"ready":3,"outdated":1,"reason":null}"#,
            ),
            2,
            expect![[r#"
                generation 2: 2/3 updated, 3 ready, 1 outdated
                moving"#]],
        );
        check(
            &detail(
                2,
                r#"{"generation":2,"state":"progressing","updated":1,"ready":3,"outdated":2,
                    "reason":"port http/tcp 8080 is fixed and max_unavailable is 0:\nno surge possible"}"#,
            ),
            2,
            expect![[r#"
                generation 2: 1/3 updated, 3 ready, 2 outdated
                  waiting: port http/tcp 8080 is fixed and max_unavailable is 0:\nno surge possible
                moving"#]],
        );
        check(
            &detail(
                2,
                r#"{"generation":2,"state":"complete","updated":3,"ready":3,"outdated":0,"reason":null}"#,
            ),
            2,
            expect![[r#"
                generation 2: 3/3 updated, 3 ready, 0 outdated
                complete: service web: generation 2 complete, 3 of 3 replicas ready
            "#]],
        );
        // A complete state of an older generation is not ours.
        check(
            &detail(
                1,
                r#"{"generation":1,"state":"complete","updated":3,"ready":3,"outdated":0}"#,
            ),
            2,
            expect![[r#"
                generation 1: 3/3 updated, 3 ready, 0 outdated
                moving"#]],
        );
        check(
            &detail(
                2,
                r#"{"generation":2,"state":"failed","updated":1,"ready":2,"outdated":2,
                    "reason":"no progress for 5m"}"#,
            ),
            2,
            expect![[r#"
                generation 2: 1/3 updated, 2 ready, 2 outdated
                exit 6: error: rollout of service web to generation 2 failed: no progress for 5m
                hint: `xcecli service status web` shows the replicas and their generations
            "#]],
        );
        // The revert of our generation 2 is generation 3: still our rollout.
        check(
            &detail(
                3,
                r#"{"generation":3,"state":"reverted","updated":0,"ready":3,"outdated":1,
                    "reason":"generation 2: replica 0 exited 3 times; restored the profile of generation 1"}"#,
            ),
            2,
            expect![[r#"
                generation 3: 0/3 updated, 3 ready, 1 outdated
                exit 6: error: rollout of service web failed and was reverted (generation 3): generation 2: replica 0 exited 3 times; restored the profile of generation 1
                hint: `xcecli service status web` shows the replicas and their generations
            "#]],
        );
        // A state this client does not know yet keeps it waiting.
        check(
            &detail(
                2,
                r#"{"generation":2,"state":"paused","updated":1,"ready":3,"outdated":2}"#,
            ),
            2,
            expect![[r#"
                generation 2: 1/3 updated, 3 ready, 2 outdated
                moving"#]],
        );
        check(
            r#"{"name":"web","replicas":3,"index":42}"#,
            1,
            expect![[r#"
                exit 1: error: the apiserver reports no rollout for service web: cannot --wait
                hint: the apiserver may be older than this xcecli; run the command without --wait"#]],
        );
    }

    #[test]
    fn timeout_message() {
        let d: ServiceDetail = serde_json::from_str(&detail(
            2,
            r#"{"generation":2,"state":"progressing","updated":2,"ready":3,"outdated":1,
                "reason":"replica 2: no host has port http free"}"#,
        ))
        .unwrap();
        let e = timed_out(&d, Duration::from_secs(600), Some("team-a"));
        expect![[r#"
            exit 3: error: rollout of service web not complete after 10m: generation 2 has 2/3 updated, 3 ready, 1 outdated
              waiting: replica 2: no host has port http free
            hint: the rollout goes on; `xcecli service status web --project team-a` shows where it is"#]]
        .assert_eq(&format!("exit {}: {e}", e.exit_code()));
    }
}
