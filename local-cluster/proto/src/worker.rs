//! The wire protocol between `xced worker` and the controller (HTTP+JSON on the
//! controller's listen address, under `/internal/v1`, authenticated with the worker's
//! per-host bearer credential; a worker may act only for its own host).
//!
//! | method, path                                              | body → answer                         |
//! |-----------------------------------------------------------|---------------------------------------|
//! | `POST /internal/v1/hosts/{host}/register`                 | [`RegisterRequest`] → [`RegisterResponse`] |
//! | `POST /internal/v1/hosts/{host}/heartbeat`                | [`Heartbeat`] (none from a worker without a session) → 204 in sync, or 200 [`HeartbeatAnswer`]; 404 when the controller does not know the host (re-register) |
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
//! | `X-Xce-Worker-Session` ([`SESSION_HEADER`]) | worker   | the session secret its registration returned (absent before it) |
//! | `X-Xce-Cluster`                         | controller   | the cluster the controller serves (every `/internal/v1` answer, errors included) |
//!
//! - A host is held by one worker session. A registration that `wants_session` gets a
//!   fresh session secret (256 random bits; the controller stores only its SHA-256, in
//!   the store, so a new leader knows it). Every later call proves it: without the
//!   header, 401 `session_required`; with another secret (or another instance id), 401
//!   `session_invalid`. The instance id alone is a label, not a proof.
//! - A registration that does not prove the live session (`ready`, heard within
//!   `unreachable_after`) answers 409 `host_taken`, names no instance, and changes
//!   nothing; one that proves it (a restarted worker with its data dir) keeps the host
//!   and its session at once. Once the holder is unreachable or lost, any instance of the
//!   host's credential may register and take the host over with a new session: a worker
//!   that lost its session file waits for that, as a node whose lease ran out.
//! - A host held without a session (a worker of an older release, which sends no
//!   `wants_session`) is held by its instance id as before: calls from another instance
//!   answer 409 `host_taken`.
//! - A heartbeat with a session carries the [`Heartbeat`] digests of the facts and of
//!   every running replica's readiness; when they differ from what the controller holds,
//!   the [`HeartbeatAnswer`] says what, and the worker reports it again (its facts, a
//!   readiness event per job that differs). A forged report does not outlive the next
//!   heartbeat. A heartbeat without the body from a host held by a session answers 400.
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
//! desired set changed); readiness is reported as transitions only, and re-asserted only
//! when a heartbeat's digest shows the controller holds something else.

use plugin_api::{Grants, HostFacts, JobId, LaunchRefusal};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::profile::Readiness;

/// Request header: the worker instance that sends the request.
pub const INSTANCE_HEADER: &str = "x-xce-worker-instance";
/// Request header (the cluster the worker joined) and answer header (the cluster the
/// controller serves).
pub const CLUSTER_HEADER: &str = "x-xce-cluster";

/// Request header: the session secret the worker instance's registration returned
/// ([`RegisterResponse::session`]); every worker call after it carries it.
pub const SESSION_HEADER: &str = "x-xce-worker-session";

/// Why no session secret could be made.
#[derive(Debug, thiserror::Error)]
#[error("no entropy for a session secret: {0}")]
pub struct NoEntropy(String);

/// A fresh session secret: 32 bytes (256 bits) from the operating system's CSPRNG, as 64
/// lowercase hex digits. Never made of anything else: without entropy there is no secret.
pub fn new_session_secret() -> Result<String, NoEntropy> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| NoEntropy(e.to_string()))?;
    Ok(hex(&bytes))
}

