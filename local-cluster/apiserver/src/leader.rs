//! The leader as the election's leader key names it, learned from an etcd watch on that
//! key (change-driven, like the standbys in `xce_store::election`), not from reads: the
//! forwarder takes the leader from the [`Seen`] this publishes and waits on it for a
//! change (a takeover while a request waits on a frozen leader, a standby where the
//! leader was).
//!
//! The watcher reads the key once (what it holds, and the etcd revision of the read;
//! `KV/Range` over gRPC), then watches it from the next revision on (`Watch/Watch`): each put names a new leader, a delete nobody (the
//! leader resigned, or its lease ran out). When the watch breaks (the member went away,
//! etcd cancelled it or compacted the history it needed), the watcher reads the key again
//! and watches again, after a pause growing with the failures (`Backoff`). A watch that
//! stays silent for [`SILENCE`] is replaced the same way, without a pause: a half-open
//! connection to a frozen member must not hide a takeover for good (the standbys do the
//! same after twice the lease's TTL). So a quiet cluster costs one read of the key per
//! [`SILENCE`], and a change costs none: it arrives on the watch.

use super::metrics::Metrics;
use retry_backoff::Backoff;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use xce_store::etcd::gateway::Limits;
use xce_store::etcd::pb::{
    event_type, Event, RangeRequest, RangeResponse, WatchCreateRequest, WatchResponse,
};
use xce_store::EtcdStore;

/// How long the watch may stay silent before it is replaced (the leader key is read
/// again and watched again): twice the default lease TTL, as the standbys wait.
pub(crate) const SILENCE: Duration = Duration::from_secs(30);
/// The longest one read of the key may take on one etcd member.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The first and the longest pause after a failed read or a broken watch.
const RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// What this apiserver knows of the leader key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Never read (yet): why.
    Unknown(String),
    /// The id the key holds, `HOST/PID@ADDR` (`None`: nobody leads). While the watch is
    /// broken this is the last value learned.
    Known(Option<String>),
}

/// Why one watch of the key ended.
#[derive(Debug)]
enum End {
    /// Silent for [`SILENCE`]: read and watch again at once.
    Silent,
    /// A read or the watch failed: read and watch again after a pause. `established`:
    /// the watch had been created (the back-off starts over).
    Broken { established: bool, why: String },
}

/// Follows the leader key (see the module documentation).
pub(crate) struct LeaderWatch {
    store: Arc<EtcdStore>,
    /// The leader key's full name (`<prefix>.leader`).
    key: String,
    seen: watch::Sender<Seen>,
    metrics: Metrics,
    /// See [`SILENCE`] (shorter in tests).
    silence: Duration,
}

