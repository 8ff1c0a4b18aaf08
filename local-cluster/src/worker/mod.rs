//! The worker agent (`xced worker`): registers its host with the controller under its own
//! credential, heartbeats, runs the host's replicas as real processes with the
//! environment its launch hooks build, probes their readiness and reports transitions
//! only, reports exits, and re-adopts the replicas of a previous worker run.
//!
//! Entry point: [`run`]. The worker side of the wire protocol is in [`crate::proto`].
//!
//! Architecture invariants:
//! - One task owns the job set; exits (pidfd watchers), readiness transitions (one probe
//!   task per job), acknowledged events and assignment changes reach it over a channel.
//! - Nothing is polled: assignments are a blocking query, exits arrive on a pidfd,
//!   readiness is reported on transitions only, facts only when they changed.
//! - `data_dir/jobs.json` is written (atomically) before the controller hears of a start
//!   or an exit, so a restarted worker re-adopts what runs and re-reports what ended.
//! - Replicas never depend on the worker process: own process group, output to
//!   `data_dir/logs/<job>.log`, stdin from /dev/null.
#![warn(missing_docs)]

mod agent;
mod client;
mod events;
mod identity;
mod probe;
mod process;
mod procfs;
mod reconcile;
mod state;
mod sys;
#[cfg(test)]
mod tests;

use plugin_api::{FactsError, HostFacts, HostFactsProvider, LaunchHook};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The default grace between SIGTERM and SIGKILL when a replica is stopped.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);
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
    /// Where `jobs.json` and `logs/` live. One directory per worker.
    pub data_dir: PathBuf,
    /// Grace between SIGTERM and SIGKILL when stopping a replica.
    pub stop_timeout: Duration,
    /// How often the host facts are re-read (and reported if they changed).
    pub facts_interval: Duration,
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
            data_dir: data_dir.into(),
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            facts_interval: DEFAULT_FACTS_INTERVAL,
        }
    }
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("host", &self.host)
            .field("controller", &self.controller)
            .field("credential", &"<redacted>")
            .field("data_dir", &self.data_dir)
            .field("stop_timeout", &self.stop_timeout)
            .field("facts_interval", &self.facts_interval)
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
}

/// Collects the host facts from every provider, in order.
pub async fn collect_facts(plugins: &WorkerPlugins) -> Result<HostFacts, FactsError> {
    let mut facts = HostFacts::default();
    for p in &plugins.facts {
        p.collect(&mut facts).await?;
    }
    Ok(facts)
}

/// Runs the worker until `shutdown` resolves, then detaches from or stops the replicas as
/// it says.
///
/// Fails at start when the facts cannot be collected, the controller URL is invalid, or
/// `data_dir` (or its `jobs.json`) is unusable; later it fails only when `jobs.json`
/// cannot be written. An unreachable controller is retried forever (with capped backoff,
/// each retry logged).
pub async fn run(
    cfg: WorkerConfig,
    plugins: WorkerPlugins,
    shutdown: impl Future<Output = ShutdownMode>,
) -> anyhow::Result<()> {
    use tracing::Instrument;
    let span = tracing::info_span!("worker", host = %cfg.host);
    async move {
        let agent = agent::Agent::start(cfg, plugins).await?;
        agent.run(shutdown).await
    }
    .instrument(span)
    .await
}
