//! [`JobKey`]: a live job's id shared by every map of the controller that is keyed by it.

use std::collections::HashMap;
use std::sync::Arc;

/// A live job's id as the model keys it: one allocation shared by the job map's key, the
/// host and service indexes (`model.rs`) and the core's per-job instants (`ready_since`,
/// `running_since`, a [`JobMap`] each), where each used to hold its own `String` (a heap
/// profile counted five copies of every id: an `Arc` is 16 bytes in place and no
/// allocation per copy, a `String` 24 bytes and a 32-byte allocation).
pub type JobKey = Arc<str>;

/// A value per live job, keyed by the model's shared [`JobKey`] (see
/// `Cluster::job_key`); looked up by any `&str` id.
#[derive(Debug)]
pub struct JobMap<V>(HashMap<JobKey, V>);

impl<V> Default for JobMap<V> {
    fn default() -> Self {
        Self(HashMap::new())
    }
}

impl<V> JobMap<V> {
    pub fn get(&self, id: &str) -> Option<&V> {
        self.0.get(id)
    }

    pub fn remove(&mut self, id: &str) -> Option<V> {
        self.0.remove(id)
    }

    pub fn insert(&mut self, id: JobKey, v: V) {
        self.0.insert(id, v);
    }

    /// Sets the value of `id` unless it has one (the first instant is kept).
    pub fn keep_first(&mut self, id: &JobKey, v: V) {
        if !self.0.contains_key(&**id) {
            self.0.insert(id.clone(), v);
        }
    }
}
