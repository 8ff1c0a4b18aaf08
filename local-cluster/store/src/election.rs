//! Leader election on etcd: several controllers on one etcd, one active at a time.
//!
//! Through the same client as [`EtcdStore`](super::EtcdStore) (its JSON gateway for the
//! leases and the campaign, its gRPC watch for the standbys):
//! - **campaign**: grant a lease (`POST /v3/lease/grant`), then one transaction "if the
//!   leader key `<prefix>.leader` does not exist (`create_revision == 0`), put it with my
//!   id, attached to my lease; else read it". The winner leads while its lease lives.
//! - **standby**: a loser revokes its lease, names the leader once, and watches the
//!   leader key from the revision it read (etcd's gRPC stream `Watch/Watch`) until it
//!   is deleted — by a resign (lease revoked) or by
//!   the leader's lease running out — then campaigns again. A watch that stays silent
//!   for twice the TTL is dropped and the campaign retried, so a half-open connection
//!   to a dead etcd member cannot park a standby forever.
//! - **leading**: [`Leadership::maintain`] renews the lease every `retry_period`
//!   (`POST /v3/lease/keepalive`) and checks the key is still its own. As in
//!   Kubernetes' leader election ([`LeaseTimings`]: a 15 s lease, a 10 s renew deadline,
//!   2 s retries), a leader that has not renewed for `renew_deadline` steps down, before
//!   its lease can run out and a standby take over; an etcd election (a second or two)
//!   costs a few failed renewals, not the leadership. The leader counts from the moment
//!   it *sent* each renewal, so it believes the lease expired no later than etcd does.
//!   When the lease is gone, the key is no longer its own, or the renew deadline passed,
//!   it is told at once (what then is the caller's part: `xced controller` drops its
//!   state and campaigns again as a standby).
//!
//! The election alone does not make commits safe (a request in flight while the lease
//! runs out may still land): the store's [`with_leader_guard`](super::EtcdStore::with_leader_guard)
//! makes every commit conditional on the leader key being the one this leader created.

use super::etcd::gateway::{self, b64, check_endpoint, int, Gateway, Limits};
use super::etcd::pb;
use retry_backoff::Backoff;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// The leader key's name after the store prefix (no `/`: it is no `<ns>/<key>`).
const LEADER: &str = ".leader";
/// The lease TTL unless told otherwise (Kubernetes' `LeaseDuration`).
pub const DEFAULT_LEADER_TTL: Duration = Duration::from_secs(15);

/// Why the election could not go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ElectionError {
    /// Bad endpoints, prefix, id or TTL.
    #[error("invalid election config: {0}")]
    InvalidConfig(String),
    /// etcd could not be asked (no endpoint answered, or it refused).
    #[error("etcd: {0}")]
    Etcd(String),
    /// This candidate is not (or no longer) the leader.
    #[error("leadership lost: {0}")]
    Lost(String),
}

