//! Test doubles for the tests of this crate and of the crates above it (`test-util`
//! feature, turned on by their dev-dependencies): never part of a release binary.

use crate::{EtcdStore, Store};

/// A single-member etcd on loopback (the test kit's), killed when dropped.
#[derive(Debug)]
pub struct TestEtcd {
    etcd: testkit::etcd::Etcd,
    /// `127.0.0.1:PORT` of its client URL.
    pub endpoint: String,
}

impl TestEtcd {
    /// Starts one, with etcd's defaults.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts one with `extra` command-line flags.
    pub fn start_with(extra: &[&str]) -> Self {
        let etcd = testkit::etcd::Etcd::start_with(1, extra).unwrap_or_else(|e| panic!("{e:#}"));
        let endpoint = etcd.endpoint().to_owned();
        TestEtcd { etcd, endpoint }
    }

    /// The etcd process's id (to freeze it with SIGSTOP).
    pub fn pid(&self) -> u32 {
        self.etcd.pid(0).expect("etcd runs")
    }

    /// A fresh store instance (as a new controller process would open) under `prefix`.
    pub fn store(&self, prefix: &str) -> EtcdStore {
        EtcdStore::new(vec![self.endpoint.clone()])
            .unwrap()
            .with_prefix(prefix)
            .unwrap()
    }
}

/// Every record of `store`, one `key=value` line each, in key order.
pub fn dump(store: &dyn Store) -> String {
    store
        .load_all()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{k}={}", String::from_utf8_lossy(v)))
        .collect::<Vec<_>>()
        .join(" ")
}
