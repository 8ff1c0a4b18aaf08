//! The state the apiserver side's routes serve from: its own copy of the entries, one watch
//! channel per service (so a watcher wakes only when its own service changed), the watcher
//! counts, and the pump that applies the in-process feed's [`Update`]s. Shared by
//! [`EndpointApi`](crate::EndpointApi) (which owns it) and the routes (which read it); it
//! knows neither.

use crate::config::TableConfig;
use crate::delivery::{Recipient, Tracker};
use crate::entry::Entry;
use crate::journal::Journal;
use crate::metrics::{Kind, Metrics};
use crate::queue::{Queue, Update};
use crate::table::Change;
use axum::http::StatusCode;
use plugin_api::{
    resolve_service, ApiError, Credential, Permission, Principal, Resolved, ServiceKey,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Instant;
use tokio::sync::watch;

/// What a service's watch channel holds.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    /// Raised on every update of the slot: how far behind a stream is, in changes.
    pub(crate) seq: u64,
    /// The entry; `None` once the service is gone.
    pub(crate) entry: Option<Arc<Entry>>,
    /// The deliveries of the slot's changes to its blocking queries (the same for the
    /// slot's life).
    pub(crate) blocking: Arc<Tracker>,
    /// The same, to its per-service streams.
    pub(crate) streams: Arc<Tracker>,
    /// Its per-service streams, checked for lag on every change (the same for the slot's
    /// life).
    pub(crate) laggards: Arc<Laggards>,
}

/// State shared by the routes and the pump.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) cfg: TableConfig,
    pub(crate) metrics: Arc<Metrics>,
    state: RwLock<ApiState>,
    watchers: Mutex<WatcherCounts>,
    /// The queue generation applied so far (in-process feed only).
    applied: watch::Sender<u64>,
    /// Held while taking updates from the queue and applying them, so that the pump and
    /// a request catching up never apply two batches out of order.
    catching_up: Mutex<()>,
    queue: Option<Arc<Queue>>,
    /// Turns true when the host drains ([`plugin_api::ApiExtension::drain`]): blocking
    /// queries answer and streams end. Watchers wait on it through [`Shared::ending`].
    pub(crate) draining: watch::Sender<bool>,
    /// Every change applied, numbered by cluster revision, for the all-services stream.
    pub(crate) journal: Journal,
    /// The all-services streams, checked for lag right after each publish of the journal
    /// (as a slot checks its streams): no watchdog task per stream, so one publish wakes
    /// each stream once, not a stream and its watchdog.
    pub(crate) all_laggards: Laggards,
    /// Raised after an update made at least one service appear (a slot was inserted):
    /// wakes the blocking queries parked on a name no visible service has yet, which
    /// then look again. Raised after the insert, so one that subscribes before it looks
    /// misses no appearance.
    pub(crate) appeared: watch::Sender<u64>,
    /// The deliveries of every change (by revision) to the all-services streams.
    all_delivery: Arc<Tracker>,
    /// Why the entries may be out of date (see [`Update::Stale`]), until the next
    /// resync; watchers end when it is set ([`Ending`]).
    stale: watch::Sender<Option<Arc<str>>>,
    /// Raised after every applied update, whatever it changed: what a consumer of the
    /// whole table (the DNS zone) waits on to rebuild once per change, never polling.
    pub(crate) changed: watch::Sender<u64>,
    /// Whether the host may still answer from this copy (see [`Authority`]); unset: always.
    authority: std::sync::OnceLock<Hook>,
}

/// An [`Authority`], shown by `Debug` as being set.
struct Hook(Authority);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Authority")
    }
}

/// Asked before every answer from the table: `Err(why)` when the host may no longer be
/// the one to answer (a controller whose leadership lease may have run out while it was
/// frozen: another may lead and have changed everything since). The routes answer 503
/// `stale` with the reason then, never the entry.
pub type Authority = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

