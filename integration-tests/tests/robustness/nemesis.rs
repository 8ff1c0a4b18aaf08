//! The nemesis: a fault schedule drawn from the run's seed (so a seed replays it), and
//! its application to a cluster shape. Faults: kill -9 of a daemon (restarted after a
//! moment), SIGSTOP/SIGCONT of a daemon for 0.3–6 s (2–6 s is the pause-detection edge),
//! a worker cut off from the controller (both directions) for 1–6 s, a worker's wall clock
//! jumped by +1h, -10m or +7d for 2–6 s (libfaketime; its monotonic clock untouched).
//! The replica-level faults (a replica that ignores SIGTERM, one that crash-loops) are
//! services of the run (`run.rs`), listed in the schedule too.

use crate::harness::{monotonic_ns, signal};
use crate::history::{Fault, Recorder};
use crate::shapes::Shape;
use std::time::Duration;

/// One planned fault.
#[derive(Debug, Clone)]
pub struct Planned {
    /// After the previous fault ended.
    pub gap_ms: u64,
    pub kind: &'static str,
    /// An index into the shape's daemons.
    pub daemon: usize,
    pub hold_ms: u64,
    /// A clock jump's wall-clock offset (empty for the other faults).
    pub offset: &'static str,
}

impl Planned {
    /// One line of a printed schedule (`names`: the shape's daemons).
    pub fn line(&self, names: &[String]) -> String {
        let offset = if self.offset.is_empty() {
            String::new()
        } else {
            format!(" by {}", self.offset)
        };
        format!(
            "after {} ms: {} {}{offset} for {} ms",
            self.gap_ms, self.kind, names[self.daemon], self.hold_ms
        )
    }
}

/// Draws a schedule for `run_ms` of faults over the shape's daemons (those it can kill
/// are `killable`, those it can cut off from the controller `partitionable`).
pub fn schedule(
    rng: &mut fastrand::Rng,
    run_ms: u64,
    killable: &[bool],
    partitionable: &[bool],
    jumpable: &[bool],
) -> Vec<Planned> {
    let mut out = Vec::new();
    let mut t = 0;
    loop {
        let gap_ms = rng.u64(1000..4000);
        let daemon = rng.usize(..killable.len());
        let offset = ["+1h", "-10m", "+7d"][rng.usize(..3)];
        let (kind, hold_ms) = match rng.u8(..12) {
            // Short pauses, and the 2–6 s band where pause detection decides.
            0..=2 => ("pause", rng.u64(300..2000)),
            3..=5 => ("pause", rng.u64(2000..6000)),
            6..=7 if killable[daemon] => ("kill9", rng.u64(200..2000)),
            8..=9 if partitionable[daemon] => ("partition", rng.u64(1000..6000)),
            10..=11 if jumpable[daemon] => ("clock-jump", rng.u64(2000..6000)),
            _ => ("pause", rng.u64(2000..6000)),
        };
        t += gap_ms + hold_ms;
        if t > run_ms {
            return out;
        }
        out.push(Planned {
            gap_ms,
            kind,
            daemon,
            hold_ms,
            offset: if kind == "clock-jump" { offset } else { "" },
        });
    }
}

/// Applies `plan` to `shape`, recording each fault; every fault is undone before the next
/// (a paused daemon continued, a killed one restarted).
pub async fn apply(shape: &mut dyn Shape, plan: &[Planned], rec: &Recorder) {
    for p in plan {
        tokio::time::sleep(Duration::from_millis(p.gap_ms)).await;
        let target = shape.daemons()[p.daemon].clone();
        let start_ns = monotonic_ns();
        match p.kind {
            "pause" => {
                if let Some(pid) = shape.pid(p.daemon) {
                    signal(pid, libc::SIGSTOP);
                    tokio::time::sleep(Duration::from_millis(p.hold_ms)).await;
                    signal(pid, libc::SIGCONT);
                }
            }
            "kill9" => {
                shape.kill9(p.daemon);
                tokio::time::sleep(Duration::from_millis(p.hold_ms)).await;
                if let Err(e) = tokio::task::block_in_place(|| shape.restart(p.daemon)) {
                    panic!("restarting {target} after its kill -9: {e:#}");
                }
            }
            "clock-jump" => {
                shape.jump_clock(p.daemon, p.offset);
                tokio::time::sleep(Duration::from_millis(p.hold_ms)).await;
                shape.jump_clock(p.daemon, "+0");
            }
            "partition" => {
                shape.partition(p.daemon, true);
                tokio::time::sleep(Duration::from_millis(p.hold_ms)).await;
                shape.partition(p.daemon, false);
            }
            other => unreachable!("no fault {other}"),
        }
        let fault = Fault {
            start_ns,
            end_ns: monotonic_ns(),
            kind: p.kind.to_owned(),
            target,
        };
        rec.with(|h| h.faults.push(fault));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seed replays its schedule, and the schedules of a few seeds use every kind of
    /// fault the shape allows, and only those.
    #[test]
    fn a_seed_replays_its_schedule_and_every_fault_kind_comes_up() {
        let draw = |seed| {
            schedule(
                &mut fastrand::Rng::with_seed(seed),
                60_000,
                &[true, true, false],
                &[false, true, true],
                &[false, false, true],
            )
        };
        let key = |p: &[Planned]| {
            p.iter()
                .map(|p| (p.gap_ms, p.kind, p.daemon, p.hold_ms))
                .collect::<Vec<_>>()
        };
        assert_eq!(key(&draw(7)), key(&draw(7)));
        let all: Vec<Planned> = (0..10).flat_map(draw).collect();
        for kind in ["pause", "kill9", "partition", "clock-jump"] {
            assert!(
                all.iter().any(|p| p.kind == kind),
                "no {kind} in 10 schedules"
            );
        }
        assert!(all.iter().all(|p| p.kind != "kill9" || p.daemon != 2));
        assert!(all.iter().all(|p| p.kind != "partition" || p.daemon != 0));
        assert!(all.iter().all(|p| p.kind != "clock-jump" || p.daemon == 2));
        assert!(all.iter().all(|p| (200..6000).contains(&p.hold_ms)));
    }
}
