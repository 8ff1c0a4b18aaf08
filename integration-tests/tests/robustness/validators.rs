//! The validators: each a pure function of a recorded [`History`], returning what it found
//! wrong. The windows the contract allows are stated in [`Windows`]; everything outside
//! them is a violation.

use crate::history::{History, Ns, Process, Read, ReadKind, ReplicaKind, SEC};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// One thing a validator found wrong.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    pub validator: &'static str,
    pub at_ns: Ns,
    pub what: String,
    /// The services and addresses involved: the report prints the history around them.
    pub keys: Vec<String>,
}

/// The windows the contract allows, in nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct Windows {
    /// After a replica ends without a SIGTERM (a crash, a killed worker's replica), how
    /// long a reader may still be handed it and a request to it may fail: the worker
    /// reports the exit at once ("a replica's exit takes it out at once"), this covers
    /// the report's trip and a loaded machine. A fault running at the end stretches it to
    /// the fault's end plus this.
    pub crash: Ns,
    /// How old an endpoint list may be and still be trusted by the load client: the
    /// service's `drain` (the time between leaving the endpoint and SIGTERM).
    pub drain: Ns,
    /// After the last fault, how long the cluster may take to converge (liveness).
    pub converge: Ns,
    /// Rollout samples this close to a fault, a crash or a scale of the service are not
    /// the rollout's own doing and are not judged.
    pub settle: Ns,
}

impl Default for Windows {
    fn default() -> Self {
        Self {
            crash: 5 * SEC,
            // The drain of the suite's services (`traffic::DRAIN`).
            drain: SEC,
            converge: 60 * SEC,
            settle: 10 * SEC,
        }
    }
}

/// Runs every validator.
pub fn all(h: &History, w: &Windows) -> Vec<Violation> {
    let mut v = Vec::new();
    v.extend(handed_after_sigterm_or_exit(h, w));
    v.extend(one_holder_per_port(h));
    v.extend(ordered_and_gapless(h));
    v.extend(rollouts_keep_availability(h, w));
    v.extend(nothing_lost_and_converged(h, w));
    v.extend(requests_only_fail_when_allowed(h, w));
    v
}

/// The end of the window after `p`'s crash: `crash` after it, or after a fault that was
/// running then.
fn crash_window_end(h: &History, w: &Windows, end: Ns) -> Ns {
    let mut until = end + w.crash;
    for f in h.faults.iter().filter(|f| f.of_daemons()) {
        if f.start_ns <= until && f.end_ns >= end {
            until = until.max(f.end_ns + w.crash);
        }
    }
    until
}

/// `p` may be handed out at `t` (a lower bound of when the answer was made).
fn may_be_handed(h: &History, w: &Windows, p: &Process, t: Ns) -> bool {
    if p.sigterm_ns.is_some_and(|s| s < t) {
        return false;
    }
    match p.end_ns {
        Some(e) if e < t => p.crashed && t <= crash_window_end(h, w, e),
        _ => true,
    }
}

/// Validator 1: no reader was handed an endpoint after its process got SIGTERM (the drain
/// takes it out of every endpoint first), nor after it exited (beyond [`Windows::crash`]
/// for an exit nobody asked for). An answer is judged by the earliest moment it can have
/// been made: a request's call time, a stream event's connection time.
pub fn handed_after_sigterm_or_exit(h: &History, w: &Windows) -> Vec<Violation> {
    let procs = h.processes();
    let mut by_addr: BTreeMap<&str, Vec<&Process>> = BTreeMap::new();
    for p in &procs {
        by_addr.entry(p.addr.as_str()).or_default().push(p);
    }
    let mut out = Vec::new();
    for r in &h.reads {
        for addr in &r.endpoints {
            // The processes that had bound this address before the reader got it.
            let holders: Vec<&&Process> = by_addr
                .get(addr.as_str())
                .into_iter()
                .flatten()
                .filter(|p| p.start_ns.is_some_and(|s| s <= r.ret_ns))
                .collect();
            if holders.is_empty() || holders.iter().any(|p| may_be_handed(h, w, p, r.call_ns)) {
                continue;
            }
            let p = holders.last().expect("not empty");
            out.push(Violation {
                validator: "1-handed-after-sigterm",
                at_ns: r.ret_ns,
                what: format!(
                    "{} ({:?}, conn {}) was handed {addr} of {} pid {} at index {}: asked at {}, its SIGTERM {:?}, its end {:?}",
                    r.reader, r.kind, r.conn, p.service, p.pid, r.index, r.call_ns, p.sigterm_ns, p.end_ns
                ),
                keys: vec![addr.clone(), r.service.clone()],
            });
        }
    }
    out
}

