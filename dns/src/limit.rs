//! Per-source rate limiting of UDP queries (in the spirit of Response Rate Limiting):
//! one address flooding the listener does not starve the others. A token bucket per
//! source address, `rate` queries per second with a burst of one second's worth; past it
//! the source's queries are dropped (counted) until its bucket refills. UDP only: TCP
//! needs a handshake (no spoofed sources) and its connections are capped.
//!
//! One [`Shared`] limiter serves every UDP reader of a listener: the buckets are split in
//! shards by source address, each behind its own lock, so a source is limited the same
//! whichever reader its packets reach, and readers rarely wait on one another.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

/// Shards of a [`Shared`] limiter: more than readers will ever contend for.
const SHARDS: usize = 16;

/// The per-source limit of one listener, shared by all its UDP readers.
#[derive(Debug)]
pub(crate) struct Shared {
    hasher: std::collections::hash_map::RandomState,
    shards: Vec<Mutex<Limiter>>,
}

impl Shared {
    /// `rate` queries per second per source; 0: no limit.
    pub(crate) fn new(rate: u32) -> Self {
        Self {
            hasher: std::collections::hash_map::RandomState::new(),
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Limiter::new(rate)))
                .collect(),
        }
    }

    /// Whether a query from `source` arriving `now` may be answered.
    pub(crate) fn admit(&self, source: IpAddr, now: Instant) -> bool {
        let mut h = self.hasher.build_hasher();
        source.hash(&mut h);
        let shard = &self.shards[(h.finish() as usize) % SHARDS];
        // A poisoned shard only means a reader panicked mid-update of plain numbers.
        let mut limiter = shard.lock().unwrap_or_else(|e| e.into_inner());
        limiter.admit(source, now)
    }
}

/// Sources remembered at most per shard; past it the idlest half is forgotten (a forgotten source
/// starts again with a full bucket, which only errs on the side of answering).
const MAX_SOURCES: usize = 65_536 / SHARDS;

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

    #[test]
    fn the_shared_limiter_counts_a_source_once_whichever_reader_asks() {
        let shared = std::sync::Arc::new(Shared::new(100));
        let t0 = Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        // Four readers take the same source's queries at the same instant: together they
        // admit one burst, not one each.
        let admitted: usize = std::thread::scope(|s| {
            let readers: Vec<_> = (0..4)
                .map(|_| {
                    let shared = shared.clone();
                    s.spawn(move || (0..100).filter(|_| shared.admit(a, t0)).count())
                })
                .collect();
            readers.into_iter().map(|r| r.join().unwrap()).sum()
        });
        assert_eq!(admitted, 100);
        let others = (0..50u8)
            .filter(|i| shared.admit(IpAddr::from([10, 0, 1, *i]), t0))
            .count();
        assert_eq!(others, 50, "other sources keep their own buckets");
    }
}
