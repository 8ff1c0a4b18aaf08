//! A service's job facts kept across scheduling passes. A visit needs the facts of every
//! job of the service, and a service whose replicas report started and ready is visited
//! at every settle while they do (with `min_ready`, readiness moves its rollout on): built
//! from every job at each visit, the facts of the 10,000-replica service were 12 % of the
//! controller's CPU placing 50,000 replicas on etcd (~70 settles, each visiting it again).
//! Kept, a visit costs what the commits since wrote: each commit notes the jobs it wrote
//! ([`Core::note_kept`]), and the next visit patches those in ([`Core::take_facts`]).
//!
//! What a fact depends on besides its job's record, and how each stays right:
//!
//! - the service's generation and `min_ready`: kept with the facts, which are rebuilt when
//!   either changed;
//! - the job's `ready_since` and whether it was ever ready: changed only by events of the
//!   job (a write, noted);
//! - time: a ready current-generation job becomes available `min_ready` after it became
//!   ready. The earliest such instant is kept (`ripe_at`): a use at or after it decides
//!   those jobs' availability again (a scan of the facts, as often as time alone
//!   makes some available, which visited the service and rebuilt its facts before); a use
//!   at an earlier `now` than the last rebuilds;
//! - the hosts' maintenance (`moving`: on a draining host), announced by no job write:
//!   the facts are kept only while no host drains, and built whole meanwhile.
//!
//! Only services of [`KEEP_AT_LEAST`] jobs or more are kept. Under `cfg(test)` every
//! service's are, and every use is compared with a rebuild.

use super::{Core, KeptFacts};
use plugin_api::{JobId, ServiceInfo, ServiceKey};
use std::time::Duration;
use tokio::time::Instant;
use xce_model::rollout::JobFacts;
use xce_model::Txn;

/// The fewest jobs a service has for its facts to be kept (40 bytes a job): a smaller
/// service's facts cost little to build. Placing 50,000 replicas with every service's
/// kept, the controller's RSS per replica was 60–170 bytes higher while a fact held a
/// copy of its id; with the model's shared id, three runs showed no difference in RSS
/// or CPU beyond the noise against this threshold.
const KEEP_AT_LEAST: usize = 1_000;

/// Whether the facts of a service of `jobs` jobs are kept: from [`KEEP_AT_LEAST`] on;
/// every service's in the tests, so that the safety net compares them everywhere.
fn kept_for(jobs: usize) -> bool {
    cfg!(test) || jobs >= KEEP_AT_LEAST
}

impl Core {
    /// Notes the jobs `txn` writes for their services' kept facts (before it is applied:
    /// a job it ends is still in the cluster, so its service is known).
    pub(super) fn note_kept(&mut self, txn: &Txn) {
        if self.kept.is_empty() {
            return;
        }
        // The service looked up once per run of its jobs (a pass writes thousands of one
        // service's jobs in a row).
        let mut run: Option<(ServiceKey, bool)> = None;
        for (id, new) in txn.jobs_written() {
            let old = self.cluster.jobs.get(id.as_str()).map(|j| &**j);
            let Some(info) = new.or(old).map(|j| &j.info) else {
                continue;
            };
            let same =
                matches!(&run, Some((k, _)) if k.project == info.project && k.name == info.service);
            if !same {
                let key = info.service_key();
                let kept = self.kept.contains_key(&key);
                run = Some((key, kept));
            }
            if let Some((key, true)) = &run {
                let Some(k) = self.kept.get_mut(key) else {
                    continue;
                };
                k.stale.push(id.clone());
                if k.stale.len() > patch_limit(k.size) {
                    // Rebuilt at the next visit anyway: not kept meanwhile (a service
                    // left unvisited, its readiness changing, would pile ids up).
                    self.kept.remove(key);
                    run = Some((key.clone(), false));
                }
            }
        }
    }

    /// The facts of every job of `s` at `now`, for a visit: the kept ones with the jobs
    /// written since patched in and those due by `now` available, or built whole. The
    /// visit gives them back with [`give_back`](Self::give_back).
    pub(super) fn take_facts(&mut self, s: &ServiceInfo, now: Instant) -> Vec<JobFacts> {
        let key = s.key();
        // `moving` follows the hosts' maintenance, which no job write announces.
        if self.any_host_drains() || !kept_for(self.cluster.count_of(&key)) {
            self.kept.remove(&key);
            return self.job_facts(s, self.cluster.jobs_of(&key), now);
        }
        let min_ready = self.min_ready_of(&key);
        let mut k = self.kept.remove(&key).unwrap_or_default();
        let rebuild = k.out
            || k.now.is_none_or(|t| now < t)
            || k.generation != s.generation
            || k.min_ready != min_ready
            || k.stale.len() > patch_limit(k.size);
        if rebuild {
            k = KeptFacts {
                generation: s.generation,
                min_ready,
                ..KeptFacts::default()
            };
            k.facts = self
                .cluster
                .jobs_of(&key)
                .filter_map(|j| self.fact_of(s, j, now, min_ready, false))
                .collect();
            k.facts.shrink_to_fit();
            k.ripe_at = self.ripe_at(s, &k.facts, min_ready);
        } else {
            let mut stale = std::mem::take(&mut k.stale);
            stale.sort_unstable();
            stale.dedup();
            self.patch_kept(&mut k, s, &stale, now);
        }
        self.ripen(&mut k, s, now);
        k.size = k.facts.len();
        k.now = Some(now);
        k.out = true;
        let facts = std::mem::take(&mut k.facts);
        #[cfg(test)]
        self.check_kept(s, &facts, now);
        self.kept.insert(key, k);
        facts
    }

