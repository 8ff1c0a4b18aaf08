//! The pool of one protocol on one host: the allocator behind [`HostPool`](crate::pool::HostPool).
//!
//! Allocation order is least-recently-freed first: ports never handed out come first (in
//! ascending order, through a cursor over a "touched" bitmap), then ports in the order they
//! were freed (a FIFO queue). So a just-released port is handed out again only when it is
//! the last free port of the range. Both steps are O(1) amortized; nothing scans the range
//! per allocation.
//!
//! A fixed port inside the dynamic range that is taken while it waits in the queue leaves a
//! stale queue entry behind; a per-port stale count (a small map, touched only on that rare
//! path) makes the queue skip it, and the queue is compacted when stale entries pile up.

use crate::facts::HostPortsFacts;
use crate::portset::PortSet;
use crate::range::PortRange;
use std::collections::{HashMap, VecDeque};

/// How many ports per protocol a host may have marked unavailable at once. The oldest mark
/// is dropped first, so marks can never eat a pool (see [`HostPool::mark_unavailable`](crate::pool::HostPool::mark_unavailable)).
pub const MAX_UNAVAILABLE: usize = 64;

/// Plane of [`Planes`]: held by a live reservation.
const HELD: usize = 0;
/// Plane of [`Planes`]: not fresh (handed out, queued, marked, or excluded at some point).
const TOUCHED: usize = 1;
/// Plane of [`Planes`]: not in the usable dynamic set (reserved or ephemeral overlap).
const EXCLUDED: usize = 2;

/// Three bitmaps over the range, interleaved per 64 ports so that everything about one
/// port sits in one cache line (with 5,000 hosts the pools do not stay in cache).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Planes(Box<[[u64; 3]]>);

impl Planes {
    fn new(len: usize) -> Self {
        Self(vec![[0; 3]; len.div_ceil(64)].into_boxed_slice())
    }
    #[inline]
    fn get(&self, plane: usize, i: usize) -> bool {
        self.0[i >> 6][plane] & (1 << (i & 63)) != 0
    }
    #[inline]
    fn set(&mut self, plane: usize, i: usize) {
        self.0[i >> 6][plane] |= 1 << (i & 63);
    }
    #[inline]
    fn clear(&mut self, plane: usize, i: usize) {
        self.0[i >> 6][plane] &= !(1 << (i & 63));
    }
    /// The first clear bit of `plane` at or after `from`, below `len`.
    #[inline]
    fn next_clear(&self, plane: usize, from: usize, len: usize) -> Option<usize> {
        let mut w = from >> 6;
        if w >= self.0.len() {
            return None;
        }
        let mut word = !self.0[w][plane] & (!0u64 << (from & 63));
        loop {
            if word != 0 {
                let i = (w << 6) + word.trailing_zeros() as usize;
                return (i < len).then_some(i);
            }
            w += 1;
            if w >= self.0.len() {
                return None;
            }
            word = !self.0[w][plane];
        }
    }
}

/// The pool of one protocol on one host. Fields a reservation reads come first, and the
/// layout is fixed (`repr(C)`), so a reservation touches few cache lines.
#[derive(Debug, Clone, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct ProtoPool {
    /// The dynamic range.
    range: PortRange,
    /// Size of the usable dynamic set.
    capacity: u32,
    /// Ports of the usable dynamic set neither held nor unavailable.
    free: u32,
    /// All held ports (inside the range or not).
    held_count: u32,
    /// Sum of `stale`, so the common path never looks into the map.
    stale_total: u32,
    /// Length of `unavailable`, so the common path never looks into the list.
    marked: u32,
    /// Where the next scan for a fresh port starts (range-relative).
    cursor: u32,
    /// Range-relative `HELD`, `TOUCHED` and `EXCLUDED` bits. Every `TOUCHED` bit below
    /// `cursor` is set.
    bits: Planes,
    /// Freed ports of the usable dynamic set, oldest first; may hold stale entries.
    queue: VecDeque<u16>,
    /// Held ports outside the dynamic range.
    outside: PortSet,
    /// Ports marked unavailable, oldest mark first.
    unavailable: VecDeque<u16>,
    /// Per port, how many of its queue entries are stale (ahead of its live one).
    stale: HashMap<u16, u32>,
}