/// How a leader keeps its lease, after Kubernetes' leader election (`LeaseDuration`,
/// `RenewDeadline`, `RetryPeriod`): the defaults are theirs, 15 s, 10 s and 2 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimings {
    /// The etcd lease's TTL: a standby takes over at most this long after the leader's
    /// last renewal (whole seconds, at least 1 s).
    pub ttl: Duration,
    /// A leader that has not renewed its lease for this long steps down. Shorter than
    /// `ttl`, so it stops leading before its lease can run out and a standby take over;
    /// long enough that an etcd election (a second or two) does not depose it.
    pub renew_deadline: Duration,
    /// The pause between renewals, between retries of a failed one, and at most between
    /// campaign attempts while etcd does not answer.
    pub retry_period: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_LEADER_TTL,
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl LeaseTimings {
    /// The timings for a lease of `ttl` when only that is given: the renew deadline is
    /// 2/3 of it and the retry period a fifth of that (15 s → 10 s and 2 s, the defaults;
    /// 3 s → 2 s and 400 ms).
    pub fn from_ttl(ttl: Duration) -> Self {
        let renew_deadline = ttl * 2 / 3;
        Self {
            ttl,
            renew_deadline,
            retry_period: renew_deadline / 5,
        }
    }

    /// Every rule the timings break, each naming its setting (`leader_ttl`,
    /// `renew_deadline`, `retry_period`, as in the controller's config) and the reason.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let Self {
            ttl,
            renew_deadline,
            retry_period,
        } = *self;
        if ttl < Duration::from_secs(1) || ttl.subsec_nanos() != 0 {
            out.push(format!(
                "leader_ttl ({ttl:?}) must be whole seconds, at least 1s (an etcd lease's TTL)"
            ));
        }
        if renew_deadline.is_zero() {
            out.push("renew_deadline must be greater than zero".into());
        } else if renew_deadline >= ttl {
            out.push(format!(
                "renew_deadline ({renew_deadline:?}) must be shorter than leader_ttl ({ttl:?}): \
                 a leader must step down before its lease can run out and a standby take over"
            ));
        }
        if retry_period.is_zero() {
            out.push("retry_period must be greater than zero".into());
        } else if retry_period >= renew_deadline {
            out.push(format!(
                "retry_period ({retry_period:?}) must be shorter than renew_deadline \
                 ({renew_deadline:?}): a leader must get more than one try before it steps down"
            ));
        }
        out
    }
}

/// One candidate: its id, the leader key, the lease timings. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Election {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    gateway: Gateway,
    key: String,
    id: String,
    timings: LeaseTimings,
    /// The deadline of one HTTP exchange.
    timeout: Duration,
}

/// What one campaign attempt found.
enum Attempt {
    Won(Leadership),
    /// Someone else leads: their id, and the revision the key was read at.
    Held {
        leader: String,
        rev: i64,
    },
    /// The key is this candidate's own, from an earlier term whose lease still lives
    /// (the term stepped down while etcd could not revoke it): revoked now, try again.
    OwnRevoked,
}

/// Why a watch ended.
enum WatchEnd {
    /// The leader key was deleted.
    Deleted,
    /// Silence, the end of the stream, or a cancel: look again.
    Recheck,
}

// === impl Election ===

impl Election {
    /// A candidate named `id` for the leader key `<prefix>.leader` on `endpoints`
    /// (`HOST:PORT`, tried in order), with a lease of `ttl` (whole seconds, at least 1;
    /// etcd may grant more) and the renew deadline and retry period derived from it
    /// ([`LeaseTimings::from_ttl`]). Contacts nobody yet.
    pub fn new(
        endpoints: Vec<String>,
        prefix: &str,
        id: &str,
        ttl: Duration,
    ) -> Result<Self, ElectionError> {
        Self::with_timings(endpoints, prefix, id, LeaseTimings::from_ttl(ttl))
    }

    /// [`new`](Self::new) with every lease timing given.
    pub fn with_timings(
        endpoints: Vec<String>,
        prefix: &str,
        id: &str,
        timings: LeaseTimings,
    ) -> Result<Self, ElectionError> {
        let ttl = timings.ttl;
        let bad = |m: String| ElectionError::InvalidConfig(m);
        if endpoints.is_empty() {
            return Err(bad("no etcd endpoint given".into()));
        }
        for ep in &endpoints {
            check_endpoint(ep).map_err(|r| bad(format!("etcd endpoint {ep:?} {r}")))?;
        }
        if !prefix.ends_with('/') {
            return Err(bad(format!("key prefix {prefix:?} must end with /")));
        }
        if id.is_empty() {
            return Err(bad("the candidate id is empty".into()));
        }
        if ttl < Duration::from_secs(1) {
            return Err(bad(format!("leader ttl {ttl:?} is below 1s")));
        }
        let problems = timings.problems();
        if !problems.is_empty() {
            return Err(bad(problems.join("; ")));
        }
        let timeout = (ttl / 2).clamp(Duration::from_millis(500), super::etcd::DEFAULT_TIMEOUT);
        Ok(Self {
            inner: Arc::new(Inner {
                gateway: Gateway::new(endpoints, timeout),
                key: format!("{prefix}{LEADER}"),
                id: id.to_owned(),
                timings,
                timeout,
            }),
        })
    }