    /// Gives back the facts a visit took: `facts` as [`take_facts`](Self::take_facts)
    /// gave `len` of them, then the facts of the jobs the visit placed (appended: dropped
    /// here, the commits noted them) and `drained` (patched in place: noted again, as
    /// their batch may not have been committed).
    pub(super) fn give_back(
        &mut self,
        key: &ServiceKey,
        mut facts: Vec<JobFacts>,
        len: usize,
        drained: Vec<JobId>,
    ) {
        let Some(k) = self.kept.get_mut(key).filter(|k| k.out) else {
            return;
        };
        facts.truncate(len);
        k.facts = facts;
        k.out = false;
        k.stale.extend(drained);
    }

    /// Patches the jobs `stale` (sorted, no repeats) into `k`: replaced in place, or
    /// added and removed in one merge.
    fn patch_kept(&self, k: &mut KeptFacts, s: &ServiceInfo, stale: &[JobId], now: Instant) {
        let mut gone = Vec::new();
        let mut new = Vec::new();
        for id in stale {
            let f = self
                .cluster
                .jobs
                .get(id.as_str())
                .and_then(|j| self.fact_of(s, j, now, k.min_ready, false));
            if let Some(t) = f.as_ref().and_then(|f| self.ripens(s, f, k.min_ready)) {
                k.ripe_at = Some(k.ripe_at.map_or(t, |r| r.min(t)));
            }
            match (k.facts.binary_search_by(|x| (*x.job).cmp(id.as_str())), f) {
                (Ok(i), Some(f)) => k.facts[i] = f,
                (Ok(i), None) => gone.push(i),
                (Err(_), Some(f)) => new.push(f),
                (Err(_), None) => {}
            }
        }
        if gone.is_empty() && new.is_empty() {
            return;
        }
        // `gone` ascends and `new` is in id order: both follow `stale`.
        let old = std::mem::take(&mut k.facts);
        let mut out = Vec::with_capacity(old.len() + new.len());
        let mut gone = gone.into_iter().peekable();
        let mut new = new.into_iter().peekable();
        for (i, f) in old.into_iter().enumerate() {
            if gone.next_if_eq(&i).is_some() {
                continue;
            }
            while let Some(n) = new.next_if(|n| n.job < f.job) {
                out.push(n);
            }
            out.push(f);
        }
        out.extend(new);
        k.facts = out;
    }

    /// When `f`, ready but not available, becomes available by time alone (`None`: not
    /// by time alone).
    fn ripens(&self, s: &ServiceInfo, f: &JobFacts, min_ready: Duration) -> Option<Instant> {
        if f.ready && !f.available && f.generation >= s.generation {
            self.ready_since.get(&f.job).map(|t| *t + min_ready)
        } else {
            None
        }
    }

    /// The earliest instant one of `facts` becomes available by time alone.
    fn ripe_at(&self, s: &ServiceInfo, facts: &[JobFacts], min_ready: Duration) -> Option<Instant> {
        facts
            .iter()
            .filter_map(|f| self.ripens(s, f, min_ready))
            .min()
    }

    /// Once `now` reaches `ripe_at`: the jobs of `k` that have been ready for `min_ready`
    /// by `now` become available, and `ripe_at` moves to the next such instant.
    fn ripen(&self, k: &mut KeptFacts, s: &ServiceInfo, now: Instant) {
        if k.ripe_at.is_none_or(|t| t > now) {
            return;
        }
        let mut next: Option<Instant> = None;
        for f in &mut k.facts {
            let Some(t) = self.ripens(s, f, k.min_ready) else {
                continue;
            };
            if t <= now {
                f.available = true;
            } else {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        k.ripe_at = next;
    }

    /// The safety net of the kept facts (tests only): `facts` equal a rebuild.
    #[cfg(test)]
    fn check_kept(&self, s: &ServiceInfo, facts: &[JobFacts], now: Instant) {
        let built = self.facts_built.get();
        let whole = self.job_facts(s, self.cluster.jobs_of(&s.key()), now);
        self.facts_built.set(built);
        assert_eq!(
            facts,
            &whole[..],
            "the kept facts of service {} differ from a rebuild",
            s.key()
        );
    }
}

/// How many written jobs a service's kept facts (`size` of them) are patched with at
/// most: beyond, they are cheaper built whole (a stop, a restart of most jobs).
fn patch_limit(size: usize) -> usize {
    size / 2 + 64
}