impl ProtoPool {
    pub(crate) fn new(facts: &HostPortsFacts, reserved: &[u16]) -> Self {
        let range = facts.range;
        let len = range.len() as usize;
        let mut bits = Planes::new(len);
        let mut capacity = range.len();
        let eph = facts.ephemeral.and_then(|e| e.intersect(range));
        if let Some(e) = eph {
            for p in e.lo()..=e.hi() {
                bits.set(EXCLUDED, usize::from(p - range.lo()));
                bits.set(TOUCHED, usize::from(p - range.lo()));
            }
            capacity -= e.len();
        }
        for &p in reserved {
            if range.contains(p) && eph.is_none_or(|e| !e.contains(p)) {
                bits.set(EXCLUDED, usize::from(p - range.lo()));
                bits.set(TOUCHED, usize::from(p - range.lo()));
                capacity -= 1;
            }
        }
        Self {
            range,
            bits,
            cursor: 0,
            stale_total: 0,
            marked: 0,
            outside: PortSet::default(),
            queue: VecDeque::new(),
            stale: HashMap::new(),
            unavailable: VecDeque::new(),
            capacity,
            free: capacity,
            held_count: 0,
        }
    }

    #[inline]
    fn rel(&self, port: u16) -> Option<usize> {
        self.range
            .contains(port)
            .then(|| usize::from(port - self.range.lo()))
    }

    #[inline]
    pub(crate) fn is_held(&self, port: u16) -> bool {
        match self.rel(port) {
            Some(i) => self.bits.get(HELD, i),
            None => self.outside.contains(port),
        }
    }

    #[inline]
    pub(crate) fn is_unavailable(&self, port: u16) -> bool {
        self.marked != 0 && self.unavailable.contains(&port)
    }

    /// Whether `port` belongs to the usable dynamic set.
    #[inline]
    pub(crate) fn in_dyn(&self, port: u16) -> bool {
        self.rel(port).is_some_and(|i| !self.bits.get(EXCLUDED, i))
    }

    /// Takes a port that is free or may be claimed (the caller checked). Leaves the queue
    /// consistent: a queued port's live entry turns stale.
    pub(crate) fn hold(&mut self, port: u16) {
        self.held_count += 1;
        match self.rel(port) {
            Some(i) => {
                debug_assert!(!self.bits.get(HELD, i));
                self.bits.set(HELD, i);
                if !self.bits.get(EXCLUDED, i) && !self.is_unavailable(port) {
                    self.withdraw(i, port);
                    self.free -= 1;
                }
            }
            None => {
                self.outside.insert(port);
            }
        }
    }

    /// A free port of the usable dynamic set leaves the free set other than through
    /// [`Self::take_any`]: a fresh one is marked touched, a queued one's entry turns stale.
    fn withdraw(&mut self, i: usize, port: u16) {
        if self.bits.get(TOUCHED, i) {
            *self.stale.entry(port).or_insert(0) += 1;
            self.stale_total += 1;
        } else {
            self.bits.set(TOUCHED, i);
        }
    }

    /// A port of the usable dynamic set becomes free: it goes to the back of the queue.
    fn enqueue(&mut self, port: u16) {
        self.free += 1;
        self.queue.push_back(port);
        let stale = self.stale_total;
        if stale > 64 && stale as usize > self.queue.len() / 2 {
            self.compact();
        }
    }

    /// Drops every stale queue entry.
    fn compact(&mut self) {
        let stale = &mut self.stale;
        self.queue.retain(|p| match stale.get_mut(p) {
            Some(c) => {
                *c -= 1;
                if *c == 0 {
                    stale.remove(p);
                }
                false
            }
            None => true,
        });
        debug_assert!(self.stale.is_empty());
        self.stale_total = 0;
    }

    /// Takes the least recently freed port of the usable dynamic set. `free > 0`.
    #[inline]
    pub(crate) fn take_any(&mut self) -> u16 {
        debug_assert!(self.free > 0);
        let len = self.range.len() as usize;
        // Once the fresh ports are used up, skip the scan (it would touch another line).
        let fresh = if (self.cursor as usize) < len {
            self.bits.next_clear(TOUCHED, self.cursor as usize, len)
        } else {
            None
        };
        let port = if let Some(i) = fresh {
            self.bits.set(TOUCHED, i);
            self.cursor = i as u32 + 1;
            self.range.lo() + i as u16
        } else {
            self.cursor = len as u32;
            loop {
                let p = self
                    .queue
                    .pop_front()
                    .expect("free ports are fresh or queued");
                if self.stale_total != 0 {
                    if let Some(c) = self.stale.get_mut(&p) {
                        self.stale_total -= 1;
                        *c -= 1;
                        if *c == 0 {
                            self.stale.remove(&p);
                        }
                        continue;
                    }
                }
                break p;
            }
        };
        self.bits.set(HELD, usize::from(port - self.range.lo()));
        self.free -= 1;
        self.held_count += 1;
        port
    }

