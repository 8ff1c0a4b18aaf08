//! The sim host's store: in memory, namespaced keys to bytes, atomic batches, one global
//! revision. Records are the plugin-api types as JSON, so a grant is persisted and read
//! back the way a real store would (a plugin that relied on getting its own Rust value
//! back would fail `restore` here).

use plugin_api::{HostInfo, JobInfo, ServiceInfo};
use std::collections::BTreeMap;

/// One write of a batch.
#[derive(Debug)]
pub(crate) enum Op {
    Put(String, Vec<u8>),
    Delete(String),
}

/// Keys → bytes, and the revision of the last commit.
#[derive(Debug, Default)]
pub(crate) struct Store {
    data: BTreeMap<String, Vec<u8>>,
    rev: u64,
    commits: u64,
}

/// A batch being built: written in one commit, each event given the next revision.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) ops: Vec<Op>,
    /// Time spent encoding the records, counted with the commit.
    pub(crate) encoding: std::time::Duration,
    /// Where job records are encoded before being copied out at their exact size: a job
    /// record (about 200 bytes) written into a fresh `Vec` (128 bytes to start with)
    /// outgrew it, a reallocation and copy for every placed job, and kept the slack.
    scratch: Vec<u8>,
}

impl Batch {
    pub(crate) fn job(&mut self, job: &JobInfo) {
        let at = std::time::Instant::now();
        self.scratch.clear();
        serde_json::to_writer(&mut self.scratch, job).expect("a job always serializes");
        let bytes = self.scratch.as_slice().to_vec();
        self.ops.push(Op::Put(job_key(&job.job), bytes));
        self.encoding += at.elapsed();
    }

    pub(crate) fn job_gone(&mut self, job: &str) {
        self.ops.push(Op::Delete(job_key(job)));
    }

    pub(crate) fn service(&mut self, service: &ServiceInfo) {
        let bytes = serde_json::to_vec(service).expect("a service always serializes");
        self.ops
            .push(Op::Put(service_key(&service.project, &service.name), bytes));
    }

    pub(crate) fn service_gone(&mut self, project: &str, name: &str) {
        self.ops.push(Op::Delete(service_key(project, name)));
    }

    pub(crate) fn host(&mut self, host: &HostInfo) {
        let bytes = serde_json::to_vec(host).expect("a host always serializes");
        self.ops.push(Op::Put(format!("host/{}", host.id), bytes));
    }
}

fn job_key(job: &str) -> String {
    // Not `format!`: its machinery was most of building a key, once per placed job.
    let mut key = String::with_capacity("job/".len() + job.len());
    key.push_str("job/");
    key.push_str(job);
    key
}

fn service_key(project: &str, name: &str) -> String {
    format!("service/{project}/{name}")
}

// === impl Store ===

impl Store {
    /// The revision the next event gets.
    pub(crate) fn next_rev(&mut self) -> u64 {
        self.rev += 1;
        self.rev
    }

    pub(crate) fn rev(&self) -> u64 {
        self.rev
    }

    /// Applies `batch` whole.
    pub(crate) fn commit(&mut self, batch: Batch) {
        self.commits += 1;
        for op in batch.ops {
            match op {
                Op::Put(k, v) => {
                    self.data.insert(k, v);
                }
                Op::Delete(k) => {
                    self.data.remove(&k);
                }
            }
        }
    }

    pub(crate) fn commits(&self) -> u64 {
        self.commits
    }

    /// Every live job as stored (for a restart: the grants come back from bytes).
    pub(crate) fn jobs(&self) -> Vec<JobInfo> {
        self.range("job/")
    }

    pub(crate) fn services(&self) -> Vec<ServiceInfo> {
        self.range("service/")
    }

    pub(crate) fn hosts(&self) -> Vec<HostInfo> {
        self.range("host/")
    }

    fn range<T: serde::de::DeserializeOwned>(&self, prefix: &str) -> Vec<T> {
        self.data
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| {
                serde_json::from_slice(v).unwrap_or_else(|e| panic!("store record {k}: {e}"))
            })
            .collect()
    }
}
