//! Host maintenance: an operator's cordon, uncordon and drain of a host
//! (`POST /v1/hosts/{id}/cordon|uncordon|drain`), and a worker's leave (`xced worker
//! --leave`: its host drains before it exits).
//!
//! The state is the host record's `maintenance` (persisted, so it survives a restart and
//! a takeover). A cordoned or draining host takes no placements (`placement.rs` leaves
//! it out of the ready hosts). A drain moves nothing itself: the jobs on a draining host
//! are `moving` in the rollout's facts (`Core::job_facts`), so each service's own
//! scheduling pass replaces them as it replaces an older generation's job: a job placed
//! elsewhere first, the one on the drained host drained (out of the endpoint, SIGTERM
//! after `drain`) once its replacement is available, never below `replicas -
//! max_unavailable`. A drain is done when the host has no live job.

use super::{Core, CoreError, HostAction, LeaveStatus};
use plugin_api::{HostId, Principal, ServiceKey};
use std::collections::BTreeSet;
use tokio::time::Instant;
use tracing::info;
use xce_model::maintenance::{Maintenance, Mode};
use xce_model::{HostRec, Txn};
use xce_proto::worker::Caller;

impl Core {
    /// An operator's cordon, uncordon or drain of `host`. Admin only (checked by the
    /// route). Idempotent: asking for the state the host is in changes nothing (and keeps
    /// who asked first, and when); a drain of a cordoned host turns it into a drain.
    pub(crate) fn maintain(
        &mut self,
        host: &HostId,
        action: HostAction,
        who: &Principal,
        now: Instant,
    ) -> Result<(), CoreError> {
        let Some(h) = self.cluster.hosts.get(host).cloned() else {
            return Err(CoreError::UnknownHost(host.clone()));
        };
        let wanted = match action {
            HostAction::Uncordon => None,
            HostAction::Cordon => Some(Mode::Cordon),
            HostAction::Drain => Some(Mode::Drain),
        };
        let current = h.maintenance.as_ref().map(|m| m.mode);
        // A cordon asked of a draining host keeps the drain: cordon never undoes one.
        if current == wanted || (action == HostAction::Cordon && current == Some(Mode::Drain)) {
            if let Some(m) = h.maintenance.as_ref().filter(|m| m.leave) {
                // An operator's word on a host its worker drained on leave: kept now.
                let m = Maintenance {
                    leave: false,
                    ..m.clone()
                };
                self.write_maintenance(h, Some(m), now)?;
            }
            return Ok(());
        }
        let m = wanted.map(|mode| Maintenance {
            mode,
            since: self.wall_secs(),
            by: who.name.clone(),
            leave: false,
        });
        let jobs = self.cluster.count_on(host);
        self.write_maintenance(h, m, now)?;
        info!(host = %host, action = action.as_str(), principal = %who.name, jobs, "host maintenance");
        Ok(())
    }

    /// The worker of `host` leaves (SIGTERM with `--leave`): its host drains, unless an
    /// operator's drain already runs. Called again and again until the host has no live
    /// job left (what the answer says); a worker that registers again for the host takes
    /// a leave's drain back (see `registered_maintenance`).
    pub(crate) fn worker_leaves(
        &mut self,
        host: &HostId,
        caller: &Caller,
        now: Instant,
    ) -> Result<LeaveStatus, CoreError> {
        self.check_holder(host, caller, "leave")?;
        let Some(h) = self.cluster.hosts.get(host).cloned() else {
            return Err(CoreError::UnknownHost(host.clone()));
        };
        let drains = h.maintenance.as_ref().is_some_and(Maintenance::drains);
        if !drains {
            // An operator's cordon becomes a drain, but stays the operator's (kept after
            // the worker comes back); otherwise the leave's own drain.
            let leave = h.maintenance.is_none();
            let m = Maintenance {
                mode: Mode::Drain,
                since: self.wall_secs(),
                by: format!("worker:{host}"),
                leave,
            };
            let jobs = self.cluster.count_on(host);
            self.write_maintenance(h, Some(m), now)?;
            info!(host = %host, jobs, "worker leaves: host drains");
        }
        Ok(LeaveStatus {
            left: self.cluster.count_on(host),
        })
    }

