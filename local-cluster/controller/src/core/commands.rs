//! The user commands, each checked against the caller's permissions on the service's own
//! project and against the project's quotas: create or update (`submit`), `scale`,
//! `restart` and stop (`delete`). A change of the profile is a new generation (a rollout,
//! driven by the scheduling pass in `placement.rs`).

use super::{stored_profile, Applied, Core, CoreError};
use crate::quota;
use plugin_api::{
    FieldError, JobState, Permission, Principal, ResourcePlugin, ServiceInfo, ServiceKey,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};
use xce_model::rollout::{self, Rollout};
use xce_model::{JobRec, ServiceRec, ServiceState, Txn};
use xce_proto::profile::{self, Profile};

impl Core {
    /// Refuses a change that would take `project` past a quota: `change` is the service
    /// `name` as it would be (`None`: gone), with its replicas and per-replica quantities.
    fn check_quota(
        &self,
        project: &str,
        name: &ServiceKey,
        change: Option<(u32, &BTreeMap<String, u64>)>,
    ) -> Result<(), CoreError> {
        let Some(limits) = self.quotas.of(project) else {
            return Ok(());
        };
        let (mut before, mut after) = (quota::Use::default(), quota::Use::default());
        for s in self.cluster.services.values() {
            if s.info.project != project || s.state == ServiceState::Stopping {
                continue;
            }
            let q = self
                .profiles
                .get(&s.info.key())
                .map(|p| p.quantities.clone())
                .unwrap_or_default();
            before.add(s.info.replicas, &q);
            if s.info.key() != *name {
                after.add(s.info.replicas, &q);
            }
        }
        if let Some((replicas, q)) = change {
            after.add(replicas, q);
        }
        // What the project holds now: every live job (draining and stopping ones keep
        // their ports until they exit, a rollout's surge too) and every service not yet
        // gone. Held beyond what the profiles declare stays counted, so scaling down and
        // up again, or stopping and creating, cannot take a project past its quota while
        // old replicas drain.
        let mut held = quota::Use::default();
        for s in self.cluster.services.values() {
            if s.info.project == project {
                held.add_service();
            }
        }
        for j in self.cluster.jobs.values() {
            if j.info.project == project {
                let q = self
                    .profiles
                    .get(&j.info.service_key())
                    .map(|p| p.quantities.clone())
                    .unwrap_or_default();
                held.add_replica(&q);
            }
        }
        let (before, after) = quota::with_held(&before, &after, &held);
        quota::check(project, limits, &before, &after).map_err(|e| {
            warn!(project = %e.project, quota = %e.quota, limit = e.limit, used = e.used, wanted = e.wanted, "change refused: quota exceeded");
            CoreError::Quota(e)
        })
    }

