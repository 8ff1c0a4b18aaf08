//! A host's maintenance state as the store holds it (`xcecli host cordon|drain`, or a
//! worker leaving with `--leave`): what stops placements on the host, what moves its
//! replicas off, and who asked when.

use serde::{Deserialize, Serialize};

/// What an operator (or the host's own worker) asked of a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// No new placements; what runs there stays.
    Cordon,
    /// No new placements, and every replica moves elsewhere by the rollout rules.
    Drain,
}

/// A host's maintenance record (`HostRec::maintenance`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Maintenance {
    pub mode: Mode,
    /// When it was asked, in seconds since the Unix epoch (wall clock: it is shown to
    /// operators and survives a restart, unlike the controller's monotonic instants).
    pub since: u64,
    /// The principal who asked (`worker:<host>` for a worker's leave).
    pub by: String,
    /// Asked by the host's own worker as it left (`xced worker --leave`): a worker that
    /// registers for the host again takes it back into service. An operator's cordon or
    /// drain is kept until `uncordon`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leave: bool,
}

impl Maintenance {
    /// Whether the host's replicas are to move off it.
    pub fn drains(&self) -> bool {
        self.mode == Mode::Drain
    }
}
