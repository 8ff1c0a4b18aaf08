//! The recorded history of one run: what the clients did and were answered, what every
//! reader was handed, what the replicas themselves logged, which faults were injected and
//! when. Every timestamp is CLOCK_MONOTONIC in nanoseconds, the clock every process on the
//! machine shares: the suite, the replicas (python's `time.monotonic_ns()`) and the
//! nemesis stamp events on one timeline, so "after its SIGTERM" means the same thing in
//! all of them.
//!
//! The validators (`validators.rs`) are pure functions of a [`History`]; the recorder
//! only appends.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// CLOCK_MONOTONIC, nanoseconds.
pub type Ns = u64;

/// One second in [`Ns`].
pub const SEC: Ns = 1_000_000_000;

/// A client's write: call and return times, and the answer (`None`: no answer, so the
/// write may or may not have happened — Jepsen's indeterminate operation).
#[derive(Debug, Clone, Serialize)]
pub struct Op {
    pub call_ns: Ns,
    pub ret_ns: Ns,
    /// `submit`, `update`, `broken-update`, `scale`, `restart`, `stop`.
    pub kind: String,
    pub service: String,
    pub status: Option<u16>,
    /// The replica count the write asks for (`submit`, `update`, `scale`).
    pub replicas: Option<u32>,
}

impl Op {
    /// The write was acknowledged (a 2xx answer).
    pub fn acked(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// How a reader got an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ReadKind {
    /// `GET /v1/services/{name}/endpoints` (JSON).
    Get,
    /// `?format=plain`.
    Plain,
    /// `?index=N&wait=…`.
    Blocking,
    /// `GET /v1/services/{name}/endpoints/stream`.
    Stream,
    /// `GET /v1/endpoints/stream`.
    AllStream,
}

/// What one reader was handed: one answer, or one stream event.
#[derive(Debug, Clone, Serialize)]
pub struct Read {
    pub reader: String,
    pub kind: ReadKind,
    /// The request, or the stream connection, this came on (unique in a run).
    pub conn: u64,
    /// When the request was sent (streams: when the connection was opened).
    pub call_ns: Ns,
    /// When the answer, or the event, was handed to the reader.
    pub ret_ns: Ns,
    pub service: String,
    /// The entry's index (the cluster revision of the service's last change).
    pub index: u64,
    /// The SSE event id, when the event carried one.
    pub event_id: Option<u64>,
    /// A blocking query's `index=N`, a stream's `Last-Event-ID`.
    pub asked: Option<u64>,
    /// The ready endpoints, as `address:port` of port `http`.
    pub endpoints: Vec<String>,
    pub deleted: bool,
    /// An `event: reset` came before this event on its connection: a fresh snapshot.
    pub after_reset: bool,
}

/// A line a replica process wrote itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ReplicaKind {
    /// Bound its port and serves.
    Start,
    /// Got SIGTERM.
    Sigterm,
    /// Exits now (after a SIGTERM, or by itself: a crash).
    Exit,
    /// Its port was taken when it tried to bind it (it exits at once).
    BindFail,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReplicaLine {
    pub ns: Ns,
    pub kind: ReplicaKind,
    pub service: String,
    pub job: String,
    /// `address:port` of its `http` port.
    pub addr: String,
    pub pid: u32,
}

/// A replica process found gone (no `/proc/<pid>`) by the suite's sampler: the end of a
/// process killed without a word (SIGKILL after an ignored SIGTERM, a killed worker's).
#[derive(Debug, Clone, Serialize)]
pub struct Gone {
    pub pid: u32,
    pub ns: Ns,
}

/// A replica's address as first seen assigned (placed, not yet ready, ready or on its
/// way out) on the all-services stream with `include=all`.
#[derive(Debug, Clone, Serialize)]
pub struct Assign {
    pub ns: Ns,
    pub service: String,
    pub job: String,
    pub addr: String,
}

/// One listening socket as `ss -ltnHp` / `ss -lunHp` saw it on a host address of the
/// cluster: its protocol, address and the processes holding it.
#[derive(Debug, Clone, Serialize)]
pub struct SockSample {
    pub ns: Ns,
    /// `tcp` or `udp`.
    pub proto: &'static str,
    pub addr: String,
    pub pids: Vec<u32>,
}

/// A host's port pool as `GET /v1/hosts` answered it: how many ports it holds.
#[derive(Debug, Clone, Serialize)]
pub struct PoolSample {
    pub call_ns: Ns,
    pub ret_ns: Ns,
    /// The host's address (the replicas' addresses start with it).
    pub ip: String,
    pub used: u64,
}

/// One request of the load client to an endpoint it was handed.
#[derive(Debug, Clone, Serialize)]
pub struct Request {
    pub call_ns: Ns,
    pub ret_ns: Ns,
    pub addr: String,
    /// When the endpoint list this address came from was handed to the client.
    pub list_ns: Ns,
    pub ok: bool,
    pub error: String,
}

/// One injected fault, from its start to its end (when it was undone).
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    pub start_ns: Ns,
    pub end_ns: Ns,
    /// `kill9`, `pause`, `sigterm-ignored`, `crash-loop`, …
    pub kind: String,
    /// The daemon or service it hit.
    pub target: String,
}

impl Fault {
    /// A fault of the cluster's daemons (not a service's own behaviour, like the
    /// crash-looping service, which lasts the whole run).
    pub fn of_daemons(&self) -> bool {
        self.kind != "crash-loop"
    }
}

