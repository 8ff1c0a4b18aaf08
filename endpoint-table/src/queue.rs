//! The seam between the controller side and the apiserver side: [`Update`]s, and the
//! in-process coalescing queue that carries them.
//!
//! The controller must never wait for the apiserver side. So the queue is not a FIFO of
//! every change: it keeps at most one pending change per service (the newest entry
//! replaces an older one that was not taken yet), and a pending resync absorbs the changes
//! that follow it. Its size is therefore bounded by the number of services, however slow
//! the consumer, and every entry carries the whole state of its service, so dropping the
//! intermediate ones loses nothing a reader could observe except the intermediate indexes.

use crate::entry::Entry;
use crate::table::Change;
use plugin_api::ServiceKey;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;
use tokio::sync::Notify;

/// What the apiserver side applies to its copy of the table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "update")]
pub enum Update {
    /// Replace everything with these entries (the first update, and after a controller
    /// restart). Until the first one arrives, the endpoint routes answer 503.
    Resync {
        /// Every entry.
        entries: Vec<Arc<Entry>>,
        /// The cluster revision the entries are at (0 from a source that predates it: the
        /// highest entry index is taken then).
        #[serde(default)]
        rev: u64,
    },
    /// One service changed.
    Change {
        /// The change.
        change: Change,
    },
    /// The source can no longer follow the controller (it met a record or an event it
    /// does not understand) and reloads: until the next resync the routes answer 503
    /// `stale` with `reason`, and open watchers end; never the old entries.
    Stale {
        /// Why, for the answers.
        reason: String,
    },
}

/// The pending updates, newest entry per service.
#[derive(Debug, Default)]
struct Pending {
    /// A resync not taken yet, with the changes since applied on top, its revision (raised
    /// by those changes), and when it came.
    resync: Option<(BTreeMap<ServiceKey, Arc<Entry>>, u64, Instant)>,
    /// Changes not taken yet, by service, with when the oldest of them came.
    changes: BTreeMap<ServiceKey, (Change, Instant)>,
    /// A stale mark not taken yet (see [`Update::Stale`]), and when it came; it
    /// supersedes everything pending before it, and a resync supersedes it.
    stale: Option<(String, Instant)>,
    /// How many pushes there were, ever.
    generation: u64,
    /// The producer is gone.
    closed: bool,
}

impl Pending {
    /// Whether anything waits to be taken.
    fn any(&self) -> bool {
        self.resync.is_some() || !self.changes.is_empty() || self.stale.is_some()
    }
}

/// Updates taken from the queue at once.
#[derive(Debug)]
pub(crate) struct Drained {
    /// The updates, each with when the feed received the event behind it.
    pub(crate) updates: Vec<(Update, Instant)>,
    /// The queue's generation they bring the consumer to.
    pub(crate) generation: u64,
}

/// A single-producer, single-consumer coalescing queue of [`Update`]s.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    pending: Mutex<Pending>,
    notify: Notify,
    /// `pending.generation`, readable without the lock: a reader checks on every request
    /// whether the apiserver side is behind (see [`pushed`](Self::pushed)).
    pushed: AtomicU64,
}