    /// Creates a service, or with `path` (a `PUT` to that name) creates or updates it: a
    /// changed profile is a new generation (a rollout), a change of only `replicas`,
    /// `drain` or `[service.update]` applies in place, the same profile changes nothing.
    pub(crate) fn submit(
        &mut self,
        doc: Value,
        path: Option<&str>,
        who: &Principal,
        now: Instant,
    ) -> Result<(ServiceKey, Applied), CoreError> {
        let project = doc
            .get("service")
            .and_then(|s| s.get("project"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if !who.may(Permission::JobSubmit, project) {
            return Err(CoreError::Forbidden(format!(
                "no job.submit permission on project {project:?}"
            )));
        }
        let profile = self.submitted_profile(&doc, path)?;
        let key = ServiceKey::new(&profile.project, &profile.name);
        match self.cluster.services.get(&key).cloned() {
            None => self.create(key, profile, who, now),
            // A `POST` names no service: it only creates.
            Some(_) if path.is_none() => Err(CoreError::Conflict(profile.name)),
            Some(cur) => self.update(key, cur, profile, who, now),
        }
    }

    /// The profile of a submitted document, validated (by the host and every plugin, and
    /// its replicas against what the hosts can hold together), and its name checked
    /// against the request's `path`; every problem listed.
    fn submitted_profile(&self, doc: &Value, path: Option<&str>) -> Result<Profile, CoreError> {
        let refs: Vec<&dyn ResourcePlugin> = self.plugins.iter().map(|p| &**p as _).collect();
        let mut errs = Vec::new();
        let body_name = doc
            .get("service")
            .and_then(|s| s.get("name"))
            .and_then(Value::as_str);
        if let (Some(path), Some(body)) = (path, body_name) {
            if path != body {
                errs.push(FieldError::new(
                    "service.name",
                    format!("is {body:?}, but the request is for service {path:?}"),
                ));
            }
        }
        match profile::validate(doc, &refs) {
            Ok(p) if errs.is_empty() => {
                profile::check_replicas(&p.raw, p.replicas, &refs).map_err(CoreError::Invalid)?;
                Ok(p)
            }
            Ok(_) => Err(CoreError::Invalid(errs)),
            Err(mut e) => {
                errs.append(&mut e);
                Err(CoreError::Invalid(errs))
            }
        }
    }

    /// Creates the service `key` of `profile` (within its project's quota): its first
    /// generation, rolling out.
    fn create(
        &mut self,
        key: ServiceKey,
        profile: Profile,
        who: &Principal,
        now: Instant,
    ) -> Result<(ServiceKey, Applied), CoreError> {
        self.check_quota(
            &profile.project,
            &key,
            Some((profile.replicas, &profile.quantities)),
        )?;
        let mut txn = Txn::new(&self.cluster);
        let mut svc = new_service(&profile);
        self.begin_rollout(&mut svc.rollout);
        txn.put_service(svc);
        self.profiles.insert(key.clone(), profile);
        if let Err(e) = self.commit(txn, now) {
            self.profiles.remove(&key);
            return Err(e);
        }
        info!(service = %key.name, project = %key.project, principal = %who.name, "service submitted");
        Ok((key, Applied::Created))
    }

    /// Updates the service `key`, now `cur`, to `profile` (within its project's quota): a new
    /// generation if its template changed, a scale if only `replicas` did, else the new
    /// settings in place; nothing if the profile is the same.
    fn update(
        &mut self,
        key: ServiceKey,
        cur: ServiceRec,
        profile: Profile,
        who: &Principal,
        now: Instant,
    ) -> Result<(ServiceKey, Applied), CoreError> {
        let name = &profile.name;
        if !who.may(Permission::JobView, &cur.info.project) {
            return Err(CoreError::Forbidden(format!(
                "no job.view permission on project {:?}",
                cur.info.project
            )));
        }
        if cur.state == ServiceState::Stopping {
            return Err(stopping(name));
        }
        if cur.info.profile == profile.raw {
            return Ok((key, Applied::Unchanged));
        }
        self.check_quota(
            &profile.project,
            &key,
            Some((profile.replicas, &profile.quantities)),
        )?;
        let mut svc = cur.clone();
        if !rollout::same_template(&cur.info.profile, &profile.raw) {
            self.next_generation(&mut svc);
            info!(service = %name, project = %key.project, generation = svc.info.generation, principal = %who.name, "new profile: rolling out a new generation");
        } else if cur.info.replicas != profile.replicas {
            self.begin_rollout(&mut svc.rollout);
            info!(service = %name, project = %key.project, replicas = profile.replicas, principal = %who.name, "service scaled");
        }
        svc.info.replicas = profile.replicas;
        svc.info.profile = profile.raw.clone();
        self.commit_service(svc, profile, now)?;
        Ok((key, Applied::Updated))
    }

    /// Makes `svc`'s current profile an older generation and starts a rollout of the next.
    pub(super) fn next_generation(&self, svc: &mut ServiceRec) {
        let g = svc.info.generation;
        if self
            .cluster
            .jobs_of(&svc.info.key())
            .any(|j| j.info.generation == g)
        {
            svc.older.insert(g, svc.info.profile.clone());
        }
        svc.info.generation = g + 1;
        self.begin_rollout(&mut svc.rollout);
    }

    /// Begins a rollout (a new service, a new generation, a scale), counted as started
    /// unless one is under way already (it goes on as this one): every rollout started
    /// ends once (`xce_rollouts_total{outcome}`), so started minus ended is the number
    /// under way.
    pub(super) fn begin_rollout(&self, r: &mut Rollout) {
        if r.state != rollout::RolloutState::Progressing {
            self.metrics.rollouts_started.inc();
        }
        r.begin();
    }

    /// Commits a changed service record whose current profile is `profile`.
    fn commit_service(
        &mut self,
        svc: ServiceRec,
        profile: Profile,
        now: Instant,
    ) -> Result<(), CoreError> {
        self.commit_service_with(svc, profile, Vec::new(), now)
    }

    /// [`commit_service`](Self::commit_service), with job changes in the same batch.
    pub(super) fn commit_service_with(
        &mut self,
        svc: ServiceRec,
        profile: Profile,
        jobs: Vec<JobRec>,
        now: Instant,
    ) -> Result<(), CoreError> {
        let name = svc.info.key();
        let mut svc = svc;
        // Slots scaled away lose their history: scaled up again, they start afresh.
        let replicas = svc.info.replicas;
        svc.slots.retain(|r, _| *r < replicas);
        let mut txn = Txn::new(&self.cluster);
        for j in jobs {
            txn.put_job(&self.cluster, j);
        }
        let moved: Vec<(u64, Value)> = svc
            .older
            .iter()
            .filter(|(g, _)| !self.older.contains_key(&(name.clone(), **g)))
            .map(|(g, v)| (*g, v.clone()))
            .collect();
        txn.put_service(svc);
        let before = self.profiles.insert(name.clone(), profile);
        for (g, raw) in moved {
            let info = &self.cluster.services[&name].info;
            let p = stored_profile(&self.plugins, info, &raw);
            self.older.insert((name.clone(), g), p);
        }
        self.progress.remove(&name);
        if let Err(e) = self.commit(txn, now) {
            match before {
                Some(p) => self.profiles.insert(name.clone(), p),
                None => self.profiles.remove(&name),
            };
            return Err(e);
        }
        Ok(())
    }

    /// The service `name` for a change by `who`: invisible answers as unknown.
    fn service_for_change(
        &self,
        key: &ServiceKey,
        who: &Principal,
    ) -> Result<ServiceRec, CoreError> {
        let Some(svc) = self.cluster.services.get(key).cloned() else {
            return Err(CoreError::ServiceNotFound(key.name.clone()));
        };
        if !who.may(Permission::JobView, &svc.info.project) {
            return Err(CoreError::ServiceNotFound(key.name.clone()));
        }
        if !who.may(Permission::JobSubmit, &svc.info.project) {
            return Err(CoreError::Forbidden(format!(
                "no job.submit permission on project {:?}",
                svc.info.project
            )));
        }
        Ok(svc)
    }

    /// Sets the replica count: new replicas run the current generation; scaling down
    /// drains the highest-numbered replicas.
    pub(crate) fn scale(
        &mut self,
        key: &ServiceKey,
        replicas: u64,
        who: &Principal,
        now: Instant,
    ) -> Result<(), CoreError> {
        let mut svc = self.service_for_change(key, who)?;
        let name = &key.name;
        if !(1..=profile::MAX_REPLICAS).contains(&replicas) {
            return Err(CoreError::Invalid(vec![FieldError::new(
                "replicas",
                format!("must be between 1 and {}", profile::MAX_REPLICAS),
            )]));
        }
        let replicas = replicas as u32;
        {
            let refs: Vec<&dyn ResourcePlugin> = self.plugins.iter().map(|p| &**p as _).collect();
            profile::check_replicas(&svc.info.profile, replicas, &refs).map_err(|errs| {
                // The request names only `replicas`: say which part of the profile it
                // cannot fit.
                CoreError::Invalid(
                    errs.into_iter()
                        .map(|e| FieldError::new("replicas", format!("{}: {}", e.field, e.reason)))
                        .collect(),
                )
            })?;
        }
        if svc.state == ServiceState::Stopping {
            return Err(stopping(name));
        }
        if svc.info.replicas == replicas {
            return Ok(());
        }
        let mut profile = self.profiles[key].clone();
        self.check_quota(
            &svc.info.project,
            key,
            Some((replicas, &profile.quantities)),
        )?;
        profile.replicas = replicas;
        if let Some(m) = profile.raw.as_object_mut() {
            m.insert("replicas".into(), Value::from(replicas));
        }
        svc.info.replicas = replicas;
        svc.info.profile = profile.raw.clone();
        self.begin_rollout(&mut svc.rollout);
        self.commit_service(svc, profile, now)?;
        info!(service = %name, project = %key.project, replicas, principal = %who.name, "service scaled");
        Ok(())
    }

    /// Rolls every replica over to a fresh one: the same profile as a new generation.
    pub(crate) fn restart(
        &mut self,
        key: &ServiceKey,
        who: &Principal,
        now: Instant,
    ) -> Result<(), CoreError> {
        let mut svc = self.service_for_change(key, who)?;
        let name = &key.name;
        if svc.state == ServiceState::Stopping {
            return Err(stopping(name));
        }
        self.next_generation(&mut svc);
        let profile = self.profiles[key].clone();
        let generation = svc.info.generation;
        self.commit_service(svc, profile, now)?;
        info!(service = %name, project = %key.project, generation, principal = %who.name, "service restarting");
        Ok(())
    }

    /// Stops a service: its running jobs drain (leave the endpoint, then get SIGTERM after
    /// `drain`), or with `now` stop at once; they end when their workers report them
    /// exited. Returns how many jobs are leaving.
    pub(crate) fn delete(
        &mut self,
        key: &ServiceKey,
        now_please: bool,
        who: &Principal,
        now: Instant,
    ) -> Result<usize, CoreError> {
        let svc = self.service_for_change(key, who)?;
        let name = &key.name;
        let jobs: Vec<JobRec> = self.cluster.jobs_of(key).cloned().collect();
        let mut txn = Txn::new(&self.cluster);
        if svc.state != ServiceState::Stopping || (now_please && !svc.stop_now) {
            txn.put_service(ServiceRec {
                state: ServiceState::Stopping,
                stop_now: svc.stop_now || now_please,
                ..svc.clone()
            });
        }
        let drain = if now_please {
            Duration::ZERO
        } else {
            self.stop_drain(key)
        };
        // `--now` also cuts short the drains already running. As many as one batch
        // holds; the scheduling passes move the rest out (see `stop_leftovers`).
        let leaving: Vec<JobRec> = jobs
            .iter()
            .filter(|j| j.effective_state() != JobState::Draining || now_please)
            .cloned()
            .collect();
        self.leave_within(&mut txn, &mut leaving.into_iter().peekable(), drain);
        if jobs.is_empty() {
            let s = txn.service(&self.cluster, key).expect("service in txn");
            txn.remove_service(&s);
        }
        self.commit(txn, now)?;
        info!(service = %name, project = %key.project, principal = %who.name, jobs = jobs.len(), drain = ?drain, "service stopping");
        Ok(jobs.len())
    }

    /// The drain of a stopping service's jobs: none after a `?now=true` stop, else its
    /// profile's.
    pub(super) fn stop_drain(&self, key: &ServiceKey) -> Duration {
        if self.cluster.services.get(key).is_some_and(|s| s.stop_now) {
            return Duration::ZERO;
        }
        self.profiles
            .get(key)
            .map_or(profile::DEFAULT_DRAIN, |p| p.drain)
    }

    /// Puts a job on its way out: a running one drains first (it leaves the endpoint
    /// now and gets SIGTERM after `drain`), anything else stops at once.
    pub(super) fn leave(&self, txn: &mut Txn, mut j: JobRec, drain: Duration) {
        let eff = j.effective_state();
        let to = match eff {
            JobState::Running if !drain.is_zero() => JobState::Draining,
            JobState::Placed | JobState::Running | JobState::Draining => JobState::Stopping,
            JobState::Unknown | JobState::Stopping | JobState::Exited | JobState::Lost => return,
        };
        if j.info.state == JobState::Unknown {
            j.held = Some(to);
        } else {
            j.info.state = to;
        }
        j.info.ready = false;
        j.held_ready = None;
        txn.put_job(&self.cluster, j);
    }
}

/// A change to a stopping service, refused with one message whatever the change.
fn stopping(name: &str) -> CoreError {
    CoreError::Refused(format!(
        "service {name:?} is stopping; change or submit it again once it is gone"
    ))
}

/// The record of a service just created from `profile`: active, its first generation
/// to roll out (the caller begins the rollout).
fn new_service(profile: &Profile) -> ServiceRec {
    let rollout = Rollout::default();
    ServiceRec {
        info: ServiceInfo {
            name: profile.name.clone(),
            project: profile.project.clone(),
            replicas: profile.replicas,
            profile: profile.raw.clone(),
            rev: 0,
            generation: plugin_api::first_generation(),
        },
        state: ServiceState::Active,
        rollout,
        older: BTreeMap::new(),
        slots: BTreeMap::new(),
        stop_now: false,
    }
}