#[derive(Debug, Default)]
struct ApiState {
    /// Whether a resync arrived (until then the routes answer 503).
    synced: bool,
    /// One watch channel per service, by service name, then project: a path's name finds
    /// every project that has a service of that name. A slot is here exactly while its
    /// service exists (it leaves the map when it is emptied).
    slots: HashMap<String, BTreeMap<String, watch::Sender<Slot>>>,
}

#[derive(Debug, Default)]
struct WatcherCounts {
    total: usize,
    per_principal: HashMap<String, usize>,
}

/// One watcher counted against the caps; uncounted when dropped.
#[derive(Debug)]
pub(crate) struct WatcherGuard {
    shared: Arc<Shared>,
    principal: String,
    kind: Kind,
}

/// What ends a watcher from outside, whatever its kind (blocking query, per-service
/// stream, all-services stream): the host's drain, or a reload of the host's tokens that
/// removed the watcher's token (or, for a watcher of one project, took away its view of
/// it). Every watcher waits on this one thing, so each kind ends the same way.
#[derive(Debug)]
pub(crate) struct Ending {
    draining: watch::Receiver<bool>,
    stale: watch::Receiver<Option<Arc<str>>>,
    credential: Credential,
    /// The project whose view the watcher needs; `None`: only the token's removal ends it
    /// (a watcher that checks visibility per entry itself, or waits for a service to
    /// appear).
    project: Option<String>,
}

/// Why a watcher must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The host stops serving: answer with what there is, end streams (clients resume
    /// elsewhere).
    Draining,
    /// Its token was removed or lost the view: answer what its next request would get
    /// ([`Credential::lost_answer`]).
    Revoked,
    /// The entries may be out of date ([`Update::Stale`]): answer 503 `stale`
    /// ([`Shared::stale_error`]), end streams; never the entry the watcher holds.
    Stale,
}

// === impl Shared ===

impl Shared {
    pub(crate) fn new(cfg: TableConfig, metrics: Arc<Metrics>, queue: Option<Arc<Queue>>) -> Self {
        let mut cfg = cfg;
        cfg.default_wait = cfg.default_wait.min(cfg.max_wait);
        let all_delivery = Arc::new(Tracker::new(metrics.delivery(Kind::AllServices), 0));
        Self {
            metrics,
            state: RwLock::default(),
            watchers: Mutex::default(),
            applied: watch::Sender::new(0),
            catching_up: Mutex::new(()),
            queue,
            draining: watch::Sender::new(false),
            appeared: watch::Sender::new(0),
            journal: Journal::new(cfg_journal(&cfg)),
            all_laggards: Laggards::default(),
            all_delivery,
            stale: watch::Sender::new(None),
            changed: watch::Sender::new(0),
            authority: std::sync::OnceLock::new(),
            cfg,
        }
    }

    /// What ends a watcher of `principal` from outside (see [`Ending`]); `project`: the
    /// project it needs the view of, if one.
    pub(crate) fn ending(&self, principal: &Principal, project: Option<&str>) -> Ending {
        Ending {
            draining: self.draining.subscribe(),
            stale: self.stale.subscribe(),
            credential: principal.credential.clone(),
            project: project.map(str::to_owned),
        }
    }

    /// See [`EndpointApi::answer_while`](crate::EndpointApi::answer_while).
    pub(crate) fn set_authority(&self, authority: Authority) {
        let _ = self.authority.set(Hook(authority));
    }

