//! A job's life after its placement, as the workers report it: started (the launch
//! hooks), readiness flips, drain, stop, gone.
//!
//! A real worker reports what happened since its last heartbeat in one message, and the
//! controller applies a message (and a burst of queued ones) in one store commit. The
//! simulated workers tick in lockstep after a placement pass: every start of the tick
//! is one batch, every readiness flip of the next tick another, each announced to the
//! listeners with one `on_events` call. Committing them one by one made the endpoint
//! table copy a service's whole entry once per replica.

use super::{job_number, Cluster, Outcome};
use crate::config::Fault;
use crate::store::Batch;
use plugin_api::{ClusterEvent, EndReason, JobState, LaunchContext};
use std::collections::BTreeSet;
use std::time::Instant;

impl Cluster {
    /// One tick of the workers of `jobs` (placed, not started): each runs the launch
    /// hooks and reports the job running; the tick is one batch. A refused launch ends
    /// its job (the plugin hears why) and its slot waits for another placement. One
    /// outcome per job, in order.
    pub(crate) fn start_all(&mut self, jobs: &[String]) -> Vec<Outcome> {
        let mut out = Vec::with_capacity(jobs.len());
        let mut started = Vec::with_capacity(jobs.len());
        let mut batch = Batch::default();
        for job in jobs {
            let n = job_number(job);
            let rec = &self.jobs[&n];
            let host = &self.hosts[rec.host as usize];
            let cx = LaunchContext {
                job: rec.info.job.clone(),
                service: rec.info.service.clone(),
                project: rec.info.project.clone(),
                replica: rec.info.replica,
                host: host.info.id.clone(),
                host_ip: host.info.facts.ip_addr,
                grants: rec.info.grants.clone(),
            };
            let at = Instant::now();
            let launched = self.workers.launch(&cx);
            self.phases.launch += at.elapsed();
            match launched {
                Ok(plan) => {
                    let rec = self.jobs.get_mut(&n).expect("live job");
                    rec.info.state = JobState::Running;
                    batch.job(&rec.info);
                    started.push(n);
                    out.push(Outcome::Started {
                        job: cx.job,
                        env: plan.env,
                    });
                }
                Err(refusal) => {
                    tracing::warn!(%job, reason = %refusal.reason, "launch refused");
                    if let Some(p) = self.plugins.iter_mut().find(|p| p.name() == refusal.plugin) {
                        p.launch_refused(&cx.host, &cx.job, &refusal.detail);
                    }
                    let reason = EndReason::Refused {
                        reason: refusal.reason,
                    };
                    out.push(self.end(n, reason, true));
                }
            }
        }
        if !started.is_empty() {
            self.commit_jobs(batch, &started);
        }
        out
    }

    /// The worker reports one readiness transition (a probe's outcome changed).
    pub(crate) fn set_ready(&mut self, job: &str, ready: bool) {
        self.set_ready_all(&[job.to_owned()], ready);
    }

    /// One tick of readiness reports: every job of `jobs` became `ready` (or not), in one
    /// batch.
    pub(crate) fn set_ready_all(&mut self, jobs: &[String], ready: bool) {
        let mut batch = Batch::default();
        let mut announced = Vec::with_capacity(jobs.len());
        for job in jobs {
            let n = job_number(job);
            let rec = self.jobs.get_mut(&n).expect("live job");
            rec.info.ready = ready;
            batch.job(&rec.info);
            if ready && matches!(self.fault, Some(Fault::DropEndpoint)) {
                // Fault injection: committed with the others, but the listeners never
                // hear of it.
                self.fault = None;
                tracing::warn!(%job, "fault injected: a readiness transition not announced");
                continue;
            }
            announced.push(n);
        }
        if announced.is_empty() {
            self.store.commit(batch);
        } else {
            self.commit_jobs(batch, &announced);
        }
    }

    /// The jobs leave every endpoint and keep running (drain), in one batch.
    pub(crate) fn drain_all(&mut self, jobs: &[String]) {
        self.set_state_all(jobs, JobState::Draining);
    }

    /// The jobs are asked to stop (SIGTERM), in one batch.
    pub(crate) fn stop_all(&mut self, jobs: &[String]) {
        self.set_state_all(jobs, JobState::Stopping);
    }

    /// The process is gone: the job ends, its grants are released; with `replace`, its
    /// slot waits for a new job.
    pub(crate) fn exited(&mut self, job: &str, reason: EndReason, replace: bool) -> Outcome {
        self.end(job_number(job), reason, replace)
    }

