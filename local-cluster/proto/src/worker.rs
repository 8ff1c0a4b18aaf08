//! The wire protocol between `xced worker` and the controller (HTTP+JSON on the
//! controller's listen address, under `/internal/v1`, authenticated with the worker's
//! per-host bearer credential; a worker may act only for its own host).
//!
//! | method, path                                              | body → answer                         |
//! |-----------------------------------------------------------|---------------------------------------|
//! | `POST /internal/v1/hosts/{host}/register`                 | [`RegisterRequest`] → [`RegisterResponse`] |
//! | `POST /internal/v1/hosts/{host}/heartbeat`                | – → 204; 404 when the controller does not know the host (re-register) |
//! | `PUT  /internal/v1/hosts/{host}/facts`                    | `HostFacts` → 204, or 400 with every problem (previous facts kept) |
//! | `GET  /internal/v1/hosts/{host}/assignments?index=N&wait=30s` | → [`Assignments`], as soon as its index > N (blocking query) |
//! | `POST /internal/v1/hosts/{host}/events`                   | `Vec<WorkerEvent>` → 204              |
//!
//! Identity, on every request and answer above:
//!
//! | header                                  | who sends it | meaning |
//! |-----------------------------------------|--------------|---------|
//! | `X-Xce-Worker-Instance` ([`INSTANCE_HEADER`]) | worker | the worker instance (a random id kept in its data dir) |
//! | `X-Xce-Cluster` ([`CLUSTER_HEADER`])    | worker       | the cluster the worker joined (absent before its first registration) |
//! | `X-Xce-Cluster`                         | controller   | the cluster the controller serves (every `/internal/v1` answer, errors included) |
//!
//! - A host is held by one worker instance: a registration from another instance while
//!   the holder is live (`ready`, heard within `unreachable_after`) answers 409
//!   `host_taken` and changes nothing; heartbeats, facts, events and assignment queries
//!   from any instance but the holder answer 409 `host_taken` too. Once the holder is
//!   unreachable or lost, another instance may register and take the host over.
//! - A worker serves one cluster: a request naming another cluster answers 409
//!   `wrong_cluster`, and a worker takes no answer whose `X-Xce-Cluster` differs from
//!   the cluster it joined (it keeps its replicas running and retries).
//!
//! A refused credential says what is wrong, by its error code: 401 `unauthenticated` (a
//! wrong or missing secret for a host that has a `[[worker]]` entry), `no_worker_entry`
//! (401 or 403: the tokens file has no entry for the host), 403 `forbidden` (another
//! host's credential, or a user token). The worker logs it once per attempt and backs off.
//!
//! Change-driven: assignments are a blocking query (the worker wakes only when its host's
//! desired set changed); readiness is reported as transitions only.

use plugin_api::{Grants, HostFacts, JobId, LaunchRefusal};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::profile::Readiness;

/// Request header: the worker instance that sends the request.
pub const INSTANCE_HEADER: &str = "x-xce-worker-instance";
/// Request header (the cluster the worker joined) and answer header (the cluster the
/// controller serves).
pub const CLUSTER_HEADER: &str = "x-xce-cluster";

/// A fresh random identity (16 hex digits): a cluster id, a worker instance id.
pub fn random_id() -> String {
    let mut seed = [0u8; 8];
    let n = match getrandom::fill(&mut seed) {
        Ok(()) => u64::from_le_bytes(seed),
        // Without entropy, the clock and the pid still tell two starts apart.
        Err(_) => {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ (u64::from(std::process::id()) << 32)
        }
    };
    format!("{n:016x}")
}

/// Who sends a worker request, from its identity headers (absent ones are `None`: a
/// worker from before identities, or one that has not joined a cluster yet) and its
/// connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The worker instance ([`INSTANCE_HEADER`]).
    pub instance: Option<String>,
    /// The cluster the worker joined ([`CLUSTER_HEADER`]).
    pub cluster: Option<String>,
    /// The peer address of the connection, for the logs (an apiserver's, when forwarded).
    pub peer: Option<String>,
}

impl Caller {
    /// The instance for logs: `none` when the worker sent none.
    pub fn instance_or_none(&self) -> &str {
        self.instance.as_deref().unwrap_or("none")
    }
}

