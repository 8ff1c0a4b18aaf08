//! A service's jobs as readers see them ([`JobView`]), in [`order`], kept in shared
//! chunks ([`Jobs`]) so that a publish patches the chunks a change falls into and shares
//! the others with the previous view. One flat `Vec` per service cost a publish O(jobs of
//! every touched service): at 1,000 hosts, one readiness event of a 5,000-job service
//! rebuilt (and then dropped) 5,000 job views, half the controller's CPU at scale.
//!
//! Names nothing of the core (the core re-exports it), so no import circle.

use plugin_api::JobInfo;
use std::sync::Arc;
use xce_model::JobRec;

/// One job as readers see it: the model's own record (shared, not copied) and its
/// plugins' grant summaries.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JobView {
    /// The job's record, the same `Arc` as the model's (`JobRec::log`: its log file on
    /// its host, once the worker reported the start).
    pub(crate) rec: Arc<JobRec>,
    /// Plugin grant summaries by plugin name, as one JSON object's text (`None`: no
    /// plugin has one). Text, not a `serde_json::Value` map: the maps cost 1.3 KB a job
    /// in B-tree nodes (a heap profile), the text a few dozen bytes; an answer parses it
    /// back. An `Arc`: a rebuilt part reuses the last one's text for a job whose grants
    /// did not change, without copying it.
    pub(crate) summaries: Option<Arc<str>>,
}

impl JobView {
    pub(crate) fn info(&self) -> &JobInfo {
        &self.rec.info
    }

    fn key(&self) -> Key<'_> {
        order(&self.rec.info)
    }
}

/// A job's view reads as its record (`view.info`, `view.log`).
impl std::ops::Deref for JobView {
    type Target = JobRec;
    fn deref(&self) -> &JobRec {
        &self.rec
    }
}

/// Where a job sorts in its service's view: by replica, then by job number (then by id,
/// for ids that are not `j-<n>[-<tag>]`: the order a stable sort of the model's id-ordered jobs
/// gave).
pub(crate) type Key<'a> = (u32, u64, &'a str);

pub(crate) fn order(j: &JobInfo) -> Key<'_> {
    key_of(j.replica, &j.job)
}

pub(crate) fn key_of(replica: u32, job: &str) -> Key<'_> {
    (replica, job_num(job), job)
}

/// Job ids are `j-<n>` or `j-<n>-<tag>` ([`xce_model::job_id`]): sort numerically.
fn job_num(id: &str) -> u64 {
    xce_model::job_number(id).unwrap_or(u64::MAX)
}

/// The chunk size a full build aims at; a patched chunk is split above [`MAX`] and joined
/// to a neighbour below [`MIN`], so a patch copies at most `MAX` job views and
/// `len / MIN` chunk pointers.
const TARGET: usize = 128;
const MAX: usize = 2 * TARGET;
const MIN: usize = TARGET / 2;

/// A service's jobs in [`order`]: what `Vec<JobView>` was, in chunks shared between
/// views. Equal when the jobs are, however they are chunked.
#[derive(Debug, Clone, Default)]
pub(crate) struct Jobs {
    chunks: Vec<Arc<[JobView]>>,
    len: usize,
}

