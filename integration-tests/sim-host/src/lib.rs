//! A second host of the plugins: a deterministic, in-process simulation of a cluster that
//! loads `port-resource`, `host-address` and `endpoint-table` through `plugin-api` alone
//! (issue 14). It has its own controller ([`cluster`](crate) state, an in-memory store,
//! a least-loaded scheduler with seeded random tie-breaks), simulated workers that run the
//! real host-facts providers and launch hooks, and the endpoint table's API side served
//! over real HTTP on loopback. A seeded scenario places replicas, churns the cluster and
//! checks, after every event, the plugins' outputs against an independent model.
//!
//! Libraries do not read the environment: the seed (`SIM_SEED`) is read by the test and
//! the bench and passed in [`SimConfig::seed`].
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod cluster;
mod fault;
mod model;
mod scenario;
mod sched;
mod serve;
mod store;
mod worker;

pub use cluster::Phases;
pub use scenario::{run, Report};
pub use worker::{host_ip, WorkerSettings};

/// A deliberate corruption of the simulated host, to show that the checks can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Once, a placement's grant gets a port another live job on the host holds.
    DuplicatePort,
    /// Once, a replica's transition to ready is committed but never announced to the
    /// endpoint table, so its entry misses an endpoint.
    DropEndpoint,
    /// Once, an ended job's grants are never released to the plugins (a leaked port).
    LeakPort,
}

/// The size and shape of one simulation run.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Seeds every random choice of the scenario and the scheduler.
    pub seed: u64,
    /// Simulated hosts.
    pub hosts: u32,
    /// Services at the start (a replaced service keeps the count).
    pub services: u32,
    /// Replicas placed in the load phase, over all services.
    pub replicas: u32,
    /// Churn events after the load.
    pub churn: u32,
    /// The share of hosts (percent) lost and returning during the churn.
    pub lost_hosts_percent: u32,
    /// One entry in this many checked events is also read over HTTP.
    pub http_every: u32,
    /// Every this many events, every service and host is checked (not only the touched).
    pub full_check_every: u32,
    /// The workers' `[ports]` settings.
    pub workers: WorkerSettings,
    /// A corruption to inject, if any.
    pub fault: Option<Fault>,
}

impl SimConfig {
    /// The `cargo test` size: about 200 hosts and 5,000 replicas.
    pub fn small(seed: u64, workers: WorkerSettings) -> Self {
        Self {
            seed,
            hosts: 200,
            services: 250,
            replicas: 5_000,
            churn: 300,
            lost_hosts_percent: 2,
            http_every: 10,
            full_check_every: 500,
            workers,
            fault: None,
        }
    }

    /// The size: 5,000 hosts, 2,000 services, 100,000 replicas.
    pub fn full(seed: u64, workers: WorkerSettings) -> Self {
        Self {
            seed,
            hosts: 5_000,
            services: 2_000,
            replicas: 100_000,
            churn: 5_000,
            lost_hosts_percent: 2,
            http_every: 20,
            full_check_every: 2_500,
            workers,
            fault: None,
        }
    }
}

/// Why a simulation could not run (a violation is not an error: it is counted).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A setting the plugins refused.
    #[error("config: {0}")]
    Config(String),
    /// The loopback apiserver could not start.
    #[error("apiserver: {0}")]
    Serve(String),
    /// A host's report was refused by the policy or a plugin.
    #[error("host {host}: {reason}")]
    Host {
        /// The host.
        host: String,
        /// Why.
        reason: String,
    },
    /// A service the scenario generated was refused.
    #[error("service {service}: {reason}")]
    Service {
        /// The service.
        service: String,
        /// Why.
        reason: String,
    },
}