    /// This candidate's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The leader key (`<prefix>.leader`).
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The lease timings.
    pub fn timings(&self) -> LeaseTimings {
        self.inner.timings
    }

    /// Who leads now: the id the leader key holds (`None`: nobody). For readers that
    /// forward to the leader; it does not campaign.
    pub fn leader(&self) -> Result<Option<String>, ElectionError> {
        let r = self.call(
            "/v3/kv/range",
            &json!({ "key": b64(self.inner.key.as_bytes()) }),
        )?;
        match r.pointer("/kvs/0/value") {
            None => Ok(None),
            Some(v) => {
                let bytes = gateway::unb64(v).map_err(ElectionError::Etcd)?;
                Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
            }
        }
    }

    /// Blocks until this candidate leads. `standby` is called with the leader's id each
    /// time another one is found leading (once per leader). An unreachable etcd is
    /// retried (with a pause growing up to the retry period, each failure logged); only
    /// a refused request ends
    /// the campaign with an error.
    pub fn campaign(&self, mut standby: impl FnMut(&str)) -> Result<Leadership, ElectionError> {
        let mut named: Option<String> = None;
        let mut backoff =
            Backoff::jittered(Duration::from_millis(100), self.inner.timings.retry_period);
        loop {
            let failed = match self.attempt() {
                Ok(Attempt::Won(l)) => return Ok(l),
                Ok(Attempt::OwnRevoked) => {
                    backoff.reset();
                    continue;
                }
                Ok(Attempt::Held { leader, rev }) => {
                    if named.as_deref() != Some(leader.as_str()) {
                        standby(&leader);
                        named = Some(leader);
                    }
                    backoff.reset();
                    match self.watch_delete(rev + 1) {
                        Ok(WatchEnd::Deleted | WatchEnd::Recheck) => continue,
                        Err(e) => e,
                    }
                }
                Err(ElectionError::Etcd(e)) => e,
                Err(e) => return Err(e),
            };
            let pause = backoff.next_pause();
            tracing::warn!(error = %failed, retry_in = ?pause, "election: etcd did not answer");
            std::thread::sleep(pause);
        }
    }

    /// One campaign transaction (with a fresh lease).
    fn attempt(&self) -> Result<Attempt, ElectionError> {
        let i = &self.inner;
        let sent = Instant::now();
        let grant = self.call(
            "/v3/lease/grant",
            &json!({ "TTL": i.timings.ttl.as_secs().max(1).to_string() }),
        )?;
        let lease = int(&grant["ID"]);
        let granted = int(&grant["TTL"]);
        if lease == 0 || granted <= 0 {
            return Err(ElectionError::Etcd(format!(
                "lease grant answered no lease: {grant}"
            )));
        }
        let key = b64(i.key.as_bytes());
        let txn = self.call(
            "/v3/kv/txn",
            &json!({
                "compare": [{ "key": key, "target": "CREATE", "result": "EQUAL",
                              "create_revision": "0" }],
                "success": [{ "request_put": { "key": key, "value": b64(i.id.as_bytes()),
                                               "lease": lease.to_string() } }],
                "failure": [{ "request_range": { "key": key } }],
            }),
        );
        let txn = match txn {
            Ok(t) => t,
            Err(e) => {
                // Whether it went through is unknown: the lease must not outlive it.
                let _ = self.revoke(lease);
                return Err(e);
            }
        };
        let rev = int(&txn["header"]["revision"]);
        if txn["succeeded"].as_bool() == Some(true) {
            tracing::info!(id = %i.id, lease = %format!("{lease:x}"), ttl_s = granted, "election: leading");
            return Ok(Attempt::Won(Leadership {
                election: self.clone(),
                lease,
                create_revision: rev,
                ttl: Duration::from_secs(granted as u64),
                expires: sent + Duration::from_secs(granted as u64),
                renewed: sent,
            }));
        }
        let _ = self.revoke(lease);
        let kv = txn.pointer("/responses/0/response_range/kvs/0");
        let leader = kv
            .map(|kv| {
                String::from_utf8_lossy(&gateway::unb64(&kv["value"]).unwrap_or_default())
                    .into_owned()
            })
            .unwrap_or_default();
        if leader == i.id {
            // This process's own key from a term that stepped down (ids name the
            // process): no one to follow, and no reason to wait for the lease to run
            // out. Revoking it lets this candidate (or another) lead at once.
            let old = kv.map_or(0, |kv| int(&kv["lease"]));
            tracing::warn!(id = %i.id, lease = %format!("{old:x}"), "election: the leader key is still this controller's from a term that stepped down; revoking its lease");
            match self.revoke(old) {
                Err(ElectionError::Etcd(e)) if !e.contains("lease not found") => {
                    return Err(ElectionError::Etcd(e))
                }
                Err(e @ (ElectionError::InvalidConfig(_) | ElectionError::Lost(_))) => {
                    return Err(e)
                }
                _ => return Ok(Attempt::OwnRevoked),
            }
        }
        Ok(Attempt::Held { leader, rev })
    }

