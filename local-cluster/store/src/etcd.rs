//! [`EtcdStore`]: the controller's store in etcd v3, spoken to through etcd's native gRPC
//! API (`etcdserverpb.KV/Range`, `KV/Txn`; messages in [`pb`]) by the [`gateway`] client,
//! which also serves the apiserver's follower (its watch, `Watch/Watch`, and loads over
//! gRPC too) and every other watch, speaks etcd's JSON gateway for the election's and the
//! fleet's leases and writes, and holds the endpoints and their failover for all of them. The store trait is
//! synchronous: each call waits for the async client ([`gateway::wait`]).
//!
//! Why gRPC for the store: etcd's JSON gateway turns each request into a gRPC call to
//! etcd itself (JSON and base64 decoded by reflection, a loopback hop, the answer encoded
//! back), which cost etcd 5x the CPU of the transaction itself: 6.7-7.5 ms of etcd CPU
//! per transaction of 120 puts of 600 B through the gateway, 1.2-1.4 ms through gRPC
//! (`cargo test -p xce-store --release --lib gateway_and_grpc_cpu -- --ignored
//! --nocapture`, three alternated rounds of 300 transactions, load average 7.9 on 2
//! cores). In the controller bench on etcd (5 complete pairs, load 8.7-18.7), etcd's CPU
//! per placement fell to 0.22-0.46x and placements/s rose 1.24-2.20x
//! (`integration-tests/README.md`, "The etcd store on etcd's native gRPC API").
//!
//! Layout: every [`Key`] is the etcd key `<prefix><ns>/<key>` (default prefix `/xce/`).
//! Keys starting `<prefix>.` are control keys, not state (no namespace starts with `.`:
//! the leader election's `<prefix>.leader` lives there too). One of them, the *fence*
//! `<prefix>.commit`, is written by every commit with a token
//! naming the commit; every commit is one etcd transaction guarded by "the fence is where
//! this store last saw it". That buys two things:
//! - **exactly once across retries**: when a commit's answer is lost (the request may or
//!   may not have been applied), it is re-sent to the next endpoint; if the guard fails
//!   and the fence holds this very commit's token, the first attempt went through;
//! - **one writer**: a second controller on the same prefix moves the fence when it
//!   commits; the first one's next commit then fails instead of handing out what the
//!   other already has. The last to [`load_all`](Store::load_all) wins.
//!
//! A batch too big for one transaction (etcd's `--max-txn-ops`, 128 by default; or about
//! 1 MiB) is committed as one journal record `<prefix>.journal` (one transaction, with
//! the fence), then written out in transactions that fit, then the journal is deleted.
//! Until then `load_all` lays the journal over what it reads, and the next commit
//! finishes writing it out first: all or nothing still holds.

pub mod fleet;
pub mod gateway;
mod grpc;
mod outcome;
// The fields are etcd's, named and documented in its `rpc.proto` and `kv.proto`.
#[allow(missing_docs)]
pub mod pb;
mod wire;

use super::contract::{Batch, BatchLimit, Key, Op, Store, StoreError};
use gateway::{Gateway, Limits};
use pb::{compare_result, compare_target, Compare, RangeRequest, RequestOp, TargetUnion};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;
use wire::{journal_of, op_bytes, parse_journal, txn_ops, EtcdOp};

/// The key prefix unless told otherwise.
pub const DEFAULT_PREFIX: &str = "/xce/";
/// The deadline of one exchange with one endpoint unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Keys per range request of [`Store::load_all`].
const DEFAULT_PAGE: usize = 1000;
/// The fence's name after the prefix: no `/`, so it is no `<ns>/<key>`.
const FENCE: &str = ".commit";
/// The journal of a batch too big for one transaction (no `/` either).
const JOURNAL: &str = ".journal";
/// etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;
/// Key and value bytes per transaction, below etcd's default `--max-request-bytes`
/// (1.5 MiB) with room for the encoding (and for base64 and JSON, when it was the gateway's).
const CHUNK_BYTES: usize = 1 << 20;

/// Parses `etcd://HOST:PORT[,HOST:PORT…]` into its endpoints (`HOST:PORT` each).
pub fn parse_url(url: &str) -> Result<Vec<String>, StoreError> {
    gateway::parse_url(url).map_err(StoreError::InvalidConfig)
}

