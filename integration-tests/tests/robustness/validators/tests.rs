//! Each validator on small hand-made histories: one that keeps the rule (no violation)
//! and ones that break it (the validator names it).

use super::*;
use crate::history::{Fault, Final, Op, Read, ReadKind, ReplicaKind, ReplicaLine, Request, Sample};

const S: Ns = SEC;

fn line(ns: Ns, kind: ReplicaKind, addr: &str, pid: u32) -> ReplicaLine {
    ReplicaLine {
        ns,
        kind,
        service: "web".into(),
        job: format!("j-{pid}"),
        addr: addr.into(),
        pid,
    }
}

fn read(kind: ReadKind, conn: u64, call: Ns, ret: Ns, index: u64, eps: &[&str]) -> Read {
    Read {
        reader: format!("r{conn}"),
        kind,
        conn,
        call_ns: call,
        ret_ns: ret,
        service: "web".into(),
        index,
        event_id: None,
        asked: None,
        endpoints: eps.iter().map(|e| (*e).to_owned()).collect(),
        deleted: false,
        after_reset: false,
    }
}

fn fired(v: &[Violation], name: &str) -> bool {
    v.iter().any(|x| x.validator == name)
}

/// A drained replica: SIGTERM at 10 s, exit at 11 s.
fn drained() -> History {
    History {
        replicas: vec![
            line(S, ReplicaKind::Start, "10.0.0.1:2000", 7),
            line(10 * S, ReplicaKind::Sigterm, "10.0.0.1:2000", 7),
            line(11 * S, ReplicaKind::Exit, "10.0.0.1:2000", 7),
        ],
        ..History::default()
    }
}

#[test]
fn v1_an_endpoint_handed_before_the_sigterm_is_fine_after_it_is_not() {
    let w = Windows::default();
    let mut h = drained();
    h.reads.push(read(
        ReadKind::Plain,
        1,
        9 * S,
        10 * S + 1,
        5,
        &["10.0.0.1:2000"],
    ));
    assert!(handed_after_sigterm_or_exit(&h, &w).is_empty());
    h.reads.push(read(
        ReadKind::Plain,
        2,
        10 * S + 1,
        10 * S + 2,
        5,
        &["10.0.0.1:2000"],
    ));
    let v = handed_after_sigterm_or_exit(&h, &w);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(fired(&v, "1-handed-after-sigterm"));
}

#[test]
fn v1_a_stream_opened_after_the_sigterm_must_not_carry_it() {
    let w = Windows::default();
    let mut h = drained();
    // Opened before the SIGTERM: the event may have been made before it.
    h.reads.push(read(
        ReadKind::Stream,
        1,
        9 * S,
        10 * S + 5,
        5,
        &["10.0.0.1:2000"],
    ));
    assert!(handed_after_sigterm_or_exit(&h, &w).is_empty());
    h.reads.push(read(
        ReadKind::AllStream,
        2,
        10 * S + 1,
        10 * S + 2,
        5,
        &["10.0.0.1:2000"],
    ));
    assert!(fired(
        &handed_after_sigterm_or_exit(&h, &w),
        "1-handed-after-sigterm"
    ));
}

#[test]
fn v1_a_crashed_replica_may_linger_only_within_the_crash_window() {
    let w = Windows::default();
    let mut h = History {
        replicas: vec![
            line(S, ReplicaKind::Start, "10.0.0.1:2000", 7),
            line(10 * S, ReplicaKind::Exit, "10.0.0.1:2000", 7),
        ],
        ..History::default()
    };
    h.reads.push(read(
        ReadKind::Get,
        1,
        10 * S + 1,
        10 * S + 2,
        5,
        &["10.0.0.1:2000"],
    ));
    assert!(handed_after_sigterm_or_exit(&h, &w).is_empty());
    h.reads.push(read(
        ReadKind::Get,
        2,
        20 * S,
        20 * S + 1,
        5,
        &["10.0.0.1:2000"],
    ));
    assert!(fired(
        &handed_after_sigterm_or_exit(&h, &w),
        "1-handed-after-sigterm"
    ));
    // A fault running at the crash stretches the window.
    h.faults.push(Fault {
        start_ns: 9 * S,
        end_ns: 18 * S,
        kind: "pause".into(),
        target: "worker-0".into(),
    });
    assert!(handed_after_sigterm_or_exit(&h, &w).is_empty());
}

