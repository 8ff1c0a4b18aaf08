//! A host's live jobs: a set of job numbers, kept as a sorted vector.

/// The live jobs of one host, ascending (the order a `BTreeSet` walks them, so the
/// events the host's jobs cause come in the same order as before).
///
/// Why not a `BTreeSet`: every placement inserts into the set of a host picked at random
/// among 5,000, and a tree's insert (nodes of their own, searched and split) was 4-7 % of
/// a placement pass in the sim host's profiles. Job numbers only grow, so an insert is a
/// push at the end; a host holds tens of jobs, so a removal's shift is short.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostJobs(Vec<u64>);

impl HostJobs {
    /// Adds `n` (a no-op if it is there).
    pub(crate) fn insert(&mut self, n: u64) {
        match self.0.last() {
            Some(&last) if last >= n => {
                if let Err(at) = self.0.binary_search(&n) {
                    self.0.insert(at, n);
                }
            }
            _ => self.0.push(n),
        }
    }

    /// Removes `n` (a no-op if it is not there).
    pub(crate) fn remove(&mut self, n: u64) {
        if let Ok(at) = self.0.binary_search(&n) {
            self.0.remove(at);
        }
    }

    /// The jobs, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &u64> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Any sequence of inserts and removals leaves what a `BTreeSet` would, in its order.
    #[test]
    fn host_jobs_behave_as_an_ordered_set() {
        let mut rng = fastrand::Rng::with_seed(11);
        let (mut jobs, mut set) = (HostJobs::default(), BTreeSet::new());
        let mut next = 0;
        for _ in 0..5_000 {
            let n = match rng.u32(..10) {
                // Mostly the next number, as placements do; sometimes an older one.
                0..=5 => {
                    next += 1;
                    next
                }
                _ => rng.u64(..=next),
            };
            if rng.u32(..3) == 0 {
                jobs.remove(n);
                set.remove(&n);
            } else {
                jobs.insert(n);
                set.insert(n);
            }
            assert!(jobs.iter().eq(set.iter()));
        }
        assert!(!set.is_empty());
    }
}
