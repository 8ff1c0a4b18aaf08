//! Replica processes: spawning (a clean environment, its own job directory, optionally
//! another user, its own process group, output to its log through a rotating writer
//! process, never a pipe to the worker) and exit watching through a pidfd, for children
//! and adopted processes alike.

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

use super::config::{ReplicaSettings, RunAs};
use super::logs;
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
    /// The process writing (and rotating) its output, when there is one; the caller
    /// reaps it ([`reap`]).
    pub(crate) writer: Option<Child>,
}

/// The log file of a job: `logs/<job>.log`, the id made safe ([`logs::safe_name`]).
pub(crate) fn log_path(logs: &Path, job: &str) -> PathBuf {
    logs.join(format!("{}.log", logs::safe_name(job)))
}

/// The job directory of a job: `jobs/<job>`, its working directory and `HOME`.
pub(crate) fn job_dir(jobs: &Path, job: &str) -> PathBuf {
    jobs.join(logs::safe_name(job))
}

/// The `PATH` of every replica: the system's directories, none of the worker's.
pub(crate) const REPLICA_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The `LANG` of every replica.
pub(crate) const REPLICA_LANG: &str = "C.UTF-8";

/// Everything a replica is started with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launch<'a> {
    pub(crate) argv: &'a [String],
    /// The profile's `[service.env]`.
    pub(crate) profile_env: &'a BTreeMap<String, String>,
    /// The launch hooks' variables (`XCE_*`).
    pub(crate) env: &'a BTreeMap<String, String>,
    /// Its job directory: working directory and `HOME`.
    pub(crate) dir: &'a Path,
    pub(crate) log: &'a Path,
    pub(crate) settings: &'a ReplicaSettings,
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
    /// Its job directory could not be made.
    #[error("cannot make the job directory {path}: {cause}")]
    Dir { path: PathBuf, cause: io::Error },
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

/// Makes the job directory (mode 0700, owned by the replicas' user when they run as
/// another one). Nothing of the daemon is in it, so no relative path of the replica
/// reaches a daemon's file.
pub(crate) fn make_job_dir(dir: &Path, user: Option<&RunAs>) -> Result<(), SpawnError> {
    use std::os::unix::fs::DirBuilderExt as _;
    let made = (|| {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        if let Some(u) = user {
            std::os::unix::fs::chown(dir, Some(u.uid), Some(u.gid))?;
        }
        Ok(())
    })();
    made.map_err(|cause| SpawnError::Dir {
        path: dir.to_owned(),
        cause,
    })
}

/// Spawns the replica with exactly the environment [`replica_env`] builds, in its job
/// directory, as the configured user, in a new process group, stdin from /dev/null and
/// stdout/stderr to its log (through the rotating writer when there is one). A start
/// error is also noted in the log, so the file the operator is shown says why there is
/// no output.
pub(crate) fn spawn(l: &Launch<'_>) -> Result<Spawned, SpawnError> {
    spawn_watched(l).inspect_err(|e| note_in_log(l.log, &e.to_string()))
}

/// The replica's whole environment: a minimal `PATH`, `LANG` and `HOME` (its job
/// directory), the profile's `[service.env]` (which may set those three otherwise), then
/// the launch hooks' `XCE_*` variables (which nothing overrides). Nothing of the worker's
/// own environment (credentials, tokens, config paths) is passed on.
pub(crate) fn replica_env(l: &Launch<'_>) -> BTreeMap<String, std::ffi::OsString> {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_owned(), REPLICA_PATH.into());
    env.insert("LANG".to_owned(), REPLICA_LANG.into());
    env.insert("HOME".to_owned(), l.dir.as_os_str().to_owned());
    for (k, v) in l.profile_env.iter().chain(l.env) {
        env.insert(k.clone(), v.into());
    }
    env
}

