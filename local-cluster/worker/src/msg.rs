//! What the other tasks tell the state task (`agent.rs`): the one type the exit
//! watchers, probes, the event sender and the assignments loop share with it, so they
//! depend on this module and never on the agent.

use plugin_api::JobId;

use xce_proto::worker::{Assignments, ExitCause};

/// What the other tasks tell the state task.
#[derive(Debug)]
pub(crate) enum Msg {
    /// The desired set changed.
    Assignments(Assignments),
    /// A job's process exited.
    Exited {
        job: JobId,
        pid: u32,
        cause: ExitCause,
    },
    /// A job's readiness changed, or (`probe`, while it is not ready) the text of its last
    /// failing probe did.
    Ready {
        job: JobId,
        pid: u32,
        ready: bool,
        probe: Option<String>,
    },
    /// The controller acknowledged the `Exited` events of these jobs.
    Acked(Vec<JobId>),
    /// An orphan's drain (`orphan_drain`) has passed: stop it unless it is listed again.
    OrphanDrained(JobId),
}
