//! The follower: keeps the apiserver's listeners (the endpoint table's feed) in step with
//! the controller through etcd alone.
//!
//! It loads the whole store once (one consistent etcd revision) and resyncs the listeners
//! from it, then watches every key of the store from the next revision on. Every batch the
//! controller commits rewrites `meta/events` with the batch's events (see
//! `controller::model::events_key`), so the watch delivers each batch's events, in commit
//! order, exactly as the leader's own listeners got them: the follower hands them to its
//! listeners and the tables agree, indexes included. From store format 3 on, a job event
//! refers to the job's record written in the same etcd revision instead of repeating it
//! (`xce_model::events`): the follower keeps the job records of the revision it is
//! reading and hands the revision's events on once the revision is complete (the next
//! revision begins, or an answer ends that is not a fragment). The global revision makes gaps
//! visible: events must follow the last applied one without a hole (a batch's events are
//! consecutive revisions); anything else — and a watch that etcd compacted away — is met
//! with a full reload and resync, never with a guess.

use super::fresh::Freshness;
use super::metrics::Metrics;
use plugin_api::{ClusterEvent, ClusterListener};
use retry_backoff::Backoff;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use xce_model::{
    check_format, decode_format, decode_stored_events, events_key, format_key, restored_key,
    Cluster, EventsError,
};
use xce_store::etcd::pb::WatchResponse;
use xce_store::{EtcdStore, Key, StoreError};

/// The longest pause between two attempts to reach etcd.
const MAX_RETRY: Duration = Duration::from_secs(2);
/// How long a watch may stay silent before the follower asks another member whether the
/// store moved on meanwhile (a member cut off from the others keeps the stream open and
/// quiet: without this check the apiserver would serve a stale table indefinitely).
const QUIET_CHECK: Duration = Duration::from_secs(10);

/// Why a watch stopped.
#[derive(Debug)]
enum End {
    /// The stream broke or etcd went away: watch again from where we are.
    Broken(String),
    /// The history we need is gone, or it does not add up: reload everything.
    Reload(String),
    /// A record or an event this build does not understand (a newer release wrote it):
    /// fail closed (the listeners stop serving what they hold), then reload; a store of
    /// a newer format keeps failing the load, so they stay closed until this apiserver
    /// is upgraded.
    NotUnderstood(String),
    /// This apiserver fell behind the store (`fresh.rs`): its listeners were marked stale;
    /// watch another member after a reload.
    Lagging,
}

/// Follows one etcd store (see the module documentation).
pub(crate) struct Follower {
    store: Arc<EtcdStore>,
    listeners: Vec<Arc<dyn ClusterListener>>,
    metrics: Metrics,
    /// The controller's revision the listeners are at.
    applied: u64,
    /// The etcd revision everything up to which has been applied.
    etcd_rev: i64,
    /// The etcd endpoint to watch next (rotates on failures).
    endpoint: usize,
    /// See [`QUIET_CHECK`] (shorter in tests).
    quiet_check: Duration,
    /// The cluster id as of the last load (written once with the store, never changed).
    cluster_id: Option<String>,
    /// How fresh the listeners are (`fresh.rs`).
    fresh: Arc<Freshness>,
    /// The etcd revision being read, not yet handed on.
    revision: Revision,
}

/// What one etcd revision wrote that its events may refer to: the job records, and its
/// events record.
#[derive(Debug, Default)]
struct Revision {
    /// The etcd revision (0: none yet).
    rev: i64,
    /// Job records written, by job id.
    jobs: HashMap<String, Vec<u8>>,
    /// The events record, if the revision wrote one.
    events: Option<Vec<u8>>,
}

impl std::fmt::Debug for Follower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("applied", &self.applied)
            .field("etcd_rev", &self.etcd_rev)
            .finish_non_exhaustive()
    }
}

impl Follower {
    pub(crate) fn new(
        store: Arc<EtcdStore>,
        listeners: Vec<Arc<dyn ClusterListener>>,
        metrics: Metrics,
        fresh: Arc<Freshness>,
    ) -> Self {
        Self {
            fresh,
            store,
            listeners,
            metrics,
            applied: 0,
            etcd_rev: 0,
            endpoint: 0,
            quiet_check: QUIET_CHECK,
            cluster_id: None,
            revision: Revision::default(),
        }
    }

