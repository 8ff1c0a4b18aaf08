//! Pause detection with no blind spot: a thread of its own beats every [`PERIOD`] and
//! measures how late each beat is. A beat that comes much later than its period means
//! this process did not run (SIGSTOP, a frozen VM, a starved machine): the hosts could
//! not be heard meanwhile, and that silence is the controller's own.
//!
//! Why not the state task's own timer: it sleeps until the next host deadline, up to
//! `unreachable_after` ahead, so a pause that ends before that deadline shows no
//! lateness at all (a 3.5 s pause against a deadline armed 2 s ahead looked like 1.5 s
//! of lateness, under the 2 s tolerance, and every host was declared unreachable). And
//! the state task is legitimately late when it is blocked in a store commit, which is no
//! pause: the beat thread keeps beating through a blocked commit, so the two are told
//! apart.
//!
//! The pause is measured in `std::time::Instant` (`CLOCK_MONOTONIC`, which a SIGSTOP does
//! not stop) and handed out as a duration, owed to every host until the core credits it
//! ([`Pulse::take`]).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How often the beat thread beats: every pause longer than this plus [`SLACK`] is seen.
pub(crate) const PERIOD: Duration = Duration::from_millis(100);

/// How much later than [`PERIOD`] a beat may come without counting as a pause: a busy
/// machine delays a sleeping thread's wake-up by some milliseconds, rarely by more.
/// Counting a short delay as a pause would cost little (the hosts' silence is judged
/// that much later), missing a long one costs every host.
pub(crate) const SLACK: Duration = Duration::from_millis(250);

/// The beat clock. Clones share it; the thread ends when the last clone is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Pulse {
    inner: Arc<Mutex<Beats>>,
}

#[derive(Debug)]
struct Beats {
    /// The last beat (by the thread, or a [`Pulse::take`]).
    last: Instant,
    /// Pauses seen and not yet taken.
    owed: Duration,
}

impl Pulse {
    /// A pulse with no thread: beats only when told ([`beat`](Self::beat), tests).
    pub(crate) fn manual(now: Instant) -> Self {
        Pulse {
            inner: Arc::new(Mutex::new(Beats {
                last: now,
                owed: Duration::ZERO,
            })),
        }
    }

    /// A pulse beating every [`PERIOD`] on a thread of its own.
    pub(crate) fn start() -> std::io::Result<Self> {
        let pulse = Self::manual(Instant::now());
        let weak = Arc::downgrade(&pulse.inner);
        std::thread::Builder::new()
            .name("xce-pulse".into())
            .spawn(move || beat_while_wanted(weak))?;
        Ok(pulse)
    }

    /// A beat at `now`: a gap since the last one longer than [`PERIOD`] + [`SLACK`] is a
    /// pause, and what exceeds the period is owed.
    pub(crate) fn beat(&self, now: Instant) {
        let mut b = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let gap = now.saturating_duration_since(b.last);
        if gap > PERIOD + SLACK {
            b.owed += gap - PERIOD;
        }
        b.last = b.last.max(now);
    }

    /// The pauses seen up to `now` and not taken before (a pause still going on when the
    /// thread has not beaten since counts too: after a SIGCONT the state task may run
    /// before the beat thread does).
    pub(crate) fn take_at(&self, now: Instant) -> Duration {
        self.beat(now);
        let mut b = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut b.owed)
    }

    /// [`take_at`](Self::take_at) now.
    pub(crate) fn take(&self) -> Duration {
        self.take_at(Instant::now())
    }
}

fn beat_while_wanted(weak: Weak<Mutex<Beats>>) {
    loop {
        std::thread::sleep(PERIOD);
        let Some(inner) = weak.upgrade() else {
            return;
        };
        Pulse { inner }.beat(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Beats every period, then nothing for `pause`, then beats again: what is owed.
    fn owed_after(pause: Duration) -> Duration {
        let t0 = Instant::now();
        let p = Pulse::manual(t0);
        let mut t = t0;
        for _ in 0..5 {
            t += PERIOD;
            p.beat(t);
        }
        t += pause;
        p.beat(t);
        for _ in 0..5 {
            t += PERIOD;
            p.beat(t);
        }
        p.take_at(t)
    }

    /// The blind spot the state task's timer had: every pause from 2 to 6 s (and short
    /// ones above the slack) is seen, as long as it was, less one period at most.
    #[test]
    fn every_pause_from_two_to_six_seconds_is_seen_whole() {
        for ms in [400, 1_000, 2_000, 2_500, 3_000, 3_500, 4_000, 5_000, 6_000] {
            let pause = Duration::from_millis(ms);
            let owed = owed_after(pause);
            assert!(
                owed + PERIOD >= pause && owed <= pause,
                "a pause of {pause:?} is owed as {owed:?}"
            );
        }
    }

    #[test]
    fn beats_on_time_or_a_little_late_owe_nothing() {
        assert_eq!(owed_after(PERIOD), Duration::ZERO);
        assert_eq!(owed_after(PERIOD + SLACK), Duration::ZERO);
    }

    /// After a SIGCONT the state task may look before the beat thread has beaten: the
    /// pause still going on counts, and is not owed twice when the thread beats late.
    #[test]
    fn a_pause_seen_before_the_thread_beats_is_owed_once() {
        let t0 = Instant::now();
        let p = Pulse::manual(t0);
        let resumed = t0 + Duration::from_millis(3_500);
        let owed = p.take_at(resumed);
        assert_eq!(owed, Duration::from_millis(3_400));
        // The beat thread wakes a moment later, its sleep long over.
        p.beat(resumed + Duration::from_millis(5));
        assert_eq!(
            p.take_at(resumed + Duration::from_millis(10)),
            Duration::ZERO
        );
        // Taken once, it is gone.
        assert_eq!(
            p.take_at(resumed + Duration::from_millis(20)),
            Duration::ZERO
        );
    }
}
