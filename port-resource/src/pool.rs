//! The per-host port pool: pure, synchronous, no I/O.
//!
//! One [`HostPool`] per host holds a pool per protocol (tcp and udp are separate
//! namespaces) and the host's reserved list. A pool knows which ports are held by live
//! reservations (anywhere in 1-65535), which are marked unavailable (held by something
//! outside xce), and which of the dynamic range it may hand out as "any free".
//!
//! Allocation order is least-recently-freed first: ports never handed out come first, then
//! ports in the order they were freed. So a just-released port is handed out again only when
//! it is the last free port of the range. How that is O(1) amortized: `proto_pool`.

use crate::facts::HostPortsFacts;
use crate::grant::Protocol;
use crate::proto_pool::ProtoPool;

pub use crate::proto_pool::MAX_UNAVAILABLE;

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
            new.pool_mut(protocol).carry_over(self.pool(protocol));
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
        self.tcp.capacity()
    }

    /// Free ports of the usable dynamic set of `protocol`.
    pub fn free(&self, protocol: Protocol) -> u32 {
        self.pool(protocol).free()
    }

    /// Ports held by live reservations, both protocols, fixed ones included.
    pub fn held(&self) -> u32 {
        self.tcp.held_count() + self.udp.held_count()
    }

    /// Ports marked unavailable, both protocols.
    pub fn unavailable(&self) -> u32 {
        self.tcp.unavailable_count() + self.udp.unavailable_count()
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
                if *n > self.pool(r.protocol).free() {
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
        self.tcp.clear_all_unavailable();
        self.udp.clear_all_unavailable();
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
    use crate::range::PortRange;
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
            pool.tcp.queue_len(),
            pool.tcp.stale_total(),
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
