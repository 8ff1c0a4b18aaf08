//! The controller's persistent store.
//!
//! A deliberately small interface — namespaced keys to opaque bytes, loaded whole at
//! start and changed only by atomic batches — so that a distributed store (etcd) can
//! replace the embedded one without touching the controller. The controller persists
//! every mutation as one [`Batch`] *before* it applies the mutation in memory, announces it
//! or answers the request that caused it.
//!
//! Three implementations: [`RedbStore`] (an embedded redb file, the default),
//! [`EtcdStore`] (etcd v3, for controllers that keep their state off the machine) and
//! `MemStore` (in memory, for tests: the `test-util` feature). One test suite
//! (`tests::suite`) checks all three against the same contract.
#![warn(missing_docs)]

pub mod backup;
mod contract;
mod election;
pub mod etcd;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;

pub use contract::{Batch, BatchLimit, Key, Op, Store, StoreError};

pub use election::{
    Election, ElectionError, Leadership, LeaseClock, LeaseTimings, Maintained, DEFAULT_LEADER_TTL,
};
pub use etcd::{
    parse_url as parse_etcd_url, EtcdStore, RecordChange, Records, DEFAULT_MAX_TXN_OPS,
    DEFAULT_PREFIX, DEFAULT_TIMEOUT,
};

// `MemStore`'s only.
#[cfg(any(test, feature = "test-util"))]
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
#[cfg(any(test, feature = "test-util"))]
use std::sync::Mutex;

/// Which store the controller uses: `redb` (the embedded file, the default) or
/// `etcd://HOST:PORT[,HOST:PORT…]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// The embedded redb file in the controller's data dir.
    Redb,
    /// etcd at these endpoints (`HOST:PORT` each).
    Etcd(Vec<String>),
}

impl FromStr for StoreSpec {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, StoreError> {
        if s == "redb" {
            Ok(Self::Redb)
        } else if s.starts_with("etcd://") {
            Ok(Self::Etcd(etcd::parse_url(s)?))
        } else {
            Err(StoreError::InvalidConfig(format!(
                "store {s:?} is neither `redb` nor etcd://HOST:PORT[,HOST:PORT...]"
            )))
        }
    }
}

// === impl MemStore ===

/// An in-memory store for tests. Can be told to fail the next commit.
#[derive(Debug, Default)]
#[cfg(any(test, feature = "test-util"))]
pub struct MemStore {
    inner: Mutex<MemInner>,
}

#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Default)]
struct MemInner {
    data: BTreeMap<Key, Vec<u8>>,
    /// Commits to let through before one fails.
    fail_after: Option<usize>,
    /// Every commit fails with this.
    fail_with: Option<StoreError>,
    /// The batch limit it claims (the embedded stores' when none).
    limit: Option<BatchLimit>,
}

#[cfg(any(test, feature = "test-util"))]
impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store that claims `limit` as its batch limit (tests that cut changes into
    /// many small batches; the store itself commits any batch).
    pub fn with_limit(limit: BatchLimit) -> Self {
        let store = Self::default();
        store.inner.lock().unwrap().limit = Some(limit);
        store
    }

    /// Makes the next [`Store::commit`] fail with [`StoreError::Injected`] (changing
    /// nothing).
    pub fn fail_next_commit(&self) {
        self.fail_commit_after(0);
    }

    /// Lets `n` commits through, then fails one.
    pub fn fail_commit_after(&self, n: usize) {
        self.inner.lock().unwrap().fail_after = Some(n);
    }

    /// Makes every later commit fail with `e` (a full disk, a failed device).
    pub fn fail_every_commit_with(&self, e: StoreError) {
        self.inner.lock().unwrap().fail_with = Some(e);
    }
}

