//! What the tests and benches of every crate share, so that each exists once: an etcd
//! launcher ([`etcd::Etcd`]), [`free_port`], [`rss_kib`], [`cpu_us`], a raw HTTP/1.1 client
//! ([`http`]), a small tmpfs for full-disk tests ([`small_fs::SmallFs`]), a seeded RNG
//! ([`seeded_rng`]) and the patience variable ([`patience`]).
//!
//! A dev-dependency only: no library or binary links it.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod circles;
pub mod etcd;
pub mod http;
pub mod layers;
pub mod named;
pub mod small_fs;

use std::time::Duration;

/// How long a test waits for something that should happen (a process answering, a state
/// being reached) before it fails: 45 s, or `XCE_TEST_PATIENCE` seconds on a slow machine.
/// Every wait of every test uses it, so one variable slows them all down together.
pub fn patience() -> Duration {
    let secs = std::env::var("XCE_TEST_PATIENCE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45);
    Duration::from_secs(secs)
}

/// A loopback TCP port that was free a moment ago (the OS picks it; a race with another
/// process binding it in between is possible and accepted in tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Resident memory of a process in KiB, from `/proc/<pid>/status`; 0 when it cannot be
/// read (the process is gone, or there is no `/proc`).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system) a process used so far, in µs, from `/proc/<pid>/stat`; 0 when
/// it cannot be read.
pub fn cpu_us(pid: u32) -> f64 {
    static TICK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    // Clock ticks per second, asked of `getconf` once (no libc call, so no `unsafe`).
    let hz = *TICK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
            .filter(|hz: &f64| *hz > 0.0)
            .unwrap_or(100.0)
    });
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces): utime and stime are 14, 15.
    let Some(close) = stat.rfind(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(u), Some(s)) => (u + s) * 1e6 / hz,
        _ => 0.0,
    }
}

/// A random generator whose seed is printed (`{what} seed N`) so that a failing run can be
/// replayed: `XCE_TEST_SEED=N` gives the same sequence again; without it, a fresh seed.
pub fn seeded_rng(what: &str) -> fastrand::Rng {
    let seed = std::env::var("XCE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("{what} seed {seed}");
    fastrand::Rng::with_seed(seed)
}

/// The release `xced` a bench runs (`$XCED` if set, else `target/release/xced` of the
/// workspace, honouring `CARGO_TARGET_DIR`); panics with how to build it when it is missing,
/// since a bench against a stale or debug binary would measure the wrong thing.
pub fn release_xced(how_to_build: &str) -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("XCED") {
        return p.into();
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("testkit lives in the workspace")
                .join("target")
        });
    let p = target.join("release").join("xced");
    assert!(p.exists(), "{} is missing: {how_to_build}", p.display());
    p
}

#[cfg(test)]
mod tests {
    /// The kit stays out of every library and binary: in each crate's `Cargo.toml` of the
    /// workspace it may appear only under `[dev-dependencies]`.
    #[test]
    fn no_crate_depends_on_the_kit_outside_its_tests() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut checked = 0;
        for entry in std::fs::read_dir(&root).unwrap() {
            let manifest = entry.unwrap().path().join("Cargo.toml");
            let Ok(text) = std::fs::read_to_string(&manifest) else {
                continue;
            };
            checked += 1;
            let mut section = String::new();
            for line in text.lines().map(str::trim) {
                if line.starts_with('[') {
                    section = line.to_owned();
                } else if line.starts_with("testkit") && !line.starts_with("testkit/") {
                    assert_eq!(
                        section,
                        "[dev-dependencies]",
                        "{}: testkit may only be a dev-dependency",
                        manifest.display()
                    );
                }
            }
        }
        assert!(checked >= 3, "found the workspace's crates ({checked})");
    }
}
