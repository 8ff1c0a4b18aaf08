//! Drain waits for the fleet: a draining replica gets SIGTERM only when its `drain` has
//! passed **and** every live separate apiserver has applied the revision that took it
//! out of the endpoint, or that wait ran out (`drain_ack_timeout`). The `drain` counts
//! from the last moment any reader could still be handed the replica: an apiserver that
//! applies the removal late (behind, within its `max_lag`) served the old list until
//! then, so the drain runs again from when its registration showed the removal, and a
//! wait that runs out ends a `drain` after the apiserver began failing closed.
//!
//! Pure and synchronous, like the rest of the core: the apiservers' registrations (from
//! an etcd watch, `xce_store::etcd::fleet`) arrive as a command ([`DrainAcks::fleet`]),
//! and the drain timer asks [`DrainAcks::stop_at`] when a drain may end. There is no
//! polling: a registration that acknowledges a drain's revision moves that drain's
//! deadline, and the state task sleeps until the next deadline.
//!
//! Why the wait is bounded, and why that is safe: an apiserver learns that a revision
//! exists within [`SIGHTING`] of its commit (its prober asks etcd at least once a second)
//! and fails closed once it has been behind that revision for its `max_lag`. So an
//! apiserver that has not applied a revision `max_lag + SIGHTING` after its commit is
//! failing closed: it serves no endpoint. The wait for each apiserver is
//! `max(drain_ack_timeout, its max_lag + SIGHTING + MARGIN)` (its registration says its
//! `max_lag`): a misconfigured short `drain_ack_timeout` cannot break that.
//!
//! The controller's own endpoint table is in-process: it has applied a change once its
//! feed got it, which happens in the commit itself, so it is never waited for. With the
//! embedded store there are no separate apiservers, no registrations, and a drain ends
//! when `drain` has passed, as before.

use plugin_api::JobId;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::time::Instant;

/// An apiserver learns that a revision exists at most this long after its commit (its
/// prober asks every second at the longest).
pub(crate) const SIGHTING: Duration = Duration::from_secs(1);
/// Slack on top of `max_lag + SIGHTING`: the apiserver judges its lag every 100 ms, and
/// the two clocks run on different machines' timers.
pub(crate) const MARGIN: Duration = Duration::from_millis(500);

/// One live apiserver, as its registration says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    /// The controller revision it has applied.
    pub(crate) applied: u64,
    /// Its `max_lag`.
    pub(crate) max_lag: Duration,
}

/// The revision that took a job out of the endpoint, and when it was committed.
#[derive(Debug, Clone, Copy)]
struct Removal {
    rev: u64,
    at: Instant,
    /// The last time a registration was seen to have applied `rev` that had not before
    /// (an apiserver that served the old list until about then).
    acked: Option<Instant>,
}

impl Removal {
    fn new(rev: u64, at: Instant) -> Self {
        Self {
            rev,
            at,
            acked: None,
        }
    }

    /// Notes the apiservers that stopped handing the job out by `now`: those whose
    /// registration shows `rev` applied now and did not in `before` (one that joined
    /// since counts: when it loaded is unknown), and those that left the fleet without
    /// having applied it (they served the old list until they died or stopped).
    fn note_acks(
        &mut self,
        before: &BTreeMap<String, Member>,
        now_members: &BTreeMap<String, Member>,
        now: Instant,
    ) {
        let applied = now_members.iter().any(|(id, m)| {
            m.applied >= self.rev && before.get(id).is_none_or(|b| b.applied < self.rev)
        });
        let left = before
            .iter()
            .any(|(id, b)| b.applied < self.rev && !now_members.contains_key(id));
        let newly = applied || left;
        if newly {
            self.acked = Some(now);
        }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct DrainAcks {
    timeout: Duration,
    /// The live registered apiservers, by id.
    members: BTreeMap<String, Member>,
    /// Draining jobs' removals.
    removals: HashMap<JobId, Removal>,
    /// For a job draining when this controller loaded the store (its removal's revision
    /// and time are unknown): the load's revision and time, which every removal precedes.
    loaded: Removal,
}

impl DrainAcks {
    pub(crate) fn new(timeout: Duration, loaded_rev: u64, now: Instant) -> Self {
        Self {
            timeout,
            members: BTreeMap::new(),
            removals: HashMap::new(),
            loaded: Removal::new(loaded_rev, now),
        }
    }

    /// `job` left the endpoint in the commit of revision `rev` at `at` (the first time it
    /// is told counts).
    pub(crate) fn removed(&mut self, job: &JobId, rev: u64, at: Instant) {
        self.removals
            .entry(job.clone())
            .or_insert(Removal::new(rev, at));
    }

    /// `job` drains no longer (stopped, ended, or back in service).
    pub(crate) fn forget(&mut self, job: &JobId) {
        self.removals.remove(job);
    }

    /// The live apiservers as of `now` (the whole set: one missing has left the fleet).
    pub(crate) fn fleet(
        &mut self,
        members: impl IntoIterator<Item = (String, Member)>,
        now: Instant,
    ) {
        let before = std::mem::replace(&mut self.members, members.into_iter().collect());
        for r in self.removals.values_mut().chain([&mut self.loaded]) {
            r.note_acks(&before, &self.members, now);
        }
    }

    /// How long `m` is waited for, from a removal's commit.
    fn patience(&self, m: &Member) -> Duration {
        self.timeout.max(m.max_lag + SIGHTING + MARGIN)
    }

    /// When `job`, whose drain ends at `drain_end`, may get SIGTERM: at `drain_end` once
    /// every live apiserver has applied its removal, or a drain after the last of them
    /// was seen to, if that is later; while one has not, when the wait for it runs out,
    /// or a drain after it began failing closed, whichever is later.
    pub(crate) fn stop_at(&self, job: &JobId, drain_end: Instant) -> Instant {
        let r = self.removals.get(job).copied().unwrap_or(self.loaded);
        let drain = drain_end.saturating_duration_since(r.at);
        self.members
            .values()
            .filter(|m| m.applied < r.rev)
            .map(|m| r.at + self.patience(m).max(m.max_lag + SIGHTING + MARGIN + drain))
            .chain(r.acked.map(|t| t + drain))
            .fold(drain_end, Instant::max)
    }

    /// The apiservers that have not applied `job`'s removal (for the log line of a stop
    /// that did not wait for them).
    pub(crate) fn unacked(&self, job: &JobId) -> Vec<&str> {
        let r = self.removals.get(job).copied().unwrap_or(self.loaded);
        self.members
            .iter()
            .filter(|(_, m)| m.applied < r.rev)
            .map(|(id, _)| id.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests;
