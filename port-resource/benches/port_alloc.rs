//! Port allocation benchmark: our pool against a baseline that follows Nomad's published
//! method, side by side in one run, on the same pools.
//!
//! 5,000 hosts with the dynamic range 20000-32000 (reserved 22, 80). Each pool is filled
//! to 0 %, 90 %, 99 % and 99.9 % of its range, plus 100 fixed ports held outside the range.
//! Then both allocators run the same sequence of replica reservations: a random host, 3
//! tcp ports per replica (0, 1 or 2 of them fixed, outside the range; the rest "any free").
//! Each new replica on a host replaces the previous one there (released untimed), so the
//! fill stays put and the free queue churns.
//!
//! Baseline (Nomad `structs/network.go`): fixed ports are checked in a 65,536-bit used
//! bitmap; each dynamic port tries up to 20 random probes in the range; if any port runs
//! out of probes, the precise path copies the bitmap, lists every free port of the range
//! (`IndexesInRange`, bit by bit), and picks at random from the list.
//!
//! Every grant is checked against an independent per-host bitmap of what is held; at the
//! end each allocator's state is scanned and compared with it. Any collision aborts.
//!
//! Run: `cargo bench -p port-resource --bench port_alloc`.

use port_resource::pool::{HostPool, PortRequest};
use port_resource::{HostPortsFacts, PortRange, Protocol};
use std::hint::black_box;
use std::time::Instant;

const HOSTS: usize = 5_000;
const RESERVATIONS: usize = 200_000;
const FIXED_HELD_PER_HOST: usize = 100;
const FILLS: [(f64, &str); 4] = [(0.0, "0"), (0.90, "90"), (0.99, "99"), (0.999, "99.9")];
const LO: u16 = 20000;
const HI: u16 = 32000;
const RESERVED: [u16; 2] = [22, 80];
/// Fixed ports come from here (outside the dynamic range, not reserved).
const FIXED_LO: u16 = 10000;
const FIXED_HI: u16 = 19999;

/// A 65,536-bit set.
#[derive(Clone)]
struct Bitmap(Box<[u64]>);

impl Bitmap {
    fn new() -> Self {
        Self(vec![0u64; 1024].into_boxed_slice())
    }
    #[inline]
    fn check(&self, p: u16) -> bool {
        self.0[usize::from(p) >> 6] & (1 << (p & 63)) != 0
    }
    #[inline]
    fn set(&mut self, p: u16) {
        self.0[usize::from(p) >> 6] |= 1 << (p & 63);
    }
    #[inline]
    fn unset(&mut self, p: u16) {
        self.0[usize::from(p) >> 6] &= !(1 << (p & 63));
    }
    /// The set bits, ascending.
    fn ones(&self) -> impl Iterator<Item = u16> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &word)| {
            let mut word = word;
            std::iter::from_fn(move || {
                (word != 0).then(|| {
                    let b = word.trailing_zeros();
                    word &= word - 1;
                    (w * 64) as u16 + b as u16
                })
            })
        })
    }
    /// Nomad's `IndexesInRange(false, from, to)`: bit by bit, into a growing list.
    fn indexes_free_in_range(&self, from: u16, to: u16) -> Vec<u16> {
        let mut out = Vec::new();
        for i in from..=to {
            if !self.check(i) {
                out.push(i);
            }
        }
        out
    }
}

/// The baseline allocator's state for one host: Nomad's used-ports bitmap.
#[derive(Clone)]
struct NomadHost {
    used: Bitmap,
}

const MAX_RAND_PORT_ATTEMPTS: usize = 20;

