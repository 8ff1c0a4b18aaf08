//! `meta/events` as stored: the events of the last committed batch, for the followers of
//! a store (`xced apiserver` on etcd), in one of two shapes.
//!
//! - Format 2 and older: a JSON array of [`ClusterEvent`]s, each whole. A `job` event
//!   repeats the job's record, which the same batch writes anyway: in the controller
//!   bench this was 58 % of the bytes a placement wrote to etcd.
//! - Format 3: the same array, except that a `job` event whose job's record the same
//!   batch writes is a *reference* to it, `[rev, "job-id", "state", ready]`: the reader
//!   takes the rest of the job (service, host, grants, …) from the record written in the
//!   same etcd revision, and the state and readiness from the reference (a batch may
//!   carry several events of one job: `started`, then `ready`; the record holds only the
//!   last). Every other event stays whole (an ended job's record is deleted in its batch).
//!
//! A reader of format 2 meets a reference as an array where it expects an event object:
//! a decode error, which it treats as an event it does not understand (it fails closed);
//! `meta/format` = 3 in the store makes it refuse the store before that anyway.

use plugin_api::{ClusterEvent, JobId, JobInfo, JobState};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

/// The first format whose events refer to the job records of their batch.
pub const REFERENCING_FORMAT: u64 = 3;

/// One element of a stored events record: a whole event, or a reference to the job record
/// written in the same revision (format 3).
#[derive(Debug, Clone, PartialEq)]
pub enum StoredEvent {
    /// A whole event.
    Full(ClusterEvent),
    /// A `job` event of revision `rev` whose job, apart from `state` and `ready`, is the
    /// record of `job` written by the same batch.
    JobRef {
        rev: u64,
        job: JobId,
        state: JobState,
        ready: bool,
    },
}

/// Why a stored events record could not be turned into events.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// Not an events record this build reads (a newer release's, or damaged).
    #[error("an events record this build does not understand: {0}")]
    Decode(serde_json::Error),
    /// A reference to a job record that the same revision does not write: the history
    /// does not add up (the reader reloads instead of guessing).
    #[error("event {rev} refers to the record of job {job}, which its revision does not write")]
    Missing { rev: u64, job: JobId },
    /// The referenced job record does not decode.
    #[error("event {rev} refers to the record of job {job}, which is unreadable: {err}")]
    Record {
        rev: u64,
        job: JobId,
        err: serde_json::Error,
    },
}

/// Whether `a` and `b` are one job with the same everything but its state and readiness
/// (what a reference leaves to the record).
fn same_but_state(a: &JobInfo, b: &JobInfo) -> bool {
    a.job == b.job
        && a.service == b.service
        && a.project == b.project
        && a.replica == b.replica
        && a.host == b.host
        && a.generation == b.generation
        && a.grants == b.grants
}

/// The events record of a batch in `format`: whole events up to format 2; from
/// [`REFERENCING_FORMAT`] on, a job event whose job's record the batch writes refers to
/// it (`written(id)`: the job of the record the batch writes for job `id`, if any).
pub fn encode_events<'a>(
    events: &[ClusterEvent],
    written: impl Fn(&str) -> Option<&'a JobInfo>,
    format: u64,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 * events.len() + 2);
    out.push(b'[');
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let written = match e {
            ClusterEvent::Job { job, .. } if format >= REFERENCING_FORMAT => {
                written(&job.job).is_some_and(|info| same_but_state(info, job))
            }
            _ => false,
        };
        let res = match e {
            ClusterEvent::Job { rev, job } if written => {
                serde_json::to_writer(&mut out, &(rev, &job.job, job.state, job.ready))
            }
            e => serde_json::to_writer(&mut out, e),
        };
        res.expect("events serialize to JSON");
    }
    out.push(b']');
    out
}

/// Decodes an events record of any format this build reads, references unresolved.
pub fn decode_stored_events(bytes: &[u8]) -> Result<Vec<StoredEvent>, EventsError> {
    serde_json::from_slice(bytes).map_err(EventsError::Decode)
}

/// The job a stored job record holds (its other fields are not needed here).
#[derive(Deserialize)]
struct RecordInfo {
    info: JobInfo,
}

impl StoredEvent {
    /// Whether it refers to a job record.
    pub fn is_reference(&self) -> bool {
        matches!(self, StoredEvent::JobRef { .. })
    }

    /// The event's revision.
    pub fn rev(&self) -> u64 {
        match self {
            StoredEvent::Full(e) => e.rev(),
            StoredEvent::JobRef { rev, .. } => *rev,
        }
    }

    /// The event; a reference takes its job from `record(job id)`, the bytes of that job's
    /// record as written in the same revision (`None`: not written there).
    pub fn resolve<'a>(
        self,
        record: impl FnOnce(&str) -> Option<&'a [u8]>,
    ) -> Result<ClusterEvent, EventsError> {
        let (rev, job, state, ready) = match self {
            StoredEvent::Full(e) => return Ok(e),
            StoredEvent::JobRef {
                rev,
                job,
                state,
                ready,
            } => (rev, job, state, ready),
        };
        let Some(bytes) = record(&job) else {
            return Err(EventsError::Missing { rev, job });
        };
        let mut info = match serde_json::from_slice::<RecordInfo>(bytes) {
            Ok(r) => r.info,
            Err(err) => return Err(EventsError::Record { rev, job, err }),
        };
        if info.job != job {
            return Err(EventsError::Missing { rev, job });
        }
        info.state = state;
        info.ready = ready;
        Ok(ClusterEvent::Job { rev, job: info })
    }
}

/// Decodes an events record of any format this build reads and resolves its references
/// with `record` (see [`StoredEvent::resolve`]).
pub fn decode_events<'a>(
    bytes: &[u8],
    record: impl Fn(&str) -> Option<&'a [u8]>,
) -> Result<Vec<ClusterEvent>, EventsError> {
    decode_stored_events(bytes)?
        .into_iter()
        .map(|e| e.resolve(&record))
        .collect()
}

impl<'de> Deserialize<'de> for StoredEvent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StoredEvent;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an event object or a job reference [rev, job, state, ready]")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StoredEvent, A::Error> {
                ClusterEvent::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(StoredEvent::Full)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StoredEvent, A::Error> {
                let missing = |i| de::Error::invalid_length(i, &"a job reference of 4 elements");
                let rev = seq.next_element()?.ok_or_else(|| missing(0))?;
                let job = seq.next_element()?.ok_or_else(|| missing(1))?;
                let state = seq.next_element()?.ok_or_else(|| missing(2))?;
                let ready = seq.next_element()?.ok_or_else(|| missing(3))?;
                if seq.next_element::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::invalid_length(
                        5,
                        &"a job reference of 4 elements",
                    ));
                }
                Ok(StoredEvent::JobRef {
                    rev,
                    job,
                    state,
                    ready,
                })
            }
        }
        d.deserialize_any(V)
    }
}
