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
mod config;
mod error;
mod fault;
mod model;
mod phases;
mod reserve;
mod scenario;
mod sched;
mod serve;
mod store;
mod worker;

pub use config::{Fault, SimConfig};
pub use error::SimError;
pub use phases::Phases;
pub use scenario::{run, Report};
pub use worker::{host_ip, WorkerSettings};