/// Validator 2: no two live processes held one address, and no address was handed to a
/// replica while another still held it. A replica that finds its port taken when it
/// binds logs `bindfail`; an address first seen assigned to a job (the all-services
/// stream with `include=all`) while a process of another job still held it was handed
/// out too early, whether or not the new replica got to bind yet.
pub fn one_holder_per_port(h: &History) -> Vec<Violation> {
    let procs = h.processes();
    let mut out = Vec::new();
    out.extend(pool_counts_every_holder(h, &procs));
    out.extend(sockets_have_one_holder(h, &procs));
    for a in &h.assigns {
        if let Some(p) = procs
            .iter()
            .find(|p| p.addr == a.addr && p.job != a.job && p.holds_at(a.ns))
        {
            out.push(Violation {
                validator: "2-one-holder-per-port",
                at_ns: a.ns,
                what: format!(
                    "{} job {} was assigned {} while {} job {} pid {} held it (started {:?}, SIGTERM {:?})",
                    a.service, a.job, a.addr, p.service, p.job, p.pid, p.start_ns, p.sigterm_ns
                ),
                keys: vec![a.addr.clone(), a.service.clone(), p.service.clone()],
            });
        }
    }
    for f in h
        .replicas
        .iter()
        .filter(|r| r.kind == ReplicaKind::BindFail)
    {
        if let Some(p) = procs
            .iter()
            .find(|p| p.addr == f.addr && p.pid != f.pid && p.holds_at(f.ns))
        {
            out.push(Violation {
                validator: "2-one-holder-per-port",
                at_ns: f.ns,
                what: format!(
                    "{} job {} pid {} was given {} while {} job {} pid {} held it (started {:?}, SIGTERM {:?})",
                    f.service, f.job, f.pid, f.addr, p.service, p.job, p.pid, p.start_ns, p.sigterm_ns
                ),
                keys: vec![f.addr.clone(), f.service.clone(), p.service.clone()],
            });
        }
    }
    out
}

/// Part of validator 2, from the kernel's side (`ss` samples): no address is held by
/// processes of two jobs at once, and no address is assigned to a job while a process of
/// another job that bound it before the assignment still holds it when sampled after it.
fn sockets_have_one_holder(h: &History, procs: &[Process]) -> Vec<Violation> {
    // The process behind a pid at `t`: the latest of ours with that pid started by then.
    let of_pid = |pid: u32, t: Ns| {
        procs
            .iter()
            .filter(|p| p.pid == pid && p.start_ns.is_some_and(|s| s <= t))
            .max_by_key(|p| p.start_ns)
    };
    let mut out = Vec::new();
    for s in &h.socks {
        let holders: Vec<&Process> = s.pids.iter().filter_map(|&pid| of_pid(pid, s.ns)).collect();
        let jobs: std::collections::BTreeSet<&str> =
            holders.iter().map(|p| p.job.as_str()).collect();
        if jobs.len() > 1 {
            out.push(Violation {
                validator: "2-one-holder-per-port",
                at_ns: s.ns,
                what: format!(
                    "ss saw {} {} held by the jobs {jobs:?} at once",
                    s.proto, s.addr
                ),
                keys: vec![s.addr.clone()],
            });
        }
        let assigned = h
            .assigns
            .iter()
            .filter(|a| a.addr == s.addr && a.ns <= s.ns);
        for a in assigned {
            if let Some(p) = holders
                .iter()
                .find(|p| p.job != a.job && p.start_ns.is_some_and(|st| st < a.ns))
            {
                out.push(Violation {
                    validator: "2-one-holder-per-port",
                    at_ns: s.ns,
                    what: format!(
                        "{} job {} was assigned {} at {} while {} job {} pid {} (bound it at {:?}) held it, as ss saw at {}",
                        a.service, a.job, a.addr, a.ns, p.service, p.job, p.pid, p.start_ns, s.ns
                    ),
                    keys: vec![a.addr.clone(), a.service.clone(), p.service.clone()],
                });
            }
        }
    }
    out
}

