//! The `rev` a job's stored record carries: the global revision of its last event. A job
//! write moves its service's `rev` without rewriting the service's record (those rewrites
//! were most of a worker report's bytes); a loaded service's `rev` is the greatest of its
//! record's and its live jobs' (`model::Cluster::from_records`).

use serde::{Deserialize, Serialize};

/// A job's record as stored: the record's own fields, then `rev` (absent when 0: a quiet
/// write, whose service's record keeps the `rev`).
#[derive(Debug, Serialize)]
pub struct StoredJob<'a, T> {
    #[serde(flatten)]
    pub rec: &'a T,
    #[serde(skip_serializing_if = "is_zero")]
    pub rev: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The `rev` of a stored job record, read apart from the record (which ignores it); 0
/// in records written before it, whose service's record holds the exact `rev`.
#[derive(Debug, Deserialize)]
pub struct StoredRev {
    #[serde(default)]
    pub rev: u64,
}