#[test]
fn v1_the_next_holder_of_an_address_is_judged_by_its_own_lines() {
    let w = Windows::default();
    let mut h = drained();
    h.replicas
        .push(line(12 * S, ReplicaKind::Start, "10.0.0.1:2000", 8));
    h.reads.push(read(
        ReadKind::Plain,
        1,
        13 * S,
        13 * S + 1,
        9,
        &["10.0.0.1:2000"],
    ));
    assert!(handed_after_sigterm_or_exit(&h, &w).is_empty());
}

#[test]
fn v2_a_port_handed_out_while_its_holder_lives_is_caught() {
    let mut h = drained();
    // Bound after the exit: fine.
    h.replicas
        .push(line(12 * S, ReplicaKind::Start, "10.0.0.1:2000", 8));
    h.replicas.sort_by_key(|r| r.ns);
    assert!(one_holder_per_port(&h).is_empty());
    // Given the port while pid 7 drained.
    h.replicas
        .push(line(10 * S + 5, ReplicaKind::BindFail, "10.0.0.1:2000", 9));
    let v = one_holder_per_port(&h);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(fired(&v, "2-one-holder-per-port"));
}

#[test]
fn v2_a_holder_killed_without_a_word_holds_until_found_gone() {
    let mut h = History {
        replicas: vec![
            line(S, ReplicaKind::Start, "10.0.0.1:2000", 7),
            line(2 * S, ReplicaKind::Sigterm, "10.0.0.1:2000", 7),
            line(4 * S, ReplicaKind::BindFail, "10.0.0.1:2000", 8),
        ],
        ..History::default()
    };
    h.gone.push(crate::history::Gone { pid: 7, ns: 5 * S });
    assert!(fired(&one_holder_per_port(&h), "2-one-holder-per-port"));
    h.gone[0].ns = 3 * S;
    assert!(one_holder_per_port(&h).is_empty());
}

#[test]
fn v3_an_index_going_backwards_for_one_reader_is_caught() {
    let mut h = History::default();
    h.reads.push(read(ReadKind::Blocking, 1, S, 2 * S, 10, &[]));
    let mut back = read(ReadKind::Blocking, 2, 2 * S, 3 * S, 8, &[]);
    back.reader = "r1".into();
    h.reads.push(back.clone());
    assert!(fired(&ordered_and_gapless(&h), "3-index-went-backwards"));
    back.index = 12;
    h.reads[1] = back;
    assert!(ordered_and_gapless(&h).is_empty());
}

#[test]
fn v3_stream_ids_out_of_order_are_caught() {
    let mut h = History::default();
    for (i, id) in [(1, 5), (2, 9), (3, 9)] {
        let mut r = read(ReadKind::Stream, 1, S, i * S, id, &[]);
        r.event_id = Some(id);
        h.reads.push(r);
    }
    assert!(fired(&ordered_and_gapless(&h), "3-stream-out-of-order"));
}

/// An all-services stream event for `service` at `index` with id `id`.
fn all_event(reader: &str, conn: u64, ret: Ns, service: &str, index: u64, id: Option<u64>) -> Read {
    let mut r = read(ReadKind::AllStream, conn, S, ret, index, &[]);
    r.reader = reader.into();
    r.service = service.into();
    r.event_id = id;
    r
}

#[test]
fn v3_an_all_stream_that_skips_a_revision_is_caught() {
    let mut h = History::default();
    // Another reader saw web change at revision 7.
    let mut other = read(ReadKind::Get, 9, 3 * S, 3 * S, 7, &[]);
    other.reader = "getter".into();
    h.reads.push(other);
    h.reads.push(all_event("a", 1, S, "web", 5, None));
    h.reads.push(all_event("a", 1, S + 1, "api", 6, Some(6)));
    // Jumps to 8 without web's revision 7.
    h.reads.push(all_event("a", 1, 4 * S, "api", 8, Some(8)));
    let v = ordered_and_gapless(&h);
    assert!(fired(&v, "3-all-stream-gap"), "{v:?}");
    // With it: fine.
    h.reads.push(all_event("a", 1, 3 * S, "web", 7, Some(7)));
    assert!(ordered_and_gapless(&h).is_empty());
}

#[test]
fn v3_a_resume_that_loses_a_change_is_caught() {
    let mut h = History::default();
    h.reads.push(all_event("a", 1, S, "web", 5, Some(5)));
    // Connection 1 breaks; web changes at 7 (seen by another reader), api at 9.
    h.reads.push(all_event("b", 3, 2 * S, "web", 7, Some(7)));
    let mut resumed = all_event("a", 2, 3 * S, "api", 9, Some(9));
    resumed.asked = Some(5);
    h.reads.push(resumed);
    assert!(fired(&ordered_and_gapless(&h), "3-all-stream-gap"));
}

