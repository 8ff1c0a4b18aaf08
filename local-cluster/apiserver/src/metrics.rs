//! The separate apiserver's own metrics, next to its extensions' in one registry.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Follower and forwarding metrics.
#[derive(Debug, Clone, Default)]
pub(crate) struct Metrics {
    /// The controller revision the listeners are at.
    pub(crate) applied: Gauge,
    /// 1 while an etcd watch is established.
    pub(crate) watching: Gauge,
    /// Events applied from the watch.
    pub(crate) events: Counter,
    /// Whole loads of the state (the first one included).
    pub(crate) resyncs: Counter,
    /// Requests forwarded to the leader, by outcome (`ok`, `no_leader`, `unreachable`).
    pub(crate) forwarded: Family<Vec<(String, String)>, Counter>,
    /// Reads of the leader key: the first, and one after each broken or silent watch.
    pub(crate) leader_reads: Counter,
    /// Changes of the leader key's holder learned (from the watch, or a read).
    pub(crate) leader_changes: Counter,
    /// Times the listeners were told to fail closed (a record or an event not
    /// understood, a load that failed).
    pub(crate) not_understood: Counter,
    /// The lag (`fresh.rs`), in seconds.
    pub(crate) lag: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Times this apiserver failed closed because it fell behind (or heard nothing).
    pub(crate) lagging: Counter,
    /// Registration writes and lease renewals that failed.
    pub(crate) registration_failures: Counter,
    /// 1 for the etcd member the follower watches (by `HOST:PORT`), 0 for the others.
    pub(crate) watched: Family<Vec<(String, String)>, Gauge>,
}

impl Metrics {
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "xce_apiserver_applied_revision",
            "The controller revision this apiserver's copy of the cluster is at",
            self.applied.clone(),
        );
        r.register(
            "xce_apiserver_watching",
            "1 while the etcd watch that feeds this apiserver is established",
            self.watching.clone(),
        );
        r.register(
            "xce_apiserver_events",
            "Controller events applied from the etcd watch",
            self.events.clone(),
        );
        r.register(
            "xce_apiserver_resyncs",
            "Whole loads of the state from etcd (the first one included)",
            self.resyncs.clone(),
        );
        r.register(
            "xce_apiserver_forwarded",
            "Requests forwarded to the leader controller, by outcome",
            self.forwarded.clone(),
        );
        r.register(
            "xce_apiserver_leader_reads",
            "Reads of the leader key: the first, then one after each broken or silent watch of it",
            self.leader_reads.clone(),
        );
        r.register(
            "xce_apiserver_leader_changes",
            "Changes of the leader (or to none) learned from the leader key",
            self.leader_changes.clone(),
        );
        r.register(
            "xce_apiserver_stale",
            "Times this apiserver stopped serving its copy (503 stale) because it met a \
             record or an event it does not understand, or could not load the state",
            self.not_understood.clone(),
        );
        r.register(
            "xce_apiserver_lag_seconds",
            "Time since the oldest store revision this apiserver knows exists (with changes \
             under the store's prefix) and has not applied; 0 when caught up",
            self.lag.clone(),
        );
        r.register(
            "xce_apiserver_lagging",
            "Times this apiserver failed closed (503 stale) because its lag passed max_lag or \
             it heard nothing from etcd for that long",
            self.lagging.clone(),
        );
        r.register(
            "xce_apiserver_watched_member",
            "1 for the etcd member (endpoint) the follower's watch is on, 0 for the others",
            self.watched.clone(),
        );
        r.register(
            "xce_apiserver_registration_failures",
            "Writes of this apiserver's registration, and renewals of its lease, that failed",
            self.registration_failures.clone(),
        );
    }

    /// The follower watches `endpoints[at]` now.
    pub(crate) fn watching_member(&self, endpoints: &[String], at: usize) {
        for (i, ep) in endpoints.iter().enumerate() {
            self.watched
                .get_or_create(&vec![("endpoint".to_owned(), ep.clone())])
                .set(i64::from(i == at));
        }
    }

    pub(crate) fn forwarded(&self, outcome: &str) {
        self.forwarded
            .get_or_create(&vec![("outcome".to_owned(), outcome.to_owned())])
            .inc();
    }
}