/// The controller's store in etcd. See the module documentation for the layout.
pub struct EtcdStore {
    gateway: Gateway,
    prefix: String,
    timeout: Duration,
    page: usize,
    max_ops: usize,
    /// `(leader key, its create_revision)`: every commit also requires that key to be
    /// the one this controller created when it won the election.
    leader: Option<(String, i64)>,
    state: Mutex<State>,
}

/// What one store instance remembers between calls (calls never overlap: the
/// controller's single state task makes them; the mutex only makes that safe to share).
#[derive(Debug)]
struct State {
    /// The fence's `mod_revision` as of this store's last load or commit (0: absent);
    /// `None` until one of them.
    fence_rev: Option<i64>,
    /// Names this instance in commit tokens.
    writer: u64,
    /// Counts this instance's commits.
    seq: u64,
    /// A commit whose outcome is unknown: no commit goes through until it is known not
    /// to have been applied (or a `load_all` reloads the truth).
    unresolved: Option<Unresolved>,
    /// A journaled batch not yet written out (see [`EtcdStore::apply_journal`]).
    pending: Option<Vec<EtcdOp>>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.gateway.endpoints())
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Why a call failed on every endpoint.
#[derive(Debug)]
struct CallError {
    /// Whether some endpoint may have applied the request.
    unknown: bool,
    message: String,
}

// === impl EtcdStore ===

impl EtcdStore {
    /// A store on the endpoints (`HOST:PORT` each, tried in order, the next on failure),
    /// under [`DEFAULT_PREFIX`]. Contacts nobody yet.
    pub fn new(endpoints: Vec<String>) -> Result<Self, StoreError> {
        if endpoints.is_empty() {
            return Err(StoreError::InvalidConfig("no etcd endpoint given".into()));
        }
        for ep in &endpoints {
            gateway::check_endpoint(ep)
                .map_err(|r| StoreError::InvalidConfig(format!("etcd endpoint {ep:?} {r}")))?;
        }
        let mut seed = [0u8; 8];
        // A clock-derived id is as good for naming commits when there is no entropy.
        let writer = match getrandom::fill(&mut seed) {
            Ok(()) => u64::from_le_bytes(seed),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        };
        Ok(Self {
            gateway: Gateway::new(endpoints, DEFAULT_TIMEOUT),
            prefix: DEFAULT_PREFIX.into(),
            timeout: DEFAULT_TIMEOUT,
            page: DEFAULT_PAGE,
            max_ops: DEFAULT_MAX_TXN_OPS,
            leader: None,
            state: Mutex::new(State {
                fence_rev: None,
                writer,
                seq: 0,
                unresolved: None,
                pending: None,
            }),
        })
    }