impl NomadHost {
    /// Assigns `request` (fixed ports and `None` for dynamic), Nomad style, into `out`.
    fn assign(
        &mut self,
        request: &[PortRequest],
        rng: &mut fastrand::Rng,
        out: &mut Vec<u16>,
    ) -> bool {
        out.clear();
        for r in request {
            if let Some(p) = r.fixed {
                if self.used.check(p) {
                    return false;
                }
            }
        }
        let n_dyn = request.iter().filter(|r| r.fixed.is_none()).count();
        let fixed = |p: u16| request.iter().any(|r| r.fixed == Some(p));
        // Stochastic: up to 20 random probes per dynamic port.
        let mut dynamic: Vec<u16> = Vec::with_capacity(n_dyn);
        let mut precise = false;
        'ports: for _ in 0..n_dyn {
            for _ in 0..MAX_RAND_PORT_ATTEMPTS {
                let p = LO + rng.u16(0..HI - LO);
                if self.used.check(p) || fixed(p) || dynamic.contains(&p) {
                    continue;
                }
                dynamic.push(p);
                continue 'ports;
            }
            precise = true;
            break;
        }
        if precise {
            // Precise: copy the bitmap, mark this ask's fixed ports, list every free port,
            // pick at random.
            let mut set = self.used.clone();
            for r in request {
                if let Some(p) = r.fixed {
                    set.set(p);
                }
            }
            let mut available = set.indexes_free_in_range(LO, HI);
            if available.len() < n_dyn {
                return false;
            }
            dynamic.clear();
            for i in 0..n_dyn {
                let j = rng.usize(i..available.len());
                available.swap(i, j);
                dynamic.push(available[i]);
            }
        }
        let mut d = dynamic.into_iter();
        for r in request {
            let p = r
                .fixed
                .unwrap_or_else(|| d.next().expect("one per dynamic port"));
            self.used.set(p);
            out.push(p);
        }
        true
    }

    fn release(&mut self, ports: &[u16]) {
        for &p in ports {
            self.used.unset(p);
        }
    }
}

/// One timed reservation of the sequence.
struct Step {
    host: usize,
    request: [PortRequest; 3],
}

fn any() -> PortRequest {
    PortRequest {
        protocol: Protocol::Tcp,
        fixed: None,
    }
}

fn fixed(p: u16) -> PortRequest {
    PortRequest {
        protocol: Protocol::Tcp,
        fixed: Some(p),
    }
}

/// What both allocators start from: the same held ports per host.
struct Filled {
    ours: Vec<HostPool>,
    nomad: Vec<NomadHost>,
    truth: Vec<Bitmap>,
}

fn fill(frac: f64, rng: &mut fastrand::Rng) -> Filled {
    let facts = HostPortsFacts {
        range: PortRange::try_new(LO.into(), HI.into()).unwrap(),
        reserved: RESERVED.to_vec(),
        ephemeral: Some(PortRange::try_new(32768, 60999).unwrap()),
    };
    let mut ours = Vec::with_capacity(HOSTS);
    let mut nomad = Vec::with_capacity(HOSTS);
    let mut truth = Vec::with_capacity(HOSTS);
    let chunk = [any(); 64];
    let mut out = Vec::new();
    for _ in 0..HOSTS {
        let mut pool = HostPool::new(&facts);
        let mut held = Bitmap::new();
        let target = (frac * f64::from(pool.capacity())) as u32;
        let mut filled = 0;
        while filled < target {
            let n = (target - filled).min(chunk.len() as u32) as usize;
            pool.reserve(&chunk[..n], &mut out).unwrap();
            for &p in &out {
                held.set(p);
            }
            filled += n as u32;
        }
        // Churn a tenth of the held range ports so the free queue is not in port order.
        let mut held_ports = pool.held_ports(Protocol::Tcp);
        rng.shuffle(&mut held_ports);
        let churn = held_ports.len() / 10;
        for &p in &held_ports[..churn] {
            pool.release(Protocol::Tcp, p);
            held.unset(p);
        }
        for _ in 0..churn {
            pool.reserve(&[any()], &mut out).unwrap();
            held.set(out[0]);
        }
        for _ in 0..FIXED_HELD_PER_HOST {
            let p = rng.u16(FIXED_LO..=FIXED_HI);
            if !held.check(p) {
                pool.reserve(&[fixed(p)], &mut out).unwrap();
                held.set(p);
            }
        }
        let mut used = held.clone();
        for p in RESERVED {
            used.set(p);
        }
        ours.push(pool);
        nomad.push(NomadHost { used });
        truth.push(held);
    }
    Filled { ours, nomad, truth }
}

