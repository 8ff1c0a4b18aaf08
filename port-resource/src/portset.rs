//! A small set of ports: open addressing with linear probing in one flat table, so a lookup
//! touches one cache line where a sorted list's binary search touches several (the pools
//! of thousands of hosts do not stay in cache).

/// A set of ports 1-65535 (0 marks an empty slot and cannot be stored).
#[derive(Debug, Clone, Default)]
pub(crate) struct PortSet {
    /// Power-of-two sized, at most half full; empty until the first insert.
    slots: Box<[u16]>,
    len: u32,
}

impl PartialEq for PortSet {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().all(|p| other.contains(p))
    }
}

impl Eq for PortSet {}

impl PortSet {
    #[inline]
    fn home(&self, port: u16) -> usize {
        // Fibonacci hashing: neighbouring ports land apart.
        let bits = self.slots.len().trailing_zeros();
        ((u32::from(port).wrapping_mul(0x9E37_79B1)) >> (32 - bits)) as usize
    }

    #[inline]
    pub(crate) fn contains(&self, port: u16) -> bool {
        if self.len == 0 {
            return false;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(port);
        loop {
            match self.slots[i] {
                0 => return false,
                p if p == port => return true,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Inserts `port` (not 0); false when it was there already.
    pub(crate) fn insert(&mut self, port: u16) -> bool {
        debug_assert_ne!(port, 0);
        if (self.len as usize + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(port);
        loop {
            match self.slots[i] {
                0 => {
                    self.slots[i] = port;
                    self.len += 1;
                    return true;
                }
                p if p == port => return false,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Removes `port`; false when it was not there.
    pub(crate) fn remove(&mut self, port: u16) -> bool {
        if self.len == 0 {
            return false;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(port);
        loop {
            match self.slots[i] {
                0 => return false,
                p if p == port => break,
                _ => i = (i + 1) & mask,
            }
        }
        // Backward-shift deletion: move later entries of the probe run into the hole when
        // their home is not between the hole and them.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        loop {
            let p = self.slots[j];
            if p == 0 {
                break;
            }
            let home = self.home(p);
            let dist_home = j.wrapping_sub(home) & mask;
            let dist_hole = j.wrapping_sub(hole) & mask;
            if dist_home >= dist_hole {
                self.slots[hole] = p;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.slots[hole] = 0;
        self.len -= 1;
        true
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        self.slots = vec![0; (old.len() * 2).max(16)].into_boxed_slice();
        self.len = 0;
        for p in old.iter().copied().filter(|&p| p != 0) {
            self.insert(p);
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.slots.iter().copied().filter(|&p| p != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #[test]
        fn behaves_like_a_set(ops in proptest::collection::vec((any::<bool>(), 1u16..200), 0..300)) {
            let mut set = PortSet::default();
            let mut model = BTreeSet::new();
            for (insert, p) in ops {
                if insert {
                    prop_assert_eq!(set.insert(p), model.insert(p));
                } else {
                    prop_assert_eq!(set.remove(p), model.remove(&p));
                }
                for q in 1u16..200 {
                    prop_assert_eq!(set.contains(q), model.contains(&q));
                }
            }
            let mut all: Vec<u16> = set.iter().collect();
            all.sort_unstable();
            prop_assert_eq!(all, model.into_iter().collect::<Vec<_>>());
        }
    }
}
