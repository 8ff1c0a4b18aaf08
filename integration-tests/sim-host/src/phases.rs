//! Where the sim host's time goes, per phase.

use std::time::Duration;

/// Time spent per phase, measured around each one.
#[derive(Debug, Clone, Default)]
pub struct Phases {
    /// Choosing hosts: the scheduler and every plugin's `fits`.
    pub pick: Duration,
    /// Every plugin's `reserve` (and `release` when a later one refuses).
    pub reserve: Duration,
    /// Encoding job records and committing store batches.
    pub commit: Duration,
    /// Announcing events to the listeners (the endpoint table's feed).
    pub announce: Duration,
    /// Workers: the launch hooks (with their real bind checks).
    pub launch: Duration,
}

impl Phases {
    /// The time spent since `before` (an earlier copy of the same counters).
    pub(crate) fn since(&self, before: &Phases) -> Phases {
        Phases {
            pick: self.pick - before.pick,
            reserve: self.reserve - before.reserve,
            commit: self.commit - before.commit,
            announce: self.announce - before.announce,
            launch: self.launch - before.launch,
        }
    }

    /// Adds `other`'s times to these.
    pub(crate) fn add(&mut self, other: &Phases) {
        self.pick += other.pick;
        self.reserve += other.reserve;
        self.commit += other.commit;
        self.announce += other.announce;
        self.launch += other.launch;
    }
}
