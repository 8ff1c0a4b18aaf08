//! What a run is given (`SimConfig`, `Fault`).

use crate::worker::WorkerSettings;

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