    /// A store on the endpoints of an `etcd://HOST:PORT[,HOST:PORT…]` url.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        Self::new(parse_url(url)?)
    }

    /// Keeps the keys under `prefix` instead (non-empty, ending in `/`).
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, StoreError> {
        if !prefix.ends_with('/') {
            return Err(StoreError::InvalidConfig(format!(
                "etcd key prefix {prefix:?} must end with /"
            )));
        }
        self.prefix = prefix.into();
        Ok(self)
    }

    /// Gives each HTTP exchange with one endpoint `timeout` (connect, send and answer).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.gateway = Gateway::new(self.gateway.endpoints().to_vec(), timeout);
        self
    }

    /// Puts at most `n` operations in one transaction (etcd's `--max-txn-ops`; at least 2).
    /// A batch with more is written as a journal first (see the module documentation).
    pub fn with_max_txn_ops(mut self, n: usize) -> Self {
        self.max_ops = n.max(2);
        self
    }

    /// Makes every commit conditional on the etcd key `key` still being the one created
    /// at `create_revision`: the leader key of this controller's
    /// [`Leadership`](super::Leadership). A deposed leader then cannot commit, not even a
    /// request that was in flight when its lease ran out (the fence alone lets a stale
    /// leader's commit land until the new leader's first commit moves it).
    pub fn with_leader_guard(mut self, key: &str, create_revision: i64) -> Self {
        self.leader = Some((key.to_owned(), create_revision));
        self
    }

    /// Reads `page` keys per range request (tests use a tiny page to paginate).
    #[cfg(test)]
    pub(crate) fn with_page(mut self, page: usize) -> Self {
        self.page = page.max(1);
        self
    }

    /// The endpoints, in the order tried.
    pub fn endpoints(&self) -> &[String] {
        self.gateway.endpoints()
    }

    /// The client of the store's etcd (the apiserver's follower watches through it).
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    fn etcd_key(&self, k: &Key) -> Result<String, StoreError> {
        if k.ns.is_empty() || k.ns.contains('/') || k.ns.starts_with('.') {
            return Err(StoreError::Backend(format!(
                "namespace {:?} cannot be stored in etcd (must be non-empty, without / and not starting with .)",
                k.ns
            )));
        }
        Ok(format!("{}{}/{}", self.prefix, k.ns, k.key))
    }

    /// `<prefix><ns>/<key>` back to a [`Key`].
    fn decode_key(&self, key: &str) -> Result<Key, StoreError> {
        key.strip_prefix(&self.prefix)
            .and_then(|k| k.split_once('/'))
            .filter(|(ns, _)| !ns.is_empty())
            .map(|(ns, k)| Key::new(ns, k))
            .ok_or_else(|| {
                StoreError::Backend(format!(
                    "etcd holds a key that is not the controller's under {:?}: {key:?}",
                    self.prefix
                ))
            })
    }

    fn fence_key(&self) -> String {
        format!("{}{FENCE}", self.prefix)
    }

    /// Calls the gRPC method `method` with `req` on each endpoint in turn (from the last
    /// good one) until one answers, each within the store's timeout. Takes the state
    /// (unused) so that calls stay serialized by its lock.
    fn call<Req, Resp>(&self, _: &mut State, method: &str, req: &Req) -> Result<Resp, CallError>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        gateway::wait(self.gateway.unary(method, req, Limits::each(self.timeout))).map_err(|e| {
            CallError {
                unknown: e.unknown,
                message: format!("etcd {}", e.message),
            }
        })
    }

    fn range(&self, st: &mut State, req: &RangeRequest) -> Result<pb::RangeResponse, CallError> {
        self.call(st, "KV/Range", req)
    }

    fn txn(&self, st: &mut State, req: &pb::TxnRequest) -> Result<pb::TxnResponse, CallError> {
        self.call(st, "KV/Txn", req)
    }

    /// Reads the fence: `(mod_revision, token)`, `(0, None)` when absent.
    fn read_fence(&self, st: &mut State) -> Result<(i64, Option<String>), StoreError> {
        let req = RangeRequest {
            key: self.fence_key().into_bytes(),
            ..Default::default()
        };
        let r = self
            .range(st, &req)
            .map_err(|e| StoreError::Backend(e.message))?;
        Ok(fence_of(r.kvs.first()))
    }

    /// Settles a commit whose outcome was unknown: `Ok` when it was not applied (or,
    /// for a replay-safe one, also when it was).
    fn resolve(&self, st: &mut State, lost: &Unresolved) -> Result<(), StoreError> {
        let (rev, value) = self.read_fence(st)?;
        if value.as_deref() == Some(lost.token.as_str()) {
            if !lost.replay_safe {
                return Err(StoreError::Stale(
                    "an earlier commit reported as failed was applied in etcd after all; \
                     restart the controller so it reloads its state"
                        .into(),
                ));
            }
            st.fence_rev = Some(rev);
        } else if Some(rev) != st.fence_rev {
            return Err(another_writer(rev, st.fence_rev));
        }
        st.unresolved = None;
        Ok(())
    }

    /// Whether the ops fit one transaction (with the fence put) and one request.
    fn fits(&self, ops: &[EtcdOp]) -> bool {
        ops.len() < self.max_ops && op_bytes(ops) <= CHUNK_BYTES
    }

    /// One transaction: `ops` plus moving the fence to a new token, if the fence is where
    /// this store last saw it. `replay_safe`: applying it once more changes nothing the
    /// caller relies on (so an unknown outcome need not stop later commits).
    fn guarded_txn(
        &self,
        st: &mut State,
        mut ops: Vec<RequestOp>,
        replay_safe: bool,
    ) -> Result<(), StoreError> {
        let expected = st.fence_rev.unwrap_or(0);
        st.seq += 1;
        let token = format!("{:016x}-{}", st.writer, st.seq);
        let fence = self.fence_key().into_bytes();
        ops.insert(0, RequestOp::put(fence.clone(), token.as_bytes()));
        let mut compare = vec![Compare {
            result: compare_result::EQUAL,
            target: compare_target::MOD,
            key: fence.clone(),
            target_union: Some(TargetUnion::ModRevision(expected)),
        }];
        let mut failure = vec![RequestOp::get(fence)];
        if let Some((key, created)) = &self.leader {
            compare.push(Compare {
                result: compare_result::EQUAL,
                target: compare_target::CREATE,
                key: key.as_bytes().to_vec(),
                target_union: Some(TargetUnion::CreateRevision(*created)),
            });
            failure.push(RequestOp::get(key.as_bytes()));
        }
        let req = pb::TxnRequest {
            compare,
            success: ops,
            failure,
        };
        let r = match self.txn(st, &req) {
            Ok(r) => r,
            Err(e) if e.unknown => {
                st.unresolved = Some(Unresolved { token, replay_safe });
                return Err(StoreError::Backend(format!(
                    "{} (the commit may or may not have been applied; \
                     no commit goes through until that is known)",
                    e.message
                )));
            }
            Err(e) => {
                let hint = if e.message.contains("too many operations") {
                    " (raise etcd's --max-txn-ops, or lower the controller's etcd_max_txn_ops to match)"
                } else if e.message.contains("too large") {
                    " (a batch is one etcd request: raise etcd's --max-request-bytes)"
                } else {
                    ""
                };
                return Err(StoreError::Backend(format!("{}{hint}", e.message)));
            }
        };
        if r.succeeded {
            st.fence_rev = Some(r.revision());
            return Ok(());
        }
        let (rev, value) = fence_of(r.range_kv(0));
        if value.as_deref() == Some(token.as_str()) {
            // An attempt whose answer was lost went through.
            st.fence_rev = Some(rev);
            return Ok(());
        }
        if let Some((key, created)) = &self.leader {
            let now = r.range_kv(1).map_or(0, |kv| kv.create_revision);
            if now != *created {
                return Err(StoreError::Stale(format!(
                    "this controller is no longer the leader (its leader key {key:?} of \
                     revision {created} is gone or replaced): it must not commit"
                )));
            }
        }
        Err(another_writer(rev, Some(expected)))
    }

    /// Writes a journaled batch in transactions that fit, then drops the journal.
    /// Every step can be replayed: the journal stays until the last.
    fn apply_journal(&self, st: &mut State, ops: &[EtcdOp]) -> Result<(), StoreError> {
        let mut start = 0;
        while start < ops.len() {
            let mut end = start + 1;
            while end < ops.len() && self.fits(&ops[start..=end]) {
                end += 1;
            }
            self.guarded_txn(st, txn_ops(&ops[start..end]), true)?;
            start = end;
        }
        self.guarded_txn(st, vec![RequestOp::delete(self.journal_key())], true)
    }

    fn journal_key(&self) -> String {
        format!("{}{JOURNAL}", self.prefix)
    }
}