// === impl Queue ===

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a full resync; pending changes are superseded by it.
    pub(crate) fn push_resync(
        &self,
        entries: impl IntoIterator<Item = Arc<Entry>>,
        rev: u64,
        at: Instant,
    ) {
        let mut pending = self.lock();
        let entries = entries.into_iter().map(|e| (e.key(), e)).collect();
        pending.resync = Some((entries, rev, at));
        pending.changes.clear();
        pending.stale = None;
        pending.generation += 1;
        self.pushed.store(pending.generation, Ordering::Release);
        drop(pending);
        self.notify.notify_one();
    }

    /// Queues changes, replacing older pending ones of the same services. Never blocks
    /// (beyond a short lock) and never grows past one change per service.
    pub(crate) fn push_changes(&self, changes: Vec<Change>, at: Instant) {
        if changes.is_empty() {
            return;
        }
        let mut pending = self.lock();
        let pending = &mut *pending;
        for change in changes {
            let service = change.key();
            if let Some((entries, rev, _)) = &mut pending.resync {
                *rev = (*rev).max(change.index());
                match change {
                    Change::Upsert { entry } => entries.insert(service, entry),
                    Change::Removed { .. } => entries.remove(&service),
                };
                continue;
            }
            match pending.changes.get_mut(&service) {
                // Keep the oldest arrival: the propagation latency is that of the first
                // event the consumer has not seen yet.
                Some(slot) => slot.0 = change,
                None => {
                    pending.changes.insert(service, (change, at));
                }
            }
        }
        pending.generation += 1;
        self.pushed.store(pending.generation, Ordering::Release);
        self.notify.notify_one();
    }

    /// Queues a stale mark (see [`Update::Stale`]): what was pending is dropped (it came
    /// from the state the source no longer vouches for).
    pub(crate) fn push_stale(&self, reason: &str, at: Instant) {
        let mut pending = self.lock();
        pending.resync = None;
        pending.changes.clear();
        pending.stale = Some((reason.to_owned(), at));
        pending.generation += 1;
        self.pushed.store(pending.generation, Ordering::Release);
        drop(pending);
        self.notify.notify_one();
    }

    /// Marks the producer gone; the consumer ends once it took everything.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_one();
    }

    /// How many pushes there were so far.
    pub(crate) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// The same, without taking the lock: every push that returned is counted.
    pub(crate) fn pushed(&self) -> u64 {
        self.pushed.load(Ordering::Acquire)
    }

    /// Takes everything pending, if anything is.
    pub(crate) fn drain(&self) -> Option<Drained> {
        let mut pending = self.lock();
        if !pending.any() {
            return None;
        }
        let mut updates = Vec::with_capacity(pending.changes.len() + 1);
        if let Some((reason, at)) = pending.stale.take() {
            updates.push((Update::Stale { reason }, at));
        }
        if let Some((entries, rev, at)) = pending.resync.take() {
            let entries = entries.into_values().collect();
            updates.push((Update::Resync { entries, rev }, at));
        }
        // In revision order (the map is by service): a consumer that numbers what it
        // applies (the all-services stream) sees the revisions only grow.
        let mut changes: Vec<_> = std::mem::take(&mut pending.changes).into_values().collect();
        changes.sort_by_key(|(change, _)| change.index());
        updates.extend(
            changes
                .into_iter()
                .map(|(change, at)| (Update::Change { change }, at)),
        );
        Some(Drained {
            updates,
            generation: pending.generation,
        })
    }

    /// Waits until updates are pending: `true` then, `false` once the producer is gone
    /// and everything was taken. Another consumer may take them first; see
    /// [`drain`](Self::drain).
    pub(crate) async fn pending(&self) -> bool {
        loop {
            {
                let pending = self.lock();
                if pending.any() {
                    return true;
                }
                if pending.closed {
                    return false;
                }
            }
            // `notify_one` leaves a permit when nobody waits, so a push between the
            // check above and this wait is not lost.
            self.notify.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    /// `service` is `name` or `project/name` (project `p` when not given).
    fn entry(service: &str, index: u64) -> Arc<Entry> {
        let (project, name) = service.split_once('/').unwrap_or(("p", service));
        Arc::new(Entry {
            service: name.into(),
            project: project.into(),
            index,
            ports: vec![],
            replicas: vec![],
            meta: Default::default(),
            rendered: Default::default(),
        })
    }

    fn upsert(service: &str, index: u64) -> Change {
        Change::Upsert {
            entry: entry(service, index),
        }
    }

    fn removed(service: &str, index: u64) -> Change {
        let (project, name) = service.split_once('/').unwrap_or(("p", service));
        Change::Removed {
            service: name.into(),
            project: project.into(),
            index,
        }
    }

    enum Op {
        Resync(Vec<Arc<Entry>>),
        Changes(Vec<Change>),
        Stale(&'static str),
        Drain,
    }

    fn check(ops: Vec<Op>, expect: Expect) {
        let queue = Queue::default();
        let mut out = String::new();
        for op in ops {
            match op {
                Op::Resync(entries) => queue.push_resync(entries, 0, Instant::now()),
                Op::Changes(changes) => queue.push_changes(changes, Instant::now()),
                Op::Stale(reason) => queue.push_stale(reason, Instant::now()),
                Op::Drain => {
                    let Some(drained) = queue.drain() else {
                        out.push_str("drain: nothing\n");
                        continue;
                    };
                    let updates: Vec<String> = drained
                        .updates
                        .iter()
                        .map(|(u, _)| match u {
                            Update::Resync { entries, .. } => {
                                let e: Vec<_> = entries
                                    .iter()
                                    .map(|e| format!("{}#{}", e.key(), e.index))
                                    .collect();
                                format!("resync[{}]", e.join(" "))
                            }
                            Update::Change {
                                change: Change::Upsert { entry },
                            } => format!("{}#{}", entry.key(), entry.index),
                            Update::Change {
                                change: change @ Change::Removed { .. },
                            } => format!("-{}", change.key()),
                            Update::Stale { reason } => format!("stale({reason})"),
                        })
                        .collect();
                    out.push_str(&format!(
                        "drain gen {}: {}\n",
                        drained.generation,
                        updates.join(", ")
                    ));
                }
            }
        }
        expect.assert_eq(&out);
    }

    /// A stale mark drops what was pending before it (its source no longer vouches for
    /// it); a resync after it supersedes it (fresh state, nothing stale left to say).
    #[test]
    fn a_stale_mark_supersedes_what_was_pending_and_a_resync_supersedes_it() {
        check(
            vec![
                Op::Changes(vec![upsert("a", 4), upsert("b", 5)]),
                Op::Stale("not understood"),
                Op::Drain,
                Op::Resync(vec![entry("a", 6)]),
                Op::Stale("not understood"),
                Op::Drain,
                Op::Stale("not understood"),
                Op::Resync(vec![entry("a", 7)]),
                Op::Drain,
            ],
            expect![[r#"
                drain gen 2: stale(not understood)
                drain gen 4: stale(not understood)
                drain gen 6: resync[p/a#7]
            "#]],
        );
    }

    #[test]
    fn coalesces_per_service() {
        check(
            vec![
                Op::Drain,
                Op::Changes(vec![upsert("a", 1), upsert("b", 2), upsert("q/a", 2)]),
                // Replaces p/a#1 only: q/a is another service.
                Op::Changes(vec![upsert("a", 3)]),
                Op::Changes(vec![]),
                Op::Changes(vec![removed("b", 4)]),
                Op::Drain,
                Op::Drain,
                Op::Changes(vec![upsert("a", 4)]),
                Op::Resync(vec![entry("a", 5), entry("c", 5), entry("q/c", 5)]),
                // Removes p/c only.
                Op::Changes(vec![upsert("d", 6), removed("c", 7)]),
                Op::Drain,
            ],
            expect![[r#"
                drain: nothing
                drain gen 3: q/a#2, p/a#3, -p/b
                drain: nothing
                drain gen 6: resync[p/a#5 p/d#6 q/c#5]
            "#]],
        );
    }

    #[tokio::test]
    async fn pending_ends_after_close() {
        let queue = Arc::new(Queue::default());
        queue.push_changes(vec![upsert("a", 1)], Instant::now());
        queue.close();
        let first = queue.pending().await;
        let taken = queue.drain().map(|d| d.updates.len());
        let second = queue.pending().await;
        assert_eq!((first, taken, second), (true, Some(1), false));
    }
}
