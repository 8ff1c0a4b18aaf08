//! The controller's own metrics, in the one shared registry served on `/metrics`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// Gauges and counters the state task updates after every command.
#[derive(Debug, Clone, Default)]
pub(crate) struct Metrics {
    pub(crate) jobs: Family<Labels, Gauge>,
    pub(crate) hosts: Family<Labels, Gauge>,
    /// Hosts under maintenance by state (`cordoned`, `draining`, `drained`).
    pub(crate) host_maintenance: Family<Labels, Gauge>,
    pub(crate) pending: Gauge,
    pub(crate) placements: Counter,
    pub(crate) revision: Gauge,
    /// Rollouts begun (a new generation: changed profile, restart, rollback).
    pub(crate) rollouts_started: Counter,
    /// Rollouts ended, by outcome (`complete`, `failed`, `reverted`).
    pub(crate) rollouts: Family<Labels, Counter>,
    pub(crate) draining: Gauge,
    /// Worker registrations refused, by reason (`host_taken`, `wrong_cluster`).
    pub(crate) registrations_refused: Family<Labels, Counter>,
    /// Worker calls refused for their session, by reason (`session_required`,
    /// `session_invalid`).
    pub(crate) worker_calls_refused: Family<Labels, Counter>,
    /// Heartbeats whose digest differed from what the controller holds, by part
    /// (`facts`, `readiness`).
    pub(crate) digest_mismatches: Family<Labels, Counter>,
    /// 1 while a full disruption is on (most hosts unreachable at once: none is declared
    /// lost), else 0.
    pub(crate) full_disruption: Gauge,
    /// Pauses of this controller process its beat thread saw (see `core/pulse.rs`).
    pub(crate) pauses: Counter,
    /// Replica jobs that ended by themselves and were replaced, by project and service.
    pub(crate) restarts: Family<Labels, Counter>,
    /// Settles that did work (placement passes, then publishing the view): one answers a
    /// burst of up to 256 queued commands.
    pub(crate) settles: Counter,
    /// Services the scheduling passes visited (one nothing happened to is left out).
    pub(crate) pass_visits: Counter,
}

impl Metrics {
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register("xce_jobs", "Live jobs by state", self.jobs.clone());
        r.register("xce_hosts", "Hosts by state", self.hosts.clone());
        r.register(
            "xce_hosts_maintenance",
            "Hosts an operator (or their leaving worker) cordoned or drains, by state: cordoned, draining, drained",
            self.host_maintenance.clone(),
        );
        r.register(
            "xce_pending_replicas",
            "Replicas of active services without a live job",
            self.pending.clone(),
        );
        r.register(
            "xce_controller_settles",
            "Settles of the controller's state (placement passes, then the readers' view and the workers' assignments); one answers a burst of up to 256 queued commands",
            self.settles.clone(),
        );
        r.register(
            "xce_controller_pass_visits",
            "Services visited by the scheduling passes: a service is visited only when a change was committed to it, replicas of it wait for room, or time alone changes its rollout (a deadline, min_ready, a restart backoff)",
            self.pass_visits.clone(),
        );
        r.register(
            "xce_placements",
            "Replicas placed on a host",
            self.placements.clone(),
        );
        r.register(
            "xce_rollouts_started",
            "Rollouts begun: a new service, a new generation (a changed profile, a restart, a rollback) or a scale; one that supersedes a rollout under way is not counted again",
            self.rollouts_started.clone(),
        );
        r.register(
            "xce_rollouts",
            "Rollouts started (xce_rollouts_started) that ended, by outcome: complete, failed, reverted",
            self.rollouts.clone(),
        );
        r.register(
            "xce_replicas_draining",
            "Replicas that left their endpoints and wait for their drain to end before SIGTERM",
            self.draining.clone(),
        );
        r.register(
            "xce_worker_registrations_refused",
            "Worker registrations refused, by reason: host_taken (another live worker holds the host, and the registration does not prove its session), wrong_cluster (the worker belongs to another cluster)",
            self.registrations_refused.clone(),
        );
        r.register(
            "xce_worker_calls_refused",
            "Worker calls (heartbeat, facts, events, assignments) refused for their session, by reason: session_required (none presented), session_invalid (another secret or instance): a stolen worker credential, or a worker whose host was taken over",
            self.worker_calls_refused.clone(),
        );
        r.register(
            "xce_worker_digest_mismatches",
            "Heartbeats whose state digest differed from what the controller holds, by part (facts, readiness): a forged report the worker then undoes, or a report still on its way",
            self.digest_mismatches.clone(),
        );
        r.register(
            "xce_full_disruption",
            "1 while most hosts are unreachable at once (a full disruption): the controller suspects itself or its network and declares no host lost",
            self.full_disruption.clone(),
        );
        r.register(
            "xce_controller_pauses",
            "Times this controller process was not running for a while (stopped, frozen, starved) and did not hold the hosts' silence meanwhile against them",
            self.pauses.clone(),
        );
        r.register(
            "xce_replica_restarts",
            "Replica jobs that ended by themselves (an exit, a signal, a start error, a refused launch) and were replaced, by project and service",
            self.restarts.clone(),
        );
        r.register(
            "xce_revision",
            "The controller's global revision",
            self.revision.clone(),
        );
    }

    pub(crate) fn set_jobs(&self, state: &str, n: usize) {
        self.jobs
            .get_or_create(&vec![("state".to_owned(), state.to_owned())])
            .set(n as i64);
    }

    pub(crate) fn rollout_ended(&self, outcome: &str) {
        self.rollouts
            .get_or_create(&vec![("outcome".to_owned(), outcome.to_owned())])
            .inc();
    }

    pub(crate) fn worker_call_refused(&self, reason: &str) {
        self.worker_calls_refused
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc();
    }

    pub(crate) fn controller_paused(&self) {
        self.pauses.inc();
    }

    pub(crate) fn digest_mismatch(&self, part: &str) {
        self.digest_mismatches
            .get_or_create(&vec![("part".to_owned(), part.to_owned())])
            .inc();
    }

    pub(crate) fn registration_refused(&self, reason: &str) {
        self.registrations_refused
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc();
    }

    fn service_labels(project: &str, service: &str) -> Labels {
        vec![
            ("project".to_owned(), project.to_owned()),
            ("service".to_owned(), service.to_owned()),
        ]
    }

    pub(crate) fn replica_restarted(&self, project: &str, service: &str) {
        self.restarts
            .get_or_create(&Self::service_labels(project, service))
            .inc();
    }

    /// A removed service's series end with it (a new service of that name starts at 0).
    pub(crate) fn service_removed(&self, project: &str, service: &str) {
        self.restarts
            .remove(&Self::service_labels(project, service));
    }

    pub(crate) fn set_host_maintenance(&self, state: &str, n: usize) {
        self.host_maintenance
            .get_or_create(&vec![("state".to_owned(), state.to_owned())])
            .set(n as i64);
    }

    pub(crate) fn set_hosts(&self, state: &str, n: usize) {
        self.hosts
            .get_or_create(&vec![("state".to_owned(), state.to_owned())])
            .set(n as i64);
    }
}