    /// 503 `stale` when the host may no longer answer from this copy (see [`Authority`]).
    pub(crate) fn ensure_authority(&self) -> Result<(), ApiError> {
        let Some(Hook(authority)) = self.authority.get() else {
            return Ok(());
        };
        authority().map_err(|why| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "stale",
                format!(
                    "these endpoints may be out of date ({why}): retry shortly or ask an apiserver"
                ),
            )
        })
    }

    /// See [`EndpointApi::flushed`](crate::EndpointApi::flushed).
    pub(crate) async fn flushed(&self) {
        let Some(queue) = &self.queue else {
            return;
        };
        let target = queue.generation();
        let mut applied = self.applied.subscribe();
        // The sender lives in `self`, so this cannot fail while `self` lives.
        let _ = applied.wait_for(|g| *g >= target).await;
    }

    /// The entry of service `key` as served now (no access control).
    pub(crate) fn entry(&self, key: &ServiceKey) -> Option<Arc<Entry>> {
        let state = self.read();
        let entry = state.slot(&key.project, &key.name)?.borrow().entry.clone();
        entry
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, ApiState> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies everything the in-process queue holds.
    fn catch_up(&self) {
        let Some(queue) = &self.queue else {
            return;
        };
        let _serial = self
            .catching_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(drained) = queue.drain() {
            for (update, at) in drained.updates {
                self.apply_one(update, Some(at));
            }
            // One batch holds every change of the revisions in it: published whole, so an
            // all-services stream never sees half of a revision, and is woken once.
            self.publish();
            self.applied.send_replace(drained.generation);
        }
    }

    /// Applies one update and publishes it to the all-services streams; `received`: when
    /// it reached the in-process feed.
    pub(crate) fn apply(&self, update: Update, received: Option<Instant>) {
        self.apply_one(update, received);
        self.publish();
    }

    /// Publishes the journal to the all-services streams, and cuts off those now past
    /// their limit (read or not).
    fn publish(&self) {
        let end = self.journal.publish();
        self.all_laggards.check(end);
    }

    /// Applies one update (recorded in the journal, not yet published).
    fn apply_one(&self, update: Update, received: Option<Instant>) {
        // When the change reached the table feed; from another source, when it reached us.
        let at = received.unwrap_or_else(Instant::now);
        let metrics = &*self.metrics;
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        // Under the state lock: the journal's order is the order the slots changed in.
        if let Some(id) = self.journal.record(&update) {
            // Noted before the record is published (so before any stream can take it).
            self.all_delivery.changed(id, at);
        }
        let mut inserted = false;
        match update {
            Update::Stale { reason } => {
                state.synced = false;
                self.stale.send_replace(Some(reason.into()));
            }
            Update::Resync { entries, .. } => {
                state.synced = true;
                self.stale.send_if_modified(|s| s.take().is_some());
                let mut entries: HashMap<ServiceKey, Arc<Entry>> =
                    entries.into_iter().map(|e| (e.key(), e)).collect();
                for (name, projects) in &mut state.slots {
                    projects.retain(|project, tx| {
                        match entries.remove(&ServiceKey::new(project, name)) {
                            Some(entry) => {
                                set(tx, Some(entry), at);
                                true
                            }
                            None => {
                                set(tx, None, at);
                                false
                            }
                        }
                    });
                }
                state.slots.retain(|_, projects| !projects.is_empty());
                for (key, entry) in entries {
                    state.insert(key, new_slot(entry, metrics));
                    inserted = true;
                }
            }
            Update::Change {
                change: Change::Upsert { entry },
            } => match state.slot(&entry.project, &entry.service) {
                Some(tx) => set(tx, Some(entry), at),
                None => {
                    state.insert(entry.key(), new_slot(entry, metrics));
                    inserted = true;
                }
            },
            Update::Change {
                change: Change::Removed {
                    service, project, ..
                },
            } => {
                if let Some(tx) = state.remove(&project, &service) {
                    set(&tx, None, at);
                }
            }
        }
        drop(state);
        if inserted {
            self.appeared.send_modify(|n| *n += 1);
        }
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        if let Some(at) = received {
            self.metrics.propagation.observe(at.elapsed().as_secs_f64());
        }
    }

    #[cfg(test)]
    pub(crate) fn watcher_count(&self) -> usize {
        self.watchers.lock().unwrap().total
    }

    #[cfg(test)]
    pub(crate) fn subscribe(&self, key: &ServiceKey) -> Option<watch::Receiver<Slot>> {
        Some(self.read().slot(&key.project, &key.name)?.subscribe())
    }

    /// 503 `stale` (see [`Update::Stale`]): the entries may be out of date.
    pub(crate) fn stale_error(&self) -> ApiError {
        let reason = self.stale.borrow().clone();
        let why = reason
            .as_deref()
            .unwrap_or("the source of the endpoints is reloading");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "stale",
            format!(
                "this apiserver's endpoints may be out of date ({why}); it is reloading them: \
                 retry shortly or ask another apiserver"
            ),
        )
    }

    /// 503 until the first resync arrived: never serve an empty table while catching up;
    /// 503 `stale` from a stale mark until the next resync: never serve what may be out
    /// of date.
    ///
    /// First, what the in-process feed queued and the pump has not applied yet is applied
    /// here: the controller answers a change once it has pushed it, and a read sent after
    /// that answer must see it (read your writes), not race the pump.
    pub(crate) fn ensure_synced(&self) -> Result<(), ApiError> {
        self.ensure_authority()?;
        if let Some(queue) = &self.queue {
            if queue.pushed() > *self.applied.borrow() {
                self.catch_up();
            }
        }
        if !self.read().synced {
            // In one process the controller resyncs before the apiserver serves: take that
            // resync now rather than race the pump and answer 503 to the first requests.
            self.catch_up();
        }
        if self.read().synced {
            Ok(())
        } else if self.stale.borrow().is_some() {
            Err(self.stale_error())
        } else {
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the endpoint table is catching up, retry shortly",
            ))
        }
    }

    /// The watch channel and current entry of the service a path's `name` (and
    /// `?project=`) resolves to for `principal` (docs/api.md): among the projects it may
    /// view that have a service `name`, exactly `project` when given. None: the one 404,
    /// the same bytes whether the name is unknown, only in projects the caller cannot
    /// view, or `project` is one it cannot view. Several (no `project`): 409 listing only
    /// those of the caller's projects.
    pub(crate) fn visible(
        &self,
        principal: &Principal,
        name: &str,
        project: Option<&str>,
    ) -> Result<(watch::Receiver<Slot>, Arc<Entry>), ApiError> {
        let not_found = || ApiError::service_not_found(name);
        let may = |p: &str| principal.may(Permission::JobView, p);
        let state = self.read();
        let key = match resolve_service(name, project, state.projects_of(name), may) {
            Resolved::Found(key) => key,
            Resolved::NotFound => return Err(not_found()),
            Resolved::Ambiguous(projects) => {
                return Err(ApiError::ambiguous_service(name, &projects))
            }
        };
        let rx = state
            .slot(&key.project, &key.name)
            .ok_or_else(not_found)?
            .subscribe();
        drop(state);
        let entry = rx.borrow().entry.clone().ok_or_else(not_found)?;
        if !may(&entry.project) {
            return Err(not_found());
        }
        Ok((rx, entry))
    }

    /// Registers a watcher of `rx`'s service, of `kind`, as a recipient of its changes
    /// (see `crate::delivery`): it owes every change from now on.
    pub(crate) fn recipient(&self, rx: &watch::Receiver<Slot>, kind: Kind) -> Recipient {
        let slot = rx.borrow();
        let tracker = match kind {
            // A detail query never registers (it watches no entry of the table).
            Kind::Blocking | Kind::Detail => slot.blocking.clone(),
            Kind::Stream | Kind::AllServices => slot.streams.clone(),
        };
        drop(slot);
        tracker.register()
    }

    /// Registers an all-services stream as a recipient of every change (by revision): it
    /// owes every change from now on.
    pub(crate) fn all_recipient(&self) -> Recipient {
        self.all_delivery.register()
    }

    /// Every entry as served now, whatever its project (no access control: for the host's
    /// own use); `None` while the routes answer 503 (before the first resync, or stale).
    pub(crate) fn snapshot(&self) -> Option<Vec<Arc<Entry>>> {
        let state = self.read();
        if !state.synced {
            return None;
        }
        let entries = state.slots.values().flat_map(|projects| projects.values());
        Some(entries.filter_map(|tx| tx.borrow().entry.clone()).collect())
    }

    /// Every entry `principal` may view (only those of `project` when given), by service
    /// name, then project.
    pub(crate) fn visible_entries(
        &self,
        principal: &Principal,
        project: Option<&str>,
    ) -> Vec<Arc<Entry>> {
        let mut entries: Vec<Arc<Entry>> = self
            .read()
            .slots
            .values()
            .flat_map(|projects| projects.values())
            .filter_map(|tx| tx.borrow().entry.clone())
            .filter(|e| project.is_none_or(|p| p == e.project))
            .filter(|e| principal.may(Permission::JobView, &e.project))
            .collect();
        entries.sort_by(|a, b| (&a.service, &a.project).cmp(&(&b.service, &b.project)));
        entries
    }

    /// Counts one more watcher of `kind` for `principal`, or 429 past a cap (the caps
    /// count every kind together).
    pub(crate) fn watcher(
        self: &Arc<Self>,
        principal: &Principal,
        kind: Kind,
    ) -> Result<WatcherGuard, ApiError> {
        let mut counts = self.watchers.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = counts
            .per_principal
            .get(&principal.name)
            .copied()
            .unwrap_or(0);
        let refused = if counts.total >= self.cfg.max_watchers {
            Some("too many watchers on this apiserver, retry later".to_owned())
        } else if mine >= self.cfg.max_watchers_per_principal {
            Some(format!(
                "too many watchers for {:?} (at most {}), retry later",
                principal.name, self.cfg.max_watchers_per_principal
            ))
        } else {
            None
        };
        if let Some(message) = refused {
            self.metrics.rejected(kind);
            tracing::debug!(principal = %principal.name, "watcher refused");
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_watchers",
                message,
            ));
        }
        counts.total += 1;
        *counts
            .per_principal
            .entry(principal.name.clone())
            .or_default() += 1;
        self.metrics.watching(kind, 1);
        Ok(WatcherGuard {
            shared: self.clone(),
            principal: principal.name.clone(),
            kind,
        })
    }
}