/// Where the replica's output goes: the write end of its writer's pipe, or (without a
/// writer program) the log file itself.
fn output(l: &Launch<'_>) -> Result<(std::fs::File, Option<Child>), SpawnError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    // Opened in any case: a log that cannot be written is a start error the operator
    // reads about, not a writer that dies silently.
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(l.log)
        .map_err(|cause| SpawnError::Log {
            path: l.log.to_owned(),
            cause,
        })?;
    let Some(program) = &l.settings.log_writer else {
        return Ok((file, None));
    };
    drop(file);
    let policy = l.settings.logs;
    let mut writer = Command::new(program)
        .arg("replica-log")
        .arg("--max-size")
        .arg(policy.max_size.to_string())
        .arg("--keep")
        .arg(policy.keep.to_string())
        .arg(l.log)
        .env_clear()
        .env("PATH", REPLICA_PATH)
        .current_dir(l.dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own group: the replica's stop signals do not end it before it has written
        // the replica's last words; it ends when the pipe does.
        .process_group(0)
        .spawn()
        .map_err(|cause| SpawnError::Log {
            path: l.log.to_owned(),
            cause: io::Error::new(
                cause.kind(),
                format!("cannot start the log writer {}: {cause}", program.display()),
            ),
        })?;
    let input = writer.stdin.take().expect("the writer's stdin is piped");
    Ok((
        std::fs::File::from(std::os::fd::OwnedFd::from(input)),
        Some(writer),
    ))
}

fn spawn_watched(l: &Launch<'_>) -> Result<Spawned, SpawnError> {
    let (program, args) = l.argv.split_first().ok_or(SpawnError::Empty)?;
    let (out, writer) = output(l)?;
    let exec = |cause| SpawnError::Exec {
        program: program.clone(),
        cause,
    };
    let err = out.try_clone().map_err(exec)?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(replica_env(l))
        .current_dir(l.dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Its own group: survives the worker (no terminal signals from the worker's
        // group), and stops as a whole with one kill(-pgid).
        .process_group(0);
    if let Some(u) = &l.settings.user {
        // std clears the supplementary groups (setgroups) before it sets the uid.
        cmd.uid(u.uid).gid(u.gid);
    }
    let spawned = cmd.spawn();
    // The pipe's write end is the replica's alone now (or nobody's): the writer sees its
    // end when the replica's is closed.
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(cause) => {
            if let Some(w) = writer {
                reap(w);
            }
            return Err(exec(cause));
        }
    };
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
            writer,
        }),
        Err(cause) => {
            // A replica the worker cannot watch must not run unsupervised.
            let _ = sys::kill_group(pid, Signal::Kill);
            let _ = child.wait();
            if let Some(w) = writer {
                reap(w);
            }
            Err(SpawnError::Watch { cause })
        }
    }
}

/// Reaps a child that runs on its own (a log writer) once it exits, without a thread
/// per child: its pidfd wakes the task.
pub(crate) fn reap(mut child: Child) {
    let Ok(fd) = sys::pidfd_open(child.id()) else {
        // Already gone and reaped elsewhere, or no pidfds: a blocking wait then.
        tokio::task::spawn_blocking(move || child.wait());
        return;
    };
    tokio::spawn(async move {
        if let Ok(afd) = sys::async_pidfd(Arc::new(fd)) {
            let _ = afd.readable().await;
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
        }
        let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    });
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
        worker_stopped: false,
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

    /// Whatever the worker's own environment holds, a replica's is the minimal three, the
    /// profile's variables and the launch hooks' ones, its `HOME` its job directory.
    #[test]
    fn a_replica_environment_is_the_minimal_three_and_the_hooks_variables() {
        let vars = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let hooks = vars(&[("XCE_PORT_HTTP", "20417"), ("XCE_JOB_ID", "j-1")]);
        let profile = vars(&[("LANG", "de_DE.UTF-8"), ("RUST_LOG", "debug")]);
        let settings = ReplicaSettings::default();
        let l = Launch {
            argv: &[],
            profile_env: &profile,
            env: &hooks,
            dir: Path::new("/d/jobs/j-1"),
            log: Path::new("/d/logs/j-1.log"),
            settings: &settings,
        };
        let env: Vec<String> = replica_env(&l)
            .into_iter()
            .map(|(k, v)| format!("{k}={}", v.to_string_lossy()))
            .collect();
        expect_test::expect![[r#"
            [
                "HOME=/d/jobs/j-1",
                "LANG=de_DE.UTF-8",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "RUST_LOG=debug",
                "XCE_JOB_ID=j-1",
                "XCE_PORT_HTTP=20417",
            ]
        "#]]
        .assert_debug_eq(&env);
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
