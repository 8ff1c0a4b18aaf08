//! What a rollout waits for, in words (`rollout.reason`), and the per-job notes it is
//! said with: the last failing probe of each replica that is not ready (reported by its
//! worker when the text changes), and which jobs have ever been ready (a superseded
//! replica never ready has nothing to drain and stops at once).
//!
//! Nothing here is persisted: a new leader starts without probe texts (the reason names
//! the replica and says it is not ready until its worker reports a new text) and counts
//! the jobs ready at its load as having been ready.

use super::{Core, Notes};
use plugin_api::{HostId, ServiceKey};
use tracing::debug;
use xce_model::job_key::JobKey;
use xce_model::rollout::{self, JobFacts, Wait};
use xce_model::{Cluster, ServiceRec, Txn};
use xce_proto::worker::WorkerEvent;

impl Notes {
    /// The notes a load starts with: every job ready now has been ready.
    pub(super) fn loaded(cluster: &Cluster) -> Self {
        let mut notes = Notes::default();
        for (id, j) in &cluster.jobs {
            if j.info.ready || j.held_ready == Some(true) {
                notes.ever_ready.insert(id.clone(), ());
            }
        }
        notes
    }

    /// A committed change made job `id` ready.
    pub(super) fn ready(&mut self, id: &JobKey) {
        self.ever_ready.keep_first(id, ());
        self.probes.remove(&**id);
    }

    /// Job `id` ended.
    pub(super) fn ended(&mut self, id: &str) {
        self.ever_ready.remove(id);
        self.probes.remove(id);
    }

    pub(super) fn ever_ready(&self, id: &str) -> bool {
        self.ever_ready.get(id).is_some()
    }
}

impl Core {
    /// Keeps the probe texts of a worker report (before its events are applied): a job of
    /// the host that is not ready gets its worker's latest text; its service is visited
    /// by the next pass when the text changed, so its rollout's reason follows.
    pub(super) fn note_probes(&mut self, host: &HostId, events: &[WorkerEvent]) {
        for ev in events {
            let WorkerEvent::Readiness {
                job,
                ready: false,
                probe: Some(text),
            } = ev
            else {
                continue;
            };
            let Some(j) = self.cluster.jobs.get(job.as_str()) else {
                continue;
            };
            if j.info.host != *host {
                continue;
            }
            if self.notes.probes.get(job) == Some(text) {
                continue;
            }
            debug!(service = %j.info.service, job = %job, host = %host, probe = %text, "readiness probe failing");
            let key = j.info.service_key();
            self.notes.probes.insert(job.clone(), text.clone());
            self.mark_for_rollout(key);
        }
    }

    /// A service whose rollout's reason may change: the next pass visits it.
    fn mark_for_rollout(&mut self, key: ServiceKey) {
        let running = self
            .cluster
            .services
            .get(&key)
            .is_some_and(|s| s.rollout.is_running(s.info.generation));
        if running {
            self.sched.mark(key);
            self.dirty = true;
        }
    }

    /// Why a progressing rollout of `s` (`view`: its jobs after this pass) waits, in
    /// words (`xcecli` prints it after `waiting:`): the lowest slot not done yet and what
    /// it waits for, with the replica's last failing probe when it is not ready
    /// (`replica 0 (j-7 on exec-02) is not ready: readiness GET / answered 404`).
    /// `txn` is the pass's batch: the jobs it placed are not in the cluster yet.
    pub(super) fn waiting_for(
        &self,
        txn: &Txn,
        s: &ServiceRec,
        view: &rollout::Service,
    ) -> Option<String> {
        let min_ready = humantime::format_duration(view.policy.min_ready);
        let text = match rollout::first_wait(view)? {
            Wait::Placement(r) => match self.pending.get(&s.info.key()).and_then(|p| p.get(&r)) {
                Some(why) => format!("replica {r} has no new replica yet: {why}"),
                None => format!(
                    "replica {r} has no new replica yet (max_surge {} is taken)",
                    view.policy.max_surge
                ),
            },
            Wait::Start(j) => format!("{} has not started yet", self.named(txn, j)),
            Wait::Ready(j) => match self.notes.probes.get(&*j.job) {
                Some(probe) => format!("{} is not ready: {probe}", self.named(txn, j)),
                None => format!("{} is not ready yet", self.named(txn, j)),
            },
            Wait::MinReady(j) => format!(
                "{} is ready; it counts once it has been ready for min_ready {min_ready}",
                self.named(txn, j)
            ),
            Wait::Leaving => "older replicas are still leaving".to_owned(),
        };
        Some(text)
    }

    /// `replica 0 (j-7 on exec-02)`.
    fn named(&self, txn: &Txn, j: &JobFacts) -> String {
        match txn.job(&self.cluster, &j.job) {
            Some(r) => format!("replica {} ({} on {})", j.replica, j.job, r.info.host),
            None => format!("replica {} ({})", j.replica, j.job),
        }
    }
}