    /// Revokes a lease (its keys go with it).
    fn revoke(&self, lease: i64) -> Result<(), ElectionError> {
        self.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }))
            .map(drop)
    }

    /// `body` to `path` on each endpoint in turn (from the last good one) until one
    /// answers. A refusal is authoritative: another member would say the same.
    fn call(&self, path: &str, body: &Value) -> Result<Value, ElectionError> {
        self.call_by(path, body, Instant::now() + self.inner.timeout * 3)
    }

    /// [`call`](Self::call), giving up at `deadline` (each endpoint gets the usual
    /// timeout, or what is left).
    fn call_by(&self, path: &str, body: &Value, deadline: Instant) -> Result<Value, ElectionError> {
        self.call_within(path, body, deadline, self.inner.timeout)
    }

    /// [`call_by`](Self::call_by), each endpoint getting at most `per_endpoint`.
    fn call_within(
        &self,
        path: &str,
        body: &Value,
        deadline: Instant,
        per_endpoint: Duration,
    ) -> Result<Value, ElectionError> {
        let limits = Limits {
            per_endpoint,
            deadline: Some(deadline),
        };
        gateway::wait(self.inner.gateway.call(path, body, limits))
            .map_err(|e| ElectionError::Etcd(e.message))
    }

    /// Watches the leader key from revision `from` on the current endpoint until it is
    /// deleted, or the watch ends or stays silent for twice the TTL.
    fn watch_delete(&self, from: i64) -> Result<WatchEnd, String> {
        let i = &self.inner;
        let create = pb::WatchCreateRequest::new(i.key.as_bytes(), Vec::new(), from);
        gateway::wait(async {
            // Silence for twice the TTL, before or after the answer starts: look again
            // (see the module documentation).
            let silence = i.timings.ttl * 2;
            let opened = i.gateway.watch_stream(i.gateway.current(), create, silence);
            let mut watch = match opened.await {
                Ok(w) => w,
                Err(e) if e.silent => return Ok(WatchEnd::Recheck),
                Err(e) => return Err(e.message),
            };
            loop {
                let answer = match tokio::time::timeout(silence, watch.next()).await {
                    Err(_silent) => return Ok(WatchEnd::Recheck),
                    Ok(Ok(None)) => return Ok(WatchEnd::Recheck),
                    Ok(Ok(Some(answer))) => answer,
                    Ok(Err(e)) => return Err(e),
                };
                let deleted = answer
                    .events
                    .iter()
                    .any(|e| e.r#type == pb::event_type::DELETE);
                if deleted {
                    return Ok(WatchEnd::Deleted);
                }
                if answer.canceled {
                    return Ok(WatchEnd::Recheck);
                }
            }
        })
    }
}