/// Moves updates from the in-process queue to the apiserver side until the feed is gone.
pub(crate) async fn pump(queue: Arc<Queue>, shared: Weak<Shared>) {
    while queue.pending().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.catch_up();
    }
    tracing::debug!("endpoint table feed closed");
}

// === impl ApiState ===

impl ApiState {
    /// The slot of service `name` in `project`.
    fn slot(&self, project: &str, name: &str) -> Option<&watch::Sender<Slot>> {
        self.slots.get(name)?.get(project)
    }

    /// The projects that have a service `name`.
    fn projects_of<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a str> {
        let projects = self.slots.get(name).into_iter().flat_map(|p| p.keys());
        projects.map(String::as_str)
    }

    fn insert(&mut self, key: ServiceKey, tx: watch::Sender<Slot>) {
        let projects = self.slots.entry(key.name).or_default();
        projects.insert(key.project, tx);
    }

    fn remove(&mut self, project: &str, name: &str) -> Option<watch::Sender<Slot>> {
        let projects = self.slots.get_mut(name)?;
        let tx = projects.remove(project);
        if projects.is_empty() {
            self.slots.remove(name);
        }
        tx
    }
}

fn new_slot(entry: Arc<Entry>, metrics: &Metrics) -> watch::Sender<Slot> {
    watch::Sender::new(Slot {
        seq: 1,
        entry: Some(entry),
        blocking: Arc::new(Tracker::new(metrics.delivery(Kind::Blocking), 1)),
        streams: Arc::new(Tracker::new(metrics.delivery(Kind::Stream), 1)),
        laggards: Arc::default(),
    })
}