    /// One tick of exit reports: every process of `jobs` is gone, in one batch.
    pub(crate) fn exited_all(&mut self, jobs: &[String], reason: &EndReason) -> Vec<Outcome> {
        let ns: Vec<u64> = jobs.iter().map(|j| job_number(j)).collect();
        self.end_all(&ns, reason, false)
    }

    /// Every job of `jobs` is out of every endpoint and in `state`, in one batch.
    fn set_state_all(&mut self, jobs: &[String], state: JobState) {
        let mut batch = Batch::default();
        let mut ns = Vec::with_capacity(jobs.len());
        for job in jobs {
            let n = job_number(job);
            let rec = self.jobs.get_mut(&n).expect("live job");
            rec.info.state = state;
            rec.info.ready = false;
            batch.job(&rec.info);
            ns.push(n);
        }
        if !ns.is_empty() {
            self.commit_jobs(batch, &ns);
        }
    }

    pub(super) fn end(&mut self, n: u64, reason: EndReason, replace: bool) -> Outcome {
        let mut out = self.end_all(&[n], &reason, replace);
        out.pop().expect("one job ended, one outcome")
    }

    /// Every job of `ns` ends (one tick of exit reports, or every job of a lost host):
    /// grants released, slots freed (with `replace`, waiting for a new job), one batch.
    pub(super) fn end_all(
        &mut self,
        ns: &[u64],
        reason: &EndReason,
        replace: bool,
    ) -> Vec<Outcome> {
        let mut batch = Batch::default();
        let mut events = Vec::with_capacity(ns.len());
        let mut out = Vec::with_capacity(ns.len());
        let mut touched = BTreeSet::new();
        for &n in ns {
            let rec = self.jobs.remove(&n).expect("ending a live job");
            let host = &mut self.hosts[rec.host as usize];
            host.jobs.remove(n);
            self.sched.add(rec.host, -1);
            let leak = matches!(self.fault, Some(Fault::LeakPort)) && !rec.info.grants.is_empty();
            if leak {
                self.fault = None;
                tracing::warn!(job = %rec.info.job, "fault injected: grants never released");
            } else {
                for p in &mut self.plugins {
                    p.release(&host.info.id, &rec.info.job);
                }
            }
            let key = rec.info.service_key();
            let slot = rec.info.replica;
            let rev = self.store.next_rev();
            if let Some(svc) = self.services.get_mut(&key) {
                svc.slots[slot as usize].retain(|&j| j != n);
                if replace && slot < svc.info.replicas && svc.slots[slot as usize].is_empty() {
                    self.pending.push((key.clone(), slot));
                }
                svc.info.rev = rev;
                touched.insert(key);
            }
            let mut job = rec.info;
            job.state = match reason {
                EndReason::HostLost => JobState::Lost,
                _ => JobState::Exited,
            };
            job.ready = false;
            batch.job_gone(&job.job);
            out.push(Outcome::Ended {
                job: job.job.clone(),
            });
            let reason = reason.clone();
            events.push(ClusterEvent::JobEnded { rev, job, reason });
        }
        // The service's revision is persisted with every change that touches it.
        for key in &touched {
            batch.service(&self.services[key].info);
        }
        self.commit_and_announce(batch, events);
        out
    }

    /// Commits `batch` and announces a `Job` event per listed job, in order.
    pub(super) fn commit_jobs(&mut self, mut batch: Batch, jobs: &[u64]) {
        let mut events = Vec::with_capacity(jobs.len());
        let mut touched = BTreeSet::new();
        for n in jobs {
            let rev = self.store.next_rev();
            let info = &self.jobs[n].info;
            let key = info.service_key();
            if let Some(s) = self.services.get_mut(&key) {
                s.info.rev = rev;
                touched.insert(key);
            }
            events.push(ClusterEvent::Job {
                rev,
                job: info.clone(),
            });
        }
        // The services' revisions are persisted with the batch that raised them.
        for key in &touched {
            batch.service(&self.services[key].info);
        }
        self.commit_and_announce(batch, events);
    }

    pub(super) fn commit_and_announce(&mut self, batch: Batch, events: Vec<ClusterEvent>) {
        self.publish(batch, &events);
    }

    /// Commits `batch`, then announces `events` to every listener in one call.
    pub(super) fn publish(&mut self, batch: Batch, events: &[ClusterEvent]) {
        let at = Instant::now();
        self.phases.commit += batch.encoding;
        self.store.commit(batch);
        self.phases.commit += at.elapsed();
        let at = Instant::now();
        // One call per committed batch: the endpoint table does its per-service work once.
        for l in &self.listeners {
            l.on_events(events);
        }
        self.phases.announce += at.elapsed();
    }
}
