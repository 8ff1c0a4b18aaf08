//! Per-source rate limiting of UDP queries (in the spirit of Response Rate Limiting):
//! one address flooding the listener does not starve the others. A token bucket per
//! source address, `rate` queries per second with a burst of one second's worth; past it
//! the source's queries are dropped (counted) until its bucket refills. UDP only: TCP
//! needs a handshake (no spoofed sources) and its connections are capped.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

/// Sources remembered at most; past it the idlest half is forgotten (a forgotten source
/// starts again with a full bucket, which only errs on the side of answering).
const MAX_SOURCES: usize = 65_536;

#[derive(Debug)]
pub(crate) struct Limiter {
    rate: f64,
    buckets: HashMap<IpAddr, (f64, Instant)>,
}

impl Limiter {
    /// `rate` queries per second per source; 0: no limit.
    pub(crate) fn new(rate: u32) -> Self {
        Self {
            rate: f64::from(rate),
            buckets: HashMap::new(),
        }
    }

    /// Whether a query from `source` arriving `now` may be answered.
    pub(crate) fn admit(&mut self, source: IpAddr, now: Instant) -> bool {
        if self.rate == 0.0 {
            return true;
        }
        if self.buckets.len() >= MAX_SOURCES && !self.buckets.contains_key(&source) {
            self.forget_idlest();
        }
        let rate = self.rate;
        let (tokens, last) = self.buckets.entry(source).or_insert((rate, now));
        let refill = now.saturating_duration_since(*last).as_secs_f64() * rate;
        *tokens = (*tokens + refill).min(rate);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn forget_idlest(&mut self) {
        let mut seen: Vec<Instant> = self.buckets.values().map(|(_, t)| *t).collect();
        seen.sort();
        let cut = seen[seen.len() / 2];
        self.buckets.retain(|_, (_, t)| *t > cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_source_past_its_rate_is_refused_until_its_bucket_refills_and_others_are_not() {
        let mut l = Limiter::new(10);
        let t0 = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        assert_eq!(
            (0..20).filter(|_| l.admit(a, t0)).count(),
            10,
            "a burst of one second's worth"
        );
        assert!(l.admit(b, t0), "another source is not affected");
        assert!(!l.admit(a, t0 + Duration::from_millis(50)));
        assert!(
            l.admit(a, t0 + Duration::from_millis(150)),
            "one token back after 100 ms"
        );
        let mut none = Limiter::new(0);
        assert!((0..1000).all(|_| none.admit(a, t0)));
    }
}