/// Updates a slot, waking its watchers only if the entry really differs; a change that
/// reached the table feed at `at`.
fn set(tx: &watch::Sender<Slot>, entry: Option<Arc<Entry>>, at: Instant) {
    let changed = tx.send_if_modified(|slot| {
        if slot.entry == entry {
            return false;
        }
        slot.seq += 1;
        slot.entry = entry;
        // Noted before any watcher can see the new seq (this runs under the channel's
        // write lock): a watcher handed it must find it owed.
        slot.blocking.changed(slot.seq, at);
        slot.streams.changed(slot.seq, at);
        true
    });
    if changed {
        // Right after the change (outside the channel's lock): a stream that falls behind
        // is cut off at the change that puts it past `stream_buffer`, read or not.
        let (laggards, seq) = {
            let slot = tx.borrow();
            (slot.laggards.clone(), slot.seq)
        };
        laggards.check(seq);
    }
}

impl Drop for WatcherGuard {
    fn drop(&mut self) {
        let mut counts = self
            .shared
            .watchers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        counts.total -= 1;
        if let Some(n) = counts.per_principal.get_mut(&self.principal) {
            *n -= 1;
            if *n == 0 {
                counts.per_principal.remove(&self.principal);
            }
        }
        self.shared.metrics.watching(self.kind, -1);
    }
}