    /// Frees a held port; a no-op when it is not held.
    pub(crate) fn release(&mut self, port: u16) {
        match self.rel(port) {
            Some(i) => {
                if !self.bits.get(HELD, i) {
                    return;
                }
                self.bits.clear(HELD, i);
                if !self.bits.get(EXCLUDED, i) && !self.is_unavailable(port) {
                    self.enqueue(port);
                }
            }
            None => {
                if !self.outside.remove(port) {
                    return;
                }
            }
        }
        self.held_count -= 1;
    }

    pub(crate) fn mark_unavailable(&mut self, port: u16) {
        if self.is_unavailable(port) {
            return;
        }
        if let Some(i) = self.rel(port) {
            if !self.bits.get(EXCLUDED, i) && !self.bits.get(HELD, i) {
                self.withdraw(i, port);
                self.free -= 1;
            }
        }
        self.unavailable.push_back(port);
        self.marked += 1;
        if self.unavailable.len() > MAX_UNAVAILABLE {
            let oldest = self.unavailable[0];
            self.clear_unavailable(oldest);
        }
    }

    fn clear_unavailable(&mut self, port: u16) {
        let Some(at) = self.unavailable.iter().position(|&p| p == port) else {
            return;
        };
        self.unavailable.remove(at);
        self.marked -= 1;
        if self.in_dyn(port) && !self.is_held(port) {
            self.enqueue(port);
        }
    }

    /// Size of the usable dynamic set.
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Ports of the usable dynamic set neither held nor unavailable.
    pub(crate) fn free(&self) -> u32 {
        self.free
    }

    /// Held ports, inside the range or not.
    pub(crate) fn held_count(&self) -> u32 {
        self.held_count
    }

    /// Ports marked unavailable.
    pub(crate) fn unavailable_count(&self) -> u32 {
        self.unavailable.len() as u32
    }

    /// Drops every unavailable mark; the ports that are not held go to the back of the
    /// free queue.
    pub(crate) fn clear_all_unavailable(&mut self) {
        while let Some(&p) = self.unavailable.front() {
            self.clear_unavailable(p);
        }
    }

    /// Takes over `old`'s holds and the order in which its free ports were released, for
    /// a pool of the same host built from new facts (see `HostPool::rebuild`): its queued
    /// ports keep their order, behind the ports this pool sees as never used; ports that
    /// were marked unavailable go last.
    pub(crate) fn carry_over(&mut self, old: &ProtoPool) {
        for p in old.held_ports() {
            self.hold(p);
        }
        let queued = old
            .free_order()
            .into_iter()
            .filter(|&p| old.rel(p).is_some_and(|i| old.bits.get(TOUCHED, i)));
        let marked: Vec<u16> = old.unavailable.iter().copied().collect();
        for p in queued.chain(marked) {
            if let Some(i) = self.rel(p) {
                if !self.bits.get(EXCLUDED, i)
                    && !self.bits.get(HELD, i)
                    && !self.bits.get(TOUCHED, i)
                {
                    self.bits.set(TOUCHED, i);
                    self.free -= 1;
                    self.enqueue(p);
                }
            }
        }
    }

    /// Entries in the free queue, stale ones included.
    #[cfg(test)]
    pub(crate) fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// Stale entries in the free queue.
    #[cfg(test)]
    pub(crate) fn stale_total(&self) -> u32 {
        self.stale_total
    }

    /// Free ports of the usable dynamic set in the order they would be handed out.
    pub(crate) fn free_order(&self) -> Vec<u16> {
        let len = self.range.len() as usize;
        let mut out = Vec::with_capacity(self.free as usize);
        let mut i = self.cursor as usize;
        while let Some(j) = self.bits.next_clear(TOUCHED, i, len) {
            out.push(self.range.lo() + j as u16);
            i = j + 1;
        }
        let mut stale = self.stale.clone();
        for &p in &self.queue {
            match stale.get_mut(&p) {
                Some(c) if *c > 0 => *c -= 1,
                _ => out.push(p),
            }
        }
        out
    }

    /// All held ports, ascending.
    pub(crate) fn held_ports(&self) -> Vec<u16> {
        let len = self.range.len() as usize;
        let mut out: Vec<u16> = self.outside.iter().collect();
        out.extend(
            (0..len)
                .filter(|&i| self.bits.get(HELD, i))
                .map(|i| self.range.lo() + i as u16),
        );
        out.sort_unstable();
        out
    }
}
