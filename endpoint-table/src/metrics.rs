//! The table's metrics, shared by the feed and the API side.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Counters and gauges of one endpoint table.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Entries that really changed (one per service per change), removals included.
    pub(crate) changes: Counter,
    /// Blocking queries waiting and streams open.
    pub(crate) watchers: Gauge,
    /// Watchers refused past a cap.
    pub(crate) watchers_rejected: Counter,
    /// Streams disconnected because the client fell behind.
    pub(crate) streams_lagged: Counter,
    /// From the feed receiving an event to the API side having applied its change.
    pub(crate) propagation: Histogram,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Self {
            changes: Counter::default(),
            watchers: Gauge::default(),
            watchers_rejected: Counter::default(),
            streams_lagged: Counter::default(),
            // 50µs .. ~13s
            propagation: Histogram::new(exponential_buckets(0.000_05, 4.0, 10)),
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "xce_endpoint_table_changes",
            "Endpoint table entries that changed (removals included)",
            self.changes.clone(),
        );
        registry.register(
            "xce_endpoint_watchers",
            "Endpoint blocking queries waiting and streams open",
            self.watchers.clone(),
        );
        registry.register(
            "xce_endpoint_watchers_rejected",
            "Endpoint watchers refused past a cap",
            self.watchers_rejected.clone(),
        );
        registry.register(
            "xce_endpoint_streams_lagged",
            "Endpoint streams disconnected because the client fell behind",
            self.streams_lagged.clone(),
        );
        registry.register(
            "xce_endpoint_propagation_seconds",
            "Time from the controller's event to the apiserver serving its change",
            self.propagation.clone(),
        );
    }
}
