//! The simulation at `cargo test` size, its reproducibility, and fault injection: each
//! deliberate corruption of the sim host must be caught by the checks.

use sim_host::{run, Fault, Report, SimConfig, WorkerSettings};

/// The seed: `SIM_SEED` to reproduce a run, else a fresh one (printed).
fn seed() -> u64 {
    match std::env::var("SIM_SEED") {
        Ok(s) => s.parse().expect("SIM_SEED is a number"),
        Err(_) => fastrand::u64(..),
    }
}

/// Worker settings like a real worker's config: a small dynamic range with one reserved
/// port inside it, and an ephemeral range (a file, as the kernel's) overlapping its top.
fn workers(dir: &tempfile::TempDir) -> WorkerSettings {
    let file = dir.path().join("ip_local_port_range");
    std::fs::write(&file, "29400\t60999\n").unwrap();
    WorkerSettings {
        range: "29000-29511".into(),
        reserved: vec![22, 80, 29100],
        ephemeral_range_file: file,
    }
}

fn print(r: &Report) {
    println!(
        "SUMMARY sim hosts={} replicas={} violations={} placements_per_s={:.0} seed={} \
         events={} placements={} checks={} http_reads={} envs={} refused={} unplaced={}",
        r.hosts,
        r.replicas,
        r.violations.len(),
        r.placements_per_s(),
        r.seed,
        r.events,
        r.placements,
        r.checks,
        r.http_reads,
        r.env_checked,
        r.refused,
        r.unplaced,
    );
    let p = &r.phases;
    println!(
        "PHASES load={:?} (placing {:?}) churn={:?} checks={:?} | pick={:?} reserve={:?} \
         commit={:?} announce={:?} launch={:?}",
        r.load_total,
        r.load_place,
        r.churn_total,
        r.check_total,
        p.pick,
        p.reserve,
        p.commit,
        p.announce,
        p.launch
    );
}

#[test]
fn small_cluster_churns_without_violations() {
    let dir = tempfile::tempdir().unwrap();
    let seed = seed();
    println!("SIM_SEED={seed}");
    let cfg = SimConfig::small(seed, workers(&dir));
    let r = run(&cfg).unwrap();
    print(&r);
    assert!(
        r.violations.is_empty(),
        "SIM_SEED={seed}: {:#?}",
        &r.violations[..r.violations.len().min(20)]
    );
    assert_eq!(
        r.replicas,
        u64::from(cfg.replicas),
        "every replica of the load placed"
    );
    assert!(r.placements > r.replicas, "the churn placed replicas too");
    assert!(
        r.env_checked + r.refused >= r.placements,
        "every placement was launched"
    );
    assert!(r.http_reads > 0 && r.events > u64::from(cfg.churn));
    assert!(r.restarts >= 1, "the controller restarted midway");
    println!("churn {:?}", r.churn);
    for kind in [
        "flap",
        "exit",
        "scale",
        "roll",
        "replace",
        "unreachable",
        "lost",
        "back",
    ] {
        assert!(
            r.churn.get(kind).copied().unwrap_or(0) > 0,
            "no {kind} in {:?}",
            r.churn
        );
    }
    assert_eq!(
        (r.left_jobs, r.left_pending),
        (0, 0),
        "the teardown ended everything"
    );
}

/// A small configuration for the runs that only need a few events.
fn tiny(seed: u64, dir: &tempfile::TempDir) -> SimConfig {
    SimConfig {
        hosts: 40,
        services: 20,
        replicas: 400,
        churn: 200,
        ..SimConfig::small(seed, workers(dir))
    }
}

#[test]
fn the_same_seed_makes_the_same_run() {
    let dir = tempfile::tempdir().unwrap();
    let seed = seed();
    let a = run(&tiny(seed, &dir)).unwrap();
    let b = run(&tiny(seed, &dir)).unwrap();
    let shape = |r: &Report| (r.events, r.placements, r.commits, r.checks, r.unplaced);
    // Refusals depend on this machine (a port held by another process), not on the seed.
    if a.refused == 0 && b.refused == 0 {
        assert_eq!(shape(&a), shape(&b), "SIM_SEED={seed}");
    }
    let c = run(&tiny(seed.wrapping_add(1), &dir)).unwrap();
    assert_ne!(shape(&a), shape(&c), "another seed, another run");
}

fn with_fault(fault: Fault) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let seed = seed();
    let r = run(&SimConfig {
        fault: Some(fault),
        ..tiny(seed, &dir)
    })
    .unwrap();
    println!(
        "{fault:?}: {} violations, first: {:?}",
        r.violations.len(),
        r.violations.first()
    );
    r
}

#[test]
fn a_port_handed_out_twice_is_caught() {
    let r = with_fault(Fault::DuplicatePort);
    assert!(
        r.violations.iter().any(|v| v.contains("held twice")),
        "{:?}",
        r.violations
    );
}

#[test]
fn an_endpoint_never_announced_is_caught() {
    let r = with_fault(Fault::DropEndpoint);
    assert!(
        r.violations
            .iter()
            .any(|v| v.contains("differs from the ready set")),
        "{:?}",
        r.violations
    );
}

#[test]
fn a_port_never_released_is_caught() {
    let r = with_fault(Fault::LeakPort);
    assert!(
        r.violations
            .iter()
            .any(|v| v.contains("ports used, jobs hold")),
        "{:?}",
        r.violations
    );
}