/// The SHA-256 of `bytes`, as 64 lowercase hex digits: a session secret as the store
/// keeps it, and the state digests of a heartbeat.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Whether `presented` (a session secret) hashes to `stored` (its SHA-256 in hex). The
/// hashes are compared in constant time: how long a refusal takes tells nothing about how
/// close a guess was.
pub fn session_matches(presented: &str, stored: &str) -> bool {
    let ours = sha256_hex(presented.as_bytes());
    let (a, b) = (ours.as_bytes(), stored.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// What a heartbeat asserts (its body, from workers that hold a session): the digests of
/// the host's facts and of every running replica's readiness, as the worker last reported
/// them. The controller compares them with what it holds; on a difference it answers
/// [`HeartbeatAnswer`] and the worker reports again, so a forged facts or readiness report
/// is undone by the next heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// [`facts_digest`] of the facts the controller last accepted from the worker.
    pub facts: String,
    /// [`ready_digest`] of the readiness of every job the worker runs (not stopping).
    pub ready: String,
    /// The index of the assignments the worker last received (absent before its first,
    /// and from a worker that predates it). A controller whose index for the host is
    /// another says so in [`HeartbeatAnswer::assignments`]: the worker's assignments
    /// query missed a change (it waits on a connection that died in a partition), and
    /// the worker asks again at once, so it hears of the change within a heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignments: Option<u64>,
}

/// The controller's answer (200) to a [`Heartbeat`] whose digests differ from what it
/// holds (a heartbeat in sync is answered 204, without a body).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAnswer {
    /// The facts differ: the worker reports its facts again (`PUT …/facts`).
    #[serde(default)]
    pub facts_differ: bool,
    /// The readiness differs: the readiness the controller holds of each job it has
    /// running on the host. The worker re-sends a readiness event for each job it runs
    /// whose readiness differs (jobs it does not list, or the controller does not, are
    /// starting or ending: their own events tell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<BTreeMap<JobId, bool>>,
    /// The host's assignment index, when the heartbeat named another one: the worker asks
    /// for its assignments again at once (a new connection; see
    /// [`Heartbeat::assignments`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignments: Option<u64>,
}

impl Heartbeat {
    /// The digests of `facts` and of `ready` (job, readiness; in any order).
    pub fn of<'a>(facts: &HostFacts, ready: impl IntoIterator<Item = (&'a str, bool)>) -> Self {
        Heartbeat {
            facts: facts_digest(facts),
            ready: ready_digest(ready),
            assignments: None,
        }
    }
}

/// The SHA-256 of `facts` as canonical JSON (object keys sorted at every level), so two
/// equal facts digest alike however they were built or stored.
pub fn facts_digest(facts: &HostFacts) -> String {
    let value = serde_json::to_value(facts).unwrap_or(serde_json::Value::Null);
    let mut text = String::new();
    canonical(&value, &mut text);
    sha256_hex(text.as_bytes())
}