    /// The cluster id the last load found (`None`: no controller has opened the store
    /// since cluster ids exist).
    pub(crate) fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.as_deref()
    }

    /// Loads the whole store and resyncs every listener from it.
    pub(crate) async fn load(&mut self) -> Result<(), StoreError> {
        let store = self.store.clone();
        let asked = tokio::time::Instant::now();
        let (records, etcd_rev) = tokio::task::spawn_blocking(move || store.load_all_at())
            .await
            .map_err(|e| StoreError::Backend(format!("the load task failed: {e}")))??;
        let cluster = Cluster::from_records(records)
            .map_err(|e| StoreError::Backend(format!("the stored state is unreadable: {e}")))?;
        let snapshot = cluster.snapshot();
        for l in &self.listeners {
            l.resync(&snapshot);
        }
        self.applied = cluster.rev;
        self.etcd_rev = etcd_rev;
        self.revision = Revision::default();
        self.cluster_id = cluster.cluster_id;
        self.metrics.resyncs.inc();
        self.metrics.applied.set(self.applied as i64);
        self.fresh
            .loaded(etcd_rev, asked, tokio::time::Instant::now());
        self.fresh.applied_controller(self.applied);
        tracing::info!(
            rev = cluster.rev,
            etcd_revision = etcd_rev,
            services = snapshot.services.len(),
            jobs = snapshot.jobs.len(),
            hosts = snapshot.hosts.len(),
            "follower: loaded the state from etcd"
        );
        Ok(())
    }

    /// Follows the store until the task is dropped.
    pub(crate) async fn run(mut self) {
        let mut backoff = Backoff::jittered(Duration::from_millis(100), MAX_RETRY);
        loop {
            let end = self.watch().await;
            // A watch that was established restarts the back-off.
            if self.metrics.watching.get() > 0 {
                backoff.reset();
            }
            self.metrics.watching.set(0);
            match end {
                End::Broken(why) => {
                    // The next endpoint: the one we watched may be the one that died.
                    self.endpoint = (self.endpoint + 1) % self.store.endpoints().len();
                    let pause = backoff.next_pause();
                    tracing::warn!(reason = %why, etcd_revision = self.etcd_rev, retry_in = ?pause, "follower: watch broken, watching again");
                    tokio::time::sleep(pause).await;
                }
                End::Reload(why) => {
                    tracing::warn!(reason = %why, "follower: reloading the whole state");
                    self.reload(&mut backoff, false).await;
                }
                End::Lagging => {
                    self.endpoint = (self.endpoint + 1) % self.store.endpoints().len();
                    self.reload(&mut backoff, true).await;
                }
                End::NotUnderstood(why) => {
                    tracing::error!(reason = %why, protocol = xce_wire::version::protocol(), format = xce_model::FORMAT, "follower: the store holds what this apiserver does not understand; answering 503 until it reloads it");
                    self.stale(&why);
                    self.reload(&mut backoff, true).await;
                }
            }
        }
    }

    /// Loads the whole state until a load succeeds. A load that fails marks the listeners
    /// stale (unless `marked` already): what they hold cannot be vouched for meanwhile.
    async fn reload(&mut self, backoff: &mut Backoff, mut marked: bool) {
        while let Err(e) = self.load().await {
            if !std::mem::replace(&mut marked, true) {
                self.stale(&e.to_string());
            }
            let pause = backoff.next_pause();
            tracing::error!(error = %e, retry_in = ?pause, "follower: cannot load the state; answering 503 meanwhile");
            tokio::time::sleep(pause).await;
        }
    }

    /// Tells every listener to fail closed (see [`ClusterListener::stale`]).
    fn stale(&self, reason: &str) {
        self.metrics.not_understood.inc();
        for l in &self.listeners {
            l.stale(reason);
        }
    }

    /// One watch stream, from the revision after the last applied one, until it ends.
    async fn watch(&mut self) -> End {
        // A revision not handed on yet is read again from `etcd_rev + 1`.
        self.revision = Revision::default();
        let store = self.store.clone();
        self.metrics
            .watching_member(self.store.endpoints(), self.endpoint);
        let create = store.watch_create(self.etcd_rev + 1);
        let sent = store
            .gateway()
            .watch_stream(self.endpoint, create, self.quiet_check);
        let mut watch = match sent.await {
            Ok(w) => w,
            Err(e) => return End::Broken(e.message),
        };
        // The newest revision another member reported while this stream was quiet.
        let mut behind: Option<i64> = None;
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(self.quiet_check, watch.next()) => next,
                () = self.fresh.lagging.notified() => return End::Lagging,
            };
            let msg = match next {
                Ok(Ok(Some(msg))) => msg,
                Ok(Ok(None)) => {
                    return End::Broken(format!("{}: the watch stream ended", watch.endpoint()))
                }
                Ok(Err(e)) => return End::Broken(e),
                Err(_quiet) => {
                    // Behind twice in a row (a change may just be on its way the first
                    // time): this stream is stuck.
                    match (self.newest_elsewhere().await, behind) {
                        (Some(newest), Some(before))
                            if newest > self.etcd_rev && before > self.etcd_rev =>
                        {
                            return End::Broken(format!(
                                "{}: the watch stayed quiet while the store moved on to \
                                 revision {newest} (this apiserver is at {})",
                                watch.endpoint(),
                                self.etcd_rev
                            ));
                        }
                        (newest, _) => behind = newest,
                    }
                    continue;
                }
            };
            behind = None;
            if let Some(end) = self.on_answer(&msg) {
                return end;
            }
            self.fresh
                .applied_etcd(self.etcd_rev, tokio::time::Instant::now());
        }
    }

    /// The newest modification revision under the store's prefix, as another member (the
    /// next endpoint) sees it; `None` when it cannot tell (single endpoint, no answer).
    async fn newest_elsewhere(&self) -> Option<i64> {
        let other = (self.endpoint + 1) % self.store.endpoints().len();
        let newest: xce_store::etcd::pb::RangeResponse = self
            .store
            .gateway()
            .unary_one(
                other,
                "KV/Range",
                &self.store.newest_request(),
                Duration::from_secs(2),
            )
            .await
            .ok()?;
        Some(newest.kvs.first().map_or(0, |kv| kv.mod_revision))
    }

    /// Handles one watch answer; `Some` ends the watch.
    fn on_answer(&mut self, r: &WatchResponse) -> Option<End> {
        if r.compact_revision > 0 {
            return Some(End::Reload(format!(
                "etcd compacted its history up to revision {}, past {}",
                r.compact_revision, self.etcd_rev
            )));
        }
        if r.canceled {
            return Some(End::Broken(format!(
                "etcd canceled the watch: {:?}",
                r.cancel_reason
            )));
        }
        if r.created {
            self.metrics.watching.set(1);
            tracing::info!(
                etcd_revision = self.etcd_rev,
                "follower: watching the store"
            );
        }
        for ev in &r.events {
            let rev = ev.kv.as_ref().map_or(0, |kv| kv.mod_revision);
            if rev != self.revision.rev {
                if let Some(end) = self.hand_on() {
                    return Some(end);
                }
                self.revision.rev = rev;
            }
            let records = match self.store.records_of(ev) {
                Ok(r) => r,
                Err(e) => return Some(End::Reload(format!("unreadable watch event: {e}"))),
            };
            for (key, value) in records {
                if let Some(end) = self.on_record(key, value) {
                    return Some(end);
                }
            }
        }
        // etcd splits a revision only into fragments; anything else ends with it.
        if !r.fragment {
            return self.hand_on();
        }
        None
    }

    /// The revision read so far is complete: its events go to the listeners, and the
    /// watch has read up to it.
    fn hand_on(&mut self) -> Option<End> {
        let done = std::mem::take(&mut self.revision);
        if let Some(bytes) = &done.events {
            if let Some(end) = self.apply_record(bytes, &done.jobs) {
                return Some(end);
            }
        }
        self.etcd_rev = self.etcd_rev.max(done.rev);
        None
    }

    /// Applies an events record; references take their job from `jobs`, the job records
    /// of the same revision.
    fn apply_record(&mut self, bytes: &[u8], jobs: &HashMap<String, Vec<u8>>) -> Option<End> {
        // An event of a kind, or with a value (a job state), this build does not know is
        // an error here (serde refuses unknown variants), never skipped: skipping it
        // would serve a table that misses the change.
        let events = match decode_stored_events(bytes) {
            Ok(e) => e,
            Err(e) => return Some(not_understood(&e)),
        };
        // The record's events go to the listeners together (one batch, as the controller
        // committed them): a listener does its per-batch work once (the endpoint table
        // wakes an all-services stream once), as it does behind the controller itself.
        let mut batch = Vec::with_capacity(events.len());
        let mut end = None;
        for stored in events {
            // Already in (a journaled batch is seen twice, the journal then its writes; a
            // load may have read a batch its watch then delivers): not resolved, as the
            // later writes of a journaled batch need not carry the records it refers to.
            if stored.rev() <= self.applied {
                continue;
            }
            let event = match stored.resolve(|id| jobs.get(id).map(Vec::as_slice)) {
                Ok(e) => e,
                Err(e @ EventsError::Missing { .. }) => {
                    end = Some(End::Reload(e.to_string()));
                    break;
                }
                Err(e) => {
                    end = Some(not_understood(&e));
                    break;
                }
            };
            let rev = event.rev();
            let follows = self.applied + batch.len() as u64 + 1;
            if rev != follows {
                end = Some(End::Reload(format!(
                    "event revision {rev} does not follow {}",
                    follows - 1
                )));
                break;
            }
            batch.push(event);
        }
        // What came before a failure is handed on, as it was read in order.
        self.hand_on_events(&batch);
        end
    }

    /// One record change: only the events record matters (the state itself is only read
    /// whole, at a load; the job records are kept for the events of their revision), the
    /// format record (a newer format is not understood), and the restore marker: `xced
    /// store restore` replaced the records without events (the jobs it restored are not
    /// ready until their workers say they run), so what the listeners hold describes
    /// processes that may be gone; only a full reload is true.
    fn on_record(&mut self, key: Key, value: Option<Vec<u8>>) -> Option<End> {
        if key.ns == xce_model::JOB_NAMESPACE {
            match value {
                Some(v) => self.revision.jobs.insert(key.key, v),
                None => self.revision.jobs.remove(&key.key),
            };
            return None;
        }
        if key == restored_key() && value.is_some() {
            return Some(End::Reload(
                "the store was restored from a backup (xced store restore)".to_owned(),
            ));
        }
        if key == format_key() {
            let format = value.as_deref().map(decode_format);
            return match format {
                Some(Ok(f)) => check_format(f)
                    .err()
                    .map(|e| End::NotUnderstood(e.to_string())),
                Some(Err(e)) => Some(End::NotUnderstood(format!(
                    "unreadable store format record: {e}"
                ))),
                None => None,
            };
        }
        if key == events_key() {
            self.revision.events = value;
        }
        None
    }

    /// Hands `events` (in revision order, the first one right after `applied`) to the
    /// listeners in one call, and records them as applied.
    fn hand_on_events(&mut self, events: &[ClusterEvent]) {
        let Some(last) = events.last() else {
            return;
        };
        // The delivery clock starts when this revision was first known to exist.
        let since = self
            .fresh
            .since()
            .map_or_else(std::time::Instant::now, |at| at.into_std());
        for l in &self.listeners {
            l.on_events_since(events, since);
        }
        let rev = last.rev();
        self.applied = rev;
        self.metrics.applied.set(rev as i64);
        self.fresh.applied_controller(rev);
        self.metrics.events.inc_by(events.len() as u64);
    }
}

