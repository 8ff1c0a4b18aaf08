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

/// The CPU time the calling thread has used so far (`CLOCK_THREAD_CPUTIME_ID`).
///
/// Why: the headline is wall time, and on a shared machine (2 cores, other builds) the
/// time this thread waits for a core counts in it; its own CPU time does not, so two runs
/// can be compared by it whatever the load.
pub(crate) fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}