/// A job the worker found still running when it (re)started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningJob {
    /// Job id.
    pub job: JobId,
    /// Its process id.
    pub pid: u32,
    /// Whether its last probe said ready.
    pub ready: bool,
}

/// Registration: sent at worker start and whenever the controller answers a heartbeat
/// with 404 (it lost track of the host).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// The host's facts.
    pub facts: HostFacts,
    /// Jobs re-adopted from before a worker restart.
    pub running: Vec<RunningJob>,
}

/// The controller's answer to a registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    /// How often to heartbeat, in milliseconds.
    pub heartbeat_ms: u64,
    /// The cluster the controller serves (the worker remembers it on its first
    /// registration). Absent from controllers older than cluster identities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

/// What the controller wants of one job on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Desired {
    /// Keep it running (start it if it is not).
    Run,
    /// Stop it (SIGTERM, then SIGKILL after the grace), then report `Exited`.
    Stop,
}

/// One job assigned to the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    /// Job id.
    pub job: JobId,
    /// Service name.
    pub service: String,
    /// Project.
    pub project: String,
    /// Replica index.
    pub replica: u32,
    /// argv of the replica process. Shared by every assignment of the service's
    /// generation (its [`Profile`](crate::profile::Profile)'s); on the wire a plain array.
    pub command: Arc<Vec<String>>,
    /// How to probe readiness; `None`: ready as soon as the process runs. Shared like
    /// `command`.
    pub readiness: Option<Arc<Readiness>>,
    /// The profile's `[service.env]`: variables the replica gets besides its `XCE_*` ones.
    /// Shared like `command`; absent on the wire when empty (and from a controller that
    /// predates it).
    #[serde(default, skip_serializing_if = "env_is_empty")]
    pub env: Arc<std::collections::BTreeMap<String, String>>,
    /// Resource grants by plugin name (for the launch hooks).
    pub grants: Grants,
    /// Run or stop.
    pub desired: Desired,
}

fn env_is_empty(env: &Arc<std::collections::BTreeMap<String, String>>) -> bool {
    env.is_empty()
}

/// The host's whole desired set. Jobs the worker runs that are not listed are orphans
/// and are stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignments {
    /// The host's assignment index (raised on every change of the set).
    pub index: u64,
    /// The jobs.
    pub jobs: Vec<Assignment>,
}

/// Something that happened to a job on the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "event")]
pub enum WorkerEvent {
    /// The process was spawned.
    Started {
        /// Job id.
        job: JobId,
        /// Process id.
        pid: u32,
        /// Where the replica's stdout and stderr go on the host (an absolute path). `None`
        /// from a worker that predates it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        log: Option<String>,
    },
    /// Readiness changed (a transition, never a repeat).
    Readiness {
        /// Job id.
        job: JobId,
        /// The new outcome.
        ready: bool,
    },
    /// The process is gone.
    Exited {
        /// Job id.
        job: JobId,
        /// Exit code when known (None: killed by a signal, or adopted). A process that
        /// could not be started reads 127 (program not found) or 126, as from a shell.
        code: Option<i32>,
        /// The signal that ended the process, when one did (Linux numbering; see
        /// [`signal_name`]). `None` also when unknown (an adopted process).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// Why the process could not be started at all (e.g. `cannot start "x": No such
        /// file or directory (os error 2)`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// Where its output went on the host (as in `Started`; also for a process that
        /// could not be started, whose log file holds the worker's line saying why).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        log: Option<String>,
    },
    /// A launch hook refused to start the job.
    Refused {
        /// Job id.
        job: JobId,
        /// The refusal.
        refusal: LaunchRefusal,
    },
}

impl WorkerEvent {
    /// The job it is about.
    pub fn job(&self) -> &JobId {
        match self {
            WorkerEvent::Started { job, .. }
            | WorkerEvent::Readiness { job, .. }
            | WorkerEvent::Exited { job, .. }
            | WorkerEvent::Refused { job, .. } => job,
        }
    }

