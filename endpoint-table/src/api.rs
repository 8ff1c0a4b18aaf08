//! The apiserver side's public face: [`EndpointApi`], an [`ApiExtension`] serving from the
//! [`Shared`] state, fed by [`Update`]s.

use crate::config::TableConfig;
use crate::entry::Entry;
use crate::metrics::{Kind, Metrics};
use crate::queue::{Queue, Update};
use crate::shared::{pump, Authority, Shared};
use plugin_api::{ApiContext, ApiError, ApiExtension, Parked, Principal, ServiceKey};
use std::sync::{Arc, Mutex, PoisonError};

/// The apiserver side of the endpoint table: register it as an [`ApiExtension`].
///
/// It serves from its own copy of the entries, fed by [`Update`]s: from the in-process
/// [`TableFeed`](crate::TableFeed) when built by [`endpoint_table`](crate::endpoint_table)
/// (the feed is pumped by a task started in [`ApiExtension::router`]), or by
/// [`apply`](Self::apply) from any other source.
#[derive(Debug)]
pub struct EndpointApi {
    shared: Arc<Shared>,
    /// The in-process queue, until [`ApiExtension::router`] starts its pump.
    pump: Mutex<Option<Arc<Queue>>>,
}

// === impl EndpointApi ===

impl EndpointApi {
    pub(crate) fn new(cfg: TableConfig, metrics: Arc<Metrics>, queue: Option<Arc<Queue>>) -> Self {
        Self {
            shared: Arc::new(Shared::new(cfg, metrics, queue.clone())),
            pump: Mutex::new(queue),
        }
    }

    /// An apiserver side with no in-process feed, driven by [`apply`](Self::apply) (e.g.
    /// from a remote controller's change stream).
    pub fn standalone(cfg: TableConfig) -> Self {
        Self::new(cfg, Arc::new(Metrics::new()), None)
    }

    /// Applies one update from the controller side, waking the watchers of the services it
    /// changes (and only those).
    pub fn apply(&self, update: Update) {
        self.shared.apply(update, None);
    }

    /// Answers from the table only while `authority` says so: every read, and every
    /// blocking query again when its wait ends, asks it first and answers 503 `stale`
    /// with its reason otherwise (see [`Authority`]). Set once; later calls change nothing.
    pub fn answer_while(&self, authority: Authority) {
        self.shared.set_authority(authority);
    }

    /// Waits until everything the in-process feed had queued when called is applied here
    /// (at once without an in-process feed). The pump must be running, i.e.
    /// [`ApiExtension::router`] called.
    pub async fn flushed(&self) {
        self.shared.flushed().await
    }

    /// The entry of service `key` as served now (no access control: for the host's own
    /// use).
    pub fn entry(&self, key: &ServiceKey) -> Option<Arc<Entry>> {
        self.shared.entry(key)
    }

    /// Every entry as served now, whatever its project (no access control: for the
    /// host's own use, e.g. a DNS zone built from the whole table); `None` while the
    /// routes answer 503 (before the first resync reached this side, or stale).
    pub fn snapshot(&self) -> Option<Vec<Arc<Entry>>> {
        self.shared.snapshot()
    }

    /// A counter raised after every update applied here (a change, a resync, a stale
    /// mark): wait on it (`changed()`), then take a [`snapshot`](Self::snapshot). Values
    /// are coalesced like any watch channel's: one wake-up may cover many updates.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn start_pump(&self) {
        let Some(queue) = self
            .pump
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let shared = Arc::downgrade(&self.shared);
        let pump = pump(queue, shared);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(pump);
            }
            Err(_) => {
                // Called outside a runtime: run the pump on its own thread rather than
                // leave the routes answering 503 forever.
                let spawned = std::thread::Builder::new()
                    .name("endpoint-table".into())
                    .spawn(
                        move || match tokio::runtime::Builder::new_current_thread().build() {
                            Ok(rt) => rt.block_on(pump),
                            Err(error) => {
                                tracing::error!(%error, "cannot start the endpoint table feed")
                            }
                        },
                    );
                if let Err(error) = spawned {
                    tracing::error!(%error, "cannot start the endpoint table feed");
                }
            }
        }
    }
}

impl ApiExtension for EndpointApi {
    fn router(&self, cx: ApiContext) -> axum::Router {
        self.start_pump();
        // The web view rides along: every apiserver that serves the endpoints serves the
        // page that shows them.
        crate::routes::router(self.shared.clone(), cx).merge(crate::ui::router())
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.shared.metrics.register(registry);
    }

    /// Parked blocking queries answer with the current entry, streams end (their
    /// clients resume elsewhere with `Last-Event-ID`), later ones do not wait.
    fn drain(&self) {
        self.shared.draining.send_replace(true);
    }

    /// The host's parked detail queries share the endpoint queries' and streams' caps.
    fn park(&self, principal: &Principal) -> Option<Result<Parked, ApiError>> {
        Some(
            self.shared
                .watcher(principal, Kind::Detail)
                .map(|g| Box::new(g) as Parked),
        )
    }
}
