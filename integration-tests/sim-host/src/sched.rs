//! The sim host's scheduler: least-loaded first, ties broken at random (seeded).
//!
//! Deliberately unlike local-cluster's (which spreads a service's replicas first, then by
//! total, then by host id, deterministically): a plugin that only works with one placement
//! order shows up here. Hosts are kept in buckets by load (live jobs), so picking is O(1)
//! per try whatever the cluster size.

/// Hosts by load, for one pick per placement.
#[derive(Debug)]
pub(crate) struct Scheduler {
    /// `buckets[n]`: the schedulable hosts with `n` live jobs, in no order.
    buckets: Vec<Vec<u32>>,
    /// Per host: its load and where it sits in its bucket (`None`: not schedulable).
    slot: Vec<Option<(u32, usize)>>,
    /// Per host: its load, also while not schedulable (jobs kept on an unreachable host).
    load: Vec<u32>,
    rng: fastrand::Rng,
}

// === impl Scheduler ===

impl Scheduler {
    pub(crate) fn new(hosts: usize, seed: u64) -> Self {
        Self {
            buckets: vec![Vec::new()],
            slot: vec![None; hosts],
            load: vec![0; hosts],
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// Makes `host` a candidate (registered, or heard again).
    pub(crate) fn enable(&mut self, host: u32) {
        if self.slot[host as usize].is_none() {
            self.insert(host);
        }
    }

    /// Takes `host` out of the candidates (unreachable or lost); its load is kept.
    pub(crate) fn disable(&mut self, host: u32) {
        if self.slot[host as usize].is_some() {
            self.remove(host);
        }
    }

    /// Adds `delta` (±1) to `host`'s load.
    pub(crate) fn add(&mut self, host: u32, delta: i32) {
        let enabled = self.slot[host as usize].is_some();
        if enabled {
            self.remove(host);
        }
        let l = &mut self.load[host as usize];
        *l = l
            .checked_add_signed(delta)
            .expect("a host's load never goes below 0");
        if enabled {
            self.insert(host);
        }
    }

    /// The least-loaded schedulable host `fits` accepts, ties broken at random; `None`
    /// when no host fits. `fits` is called once per host tried.
    pub(crate) fn pick(&mut self, mut fits: impl FnMut(u32) -> bool) -> Option<u32> {
        for b in 0..self.buckets.len() {
            let n = self.buckets[b].len();
            if n == 0 {
                continue;
            }
            // A random start and a random stride coprime with n visit every host of the
            // bucket once, in a seeded random order, without allocating.
            let start = self.rng.usize(..n);
            let stride = self.coprime_stride(n);
            for k in 0..n {
                let h = self.buckets[b][(start + k * stride) % n];
                if fits(h) {
                    return Some(h);
                }
            }
        }
        None
    }

    fn coprime_stride(&mut self, n: usize) -> usize {
        if n <= 2 {
            return 1;
        }
        loop {
            let s = self.rng.usize(1..n);
            if gcd(s, n) == 1 {
                return s;
            }
        }
    }

    fn insert(&mut self, host: u32) {
        let l = self.load[host as usize] as usize;
        if self.buckets.len() <= l {
            self.buckets.resize_with(l + 1, Vec::new);
        }
        self.buckets[l].push(host);
        self.slot[host as usize] = Some((l as u32, self.buckets[l].len() - 1));
    }

    fn remove(&mut self, host: u32) {
        let (l, at) = self.slot[host as usize]
            .take()
            .expect("removing a schedulable host");
        let bucket = &mut self.buckets[l as usize];
        bucket.swap_remove(at);
        if let Some(&moved) = bucket.get(at) {
            self.slot[moved as usize] = Some((l, at));
        }
    }
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_least_loaded_and_spreads_ties_at_random() {
        let mut s = Scheduler::new(4, 7);
        for h in 0..4 {
            s.enable(h);
        }
        s.add(0, 1);
        s.add(1, 1);
        // Hosts 2 and 3 are the least loaded; which one first is the seed's choice.
        let first = s.pick(|_| true).unwrap();
        assert!(first == 2 || first == 3, "{first}");
        // A host that does not fit is skipped for the next least loaded.
        let other = s.pick(|h| h != 2 && h != 3).unwrap();
        assert!(other == 0 || other == 1, "{other}");
        s.disable(0);
        s.disable(1);
        assert_eq!(s.pick(|h| h < 2), None);
        // Every host of a bucket is tried exactly once.
        let mut tried = Vec::new();
        assert_eq!(
            s.pick(|h| {
                tried.push(h);
                false
            }),
            None
        );
        tried.sort_unstable();
        assert_eq!(tried, vec![2, 3]);
    }

    #[test]
    fn ties_are_broken_differently_under_different_seeds() {
        let picks = |seed| {
            let mut s = Scheduler::new(50, seed);
            (0..50).for_each(|h| s.enable(h));
            (0..10)
                .map(|_| {
                    let h = s.pick(|_| true).unwrap();
                    s.add(h, 1);
                    h
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(picks(1), picks(1));
        assert_ne!(picks(1), picks(2));
    }
}
