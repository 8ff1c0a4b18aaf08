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
//! A refused credential says what is wrong, by its error code: 401 `unauthenticated` (a
//! wrong or missing secret for a host that has a `[[worker]]` entry), `no_worker_entry`
//! (401 or 403: the tokens file has no entry for the host), 403 `forbidden` (another
//! host's credential, or a user token). The worker logs it once per attempt and backs off.
//!
//! Change-driven: assignments are a blocking query (the worker wakes only when its host's
//! desired set changed); readiness is reported as transitions only.

use plugin_api::{Grant, HostFacts, JobId, LaunchRefusal};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::profile::Readiness;

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
    /// argv of the replica process.
    pub command: Vec<String>,
    /// How to probe readiness; `None`: ready as soon as the process runs.
    pub readiness: Option<Readiness>,
    /// Resource grants by plugin name (for the launch hooks).
    pub grants: BTreeMap<String, Grant>,
    /// Run or stop.
    pub desired: Desired,
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
        /// Exit code when known (None: killed by a signal, or adopted).
        code: Option<i32>,
    },
    /// A launch hook refused to start the job.
    Refused {
        /// Job id.
        job: JobId,
        /// The refusal.
        refusal: LaunchRefusal,
    },
}