fn sample(ns: Ns, ready: u32, rollout: &str) -> Sample {
    Sample {
        ns,
        service: "web".into(),
        replicas: 3,
        max_unavailable: 1,
        ready,
        rollout: rollout.into(),
        generation: 2,
    }
}

#[test]
fn v4_a_rollout_below_its_floor_is_caught_unless_a_fault_explains_it() {
    let w = Windows::default();
    let mut h = History {
        samples: vec![sample(100 * S, 2, "progressing")],
        ..History::default()
    };
    assert!(rollouts_keep_availability(&h, &w).is_empty());
    h.samples.push(sample(101 * S, 1, "progressing"));
    assert!(fired(
        &rollouts_keep_availability(&h, &w),
        "4-rollout-below-floor"
    ));
    h.faults.push(Fault {
        start_ns: 95 * S,
        end_ns: 99 * S,
        kind: "kill9".into(),
        target: "worker-1".into(),
    });
    assert!(rollouts_keep_availability(&h, &w).is_empty());
}

fn op(call: Ns, kind: &str, status: Option<u16>, replicas: Option<u32>) -> Op {
    Op {
        call_ns: call,
        ret_ns: call + 1,
        kind: kind.into(),
        service: "web".into(),
        status,
        replicas,
    }
}

fn fin(services: &[(&str, u32, u32, &str)]) -> Final {
    Final {
        faults_end_ns: 100 * S,
        converged_ns: Some(110 * S),
        services: services
            .iter()
            .map(|(s, r, rd, st)| ((*s).to_owned(), (*r, *rd, (*st).to_owned())))
            .collect(),
    }
}

#[test]
fn v4_a_broken_update_left_unreverted_is_caught() {
    let w = Windows::default();
    let mut h = History {
        ops: vec![
            op(S, "submit", Some(201), Some(3)),
            op(2 * S, "broken-update", Some(200), Some(3)),
        ],
        ..History::default()
    };
    // Samples of generation 2 at full strength: only the revert is judged.
    h.samples = vec![sample(3 * S, 3, "failed")];
    assert!(fired(
        &rollouts_keep_availability(&h, &w),
        "4-broken-update-not-reverted"
    ));
    // Seen reverted, then scaled (a new rollout, which completes): fine.
    h.samples.push(sample(4 * S, 3, "reverted"));
    h.samples.push(sample(5 * S, 3, "complete"));
    assert!(rollouts_keep_availability(&h, &w).is_empty());
    // Superseded by another update before it could fail: not judged.
    h.samples.truncate(1);
    h.ops.push(op(3 * S, "update", Some(200), Some(3)));
    assert!(rollouts_keep_availability(&h, &w).is_empty());
}

#[test]
fn v5_a_lost_acknowledged_write_is_caught_an_unanswered_one_is_not_judged() {
    let w = Windows::default();
    let mut h = History {
        ops: vec![
            op(S, "submit", Some(201), Some(3)),
            op(2 * S, "scale", Some(200), Some(5)),
        ],
        ..History::default()
    };
    h.fin = Some(fin(&[("web", 5, 5, "complete")]));
    assert!(nothing_lost_and_converged(&h, &w).is_empty());
    h.fin = Some(fin(&[("web", 3, 3, "complete")]));
    assert!(fired(&nothing_lost_and_converged(&h, &w), "5-write-lost"));
    // The scale got no answer: 3 or 5 are both fine.
    h.ops[1].status = None;
    assert!(nothing_lost_and_converged(&h, &w).is_empty());
    // A stop that was acknowledged: the service must be gone.
    h.ops.push(op(3 * S, "stop", Some(202), None));
    assert!(fired(&nothing_lost_and_converged(&h, &w), "5-write-lost"));
}

#[test]
fn v5_a_cluster_that_never_converges_is_caught() {
    let w = Windows::default();
    let mut h = History::default();
    let mut f = fin(&[]);
    f.converged_ns = None;
    h.fin = Some(f);
    assert!(fired(
        &nothing_lost_and_converged(&h, &w),
        "5-not-converged"
    ));
}

fn request(call: Ns, list: Ns, ok: bool) -> Request {
    Request {
        call_ns: call,
        ret_ns: call + 1000,
        addr: "10.0.0.1:2000".into(),
        list_ns: list,
        ok,
        error: if ok { String::new() } else { "refused".into() },
    }
}

