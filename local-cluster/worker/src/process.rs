//! Replica processes: spawning (own process group, output to a log file, never a pipe to
//! the worker) and exit watching through a pidfd, for children and adopted processes
//! alike.

use plugin_api::JobId;
use std::collections::BTreeMap;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use xce_proto::worker::ExitCause;

use super::msg::Msg;
use super::procfs;
use super::sys::{self, PidFd, Signal};

/// A freshly spawned replica.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub(crate) child: Child,
    pub(crate) pid: u32,
    pub(crate) start_time: u64,
    pub(crate) pidfd: PidFd,
}

/// The log file of a job: `logs/<job>.log`, with anything but `[A-Za-z0-9._-]` in the id
/// replaced so a job id can never name a path outside the directory.
pub(crate) fn log_path(logs: &Path, job: &str) -> PathBuf {
    let safe: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let safe = if safe.starts_with('.') || safe.is_empty() {
        format!("_{safe}")
    } else {
        safe
    };
    logs.join(format!("{safe}.log"))
}

/// Why a replica could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpawnError {
    /// The assignment has no argv.
    #[error("cannot start: the command is empty")]
    Empty,
    /// Its log file could not be opened.
    #[error("cannot open the log file {path}: {cause}")]
    Log { path: PathBuf, cause: io::Error },
    /// `execve` (or the fork before it) failed: no such program, not executable, ...
    #[error("cannot start {program:?}: {cause}")]
    Exec { program: String, cause: io::Error },
    /// It started, but cannot be watched (so it was killed again).
    #[error("cannot watch the started process: {cause}")]
    Watch { cause: io::Error },
}

impl SpawnError {
    /// The exit code a shell would give: 127 when the program is not there, 126 otherwise.
    pub(crate) fn code(&self) -> i32 {
        match self {
            SpawnError::Exec { cause, .. } if cause.kind() == io::ErrorKind::NotFound => 127,
            _ => 126,
        }
    }
}

/// Spawns `argv` with `env` added to the worker's environment, in a new process group,
/// stdin from /dev/null and stdout/stderr appended to `log`. A start error is also noted
/// in `log`, so the file the operator is shown says why there is no output.
pub(crate) fn spawn(
    argv: &[String],
    env: &BTreeMap<String, String>,
    log: &Path,
) -> Result<Spawned, SpawnError> {
    spawn_watched(argv, env, log).inspect_err(|e| note_in_log(log, &e.to_string()))
}

fn spawn_watched(
    argv: &[String],
    env: &BTreeMap<String, String>,
    log: &Path,
) -> Result<Spawned, SpawnError> {
    let (program, args) = argv.split_first().ok_or(SpawnError::Empty)?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|cause| SpawnError::Log {
            path: log.to_owned(),
            cause,
        })?;
    let exec = |cause| SpawnError::Exec {
        program: program.clone(),
        cause,
    };
    let err = out.try_clone().map_err(exec)?;
    let mut child = Command::new(program)
        .args(args)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Its own group: survives the worker (no terminal signals from the worker's
        // group), and stops as a whole with one kill(-pgid).
        .process_group(0)
        .spawn()
        .map_err(exec)?;
    let pid = child.id();
    // The child is not reaped yet, so its pid and /proc entry are certainly its own.
    let watchable = sys::pidfd_open(pid).and_then(|pidfd| {
        let stat = procfs::read_stat(pid)?
            .ok_or_else(|| io::Error::other("spawned process has no /proc entry"))?;
        Ok((pidfd, stat.start_time))
    });
    match watchable {
        Ok((pidfd, start_time)) => Ok(Spawned {
            child,
            pid,
            start_time,
            pidfd,
        }),
        Err(cause) => {
            // A replica the worker cannot watch must not run unsupervised.
            let _ = sys::kill_group(pid, Signal::Kill);
            let _ = child.wait();
            Err(SpawnError::Watch { cause })
        }
    }
}

/// Appends one line from the worker to a replica's log, so the file the operator is shown
/// says why there is no output (best effort: the event carries the reason too).
fn note_in_log(log: &Path, line: &str) {
    use std::io::Write as _;
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut f| writeln!(f, "xced worker: {line}"));
    if let Err(e) = written {
        tracing::debug!(log = %log.display(), error = %e, "cannot write to the replica log");
    }
}

/// How a child's wait status reads as an [`ExitCause`].
pub(crate) fn cause_of(status: std::process::ExitStatus) -> ExitCause {
    use std::os::unix::process::ExitStatusExt as _;
    ExitCause {
        code: status.code(),
        signal: status.signal(),
        error: None,
    }
}

/// Opens a pidfd on a process from a previous worker, if it is still the same process
/// (same start time) and still running.
pub(crate) fn adopt(pid: u32, start_time: u64) -> Option<PidFd> {
    // Open first, check second: if the check passes, the pidfd (opened before it) refers
    // to the process the check saw, even if the pid is recycled right after.
    let fd = sys::pidfd_open(pid).ok()?;
    procfs::is_same_and_live(pid, start_time).then_some(fd)
}