/// The service list as the suite sampled it (for the rollout validator).
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub ns: Ns,
    pub service: String,
    pub replicas: u32,
    pub max_unavailable: u32,
    pub ready: u32,
    /// The rollout's state: `progressing`, `complete`, `failed`, `reverted`.
    pub rollout: String,
    pub generation: u64,
}

/// The cluster once the faults stopped and it converged (or the wait gave up).
#[derive(Debug, Clone, Serialize, Default)]
pub struct Final {
    /// When the last fault ended.
    pub faults_end_ns: Ns,
    /// When every service had what its last acknowledged write asked for (`None`: never,
    /// within the wait).
    pub converged_ns: Option<Ns>,
    /// Each service: (replicas, ready, rollout state).
    pub services: BTreeMap<String, (u32, u32, String)>,
}

/// Everything one run recorded.
#[derive(Debug, Clone, Default, Serialize)]
pub struct History {
    pub ops: Vec<Op>,
    pub reads: Vec<Read>,
    pub replicas: Vec<ReplicaLine>,
    pub gone: Vec<Gone>,
    pub assigns: Vec<Assign>,
    pub pools: Vec<PoolSample>,
    pub socks: Vec<SockSample>,
    pub requests: Vec<Request>,
    pub faults: Vec<Fault>,
    pub samples: Vec<Sample>,
    pub fin: Option<Final>,
}

impl History {
    /// Parses the replicas' shared log: `<kind> <ns> <service> <job> <addr> <pid>` a line
    /// (lines a process had not finished writing when it was killed are skipped).
    pub fn add_replica_log(&mut self, text: &str) {
        for l in text.lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            let [kind, ns, service, job, addr, pid] = w[..] else {
                continue;
            };
            let kind = match kind {
                "start" => ReplicaKind::Start,
                "sigterm" => ReplicaKind::Sigterm,
                "exit" => ReplicaKind::Exit,
                "bindfail" => ReplicaKind::BindFail,
                _ => continue,
            };
            let (Ok(ns), Ok(pid)) = (ns.parse(), pid.parse()) else {
                continue;
            };
            self.replicas.push(ReplicaLine {
                ns,
                kind,
                service: service.to_owned(),
                job: job.to_owned(),
                addr: addr.to_owned(),
                pid,
            });
        }
        self.replicas.sort_by_key(|r| r.ns);
    }

    /// Every replica process: its lifetime and what it logged, in the order they bound
    /// their ports (those that never did first).
    pub fn processes(&self) -> Vec<Process> {
        // By pid and job: pids wrap around within a long run.
        let mut by_pid: BTreeMap<(u32, &str), Process> = BTreeMap::new();
        for r in &self.replicas {
            let p = by_pid.entry((r.pid, &r.job)).or_insert_with(|| Process {
                pid: r.pid,
                service: r.service.clone(),
                job: r.job.clone(),
                addr: r.addr.clone(),
                start_ns: None,
                sigterm_ns: None,
                end_ns: None,
                crashed: false,
            });
            match r.kind {
                ReplicaKind::Start => p.start_ns = Some(r.ns),
                ReplicaKind::Sigterm => {
                    p.sigterm_ns = Some(p.sigterm_ns.map_or(r.ns, |s| s.min(r.ns)));
                }
                ReplicaKind::Exit | ReplicaKind::BindFail => {
                    p.end_ns = Some(p.end_ns.map_or(r.ns, |e| e.min(r.ns)));
                    p.crashed = p.sigterm_ns.is_none() && r.kind == ReplicaKind::Exit;
                }
            }
        }
        for g in &self.gone {
            let of_pid = by_pid
                .values_mut()
                .filter(|p| p.pid == g.pid && p.start_ns.is_some_and(|s| s <= g.ns));
            if let Some(p) = of_pid.max_by_key(|p| p.start_ns) {
                // A process that wrote a line after the sample was alive then: the sample
                // is wrong (its pid was briefly unreadable), not the process's end.
                let later_line = self
                    .replicas
                    .iter()
                    .any(|r| r.pid == p.pid && r.job == p.job && r.ns > g.ns);
                if p.end_ns.is_none() && !later_line {
                    p.end_ns = Some(g.ns);
                    // Killed without a word: a SIGKILL after an ignored SIGTERM is not a
                    // crash, a killed worker's replica is.
                    p.crashed = p.sigterm_ns.is_none();
                }
            }
        }
        let mut all: Vec<Process> = by_pid.into_values().collect();
        all.sort_by_key(|p| p.start_ns);
        all
    }
}

/// One replica process, as its own log lines (and the sampler) tell it.
#[derive(Debug, Clone, Serialize)]
pub struct Process {
    pub pid: u32,
    pub service: String,
    pub job: String,
    pub addr: String,
    /// `None`: it never bound its port (a bind failure).
    pub start_ns: Option<Ns>,
    pub sigterm_ns: Option<Ns>,
    /// Its exit line, or when the sampler found it gone; `None`: alive at the end.
    pub end_ns: Option<Ns>,
    /// It ended without a SIGTERM before (a crash, or killed with its worker).
    pub crashed: bool,
}

impl Process {
    /// Held its port at `t` (bound it at or before `t`, had not ended).
    pub fn holds_at(&self, t: Ns) -> bool {
        self.start_ns.is_some_and(|s| s <= t) && self.end_ns.is_none_or(|e| t < e)
    }
}

/// The recorder every traffic task, reader and nemesis appends to.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<History>>);

impl Recorder {
    pub fn with<R>(&self, f: impl FnOnce(&mut History) -> R) -> R {
        f(&mut self.0.lock().expect("recorder lock"))
    }

    pub fn snapshot(&self) -> History {
        self.with(|h| h.clone())
    }
}