// === impl Leadership ===

/// This candidate leads while its lease lives. Renew it with [`keep_alive`]
/// (or hand it to [`maintain`]); [`resign`] hands leadership over at once.
///
/// [`keep_alive`]: Leadership::keep_alive
/// [`maintain`]: Leadership::maintain
/// [`resign`]: Leadership::resign
#[derive(Debug)]
pub struct Leadership {
    election: Election,
    lease: i64,
    create_revision: i64,
    ttl: Duration,
    /// When the lease runs out at the latest, counted from the last renewal's sending.
    expires: Instant,
    /// When the last renewal that went through (or the grant) was sent.
    renewed: Instant,
}

impl Leadership {
    /// The leader's id.
    pub fn id(&self) -> &str {
        self.election.id()
    }

    /// The leader key.
    pub fn key(&self) -> &str {
        self.election.key()
    }

    /// The revision at which this leader created the leader key (see
    /// [`EtcdStore::with_leader_guard`](super::EtcdStore::with_leader_guard)).
    pub fn create_revision(&self) -> i64 {
        self.create_revision
    }

    /// The granted lease TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// By when the lease runs out unless renewed (a conservative estimate).
    pub fn expires(&self) -> Instant {
        self.expires
    }

    /// By when this leader steps down unless it renews: `renew_deadline` after the last
    /// renewal that went through was sent (and never after [`expires`](Self::expires)).
    pub fn step_down_at(&self) -> Instant {
        (self.renewed + self.election.inner.timings.renew_deadline).min(self.expires)
    }

    /// One renewal: keeps the lease alive and checks the leader key is still this
    /// leader's. [`ElectionError::Lost`] when the lease or the key is gone;
    /// [`ElectionError::Etcd`] when etcd did not answer (still leading until
    /// [`step_down_at`](Self::step_down_at)).
    pub fn keep_alive(&mut self) -> Result<(), ElectionError> {
        let e = &self.election;
        let sent = Instant::now();
        // An answer after the renew deadline is no use: the caller must learn by then.
        let by = self.step_down_at().max(sent + Duration::from_millis(50));
        // Each member gets a retry period at most: a follower forwards the renewal to the
        // raft leader, and holds it for seconds when that one is frozen, while another
        // member answers once etcd has elected a new leader.
        let per_endpoint = e
            .inner
            .timings
            .retry_period
            .clamp(Duration::from_millis(500), e.inner.timeout);
        let r = e.call_within(
            "/v3/lease/keepalive",
            &json!({ "ID": self.lease.to_string() }),
            by,
            per_endpoint,
        )?;
        // The streaming gateway reports a failure in a 200 answer: that is etcd not
        // answering (say, while it elects a raft leader), not the lease gone.
        if r.get("error").is_some() || r.get("result").is_none() {
            return Err(ElectionError::Etcd(format!(
                "/v3/lease/keepalive answered no result: {r}"
            )));
        }
        let ttl = int(&r["result"]["TTL"]);
        if ttl <= 0 {
            return Err(ElectionError::Lost(format!(
                "the lease {:x} has expired",
                self.lease
            )));
        }
        let kv = e.call_within(
            "/v3/kv/range",
            &json!({ "key": b64(e.key().as_bytes()) }),
            by,
            per_endpoint,
        )?;
        let kv = kv.pointer("/kvs/0");
        let created = kv.map_or(0, |kv| int(&kv["create_revision"]));
        if created != self.create_revision {
            let holder = kv
                .map(|kv| {
                    String::from_utf8_lossy(&gateway::unb64(&kv["value"]).unwrap_or_default())
                        .into_owned()
                })
                .unwrap_or_else(|| "nobody".into());
            return Err(ElectionError::Lost(format!(
                "the leader key {:?} is no longer this leader's (held by {holder})",
                e.key()
            )));
        }
        self.expires = sent + Duration::from_secs(ttl as u64);
        self.renewed = sent;
        Ok(())
    }