/// A commit whose answer was lost.
#[derive(Debug, Clone)]
struct Unresolved {
    token: String,
    replay_safe: bool,
}

fn another_writer(now: i64, expected: Option<i64>) -> StoreError {
    StoreError::Stale(format!(
        "another writer changed the etcd store since this controller loaded it (fence at \
         revision {now}, expected {}): is a second controller using the same etcd prefix?",
        expected.unwrap_or(0)
    ))
}

/// `(mod_revision, token)` of a fence key-value, `(0, None)` for none.
fn fence_of(kv: Option<&pb::KeyValue>) -> (i64, Option<String>) {
    match kv {
        Some(kv) => (
            kv.mod_revision,
            Some(String::from_utf8_lossy(&kv.value).into_owned()),
        ),
        None => (0, None),
    }
}

/// Every record of the store, sorted by key (what [`Store::load_all`] returns).
pub type Records = Vec<(Key, Vec<u8>)>;
/// A record set to bytes, or removed (`None`).
pub type RecordChange = (Key, Option<Vec<u8>>);

/// Following the store's history: what a reader that never commits (a separate apiserver)
/// needs to keep up with the controller through etcd watches.
impl EtcdStore {
    /// [`Store::load_all`], and the etcd revision it read at: a watch from the next
    /// revision (see [`watch_request`](Self::watch_request)) sees every later commit.
    pub fn load_all_at(&self) -> Result<(Records, i64), StoreError> {
        let mut st = self.state.lock().unwrap();
        let fence = self.fence_key();
        let journal = self.journal_key();
        let end = prefix_end(self.prefix.as_bytes());
        let mut from = self.prefix.as_bytes().to_vec();
        // Every page reads the revision of the first: one consistent snapshot.
        let mut rev = 0i64;
        let mut fence_rev = 0;
        let mut pending = None;
        let mut out = BTreeMap::new();
        loop {
            let req = RangeRequest {
                key: from,
                range_end: end.clone(),
                limit: self.page as i64,
                revision: rev,
                ..Default::default()
            };
            let r = self
                .range(&mut st, &req)
                .map_err(|e| StoreError::Backend(e.message))?;
            if rev == 0 {
                rev = r.revision();
            }
            let more = r.more;
            let Some(last) = r.kvs.last().map(|kv| kv.key.clone()) else {
                if more {
                    return Err(StoreError::Backend(
                        "etcd range said there is more but sent nothing".into(),
                    ));
                }
                break;
            };
            for kv in r.kvs {
                let key = String::from_utf8(kv.key).map_err(|e| {
                    StoreError::Backend(format!(
                        "etcd holds a key that is not text under {:?}: {:?}",
                        self.prefix,
                        String::from_utf8_lossy(e.as_bytes())
                    ))
                })?;
                if key == fence {
                    fence_rev = kv.mod_revision;
                } else if key == journal {
                    pending = Some(parse_journal(&kv.value)?);
                } else if key[self.prefix.len()..].starts_with('.') {
                    // Another control key (the election's `.leader`): not state.
                } else {
                    out.insert(self.decode_key(&key)?, kv.value);
                }
            }
            if !more {
                break;
            }
            from = last;
            from.push(0);
        }
        // A journaled batch is committed: what it says wins over what is written so far.
        // The next commit finishes writing it.
        if let Some(ops) = &pending {
            for (k, v) in ops {
                let k = self.decode_key(k)?;
                match v {
                    Some(v) => out.insert(k, v.clone()),
                    None => out.remove(&k),
                };
            }
        }
        st.fence_rev = Some(fence_rev);
        st.unresolved = None;
        st.pending = pending;
        // A BTreeMap: sorted by (ns, key), which etcd's bytewise order of `ns/key` is not
        // when a namespace is a prefix of another ("a" / "a-b").
        Ok((out.into_iter().collect(), rev))
    }

