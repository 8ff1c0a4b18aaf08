//! How fresh this apiserver's copy is, and failing closed when it is not.
//!
//! The follower's watch alone cannot tell: a member cut off from the others, or frozen,
//! keeps the stream open and quiet, and etcd's progress notifications (which would carry
//! the current revision on a quiet stream) come every 10 minutes by default, and one
//! asked for comes from the watched member, which may be the cut-off one. So a prober asks
//! etcd (`KV/Range` over gRPC), every [`probe_interval`],
//! for the store's current revision and whether anything under the store's prefix changed
//! after the revision this apiserver has applied: one count-only, linearizable range with
//! `min_mod_revision` (writes outside the prefix are no lag), to every member at once
//! (the watched one may be the frozen one), each with a short timeout.
//!
//! **The rule.** The apiserver is *known current* as of the moment a read that showed it
//! had everything the store had was sent: a probe answering "nothing under the prefix
//! after what you applied", a probe whose revision the watch has since applied, or the
//! first page of a whole load. While a revision with changes under the prefix is known to
//! exist and is not applied yet, the *lag* is the time since the apiserver was last known
//! current (0 when nothing is known to be missing). That bounds the real lag from above:
//! the store moved on after that moment, so the apiserver fails closed at most `max_lag`
//! after the store moved on, however late in the probe interval the move was seen.
//! (Counting from the first *sighting* of the new revision instead would fail closed up
//! to a probe interval later.) Past `max_lag` it fails closed: its listeners are marked
//! stale (503 `stale`, open streams end), `/healthz` answers 503 `stale`, and the
//! follower abandons its watch for the next member and reloads the whole state; the
//! resync of that load serves again.
//! It also fails closed when it has heard nothing at all from etcd for `max_lag` (no
//! answer to a probe, no watch message, not even a refusal): an apiserver cut off from
//! every member cannot know what it misses. A probe that fails while the watch is fine,
//! or that every member answers with "no leader", is no lag: during a quorum loss nothing
//! can be written, so nothing can be missed, and a healthy apiserver stays healthy.
//! The limit of this rule: an apiserver that reaches only a minority of members, which
//! say "no leader" while the majority (out of its reach) goes on writing, cannot tell
//! that from a quorum loss; it stays up until it reaches a member of the majority.
//! Such a "no leader" round, with nothing known to be missing, also counts as known
//! current: otherwise the first write after a quorum loss would find the whole loss
//! counted as lag and fail every apiserver closed for nothing.

use super::metrics::Metrics;
use plugin_api::ClusterListener;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use xce_store::etcd::pb::{RangeResponse, StatusRequest, StatusResponse};
use xce_store::EtcdStore;