/// The same request sequence for both allocators.
fn steps(truth: &[Bitmap], rng: &mut fastrand::Rng) -> Vec<Step> {
    (0..RESERVATIONS)
        .map(|i| {
            let host = rng.usize(0..HOSTS);
            // Fixed ports free on the host at fill time and distinct in the request; the
            // replica they replace is released first, so they stay free.
            let mut pick = || loop {
                let p = rng.u16(FIXED_LO..=FIXED_HI);
                if !truth[host].check(p) {
                    break p;
                }
            };
            let (a, b) = (pick(), pick());
            let b = if a == b {
                if a == FIXED_HI {
                    a - 1
                } else {
                    a + 1
                }
            } else {
                b
            };
            let request = match i % 3 {
                0 => [any(), any(), any()],
                1 => [fixed(a), any(), any()],
                _ => [fixed(a), any(), fixed(b)],
            };
            Step { host, request }
        })
        .collect()
}

/// What the benchmark drives: one allocator over all hosts.
trait Allocator {
    /// Reserves `request` on host `h`, writing the ports to `out`.
    fn reserve(&mut self, h: usize, request: &[PortRequest], out: &mut Vec<u16>) -> bool;
    /// Frees ports on host `h`.
    fn release(&mut self, h: usize, ports: &[u16]);
    /// Every port the allocator holds on host `h` (reserved ports excluded).
    fn held(&self, h: usize) -> Vec<u16>;
}

struct Ours(Vec<HostPool>);

impl Allocator for Ours {
    #[inline]
    fn reserve(&mut self, h: usize, request: &[PortRequest], out: &mut Vec<u16>) -> bool {
        self.0[h].reserve(request, out).is_ok()
    }
    fn release(&mut self, h: usize, ports: &[u16]) {
        for &p in ports {
            self.0[h].release(Protocol::Tcp, p);
        }
    }
    fn held(&self, h: usize) -> Vec<u16> {
        self.0[h].held_ports(Protocol::Tcp)
    }
}

struct Nomad(Vec<NomadHost>, fastrand::Rng);

impl Allocator for Nomad {
    #[inline]
    fn reserve(&mut self, h: usize, request: &[PortRequest], out: &mut Vec<u16>) -> bool {
        self.0[h].assign(request, &mut self.1, out)
    }
    fn release(&mut self, h: usize, ports: &[u16]) {
        self.0[h].release(ports)
    }
    fn held(&self, h: usize) -> Vec<u16> {
        self.0[h]
            .used
            .ones()
            .filter(|p| !RESERVED.contains(p))
            .collect()
    }
}

/// One allocator running the sequence, with its own independent record of what is held.
struct Lane<A> {
    alloc: A,
    truth: Vec<Bitmap>,
    live: Vec<Option<Vec<u16>>>,
    times: Vec<u64>,
    out: Vec<u16>,
}

impl<A: Allocator> Lane<A> {
    fn new(alloc: A, truth: Vec<Bitmap>) -> Self {
        Self {
            alloc,
            truth,
            live: vec![None; HOSTS],
            times: Vec::with_capacity(RESERVATIONS),
            out: Vec::with_capacity(3),
        }
    }

    /// One replica: release the one it replaces (untimed), reserve (timed), check every
    /// granted port against the independent record.
    fn step(&mut self, s: &Step) {
        let truth = &mut self.truth[s.host];
        if let Some(old) = self.live[s.host].take() {
            self.alloc.release(s.host, &old);
            for &p in &old {
                truth.unset(p);
            }
        }
        let t = Instant::now();
        let ok = self
            .alloc
            .reserve(s.host, black_box(&s.request), &mut self.out);
        let ns = t.elapsed().as_nanos() as u64;
        assert!(ok, "reservation failed on host {}", s.host);
        self.times.push(ns);
        for (i, &p) in self.out.iter().enumerate() {
            assert!(
                !truth.check(p) && !self.out[..i].contains(&p),
                "collision: host {} port {p}",
                s.host
            );
            if s.request[i].fixed.is_none() {
                assert!((LO..=HI).contains(&p) && !RESERVED.contains(&p));
            }
            truth.set(p);
        }
        self.live[s.host] = Some(self.out.clone());
    }
}

