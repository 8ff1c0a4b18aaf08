//! A host's desired set as the controller keeps it: each job's entry points at the
//! model's own record (shared, not copied) and at its generation's command and probe
//! (one `Arc` per generation), and is written out as the wire's
//! [`Assignments`](xce_proto::worker::Assignments) only when a worker asks. A copy per job of
//! its grants, command and probe cost 2.4 KB a replica (a heap profile, 2,000 replicas).

use plugin_api::Grants;
use serde::{Serialize, Serializer};
use std::collections::BTreeMap;
use std::sync::Arc;
use xce_model::JobRec;
use xce_proto::profile::Readiness;
use xce_proto::worker::Desired;
#[cfg(test)]
use xce_proto::worker::{Assignment, Assignments};

/// A host's desired set and its index: serializes exactly as [`Assignments`](xce_proto::worker::Assignments).
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct HostAssignments {
    /// The host's assignment index (see [`Assignments::index`](xce_proto::worker::Assignments::index)).
    pub(crate) index: u64,
    /// The jobs, by job id.
    pub(crate) jobs: Vec<JobAssignment>,
}

/// One job of a host's desired set: serializes exactly as [`Assignment`](xce_proto::worker::Assignment).
#[derive(Debug, Clone)]
pub(crate) struct JobAssignment {
    /// The job's record (id, service, project, replica, grants), the model's `Arc`.
    pub(crate) rec: Arc<JobRec>,
    /// Its generation's argv.
    pub(crate) command: Arc<Vec<String>>,
    /// Its generation's readiness probe.
    pub(crate) readiness: Option<Arc<Readiness>>,
    /// Its generation's `[service.env]`.
    pub(crate) env: Arc<BTreeMap<String, String>>,
    /// Run or stop.
    pub(crate) desired: Desired,
}

/// The wire form, borrowed: field for field [`Assignment`](xce_proto::worker::Assignment) (a test holds them equal).
#[derive(Serialize)]
struct Wire<'a> {
    job: &'a str,
    service: &'a str,
    project: &'a str,
    replica: u32,
    command: &'a [String],
    readiness: Option<&'a Readiness>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    env: &'a BTreeMap<String, String>,
    grants: &'a Grants,
    desired: Desired,
}

// === impl HostAssignments ===

impl HostAssignments {
    /// Whether a worker would read the same jobs in both (the index aside).
    pub(crate) fn same_jobs(&self, jobs: &[JobAssignment]) -> bool {
        self.jobs.len() == jobs.len() && self.jobs.iter().zip(jobs).all(|(a, b)| a.same(b))
    }

    /// The wire form, owned (tests; the API serializes `self` directly).
    #[cfg(test)]
    pub(crate) fn to_wire(&self) -> Assignments {
        Assignments {
            index: self.index,
            jobs: self.jobs.iter().map(JobAssignment::to_wire).collect(),
        }
    }
}

// === impl JobAssignment ===

impl JobAssignment {
    fn wire(&self) -> Wire<'_> {
        let info = &self.rec.info;
        Wire {
            job: &info.job,
            service: &info.service,
            project: &info.project,
            replica: info.replica,
            command: &self.command,
            readiness: self.readiness.as_deref(),
            env: &self.env,
            grants: &info.grants,
            desired: self.desired,
        }
    }

    /// Whether both say the same to a worker (a job's state or readiness changing
    /// alone does not change what its worker is told).
    pub(crate) fn same(&self, o: &JobAssignment) -> bool {
        let (a, b) = (&self.rec.info, &o.rec.info);
        a.job == b.job
            && a.service == b.service
            && a.project == b.project
            && a.replica == b.replica
            && self.desired == o.desired
            && (Arc::ptr_eq(&self.command, &o.command) || self.command == o.command)
            && self.readiness == o.readiness
            && (Arc::ptr_eq(&self.env, &o.env) || self.env == o.env)
            && (Arc::ptr_eq(&self.rec, &o.rec) || a.grants == b.grants)
    }

    /// The wire form, owned.
    #[cfg(test)]
    pub(crate) fn to_wire(&self) -> Assignment {
        let info = &self.rec.info;
        Assignment {
            job: info.job.clone(),
            service: info.service.clone(),
            project: info.project.clone(),
            replica: info.replica,
            command: self.command.clone(),
            readiness: self.readiness.clone(),
            env: self.env.clone(),
            grants: info.grants.clone(),
            desired: self.desired,
        }
    }
}