#[cfg(any(test, feature = "test-util"))]
impl Store for MemStore {
    fn load_all(&self) -> Result<Vec<(Key, Vec<u8>)>, StoreError> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .data
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        let mut inner = self.inner.lock().unwrap();
        if let Some(e) = &inner.fail_with {
            return Err(e.clone());
        }
        match inner.fail_after {
            Some(0) => {
                inner.fail_after = None;
                return Err(StoreError::Injected);
            }
            Some(n) => inner.fail_after = Some(n - 1),
            None => {}
        }
        for op in batch.ops {
            match op {
                Op::Put(k, v) => {
                    inner.data.insert(k, v);
                }
                Op::Delete(k) => {
                    inner.data.remove(&k);
                }
            }
        }
        Ok(())
    }

    fn put_if_absent(&self, key: Key, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        let mut inner = self.inner.lock().unwrap();
        if let Some(e) = &inner.fail_with {
            return Err(e.clone());
        }
        Ok(inner.data.entry(key).or_insert(value).clone())
    }

    fn batch_limit(&self) -> BatchLimit {
        self.inner
            .lock()
            .unwrap()
            .limit
            .unwrap_or(BatchLimit::EMBEDDED)
    }
}

// === impl RedbStore ===

/// All keys live in one table keyed by `(namespace, key)`.
const TABLE: redb::TableDefinition<'static, (&str, &str), &[u8]> =
    redb::TableDefinition::new("xce");

/// redb's page cache. redb's default (1 GiB) keeps every page a commit wrote, so the
/// cache grew with the store: 23 MB at 50,000 jobs, about a quarter of the controller's
/// memory per replica (a heap profile, `integration-tests/README.md`). Nothing needs those
/// pages: the controller reads the store once, at start, and keeps its state in its own
/// model; a commit only walks the B-tree from the root to the leaves it changes. 4 MiB
/// (redb gives a tenth of it to the write buffer) holds the branch pages and the hot
/// leaves, and the scale bench placed as fast with it.
const CACHE_BYTES: usize = 4 << 20;

/// The embedded store: one redb file.
pub struct RedbStore {
    db: redb::Database,
}

impl fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbStore").finish_non_exhaustive()
    }
}

fn backend(e: impl fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// A redb error: I/O ones (and redb's "a previous I/O error occurred") are
/// [`StoreError::Io`], the rest [`StoreError::Backend`].
fn redb_err(e: impl Into<redb::Error>) -> StoreError {
    match e.into() {
        redb::Error::Io(io) => StoreError::Io {
            no_space: io.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
                || io.kind() == std::io::ErrorKind::StorageFull,
            message: io.to_string(),
        },
        e @ redb::Error::PreviousIo => StoreError::Io {
            no_space: false,
            message: e.to_string(),
        },
        e => StoreError::Backend(e.to_string()),
    }
}

impl RedbStore {
    /// Opens (or creates) the store file at `path`. Fails when another process has it
    /// open.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let db = redb::Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(path.as_ref())
            .map_err(|e| StoreError::Backend(format!("open {}: {e}", path.as_ref().display())))?;
        // Create the table up front so `load_all` on a fresh file finds it.
        let tx = db.begin_write().map_err(backend)?;
        tx.open_table(TABLE).map_err(backend)?;
        tx.commit().map_err(backend)?;
        Ok(Self { db })
    }
}

impl Store for RedbStore {
    fn load_all(&self) -> Result<Vec<(Key, Vec<u8>)>, StoreError> {
        use redb::ReadableTable;
        let tx = self.db.begin_read().map_err(backend)?;
        let table = tx.open_table(TABLE).map_err(backend)?;
        let mut out = Vec::new();
        for row in table.iter().map_err(backend)? {
            let (k, v) = row.map_err(backend)?;
            let (ns, key) = k.value();
            out.push((Key::new(ns, key), v.value().to_vec()));
        }
        Ok(out)
    }

    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(redb_err)?;
        {
            let mut table = tx.open_table(TABLE).map_err(redb_err)?;
            for op in &batch.ops {
                match op {
                    Op::Put(k, v) => {
                        table
                            .insert((k.ns.as_str(), k.key.as_str()), v.as_slice())
                            .map_err(redb_err)?;
                    }
                    Op::Delete(k) => {
                        table
                            .remove((k.ns.as_str(), k.key.as_str()))
                            .map_err(redb_err)?;
                    }
                }
            }
        }
        // Dropping an uncommitted write transaction aborts it: all or nothing.
        tx.commit().map_err(redb_err)
    }

    fn put_if_absent(&self, key: Key, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        use redb::ReadableTable;
        // One write transaction at a time (redb serializes them, and the file is locked
        // to one process): read and write cannot interleave with another's.
        let tx = self.db.begin_write().map_err(redb_err)?;
        let stored = {
            let mut table = tx.open_table(TABLE).map_err(redb_err)?;
            let k = (key.ns.as_str(), key.key.as_str());
            let existing = table.get(k).map_err(redb_err)?.map(|v| v.value().to_vec());
            match existing {
                Some(v) => v,
                None => {
                    table.insert(k, value.as_slice()).map_err(redb_err)?;
                    value
                }
            }
        };
        tx.commit().map_err(redb_err)?;
        Ok(stored)
    }
}