/// Independent scan: the allocator's held set equals the truth, and no port is in two
/// live grants.
fn scan(truth: &[Bitmap], alloc: &impl Allocator, live: &[Option<Vec<u16>>]) -> usize {
    let mut checked = 0;
    for h in 0..HOSTS {
        let mut seen = Bitmap::new();
        for &p in live[h].iter().flatten() {
            assert!(
                !seen.check(p),
                "collision in live grants: host {h} port {p}"
            );
            seen.set(p);
        }
        let mut expected: Vec<u16> = truth[h].ones().collect();
        let mut got = alloc.held(h);
        expected.sort_unstable();
        got.sort_unstable();
        assert_eq!(
            got, expected,
            "host {h}: allocator state differs from the scan"
        );
        checked += got.len();
    }
    checked
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    // Cost of the clock itself, included in every number below.
    let mut clock: Vec<u64> = (0..100_000)
        .map(|_| {
            let t = Instant::now();
            t.elapsed().as_nanos() as u64
        })
        .collect();
    clock.sort_unstable();
    println!(
        "port allocation: {HOSTS} hosts, range {LO}-{HI}, {RESERVATIONS} replicas of 3 tcp ports \
         per fill level; clock overhead median {} ns (included)",
        percentile(&clock, 0.5)
    );
    println!(
        "{:>6} | {:>8} {:>8} {:>9} | {:>9} {:>9} {:>10} | {:>6} {:>6} {:>6} | {:>9}",
        "fill %",
        "ours p50",
        "ours p99",
        "ours mean",
        "nomad p50",
        "nomad p99",
        "nomad mean",
        "x p50",
        "x p99",
        "x mean",
        "scanned"
    );
    let mut summary = Vec::new();
    for (frac, label) in FILLS {
        let Filled { ours, nomad, truth } = fill(frac, &mut rng);
        let steps = steps(&truth, &mut rng);

        // Side by side: the two allocators take turns on every replica (alternating who
        // goes first), so machine noise hits both alike.
        let mut a = Lane::new(Ours(ours), truth.clone());
        let mut b = Lane::new(Nomad(nomad, fastrand::Rng::with_seed(7)), truth);
        for (i, s) in steps.iter().enumerate() {
            if i % 2 == 0 {
                a.step(s);
                b.step(s);
            } else {
                b.step(s);
                a.step(s);
            }
        }
        let scanned = scan(&a.truth, &a.alloc, &a.live) + scan(&b.truth, &b.alloc, &b.live);
        let (mut ours_ns, mut nomad_ns) = (a.times, b.times);
        ours_ns.sort_unstable();
        nomad_ns.sort_unstable();
        let stats = |v: &[u64]| {
            let mean = v.iter().sum::<u64>() as f64 / v.len() as f64;
            (percentile(v, 0.5), percentile(v, 0.99), mean)
        };
        let (o50, o99, omean) = stats(&ours_ns);
        let (n50, n99, nmean) = stats(&nomad_ns);
        let x50 = n50 as f64 / o50.max(1) as f64;
        let x99 = n99 as f64 / o99.max(1) as f64;
        let xmean = nmean / omean.max(1.0);
        println!(
            "{label:>6} | {o50:>8} {o99:>8} {omean:>9.0} | {n50:>9} {n99:>9} {nmean:>10.0} | \
             {x50:>6.1} {x99:>6.1} {xmean:>6.1} | {:>9}",
            scanned
        );
        summary.push(format!(
            "SUMMARY port-alloc fill={label} ours_ns={o50} nomad_ns={n50} speedup={x50:.1}"
        ));
    }
    println!(
        "(ns per replica reservation; collisions: 0, every grant checked and both states scanned)"
    );
    for s in summary {
        println!("{s}");
    }
}
