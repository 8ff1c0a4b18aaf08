//! The one retry pause of the workspace: capped exponential backoff. Used by every loop
//! that retries or delays something: the worker's registration, assignments and events,
//! the apiserver's follower and leader watch, the controller's election campaign and an
//! elected controller that could not load its term (all with jitter), the controller's
//! per-replica restart delay, a failed `accept`, `xced dev`'s wait for its hosts, and the
//! CLI's watch retries (without jitter: one process, or delays asserted exactly and
//! printed to the user).
//!
//! A crate of its own (not `plugin-api`, not the host's crates): the CLI library
//! (`xcecli-ext`) may not depend on the host, and a retry pause is no part of the plugin
//! contract; one tiny crate with one dependency (`fastrand`, for the jitter) is what both
//! sides can share.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

use std::time::Duration;

/// How much [`Backoff::jittered`] lengthens a pause at random, as a fraction of it: enough
/// that many workers (or apiservers) that lost the controller together do not come back
/// in lockstep, small enough that the cap stays meaningful.
pub const JITTER: f64 = 0.2;

/// Capped exponential backoff: the pauses are `first`, `2 × first`, … up to `cap`,
/// optionally each lengthened at random by up to a fraction of it. [`reset`](Self::reset)
/// after a success starts over at `first`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    step: Duration,
    jitter: f64,
}

impl Backoff {
    /// Exact pauses from `first` up to `cap` (a `cap` below `first` is raised to it).
    pub fn new(first: Duration, cap: Duration) -> Self {
        Self {
            first,
            cap: cap.max(first),
            step: first,
            jitter: 0.0,
        }
    }

    /// Pauses from `first` up to `cap`, each lengthened by up to [`JITTER`] at random: for
    /// the retries of many processes that failed together.
    pub fn jittered(first: Duration, cap: Duration) -> Self {
        Self {
            jitter: JITTER,
            ..Self::new(first, cap)
        }
    }

    /// The pause before the next retry; the one after it is twice as long (up to the cap).
    pub fn next_pause(&mut self) -> Duration {
        let d = self.step;
        self.step = (self.step * 2).min(self.cap);
        if self.jitter > 0.0 {
            d + d.mul_f64(fastrand::f64() * self.jitter)
        } else {
            d
        }
    }

    /// Starts over at `first` (a call went through).
    pub fn reset(&mut self) {
        self.step = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The pauses without jitter: each is within `[step, step × (1 + jitter)]`.
    fn steps(b: &mut Backoff, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| {
                let expected = b.step;
                let d = b.next_pause();
                assert!(
                    d >= expected && d <= expected.mul_f64(1.0 + b.jitter),
                    "{d:?} for step {expected:?}"
                );
                expected.as_millis() as u64
            })
            .collect()
    }

    #[test]
    fn doubles_up_to_the_cap() {
        let mut b = Backoff::jittered(ms(100), ms(1000));
        assert_eq!(steps(&mut b, 7), [100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn without_jitter_the_pauses_are_exact() {
        let mut b = Backoff::new(ms(200), ms(1000));
        let pauses: Vec<u64> = (0..5).map(|_| b.next_pause().as_millis() as u64).collect();
        assert_eq!(pauses, [200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::jittered(ms(200), ms(10_000));
        steps(&mut b, 4);
        b.reset();
        assert_eq!(steps(&mut b, 2), [200, 400]);
    }

    #[test]
    fn a_cap_below_the_first_pause_keeps_the_first() {
        let mut b = Backoff::new(ms(500), ms(100));
        assert_eq!(steps(&mut b, 3), [500, 500, 500]);
    }

    #[test]
    fn jitter_spreads_the_pauses() {
        let pauses: std::collections::BTreeSet<Duration> = (0..20)
            .map(|_| Backoff::jittered(ms(1000), ms(1000)).next_pause())
            .collect();
        assert!(pauses.len() > 1, "{pauses:?}");
    }
}
