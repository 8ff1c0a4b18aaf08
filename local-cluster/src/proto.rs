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
//! Change-driven: assignments are a blocking query (the worker wakes only when its host's
//! desired set changed); readiness is reported as transitions only.

use plugin_api::{Grant, HostFacts, JobId, LaunchRefusal};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::profile::Readiness;

/// Request header: the worker instance that sends the request.
pub const INSTANCE_HEADER: &str = "x-xce-worker-instance";
/// Request header (the cluster the worker joined) and answer header (the cluster the
/// controller serves).
pub const CLUSTER_HEADER: &str = "x-xce-cluster";

/// A fresh random identity (16 hex digits): a cluster id, a worker instance id.
pub(crate) fn random_id() -> String {
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