#[test]
fn v6_a_failed_request_is_allowed_only_in_the_stated_windows() {
    let w = Windows::default();
    let mut h = drained();
    // Fresh list, replica draining (SIGTERM at 10 s, exit 11 s): the request at 12 s with
    // a list from 11.5 s should never have had that address.
    h.requests.push(request(12 * S, 11 * S + S / 2, false));
    assert!(fired(
        &requests_only_fail_when_allowed(&h, &w),
        "6-request-failed"
    ));
    // A timeout while its replica was still serving (before its SIGTERM): slow, fine.
    let mut slow = request(5 * S, 5 * S - 1, false);
    slow.error = "timeout: operation timed out".into();
    h.requests.push(slow);
    assert_eq!(requests_only_fail_when_allowed(&h, &w).len(), 1);
    // A list older than the drain: the client's own fault.
    h.requests[0].list_ns = 4 * S;
    assert!(requests_only_fail_when_allowed(&h, &w).is_empty());
    // A crash: allowed within the crash window.
    let mut c = History {
        replicas: vec![
            line(S, ReplicaKind::Start, "10.0.0.1:2000", 7),
            line(10 * S, ReplicaKind::Exit, "10.0.0.1:2000", 7),
        ],
        ..History::default()
    };
    c.requests.push(request(10 * S + 1, 9 * S, false));
    assert!(requests_only_fail_when_allowed(&c, &w).is_empty());
}

#[test]
fn v2_an_address_assigned_while_its_holder_lives_is_caught() {
    let mut h = drained();
    let assign = |ns: Ns| crate::history::Assign {
        ns,
        service: "api".into(),
        job: "j-99".into(),
        addr: "10.0.0.1:2000".into(),
    };
    // After pid 7's exit at 11 s: fine.
    h.assigns.push(assign(11 * S + 1));
    assert!(one_holder_per_port(&h).is_empty());
    // While it drained.
    h.assigns.push(assign(10 * S + 5));
    assert!(fired(&one_holder_per_port(&h), "2-one-holder-per-port"));
}

#[test]
fn v2_a_pool_that_counts_fewer_ports_than_holders_is_caught() {
    let mut h = drained();
    let pool = |call: Ns, used: u64| crate::history::PoolSample {
        call_ns: call,
        ret_ns: call + 1000,
        ip: "10.0.0.1".into(),
        used,
    };
    // Held while it drains (SIGTERM at 10 s, exit at 11 s): counted, fine.
    h.pools.push(pool(10 * S + 5, 1));
    // After the exit: nothing held, fine.
    h.pools.push(pool(12 * S, 0));
    assert!(one_holder_per_port(&h).is_empty());
    // Released while it drained.
    h.pools.push(pool(10 * S + 10, 0));
    assert!(fired(&one_holder_per_port(&h), "2-one-holder-per-port"));
}

fn sock(ns: Ns, addr: &str, pids: &[u32]) -> crate::history::SockSample {
    crate::history::SockSample {
        ns,
        proto: "tcp",
        addr: addr.into(),
        pids: pids.to_vec(),
    }
}

#[test]
fn v2_ss_seeing_an_old_holder_after_the_address_was_assigned_again_is_caught() {
    let mut h = drained();
    // pid 7 (job j-7) held 10.0.0.1:2000 and exited at 11 s (`drained`); job j-8 got the
    // address at 12 s.
    h.assigns.push(crate::history::Assign {
        ns: 12 * S,
        service: "web".into(),
        job: "j-8".into(),
        addr: "10.0.0.1:2000".into(),
    });
    h.socks.push(sock(3 * S, "10.0.0.1:2000", &[7]));
    assert!(one_holder_per_port(&h).is_empty());
    // The kernel still had pid 7 on it after the new assignment: its port was handed out
    // while it held it (whatever its own log said).
    h.socks.push(sock(13 * S, "10.0.0.1:2000", &[7]));
    assert!(fired(&one_holder_per_port(&h), "2-one-holder-per-port"));
}

#[test]
fn v2_ss_seeing_two_jobs_on_one_address_is_caught() {
    let mut h = drained();
    h.replicas
        .push(line(2 * S, ReplicaKind::Start, "10.0.0.1:2001", 9));
    h.socks.push(sock(3 * S, "10.0.0.1:2000", &[7]));
    assert!(one_holder_per_port(&h).is_empty());
    h.socks.push(sock(4 * S, "10.0.0.1:2000", &[7, 9]));
    assert!(fired(&one_holder_per_port(&h), "2-one-holder-per-port"));
}
