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
    /// From a change of a service's entry reaching the feed to the last watcher of the
    /// service connected then having been handed it (see `crate::delivery`).
    pub(crate) delivery: Histogram,
}

/// The buckets of `xce_endpoint_delivery_seconds`, in seconds: readable boundaries around
/// the values `drain` takes (default 5s, at most 10m).
pub(crate) const DELIVERY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

impl Metrics {
    pub(crate) fn new() -> Self {
        Self {
            changes: Counter::default(),
            watchers: Gauge::default(),
            watchers_rejected: Counter::default(),
            streams_lagged: Counter::default(),
            // 50µs .. ~13s
            propagation: Histogram::new(exponential_buckets(0.000_05, 4.0, 10)),
            delivery: Histogram::new(DELIVERY_BUCKETS),
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
        registry.register(
            "xce_endpoint_delivery_seconds",
            "Time from an endpoint change reaching this process's table feed to the last \
             watcher of the service connected then having been sent it (blocking answer \
             built, stream event yielded); changes no watcher was sent are not observed",
            self.delivery.clone(),
        );
    }
}