    /// An `Exited` event for `job` that ended as `cause` says, its output in `log`.
    pub fn exited(job: JobId, cause: ExitCause, log: Option<String>) -> Self {
        WorkerEvent::Exited {
            job,
            code: cause.code,
            signal: cause.signal,
            error: cause.error,
            log,
        }
    }
}

/// How a replica's process ended, as precisely as its worker knows. Every field `None`:
/// unknown (a process of a previous worker run, or one the worker no longer had).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitCause {
    /// Its exit code, when it exited by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// The signal that ended it (Linux numbering).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why it could not be started (then `code` is 127 or 126, as from a shell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ExitCause {
    /// An exit by itself with `code`.
    pub fn code(code: i32) -> Self {
        ExitCause {
            code: Some(code),
            ..ExitCause::default()
        }
    }

    /// The end by signal `signal`.
    pub fn signal(signal: i32) -> Self {
        ExitCause {
            signal: Some(signal),
            ..ExitCause::default()
        }
    }

    /// The name of the signal that ended the process, when known.
    pub fn signal_name(&self) -> Option<&'static str> {
        self.signal.and_then(signal_name)
    }
}

impl std::fmt::Display for ExitCause {
    /// `exit 3`, `SIGKILL (signal 9)`, the start error, or `exit (status unknown)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.error, self.signal, self.code) {
            (Some(e), _, _) => f.write_str(e),
            (None, Some(s), _) => match signal_name(s) {
                Some(name) => write!(f, "{name} (signal {s})"),
                None => write!(f, "signal {s}"),
            },
            (None, None, Some(c)) => write!(f, "exit {c}"),
            (None, None, None) => f.write_str("exit (status unknown)"),
        }
    }
}

/// The name of a Linux signal (`SIGKILL` for 9), or `None` for a number that names no
/// standard signal (real-time signals included).
pub fn signal_name(signal: i32) -> Option<&'static str> {
    // The numbering is the kernel's (x86, arm and most others agree on these).
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    let i = usize::try_from(signal).ok()?.checked_sub(1)?;
    NAMES.get(i).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::process::Signal;

    #[test]
    fn exit_causes_read_well_and_old_events_still_parse() {
        let all = [
            ExitCause::code(3),
            ExitCause::signal(Signal::KILL.as_raw()),
            ExitCause::signal(Signal::SEGV.as_raw()),
            ExitCause::signal(40),
            ExitCause {
                code: Some(127),
                error: Some(
                    "cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"
                        .into(),
                ),
                ..ExitCause::default()
            },
            ExitCause::default(),
        ];
        let lines: Vec<String> = all.iter().map(|c| c.to_string()).collect();
        expect_test::expect![[r#"
            exit 3
            SIGKILL (signal 9)
            SIGSEGV (signal 11)
            signal 40
            cannot start "no-such-binary-xyz": No such file or directory (os error 2)
            exit (status unknown)"#]]
        .assert_eq(&lines.join("\n"));
        assert_eq!(signal_name(Signal::TERM.as_raw()), Some("SIGTERM"));
        assert_eq!(signal_name(Signal::SYS.as_raw()), Some("SIGSYS"));
        assert_eq!(signal_name(0), None);
        assert_eq!(signal_name(-9), None);
        // An old worker's events (no signal, error or log) read as before, and a new
        // worker's extra fields are skipped when absent, so an old controller reads them.
        let old: WorkerEvent =
            serde_json::from_str(r#"{"event":"exited","job":"j-1","code":null}"#).unwrap();
        assert_eq!(
            old,
            WorkerEvent::exited("j-1".into(), ExitCause::default(), None)
        );
        let new = WorkerEvent::exited(
            "j-2".into(),
            ExitCause::signal(9),
            Some("/d/j-2.log".into()),
        );
        expect_test::expect![[
            r#"{"event":"exited","job":"j-2","code":null,"signal":9,"log":"/d/j-2.log"}"#
        ]]
        .assert_eq(&serde_json::to_string(&new).unwrap());
        let old: WorkerEvent =
            serde_json::from_str(r#"{"event":"started","job":"j-1","pid":7}"#).unwrap();
        assert_eq!(
            old,
            WorkerEvent::Started {
                job: "j-1".into(),
                pid: 7,
                log: None
            }
        );
    }
}
