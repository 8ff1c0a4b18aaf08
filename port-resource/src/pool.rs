//! The per-host port pool: pure, synchronous, no I/O.
//!
//! One [`HostPool`] per host holds a pool per protocol (tcp and udp are separate
//! namespaces). A pool knows which ports are held by live reservations (anywhere in
//! 1-65535), which are marked unavailable (held by something outside xce), and which of the
//! dynamic range it may hand out as "any free".
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
use crate::grant::Protocol;
use crate::portset::PortSet;
use crate::range::PortRange;
use std::collections::{HashMap, VecDeque};

/// How many ports per protocol a host may have marked unavailable at once. The oldest mark
/// is dropped first, so marks can never eat a pool (see [`HostPool::mark_unavailable`]).
pub const MAX_UNAVAILABLE: usize = 64;

/// One port of a replica, as the pool sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRequest {
    /// tcp or udp.
    pub protocol: Protocol,
    /// A fixed port, or `None` for "any free" from the dynamic range.
    pub fixed: Option<u16>,
}

/// Why a request does not fit a pool; `index` is the position of the port in the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortfall {
    /// The fixed port is held by another reservation (or twice in this request).
    Taken {
        /// Index in the request.
        index: usize,
    },
    /// The fixed port is on the host's reserved list.
    Reserved {
        /// Index in the request.
        index: usize,
    },
    /// The fixed port is marked unavailable (held by a process outside xce).
    Unavailable {
        /// Index in the request.
        index: usize,
    },
    /// No free port is left in the dynamic range for this "any free" port.
    Exhausted {
        /// Index in the request.
        index: usize,
    },
}

