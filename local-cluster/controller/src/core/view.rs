//! The readers' [`View`], built incrementally: each service's and each host's part is an
//! `Arc` kept from one publish to the next, and a publish rebuilds only the parts that
//! changed. Rebuilding every service on every settle cost the state task about half its
//! time at 50,000 jobs (every job and its grants cloned per settle), whatever one
//! command changed.
//!
//! A service's part changes only with its records (its service record, its jobs: marked
//! by [`Core::commit`] from the transaction, quiet writes included), its pending reasons
//! (compared at publish: the scheduling pass rebuilds them), and time alone while one of
//! its current-generation jobs is ready but not yet `min_ready` (its rollout counts: the
//! instant is kept, the part rebuilt once it passes). A host's part changes with its
//! record and its jobs, both announced by events ([`Core::publish`] collects the hosts).
//!
//! A changed part is patched, not rebuilt, when its service's replicas, generation and
//! `min_ready` are the same as the last part's: the jobs a commit wrote are patched into
//! the last part's [`Jobs`] (the chunks they fall into copied, the others shared), and
//! the rollout counts updated by what those jobs counted before and count now, plus the
//! jobs that were waiting for `min_ready` (the only ones time alone changes). A publish
//! then costs what changed, not the size of the services touched: rebuilding whole
//! parts was 57 % of the controller's CPU at 1,000 hosts (a readiness event of a
//! 5,000-job service rebuilt 5,000 job views). Under `cfg(test)` every publish is
//! compared with a whole rebuild (`Core::check_view`).

use super::jobs::{key_of, order};
use super::{Book, Core, HostView, JobView, Jobs, Parts, ServiceView, Tally, View};
use plugin_api::{HostId, JobId, JobInfo, ServiceKey};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use xce_model::rollout::{self, Counts, JobFacts};
use xce_model::{Cluster, JobRec, ServiceRec, Txn};

impl Parts {
    /// Notes the services and jobs `txn` writes (before it is applied: a job it ends is
    /// still in `c`, so its service and replica are known), and counts its jobs' new
    /// states for the gauges.
    pub(super) fn touch(&mut self, txn: &Txn, c: &Cluster) {
        let written = txn.services_written().map(|(key, _)| key);
        for key in written.chain(txn.services_bumped()) {
            self.dirty.entry(key.clone()).or_default();
        }
        // A key built once per run of one service's jobs, not per job (a pass writes
        // thousands of one service's jobs, mostly in a row).
        let mut run: Option<(ServiceKey, Vec<(u32, JobId)>)> = None;
        for (id, new) in txn.jobs_written() {
            let old = c.jobs.get(id.as_str()).map(|j| &**j);
            self.tally.count(old, -1);
            self.tally.count(new, 1);
            let Some(info) = new.or(old).map(|j| &j.info) else {
                continue;
            };
            match &mut run {
                Some((k, jobs)) if k.project == info.project && k.name == info.service => {
                    jobs.push((info.replica, id.clone()));
                }
                _ => {
                    self.note_jobs(run.take());
                    run = Some((info.service_key(), vec![(info.replica, id.clone())]));
                }
            }
        }
        self.note_jobs(run);
    }

    fn note_jobs(&mut self, run: Option<(ServiceKey, Vec<(u32, JobId)>)>) {
        if let Some((key, jobs)) = run {
            self.dirty.entry(key).or_default().extend(jobs);
        }
    }

    /// Marks every service for a rebuild from scratch, and counts every job (the first
    /// view after a load).
    pub(super) fn touch_all(&mut self, c: &Cluster) {
        self.services.clear();
        self.books.clear();
        self.dirty
            .extend(c.services.keys().map(|k| (k.clone(), Vec::new())));
        self.tally = Tally::of(c);
    }
}

