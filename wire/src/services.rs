//! The answers of the service routes (`docs/api.md`, "Services"; `docs/status.md`):
//! `GET /v1/services` ([`ServiceList`]), the service detail ([`ServiceDetail`]: `GET
//! /v1/services/{name}`, and the answer of `POST /v1/services`, `PUT /v1/services/{name}`,
//! `…/scale` and `…/restart`), and `DELETE /v1/services/{name}` ([`StopAnswer`]).
//!
//! Every object's keys are written in alphabetical order: these answers were sorted
//! `serde_json::Map`s once, and the server's tests compare its text with the tree's.

use crate::summaries::{Merged, Summaries, JOB_FIELDS};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use std::borrow::Cow;

/// `GET /v1/services`: the services the caller may view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceList<'a> {
    /// One row per service.
    pub services: Vec<ServiceSummary<'a>>,
}

/// One row of `GET /v1/services`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceSummary<'a> {
    /// The generation of the current profile (0 from a server that predates rollouts).
    #[serde(default)]
    pub generation: u64,
    /// The service's index (its revision: every change of its jobs or rollout bumps it).
    #[serde(default)]
    pub index: u64,
    /// Service name.
    pub name: Cow<'a, str>,
    /// Replicas no host can hold yet.
    #[serde(default)]
    pub pending: u32,
    /// Why the first pending replica waits.
    #[serde(default)]
    pub pending_reason: Option<Cow<'a, str>>,
    /// The service's project (empty from a server that predates projects).
    #[serde(default)]
    pub project: Cow<'a, str>,
    /// Ready jobs.
    #[serde(default)]
    pub ready: u32,
    /// The replica count of the profile.
    #[serde(default)]
    pub replicas: u32,
    /// The state of the latest rollout (`None` from a server that predates rollouts).
    #[serde(default)]
    pub rollout: Option<RolloutState>,
    /// Running jobs.
    #[serde(default)]
    pub running: u32,
    /// `active` or `stopping`.
    #[serde(default)]
    pub state: Cow<'a, str>,
}

/// The service detail: `GET /v1/services/{name}` (also as a blocking query), and the
/// answer of `POST /v1/services`, `PUT /v1/services/{name}`, `…/scale` and `…/restart`.
///
/// `Jobs` and `Slots` are the sequences of [`JobAnswer`]s and [`ReplicaStatus`]es: a
/// client reads `Vec`s (the defaults); the server may give any `Serialize` sequence of
/// them, so that a 10,000-replica service's detail is written one job at a time straight
/// into the answer's text instead of being built whole first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceDetail<'a, Jobs = Vec<JobAnswer<'a>>, Slots = Vec<ReplicaStatus<'a>>> {
    /// The generation of the current profile (0 from a server that predates rollouts).
    #[serde(default)]
    pub generation: u64,
    /// The service's index (as `X-Xce-Index`).
    #[serde(default)]
    pub index: u64,
    /// The placed jobs, by replica, then job number (during a rollout a slot may have an
    /// old and a new job).
    #[serde(default)]
    pub jobs: Jobs,
    /// Service name.
    pub name: Cow<'a, str>,
    /// The replicas no host can hold yet, with the reason.
    #[serde(default)]
    pub pending: Vec<PendingReplica<'a>>,
    /// The profile's `[service]` table, as JSON.
    #[serde(default)]
    pub profile: Cow<'a, Value>,
    /// The service's project (empty from a server that predates projects).
    #[serde(default)]
    pub project: Cow<'a, str>,
    /// One entry per replica slot `0 … replicas-1` (empty from a server that predates
    /// it).
    #[serde(default)]
    pub replica_status: Slots,
    /// The replica count of the profile.
    #[serde(default)]
    pub replicas: u32,
    /// Where the service's latest change stands (`None` from a server that predates
    /// rollouts).
    #[serde(default)]
    pub rollout: Option<Rollout<'a>>,
    /// `active` or `stopping`.
    #[serde(default)]
    pub state: Cow<'a, str>,
}

/// A placed job in a [`ServiceDetail`], with each resource plugin's summary of its grant
/// as a key of its own beside the job's fields (`"ports": {"http": 20417}`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct JobAnswer<'a> {
    /// The generation the job runs (`None` from a server that predates rollouts).
    #[serde(default)]
    pub generation: Option<u64>,
    /// The host it is placed on.
    #[serde(default)]
    pub host: Cow<'a, str>,
    /// Job id.
    pub job: Cow<'a, str>,
    /// Its log file on its host, once its worker has started it.
    #[serde(default)]
    pub log: Option<Cow<'a, str>>,
    /// Whether it is an endpoint.
    #[serde(default)]
    pub ready: bool,
    /// Its replica slot.
    pub replica: u32,
    /// `placed`, `running`, `draining`, `stopping`, `unknown` (a string: a newer server's
    /// state must not fail a client).
    #[serde(default)]
    pub state: Cow<'a, str>,
    /// Plugin name → that plugin's summary of the job's grant (read: every key that is not
    /// one of the job's fields).
    #[serde(flatten)]
    pub summaries: Summaries<'a>,
}