/// Sends `sig` to the job's process group, if its leader has not exited yet.
pub(crate) fn signal(pidfd: &PidFd, pid: u32, sig: Signal) {
    if sys::pidfd_exited(pidfd) {
        return;
    }
    match sys::kill_group(pid, sig) {
        Ok(_) => tracing::debug!(?sig, "signalled process group"),
        Err(e) => tracing::warn!(?sig, error = %e, "signalling process group failed"),
    }
}

/// A stop order for a job's watcher: SIGTERM went to the group at `sent`; SIGKILL follows
/// `grace` later unless the process has exited by then.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StopOrder {
    pub(crate) sent: tokio::time::Instant,
    pub(crate) grace: Duration,
}

/// Waits for the process to exit and tells the state task. For a child of ours, kills
/// what is left of its group (before reaping, while the group id cannot be recycled) and
/// reports the exit code or signal; for an adopted process the cause is unknown.
///
/// Once `stop` delivers an order, this task also enforces the grace: it is the one that
/// sees the exit (on the pidfd, the moment it happens), so it alone judges whether the
/// process stopped in time, measured from its own SIGTERM. The state task's backlog
/// (hundreds of exits being recorded one after another) cannot make a replica that
/// exited in time look like one that did not.
pub(crate) async fn watch(
    job: JobId,
    pid: u32,
    pidfd: Arc<PidFd>,
    child: Option<Child>,
    owner: mpsc::Sender<Msg>,
    stop: oneshot::Receiver<StopOrder>,
) {
    match sys::async_pidfd(pidfd.clone()) {
        Ok(afd) => wait_exit(&afd, &pidfd, pid, stop).await,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch the process; assuming it exited");
        }
    }
    let cause = match child {
        Some(mut child) => {
            if let Err(e) = sys::kill_group(pid, Signal::Kill) {
                tracing::debug!(error = %e, "cleaning up the process group failed");
            }
            let status = match child.try_wait() {
                Ok(Some(status)) => Some(status),
                // Readable pidfd means exited; a failed reap only loses the cause.
                Ok(None) | Err(_) => tokio::task::spawn_blocking(move || child.wait())
                    .await
                    .ok()
                    .and_then(Result::ok),
            };
            status.map(cause_of).unwrap_or_default()
        }
        None => ExitCause::default(),
    };
    tracing::info!(cause = %cause, "process exited");
    let _ = owner.send(Msg::Exited { job, pid, cause }).await;
}

/// What woke [`wait_exit`].
enum Woke {
    Exited(io::Result<()>),
    Order(Option<StopOrder>),
    GraceOver,
}

/// Returns once the pidfd says the process exited; SIGKILLs its group if a stop order
/// came and the process is still there `grace` after that order's SIGTERM.
async fn wait_exit(
    afd: &tokio::io::unix::AsyncFd<Arc<PidFd>>,
    pidfd: &PidFd,
    pid: u32,
    stop: oneshot::Receiver<StopOrder>,
) {
    let mut orders = Some(stop);
    let mut order: Option<StopOrder> = None;
    // Whether the grace has been judged (ran out: the exit was there, or SIGKILL went).
    let mut judged = false;
    loop {
        let next_order = async {
            match orders.as_mut() {
                Some(rx) => rx.await.ok(),
                None => std::future::pending().await,
            }
        };
        let grace_over = async {
            match order {
                Some(o) if !judged => tokio::time::sleep_until(o.sent + o.grace).await,
                _ => std::future::pending().await,
            }
        };
        // The exit first: a process that exited and a grace that ran out in the same
        // turn of the runtime stopped in time.
        let woke = tokio::select! {
            biased;
            r = afd.readable() => Woke::Exited(r.map(drop)),
            o = next_order => Woke::Order(o),
            () = grace_over => Woke::GraceOver,
        };
        match woke {
            Woke::Exited(r) => {
                if let Err(e) = r {
                    tracing::error!(error = %e, "watching the process failed; assuming it exited");
                }
                if let (Some(o), false) = (order, judged) {
                    tracing::debug!(after = ?o.sent.elapsed(), "replica stopped within the grace");
                }
                return;
            }
            Woke::Order(o) => {
                // A dropped sender (never stopped) leaves only the exit to wait for.
                orders = None;
                order = o;
            }
            Woke::GraceOver => {
                judged = true;
                // The reactor may not have handed the exit over yet: ask the kernel.
                if sys::pidfd_exited(pidfd) {
                    continue;
                }
                let grace = order.map(|o| o.grace).unwrap_or_default();
                tracing::warn!(?grace, "replica did not stop within the grace; killing it");
                signal(pidfd, pid, Signal::Kill);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(job: &str, expect: expect_test::Expect) {
        expect.assert_eq(&log_path(Path::new("/d/logs"), job).display().to_string());
    }

    #[test]
    fn log_paths_stay_in_the_directory() {
        check("j-17", expect_test::expect!["/d/logs/j-17.log"]);
        check(
            "../../etc/passwd",
            expect_test::expect!["/d/logs/_.._.._etc_passwd.log"],
        );
        check("", expect_test::expect!["/d/logs/_.log"]);
    }
}