impl Core {
    /// The readers' view of the cluster now, reusing the parts of the last one that did
    /// not change. `hosts` are the hosts whose record or jobs changed since.
    pub(super) fn build_view(&mut self, hosts: &BTreeSet<HostId>, now: Instant) -> View {
        let mut dirty = std::mem::take(&mut self.parts.dirty);
        // Time alone made these services' counts change.
        for (key, _) in self.parts.timed.iter().filter(|(_, t)| **t <= now) {
            dirty.entry(key.clone()).or_default();
        }
        let mut services = std::mem::take(&mut self.parts.services);
        for (key, changed) in dirty {
            let Some(rec) = self.cluster.services.get(&key) else {
                services.remove(&key);
                self.parts.timed.remove(&key);
                self.parts.books.remove(&key);
                continue;
            };
            let last = services.get(&key);
            let book = self.parts.books.remove(&key);
            let (v, book) = match (last, book) {
                (Some(l), Some(b))
                    if l.info.replicas == rec.info.replicas
                        && l.info.generation == rec.info.generation
                        && b.min_ready == self.min_ready(&key) =>
                {
                    self.patch_view(rec, l, b, changed, now)
                }
                _ => self.service_view(rec, last, now),
            };
            let next = self.next_available(&book);
            services.insert(key.clone(), Arc::new(v));
            self.parts.books.insert(key.clone(), book);
            self.set_timed(&key, next);
        }
        // The pending reasons come from the scheduling pass, not from a commit: compare.
        let empty = BTreeMap::new();
        for (key, part) in services.iter_mut() {
            let now_pending = self.pending.get(key).unwrap_or(&empty);
            let same = part.pending.len() == now_pending.len()
                && part
                    .pending
                    .iter()
                    .zip(now_pending)
                    .all(|((r, why), (r2, why2))| r == r2 && why == why2);
            if !same {
                let mut v = ServiceView::clone(part);
                v.pending = pending_of(now_pending);
                *part = Arc::new(v);
            }
        }
        self.parts.services = services;

        let mut parts = std::mem::take(&mut self.parts.hosts);
        parts.retain(|h, _| self.cluster.hosts.contains_key(h));
        let mut host_views = Vec::with_capacity(self.cluster.hosts.len());
        for id in self.cluster.hosts.keys() {
            let part = match parts.get(id) {
                Some(p) if !hosts.contains(id) => p.clone(),
                _ => {
                    let p = Arc::new(self.host_view(id));
                    parts.insert(id.clone(), p.clone());
                    p
                }
            };
            host_views.push(part);
        }
        self.parts.hosts = parts;
        View {
            services: self.parts.services.clone(),
            hosts: host_views,
        }
    }

    fn set_timed(&mut self, key: &ServiceKey, next: Option<Instant>) {
        match next {
            Some(t) => {
                self.parts.timed.insert(key.clone(), t);
            }
            None => {
                self.parts.timed.remove(key);
            }
        }
    }

    /// The view of one service at `now`, built whole, and what its counts were counted
    /// with. `last` is the service's previous part: the grant summaries of jobs whose
    /// grants did not change are taken from it rather than asked of the plugins again.
    fn service_view(
        &self,
        s: &ServiceRec,
        last: Option<&Arc<ServiceView>>,
        now: Instant,
    ) -> (ServiceView, Book) {
        let key = s.info.key();
        let mut jobs: Vec<JobView> = self
            .cluster
            .shared_jobs_of(&key)
            .map(|j| self.job_view(j, last))
            .collect();
        jobs.sort_by(|a, b| order(a.info()).cmp(&order(b.info())));
        let facts = self.job_facts(&s.info, self.cluster.jobs_of(&key), now);
        let counts = self.counts(s, &facts);
        let book = Book {
            min_ready: self.min_ready(&key),
            waiting: waiting(s, &facts).collect(),
        };
        (self.part(s, Jobs::from_sorted(jobs), counts), book)
    }