/// The shared contract suite every [`Store`] must pass.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use expect_test::expect;

    pub(crate) use crate::testing::dump;

    pub(crate) fn batch(ops: &[(&str, &str, Option<&str>)]) -> Batch {
        let mut b = Batch::default();
        for (ns, k, v) in ops {
            match v {
                Some(v) => b.put(Key::new(*ns, *k), v.as_bytes().to_vec()),
                None => b.delete(Key::new(*ns, *k)),
            }
        }
        b
    }

    /// Runs the contract against a fresh, empty store; `reopen` gives the store again as
    /// a restarted process would see it.
    pub(crate) fn suite(
        store: Box<dyn Store>,
        reopen: impl FnOnce(Box<dyn Store>) -> Box<dyn Store>,
    ) {
        assert_eq!(dump(&*store), "");
        store
            .commit(batch(&[
                ("job", "j-2", Some("b")),
                ("job", "j-1", Some("a")),
                ("meta", "rev", Some("7")),
                ("host", "exec-01", Some("h")),
            ]))
            .unwrap();
        expect!["host/exec-01=h job/j-1=a job/j-2=b meta/rev=7"].assert_eq(&dump(&*store));

        // Later ops of one batch win; deleting an absent key is a no-op.
        store
            .commit(batch(&[
                ("job", "j-1", None),
                ("job", "j-3", Some("c")),
                ("job", "j-3", Some("c2")),
                ("job", "nope", None),
                ("meta", "rev", Some("8")),
            ]))
            .unwrap();
        expect!["host/exec-01=h job/j-2=b job/j-3=c2 meta/rev=8"].assert_eq(&dump(&*store));

        // Namespaces do not collide.
        store.commit(batch(&[("jo", "bj-2", Some("x"))])).unwrap();
        expect!["host/exec-01=h jo/bj-2=x job/j-2=b job/j-3=c2 meta/rev=8"]
            .assert_eq(&dump(&*store));

        // Written once: the first value stays, and every caller learns it.
        let first = store
            .put_if_absent(Key::new("meta", "id"), b"one".to_vec())
            .unwrap();
        let second = store
            .put_if_absent(Key::new("meta", "id"), b"two".to_vec())
            .unwrap();
        assert_eq!(
            (first.as_slice(), second.as_slice()),
            (&b"one"[..], &b"one"[..])
        );
        // It does not stand in the way of later commits.
        store.commit(batch(&[("meta", "rev", Some("8"))])).unwrap();

        let store = reopen(store);
        expect!["host/exec-01=h jo/bj-2=x job/j-2=b job/j-3=c2 meta/id=one meta/rev=8"]
            .assert_eq(&dump(&*store));
        store.commit(Batch::default()).unwrap();
        expect!["host/exec-01=h jo/bj-2=x job/j-2=b job/j-3=c2 meta/id=one meta/rev=8"]
            .assert_eq(&dump(&*store));
        assert_eq!(
            store
                .put_if_absent(Key::new("meta", "id"), b"three".to_vec())
                .unwrap(),
            b"one"
        );
    }

    #[test]
    fn mem_store_passes_the_suite() {
        // A process restart loses a MemStore; "reopening" it keeps the same instance.
        suite(Box::new(MemStore::new()), |s| s);
    }

    #[test]
    fn redb_store_passes_the_suite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let p2 = path.clone();
        suite(Box::new(RedbStore::open(&path).unwrap()), move |s| {
            drop(s);
            Box::new(RedbStore::open(&p2).unwrap())
        });
    }

    /// The page cache is small (`CACHE_BYTES`); batches and a store many times its size
    /// still commit whole and read back whole, in this process and after a reopen, and
    /// a rewrite of every key replaces every value.
    #[test]
    fn redb_store_beyond_its_cache_keeps_every_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.redb");
        let store = RedbStore::open(&path).unwrap();
        let value = |round: u8, i: usize| format!("{round}:{i:05}:{}", "v".repeat(1100));
        // 4 batches of 4,096 records of ~1.1 KiB: each batch ten times the write buffer,
        // and bigger than the whole cache.
        let (batches, per) = (4, 4096);
        for round in [1u8, 2] {
            for b in 0..batches {
                let mut batch = Batch::default();
                for i in b * per..(b + 1) * per {
                    batch.put(
                        Key::new("job", format!("j{i:05}")),
                        value(round, i).into_bytes(),
                    );
                }
                assert!(batch.bytes() > CACHE_BYTES, "{} bytes", batch.bytes());
                store.commit(batch).unwrap();
            }
            let all = store.load_all().unwrap();
            assert_eq!(all.len(), batches * per);
            for (i, (k, v)) in all.iter().enumerate() {
                assert_eq!(k.key, format!("j{i:05}"));
                assert_eq!(String::from_utf8_lossy(v), value(round, i), "{k}");
            }
        }
        drop(store);
        let reopened = RedbStore::open(&path).unwrap();
        let all = reopened.load_all().unwrap();
        assert_eq!(all.len(), batches * per);
        assert!(all
            .iter()
            .enumerate()
            .all(|(i, (_, v))| v.as_slice() == value(2, i).as_bytes()));
    }

    #[test]
    fn failed_commit_changes_nothing() {
        let s = MemStore::new();
        s.commit(batch(&[("a", "1", Some("x"))])).unwrap();
        s.fail_next_commit();
        assert!(s
            .commit(batch(&[("a", "1", None), ("a", "2", Some("y"))]))
            .is_err());
        expect!["a/1=x"].assert_eq(&dump(&s));
        s.commit(batch(&[("a", "2", Some("y"))])).unwrap();
        expect!["a/1=x a/2=y"].assert_eq(&dump(&s));
    }

    use testkit::small_fs::SmallFs;

    /// redb on a full disk: the write that finds no space is an `Io { no_space }` error
    /// (507 upstream; the controller stops), later writes fail as I/O errors too (redb
    /// refuses every write until reopened), every acknowledged commit survives (the refused
    /// one may or may not have landed), and once space returns a reopened store writes
    /// again.
    #[test]
    fn a_full_disk_is_an_io_error_and_nothing_acknowledged_is_lost() {
        let Some(fs) = SmallFs::mount("2m") else {
            eprintln!("SKIPPED: cannot mount a tmpfs here (needs root); the full-disk path is not checked");
            return;
        };
        let path = fs.path().join("controller.redb");
        let store = RedbStore::open(&path).unwrap();
        let blob = "x".repeat(64 * 1024);
        let mut acknowledged = 0;
        let err = loop {
            let key = format!("k{acknowledged:04}");
            match store.commit(batch(&[("a", &key, Some(&blob))])) {
                Ok(()) => acknowledged += 1,
                Err(e) => break e,
            }
            assert!(acknowledged < 1000, "a 2 MiB filesystem never filled");
        };
        assert!(
            matches!(err, StoreError::Io { no_space: true, .. }),
            "the first refused write: {err}"
        );
        let again = store
            .commit(batch(&[("a", "small", Some("y"))]))
            .unwrap_err();
        assert!(matches!(again, StoreError::Io { .. }), "then: {again}");
        drop(store);
        fs.grow("64m");
        let store = RedbStore::open(&path).unwrap();
        // Every acknowledged commit survives; the refused one may have landed too (an I/O
        // error in a commit leaves its outcome unknown), never anything after it.
        let kept = store.load_all().unwrap().len();
        assert!(
            kept == acknowledged || kept == acknowledged + 1,
            "acknowledged {acknowledged}, found {kept}"
        );
        store.commit(batch(&[("a", "after", Some("z"))])).unwrap();
    }
}
