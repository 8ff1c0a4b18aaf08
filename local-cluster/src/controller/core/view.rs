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

use super::{Core, HostView, JobView, Parts, ServiceView, View};
use crate::controller::model::{Cluster, JobRec, ServiceRec, Txn};
use crate::controller::rollout;
use plugin_api::{HostId, JobInfo, ServiceKey};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::time::Instant;

impl Parts {
    /// Notes the services `txn` writes (before it is applied: a job it ends is still in
    /// `c`, so its service is known).
    pub(super) fn touch(&mut self, txn: &Txn, c: &Cluster) {
        txn.touched_services(c, &mut self.dirty);
    }

    /// Marks every service for a rebuild (the first view after a load).
    pub(super) fn touch_all(&mut self, c: &Cluster) {
        self.dirty.extend(c.services.keys().cloned());
    }
}

impl Core {
    /// The readers' view of the cluster now, reusing the parts of the last one that did
    /// not change. `hosts` are the hosts whose record or jobs changed since.
    pub(super) fn build_view(&mut self, hosts: &BTreeSet<HostId>, now: Instant) -> View {
        let mut dirty = std::mem::take(&mut self.parts.dirty);
        // Time alone made these services' counts change.
        let due: Vec<ServiceKey> = self
            .parts
            .timed
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(k, _)| k.clone())
            .collect();
        dirty.extend(due);
        let mut services = std::mem::take(&mut self.parts.services);
        for key in &dirty {
            match self.cluster.services.get(key) {
                Some(rec) => {
                    let (v, next) = self.service_view(rec, services.get(key), now);
                    services.insert(key.clone(), Arc::new(v));
                    self.set_timed(key, next);
                }
                None => {
                    services.remove(key);
                    self.parts.timed.remove(key);
                }
            }
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

    /// The view of one service at `now`, and when its counts will change with time alone.
    /// `last` is the service's previous part: the grant summaries of jobs whose grants
    /// did not change are taken from it rather than asked of the plugins again.
    fn service_view(
        &self,
        s: &ServiceRec,
        last: Option<&Arc<ServiceView>>,
        now: Instant,
    ) -> (ServiceView, Option<Instant>) {
        let key = s.info.key();
        let recs: Vec<&JobRec> = self.cluster.jobs_of(&key).collect();
        let mut jobs: Vec<JobView> = self
            .cluster
            .shared_jobs_of(&key)
            .map(|j| JobView {
                rec: j.clone(),
                summaries: match last.and_then(|l| same_grants(&l.jobs, j)) {
                    Some(known) => known.clone(),
                    None => self.grant_summaries(&j.info),
                },
            })
            .collect();
        jobs.sort_by_key(|j| order(j.info()));
        let pending = self.pending.get(&key).map(pending_of).unwrap_or_default();
        let policy = self
            .profiles
            .get(&key)
            .map(|p| p.update)
            .unwrap_or_default();
        let facts = self.job_facts(&s.info, recs.iter().copied(), now);
        let counts = rollout::Service {
            replicas: s.info.replicas,
            generation: s.info.generation,
            policy,
            jobs: &facts,
        }
        .counts();
        // A ready job of the current generation becomes available once it has been ready
        // for `min_ready` (see `job_facts`): the counts change then without any event.
        let next = facts
            .iter()
            .filter(|f| f.ready && !f.available && f.generation >= s.info.generation)
            .filter_map(|f| self.ready_since.get(&f.job))
            .map(|t| *t + policy.min_ready)
            .min();
        let view = ServiceView {
            info: s.info.clone(),
            state: s.state,
            jobs,
            pending,
            rollout: s.rollout.clone(),
            counts,
            slots: s.slots.clone(),
        };
        (view, next)
    }

    fn host_view(&self, id: &str) -> HostView {
        let h = &self.cluster.hosts[id];
        HostView {
            info: h.info.clone(),
            jobs: self.cluster.count_on(id),
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
    /// whole from the state at `now`.
    #[cfg(test)]
    pub(super) fn check_view(&self, view: &View, now: Instant) {
        let whole: BTreeMap<ServiceKey, ServiceView> = self
            .cluster
            .services
            .values()
            .map(|s| (s.info.key(), self.service_view(s, None, now).0))
            .collect();
        assert_eq!(
            view.services.keys().collect::<Vec<_>>(),
            whole.keys().collect::<Vec<_>>(),
            "the incremental view has other services than the state"
        );
        for (key, part) in &view.services {
            assert_eq!(
                **part, whole[key],
                "the incremental view of service {key} differs from a full rebuild"
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

/// The order of a service's jobs in its view: by replica, then by job number.
fn order(j: &JobInfo) -> (u32, u64) {
    (j.replica, job_num(&j.job))
}

/// The summaries `jobs` (a service's last view, in [`order`]) has for `j`, if it has the
/// job with the same grants (a job's grants are set when it is placed; a change of its
/// state or readiness leaves them).
fn same_grants<'a>(jobs: &'a [JobView], j: &Arc<JobRec>) -> Option<&'a Option<Arc<str>>> {
    let at = jobs
        .binary_search_by_key(&order(&j.info), |v| order(v.info()))
        .ok()?;
    let old = &jobs[at];
    let same = Arc::ptr_eq(&old.rec, j)
        || (old.rec.info.job == j.info.job && old.rec.info.grants == j.info.grants);
    same.then_some(&old.summaries)
}

/// Job ids are `j-<n>`: sort numerically.
fn job_num(id: &str) -> u64 {
    id.strip_prefix("j-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}
