//! `data_dir/jobs.json`: what the worker runs, so that a restarted worker re-adopts its
//! replicas. Written atomically (temporary file, fsync, rename, fsync of the directory),
//! always before the controller hears of the change it records.

use plugin_api::JobId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use xce_proto::worker::{Assignment, ExitCause};

/// The file format version this worker writes and reads.
const VERSION: u32 = 1;

/// One job the worker started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JobRecord {
    /// Job id.
    pub(crate) job: JobId,
    /// Process id (also the process group id).
    pub(crate) pid: u32,
    /// `/proc/<pid>/stat` field 22, so a recycled pid is never mistaken for the replica.
    pub(crate) start_time: u64,
    /// The assignment it was started from.
    pub(crate) assignment: Assignment,
    /// The sockets the launch plan declared (readiness probes connect to them).
    pub(crate) sockets: BTreeMap<String, SocketAddr>,
    /// The last readiness outcome reported.
    pub(crate) ready: bool,
    /// Set once the process has exited, until the controller acknowledged the `Exited`
    /// event; a restarted worker reports it again from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) exited: Option<ExitRecord>,
}

/// An exit not yet acknowledged by the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExitRecord {
    /// Exit code when known.
    pub(crate) code: Option<i32>,
    /// The signal that ended it, when one did (absent in files of older workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) signal: Option<i32>,
    /// The worker stopped it in its shutdown (written only when true, so the files of
    /// every other exit stay readable by older workers).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) worker_stopped: bool,
}

impl ExitRecord {
    /// The record of an exit as `cause` says (a start error is never recorded: such a job
    /// never had a process to re-adopt).
    pub(crate) fn of(cause: &ExitCause) -> Self {
        ExitRecord {
            code: cause.code,
            signal: cause.signal,
            worker_stopped: cause.worker_stopped,
        }
    }

    /// The cause it records.
    pub(crate) fn cause(self) -> ExitCause {
        ExitCause {
            code: self.code,
            signal: self.signal,
            error: None,
            worker_stopped: self.worker_stopped,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobsFile {
    version: u32,
    jobs: Vec<JobRecord>,
}

/// Why `jobs.json` could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum StateError {
    /// Reading or writing failed.
    // The cause is part of the message and deliberately not a `source`: error chains
    // (`{:#}`) would print it twice.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// The content is not a jobs file this worker understands.
    #[error("{path}: not a valid jobs file ({reason}); move it aside to start without re-adopting replicas")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Reads the jobs file; a missing file is an empty set.
pub(crate) fn load(path: &Path) -> Result<Vec<JobRecord>, StateError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(cause) => {
            return Err(StateError::Io {
                path: path.to_owned(),
                cause,
            })
        }
    };
    let invalid = |reason: String| StateError::Invalid {
        path: path.to_owned(),
        reason,
    };
    let file: JobsFile = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    if file.version != VERSION {
        return Err(invalid(format!("unsupported version {}", file.version)));
    }
    Ok(file.jobs)
}

/// Replaces the jobs file atomically: after a crash at any point it holds either the old
/// or the new set, never a torn one.
pub(crate) fn save(path: &Path, jobs: &[JobRecord]) -> Result<(), StateError> {
    let io = |cause| StateError::Io {
        path: path.to_owned(),
        cause,
    };
    let file = JobsFile {
        version: VERSION,
        jobs: jobs.to_vec(),
    };
    let body = serde_json::to_vec_pretty(&file).map_err(|e| io(std::io::Error::other(e)))?;
    xce_stdx::atomic_file::write_atomic(path, &body).map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use xce_proto::profile::{Probe, Readiness};
    use xce_proto::worker::Desired;

    fn record(job: &str, exited: Option<ExitRecord>) -> JobRecord {
        JobRecord {
            job: job.into(),
            pid: 4242,
            start_time: 987_654,
            assignment: Assignment {
                job: job.into(),
                service: "web".into(),
                project: "default".into(),
                replica: 0,
                command: vec!["sleep".into(), "1000".into()].into(),
                readiness: Some(std::sync::Arc::new(Readiness {
                    probe: Probe::Http {
                        socket: "http".into(),
                        path: "/healthz".into(),
                    },
                    interval: Duration::from_secs(1),
                    timeout: Duration::from_millis(500),
                    failure_threshold: 1,
                    success_threshold: 1,
                })),
                env: Default::default(),
                grants: [(
                    "ports".to_owned(),
                    serde_json::json!({"http": 20417}).into(),
                )]
                .into(),
                desired: Desired::Run,
            },
            sockets: [("http".to_owned(), "127.0.0.11:20417".parse().unwrap())].into(),
            ready: true,
            exited,
        }
    }

    fn check(jobs: Vec<JobRecord>, expect: expect_test::Expect) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.json");
        save(&path, &jobs).unwrap();
        assert_eq!(load(&path).unwrap(), jobs, "round trip");
        expect.assert_eq(&std::fs::read_to_string(&path).unwrap());
    }

    #[test]
    fn round_trips_running_and_exited_jobs() {
        check(
            vec![
                record("j-1", None),
                record(
                    "j-2",
                    Some(ExitRecord {
                        code: None,
                        signal: Some(9),
                        worker_stopped: false,
                    }),
                ),
            ],
            expect_test::expect![[r#"
                {
                  "version": 1,
                  "jobs": [
                    {
                      "job": "j-1",
                      "pid": 4242,
                      "start_time": 987654,
                      "assignment": {
                        "job": "j-1",
                        "service": "web",
                        "project": "default",
                        "replica": 0,
                        "command": [
                          "sleep",
                          "1000"
                        ],
                        "readiness": {
                          "probe": {
                            "http": {
                              "socket": "http",
                              "path": "/healthz"
                            }
                          },
                          "interval": 1000,
                          "timeout": 500,
                          "failure_threshold": 1,
                          "success_threshold": 1
                        },
                        "grants": {
                          "ports": {"http":20417}
                        },
                        "desired": "run"
                      },
                      "sockets": {
                        "http": "127.0.0.11:20417"
                      },
                      "ready": true
                    },
                    {
                      "job": "j-2",
                      "pid": 4242,
                      "start_time": 987654,
                      "assignment": {
                        "job": "j-2",
                        "service": "web",
                        "project": "default",
                        "replica": 0,
                        "command": [
                          "sleep",
                          "1000"
                        ],
                        "readiness": {
                          "probe": {
                            "http": {
                              "socket": "http",
                              "path": "/healthz"
                            }
                          },
                          "interval": 1000,
                          "timeout": 500,
                          "failure_threshold": 1,
                          "success_threshold": 1
                        },
                        "grants": {
                          "ports": {"http":20417}
                        },
                        "desired": "run"
                      },
                      "sockets": {
                        "http": "127.0.0.11:20417"
                      },
                      "ready": true,
                      "exited": {
                        "code": null,
                        "signal": 9
                      }
                    }
                  ]
                }"#]],
        );
    }

    #[test]
    fn missing_file_is_empty_and_garbage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.json");
        assert_eq!(load(&path).unwrap(), vec![]);
        std::fs::write(&path, "{\"version\": 9, \"jobs\": []}").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("unsupported version 9"), "{err}");
        std::fs::write(&path, "{").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("not a valid jobs file"), "{err}");
    }
}
