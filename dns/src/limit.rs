//! Per-source rate limiting of UDP queries (in the spirit of Response Rate Limiting):
//! one address flooding the listener does not starve the others. A token bucket per
//! source address, `rate` queries per second with a burst of one second's worth; past it
//! the source's queries are refused until its bucket refills: dropped, except every
//! `slip`-th, answered with an empty truncated reply (as BIND's RRL "slip" does), so a
//! real client whose address a flood forges still gets through by retrying over TCP. UDP only: TCP
//! needs a handshake (no spoofed sources) and its connections are capped.
//!
//! One [`Shared`] limiter serves every UDP reader of a listener: the buckets are split in
//! shards by source address, each behind its own lock, so a source is limited the same
//! whichever reader its packets reach, and readers rarely wait on one another.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

/// Shards of a [`Shared`] limiter: more than readers will ever contend for.
const SHARDS: usize = 16;

/// What to do with a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Answer it.
    Answer,
    /// Over the limit: answer it empty with TC set (the client retries over TCP).
    Slip,
    /// Over the limit: drop it.
    Drop,
}

/// The per-source limit of one listener, shared by all its UDP readers.
#[derive(Debug)]
pub(crate) struct Shared {
    /// `rate` 0: every query is answered, without hashing its source or taking a lock.
    unlimited: bool,
    hasher: std::collections::hash_map::RandomState,
    shards: Vec<Mutex<Limiter>>,
}

impl Shared {
    /// `rate` queries per second per source (0: no limit); `slip` as [`Limiter::new`].
    pub(crate) fn new(rate: u32, slip: u8) -> Self {
        Self {
            unlimited: rate == 0,
            hasher: std::collections::hash_map::RandomState::new(),
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Limiter::new(rate, slip)))
                .collect(),
        }
    }

    /// What to do with a query from `source` arriving `now`.
    pub(crate) fn admit(&self, source: IpAddr, now: Instant) -> Verdict {
        if self.unlimited {
            return Verdict::Answer;
        }
        let shard = &self.shards[(self.hasher.hash_one(source) as usize) % SHARDS];
        // A poisoned shard only means a reader panicked mid-update of plain numbers.
        let mut limiter = shard.lock().unwrap_or_else(|e| e.into_inner());
        limiter.admit(source, now)
    }
}

/// Sources remembered at most per shard; past it the idlest half is forgotten (a forgotten source
/// starts again with a full bucket, which only errs on the side of answering).
const MAX_SOURCES: usize = 65_536 / SHARDS;

/// One source's bucket: its tokens, when it was last seen, and how many of its queries
/// were refused since it last had a token (every `slip`-th of them slips).
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
    refused: u32,
}

#[derive(Debug)]
pub(crate) struct Limiter {
    rate: f64,
    slip: u8,
    buckets: HashMap<IpAddr, Bucket>,
}

impl Limiter {
    /// `rate` queries per second per source (0: no limit); of a source's refused queries
    /// every `slip`-th slips (1: all of them, 0: none).
    pub(crate) fn new(rate: u32, slip: u8) -> Self {
        Self {
            rate: f64::from(rate),
            slip,
            buckets: HashMap::new(),
        }
    }

    /// What to do with a query from `source` arriving `now`.
    pub(crate) fn admit(&mut self, source: IpAddr, now: Instant) -> Verdict {
        if self.rate == 0.0 {
            return Verdict::Answer;
        }
        if self.buckets.len() >= MAX_SOURCES && !self.buckets.contains_key(&source) {
            self.forget_idlest();
        }
        let rate = self.rate;
        let b = self.buckets.entry(source).or_insert(Bucket {
            tokens: rate,
            last: now,
            refused: 0,
        });
        let refill = now.saturating_duration_since(b.last).as_secs_f64() * rate;
        b.tokens = (b.tokens + refill).min(rate);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            b.refused = 0;
            return Verdict::Answer;
        }
        b.refused = b.refused.wrapping_add(1);
        if self.slip != 0 && b.refused % u32::from(self.slip) == 0 {
            Verdict::Slip
        } else {
            Verdict::Drop
        }
    }

    fn forget_idlest(&mut self) {
        let mut seen: Vec<Instant> = self.buckets.values().map(|b| b.last).collect();
        seen.sort();
        let cut = seen[seen.len() / 2];
        self.buckets.retain(|_, b| b.last > cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_source_past_its_rate_is_refused_until_its_bucket_refills_and_others_are_not() {
        let mut l = Limiter::new(10, 0);
        let t0 = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        assert_eq!(
            (0..20)
                .filter(|_| l.admit(a, t0) == Verdict::Answer)
                .count(),
            10,
            "a burst of one second's worth"
        );
        assert_eq!(
            l.admit(b, t0),
            Verdict::Answer,
            "another source is not affected"
        );
        assert_eq!(l.admit(a, t0 + Duration::from_millis(50)), Verdict::Drop);
        assert_eq!(
            l.admit(a, t0 + Duration::from_millis(150)),
            Verdict::Answer,
            "one token back after 100 ms"
        );
        let mut none = Limiter::new(0, 2);
        assert!((0..1000).all(|_| none.admit(a, t0) == Verdict::Answer));
    }

    #[test]
    fn every_slip_th_refused_query_of_a_source_slips_and_the_rest_are_dropped() {
        let t0 = Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let verdicts = |slip| {
            let mut l = Limiter::new(2, slip);
            (0..8).map(|_| l.admit(a, t0)).collect::<Vec<_>>()
        };
        use Verdict::{Answer as A, Drop as D, Slip as S};
        assert_eq!(verdicts(2), [A, A, D, S, D, S, D, S]);
        assert_eq!(verdicts(3), [A, A, D, D, S, D, D, S]);
        assert_eq!(verdicts(1), [A, A, S, S, S, S, S, S]);
        assert_eq!(verdicts(0), [A, A, D, D, D, D, D, D]);
        // The count starts again once the source is answered.
        let mut l = Limiter::new(2, 2);
        for _ in 0..3 {
            l.admit(a, t0);
        }
        assert_eq!(l.admit(a, t0 + Duration::from_millis(500)), A);
        assert_eq!(l.admit(a, t0 + Duration::from_millis(500)), D);
        assert_eq!(l.admit(a, t0 + Duration::from_millis(500)), S);
    }

    #[test]
    fn the_shared_limiter_counts_a_source_once_whichever_reader_asks() {
        let shared = std::sync::Arc::new(Shared::new(100, 0));
        let t0 = Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        // Four readers take the same source's queries at the same instant: together they
        // admit one burst, not one each.
        let admitted: usize = std::thread::scope(|s| {
            let readers: Vec<_> = (0..4)
                .map(|_| {
                    let shared = shared.clone();
                    s.spawn(move || {
                        (0..100)
                            .filter(|_| shared.admit(a, t0) == Verdict::Answer)
                            .count()
                    })
                })
                .collect();
            readers.into_iter().map(|r| r.join().unwrap()).sum()
        });
        assert_eq!(admitted, 100);
        let others = (0..50u8)
            .filter(|i| shared.admit(IpAddr::from([10, 0, 1, *i]), t0) == Verdict::Answer)
            .count();
        assert_eq!(others, 50, "other sources keep their own buckets");
    }
}