    /// The view of one service at `now`: `last`, its previous part (counted with `book`,
    /// with the same replicas, generation and `min_ready`), with the jobs in `changed`
    /// (replica, id: those the commits since wrote) patched in, and the counts of those
    /// and of the jobs waiting for `min_ready` counted again.
    fn patch_view(
        &self,
        s: &ServiceRec,
        last: &Arc<ServiceView>,
        mut book: Book,
        mut changed: Vec<(u32, JobId)>,
        now: Instant,
    ) -> (ServiceView, Book) {
        changed.sort_by(|a, b| key_of(a.0, &a.1).cmp(&key_of(b.0, &b.1)));
        changed.dedup();
        // The jobs counted again: as the last part counted them, and as they are now.
        let mut before: Vec<&JobRec> = Vec::with_capacity(changed.len());
        let mut after: Vec<&JobRec> = Vec::with_capacity(changed.len());
        for (replica, id) in &changed {
            before.extend(last.jobs.get(key_of(*replica, id)).map(|v| &*v.rec));
            after.extend(self.cluster.jobs.get(id.as_str()).map(|j| &**j));
        }
        for id in &book.waiting {
            // Not `min_ready` yet: counted now as the last part counted it (a fact of the
            // same record, not available either way), so left out (all of a placement's
            // ready replicas wait for `min_ready` at once).
            let due = self
                .ready_since
                .get(id.as_str())
                .is_none_or(|t| now.saturating_duration_since(*t) >= book.min_ready);
            if !due {
                continue;
            }
            let Some(j) = self.cluster.jobs.get(id.as_str()) else {
                continue; // Ended: in `changed`.
            };
            let key = order(&j.info);
            if changed
                .binary_search_by(|c| key_of(c.0, &c.1).cmp(&key))
                .is_err()
            {
                before.push(j);
                after.push(j);
            }
        }
        let mut before = self.job_facts(&s.info, before, now);
        // What the last part counted: a current-generation ready job was available
        // unless it was waiting (an older one when ready, whatever the time).
        for f in &mut before {
            f.available =
                f.ready && (f.generation < s.info.generation || !book.waiting.contains(&*f.job));
        }
        let after = self.job_facts(&s.info, after, now);
        let counts = minus(
            plus(last.counts, self.counts(s, &after)),
            self.counts(s, &before),
        );
        for f in &before {
            book.waiting.remove(&*f.job);
        }
        for (_, id) in &changed {
            book.waiting.remove(id);
        }
        book.waiting.extend(waiting(s, &after));
        let changes: Vec<_> = changed
            .into_iter()
            .map(|(replica, id)| {
                let v = self
                    .cluster
                    .jobs
                    .get(id.as_str())
                    .map(|j| self.job_view(j, Some(last)));
                ((replica, id), v)
            })
            .collect();
        (self.part(s, last.jobs.patch(&changes), counts), book)
    }

    /// A service's part around its `jobs` and `counts`.
    fn part(&self, s: &ServiceRec, jobs: Jobs, counts: Counts) -> ServiceView {
        let pending = self
            .pending
            .get(&s.info.key())
            .map(pending_of)
            .unwrap_or_default();
        ServiceView {
            info: s.info.clone(),
            state: s.state,
            jobs,
            pending,
            rollout: s.rollout.clone(),
            counts,
            slots: s.slots.clone(),
        }
    }

    /// A job's view; its grant summaries from `last` (the service's previous part) when
    /// it has the job with the same grants.
    fn job_view(&self, j: &Arc<JobRec>, last: Option<&Arc<ServiceView>>) -> JobView {
        JobView {
            rec: j.clone(),
            summaries: match last.and_then(|l| same_grants(&l.jobs, j)) {
                Some(known) => known.clone(),
                None => self.grant_summaries(&j.info),
            },
        }
    }

    /// The rollout counts of `facts` (some of a service's jobs: the counts are sums).
    /// A job on a draining host counts by its generation here (the scheduling pass
    /// replaces it like an older one, but it runs the current generation): a host's
    /// maintenance changing then changes no service's counts, which are patched, not
    /// rebuilt, on job changes only.
    fn counts(&self, s: &ServiceRec, facts: &[JobFacts]) -> Counts {
        let unmoved: Vec<JobFacts>;
        let facts = if facts.iter().any(|f| f.moving) {
            unmoved = facts
                .iter()
                .map(|f| JobFacts {
                    moving: false,
                    ..f.clone()
                })
                .collect();
            &unmoved
        } else {
            facts
        };
        rollout::Service {
            replicas: s.info.replicas,
            generation: s.info.generation,
            policy: self
                .profiles
                .get(&s.info.key())
                .map(|p| p.update)
                .unwrap_or_default(),
            jobs: facts,
        }
        .counts()
    }

    fn min_ready(&self, key: &ServiceKey) -> Duration {
        self.profiles
            .get(key)
            .map_or(Duration::ZERO, |p| p.update.min_ready)
    }

    /// When the first of the jobs `book` has waiting becomes available with time alone
    /// (`min_ready` after it became ready: see `job_facts`).
    fn next_available(&self, book: &Book) -> Option<Instant> {
        book.waiting
            .iter()
            .filter_map(|id| self.ready_since.get(id))
            .map(|t| *t + book.min_ready)
            .min()
    }