impl std::fmt::Debug for LeaderWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderWatch")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl LeaderWatch {
    /// A watcher of `key` through `store`'s etcd client, and the receiver of what it
    /// learns ([`Seen::Unknown`] until the first read).
    pub(crate) fn new(
        store: Arc<EtcdStore>,
        key: &str,
        metrics: Metrics,
    ) -> (Self, watch::Receiver<Seen>) {
        let (seen, rx) = watch::channel(Seen::Unknown("the leader key was not read yet".into()));
        let me = Self {
            store,
            key: key.to_owned(),
            seen,
            metrics,
            silence: SILENCE,
        };
        (me, rx)
    }

    /// Reads the key once: what it holds is published, or why it could not be read (kept
    /// as [`Seen::Unknown`] only while nothing was ever learned). Returns the etcd
    /// revision of the read.
    pub(crate) async fn read(&self) -> Result<i64, String> {
        self.metrics.leader_reads.inc();
        let req = RangeRequest {
            key: self.key.as_bytes().to_vec(),
            ..Default::default()
        };
        let read: Result<RangeResponse, String> = self
            .store
            .gateway()
            .unary("KV/Range", &req, Limits::each(READ_TIMEOUT))
            .await
            .map_err(|e| e.message);
        let answer = match read {
            Ok(v) => v,
            Err(e) => {
                self.seen.send_if_modified(|s| match s {
                    Seen::Unknown(why) => {
                        why.clone_from(&e);
                        true
                    }
                    Seen::Known(_) => false,
                });
                return Err(e);
            }
        };
        let id = answer
            .kvs
            .first()
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
        self.publish(id);
        Ok(answer.revision())
    }

    /// Follows the key until the task is dropped: watches from after `rev` (the first
    /// [`read`](Self::read)'s revision; `None`: read first).
    pub(crate) async fn run(self, mut rev: Option<i64>) {
        let mut backoff = Backoff::jittered(RETRY.0, RETRY.1);
        loop {
            let end = match rev.take() {
                Some(rev) => self.watch_from(rev + 1).await,
                None => match self.read().await {
                    Ok(rev) => self.watch_from(rev + 1).await,
                    Err(why) => End::Broken {
                        established: false,
                        why,
                    },
                },
            };
            match end {
                End::Silent => {
                    tracing::debug!(silence = ?self.silence, "leader watch: silent; reading the leader key again");
                }
                End::Broken { established, why } => {
                    if established {
                        backoff.reset();
                    }
                    let pause = backoff.next_pause();
                    tracing::warn!(reason = %why, retry_in = ?pause, "leader watch: broken; reading the leader key again");
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// One watch of the key from revision `from`, on the member that answered last,
    /// publishing every change, until it breaks or stays silent.
    async fn watch_from(&self, from: i64) -> End {
        let gateway = self.store.gateway();
        let create = WatchCreateRequest::new(self.key.as_bytes(), Vec::new(), from);
        let opened = gateway.watch_stream(gateway.current(), create, self.silence);
        let mut watch = match opened.await {
            Err(e) if e.silent => return End::Silent,
            Err(e) => {
                return End::Broken {
                    established: false,
                    why: e.message,
                }
            }
            Ok(w) => w,
        };
        let mut established = false;
        loop {
            let answer = match tokio::time::timeout(self.silence, watch.next()).await {
                Err(_silent) => return End::Silent,
                Ok(Ok(Some(answer))) => answer,
                Ok(Ok(None)) => {
                    let why = format!("{}: the watch ended", watch.endpoint());
                    return End::Broken { established, why };
                }
                Ok(Err(why)) => return End::Broken { established, why },
            };
            established |= answer.created;
            if let Some(why) = watch_failure(&answer, from) {
                return End::Broken { established, why };
            }
            for event in &answer.events {
                self.on_event(event);
            }
        }
    }

    /// One change of the key: a put names the leader, a delete nobody.
    fn on_event(&self, event: &Event) {
        let id = match &event.kv {
            Some(kv) if event.r#type != event_type::DELETE => {
                Some(String::from_utf8_lossy(&kv.value).into_owned())
            }
            _ => None,
        };
        self.publish(id);
    }

    /// Publishes the key's holder; waiters wake only when it differs from what they saw.
    fn publish(&self, id: Option<String>) {
        let now = Seen::Known(id);
        let changed = self.seen.send_if_modified(|s| {
            let changed = *s != now;
            if changed {
                *s = now.clone();
            }
            changed
        });
        if changed {
            self.metrics.leader_changes.inc();
            if let Seen::Known(id) = &now {
                tracing::info!(
                    leader = id.as_deref().unwrap_or("none"),
                    "leader key changed"
                );
            }
        }
    }
}

/// Why a watch answer ends the watch: a compacted history (the watch would miss
/// changes), a cancel.
fn watch_failure(answer: &WatchResponse, from: i64) -> Option<String> {
    if answer.compact_revision > 0 {
        return Some(format!("etcd compacted the history past revision {from}"));
    }
    if answer.canceled {
        return Some(format!(
            "etcd canceled the watch: {:?}",
            answer.cancel_reason
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use xce_store::etcd::gateway::b64;
    use xce_store::testing::TestEtcd;

    /// Puts (`Some`) or deletes (`None`) the leader key, as a controller's campaign and
    /// its lease do.
    async fn set(etcd: &TestEtcd, id: Option<&str>) {
        let key = b64(b"/xce/.leader");
        let (path, body) = match id {
            Some(id) => ("put", json!({ "key": key, "value": b64(id.as_bytes()) })),
            None => ("deleterange", json!({ "key": key })),
        };
        let r = reqwest::Client::new()
            .post(format!("http://{}/v3/kv/{path}", etcd.endpoint))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }

    /// Waits (bounded) for the next value that differs from the last one seen.
    async fn next(rx: &mut watch::Receiver<Seen>) -> Seen {
        tokio::time::timeout(Duration::from_secs(10), rx.changed())
            .await
            .expect("a change within 10s")
            .unwrap();
        rx.borrow_and_update().clone()
    }

    fn known(id: &str) -> Seen {
        Seen::Known(Some(id.to_owned()))
    }

    /// Every change of the leader key reaches the receiver from the watch: after the
    /// first read, not one more read of the key, however many changes and however long
    /// requests would have waited (the forwarder used to read it every second).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leader_changes_arrive_on_the_watch_without_reading_the_key_again() {
        let etcd = TestEtcd::start();
        let metrics = Metrics::default();
        let (w, mut rx) = LeaderWatch::new(
            Arc::new(etcd.store("/xce/")),
            "/xce/.leader",
            metrics.clone(),
        );
        let rev = w.read().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), Seen::Known(None));
        let task = tokio::spawn(w.run(Some(rev)));

        // Put before the watch is even created: it starts from the read's revision, so
        // nothing in between is missed.
        set(&etcd, Some("node-a/1@127.0.0.1:7001")).await;
        assert_eq!(next(&mut rx).await, known("node-a/1@127.0.0.1:7001"));
        set(&etcd, None).await;
        assert_eq!(next(&mut rx).await, Seen::Known(None));
        set(&etcd, Some("node-b/2@127.0.0.1:7002")).await;
        assert_eq!(next(&mut rx).await, known("node-b/2@127.0.0.1:7002"));
        // Rewritten with the same holder: nobody is woken.
        set(&etcd, Some("node-b/2@127.0.0.1:7002")).await;
        set(&etcd, Some("node-c/3@127.0.0.1:7003")).await;
        assert_eq!(next(&mut rx).await, known("node-c/3@127.0.0.1:7003"));

        // Quiet for longer than the forwarder's old one-second re-read.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(metrics.leader_reads.get(), 1, "the key was read only once");
        // Nobody (the first read), then a, nobody, b and c.
        assert_eq!(metrics.leader_changes.get(), 5);
        task.abort();
    }

    /// A watch that breaks (etcd frozen, then back: the watch goes silent, the reads fail)
    /// is replaced: the key is read again, after bounded pauses, and a change made while
    /// nothing watched is learned from that read.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_broken_watch_is_replaced_and_what_changed_meanwhile_is_read() {
        let etcd = TestEtcd::start();
        let metrics = Metrics::default();
        let (mut w, mut rx) = LeaderWatch::new(
            Arc::new(etcd.store("/xce/")),
            "/xce/.leader",
            metrics.clone(),
        );
        w.silence = Duration::from_millis(300);
        set(&etcd, Some("node-a/1@127.0.0.1:7001")).await;
        let rev = w.read().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), known("node-a/1@127.0.0.1:7001"));
        let task = tokio::spawn(w.run(Some(rev)));

        let pid = rustix::process::Pid::from_raw(etcd.pid() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
        // Silent, then reads that time out: the watcher keeps trying.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let tried = metrics.leader_reads.get();
        assert!(tried >= 2, "read again after the silence: {tried} reads");
        // What it knew stays known while etcd cannot be asked.
        assert_eq!(*rx.borrow_and_update(), known("node-a/1@127.0.0.1:7001"));
        rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
        set(&etcd, Some("node-b/2@127.0.0.1:7002")).await;
        assert_eq!(next(&mut rx).await, known("node-b/2@127.0.0.1:7002"));
        task.abort();
    }
}