    /// The maintenance a host registering again keeps: an operator's, not a leave's (its
    /// worker is back: the host takes placements again).
    pub(super) fn registered_maintenance(&self, prev: Option<&HostRec>) -> Option<Maintenance> {
        let m = prev?.maintenance.clone()?;
        if m.leave {
            info!(host = %prev?.info.id, "the worker that left registered again: its host takes placements again");
            return None;
        }
        Some(m)
    }

    /// Writes `host`'s new maintenance state and marks the services with jobs there for
    /// the next scheduling pass (a drain moves them; an uncordon may let a waiting one
    /// place).
    fn write_maintenance(
        &mut self,
        mut h: HostRec,
        m: Option<Maintenance>,
        now: Instant,
    ) -> Result<(), CoreError> {
        let id = h.info.id.clone();
        h.maintenance = m;
        let services: BTreeSet<ServiceKey> = self
            .cluster
            .jobs_on(&id)
            .map(|j| j.info.service_key())
            .collect();
        let mut txn = Txn::new(&self.cluster);
        // Quiet: the host's info (what listeners and the endpoints see) is unchanged, so
        // no event and no index bump for its services.
        txn.put_host_quiet(h);
        self.commit(txn, now)?;
        // (Services waiting for room are visited by every pass anyway: an uncordoned
        // host is seen.)
        for key in services {
            self.sched.mark(key);
        }
        // The readers' view of the host is rebuilt at the next publish.
        self.parts.hosts.remove(&id);
        Ok(())
    }

    /// Seconds since the Unix epoch on the core's wall clock.
    fn wall_secs(&self) -> u64 {
        (self.wall)()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
}

impl Core {
    /// Whether any host is being drained: when none is (almost always), no job is on one,
    /// and a caller asking for each of a service's jobs skips [`on_draining_host`]'s
    /// lookup of the host by name (a B-tree search comparing host names per job: a fifth
    /// of the controller's string comparisons while placing 50,000 replicas on etcd).
    ///
    /// [`on_draining_host`]: Self::on_draining_host
    pub(super) fn any_host_drains(&self) -> bool {
        self.cluster
            .hosts
            .values()
            .any(|h| h.maintenance.as_ref().is_some_and(Maintenance::drains))
    }

    /// Whether `j` runs on a host being drained (it is to move: see the module
    /// documentation).
    pub(super) fn on_draining_host(&self, j: &xce_model::JobRec) -> bool {
        self.cluster
            .hosts
            .get(&j.info.host)
            .and_then(|h| h.maintenance.as_ref())
            .is_some_and(Maintenance::drains)
    }

    /// The live jobs left on a host under maintenance, per service (none for a host in
    /// service: nobody waits on those).
    pub(super) fn left_on(&self, h: &HostRec) -> Vec<(ServiceKey, usize)> {
        if h.maintenance.is_none() {
            return Vec::new();
        }
        let mut left: std::collections::BTreeMap<ServiceKey, usize> = Default::default();
        for j in self.cluster.jobs_on(&h.info.id) {
            *left.entry(j.info.service_key()).or_default() += 1;
        }
        left.into_iter().collect()
    }

    /// Sets `xce_hosts_maintenance`: hosts cordoned, draining, and drained (a drain with
    /// no live job left).
    pub(super) fn count_maintenance(&self) {
        let mut n = [0usize; 3];
        for h in self.cluster.hosts.values() {
            let Some(m) = &h.maintenance else { continue };
            let i = match m.mode {
                Mode::Cordon => 0,
                Mode::Drain if self.cluster.count_on(&h.info.id) > 0 => 1,
                Mode::Drain => 2,
            };
            n[i] += 1;
        }
        for (state, n) in ["cordoned", "draining", "drained"].into_iter().zip(n) {
            self.metrics.set_host_maintenance(state, n);
        }
    }
}
