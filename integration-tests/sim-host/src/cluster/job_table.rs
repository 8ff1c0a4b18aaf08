//! The live jobs by number: a slab indexed by the job number.

/// Live records by job number (`j-17` is 17), one slot per number ever handed out.
///
/// Why not a hash map: the numbers are dense (handed out one by one from 1, never
/// reused), so the number is the index. A hash map hashed each number with SipHash, and
/// every placement's insert wrote to a random bucket of a table of 100,000 records (a
/// cache miss, and the page faults of first touching a presized table at random): 8 % of
/// a placement pass in the sim host's profile. Here a placement pushes at the end.
///
/// A run hands out one number per placement (about 142,000 in the full run), and an
/// ended job's slot stays as an empty `Option`: the slab's memory follows the run's
/// placements, not its live jobs, which is fine for a simulation of bounded length.
#[derive(Debug)]
pub(crate) struct JobTable<T> {
    slots: Vec<Option<T>>,
    live: usize,
}

impl<T> Default for JobTable<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            live: 0,
        }
    }
}

impl<T> JobTable<T> {
    /// Makes room for `n` more numbers.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.slots.reserve(n);
    }

    /// Live records.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    pub(crate) fn get(&self, n: &u64) -> Option<&T> {
        self.slots.get(index(*n)?)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, n: &u64) -> Option<&mut T> {
        self.slots.get_mut(index(*n)?)?.as_mut()
    }

    /// Sets the record of number `n`, returning the one it replaced.
    pub(crate) fn insert(&mut self, n: u64, rec: T) -> Option<T> {
        let i = index(n).expect("job numbers start at 1");
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        let old = self.slots[i].replace(rec);
        if old.is_none() {
            self.live += 1;
        }
        old
    }

    pub(crate) fn remove(&mut self, n: &u64) -> Option<T> {
        let old = self.slots.get_mut(index(*n)?)?.take();
        if old.is_some() {
            self.live -= 1;
        }
        old
    }
}

impl<T> std::ops::Index<&u64> for JobTable<T> {
    type Output = T;

    fn index(&self, n: &u64) -> &T {
        self.get(n)
            .unwrap_or_else(|| panic!("job j-{n} is not live"))
    }
}

/// The slot of number `n` (numbers start at 1).
fn index(n: u64) -> Option<usize> {
    usize::try_from(n.checked_sub(1)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Any sequence of inserts and removals answers as the hash map it replaced.
    #[test]
    fn a_job_table_answers_as_a_map() {
        let mut rng = fastrand::Rng::with_seed(5);
        let (mut table, mut map) = (JobTable::default(), HashMap::new());
        for step in 0..5_000u64 {
            let n = rng.u64(1..=300);
            if rng.u32(..3) == 0 {
                assert_eq!(table.remove(&n), map.remove(&n));
            } else {
                assert_eq!(table.insert(n, step), map.insert(n, step));
            }
            assert_eq!(table.len(), map.len());
            let probe = rng.u64(..=310);
            assert_eq!(table.get(&probe), map.get(&probe));
            if let Some(v) = table.get_mut(&probe) {
                *v += 1;
                *map.get_mut(&probe).unwrap() += 1;
            }
        }
        assert!(!map.is_empty());
        assert_eq!(table.get(&0), None);
    }
}
