//! The table's metrics, shared by the feed and the API side.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Counters and gauges of one endpoint table.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Entries that really changed (one per service per change), removals included.
    pub(crate) changes: Counter,
    /// Blocking queries waiting and streams open, by kind.
    pub(crate) watchers: Family<KindLabel, Gauge>,
    /// Watchers refused past a cap, by kind.
    pub(crate) watchers_rejected: Family<KindLabel, Counter>,
    /// Streams disconnected because the client fell behind, by kind.
    pub(crate) streams_lagged: Family<KindLabel, Counter>,
    /// From the feed receiving an event to the API side having applied its change.
    pub(crate) propagation: Histogram,
    /// From a change of a service's entry reaching the feed to the last watcher of the
    /// service connected then having been handed it, by kind of watcher (see
    /// `crate::delivery`).
    pub(crate) delivery: Family<KindLabel, Histogram, fn() -> Histogram>,
}

/// What kind of watcher: the `kind` label of the watcher metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// A blocking query while it waits (`?index=&wait=`).
    Blocking,
    /// `GET /v1/services/{name}/endpoints/stream`.
    Stream,
    /// `GET /v1/endpoints/stream`, every service on one stream.
    AllServices,
    /// A blocking query on a service's detail (`GET /v1/services/{name}?index=`), which
    /// the host serves or forwards and counts here ([`plugin_api::ApiExtension::park`]).
    Detail,
}

impl EncodeLabelValue for Kind {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(match self {
            Kind::Blocking => "blocking",
            Kind::Stream => "stream",
            Kind::AllServices => "all_services",
            Kind::Detail => "detail",
        })
    }
}

/// The label set of the watcher metrics: `{kind="blocking"|"stream"|"all_services"|"detail"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct KindLabel {
    kind: Kind,
}

/// The buckets of `xce_endpoint_delivery_seconds`, in seconds: readable boundaries around
/// the values `drain` takes (default 5s, at most 10m).
pub(crate) const DELIVERY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

impl Metrics {
    pub(crate) fn new() -> Self {
        let metrics = Self {
            changes: Counter::default(),
            watchers: Family::default(),
            watchers_rejected: Family::default(),
            streams_lagged: Family::default(),
            // 50µs .. ~13s
            propagation: Histogram::new(exponential_buckets(0.000_05, 4.0, 10)),
            delivery: Family::new_with_constructor(|| Histogram::new(DELIVERY_BUCKETS)),
        };
        // Every kind shows from the start, at 0.
        for kind in [Kind::Blocking, Kind::Stream, Kind::AllServices] {
            let label = KindLabel { kind };
            let _ = metrics.watchers.get_or_create(&label);
            let _ = metrics.watchers_rejected.get_or_create(&label);
            let _ = metrics.delivery.get_or_create(&label);
            if kind != Kind::Blocking {
                let _ = metrics.streams_lagged.get_or_create(&label);
            }
        }
        metrics
    }

    /// One more (`+1`) or one less (`-1`) watcher of `kind`.
    pub(crate) fn watching(&self, kind: Kind, delta: i64) {
        self.watchers
            .get_or_create(&KindLabel { kind })
            .inc_by(delta);
    }

    /// The delivery histogram of watchers of `kind`.
    pub(crate) fn delivery(&self, kind: Kind) -> Histogram {
        self.delivery.get_or_create(&KindLabel { kind }).clone()
    }

    /// A watcher of `kind` refused past a cap.
    pub(crate) fn rejected(&self, kind: Kind) {
        self.watchers_rejected
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    /// A stream of `kind` cut off.
    pub(crate) fn lagged(&self, kind: Kind) {
        self.streams_lagged.get_or_create(&KindLabel { kind }).inc();
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "xce_endpoint_table_changes",
            "Endpoint table entries that changed (removals included)",
            self.changes.clone(),
        );
        registry.register(
            "xce_endpoint_watchers",
            "Endpoint blocking queries waiting and streams open, by kind",
            self.watchers.clone(),
        );
        registry.register(
            "xce_endpoint_watchers_rejected",
            "Endpoint watchers refused past a cap, by kind",
            self.watchers_rejected.clone(),
        );
        registry.register(
            "xce_endpoint_streams_lagged",
            "Endpoint streams disconnected because the client fell behind, by kind",
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
             watcher of its kind following the service then having been sent it (blocking \
             answer built, stream event yielded), by kind of watcher; changes no watcher of \
             the kind was sent are not observed",
            self.delivery.clone(),
        );
    }
}