    /// Hands leadership over at once: revokes the lease, which deletes the leader key.
    pub fn resign(self) -> Result<(), ElectionError> {
        self.election.revoke(self.lease)
    }

    /// Renews the lease every `retry_period` on a thread of its own. `lost` is called
    /// once, with the reason, when the lease or the key is gone or no renewal got through
    /// for `renew_deadline`; the thread then ends. Drop or [`resign`](Maintained::resign)
    /// the handle to stop.
    pub fn maintain(self, lost: impl FnOnce(ElectionError) + Send + 'static) -> Maintained {
        let (stop, stopped) = mpsc::channel::<()>();
        let timings = self.election.inner.timings;
        let period = timings.retry_period;
        let election = self.election.clone();
        let lease = self.lease;
        let create_revision = self.create_revision;
        let resigned = Arc::new(AtomicBool::new(false));
        let resigning = resigned.clone();
        let clock = Arc::new(LeaseClock::new(self.expires()));
        let extended = clock.clone();
        let thread = std::thread::Builder::new()
            .name("xce-leader-lease".into())
            .spawn(move || {
                let mut me = self;
                let mut wait = period;
                loop {
                    match stopped.recv_timeout(wait) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    let started = Instant::now();
                    let renewed = me.keep_alive();
                    let took = started.elapsed();
                    // A renewal that was in flight when the leader resigned fails (the
                    // lease is revoked): that is no loss to report.
                    if resigning.load(Ordering::SeqCst) {
                        return;
                    }
                    let left = me.step_down_at().saturating_duration_since(Instant::now());
                    match renewed {
                        Ok(()) => {
                            extended.extend(me.expires());
                            wait = period;
                            // Visible before it costs the leadership: an etcd member that
                            // hangs, an election, an overloaded etcd.
                            if took > period {
                                tracing::warn!(took = ?took, renew_deadline = ?timings.renew_deadline, "election: lease renewal was slow");
                            }
                        }
                        // Another try fits before the deadline: half of what is left at
                        // most, so the last try still has time to get through.
                        Err(ElectionError::Etcd(e)) if left >= Duration::from_millis(100) => {
                            wait = period.min(left / 2);
                            tracing::warn!(error = %e, steps_down_in = ?left, retry_in = ?wait, "election: lease renewal failed; retrying");
                        }
                        Err(ElectionError::Etcd(e)) => {
                            lost(ElectionError::Lost(format!(
                                "no lease renewal got through for the renew deadline ({:?}): {e}",
                                timings.renew_deadline
                            )));
                            return;
                        }
                        Err(e) => {
                            lost(e);
                            return;
                        }
                    }
                }
            })
            .expect("spawning the lease thread");
        Maintained {
            stop: Some(stop),
            thread: Some(thread),
            election,
            lease,
            create_revision,
            resigned,
            clock,
        }
    }
}

/// Until when a leader may still act as the leader, by its own clock: the end of its lease
/// counted from the sending of its last renewal that went through ([`Leadership::expires`]),
/// which the renewing thread moves on. No other controller can be elected before etcd
/// lets the lease run out, which is no earlier. Read on every request a leader answers
/// from its memory: a leader frozen past it (SIGSTOP, a starved VM) may have been replaced
/// meanwhile, and when it runs again its request handlers may answer before its renewing
/// thread has learned the lease is gone; this check needs no thread to have run. (A leader
/// that steps down at its renew deadline, before this, still answers its parked queries
/// as it drains.)
#[derive(Debug)]
pub struct LeaseClock {
    base: Instant,
    /// Nanoseconds after `base`.
    until: AtomicU64,
}