/// Part of validator 2: a host's pool never holds fewer ports than our processes that
/// held an address of that host all through the pool's answer (a port released before
/// its process exited can be handed out again while it is still held).
fn pool_counts_every_holder(h: &History, procs: &[Process]) -> Vec<Violation> {
    let mut out = Vec::new();
    for s in &h.pools {
        let prefix = format!("{}:", s.ip);
        let holders: Vec<&Process> = procs
            .iter()
            .filter(|p| {
                p.addr.starts_with(&prefix) && p.holds_at(s.call_ns) && p.holds_at(s.ret_ns)
            })
            .collect();
        if holders.len() as u64 > s.used {
            let names: Vec<String> = holders
                .iter()
                .map(|p| format!("{} {} pid {}", p.service, p.addr, p.pid))
                .collect();
            out.push(Violation {
                validator: "2-one-holder-per-port",
                at_ns: s.ret_ns,
                what: format!(
                    "host {}'s pool held {} ports while {} processes held its addresses: {}",
                    s.ip,
                    s.used,
                    holders.len(),
                    names.join(", ")
                ),
                keys: holders.iter().map(|p| p.addr.clone()).collect(),
            });
        }
    }
    out
}

/// Validator 3: every reader sees each service's index only grow (requests, blocking
/// queries, streams and their resumes alike), stream event ids grow within a
/// connection, and the all-services stream's promise holds: once a reader has event id
/// `X`, it has every service's newest state up to revision `X` (no revision skipped,
/// none lost on a resume with `Last-Event-ID`).
pub fn ordered_and_gapless(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut reads: Vec<_> = h.reads.iter().collect();
    reads.sort_by_key(|r| r.ret_ns);
    // Per reader and service: the newest index it has seen; per connection: the last id.
    let mut seen: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut last_id: BTreeMap<u64, u64> = BTreeMap::new();
    for r in &reads {
        let key = (r.reader.as_str(), r.service.as_str());
        if r.after_reset {
            seen.retain(|(reader, _), _| *reader != r.reader);
        }
        if let Some(&prev) = seen.get(&key) {
            if r.index < prev {
                out.push(Violation {
                    validator: "3-index-went-backwards",
                    at_ns: r.ret_ns,
                    what: format!(
                        "{} ({:?}, conn {}) had {} at index {prev}, then was handed index {}",
                        r.reader, r.kind, r.conn, r.service, r.index
                    ),
                    keys: vec![r.service.clone()],
                });
            }
        }
        seen.insert(key, r.index.max(seen.get(&key).copied().unwrap_or(0)));
        if let Some(id) = r.event_id {
            let strict = r.kind == ReadKind::Stream;
            if let Some(&prev) = last_id.get(&r.conn) {
                if id < prev || (strict && id == prev) {
                    out.push(Violation {
                        validator: "3-stream-out-of-order",
                        at_ns: r.ret_ns,
                        what: format!("{} conn {}: event id {id} after {prev}", r.reader, r.conn),
                        keys: vec![r.service.clone()],
                    });
                }
            }
            last_id.insert(r.conn, id);
        }
    }
    out.extend(all_stream_gaps(h));
    out
}

/// The all-services stream's "`Last-Event-ID: X` means I have everything up to `X`":
/// once a reader is done (the run let it go on in the converged cluster), its newest index
/// of every service whose last change (as any reader saw it) is within the last event id
/// it got is that last change. The stream may fold a service's changes into its newest
/// one (a slow reader skips states, and a folded change comes later, at its newest
/// revision), so this is judged at the reader's end and only for services that stopped
/// changing before it: a last change skipped is a change lost for good.
fn all_stream_gaps(h: &History) -> Vec<Violation> {
    let mut known: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for r in &h.reads {
        known.entry(r.service.as_str()).or_default().insert(r.index);
    }
    let mut by_reader: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for r in h.reads.iter().filter(|r| r.kind == ReadKind::AllStream) {
        by_reader.entry(r.reader.as_str()).or_default().push(r);
    }
    let mut out = Vec::new();
    for (reader, mut events) in by_reader {
        events.sort_by_key(|r| r.ret_ns);
        let mut state: BTreeMap<&str, u64> = BTreeMap::new();
        let mut last = None;
        for e in events {
            if e.after_reset {
                state.clear();
            }
            let s = state.entry(e.service.as_str()).or_insert(0);
            *s = (*s).max(e.index);
            if let Some(id) = e.event_id {
                last = Some((id.max(last.map_or(0, |l: (u64, &Read)| l.0)), e));
            }
        }
        let Some((x, e)) = last else { continue };
        for (service, revs) in &known {
            // A service that changed after `x` may have its earlier changes folded into
            // an event the reader did not get to: only a service whose last change is
            // within `x` is judged, and it must be there.
            let Some(&want) = revs.last().filter(|&&w| w <= x) else {
                continue;
            };
            let have = state.get(service).copied().unwrap_or(0);
            if have < want {
                out.push(Violation {
                    validator: "3-all-stream-gap",
                    at_ns: e.ret_ns,
                    what: format!(
                        "{reader} ended at event id {x} (conn {}) with {service} at index {have}, but {service} changed at revision {want}",
                        e.conn
                    ),
                    keys: vec![(*service).to_owned()],
                });
            }
        }
    }
    out
}