fn not_understood(e: &EventsError) -> End {
    End::NotUnderstood(format!(
        "an event this apiserver does not understand (written by a newer release?): {e}"
    ))
}

#[cfg(test)]
mod bench;

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::{ClusterSnapshot, ServiceInfo};
    use serde_json::Value;
    use std::sync::Mutex;
    use xce_model::Txn;
    use xce_store::etcd::gateway::int;
    use xce_store::testing::TestEtcd;
    use xce_store::{Batch, Store};

    /// What a listener was told: `resync@REV(services)`, `event@REV` (a batch of one event)
    /// and `events@FIRST..LAST` (a batch of several, told in one call).
    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl ClusterListener for Recorder {
        fn resync(&self, s: &ClusterSnapshot) {
            let names: Vec<&str> = s.services.iter().map(|s| s.name.as_str()).collect();
            self.0
                .lock()
                .unwrap()
                .push(format!("resync@{}({})", s.rev, names.join(",")));
        }
        fn on_event(&self, e: &ClusterEvent) {
            self.0.lock().unwrap().push(format!("event@{}", e.rev()));
        }
        fn on_events(&self, events: &[ClusterEvent]) {
            match events {
                [one] => self.on_event(one),
                [first, .., last] => {
                    self.0
                        .lock()
                        .unwrap()
                        .push(format!("events@{}..{}", first.rev(), last.rev()))
                }
                [] => panic!("told an empty batch"),
            }
        }
        fn stale(&self, reason: &str) {
            self.0.lock().unwrap().push(format!("stale({reason})"));
        }
    }

    impl Recorder {
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    /// A freshness state with the default `max_lag` (its prober is not running).
    pub(super) fn fresh() -> Arc<Freshness> {
        Arc::new(Freshness::new(Duration::from_secs(2), Metrics::default()))
    }

    pub(super) fn service(name: &str) -> xce_model::ServiceRec {
        xce_model::ServiceRec {
            info: ServiceInfo {
                name: name.into(),
                project: "p".into(),
                replicas: 1,
                profile: serde_json::json!({}),
                rev: 0,
                generation: 1,
            },
            state: xce_model::ServiceState::Active,
            rollout: Default::default(),
            older: Default::default(),
            slots: Default::default(),
            stop_now: false,
        }
    }

    /// Commits `names` as one controller batch (one event each), as the controller does.
    fn commit(store: &dyn Store, c: &mut Cluster, names: &[&str]) {
        let mut txn = Txn::new(c);
        for n in names {
            txn.put_service(service(n));
        }
        store.commit(txn.batch()).unwrap();
        txn.apply(c);
    }

    /// Service `a` committed through `writer`, then a follower of the same prefix loaded
    /// (resynced at rev 1): the writer's cluster, the recorder, the follower.
    async fn loaded_after_a(
        etcd: &TestEtcd,
        writer: &dyn Store,
        metrics: Metrics,
    ) -> (Cluster, Arc<Recorder>, Follower) {
        let mut c = Cluster::load(writer).unwrap();
        commit(writer, &mut c, &["a"]);
        let rec = Arc::new(Recorder::default());
        let mut f = Follower::new(
            Arc::new(etcd.store("/xce/")),
            vec![rec.clone()],
            metrics,
            fresh(),
        );
        f.load().await.unwrap();
        assert_eq!(rec.take(), ["resync@1(a)"]);
        (c, rec, f)
    }

    async fn until(rec: &Recorder, want: usize) -> Vec<String> {
        let mut got = Vec::new();
        // Bounded by the tests' patience: the watch delivers within milliseconds on
        // loopback, unless the machine is very busy.
        let deadline = std::time::Instant::now() + testkit::patience();
        while std::time::Instant::now() < deadline {
            got.extend(rec.take());
            if got.len() >= want {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("expected {want} notifications, got {got:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn follows_batches_in_order_reads_journals_once_and_reloads_on_a_gap() {
        let etcd = TestEtcd::start();
        // Small transactions: a batch of 3 services goes through the journal.
        let writer = etcd.store("/xce/").with_max_txn_ops(4);
        let (mut c, rec, f) = loaded_after_a(&etcd, &writer, Metrics::default()).await;
        let task = tokio::spawn(f.run());

        // Plain batches, then a journaled one: every event once, in order, and a batch's
        // events in one call (an all-services stream then wakes once for it).
        commit(&writer, &mut c, &["b"]);
        commit(&writer, &mut c, &["c", "d", "e"]);
        assert_eq!(until(&rec, 2).await, ["event@2", "events@3..5"]);

        // A batch whose events skip a revision (no controller writes that): the follower
        // does not guess, it reloads the whole state.
        c.rev += 1;
        commit(&writer, &mut c, &["f"]);
        assert_eq!(until(&rec, 1).await, ["resync@7(a,b,c,d,e,f)"]);
        commit(&writer, &mut c, &["g"]);
        assert_eq!(until(&rec, 1).await, ["event@8"]);

        // A batch without events (a quiet record change) tells the listeners nothing.
        let mut quiet = Batch::default();
        quiet.put(xce_store::Key::new("host", "h1"), b"{}".to_vec());
        writer.commit(quiet).unwrap();
        commit(&writer, &mut c, &["h"]);
        assert_eq!(until(&rec, 1).await, ["event@9"]);
        task.abort();
    }

    /// `xced store restore` replaces the records without events: the follower reloads the
    /// whole state when the restore's last write (`meta/restored`) arrives, instead of
    /// serving the endpoints of before the restore (the e2e restore on etcd listed four
    /// endpoints whose processes were gone).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restore_written_under_it_means_a_full_reload() {
        let etcd = TestEtcd::start();
        let writer = etcd.store("/xce/");
        let (mut c, rec, f) = loaded_after_a(&etcd, &writer, Metrics::default()).await;
        // The backup: service `a` alone, as of revision 1.
        let backup = writer.load_all().unwrap();
        let task = tokio::spawn(f.run());
        commit(&writer, &mut c, &["b"]);
        assert_eq!(until(&rec, 1).await, ["event@2"]);
        let restored = xce_model::restored_records(backup).unwrap();
        xce_store::backup::replace_all(&writer, restored, false).unwrap();
        let got = until(&rec, 1).await;
        assert!(got[0].starts_with("resync@"), "{got:?}");
        assert!(
            !got[0].contains('b'),
            "the restored state has no b: {got:?}"
        );
        task.abort();
    }

    /// An event this build does not know (a job state of a newer release, as `draining`
    /// was to the release before it): the listeners fail closed before anything else
    /// happens, then the whole state is reloaded (its records are readable here) and
    /// served again; the follower goes on following.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_event_it_does_not_understand_fails_closed_then_reloads() {
        let etcd = TestEtcd::start();
        let writer = etcd.store("/xce/");
        let (mut c, rec, f) = loaded_after_a(&etcd, &writer, Metrics::default()).await;
        let task = tokio::spawn(f.run());
        let mut b = Batch::default();
        let event = r#"[{"event":"job","rev":2,"job":{"job":"j-1","service":"a","project":"p",
            "replica":0,"host":"h1","state":"hibernating","ready":false,"grants":{}}}]"#;
        b.put(events_key(), event.as_bytes().to_vec());
        b.put(xce_store::Key::new("meta", "rev"), b"2".to_vec());
        writer.commit(b).unwrap();
        c.rev = 2;
        let got = until(&rec, 2).await;
        assert!(
            got[0].starts_with("stale(an event this apiserver does not understand")
                && got[0].contains("unknown variant `hibernating`"),
            "{got:?}"
        );
        assert_eq!(got[1], "resync@2(a)");
        commit(&writer, &mut c, &["b"]);
        assert_eq!(until(&rec, 1).await, ["event@3"]);
        task.abort();
    }

    /// A store migrated to a newer format: the listeners fail closed and stay so (no
    /// resync: the load refuses the newer format) until the format is one this build
    /// reads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_newer_store_format_fails_closed_until_it_can_be_read() {
        let etcd = TestEtcd::start();
        let writer = etcd.store("/xce/");
        let metrics = Metrics::default();
        let (mut c, rec, f) = loaded_after_a(&etcd, &writer, metrics.clone()).await;
        let task = tokio::spawn(f.run());
        let newer = xce_model::FORMAT + 1;
        let mut b = Batch::default();
        b.put(format_key(), newer.to_string().into_bytes());
        writer.commit(b).unwrap();
        let got = until(&rec, 1).await;
        assert!(
            got[0].starts_with(&format!("stale(the store holds records of format {newer}")),
            "{got:?}"
        );
        // Back to a format this build reads (as an upgrade of this apiserver would be):
        // served again. The loads tried meanwhile were refused: the next thing the
        // listener hears is the resync of the readable store, nothing before it.
        // One batch, so that no load can see the one without the other.
        let mut txn = Txn::new(&c);
        txn.put_service(service("b"));
        let mut b = txn.batch();
        b.put(format_key(), xce_model::FORMAT.to_string().into_bytes());
        writer.commit(b).unwrap();
        txn.apply(&mut c);
        assert_eq!(until(&rec, 1).await, ["resync@2(a,b)"]);
        assert_eq!(metrics.not_understood.get(), 1);
        task.abort();
    }

    /// A backlog bigger than one watch message (etcd sends up to 1,000 revisions in one
    /// catch-up answer): the follower asks for fragments, so it reads the backlog instead
    /// of refusing the oversized message and asking for the same revisions again, for
    /// ever (seen in the controller bench: an apiserver behind during a placement).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backlog_larger_than_one_watch_message_is_read() {
        let etcd = TestEtcd::start();
        let writer = etcd.store("/xce/");
        let (mut c, rec, f) = loaded_after_a(&etcd, &writer, Metrics::default()).await;
        // Batches of ~300 KB on the wire each (the record and its event, base64), more
        // than the largest watch message the follower accepts in all.
        let pad = "x".repeat(100 << 10);
        let batches = xce_store::etcd::gateway::MAX_MESSAGE / (200 << 10) + 10;
        for i in 0..batches {
            let mut txn = Txn::new(&c);
            let mut s = service(&format!("big-{i}"));
            s.info.profile = serde_json::json!({ "pad": pad });
            txn.put_service(s);
            writer.commit(txn.batch()).unwrap();
            txn.apply(&mut c);
        }
        let task = tokio::spawn(f.run());
        let got = until(&rec, batches).await;
        let want: Vec<String> = (0..batches).map(|i| format!("event@{}", i + 2)).collect();
        assert_eq!(got, want);
        task.abort();
    }

    /// History the follower still needs was compacted away while it was not watching: it
    /// reloads the whole state instead of missing the batches in between.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_compacted_history_means_a_full_reload() {
        let etcd = TestEtcd::start();
        let writer = etcd.store("/xce/");
        let metrics = Metrics::default();
        let (mut c, rec, f) = loaded_after_a(&etcd, &writer, metrics.clone()).await;
        // Two batches it has not seen, then etcd forgets everything before the last.
        commit(&writer, &mut c, &["b"]);
        commit(&writer, &mut c, &["c"]);
        let http = reqwest::Client::new();
        let head: Value = http
            .post(format!("http://{}/v3/kv/range", etcd.endpoint))
            .body(r#"{"key":"AA=="}"#)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let now = int(&head["header"]["revision"]);
        let compacted = http
            .post(format!("http://{}/v3/kv/compaction", etcd.endpoint))
            .body(format!(r#"{{"revision":"{now}","physical":true}}"#))
            .send()
            .await
            .unwrap();
        assert!(compacted.status().is_success());
        let task = tokio::spawn(f.run());
        assert_eq!(until(&rec, 1).await, ["resync@3(a,b,c)"]);
        assert_eq!(metrics.resyncs.get(), 2);
        // And it follows on from there.
        commit(&writer, &mut c, &["d"]);
        assert_eq!(until(&rec, 1).await, ["event@4"]);
        task.abort();
    }

    /// A member that creates the watch and then sends nothing (cut off from the others):
    /// the follower notices that another member has moved on and watches elsewhere.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_that_stays_quiet_while_the_store_moves_on_is_abandoned() {
        let etcd = TestEtcd::start();
        // A "member" that answers the watch with "created", then goes quiet.
        let mute = xce_store::testing::mute_member();
        let writer = etcd.store("/xce/");
        let mut c = Cluster::load(&writer).unwrap();
        let rec = Arc::new(Recorder::default());
        let store = xce_store::EtcdStore::new(vec![etcd.endpoint.clone(), mute])
            .unwrap()
            .with_prefix("/xce/")
            .unwrap();
        let metrics = Metrics::default();
        let mut f = Follower::new(Arc::new(store), vec![rec.clone()], metrics.clone(), fresh());
        f.load().await.unwrap();
        assert_eq!(rec.take(), ["resync@0()"]);
        // Watch the mute one first; check quickly.
        f.endpoint = 1;
        f.quiet_check = Duration::from_millis(200);
        let task = tokio::spawn(f.run());
        // Created on the mute member: the follower believes it watches.
        let deadline = std::time::Instant::now() + testkit::patience();
        while std::time::Instant::now() < deadline {
            if metrics.watching.get() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            metrics.watching.get(),
            1,
            "the mute member's watch was created"
        );
        commit(&writer, &mut c, &["a"]);
        assert_eq!(until(&rec, 1).await, ["event@1"]);
        task.abort();
    }

    /// Every event a listener was told, whole.
    #[derive(Default)]
    struct Events(Mutex<Vec<ClusterEvent>>);

    impl ClusterListener for Events {
        fn resync(&self, _: &ClusterSnapshot) {}
        fn on_event(&self, e: &ClusterEvent) {
            self.0.lock().unwrap().push(e.clone());
        }
    }

    fn job(id: &str, state: plugin_api::JobState, ready: bool) -> xce_model::JobRec {
        xce_model::JobRec {
            info: plugin_api::JobInfo {
                job: id.into(),
                service: "a".into(),
                project: "p".into(),
                replica: 0,
                host: "h1".into(),
                state,
                ready,
                grants: Default::default(),
                generation: 1,
            },
            held: None,
            held_ready: None,
            log: None,
        }
    }

    /// The same history committed in store format 2 and in format 3 (whose job events
    /// refer to the job records of their revision), plain and journaled batches: the
    /// followers of both hand their listeners the same events, the controller's own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_store_formats_are_followed_to_the_same_events() {
        use plugin_api::JobState::{Placed, Running};
        let etcd = TestEtcd::start();
        let mut told = Vec::new();
        let mut committed = Vec::new();
        for (format, prefix) in [(2, "/two/"), (3, "/three/")] {
            // Small transactions: the third batch goes through the journal.
            let writer = etcd.store(prefix).with_max_txn_ops(6);
            let mut c = Cluster::load(&writer).unwrap();
            let mut txn = Txn::new(&c);
            txn.migrate(&c);
            txn.upgrade_format(format);
            txn.put_service(service("a"));
            writer.commit(txn.batch()).unwrap();
            txn.apply(&mut c);
            let listener = Arc::new(Events::default());
            let mut f = Follower::new(
                Arc::new(etcd.store(prefix)),
                vec![listener.clone()],
                Metrics::default(),
                fresh(),
            );
            f.load().await.unwrap();
            let task = tokio::spawn(f.run());
            let batches: [&[(&str, plugin_api::JobState, bool)]; 3] = [
                &[("j-1", Placed, false), ("j-2", Placed, false)],
                &[("j-1", Running, false), ("j-1", Running, true)],
                &[
                    ("j-2", Running, false),
                    ("j-2", Running, true),
                    ("j-3", Placed, false),
                    ("j-4", Placed, false),
                    ("j-5", Placed, false),
                    ("j-6", Placed, false),
                ],
            ];
            let mut events = Vec::new();
            for batch in batches {
                let mut txn = Txn::new(&c);
                for (id, state, ready) in batch {
                    txn.put_job(&c, job(id, *state, *ready));
                }
                events.extend(txn.events.clone());
                writer.commit(txn.batch()).unwrap();
                txn.apply(&mut c);
            }
            let deadline = std::time::Instant::now() + testkit::patience();
            while std::time::Instant::now() < deadline {
                if listener.0.lock().unwrap().len() >= events.len() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            task.abort();
            told.push(std::mem::take(&mut *listener.0.lock().unwrap()));
            committed.push(events);
        }
        assert_eq!(committed[0], committed[1]);
        assert_eq!(told[0], committed[0], "format 2");
        assert_eq!(told[1], committed[1], "format 3");
    }

    /// Format 3 behind a backlog that etcd sends in fragments (it cuts a catch-up answer by
    /// size, so a fragment may end inside a revision, with a reference's record in the
    /// fragment before it): every event still arrives once, in order, and whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fragmented_backlog_in_format_3_is_read_whole() {
        let etcd = TestEtcd::start();
        let writer = etcd.store("/xce/");
        let mut c = Cluster::load(&writer).unwrap();
        let mut txn = Txn::new(&c);
        txn.migrate(&c);
        txn.upgrade_format(3);
        writer.commit(txn.batch()).unwrap();
        txn.apply(&mut c);
        let listener = Arc::new(Events::default());
        let mut f = Follower::new(
            Arc::new(etcd.store("/xce/")),
            vec![listener.clone()],
            Metrics::default(),
            fresh(),
        );
        f.load().await.unwrap();
        // 12 batches of 8 job records of ~60 KB (a long log path): ~5 MB of backlog, more
        // than three times etcd's 1.5 MiB fragment.
        let pad = "x".repeat(60 << 10);
        let mut events = Vec::new();
        for b in 0..12 {
            let mut txn = Txn::new(&c);
            for j in 0..8 {
                let mut rec = job(&format!("j-{b}-{j}"), plugin_api::JobState::Placed, false);
                rec.log = Some(pad.clone());
                txn.put_job(&c, rec);
            }
            events.extend(txn.events.clone());
            writer.commit(txn.batch()).unwrap();
            txn.apply(&mut c);
        }
        let task = tokio::spawn(f.run());
        let deadline = std::time::Instant::now() + testkit::patience();
        while std::time::Instant::now() < deadline {
            if listener.0.lock().unwrap().len() >= events.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        task.abort();
        let told = std::mem::take(&mut *listener.0.lock().unwrap());
        assert_eq!(told.len(), events.len());
        assert!(
            told == events,
            "the events told differ from the committed ones"
        );
    }
}