/// A port that is already held (restoring a reservation that conflicts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("port {protocol}/{port} is already held")]
pub struct AlreadyHeld {
    /// Protocol.
    pub protocol: Protocol,
    /// Port.
    pub port: u16,
}

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
struct ProtoPool {
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
    fn new(facts: &HostPortsFacts, reserved: &[u16]) -> Self {
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
    fn is_held(&self, port: u16) -> bool {
        match self.rel(port) {
            Some(i) => self.bits.get(HELD, i),
            None => self.outside.contains(port),
        }
    }

    #[inline]
    fn is_unavailable(&self, port: u16) -> bool {
        self.marked != 0 && self.unavailable.contains(&port)
    }

    /// Whether `port` belongs to the usable dynamic set.
    #[inline]
    fn in_dyn(&self, port: u16) -> bool {
        self.rel(port).is_some_and(|i| !self.bits.get(EXCLUDED, i))
    }

    /// Takes a port that is free or may be claimed (the caller checked). Leaves the queue
    /// consistent: a queued port's live entry turns stale.
    fn hold(&mut self, port: u16) {
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
    fn take_any(&mut self) -> u16 {
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
    fn release(&mut self, port: u16) {
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

    fn mark_unavailable(&mut self, port: u16) {
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

    /// Free ports of the usable dynamic set in the order they would be handed out.
    fn free_order(&self) -> Vec<u16> {
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
    fn held_ports(&self) -> Vec<u16> {
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

/// A host's reserved list, sorted and deduplicated; inline when short (the common case)
/// so that checking a fixed port does not chase a pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reserved {
    Inline { len: u8, ports: [u16; 8] },
    Heap(Box<[u16]>),
}

impl Reserved {
    fn new(sorted: &[u16]) -> Self {
        if sorted.len() <= 8 {
            let mut ports = [0; 8];
            ports[..sorted.len()].copy_from_slice(sorted);
            Reserved::Inline {
                len: sorted.len() as u8,
                ports,
            }
        } else {
            Reserved::Heap(sorted.into())
        }
    }

    #[inline]
    fn contains(&self, port: u16) -> bool {
        match self {
            Reserved::Inline { len, ports } => ports[..usize::from(*len)].contains(&port),
            Reserved::Heap(ports) => ports.binary_search(&port).is_ok(),
        }
    }
}

/// The port pools of one host: one per protocol, sharing the host's reserved list.
/// Cache-line aligned, with what a tcp reservation reads first.
#[derive(Debug, Clone, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct HostPool {
    reserved: Reserved,
    tcp: ProtoPool,
    udp: ProtoPool,
    facts: HostPortsFacts,
}

// === impl HostPool ===

impl HostPool {
    /// An empty pool for a host with these facts.
    pub fn new(facts: &HostPortsFacts) -> Self {
        let mut reserved = facts.reserved.clone();
        reserved.sort_unstable();
        reserved.dedup();
        let tcp = ProtoPool::new(facts, &reserved);
        Self {
            facts: facts.clone(),
            reserved: Reserved::new(&reserved),
            udp: tcp.clone(),
            tcp,
        }
    }

    /// The facts the pool was built from.
    pub fn facts(&self) -> &HostPortsFacts {
        &self.facts
    }

    /// Builds the pool for new facts of the same host, keeping every held port and the
    /// order in which free ports were released (ports new to the range come first, as
    /// never-used ports). Unavailable marks are dropped: the host reported afresh.
    pub fn rebuild(&self, facts: &HostPortsFacts) -> Self {
        let mut new = Self::new(facts);
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            let (old, pool) = (self.pool(protocol), new.pool_mut(protocol));
            for p in old.held_ports() {
                pool.hold(p);
            }
            // Queued ports keep their order, behind the ports the new pool sees as
            // never used; ports that were marked unavailable go last.
            let queued = old
                .free_order()
                .into_iter()
                .filter(|&p| old.rel(p).is_some_and(|i| old.bits.get(TOUCHED, i)));
            let marked: Vec<u16> = old.unavailable.iter().copied().collect();
            for p in queued.chain(marked) {
                if let Some(i) = pool.rel(p) {
                    if !pool.bits.get(EXCLUDED, i)
                        && !pool.bits.get(HELD, i)
                        && !pool.bits.get(TOUCHED, i)
                    {
                        pool.bits.set(TOUCHED, i);
                        pool.free -= 1;
                        pool.enqueue(p);
                    }
                }
            }
        }
        new
    }

    fn pool(&self, protocol: Protocol) -> &ProtoPool {
        match protocol {
            Protocol::Tcp => &self.tcp,
            Protocol::Udp => &self.udp,
        }
    }

    fn pool_mut(&mut self, protocol: Protocol) -> &mut ProtoPool {
        match protocol {
            Protocol::Tcp => &mut self.tcp,
            Protocol::Udp => &mut self.udp,
        }
    }

    /// Whether `port` is on the host's reserved list.
    pub fn is_reserved(&self, port: u16) -> bool {
        self.reserved.contains(port)
    }

    /// Whether `port` is held by a live reservation.
    pub fn is_held(&self, protocol: Protocol, port: u16) -> bool {
        self.pool(protocol).is_held(port)
    }

    /// Whether `port` is marked unavailable.
    pub fn is_unavailable(&self, protocol: Protocol, port: u16) -> bool {
        self.pool(protocol).is_unavailable(port)
    }

    /// Whether `port` is one the pool may hand out as "any free" (in the dynamic range,
    /// not reserved, not in the ephemeral overlap), whatever its current state.
    pub fn is_dynamic(&self, protocol: Protocol, port: u16) -> bool {
        self.pool(protocol).in_dyn(port)
    }

    /// Size of the usable dynamic set (per protocol).
    pub fn capacity(&self) -> u32 {
        self.tcp.capacity
    }

    /// Free ports of the usable dynamic set of `protocol`.
    pub fn free(&self, protocol: Protocol) -> u32 {
        self.pool(protocol).free
    }

    /// Ports held by live reservations, both protocols, fixed ones included.
    pub fn held(&self) -> u32 {
        self.tcp.held_count + self.udp.held_count
    }

    /// Ports marked unavailable, both protocols.
    pub fn unavailable(&self) -> u32 {
        (self.tcp.unavailable.len() + self.udp.unavailable.len()) as u32
    }

    /// Says whether `request` fits now, without changing anything. Fixed-port problems are
    /// reported before a shortage of free ports.
    pub fn check(&self, request: &[PortRequest]) -> Result<(), Shortfall> {
        let mut need = [0u32; 2];
        for (index, r) in request.iter().enumerate() {
            let Some(port) = r.fixed else { continue };
            let pool = self.pool(r.protocol);
            // Port 0 is no port (validation refuses it): never grant it.
            if port == 0 || self.is_reserved(port) {
                return Err(Shortfall::Reserved { index });
            }
            if pool.is_held(port)
                || request[..index]
                    .iter()
                    .any(|o| o.protocol == r.protocol && o.fixed == Some(port))
            {
                return Err(Shortfall::Taken { index });
            }
            if pool.is_unavailable(port) {
                return Err(Shortfall::Unavailable { index });
            }
            if pool.in_dyn(port) {
                need[r.protocol as usize] += 1;
            }
        }
        for (index, r) in request.iter().enumerate() {
            if r.fixed.is_none() {
                let n = &mut need[r.protocol as usize];
                *n += 1;
                if *n > self.pool(r.protocol).free {
                    return Err(Shortfall::Exhausted { index });
                }
            }
        }
        Ok(())
    }

    /// Reserves `request` all or nothing, writing the granted ports to `out` (cleared
    /// first) in request order. On `Err` nothing changed.
    pub fn reserve(
        &mut self,
        request: &[PortRequest],
        out: &mut Vec<u16>,
    ) -> Result<(), Shortfall> {
        self.check(request)?;
        out.clear();
        // Fixed ports first, so "any free" ports cannot take them.
        for r in request {
            if let Some(port) = r.fixed {
                self.pool_mut(r.protocol).hold(port);
            }
        }
        for r in request {
            out.push(match r.fixed {
                Some(port) => port,
                None => self.pool_mut(r.protocol).take_any(),
            });
        }
        Ok(())
    }

    /// Holds `port` for a reservation being restored, whatever the reserved list and
    /// unavailable marks say (reservations outlive config changes).
    /// Port 0, which is no port, counts as held.
    pub fn hold(&mut self, protocol: Protocol, port: u16) -> Result<(), AlreadyHeld> {
        let pool = self.pool_mut(protocol);
        if port == 0 || pool.is_held(port) {
            return Err(AlreadyHeld { protocol, port });
        }
        pool.hold(port);
        Ok(())
    }

    /// Frees a held port (to the back of the free queue). A no-op when not held.
    pub fn release(&mut self, protocol: Protocol, port: u16) {
        self.pool_mut(protocol).release(port)
    }

    /// Marks `port` unavailable (a process outside xce holds it): it is not handed out,
    /// and a fixed request for it does not fit, until [`Self::rebuild`],
    /// [`Self::clear_unavailable`], or until [`MAX_UNAVAILABLE`] newer marks push it out. A held port stays held until released.
    pub fn mark_unavailable(&mut self, protocol: Protocol, port: u16) {
        self.pool_mut(protocol).mark_unavailable(port)
    }

    /// Drops every unavailable mark; the ports that are not held go to the back of the
    /// free queue (they were busy a moment ago).
    pub fn clear_unavailable(&mut self) {
        for pool in [&mut self.tcp, &mut self.udp] {
            while let Some(&p) = pool.unavailable.front() {
                pool.clear_unavailable(p);
            }
        }
    }

    /// Free ports of the dynamic set in the order "any free" would hand them out (for
    /// tests and diagnostics; O(range)).
    pub fn free_order(&self, protocol: Protocol) -> Vec<u16> {
        self.pool(protocol).free_order()
    }

    /// Every held port of `protocol`, ascending (O(range)).
    pub fn held_ports(&self, protocol: Protocol) -> Vec<u16> {
        self.pool(protocol).held_ports()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn facts(range: (u32, u32), reserved: &[u16], eph: Option<(u32, u32)>) -> HostPortsFacts {
        HostPortsFacts {
            range: PortRange::try_new(range.0, range.1).unwrap(),
            reserved: reserved.to_vec(),
            ephemeral: eph.map(|(a, b)| PortRange::try_new(a, b).unwrap()),
        }
    }

    fn req(spec: &str) -> Vec<PortRequest> {
        spec.split_whitespace()
            .map(|t| {
                let (proto, port) = t.split_once('/').unwrap();
                PortRequest {
                    protocol: if proto == "udp" {
                        Protocol::Udp
                    } else {
                        Protocol::Tcp
                    },
                    fixed: if port == "*" {
                        None
                    } else {
                        Some(port.parse().unwrap())
                    },
                }
            })
            .collect()
    }

    /// Runs a script of operations on one pool and prints what each did:
    /// `r <ports>` reserve, `f <proto/port>` free, `u <proto/port>` mark unavailable,
    /// `h <proto/port>` hold (restore).
    fn check(facts: HostPortsFacts, script: &str, expect: Expect) {
        let mut pool = HostPool::new(&facts);
        let mut out = Vec::new();
        let mut log = format!(
            "capacity={} free={}\n",
            pool.capacity(),
            pool.free(Protocol::Tcp)
        );
        for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (op, arg) = line.split_once(' ').unwrap();
            let res = match op {
                "r" => match pool.reserve(&req(arg), &mut out) {
                    Ok(()) => format!("{out:?}"),
                    Err(e) => format!("{e:?}"),
                },
                "f" | "u" | "h" => {
                    let r = req(arg)[0];
                    let port = r.fixed.unwrap();
                    match op {
                        "f" => {
                            pool.release(r.protocol, port);
                            "ok".to_owned()
                        }
                        "u" => {
                            pool.mark_unavailable(r.protocol, port);
                            "ok".to_owned()
                        }
                        _ => format!("{:?}", pool.hold(r.protocol, port)),
                    }
                }
                _ => panic!("bad op {op}"),
            };
            log += &format!(
                "{line:<22} -> {res:<28} free={} held={} order={:?}\n",
                pool.free(Protocol::Tcp),
                pool.held(),
                pool.free_order(Protocol::Tcp),
            );
        }
        expect.assert_eq(&log);
    }

    #[test]
    fn fresh_then_least_recently_freed() {
        check(
            facts((100, 104), &[], None),
            "
            r tcp/* tcp/*
            r tcp/*
            f tcp/101
            f tcp/100
            r tcp/*
            r tcp/*
            r tcp/* tcp/*
            f tcp/104
            r tcp/*
            ",
            expect![[r#"
                capacity=5 free=5
                r tcp/* tcp/*          -> [100, 101]                   free=3 held=2 order=[102, 103, 104]
                r tcp/*                -> [102]                        free=2 held=3 order=[103, 104]
                f tcp/101              -> ok                           free=3 held=2 order=[103, 104, 101]
                f tcp/100              -> ok                           free=4 held=1 order=[103, 104, 101, 100]
                r tcp/*                -> [103]                        free=3 held=2 order=[104, 101, 100]
                r tcp/*                -> [104]                        free=2 held=3 order=[101, 100]
                r tcp/* tcp/*          -> [101, 100]                   free=0 held=5 order=[]
                f tcp/104              -> ok                           free=1 held=4 order=[104]
                r tcp/*                -> [104]                        free=0 held=5 order=[]
            "#]],
        );
    }

    #[test]
    fn all_or_nothing_and_fixed_ports() {
        check(
            facts((100, 103), &[22, 102], Some((103, 200))),
            "
            r tcp/* tcp/* tcp/*
            r tcp/22
            r tcp/8080 tcp/8080
            r tcp/8080 udp/8080 tcp/*
            r tcp/8080
            r tcp/103 tcp/*
            r tcp/* tcp/*
            r udp/* udp/*
            f tcp/8080
            f tcp/103
            f tcp/9999
            ",
            expect![[r#"
                capacity=2 free=2
                r tcp/* tcp/* tcp/*    -> Exhausted { index: 2 }       free=2 held=0 order=[100, 101]
                r tcp/22               -> Reserved { index: 0 }        free=2 held=0 order=[100, 101]
                r tcp/8080 tcp/8080    -> Taken { index: 1 }           free=2 held=0 order=[100, 101]
                r tcp/8080 udp/8080 tcp/* -> [8080, 8080, 100]            free=1 held=3 order=[101]
                r tcp/8080             -> Taken { index: 0 }           free=1 held=3 order=[101]
                r tcp/103 tcp/*        -> [103, 101]                   free=0 held=5 order=[]
                r tcp/* tcp/*          -> Exhausted { index: 0 }       free=0 held=5 order=[]
                r udp/* udp/*          -> [100, 101]                   free=0 held=7 order=[]
                f tcp/8080             -> ok                           free=0 held=6 order=[]
                f tcp/103              -> ok                           free=0 held=5 order=[]
                f tcp/9999             -> ok                           free=0 held=5 order=[]
            "#]],
        );
    }

    #[test]
    fn fixed_port_inside_range_while_queued() {
        check(
            facts((100, 103), &[], None),
            "
            r tcp/* tcp/* tcp/* tcp/*
            f tcp/102
            f tcp/100
            r tcp/102
            f tcp/102
            r tcp/102
            f tcp/102
            r tcp/* tcp/*
            f tcp/103
            r tcp/101 tcp/*
            u tcp/100
            f tcp/100
            r tcp/*
            r tcp/100
            ",
            expect![[r#"
                capacity=4 free=4
                r tcp/* tcp/* tcp/* tcp/* -> [100, 101, 102, 103]         free=0 held=4 order=[]
                f tcp/102              -> ok                           free=1 held=3 order=[102]
                f tcp/100              -> ok                           free=2 held=2 order=[102, 100]
                r tcp/102              -> [102]                        free=1 held=3 order=[100]
                f tcp/102              -> ok                           free=2 held=2 order=[100, 102]
                r tcp/102              -> [102]                        free=1 held=3 order=[100]
                f tcp/102              -> ok                           free=2 held=2 order=[100, 102]
                r tcp/* tcp/*          -> [100, 102]                   free=0 held=4 order=[]
                f tcp/103              -> ok                           free=1 held=3 order=[103]
                r tcp/101 tcp/*        -> Taken { index: 0 }           free=1 held=3 order=[103]
                u tcp/100              -> ok                           free=1 held=3 order=[103]
                f tcp/100              -> ok                           free=1 held=2 order=[103]
                r tcp/*                -> [103]                        free=0 held=3 order=[]
                r tcp/100              -> Unavailable { index: 0 }     free=0 held=3 order=[]
            "#]],
        );
    }

    #[test]
    fn stale_queue_entries_are_compacted() {
        let mut pool = HostPool::new(&facts((100, 103), &[], None));
        let mut out = Vec::new();
        pool.reserve(&req("tcp/* tcp/* tcp/* tcp/*"), &mut out)
            .unwrap();
        for p in [100, 101, 102, 103] {
            pool.release(Protocol::Tcp, p);
        }
        // Port 101 waits in the queue; taking and freeing it as a fixed port leaves a
        // stale entry behind each time.
        for _ in 0..1000 {
            pool.reserve(&req("tcp/101"), &mut out).unwrap();
            pool.release(Protocol::Tcp, 101);
        }
        let out = format!(
            "queue={} stale={} order={:?} free={}",
            pool.tcp.queue.len(),
            pool.tcp.stale_total,
            pool.free_order(Protocol::Tcp),
            pool.free(Protocol::Tcp),
        );
        expect!["queue=29 stale=25 order=[100, 102, 103, 101] free=4"].assert_eq(&out);
    }

    #[test]
    fn unavailable_marks_are_bounded() {
        let mut pool = HostPool::new(&facts((1000, 1999), &[], None));
        for p in 1000..1000 + MAX_UNAVAILABLE as u16 + 10 {
            pool.mark_unavailable(Protocol::Tcp, p);
        }
        let out = format!(
            "unavailable={} free={} first_free={:?} 1000_marked={} 1073_marked={}",
            pool.unavailable(),
            pool.free(Protocol::Tcp),
            pool.free_order(Protocol::Tcp).first(),
            pool.is_unavailable(Protocol::Tcp, 1000),
            pool.is_unavailable(Protocol::Tcp, 1073),
        );
        expect![[
            r#"unavailable=64 free=936 first_free=Some(1074) 1000_marked=false 1073_marked=true"#
        ]]
        .assert_eq(&out);
    }

    #[test]
    fn rebuild_keeps_holds_and_order() {
        let mut pool = HostPool::new(&facts((100, 105), &[], None));
        let mut out = Vec::new();
        pool.reserve(&req("tcp/* tcp/* tcp/* tcp/9000"), &mut out)
            .unwrap();
        pool.release(Protocol::Tcp, 101);
        pool.release(Protocol::Tcp, 100);
        pool.mark_unavailable(Protocol::Tcp, 104);
        let new = pool.rebuild(&facts((100, 107), &[103], None));
        let out = format!(
            "held={:?} order={:?} free={} capacity={} unavailable={}",
            new.held_ports(Protocol::Tcp),
            new.free_order(Protocol::Tcp),
            new.free(Protocol::Tcp),
            new.capacity(),
            new.unavailable(),
        );
        expect![
            "held=[102, 9000] order=[105, 106, 107, 101, 100, 104] free=6 capacity=7 unavailable=0"
        ]
        .assert_eq(&out);
    }
}