    /// The watch that follows every key of this store from etcd revision `start` on.
    pub fn watch_create(&self, start: i64) -> pb::WatchCreateRequest {
        // `fragment`: etcd splits an answer bigger than its request limit into several
        // messages. A catch-up answer holds up to 1,000 revisions; whole, one of a
        // follower behind a placement burst was over the largest message the client
        // takes, which it refused and then asked for again, for ever. The follower
        // handles each event on its own, so a split answer reads the same.
        pb::WatchCreateRequest {
            fragment: true,
            ..pb::WatchCreateRequest::new(
                self.prefix.as_bytes(),
                prefix_end(self.prefix.as_bytes()),
                start,
            )
        }
    }

    /// The range (`KV/Range`) that finds the most recently modified key of this store (its
    /// `mod_revision` is the store's newest revision; keys only).
    pub fn newest_request(&self) -> RangeRequest {
        RangeRequest {
            key: self.prefix.as_bytes().to_vec(),
            range_end: prefix_end(self.prefix.as_bytes()),
            limit: 1,
            sort_order: 2,  // descend
            sort_target: 3, // by mod revision
            keys_only: true,
            ..Default::default()
        }
    }

    /// The record changes one event of a watch answer carries: one for a state key, a
    /// whole batch for a journal record (committed from then on: the writes that follow
    /// repeat parts of it), none for the other control keys.
    pub fn records_of(&self, event: &pb::Event) -> Result<Vec<RecordChange>, StoreError> {
        let kv = event
            .kv
            .as_ref()
            .ok_or_else(|| StoreError::Backend("etcd sent a watch event without its key".into()))?;
        let key = std::str::from_utf8(&kv.key)
            .map_err(|_| StoreError::Backend("etcd sent a key that is not text".into()))?;
        let delete = event.r#type == pb::event_type::DELETE;
        if key == self.journal_key() {
            if delete {
                return Ok(Vec::new());
            }
            return parse_journal(&kv.value)?
                .into_iter()
                .map(|(k, v)| Ok((self.decode_key(&k)?, v)))
                .collect();
        }
        if key[self.prefix.len().min(key.len())..].starts_with('.') {
            return Ok(Vec::new());
        }
        let value = (!delete).then(|| kv.value.clone());
        Ok(vec![(self.decode_key(key)?, value)])
    }
}