impl JobAnswer<'_> {
    /// The summary of the plugin named `plugin`, if it has one.
    pub fn summary(&self, plugin: &str) -> Option<&Value> {
        self.summaries.get(plugin)
    }
}

impl Serialize for JobAnswer<'_> {
    /// The job's fields and the summaries, keys in alphabetical order.
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let mut m = Merged::new(ser, JOB_FIELDS, &self.summaries)?;
        m.field("generation", &self.generation)?;
        m.field("host", &self.host)?;
        m.field("job", &self.job)?;
        m.field("log", &self.log)?;
        m.field("ready", &self.ready)?;
        m.field("replica", &self.replica)?;
        m.field("state", &self.state)?;
        m.end()
    }
}

/// A replica no host can hold yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingReplica<'a> {
    /// Why (lenient: a reason a server could not give, `null`, must not fail a client).
    #[serde(default)]
    pub reason: Option<Cow<'a, str>>,
    /// The replica slot.
    pub replica: u32,
}

/// What happened to one replica slot across its jobs (`docs/status.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaStatus<'a> {
    /// The last time one of the slot's jobs ended by itself.
    #[serde(default)]
    pub last_exit: Option<LastExit<'a>>,
    /// The log file of the slot's newest job (the live one if it has started, else the
    /// last that ended), on `log_host`.
    #[serde(default)]
    pub log: Option<Cow<'a, str>>,
    /// The host `log` is on.
    #[serde(default)]
    pub log_host: Option<Cow<'a, str>>,
    /// The slot (`XCE_REPLICA`).
    pub replica: u32,
    /// Jobs of the slot that ended by themselves and were replaced.
    #[serde(default)]
    pub restarts: u64,
}

/// The last time a replica slot's job ended by itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastExit<'a> {
    /// When the controller learnt of it: RFC 3339 UTC with milliseconds.
    #[serde(default)]
    pub at: Cow<'a, str>,
    /// Its exit code (127 or 126 when it could not be started); `null` when a signal ended
    /// it or the cause is unknown.
    #[serde(default)]
    pub code: Option<i32>,
    /// Why it could not be started.
    #[serde(default)]
    pub error: Option<Cow<'a, str>>,
    /// The host it ran on.
    #[serde(default)]
    pub host: Cow<'a, str>,
    /// The job that ended.
    #[serde(default)]
    pub job: Cow<'a, str>,
    /// The signal that ended it (Linux numbering).
    #[serde(default)]
    pub signal: Option<i32>,
    /// `SIGKILL`, `SIGSEGV`, … (`null` for a real-time or unknown signal).
    #[serde(default)]
    pub signal_name: Option<Cow<'a, str>>,
    /// One line for people: `exit 3`, `SIGKILL (signal 9)`, the `error`, or `exit (status
    /// unknown)`.
    #[serde(default)]
    pub summary: Cow<'a, str>,
}

/// Where a service's latest change stands (`docs/api.md`, `docs/design.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollout<'a> {
    /// Set when the service's `drain` is shorter than DNS clients may keep an answer
    /// (twice the cluster's DNS `ttl`): a client may still connect to a replica after its
    /// SIGTERM. Absent otherwise, and on clusters that serve no DNS listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_warning: Option<Cow<'a, str>>,
    /// The generation this rollout brings the service to.
    pub generation: u64,
    /// Live jobs of older generations that are not draining or stopping.
    #[serde(default)]
    pub outdated: u32,
    /// Ready jobs of any generation.
    #[serde(default)]
    pub ready: u32,
    /// Why it waits, why it failed, or what was reverted.
    #[serde(default)]
    pub reason: Option<Cow<'a, str>>,
    /// Where it stands.
    pub state: RolloutState,
    /// Live jobs of `generation` that are not draining or stopping.
    #[serde(default)]
    pub updated: u32,
}

/// `rollout.state` (and `rollout` of a [`ServiceSummary`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    /// Replacing, adding or removing replicas.
    Progressing,
    /// Every slot runs the current generation, ready; no older replica is live.
    Complete,
    /// No progress for the deadline, or new replicas kept exiting; not rolled back.
    Failed,
    /// Failed and rolled back to the last complete generation's profile.
    Reverted,
    /// A state this client does not know (a newer server): treated as still moving.
    /// Never written by a server.
    #[serde(other)]
    Unknown,
}

impl RolloutState {
    /// As the REST API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutState::Progressing => "progressing",
            RolloutState::Complete => "complete",
            RolloutState::Failed => "failed",
            RolloutState::Reverted => "reverted",
            RolloutState::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for RolloutState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `DELETE /v1/services/{name}` (202): the service is stopping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StopAnswer<'a> {
    /// The service name, as the request's path gave it.
    pub name: Cow<'a, str>,
    /// How many jobs were told to drain or stop.
    #[serde(default)]
    pub stopping: u32,
}

#[cfg(test)]
mod tests;