impl LeaseClock {
    fn new(until: Instant) -> Self {
        let base = Instant::now();
        let me = Self {
            base,
            until: AtomicU64::new(0),
        };
        me.extend(until);
        me
    }

    fn extend(&self, until: Instant) {
        let ns = until.saturating_duration_since(self.base).as_nanos();
        self.until
            .store(u64::try_from(ns).unwrap_or(u64::MAX), Ordering::Release);
    }

    /// `Err` with the reason once this leader may no longer lead.
    pub fn leading(&self) -> Result<(), String> {
        let until = self.base + Duration::from_nanos(self.until.load(Ordering::Acquire));
        let now = Instant::now();
        if now < until {
            return Ok(());
        }
        Err(format!(
            "this controller's leadership lease may have run out ({:?} ago, counted from its \
             last renewal): another controller may lead now",
            now - until
        ))
    }
}

/// A leadership whose lease a thread renews (see [`Leadership::maintain`]).
#[derive(Debug)]
pub struct Maintained {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    election: Election,
    lease: i64,
    create_revision: i64,
    /// Set when resigning: a renewal still in flight then ends the thread quietly.
    resigned: Arc<AtomicBool>,
    clock: Arc<LeaseClock>,
}

impl Maintained {
    /// Until when this leader may act as the leader (see [`LeaseClock`]).
    pub fn clock(&self) -> Arc<LeaseClock> {
        self.clock.clone()
    }

    /// Whether the leader key is still the one this leader created (one read, at most
    /// the usual call deadline): `false` once it is gone or another's. For a caller told
    /// by its store that a commit was refused, to learn whether that is the leadership
    /// lost or something else.
    pub fn holds_key(&self) -> Result<bool, ElectionError> {
        let e = &self.election;
        let r = e.call("/v3/kv/range", &json!({ "key": b64(e.key().as_bytes()) }))?;
        Ok(r.pointer("/kvs/0/create_revision").map_or(0, int) == self.create_revision)
    }

    /// Stops renewing and revokes the lease: a standby takes over at once. It does not
    /// wait for a renewal in flight (that may take up to the lease's end when etcd is
    /// slow); the renewing thread ends by itself, without calling `lost`.
    pub fn resign(mut self) -> Result<(), ElectionError> {
        self.resigned.store(true, Ordering::SeqCst);
        drop(self.stop.take());
        // Detached: the revocation must not wait for it.
        drop(self.thread.take());
        self.election.revoke(self.lease)
    }

    /// Stops renewing and revokes the lease, trying again (every `retry_period`) while
    /// etcd does not answer, until it is revoked, etcd says it is gone, or `give_up`
    /// passed. For a term that stepped down because etcd lost its quorum: the lease
    /// outlives the outage (a new etcd leader extends every lease by its TTL), and
    /// revoking it as soon as etcd answers again spares the next election that wait.
    /// `Ok(true)`: revoked; `Ok(false)`: it was gone already.
    pub fn revoke_until_gone(mut self, give_up: Duration) -> Result<bool, ElectionError> {
        self.resigned.store(true, Ordering::SeqCst);
        drop(self.stop.take());
        drop(self.thread.take());
        let until = Instant::now() + give_up;
        let period = self.election.inner.timings.retry_period;
        let mut backoff = Backoff::jittered(Duration::from_millis(100), period);
        loop {
            match self.election.revoke(self.lease) {
                Ok(()) => return Ok(true),
                Err(ElectionError::Etcd(e)) if e.contains("lease not found") => return Ok(false),
                Err(e) if Instant::now() >= until => return Err(e),
                Err(e) => {
                    let pause = backoff.next_pause();
                    tracing::debug!(error = %e, retry_in = ?pause, "election: the stepped-down term's lease is not revoked yet");
                    std::thread::sleep(pause);
                }
            }
        }
    }

    fn stop_thread(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Maintained {
    fn drop(&mut self) {
        // Stops renewing only: the lease runs out by itself.
        self.stop_thread();
    }
}

#[cfg(test)]
mod tests;
