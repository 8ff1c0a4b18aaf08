//! [`Report`]: a worker's events report as the state task hands it to the core (a file
//! of its own: the core's `mod.rs` re-exports it, and `worker.rs`, which handles it,
//! imports from `mod.rs`).

use plugin_api::HostId;
use xce_proto::worker::{Caller, WorkerEvent};

/// One worker's events report (`POST /internal/v1/hosts/{host}/events`).
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) host: HostId,
    pub(crate) caller: Caller,
    pub(crate) events: Vec<WorkerEvent>,
}