impl Serialize for JobAssignment {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.wire().serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::{JobInfo, JobState};
    use std::time::Duration;
    use xce_proto::profile::Probe;

    fn job(id: &str, readiness: bool) -> JobAssignment {
        let info: JobInfo = serde_json::from_value(serde_json::json!({
            "job": id, "service": "web", "project": "team-a", "replica": 3,
            "generation": 2, "host": "exec-01", "state": "running", "ready": true,
            "grants": {"ports": {"http": 20417}, "address": {"ip": "10.0.0.7"}},
        }))
        .expect("a job info");
        assert_eq!(info.state, JobState::Running);
        JobAssignment {
            rec: Arc::new(JobRec {
                info,
                held: None,
                held_ready: None,
                log: Some("/var/log/x".into()),
            }),
            command: Arc::new(vec!["sh".into(), "-c".into(), "exec web".into()]),
            readiness: readiness.then(|| {
                Arc::new(Readiness {
                    probe: Probe::Http {
                        socket: "http".into(),
                        path: "/ready".into(),
                    },
                    interval: Duration::from_millis(200),
                    timeout: Duration::from_secs(3),
                    failure_threshold: 2,
                    success_threshold: 1,
                })
            }),
            // One job with variables, one without (absent on the wire).
            env: Arc::new(if readiness {
                BTreeMap::from([("RUST_LOG".to_owned(), "info".to_owned())])
            } else {
                BTreeMap::new()
            }),
            desired: Desired::Stop,
        }
    }

    /// The shared form writes the same bytes as the wire type, and reads back as it.
    #[test]
    fn serializes_exactly_as_the_wire_type() {
        let a = HostAssignments {
            index: 41,
            jobs: vec![job("j-7", true), job("j-8", false)],
        };
        let ours = serde_json::to_string(&a).unwrap();
        let wire = serde_json::to_string(&a.to_wire()).unwrap();
        assert_eq!(ours, wire);
        let back: Assignments = serde_json::from_str(&ours).unwrap();
        assert_eq!(back, a.to_wire());
        assert!(
            ours.contains("\"command\":[\"sh\",\"-c\",\"exec web\"]"),
            "{ours}"
        );
        assert_eq!(
            ours.matches("\"env\":{\"RUST_LOG\":\"info\"}").count(),
            1,
            "{ours}"
        );
    }

    /// Only what the worker reads counts as a change.
    #[test]
    fn a_change_the_worker_does_not_read_is_no_change() {
        let a = job("j-7", true);
        let mut ready_flipped = JobRec::clone(&a.rec);
        ready_flipped.info.ready = false;
        let b = JobAssignment {
            rec: Arc::new(ready_flipped),
            ..a.clone()
        };
        assert!(a.same(&b));
        let stop = JobAssignment {
            desired: Desired::Run,
            ..a.clone()
        };
        assert!(!a.same(&stop));
        let other_command = JobAssignment {
            command: Arc::new(vec!["true".into()]),
            ..a.clone()
        };
        assert!(!a.same(&other_command));
        let other_env = JobAssignment {
            env: Arc::new(BTreeMap::new()),
            ..a.clone()
        };
        assert!(!a.same(&other_env));
        let mut regranted = JobRec::clone(&a.rec);
        regranted.info.grants.remove("address");
        assert!(!a.same(&JobAssignment {
            rec: Arc::new(regranted),
            ..a.clone()
        }));
    }
}
