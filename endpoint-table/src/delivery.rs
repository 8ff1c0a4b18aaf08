//! Delivery tracking for `xce_endpoint_delivery_seconds`: for each change of a service's
//! entry, the time from the change reaching this process's table feed to the moment the
//! last watcher of that service that was connected then has been handed it.
//!
//! Each service slot has one [`Tracker`]. A watcher (a blocking query while it is parked,
//! an open stream) holds a [`Recipient`] of its service's tracker. When a change lands,
//! the tracker notes it with the number of recipients registered at that moment; each of
//! them settles it once, by being handed that entry or a newer one (a watcher skips
//! intermediate entries, and the newest one covers them), by skipping it (a blocking query
//! whose index the change does not pass), or by leaving (its request or stream dropped, or
//! cut off). When the last one settled, the change is observed once: the time until the
//! last handover. A change that no recipient was handed — none was connected, or all left
//! or skipped it first — is not observed at all: zeros would only dilute the quantiles an
//! operator reads to choose `drain`.
//!
//! The clock starts when the change reached this process's table feed: in the
//! controller's process right after the controller committed it (`ClusterListener::on_event`
//! runs after the commit); in a separate apiserver when the revision was first known to
//! exist there (`ClusterListener::on_events_since`: the apiserver's prober learns of a
//! revision at least once a second, before a slow store watch delivers it), so the store
//! watch's delay is included, from that first sighting (the events carry no commit time;
//! the up to one second between the commit and the first sighting is not counted). A change that
//! waited in the coalescing queue behind an older one of the same service counts from the
//! older one's arrival (the entry sent covers both). The clock stops when the answer is
//! built or the stream event yielded, not when the client has read or acted on it.
//!
//! What is pending is bounded: a blocking query settles as soon as it wakes, and a stream
//! more than `stream_buffer` changes behind is cut off (and leaves).

use prometheus_client::metrics::histogram::Histogram;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// The deliveries of one service slot's changes to its watchers.
#[derive(Debug)]
pub(crate) struct Tracker {
    state: Mutex<State>,
    histogram: Histogram,
}

#[derive(Debug)]
struct State {
    /// Recipients registered now.
    recipients: usize,
    /// The slot seq of the last change noted: a recipient registered now owes nothing up
    /// to it.
    seq: u64,
    /// Changes not yet settled by every recipient counted for them, oldest first.
    pending: VecDeque<Pending>,
}

#[derive(Debug)]
struct Pending {
    /// The slot seq the change made.
    seq: u64,
    /// When the change reached the table feed.
    at: Instant,
    /// Counted recipients that have not settled it yet.
    owed: usize,
    /// When the last recipient so far was handed it.
    handed: Option<Instant>,
}

/// One watcher's registration with its service's [`Tracker`]. Dropping it settles every
/// change it still owes, as a recipient that left.
#[derive(Debug)]
pub(crate) struct Recipient {
    tracker: Arc<Tracker>,
    /// The slot seq up to which this recipient owes nothing.
    settled: u64,
}

// === impl Tracker ===