/// Validator 4: a rollout never takes ready replicas below `replicas - max_unavailable` by
/// its own actions (samples near a fault, a crash of the service's replica or a scale or
/// submit of it are not the rollout's doing), and a broken update is seen reverted
/// (unless another change of the profile came first).
pub fn rollouts_keep_availability(h: &History, w: &Windows) -> Vec<Violation> {
    let procs = h.processes();
    let disturbed = |service: &str, t: Ns| {
        h.faults
            .iter()
            .filter(|f| f.of_daemons())
            .any(|f| f.start_ns <= t + w.settle && t <= f.end_ns + w.settle)
            || procs.iter().any(|p| {
                p.service == service
                    && p.crashed
                    && p.end_ns
                        .is_some_and(|e| e <= t + w.settle && t <= e + w.settle)
            })
            || h.ops.iter().any(|o| {
                o.service == service
                    && matches!(o.kind.as_str(), "scale" | "submit" | "stop")
                    && o.call_ns <= t
                    && t <= o.ret_ns + w.settle
            })
    };
    let mut out = Vec::new();
    for s in &h.samples {
        let floor = s.replicas.saturating_sub(s.max_unavailable);
        if s.rollout == "progressing"
            && s.generation > 1
            && s.ready < floor
            && !disturbed(&s.service, s.ns)
        {
            out.push(Violation {
                validator: "4-rollout-below-floor",
                at_ns: s.ns,
                what: format!(
                    "{} generation {}: {} ready of {} replicas (max_unavailable {}) while its rollout progressed",
                    s.service, s.generation, s.ready, s.replicas, s.max_unavailable
                ),
                keys: vec![s.service.clone()],
            });
        }
    }
    for o in h
        .ops
        .iter()
        .filter(|o| o.kind == "broken-update" && o.acked())
    {
        // Judged when nothing changed the service's profile after it (a scale may).
        let later = h.ops.iter().any(|l| {
            l.service == o.service
                && l.call_ns > o.call_ns
                && matches!(
                    l.kind.as_str(),
                    "update" | "broken-update" | "stop" | "restart"
                )
        });
        let reverted = h
            .samples
            .iter()
            .any(|s| s.service == o.service && s.ns > o.call_ns && s.rollout == "reverted");
        if !later && !reverted {
            out.push(Violation {
                validator: "4-broken-update-not-reverted",
                at_ns: o.ret_ns,
                what: format!("{}: its broken update was never seen reverted", o.service),
                keys: vec![o.service.clone()],
            });
        }
    }
    out
}

/// What the last acknowledged write of each service asked for: `Some(replicas)`, or
/// `None` for stopped. Services whose last write got no answer may be either way and are
/// left out.
pub fn expected_state(h: &History) -> BTreeMap<String, Option<u32>> {
    let mut ops: Vec<_> = h.ops.iter().collect();
    ops.sort_by_key(|o| o.call_ns);
    let mut want: BTreeMap<String, Option<Option<u32>>> = BTreeMap::new();
    for o in ops {
        let prev = want.get(&o.service).cloned().flatten();
        let next = match (o.acked(), o.status) {
            (true, _) => match o.kind.as_str() {
                "stop" => Some(None),
                "restart" => prev,
                _ => o.replicas.map(Some).or(prev),
            },
            // Refused: no change. No answer: unknown from here on.
            (false, Some(_)) => prev,
            (false, None) => None,
        };
        want.insert(o.service.clone(), next);
    }
    want.into_iter()
        .filter_map(|(s, w)| w.map(|w| (s, w)))
        .collect()
}