impl Store for EtcdStore {
    fn load_all(&self) -> Result<Vec<(Key, Vec<u8>)>, StoreError> {
        self.load_all_at().map(|(records, _)| records)
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        // etcd refuses a transaction naming a key twice: the last op on a key wins.
        let mut last: BTreeMap<String, Option<Vec<u8>>> = BTreeMap::new();
        for op in batch.ops {
            match op {
                Op::Put(k, v) => last.insert(self.etcd_key(&k)?, Some(v)),
                Op::Delete(k) => last.insert(self.etcd_key(&k)?, None),
            };
        }
        let ops: Vec<EtcdOp> = last.into_iter().collect();
        let mut st = self.state.lock().unwrap();
        if let Some(lost) = st.unresolved.clone() {
            self.resolve(&mut st, &lost)?;
        }
        if st.fence_rev.is_none() {
            let (rev, _) = self.read_fence(&mut st)?;
            st.fence_rev = Some(rev);
        }
        // An earlier journaled batch comes first: its writes must not land on top of
        // this one's.
        if let Some(pending) = st.pending.take() {
            if let Err(e) = self.apply_journal(&mut st, &pending) {
                st.pending = Some(pending);
                return Err(e);
            }
        }
        if self.fits(&ops) {
            return self.guarded_txn(&mut st, txn_ops(&ops), false);
        }
        // Too big for one transaction: commit it as one journal record, then write it out.
        // The record is one request too: refuse what etcd would refuse, saying why.
        let record = journal_of(&ops);
        if record.len() > CHUNK_BYTES {
            return Err(StoreError::Backend(format!(
                "a batch of {} operations is {} bytes as a journal record, more than one \
                 etcd request holds ({CHUNK_BYTES}); the controller cuts its batches to \
                 the store's batch limit, so this is a bug",
                ops.len(),
                record.len()
            )));
        }
        let journal = RequestOp::put(self.journal_key(), record);
        self.guarded_txn(&mut st, vec![journal], false)?;
        // Committed: `load_all` sees the journal from here on.
        if let Err(e) = self.apply_journal(&mut st, &ops) {
            tracing::warn!(error = %e, "etcd store: a committed batch is not written out yet; the next commit finishes it");
            st.pending = Some(ops);
        }
        Ok(())
    }

    /// One transaction: fewer ops than `--max-txn-ops` with the fence, and key and value
    /// bytes (keys with the prefix) within one request.
    /// Apiservers follow etcd through `meta/events`.
    fn journals_events(&self) -> bool {
        true
    }

    fn batch_limit(&self) -> BatchLimit {
        let ops = self.max_ops - 1;
        BatchLimit {
            ops,
            bytes: CHUNK_BYTES - ops * self.prefix.len(),
        }
    }

    /// One transaction "create the key unless it exists, else read it" (`create_revision
    /// == 0`), without the fence: it changes no record anyone built on. Replay-safe, so a
    /// lost answer is simply asked again (the replay finds the key and reads it).
    fn put_if_absent(&self, key: Key, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        let k = self.etcd_key(&key)?.into_bytes();
        let req = pb::TxnRequest {
            compare: vec![Compare {
                result: compare_result::EQUAL,
                target: compare_target::CREATE,
                key: k.clone(),
                target_union: Some(TargetUnion::CreateRevision(0)),
            }],
            success: vec![RequestOp::put(k.clone(), value.as_slice())],
            failure: vec![RequestOp::get(k)],
        };
        let mut st = self.state.lock().unwrap();
        let mut last = String::new();
        for _ in 0..2 {
            match self.txn(&mut st, &req) {
                Ok(r) if r.succeeded => return Ok(value),
                Ok(r) => {
                    let kv = r.range_kv(0).ok_or_else(|| {
                        StoreError::Backend(format!(
                            "etcd put-if-absent of {key}: the key exists but reads empty"
                        ))
                    })?;
                    return Ok(kv.value.clone());
                }
                Err(e) if e.unknown => last = e.message,
                Err(e) => return Err(StoreError::Backend(e.message)),
            }
        }
        Err(StoreError::Backend(last))
    }
}

/// The smallest key above every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(b) = end.pop() {
        if b < 0xff {
            end.push(b + 1);
            return end;
        }
    }
    // All 0xff (not a prefix this store accepts): "\0" means "to the end" in etcd.
    vec![0]
}

#[cfg(test)]
pub(crate) mod tests;
