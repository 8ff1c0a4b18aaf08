//! The nemesis: a fault schedule drawn from the run's seed (so a seed replays it), and
//! its application to a cluster shape. Faults: kill -9 of a daemon (restarted after a
//! moment), SIGSTOP/SIGCONT of a daemon for 0.3–6 s (2–6 s is the pause-detection edge),
//! a worker or apiserver cut off from what it talks to (both directions, or one) for
//! 1–6 s, a worker's wall clock jumped by +1h, -10m or +7d for 2–6 s (libfaketime; its
//! monotonic clock untouched), the etcd raft leadership moved to a member, the disk under
//! the controller's data dir filled for 1–4 s (then freed, the controller restarted).
//! The replica-level faults (a replica that ignores SIGTERM, one that crash-loops) are
//! services of the run (`run.rs`), listed in the schedule too.

use crate::harness::{monotonic_ns, signal};
use crate::history::{Fault, Recorder};
use crate::proxy::Cut;
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

/// What the nemesis may do to one daemon of a shape (it may always pause it).
#[derive(Debug, Clone, Copy, Default)]
pub struct Caps {
    /// kill -9 and [`Shape::restart`].
    pub kill: bool,
    /// Cut off from what it talks to, both ways or one way ([`Shape::partition`]).
    pub partition: bool,
    /// Its wall clock jumped ([`Shape::jump_clock`]).
    pub clock: bool,
    /// Its data dir on a small disk the nemesis fills ([`Shape::fill_disk`]).
    pub disk: bool,
    /// An etcd member the raft leadership can be moved to ([`Shape::move_leader`]).
    pub leader: bool,
    /// An etcd member an apiserver watches first (the freeze weight picks these).
    pub under_apiserver: bool,
}

/// Draws a schedule for `run_ms` of faults over the shape's daemons (`caps`: what each
/// may suffer). `freeze_pct`: the share of faults (in %) that are instead a pause of a
/// member under an apiserver for 2–6 s (0 in the ordinary runs, which then draw exactly
/// as before it existed).
pub fn schedule(
    rng: &mut fastrand::Rng,
    run_ms: u64,
    caps: &[Caps],
    freeze_pct: u8,
) -> Vec<Planned> {
    let mut out = Vec::new();
    let mut t = 0;
    let watched: Vec<usize> = (0..caps.len())
        .filter(|&d| caps[d].under_apiserver)
        .collect();
    loop {
        let gap_ms = rng.u64(1000..4000);
        let mut daemon = rng.usize(..caps.len());
        let offset = ["+1h", "-10m", "+7d"][rng.usize(..3)];
        let c = caps[daemon];
        let (mut kind, mut hold_ms) = match rng.u8(..16) {
            // Short pauses, and the 2–6 s band where pause detection decides.
            0..=2 => ("pause", rng.u64(300..2000)),
            3..=5 => ("pause", rng.u64(2000..6000)),
            6..=7 if c.kill => ("kill9", rng.u64(200..2000)),
            8..=9 if c.partition => {
                let way = ["partition", "partition-up", "partition-down"][rng.usize(..3)];
                (way, rng.u64(1000..6000))
            }
            10..=11 if c.clock => ("clock-jump", rng.u64(2000..6000)),
            12..=13 if c.leader => ("move-leader", 0),
            14..=15 if c.disk => ("disk-full", rng.u64(1000..4000)),
            _ => ("pause", rng.u64(2000..6000)),
        };
        if freeze_pct > 0 && !watched.is_empty() && rng.u8(..100) < freeze_pct {
            daemon = watched[rng.usize(..watched.len())];
            (kind, hold_ms) = ("pause", rng.u64(2000..6000));
        }
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
            "partition" | "partition-up" | "partition-down" => {
                let cut = match p.kind {
                    "partition" => Cut::Both,
                    "partition-up" => Cut::Up,
                    _ => Cut::Down,
                };
                shape.partition(p.daemon, cut);
                tokio::time::sleep(Duration::from_millis(p.hold_ms)).await;
                shape.partition(p.daemon, Cut::Healed);
            }
            "move-leader" => tokio::task::block_in_place(|| shape.move_leader(p.daemon)),
            "disk-full" => {
                let fill = tokio::task::block_in_place(|| shape.fill_disk(p.daemon, true));
                fill.expect("filling the disk");
                tokio::time::sleep(Duration::from_millis(p.hold_ms)).await;
                if let Err(e) = tokio::task::block_in_place(|| shape.fill_disk(p.daemon, false)) {
                    panic!("freeing {target}'s disk: {e:#}");
                }
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
        let caps = [
            Caps {
                kill: true,
                ..Caps::default()
            },
            Caps {
                kill: true,
                partition: true,
                leader: true,
                ..Caps::default()
            },
            Caps {
                partition: true,
                clock: true,
                disk: true,
                ..Caps::default()
            },
        ];
        let draw = |seed| schedule(&mut fastrand::Rng::with_seed(seed), 60_000, &caps, 0);
        let key = |p: &[Planned]| {
            p.iter()
                .map(|p| (p.gap_ms, p.kind, p.daemon, p.hold_ms))
                .collect::<Vec<_>>()
        };
        assert_eq!(key(&draw(7)), key(&draw(7)));
        let all: Vec<Planned> = (0..10).flat_map(draw).collect();
        let kinds = [
            "pause",
            "kill9",
            "partition",
            "partition-up",
            "partition-down",
            "clock-jump",
            "move-leader",
            "disk-full",
        ];
        for kind in kinds {
            assert!(
                all.iter().any(|p| p.kind == kind),
                "no {kind} in 10 schedules"
            );
        }
        assert!(all.iter().all(|p| p.kind != "kill9" || p.daemon != 2));
        assert!(all
            .iter()
            .all(|p| !p.kind.starts_with("partition") || p.daemon != 0));
        assert!(all.iter().all(|p| p.kind != "clock-jump" || p.daemon == 2));
        assert!(all.iter().all(|p| p.kind != "move-leader" || p.daemon == 1));
        assert!(all.iter().all(|p| p.kind != "disk-full" || p.daemon == 2));
        assert!(all
            .iter()
            .all(|p| p.kind == "move-leader" || (200..6000).contains(&p.hold_ms)));
    }
}
