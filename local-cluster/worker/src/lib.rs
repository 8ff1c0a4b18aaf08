//! The worker agent (`xced worker`): registers its host with the controller under its own
//! credential, heartbeats, runs the host's replicas as real processes with the
//! environment its launch hooks build, probes their readiness and reports transitions
//! only, reports exits, and re-adopts the replicas of a previous worker run.
//!
//! Entry point: [`run`]. The worker side of the wire protocol is in [`xce_proto::worker`].
//!
//! Architecture invariants:
//! - One task owns the job set; exits (pidfd watchers), readiness transitions (one probe
//!   task per job), acknowledged events and assignment changes reach it over a channel.
//! - Nothing is polled: assignments are a blocking query, exits arrive on a pidfd,
//!   readiness is reported on transitions only, facts only when they changed.
//! - `data_dir/jobs.json` is written (atomically) before the controller hears of a start
//!   or an exit, so a restarted worker re-adopts what runs and re-reports what ended.
//! - Replicas never depend on the worker process: own process group, output to
//!   `data_dir/logs/<job>.log` through a writer process of their own, stdin from /dev/null.
//! - Replicas see nothing of the worker: a clean environment, their own job directory
//!   (`data_dir/jobs/<job>`), optionally another user; the worker's files are 0600/0700.
#![warn(missing_docs)]

mod agent;
mod client;
mod config;
mod control;
mod events;
mod identity;
mod leave;
mod logs;
mod msg;
mod probe;
mod process;
mod procfs;
mod reconcile;
mod state;
mod sys;
#[cfg(test)]
mod tests;

use std::future::Future;

pub use config::{
    collect_facts, ReplicaSettings, RunAs, ShutdownMode, WorkerConfig, WorkerPlugins,
    DEFAULT_FACTS_INTERVAL, DEFAULT_LEAVE_TIMEOUT, DEFAULT_ORPHAN_DRAIN, DEFAULT_STOP_TIMEOUT,
};
pub use logs::{parse_size, write_rotating, LogPolicy};

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
