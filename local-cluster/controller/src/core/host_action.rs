//! What the host maintenance commands take and answer (`maintenance.rs` handles them): a
//! file of its own, so the core's `mod.rs` re-exports them without importing the file
//! that imports it.

/// What an operator asks of a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostAction {
    Cordon,
    Uncordon,
    Drain,
}

impl HostAction {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HostAction::Cordon => "cordon",
            HostAction::Uncordon => "uncordon",
            HostAction::Drain => "drain",
        }
    }
}

/// Where a worker's leave stands (the answer of its `leave` call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaveStatus {
    /// Live jobs left on the host.
    pub(crate) left: usize,
}
