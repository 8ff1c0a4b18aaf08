//! The controller side: a [`ClusterListener`] that owns the table and pushes its changes.

use crate::metrics::Metrics;
use crate::queue::Queue;
use crate::table::{Change, Table};
use plugin_api::{ClusterEvent, ClusterListener, ClusterSnapshot};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// The controller side of the endpoint table: register it as the controller's
/// [`ClusterListener`]. It applies every event to its [`Table`] at once and queues the
/// resulting changes for the apiserver side without ever waiting for it.
///
/// Dropping it ends the apiserver side's feed; the apiserver keeps serving what it has.
#[derive(Debug)]
pub struct TableFeed {
    table: Mutex<Table>,
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
}

impl TableFeed {
    pub(crate) fn new(queue: Arc<Queue>, metrics: Arc<Metrics>) -> Self {
        Self {
            table: Mutex::new(Table::new()),
            queue,
            metrics,
        }
    }

    fn record(&self, changes: &[Change], rev: u64) {
        self.metrics.changes.inc_by(changes.len() as u64);
        for change in changes {
            match change {
                Change::Upsert { entry } => tracing::debug!(
                    service = %entry.service,
                    project = %entry.project,
                    index = entry.index,
                    endpoints = entry.endpoints().count(),
                    rev,
                    "endpoint entry changed"
                ),
                Change::Removed {
                    service, project, ..
                } => {
                    tracing::debug!(%service, %project, rev, "endpoint entry removed")
                }
            }
        }
    }
}

impl ClusterListener for TableFeed {
    fn resync(&self, snapshot: &ClusterSnapshot) {
        let at = Instant::now();
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let changes = table.resync(snapshot);
        self.record(&changes, snapshot.rev);
        self.queue
            .push_resync(table.entries().cloned(), snapshot.rev, at);
        tracing::info!(
            rev = snapshot.rev,
            services = snapshot.services.len(),
            changed = changes.len(),
            "endpoint table resynced"
        );
    }

    fn on_event(&self, event: &ClusterEvent) {
        self.on_events(std::slice::from_ref(event));
    }

    /// Fails closed: the apiserver side answers 503 `stale` and ends its watchers until
    /// the next resync (the table itself is kept: the resync's changes are computed
    /// against it, so a reader's index never goes back).
    fn stale(&self, reason: &str) {
        self.mark_stale(reason);
    }

    /// One new entry per touched service for the whole batch (not one per event), and one
    /// push to the queue.
    fn on_events(&self, events: &[ClusterEvent]) {
        self.on_events_since(events, Instant::now());
    }

    /// The delivery clock of these changes starts at `since` (never later than now): in a
    /// separate apiserver, when the revision was first known to exist, so the store
    /// watch's delay counts.
    fn on_events_since(&self, events: &[ClusterEvent], since: Instant) {
        let Some(last) = events.last() else {
            return;
        };
        let at = since.min(Instant::now());
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let changes = table.apply_batch(events);
        drop(table);
        self.record(&changes, last.rev());
        self.queue.push_changes(changes, at);
    }
}

impl TableFeed {
    /// See [`ClusterListener::stale`].
    fn mark_stale(&self, reason: &str) {
        tracing::warn!(%reason, "endpoint table stale: answering 503 until the next resync");
        self.queue.push_stale(reason, Instant::now());
    }
}

impl Drop for TableFeed {
    fn drop(&mut self) {
        self.queue.close();
    }
}