/// A service the nemesis made crash-loop: it never settles, by design.
pub fn crash_looping(h: &History, service: &str) -> bool {
    h.faults
        .iter()
        .any(|f| f.kind == "crash-loop" && f.target == service)
}

/// Validator 5: every acknowledged write is there once the faults stopped (a stopped
/// service is gone, a running one has the replicas its last write asked for, all ready),
/// and the cluster got there within [`Windows::converge`] of the last fault.
pub fn nothing_lost_and_converged(h: &History, w: &Windows) -> Vec<Violation> {
    let Some(fin) = &h.fin else {
        return vec![Violation {
            validator: "5-no-final-state",
            at_ns: 0,
            what: "the run recorded no final state".into(),
            keys: vec![],
        }];
    };
    let mut out = Vec::new();
    for (service, want) in expected_state(h) {
        if crash_looping(h, &service) {
            continue;
        }
        let have = fin.services.get(&service);
        let ok = match (want, have) {
            (None, None) => true,
            (Some(n), Some((replicas, ready, _))) => *replicas == n && *ready == n,
            _ => false,
        };
        if !ok {
            out.push(Violation {
                validator: "5-write-lost",
                at_ns: fin.converged_ns.unwrap_or(fin.faults_end_ns),
                what: format!(
                    "{service}: the last acknowledged write asked for {want:?} replicas, the cluster has (replicas, ready, rollout) {have:?}"
                ),
                keys: vec![service.clone()],
            });
        }
    }
    match fin.converged_ns {
        Some(c) if c.saturating_sub(fin.faults_end_ns) <= w.converge => {}
        c => out.push(Violation {
            validator: "5-not-converged",
            at_ns: fin.faults_end_ns,
            what: format!(
                "not converged within {} s of the last fault (converged at {c:?})",
                w.converge / SEC
            ),
            keys: vec![],
        }),
    }
    out
}

/// Validator 6: requests the load client sent to endpoints it was handed fail only inside
/// the windows the contract allows: the list was older than the drain, or the replica at
/// that address ended without a SIGTERM (crash window), or no replica of ours ever held
/// it (the list came from before the suite's replicas logged). A request that timed out
/// while its replica lived with no SIGTERM met a slow replica (a loaded machine), which
/// is not the endpoint's fault.
pub fn requests_only_fail_when_allowed(h: &History, w: &Windows) -> Vec<Violation> {
    let procs = h.processes();
    let mut out = Vec::new();
    for q in h.requests.iter().filter(|q| !q.ok) {
        if q.call_ns.saturating_sub(q.list_ns) > w.drain {
            continue;
        }
        let holders: Vec<&Process> = procs
            .iter()
            .filter(|p| p.addr == q.addr && p.start_ns.is_some_and(|s| s <= q.call_ns))
            .collect();
        let Some(p) = holders.last() else { continue };
        let crashed_then = p.crashed
            && p.end_ns
                .is_some_and(|e| e <= q.ret_ns && q.call_ns <= crash_window_end(h, w, e));
        let paused = h.faults.iter().any(|f| {
            f.kind == "pause-replica"
                && f.target == p.addr
                && f.start_ns <= q.ret_ns
                && q.call_ns <= f.end_ns
        });
        // Slow, not gone: a timeout while its replica lived with no SIGTERM.
        let slow = q.error.starts_with("timeout")
            && p.sigterm_ns.is_none_or(|s| s > q.ret_ns)
            && p.end_ns.is_none_or(|e| e > q.ret_ns);
        if crashed_then || paused || slow {
            continue;
        }
        out.push(Violation {
            validator: "6-request-failed",
            at_ns: q.call_ns,
            what: format!(
                "a request to {} (list {} ms old) failed: {}; its replica {} pid {}: SIGTERM {:?}, end {:?}",
                q.addr,
                q.call_ns.saturating_sub(q.list_ns) / 1_000_000,
                q.error,
                p.service,
                p.pid,
                p.sigterm_ns,
                p.end_ns
            ),
            keys: vec![q.addr.clone(), p.service.clone()],
        });
    }
    out
}

#[cfg(test)]
mod tests;
