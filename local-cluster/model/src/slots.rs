//! The history of a service's replica slots, kept in its record across the jobs that
//! fill each slot (restarts, the last exit and its cause, the last log; `docs/status.md`).

use plugin_api::{HostId, JobId};
use serde::{Deserialize, Serialize};
use xce_proto::worker::ExitCause;

/// The history of one replica slot (`XCE_REPLICA`), kept across the jobs that fill it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRec {
    /// How many of its jobs ended by themselves (an exit, a signal, a start error, a
    /// refused launch, a worker that lost the process) while the service was active:
    /// each one made the controller place a replacement.
    #[serde(default)]
    pub restarts: u64,
    /// The last such end.
    #[serde(default)]
    pub last_exit: Option<LastExit>,
    /// The log file of the slot's last ended job, on `log_host`.
    #[serde(default)]
    pub log: Option<String>,
    /// The host `log` is on.
    #[serde(default)]
    pub log_host: Option<HostId>,
}

/// A job's end by itself, as its worker reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastExit {
    /// The job that ended.
    pub job: JobId,
    /// The host it ran on.
    pub host: HostId,
    /// When the controller learnt of it: wall clock, RFC 3339 UTC.
    pub at: String,
    /// The exit code, signal or start error (all `None`: unknown).
    #[serde(default)]
    pub cause: ExitCause,
}