impl Tracker {
    /// A tracker for a slot whose seq is `seq` now.
    pub(crate) fn new(histogram: Histogram, seq: u64) -> Self {
        Self {
            state: Mutex::new(State {
                recipients: 0,
                seq,
                pending: VecDeque::new(),
            }),
            histogram,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that the slot changed to `seq` (higher than any before), a change that reached
    /// the table feed at `at`. The recipients registered now each owe it.
    ///
    /// Call it before any watcher can take the new seq (the apiserver side calls it inside
    /// the watch channel's `send_if_modified`, under the channel's write lock): a recipient
    /// handed seq `seq` before it was noted would never settle it. A watcher that registers
    /// afterwards holds an entry of at most `seq` and owes nothing up to it; one that
    /// registered before is woken by the change and settles it.
    /// A `seq` not above the last one noted is ignored: the all-services streams' tracker
    /// counts revisions, and one revision may change several services.
    pub(crate) fn changed(&self, seq: u64, at: Instant) {
        let mut state = self.lock();
        if seq <= state.seq {
            return;
        }
        state.seq = seq;
        if state.recipients > 0 {
            let owed = state.recipients;
            state.pending.push_back(Pending {
                seq,
                at,
                owed,
                handed: None,
            });
        }
    }

    /// Registers a recipient: it owes every change noted from now on, none before.
    pub(crate) fn register(self: &Arc<Self>) -> Recipient {
        let mut state = self.lock();
        state.recipients += 1;
        Recipient {
            tracker: self.clone(),
            settled: state.seq,
        }
    }

    /// Changes not settled yet.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.lock().pending.len()
    }
}

// === impl Recipient ===

impl Recipient {
    /// The recipient was handed the entry of slot seq `seq` now (so every change up to it).
    pub(crate) fn handed(&mut self, seq: u64) {
        self.handed_at(seq, Instant::now());
    }

    /// [`handed`](Self::handed) at a given time.
    pub(crate) fn handed_at(&mut self, seq: u64, now: Instant) {
        self.settle(seq, Some(now));
    }

    /// The recipient will not be handed the changes up to slot seq `seq` (a blocking query
    /// whose index they do not pass): they no longer wait for it.
    pub(crate) fn skipped(&mut self, seq: u64) {
        self.settle(seq, None);
    }