/// The per-service streams of one service slot, checked by whoever changes the slot
/// (`Laggards::check`, right after the change), so a client that never reads is cut
/// off at the change that puts it past its limit, as a watchdog task would, without a task
/// per stream that wakes on every change (issue 31: with 10,000 streams on a service, a
/// change woke 20,000 tasks, half of them only to find nobody behind). The same walk wakes
/// the streams (`Lag`'s waker): a per-service stream waits for its slot's changes here, not
/// in the slot's watch channel, whose waiter list every stream joined and left again per
/// event (under one of its eight locks, shared with the other core) and whose wake-up of
/// 10,000 waiters was 11 % of the server's CPU in the fan-out bench.
#[derive(Debug, Default)]
pub(crate) struct Laggards(Mutex<Vec<Weak<dyn Behind>>>);

/// A stream its slot follows (`crate::lag::Lag`).
pub(crate) trait Behind: Send + Sync + std::fmt::Debug {
    /// The slot is at `position`: true if the stream is (now) cut off. Wakes the stream
    /// if it asked to be woken on changes.
    fn check(&self, position: u64) -> bool;
}

impl Laggards {
    /// Follows `lag` until its stream is dropped or cut off.
    pub(crate) fn register(&self, lag: Weak<dyn Behind>) {
        self.lock().push(lag);
    }

    /// The slot is at `position` now: cuts off every stream past its limit, and forgets
    /// the streams that are gone or cut off.
    pub(crate) fn check(&self, position: u64) {
        self.lock()
            .retain(|lag| lag.upgrade().is_some_and(|lag| !lag.check(position)));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<dyn Behind>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// === impl WatcherGuard ===

impl WatcherGuard {
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    pub(crate) fn principal(&self) -> &str {
        &self.principal
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }
}

// === impl Ending ===

/// [`Ending::wait`] as a future a stream keeps across its events, polled only when one
/// of the channels it waits on woke it.
///
/// A stream polls it beside its wait for the next change every time the stream is polled,
/// i.e. on every event; polling [`Ending::wait`] itself then re-checked the drain,
/// staleness and credential channels each time, and re-registered the stream's waker in
/// their waiter lists (a lock on a list every watcher of the host shares, per event and
/// watcher: with 10,000 streams, 30,000 lock round trips per change, across the cores).
/// Here a poll that was not woken by those channels is a flag test.
pub(crate) struct EndingFuture {
    wait: std::pin::Pin<Box<dyn std::future::Future<Output = Ended> + Send>>,
    woken: Arc<WokenFlag>,
    /// The waker last registered in `woken.task`.
    kept: Option<std::task::Waker>,
}

/// Set by the ending's own waker; tells the stream's task.
#[derive(Default)]
struct WokenFlag {
    woken: std::sync::atomic::AtomicBool,
    task: StableWaker,
}

impl std::task::Wake for WokenFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, std::sync::atomic::Ordering::Release);
        self.task.wake();
    }
}