/// How often the prober asks for the current revision: at least once a second, four
/// times per `max_lag` when that is shorter.
pub(crate) fn probe_interval(max_lag: Duration) -> Duration {
    (max_lag / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// How often the lag is judged (cheap: a lock and a comparison).
const JUDGE_EVERY: Duration = Duration::from_millis(100);

/// What one probe learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// A member answered: the store's revision, and whether anything under the prefix
    /// changed after the applied revision.
    Answer { rev: i64, changed: bool },
    /// No member has a leader (a quorum loss, or only a minority in reach), or the
    /// members that answer hold every read while having nothing this apiserver has not
    /// applied (etcd electing a leader): nothing can be written that this apiserver could
    /// miss.
    Leaderless,
    /// Nobody answered at all.
    Silent,
}

/// The freshness state, shared by the follower, the prober, `/healthz` and the
/// registration.
#[derive(Debug)]
pub(crate) struct Freshness {
    state: Mutex<State>,
    /// Past this lag the apiserver fails closed.
    pub(crate) max_lag: Duration,
    /// Told when the apiserver fell behind: the follower leaves its watch and reloads.
    pub(crate) lagging: Notify,
    /// The controller revision the listeners are at (for the registration).
    pub(crate) applied: watch::Sender<u64>,
    metrics: Metrics,
}

/// A revision known to exist, with changes under the prefix, not applied yet.
#[derive(Debug, Clone, Copy)]
struct Sighting {
    rev: i64,
    /// When the probe that found it was sent: the store was at or before `rev` then, so
    /// once `rev` is applied the apiserver is known current as of this moment.
    asked: Instant,
    /// When its answer arrived (where the delivery clock of its changes starts).
    seen: Instant,
}

#[derive(Debug)]
struct State {
    /// The etcd revision everything up to which is applied.
    etcd_rev: i64,
    /// Revisions known to exist and not applied yet; oldest first.
    sightings: VecDeque<Sighting>,
    /// The last moment this apiserver was known to have everything the store had.
    current_at: Instant,
    /// The store revision up to which it is known to have every change under the prefix
    /// (at least `etcd_rev`; more when later revisions changed nothing under it).
    covered: i64,
    /// The last time etcd said anything (a probe answer or refusal, a watch message).
    heard: Instant,
    /// Why the listeners were marked stale for lag; cleared by the next load.
    stale: Option<String>,
}

impl Freshness {
    pub(crate) fn new(max_lag: Duration, metrics: Metrics) -> Self {
        Self {
            state: Mutex::new(State {
                etcd_rev: 0,
                sightings: VecDeque::new(),
                current_at: Instant::now(),
                covered: 0,
                heard: Instant::now(),
                stale: None,
            }),
            max_lag,
            lagging: Notify::new(),
            applied: watch::Sender::new(0),
            metrics,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The etcd revision the follower has applied.
    pub(crate) fn etcd_rev(&self) -> i64 {
        self.state().etcd_rev
    }

    /// The store revision up to which this apiserver is known to have every change under
    /// the prefix.
    fn covered(&self) -> i64 {
        self.state().covered
    }

    /// The follower applied everything up to `etcd_rev` (a watch message). A watch
    /// message alone proves nothing about currency (the watched member may itself be
    /// behind); only the sightings it settles do.
    pub(crate) fn applied_etcd(&self, etcd_rev: i64, now: Instant) {
        let mut st = self.state();
        st.etcd_rev = st.etcd_rev.max(etcd_rev);
        st.covered = st.covered.max(etcd_rev);
        st.heard = now;
        let rev = st.etcd_rev;
        st.settle(rev);
    }

    /// A whole load at `etcd_rev`, whose first (linearizable) page was asked for at
    /// `asked`, resynced the listeners: fresh again, and known current as of `asked`.
    pub(crate) fn loaded(&self, etcd_rev: i64, asked: Instant, now: Instant) {
        self.applied_etcd(etcd_rev, now);
        {
            let mut st = self.state();
            if st.sightings.is_empty() {
                st.current_at = st.current_at.max(asked);
            }
        }
        if let Some(why) = self.state().stale.take() {
            tracing::info!(etcd_revision = etcd_rev, was = %why, "freshness: caught up; serving again");
        }
    }

    /// The listeners applied controller revision `rev`.
    pub(crate) fn applied_controller(&self, rev: u64) {
        self.applied
            .send_if_modified(|a| std::mem::replace(a, rev) != rev);
    }

    /// What a probe sent at `asked` learned; its answer came at `now`.
    pub(crate) fn probed(&self, probe: Probe, asked: Instant, now: Instant) {
        let mut st = self.state();
        match probe {
            Probe::Answer { rev, changed } => {
                st.heard = now;
                if !changed || rev <= st.etcd_rev {
                    // Nothing under the prefix after what is applied, up to `rev` (which
                    // the store had reached no earlier than `asked`): current as of then.
                    st.settle(rev);
                    st.covered = st.covered.max(rev);
                    st.current_at = st.current_at.max(asked);
                } else if st.sightings.back().is_none_or(|s| s.rev < rev) {
                    st.sightings.push_back(Sighting {
                        rev,
                        asked,
                        seen: now,
                    });
                }
            }
            Probe::Leaderless => {
                st.heard = now;
                // Nothing can be written without a leader (see the module documentation).
                if st.sightings.is_empty() {
                    st.current_at = st.current_at.max(asked);
                }
            }
            Probe::Silent => {}
        }
    }

    /// The lag now (see the module documentation).
    pub(crate) fn lag(&self, now: Instant) -> Duration {
        let st = self.state();
        if st.sightings.is_empty() {
            Duration::ZERO
        } else {
            now.saturating_duration_since(st.current_at)
        }
    }

    /// When this apiserver fails closed unless it catches up first (`None`: nothing is
    /// known to be missing).
    fn deadline(&self) -> Option<Instant> {
        let st = self.state();
        (!st.sightings.is_empty()).then(|| st.current_at + self.max_lag)
    }

    /// When the oldest revision not applied yet was first seen: where the delivery clock
    /// of the changes being applied starts.
    pub(crate) fn since(&self) -> Option<Instant> {
        self.state().sightings.front().map(|s| s.seen)
    }

    /// Why this apiserver fails closed now (`None`: it serves).
    pub(crate) fn stale(&self) -> Option<String> {
        self.state().stale.clone()
    }

    /// Judges the lag at `now`; on falling behind, marks the listeners stale and tells the
    /// follower. Returns the lag.
    fn judge(&self, listeners: &[Arc<dyn ClusterListener>], now: Instant) -> Duration {
        let lag = self.lag(now);
        self.metrics.lag.set(lag.as_secs_f64());
        let mut st = self.state();
        if st.stale.is_some() {
            return lag;
        }
        let silent = now.saturating_duration_since(st.heard);
        let why = if lag > self.max_lag {
            format!(
                "this apiserver is {} behind the store (max_lag {})",
                humantime::format_duration(round_ms(lag)),
                humantime::format_duration(self.max_lag)
            )
        } else if silent > self.max_lag {
            format!(
                "this apiserver has heard nothing from etcd for {} (max_lag {})",
                humantime::format_duration(round_ms(silent)),
                humantime::format_duration(self.max_lag)
            )
        } else {
            return lag;
        };
        tracing::warn!(reason = %why, etcd_revision = st.etcd_rev, "freshness: failing closed until caught up");
        st.stale = Some(why.clone());
        drop(st);
        self.metrics.lagging.inc();
        for l in listeners {
            l.stale(&why);
        }
        self.lagging.notify_one();
        lag
    }
}

impl State {
    /// Drops the sightings up to `rev` (applied, or known to hold no change under the
    /// prefix): the apiserver was current as of when each was asked for.
    fn settle(&mut self, rev: i64) {
        while let Some(s) = self.sightings.front().copied().filter(|s| s.rev <= rev) {
            self.current_at = self.current_at.max(s.asked);
            self.covered = self.covered.max(s.rev);
            self.sightings.pop_front();
        }
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// Judges the lag every [`JUDGE_EVERY`], and at the moment it would pass `max_lag`, until
/// dropped.
pub(crate) async fn judge(fresh: Arc<Freshness>, listeners: Vec<Arc<dyn ClusterListener>>) {
    loop {
        fresh.judge(&listeners, Instant::now());
        let next = Instant::now() + JUDGE_EVERY;
        // Just past the deadline (the rule is "more than max_lag"), not up to a tick late.
        let due = fresh.deadline().map(|d| d + Duration::from_millis(1));
        tokio::time::sleep_until(due.map_or(next, |d| d.min(next))).await;
    }
}

/// Probes the store every [`probe_interval`] until dropped.
pub(crate) async fn probe(fresh: Arc<Freshness>, store: Arc<EtcdStore>) {
    let interval = probe_interval(fresh.max_lag);
    let mut every = tokio::time::interval(interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let asked = Instant::now();
        let p = probe_once(&fresh, &store, interval.max(Duration::from_millis(500))).await;
        fresh.probed(p, asked, Instant::now());
    }
}

/// One probe: every member asked at once, the first answer counts. At once, not in turn:
/// members that do not answer (frozen, cut off, holding the read while etcd elects a
/// leader) would otherwise each cost a timeout before the one that answers is asked, and
/// during a quorum loss the "no leader" round would come later than `max_lag` allows
/// (the apiserver would fail closed for nothing).
async fn probe_once(fresh: &Freshness, store: &Arc<EtcdStore>, timeout: Duration) -> Probe {
    let range = Arc::new(store.changes_since_request(fresh.etcd_rev() + 1));
    let mut leaderless = false;
    let mut asked = ask_all(store, move |store, at| {
        let range = range.clone();
        async move {
            let gateway = store.gateway();
            let r: RangeResponse = gateway.unary_one(at, "KV/Range", &*range, timeout).await?;
            Ok((r.revision(), r.count))
        }
    });
    // Dropping the set (on the first answer) cancels the calls still waiting.
    while let Some(done) = asked.join_next().await {
        match done {
            Ok(Ok((rev, count))) => {
                return Probe::Answer {
                    rev,
                    changed: count > 0,
                }
            }
            Ok(Err(e)) => {
                leaderless |= e.contains("no leader");
                tracing::debug!(error = %e, "freshness: probe");
            }
            Err(e) => tracing::debug!(error = %e, "freshness: probe task"),
        }
    }
    if leaderless {
        return Probe::Leaderless;
    }
    // Every member held the read. For the first one or two election timeouts of a quorum
    // loss the live members still believe in a leader and hold linearizable reads instead
    // of saying "no leader"; their own status (answered locally) tells that from silence:
    // a live member with nothing this apiserver lacks, while no read can be served, is
    // the same as "no leader".
    let mut asked = ask_all(store, move |store, at| async move {
        let gateway = store.gateway();
        let status: StatusResponse = gateway
            .unary_one(at, "Maintenance/Status", &StatusRequest {}, timeout)
            .await?;
        Ok(status.header.map_or(0, |h| h.revision))
    });
    while let Some(done) = asked.join_next().await {
        match done {
            Ok(Ok(rev)) if rev <= fresh.covered() => return Probe::Leaderless,
            Ok(Err(e)) if e.contains("no leader") => return Probe::Leaderless,
            _ => {}
        }
    }
    Probe::Silent
}

/// `call` on every member at once (`call(store, member)`).
fn ask_all<T, F, Fut>(store: &Arc<EtcdStore>, call: F) -> tokio::task::JoinSet<Result<T, String>>
where
    T: Send + 'static,
    F: Fn(Arc<EtcdStore>, usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>> + Send + 'static,
{
    let mut asked = tokio::task::JoinSet::new();
    for at in 0..store.endpoints().len() {
        asked.spawn(call(store.clone(), at));
    }
    asked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Marks(Mutex<Vec<String>>);
    impl ClusterListener for Marks {
        fn resync(&self, _: &plugin_api::ClusterSnapshot) {}
        fn on_event(&self, _: &plugin_api::ClusterEvent) {}
        fn stale(&self, reason: &str) {
            self.0.lock().unwrap().push(reason.to_owned());
        }
    }

    fn answer(rev: i64, changed: bool) -> Probe {
        Probe::Answer { rev, changed }
    }

    /// The rule on a virtual clock: the lag counts from the last moment the apiserver was
    /// known current (when the probe that showed it was *sent*), not from the first
    /// sighting of a newer revision; past `max_lag` the listeners fail closed once; a
    /// quorum loss (no answer but "no leader") is no lag; silence is; a load serves again.
    #[test]
    fn lag_counts_from_the_last_moment_known_current_and_fails_closed_past_max_lag() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let f = Freshness::new(Duration::from_secs(2), Metrics::default());
        let marks = Arc::new(Marks::default());
        let ls: Vec<Arc<dyn ClusterListener>> = vec![marks.clone()];
        f.applied_etcd(10, ms(0));
        // A write outside the prefix: the store moved, nothing to apply; current as of
        // the probe sent at 0.1 s.
        f.probed(answer(11, false), ms(100), ms(150));
        assert_eq!(f.lag(ms(3000)), Duration::ZERO);
        assert_eq!(f.covered(), 11, "nothing under the prefix up to 11");
        // The store moves under the prefix after 0.1 s; the probe sent at 0.6 s sees 12
        // (answered at 0.65 s), the one sent at 1.1 s sees 13. The lag counts from 0.1 s:
        // the store may have moved right after the last probe that showed it current.
        f.probed(answer(12, true), ms(600), ms(650));
        assert_eq!(f.since(), Some(ms(650)), "delivery clock: first sighting");
        f.probed(answer(13, true), ms(1100), ms(1150));
        assert_eq!(f.lag(ms(1500)), Duration::from_millis(1400));
        // The watch delivers 12: current as of 0.6 s (the store was at 12 or before
        // when that probe was sent); 13 is still missing.
        f.applied_etcd(12, ms(1600));
        assert_eq!(f.lag(ms(1600)), Duration::from_secs(1));
        assert_eq!(f.deadline(), Some(ms(2600)));
        // Quorum loss: only "no leader" answers; they neither add lag nor, with 13
        // missing, make the apiserver current; no silence either.
        for t in [1700, 2200] {
            f.probed(Probe::Leaderless, ms(t), ms(t + 50));
        }
        assert_eq!(f.judge(&ls, ms(2600)), Duration::from_secs(2));
        assert!(f.stale().is_none() && marks.0.lock().unwrap().is_empty());
        // 13 is still not applied at 2.7 s: 2.1 s since known current (only 1.55 s since
        // 13 was seen), fails closed, once.
        f.judge(&ls, ms(2700));
        f.judge(&ls, ms(2800));
        let why = f.stale().expect("stale");
        assert!(
            why.contains("2s 100ms behind the store (max_lag 2s)"),
            "{why}"
        );
        assert_eq!(marks.0.lock().unwrap().len(), 1);
        // The reload (asked for at 3.2 s) caught up: serves again, current as of 3.2 s.
        f.loaded(14, ms(3200), ms(3300));
        assert!(f.stale().is_none());
        assert_eq!(f.judge(&ls, ms(3300)), Duration::ZERO);
        // A quorum loss with nothing missing counts as current: the first write after
        // it is not charged the whole loss.
        for t in [4000, 6000, 8000] {
            f.probed(Probe::Leaderless, ms(t), ms(t + 50));
        }
        f.probed(answer(15, true), ms(8500), ms(8550));
        assert_eq!(f.judge(&ls, ms(8600)), Duration::from_millis(600));
        f.applied_etcd(15, ms(8610));
        // Nothing heard at all for more than max_lag: cut off, fails closed.
        f.probed(Probe::Silent, ms(9000), ms(9500));
        assert!(f.stale().is_none());
        f.judge(&ls, ms(10_710));
        let why = f.stale().expect("stale");
        assert!(
            why.contains("heard nothing from etcd for 2s 100ms"),
            "{why}"
        );
    }

    #[test]
    fn the_probe_interval_is_at_most_a_second() {
        assert_eq!(
            probe_interval(Duration::from_secs(2)),
            Duration::from_millis(500)
        );
        assert_eq!(
            probe_interval(Duration::from_secs(10)),
            Duration::from_secs(1)
        );
    }
}
