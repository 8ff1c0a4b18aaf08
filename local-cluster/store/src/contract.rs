//! The store's contract: the types every store speaks ([`Key`], [`Op`], [`Batch`],
//! [`StoreError`]) and the [`Store`] trait. A module of its own so that the stores
//! (`etcd`, the embedded ones in `store.rs`) import it from here and `store.rs` only
//! re-exports: no file names a file that names it back.

use std::fmt;

/// A key: a namespace (e.g. `job`) and a key within it (e.g. `j-17`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// The namespace.
    pub ns: String,
    /// The key within the namespace.
    pub key: String,
}

impl Key {
    /// Builds a key.
    pub fn new(ns: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            ns: ns.into(),
            key: key.into(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.ns, self.key)
    }
}

/// One change of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Sets the key to the bytes.
    Put(Key, Vec<u8>),
    /// Removes the key (no-op when absent).
    Delete(Key),
}

/// Changes applied all together or not at all, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// The changes.
    pub ops: Vec<Op>,
}

impl Batch {
    /// Adds a put.
    pub fn put(&mut self, key: Key, value: Vec<u8>) {
        self.ops.push(Op::Put(key, value));
    }
    /// Adds a delete.
    pub fn delete(&mut self, key: Key) {
        self.ops.push(Op::Delete(key));
    }
    /// Whether the batch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    /// Key and value bytes of the batch (what bounds the size of its request).
    pub fn bytes(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match op {
                Op::Put(k, v) => k.ns.len() + 1 + k.key.len() + v.len(),
                Op::Delete(k) => k.ns.len() + 1 + k.key.len(),
            })
            .sum()
    }
}

/// The most one [`Batch`] should hold for the store to commit it in one step (for etcd:
/// one transaction, without the journal). The controller cuts big changes (placing,
/// draining or stopping thousands of replicas) into batches within it, each one atomic;
/// a bigger batch still commits (see [`Store::commit`]), just less cheaply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimit {
    /// Operations (distinct keys) per batch.
    pub ops: usize,
    /// Key and value bytes per batch.
    pub bytes: usize,
}

impl BatchLimit {
    /// The embedded stores' limit: big enough that a pass is few disk syncs (a redb
    /// commit is one), small enough that one pass keeps the state task busy for
    /// milliseconds, not seconds.
    pub const EMBEDDED: BatchLimit = BatchLimit {
        ops: 4096,
        bytes: 4 << 20,
    };

    /// Whether `batch` is within the limit.
    pub fn admits(&self, batch: &Batch) -> bool {
        batch.ops.len() <= self.ops && batch.bytes() <= self.bytes
    }
}

/// Why the store failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend failed (I/O, corruption, a lock held by another process).
    #[error("store backend: {0}")]
    Backend(String),
    /// A test store told to fail.
    #[error("store failure injected for a test")]
    Injected,
    /// The store holds something this instance did not write or cannot account for
    /// (another writer, a lost leadership, a commit reported failed that landed after
    /// all): its caller's view is stale, and no commit will go through until it reloads.
    #[error("the store changed under this controller: {0}")]
    Stale(String),
    /// The store's configuration is wrong (a bad url, prefix or endpoint).
    #[error("invalid store configuration: {0}")]
    InvalidConfig(String),
    /// Writing failed with an I/O error (a full disk, a failing device). The embedded
    /// store refuses every later write until it is reopened, so its controller must stop
    /// (a supervisor or a standby takes over) rather than run on wedged.
    #[error("store I/O error{}: {message}", if *no_space { " (no space left on device)" } else { "" })]
    Io {
        /// The device is full (`ENOSPC`): the refused write answers 507.
        no_space: bool,
        /// The error as the backend said it.
        message: String,
    },
}

/// The controller's storage.
///
/// **Who calls it**: the controller's single state task (so calls never overlap), at
/// start ([`load_all`](Self::load_all)) and for every mutation ([`commit`](Self::commit)).
/// Calls are synchronous and may block briefly on disk (or, for [`EtcdStore`](super::EtcdStore), on the
/// network, up to its timeout per endpoint).
pub trait Store: Send + Sync + 'static {
    /// Everything stored, sorted by key.
    fn load_all(&self) -> Result<Vec<(Key, Vec<u8>)>, StoreError>;
    /// Applies the batch atomically and durably: after `Ok`, a later `load_all` (also
    /// after a process restart, for durable stores) sees all of it; after `Err`, none.
    ///
    /// A remote store can lose the answer to a commit it sent: it then returns `Err` and
    /// fails every later commit until it knows the batch was not applied (or until a
    /// `load_all` reloads the truth), so the caller never builds on a batch it believes
    /// failed.
    fn commit(&self, batch: Batch) -> Result<(), StoreError>;
    /// Sets `key` to `value` unless it exists, atomically (two controllers racing on one
    /// store agree on the winner), and returns what the key holds afterwards: `value`, or
    /// the value it already had. Durable like [`commit`](Self::commit); outside the commit
    /// sequence (it never makes a caller's view stale). For values written once and never
    /// changed, such as the cluster id.
    fn put_if_absent(&self, key: Key, value: Vec<u8>) -> Result<Vec<u8>, StoreError>;
    /// How big a batch the store commits in one step (see [`BatchLimit`]).
    fn batch_limit(&self) -> BatchLimit {
        BatchLimit::EMBEDDED
    }
    /// Whether each batch must also carry its events (the controller's `meta/events`):
    /// true for a store that others follow by watching it (etcd: `xced apiserver`). An
    /// embedded store has no followers, and writing the events there doubled every
    /// batch's encoding for nobody.
    fn journals_events(&self) -> bool {
        false
    }
}