fn canonical(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The SHA-256 of the (job, readiness) pairs sorted by job: one line `job ready|not` each.
pub fn ready_digest<'a>(ready: impl IntoIterator<Item = (&'a str, bool)>) -> String {
    let mut pairs: Vec<(&str, bool)> = ready.into_iter().collect();
    pairs.sort_unstable();
    let mut text = String::new();
    for (job, r) in pairs {
        text.push_str(job);
        text.push_str(if r { " ready\n" } else { " not\n" });
    }
    sha256_hex(text.as_bytes())
}

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
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The worker instance ([`INSTANCE_HEADER`]).
    pub instance: Option<String>,
    /// The cluster the worker joined ([`CLUSTER_HEADER`]).
    pub cluster: Option<String>,
    /// The session secret it presents ([`SESSION_HEADER`]); never logged.
    pub session: Option<String>,
    /// The peer address of the connection, for the logs (an apiserver's, when forwarded).
    pub peer: Option<String>,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("instance", &self.instance)
            .field("cluster", &self.cluster)
            .field("session", &self.session.as_ref().map(|_| "<redacted>"))
            .field("peer", &self.peer)
            .finish()
    }
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
    /// The worker takes a session: it keeps the secret of the answer's `session` and
    /// presents it ([`SESSION_HEADER`]) on every later call, and sends a [`Heartbeat`]
    /// body with every heartbeat. Every worker of this release sets it; a registration
    /// without it (an older worker) gets no session, and is refused like any other while
    /// a live session holds the host.
    #[serde(default)]
    pub wants_session: bool,
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
    /// A new session secret (64 hex digits, 256 random bits) for a registration that
    /// `wants_session` and did not prove the host's current session: the worker keeps it
    /// (in its data dir, mode 0600) and proves it on every later call. Absent when the
    /// registration proved the current session (it stays valid: the controller keeps only
    /// its hash, and never sends it again), or for a worker that wants none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
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
    /// Readiness changed (a transition), or, for a job that is not ready, the text of its
    /// last failing probe changed (a repeat of `ready: false` with a new `probe`).
    Readiness {
        /// Job id.
        job: JobId,
        /// The new outcome.
        ready: bool,
        /// The last failing probe of a job that is not ready, in words
        /// (`readiness GET / answered 404`, `readiness GET /: connection refused`): what
        /// its rollout waits for. Sent when the text changes, not per probe. Absent when
        /// ready, and from workers that predate it; a controller that predates it ignores
        /// it (and the repeat changes nothing there: events are idempotent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        probe: Option<String>,
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
        /// The worker ended it on its own, not at the controller's word: it stopped its
        /// replicas because it was shutting down (see [`ExitCause::worker_stopped`]).
        /// Absent from older workers (then `false`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        worker_stopped: bool,
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
            worker_stopped: cause.worker_stopped,
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
    /// The worker stopped it on its own because it was shutting down (not the replica
    /// ending by itself, nor the controller stopping it): the controller places a
    /// replacement without counting a restart or a rollout exit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub worker_stopped: bool,
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
    fn a_session_secret_is_random_and_checked_by_its_hash_only() {
        let a = new_session_secret().unwrap();
        let b = new_session_secret().unwrap();
        assert_eq!(a.len(), 64, "{a}");
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b, "two sessions, two secrets");
        let stored = sha256_hex(a.as_bytes());
        assert!(session_matches(&a, &stored));
        assert!(!session_matches(&b, &stored), "another session's secret");
        assert!(
            !session_matches(&stored, &stored),
            "the hash itself is no secret"
        );
        assert!(!session_matches("", &stored));
        assert!(
            !session_matches(&a, "short"),
            "a malformed stored hash matches nothing"
        );
    }

    #[test]
    fn digests_depend_on_the_state_not_on_its_order() {
        let facts = |json: &str| -> HostFacts { serde_json::from_str(json).unwrap() };
        let one = facts(
            r#"{"ip_addr": "127.0.0.11", "sections": {"ports": {"range": [1, 2], "ephemeral": null}}}"#,
        );
        let same = facts(
            r#"{"sections": {"ports": {"ephemeral": null, "range": [1, 2]}}, "ip_addr": "127.0.0.11"}"#,
        );
        let moved = facts(
            r#"{"ip_addr": "127.0.78.99", "sections": {"ports": {"range": [1, 2], "ephemeral": null}}}"#,
        );
        assert_eq!(facts_digest(&one), facts_digest(&same));
        assert_ne!(facts_digest(&one), facts_digest(&moved));
        let a = ready_digest([("j-1", true), ("j-2", false)]);
        assert_eq!(a, ready_digest([("j-2", false), ("j-1", true)]));
        assert_ne!(a, ready_digest([("j-1", true), ("j-2", true)]));
        assert_ne!(a, ready_digest([("j-1", true)]), "a job more or less");
        assert_eq!(
            Heartbeat::of(&one, [("j-1", true), ("j-2", false)]).ready,
            a
        );
        // The wire: an in-sync answer has no body; a difference says which part.
        let answer = HeartbeatAnswer {
            facts_differ: true,
            ready: Some([("j-1".to_owned(), false)].into()),
            assignments: None,
        };
        expect_test::expect![[r#"{"facts_differ":true,"ready":{"j-1":false}}"#]]
            .assert_eq(&serde_json::to_string(&answer).unwrap());
        // A worker of an older release registers without `wants_session`.
        let old: RegisterRequest = serde_json::from_str(r#"{"facts": {}, "running": []}"#).unwrap();
        assert!(!old.wants_session);
    }

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

/// The answer of `POST /internal/v1/hosts/{host}/leave` (a worker leaving with
/// `--leave`): the host drains (no new placements; its replicas move elsewhere, each
/// replacement ready before the replica it replaces drains); `left` live replicas are
/// still on it. The worker asks again until none is left, then exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveAnswer {
    /// Live replicas still on the host.
    pub left: u32,
}