    fn host_view(&self, id: &str) -> HostView {
        let h = &self.cluster.hosts[id];
        HostView {
            info: h.info.clone(),
            jobs: self.cluster.count_on(id),
            maintenance: h.maintenance.clone(),
            left: self.left_on(h),
            summaries: self
                .plugins
                .iter()
                .filter_map(|p| p.host_summary(&h.info.id).map(|v| (p.name().to_owned(), v)))
                .collect(),
        }
    }

    /// The plugins' summaries of the job's grants, as the text of one JSON object by
    /// plugin name (`None`: none has one).
    fn grant_summaries(&self, job: &JobInfo) -> Option<Arc<str>> {
        let m: serde_json::Map<String, Value> = self
            .plugins
            .iter()
            .filter_map(|p| {
                let g = job.grants.get(p.name())?;
                p.grant_summary(g).map(|v| (p.name().to_owned(), v))
            })
            .collect();
        (!m.is_empty()).then(|| Value::Object(m).to_string().into())
    }

    /// The safety net of the incremental view (tests only): `view` equals a view built
    /// whole from the state at `now`, and so does what its counts were counted with.
    #[cfg(test)]
    pub(super) fn check_view(&self, view: &View, now: Instant) {
        // What a publish costs is counted without this net.
        let built = self.facts_built.get();
        let whole: BTreeMap<ServiceKey, (ServiceView, Book)> = self
            .cluster
            .services
            .values()
            .map(|s| (s.info.key(), self.service_view(s, None, now)))
            .collect();
        self.facts_built.set(built);
        assert_eq!(
            view.services.keys().collect::<Vec<_>>(),
            whole.keys().collect::<Vec<_>>(),
            "the incremental view has other services than the state"
        );
        assert_eq!(self.parts.books.len(), whole.len(), "books of the parts");
        for (key, part) in &view.services {
            part.jobs.check();
            let (whole_part, whole_book) = &whole[key];
            assert_eq!(
                **part, *whole_part,
                "the incremental view of service {key} differs from a full rebuild"
            );
            assert_eq!(
                self.parts.books.get(key),
                Some(whole_book),
                "what the counts of service {key} were counted with"
            );
            assert_eq!(
                self.parts.timed.get(key).copied(),
                self.next_available(whole_book),
                "when the counts of service {key} change with time"
            );
        }
        let hosts: Vec<HostView> = self
            .cluster
            .hosts
            .keys()
            .map(|h| self.host_view(h))
            .collect();
        assert_eq!(view.hosts.len(), hosts.len(), "hosts in the view");
        for (part, whole) in view.hosts.iter().zip(&hosts) {
            assert_eq!(
                **part, *whole,
                "the incremental view of host {} differs from a full rebuild",
                whole.info.id
            );
        }
    }
}

fn pending_of(m: &BTreeMap<u32, String>) -> Vec<(u32, String)> {
    m.iter().map(|(r, why)| (*r, why.clone())).collect()
}

/// The live ready current-generation jobs of `facts` that are not available yet.
fn waiting<'a>(s: &'a ServiceRec, facts: &'a [JobFacts]) -> impl Iterator<Item = JobId> + 'a {
    facts
        .iter()
        .filter(|f| f.ready && !f.available && f.generation >= s.info.generation)
        .map(|f| f.job.to_string())
}

fn plus(a: Counts, b: Counts) -> Counts {
    Counts {
        updated: a.updated + b.updated,
        ready: a.ready + b.ready,
        outdated: a.outdated + b.outdated,
        available: a.available + b.available,
        excess: a.excess + b.excess,
    }
}

/// `a - b`, where `b` counts some of the jobs `a` counted.
fn minus(a: Counts, b: Counts) -> Counts {
    Counts {
        updated: a.updated - b.updated,
        ready: a.ready - b.ready,
        outdated: a.outdated - b.outdated,
        available: a.available - b.available,
        excess: a.excess - b.excess,
    }
}

/// The summaries `jobs` (a service's last view) has for `j`, if it has the job with the
/// same grants (a job's grants are set when it is placed; a change of its state or
/// readiness leaves them).
fn same_grants<'a>(jobs: &'a Jobs, j: &Arc<JobRec>) -> Option<&'a Option<Arc<str>>> {
    let old = jobs.get(order(&j.info))?;
    let same = Arc::ptr_eq(&old.rec, j) || old.rec.info.grants == j.info.grants;
    same.then_some(&old.summaries)
}