/// The jobs of a [`Jobs`] in order.
pub(crate) type Iter<'a> = std::iter::FlatMap<
    std::slice::Iter<'a, Arc<[JobView]>>,
    &'a [JobView],
    fn(&'a Arc<[JobView]>) -> &'a [JobView],
>;

fn as_slice(c: &Arc<[JobView]>) -> &[JobView] {
    c
}

impl<'a> IntoIterator for &'a Jobs {
    type Item = &'a JobView;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl PartialEq for Jobs {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

/// The `i`th job in order (a walk over the chunk lengths: O(chunks), for answers that
/// write a service's jobs by position).
impl std::ops::Index<usize> for Jobs {
    type Output = JobView;
    fn index(&self, mut i: usize) -> &JobView {
        for c in &self.chunks {
            if i < c.len() {
                return &c[i];
            }
            i -= c.len();
        }
        panic!("job index out of range: {} jobs", self.len)
    }
}

impl Jobs {
    /// From job views already in [`order`].
    pub(crate) fn from_sorted(jobs: Vec<JobView>) -> Self {
        let len = jobs.len();
        let mut chunks = Vec::new();
        split_into(&mut chunks, jobs);
        Jobs { chunks, len }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The jobs in order.
    pub(crate) fn iter(&self) -> Iter<'_> {
        self.chunks
            .iter()
            .flat_map(as_slice as fn(&Arc<[JobView]>) -> &[JobView])
    }

    /// The jobs of one replica slot, in order (a binary search, not a scan: an answer
    /// lists every slot of a service).
    pub(crate) fn of_replica(
        &self,
        replica: u32,
    ) -> impl DoubleEndedIterator<Item = &JobView> + '_ {
        let from = self.chunk_of((replica, 0, ""));
        let to = self.chunk_of((replica, u64::MAX, "\u{10ffff}"));
        let chunks = self.chunks.get(from..=to).unwrap_or_default();
        chunks
            .iter()
            .flat_map(|c| c.iter())
            .filter(move |j| j.info().replica == replica)
    }

    /// The view of the job at `key`, if there is one.
    pub(crate) fn get(&self, key: Key<'_>) -> Option<&JobView> {
        let chunk = self.chunks.get(self.chunk_of(key))?;
        let at = chunk.binary_search_by(|j| j.key().cmp(&key)).ok()?;
        Some(&chunk[at])
    }

    /// The chunk `key` falls into: the last whose first job is not after it (the first
    /// chunk for a key before every job).
    fn chunk_of(&self, key: Key<'_>) -> usize {
        self.chunks
            .partition_point(|c| c[0].key() <= key)
            .saturating_sub(1)
    }

    /// These jobs with `changes` made: each a job's key and its new view, `None` when it
    /// is gone. `changes` are in [`order`], one per key. Only the chunks a change falls
    /// into are copied; the others are shared.
    pub(crate) fn patch<K: AsRef<str>>(&self, changes: &[((u32, K), Option<JobView>)]) -> Self {
        let key = |i: usize| key_of(changes[i].0 .0, changes[i].0 .1.as_ref());
        let mut out: Vec<Arc<[JobView]>> = Vec::with_capacity(self.chunks.len() + 2);
        let mut next_chunk = 0;
        let mut k = 0;
        while k < changes.len() {
            let target = self.chunk_of(key(k));
            out.extend(self.chunks[next_chunk.min(target)..target].iter().cloned());
            // The changes before the next chunk's first job fall into this one.
            let end = match self.chunks.get(target + 1) {
                Some(next) => {
                    let first = next[0].key();
                    k + (k..changes.len()).take_while(|i| key(*i) < first).count()
                }
                None => changes.len(),
            };
            let old: &[JobView] = self.chunks.get(target).map_or(&[], |c| c);
            split_into(&mut out, merge(old, &changes[k..end]));
            next_chunk = target + 1;
            k = end;
        }
        out.extend(
            self.chunks
                .get(next_chunk..)
                .unwrap_or_default()
                .iter()
                .cloned(),
        );
        join_small(&mut out);
        let len = out.iter().map(|c| c.len()).sum();
        Jobs { chunks: out, len }
    }

    /// The safety net (tests only): the jobs in strict [`order`], chunks neither empty nor
    /// above [`MAX`], and none below [`MIN`] unless it is the only one.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        assert_eq!(
            self.len,
            self.chunks.iter().map(|c| c.len()).sum::<usize>(),
            "the jobs' count"
        );
        for c in &self.chunks {
            assert!(!c.is_empty() && c.len() <= MAX, "a chunk of {}", c.len());
            assert!(
                self.chunks.len() == 1 || c.len() >= MIN,
                "a chunk of {} among {}",
                c.len(),
                self.chunks.len()
            );
        }
        let keys: Vec<Key<'_>> = self.iter().map(JobView::key).collect();
        assert!(
            keys.windows(2).all(|w| w[0] < w[1]),
            "the jobs are not in order"
        );
    }
}

/// `old` (in order) with `changes` (in order, one per key) made.
fn merge<K: AsRef<str>>(old: &[JobView], changes: &[((u32, K), Option<JobView>)]) -> Vec<JobView> {
    let mut out = Vec::with_capacity(old.len() + changes.len());
    let mut old = old.iter().peekable();
    for ((replica, id), new) in changes {
        let key = key_of(*replica, id.as_ref());
        while let Some(j) = old.next_if(|j| j.key() < key) {
            out.push(j.clone());
        }
        // The job's previous view, replaced or removed.
        old.next_if(|j| j.key() == key);
        out.extend(new.iter().cloned());
    }
    out.extend(old.cloned());
    out
}

/// Appends `jobs` as chunks: one if it fits in [`MAX`], else balanced ones near
/// [`TARGET`] (each at least `MAX / 3`, above [`MIN`]); none when empty.
fn split_into(out: &mut Vec<Arc<[JobView]>>, jobs: Vec<JobView>) {
    let n = jobs.len();
    if n == 0 {
        return;
    }
    if n <= MAX {
        out.push(jobs.into());
        return;
    }
    let pieces = n.div_ceil(TARGET);
    let mut rest = jobs.into_iter();
    for p in 0..pieces {
        let size = n / pieces + usize::from(p < n % pieces);
        out.push(rest.by_ref().take(size).collect());
    }
}

/// Joins every chunk below [`MIN`] to a neighbour (splitting the pair again if it is
/// above [`MAX`]), unless it is the only chunk. Only patched chunks can be that small.
fn join_small(chunks: &mut Vec<Arc<[JobView]>>) {
    let mut i = 0;
    while i < chunks.len() {
        if chunks.len() == 1 || chunks[i].len() >= MIN {
            i += 1;
            continue;
        }
        let j = if i + 1 < chunks.len() { i } else { i - 1 };
        let pair: Vec<JobView> = chunks[j]
            .iter()
            .chain(chunks[j + 1].iter())
            .cloned()
            .collect();
        let mut pieces = Vec::new();
        split_into(&mut pieces, pair);
        chunks.splice(j..j + 2, pieces);
        i = j;
    }
}

#[cfg(test)]
mod tests;