    fn settle(&mut self, upto: u64, handed: Option<Instant>) {
        if upto <= self.settled {
            return;
        }
        let tracker = &self.tracker;
        tracker
            .lock()
            .settle(&tracker.histogram, self.settled, upto, handed);
        self.settled = upto;
    }
}

impl Drop for Recipient {
    fn drop(&mut self) {
        let tracker = &self.tracker;
        let mut state = tracker.lock();
        state.settle(&tracker.histogram, self.settled, u64::MAX, None);
        state.recipients -= 1;
    }
}

// === impl State ===

impl State {
    /// One recipient settles the changes after slot seq `after` up to `upto`, handed them
    /// at `handed` (or not handed them); each change it was the last to settle is
    /// observed, if anyone was handed it.
    fn settle(&mut self, histogram: &Histogram, after: u64, upto: u64, handed: Option<Instant>) {
        self.pending.retain_mut(|p| {
            if p.seq <= after || p.seq > upto {
                return true;
            }
            p.owed -= 1;
            if handed.is_some() {
                p.handed = handed;
            }
            if p.owed > 0 {
                return true;
            }
            if let Some(last) = p.handed {
                histogram.observe(last.saturating_duration_since(p.at).as_secs_f64());
            }
            false
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};
    use std::collections::BTreeMap;
    use std::fmt::Write;
    use std::time::Duration;

    /// One step; times are seconds after the start.
    enum Op {
        Join(&'static str),
        Change(u64, u64),
        Hand(&'static str, u64, u64),
        Skip(&'static str, u64),
        Leave(&'static str),
    }
    use Op::*;

    /// The observations so far: `count sum`.
    fn observed(histogram: &Histogram) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("d", "", histogram.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let value = |suffix: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("d_{suffix} ")))
                .unwrap()
                .to_owned()
        };
        format!("count={} sum={}", value("count"), value("sum"))
    }

    fn check(ops: &[Op], expect: Expect) {
        let histogram = Histogram::new([1.0]);
        let tracker = Arc::new(Tracker::new(histogram.clone(), 1));
        let start = Instant::now();
        let secs = |s: u64| start + Duration::from_secs(s);
        let mut recipients = BTreeMap::new();
        let mut out = String::new();
        for op in ops {
            let label = match op {
                Join(who) => {
                    recipients.insert(*who, tracker.register());
                    format!("join {who}")
                }
                Change(seq, at) => {
                    tracker.changed(*seq, secs(*at));
                    format!("change {seq} @{at}")
                }
                Hand(who, seq, at) => {
                    recipients.get_mut(who).unwrap().handed_at(*seq, secs(*at));
                    format!("hand {who} {seq} @{at}")
                }
                Skip(who, seq) => {
                    recipients.get_mut(who).unwrap().skipped(*seq);
                    format!("skip {who} {seq}")
                }
                Leave(who) => {
                    recipients.remove(who);
                    format!("leave {who}")
                }
            };
            let _ = writeln!(
                out,
                "{label:<14} {} pending={}",
                observed(&histogram),
                tracker.pending()
            );
        }
        expect.assert_eq(&out);
    }

    #[test]
    fn observed_once_when_the_last_recipient_was_handed_it() {
        check(
            &[
                Join("a"),
                Join("b"),
                Join("c"),
                Change(2, 10),
                Hand("b", 2, 11),
                Hand("a", 2, 12),
                Hand("c", 2, 13),
                // Nothing owed any more: a repeated handover changes nothing.
                Hand("c", 2, 14),
            ],
            expect![[r#"
                join a         count=0 sum=0.0 pending=0
                join b         count=0 sum=0.0 pending=0
                join c         count=0 sum=0.0 pending=0
                change 2 @10   count=0 sum=0.0 pending=1
                hand b 2 @11   count=0 sum=0.0 pending=1
                hand a 2 @12   count=0 sum=0.0 pending=1
                hand c 2 @13   count=1 sum=3.0 pending=0
                hand c 2 @14   count=1 sum=3.0 pending=0
            "#]],
        );
    }

    #[test]
    fn no_recipient_no_observation() {
        check(
            &[
                Change(2, 0),
                Join("a"),
                // Registered after change 2: owes only what comes next.
                Hand("a", 2, 5),
                Leave("a"),
                Change(3, 6),
            ],
            expect![[r#"
                change 2 @0    count=0 sum=0.0 pending=0
                join a         count=0 sum=0.0 pending=0
                hand a 2 @5    count=0 sum=0.0 pending=0
                leave a        count=0 sum=0.0 pending=0
                change 3 @6    count=0 sum=0.0 pending=0
            "#]],
        );
    }

    #[test]
    fn a_newer_entry_settles_the_changes_it_covers() {
        check(
            &[
                Join("a"),
                Change(2, 0),
                Join("b"),
                Change(3, 1),
                Hand("b", 3, 2),
                Hand("a", 3, 5),
            ],
            expect![[r#"
                join a         count=0 sum=0.0 pending=0
                change 2 @0    count=0 sum=0.0 pending=1
                join b         count=0 sum=0.0 pending=1
                change 3 @1    count=0 sum=0.0 pending=2
                hand b 3 @2    count=0 sum=0.0 pending=2
                hand a 3 @5    count=2 sum=9.0 pending=0
            "#]],
        );
    }

    #[test]
    fn leaving_and_skipping_do_not_hold_it_open() {
        check(
            &[
                Join("a"),
                Join("b"),
                Join("c"),
                Change(2, 0),
                Hand("a", 2, 2),
                Skip("b", 2),
                // The last one leaves later: observed then, with the last handover's time.
                Leave("c"),
                // Nobody is handed change 3: not observed.
                Change(3, 10),
                Skip("a", 3),
                Leave("b"),
            ],
            expect![[r#"
                join a         count=0 sum=0.0 pending=0
                join b         count=0 sum=0.0 pending=0
                join c         count=0 sum=0.0 pending=0
                change 2 @0    count=0 sum=0.0 pending=1
                hand a 2 @2    count=0 sum=0.0 pending=1
                skip b 2       count=0 sum=0.0 pending=1
                leave c        count=1 sum=2.0 pending=0
                change 3 @10   count=1 sum=2.0 pending=1
                skip a 3       count=1 sum=2.0 pending=1
                leave b        count=1 sum=2.0 pending=0
            "#]],
        );
    }
}
