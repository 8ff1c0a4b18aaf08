//! What a worker is started with: its config, its plugins, and what happens to the
//! replicas when it shuts down.

use plugin_api::{FactsError, HostFacts, HostFactsProvider, LaunchHook};

use super::logs::LogPolicy;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The default grace between SIGTERM and SIGKILL when a replica is stopped.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The default drain of a replica the controller does not list (see
/// [`WorkerConfig::orphan_drain`]): a profile's default `drain`.
pub const DEFAULT_ORPHAN_DRAIN: Duration = Duration::from_secs(5);
/// The default period of re-reading the host facts.
pub const DEFAULT_FACTS_INTERVAL: Duration = Duration::from_secs(30);

/// What a worker needs to know. Build it with [`WorkerConfig::new`] for the defaults.
#[derive(Clone)]
pub struct WorkerConfig {
    /// The host id this worker acts for (e.g. `exec-01`).
    pub host: String,
    /// The controller's base URL, e.g. `http://127.0.0.1:7480`; or several, separated
    /// by commas (controllers sharing one etcd, of which only the leader listens): the
    /// worker uses the one that answered last and moves to the next on a connection
    /// failure.
    pub controller: String,
    /// The worker's bearer credential. Never logged (`Debug` redacts it).
    pub credential: String,
    /// The CA (PEM) that signed the controllers' certificates, for `https://`
    /// controllers (`ca_file`); the system's roots without.
    pub ca_file: Option<PathBuf>,
    /// Where `jobs.json` and `logs/` live. One directory per worker.
    pub data_dir: PathBuf,
    /// Grace between SIGTERM and SIGKILL when stopping a replica.
    pub stop_timeout: Duration,
    /// How often the host facts are re-read (and reported if they changed).
    pub facts_interval: Duration,
    /// How replicas are started and their output kept.
    pub replicas: ReplicaSettings,
    /// How long a running replica the controller does not list (its store does not know
    /// it: a restored backup, a host declared lost) keeps running before its SIGTERM. It
    /// is in no endpoint any more; clients that still hold an older list finish with it.
    pub orphan_drain: Duration,
}

/// How the worker starts replicas and keeps their output (`[replicas]` and `[logs]` in the
/// worker config).
#[derive(Debug, Clone, Default)]
pub struct ReplicaSettings {
    /// Run the replicas as this user instead of the worker's own (`[replicas] user`).
    pub user: Option<RunAs>,
    /// Rotation and retention of the replicas' logs (`[logs]`).
    pub logs: LogPolicy,
    /// The program that writes and rotates a replica's output, run as `PROGRAM
    /// replica-log --max-size N --keep K FILE` (`xced` itself). `None`: a replica appends
    /// to its log file itself, which then does not rotate (the library's own tests).
    pub log_writer: Option<PathBuf>,
}

/// The user replicas run as, resolved from its name when the worker starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// The user's name.
    pub name: String,
    /// Its user id.
    pub uid: u32,
    /// Its primary group id (its only group: supplementary groups are cleared).
    pub gid: u32,
}

impl RunAs {
    /// Looks `name` up in the system's user database.
    pub fn lookup(name: &str) -> Result<Self, String> {
        match nix::unistd::User::from_name(name) {
            Ok(Some(u)) => Ok(Self {
                name: name.to_owned(),
                uid: u.uid.as_raw(),
                gid: u.gid.as_raw(),
            }),
            Ok(None) => Err(format!("no user {name:?} on this host (create it, e.g. `useradd --system --no-create-home {name}`)")),
            Err(e) => Err(format!("cannot look user {name:?} up: {e}")),
        }
    }
}

impl WorkerConfig {
    /// A config with the default stop timeout and facts interval.
    pub fn new(
        host: impl Into<String>,
        controller: impl Into<String>,
        credential: impl Into<String>,
        data_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            host: host.into(),
            controller: controller.into(),
            credential: credential.into(),
            ca_file: None,
            data_dir: data_dir.into(),
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            facts_interval: DEFAULT_FACTS_INTERVAL,
            replicas: ReplicaSettings::default(),
            orphan_drain: DEFAULT_ORPHAN_DRAIN,
        }
    }
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("host", &self.host)
            .field("controller", &self.controller)
            .field("credential", &"<redacted>")
            .field("ca_file", &self.ca_file)
            .field("data_dir", &self.data_dir)
            .field("stop_timeout", &self.stop_timeout)
            .field("facts_interval", &self.facts_interval)
            .field("replicas", &self.replicas)
            .field("orphan_drain", &self.orphan_drain)
            .finish()
    }
}

/// The plugins a worker runs with, in registration order.
#[derive(Clone, Default)]
pub struct WorkerPlugins {
    /// Host facts providers; each fills in its part of the facts, in order.
    pub facts: Vec<Arc<dyn HostFactsProvider>>,
    /// Launch hooks; each adds to the launch plan (or refuses), in order.
    pub hooks: Vec<Arc<dyn LaunchHook>>,
}

impl std::fmt::Debug for WorkerPlugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPlugins")
            .field(
                "facts",
                &self.facts.iter().map(|p| p.name()).collect::<Vec<_>>(),
            )
            .field(
                "hooks",
                &self.hooks.iter().map(|h| h.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// What happens to the replicas when the worker shuts down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Leave them running for a later worker to re-adopt (`xced worker` on SIGTERM or
    /// SIGINT).
    Detach,
    /// Stop every replica (SIGTERM, SIGKILL after the grace) and report the exits first
    /// (`xced dev` on Ctrl-C).
    StopReplicas,
    /// Leave the cluster first (`xced worker --leave`, `leave_on_stop = true`): ask the
    /// controller to drain the host (its replicas move elsewhere, each replacement ready
    /// before the replica it replaces drains and is stopped by the controller), keep
    /// running until no replica is left or `timeout` ran out, then detach from whatever
    /// is still there.
    Leave {
        /// The bound of the wait.
        timeout: Duration,
    },
}

/// The default bound of a leave's wait (`leave_timeout`).
pub const DEFAULT_LEAVE_TIMEOUT: Duration = Duration::from_secs(600);

/// Collects the host facts from every provider, in order.
pub async fn collect_facts(plugins: &WorkerPlugins) -> Result<HostFacts, FactsError> {
    let mut facts = HostFacts::default();
    for p in &plugins.facts {
        p.collect(&mut facts).await?;
    }
    Ok(facts)
}