impl std::future::Future for EndingFuture {
    type Output = Ended;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Ended> {
        let me = &mut *self;
        me.woken.task.register(cx.waker(), &mut me.kept);
        if !me
            .woken
            .woken
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return std::task::Poll::Pending;
        }
        let waker = std::task::Waker::from(me.woken.clone());
        me.wait
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
    }
}

/// A task's waker that stays registered across wakes, for whoever wakes a stream on every
/// change (its slot, see [`Laggards`]) or now and then (the host's drain, staleness and
/// credential channels, see [`EndingFuture`]).
///
/// Unlike `AtomicWaker`, a wake does not take the waker, so the stream does not register
/// again after each event: it keeps a clone of what it registered, and registers only when
/// its task's waker is another (`will_wake`: two pointer compares). Registering on every
/// poll, as `AtomicWaker` wants, cost 6 % of the server's CPU in the fan-out bench (10,000
/// streams, each its own cold cache line per event).
#[derive(Default)]
pub(crate) struct StableWaker(Mutex<Option<std::task::Waker>>);

impl StableWaker {
    /// Registers `waker`, unless `kept` (the clone kept at the caller's last registration
    /// here) wakes the same task.
    pub(crate) fn register(&self, waker: &std::task::Waker, kept: &mut Option<std::task::Waker>) {
        if kept.as_ref().is_some_and(|k| k.will_wake(waker)) {
            return;
        }
        *kept = Some(waker.clone());
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(waker.clone());
    }

    /// Wakes the registered task, if any; it stays registered.
    pub(crate) fn wake(&self) {
        if let Some(waker) = &*self.0.lock().unwrap_or_else(PoisonError::into_inner) {
            waker.wake_by_ref();
        }
    }
}

impl std::fmt::Debug for StableWaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StableWaker").finish_non_exhaustive()
    }
}

impl Ending {
    /// [`wait`](Self::wait), owned: a stream polls this one future beside each wait for
    /// its next change, instead of a new `wait` per event. Each `wait` registers with the
    /// host's drain, staleness and credential channels, which every watcher shares, and
    /// unregisters when the event wins: two lock round trips on three shared lists per
    /// event and watcher (issue 31), where this future stays registered until it
    /// resolves, and is polled only when they woke it ([`EndingFuture`]). Not polled
    /// again once it has resolved.
    pub(crate) fn boxed(mut self) -> EndingFuture {
        let woken = Arc::new(WokenFlag::default());
        // Polled once at first: it may have to end at once, and it registers its waker.
        woken
            .woken
            .store(true, std::sync::atomic::Ordering::Release);
        EndingFuture {
            wait: Box::pin(async move { self.wait().await }),
            woken,
            kept: None,
        }
    }

    /// Resolves once the watcher must end (at once if it already must), saying why.
    pub(crate) async fn wait(&mut self) -> Ended {
        let Self {
            draining,
            stale,
            credential,
            project,
        } = self;
        let revoked = async {
            match project {
                Some(project) => credential.lost(Permission::JobView, project).await,
                None => credential.removed().await,
            }
        };
        tokio::select! {
            // The sender lives in `Shared`, which the watcher holds: it cannot close first.
            _ = draining.wait_for(|d| *d) => Ended::Draining,
            // The same: the sender lives in `Shared`.
            _ = stale.wait_for(Option::is_some) => Ended::Stale,
            () = revoked => Ended::Revoked,
        }
    }
}

/// How many changes the journal keeps: twice what an all-services stream may fall behind,
/// so a client cut off for lagging can still resume without a reset.
fn cfg_journal(cfg: &TableConfig) -> usize {
    usize::try_from(cfg.all_stream_buffer.saturating_mul(2)).unwrap_or(usize::MAX)
}
