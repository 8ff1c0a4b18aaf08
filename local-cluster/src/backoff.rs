//! The one retry pause of the crate: capped exponential backoff with a little jitter, used
//! by every loop that retries a call (the worker's registration, assignments and events,
//! the apiserver's follower, the controller's election campaign).

use std::time::Duration;

/// How much a pause may be lengthened at random, as a fraction of it: enough that many
/// workers (or apiservers) that lost the controller together do not come back in
/// lockstep, small enough that the cap stays meaningful.
const JITTER: f64 = 0.2;

/// Capped exponential backoff: the pauses are `first`, `2 × first`, … up to `cap`, each
/// lengthened by up to 20 % at random. [`reset`](Self::reset) after a success starts
/// over at `first`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    first: Duration,
    cap: Duration,
    step: Duration,
}

impl Backoff {
    /// Pauses from `first` up to `cap` (a `cap` below `first` is raised to it).
    pub(crate) fn new(first: Duration, cap: Duration) -> Self {
        Self {
            first,
            cap: cap.max(first),
            step: first,
        }
    }

    /// The pause before the next retry; the one after it is twice as long (up to the cap).
    pub(crate) fn next(&mut self) -> Duration {
        let d = self.step;
        self.step = (self.step * 2).min(self.cap);
        d + d.mul_f64(fastrand::f64() * JITTER)
    }

    /// Starts over at `first` (a call went through).
    pub(crate) fn reset(&mut self) {
        self.step = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The pauses without jitter: each is within `[step, step × 1.2]`.
    fn steps(b: &mut Backoff, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| {
                let expected = b.step;
                let d = b.next();
                assert!(
                    d >= expected && d <= expected.mul_f64(1.0 + JITTER),
                    "{d:?} for step {expected:?}"
                );
                expected.as_millis() as u64
            })
            .collect()
    }

    #[test]
    fn doubles_up_to_the_cap() {
        let mut b = Backoff::new(ms(100), ms(1000));
        assert_eq!(steps(&mut b, 7), [100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::new(ms(200), ms(10_000));
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
            .map(|_| Backoff::new(ms(1000), ms(1000)).next())
            .collect();
        assert!(pauses.len() > 1, "{pauses:?}");
    }
}
