//! The simulation at the size: 5,000 hosts, 2,000 services, 100,000 replicas,
//! then churn. `cargo bench -p sim-host` (release); `SIM_SEED` reproduces a run.
//!
//! Prints one `SUMMARY sim …` line (every figure computed by the run) and the time per
//! phase, so a missed goal says where the time went.

use sim_host::{run, SimConfig, WorkerSettings};

fn main() {
    let seed = match std::env::var("SIM_SEED") {
        Ok(s) => s.parse().expect("SIM_SEED is a number"),
        Err(_) => fastrand::u64(..),
    };
    println!("SIM_SEED={seed}");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("ip_local_port_range");
    std::fs::write(&file, "29400\t60999\n").expect("writing the ephemeral range file");
    let workers = WorkerSettings {
        range: "29000-29511".into(),
        reserved: vec![22, 80, 29100],
        ephemeral_range_file: file,
    };
    let mut cfg = SimConfig::full(seed, workers);
    if let Ok(n) = std::env::var("SIM_CHURN") {
        cfg.churn = n.parse().expect("SIM_CHURN is a number");
    }
    // The machine is shared: the load around the run says how far its timings can be
    // trusted.
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load_before = load();
    let r = match run(&cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("simulation failed: {e}");
            std::process::exit(2);
        }
    };
    for v in r.violations.iter().take(20) {
        println!("VIOLATION {v}");
    }
    println!(
        "SUMMARY sim hosts={} replicas={} violations={} placements_per_s={:.0} \
         placements_per_s_without_listeners={:.0} seed={} placements_per_cpu_s={:.0}",
        r.hosts,
        r.replicas,
        r.violations.len(),
        r.placements_per_s(),
        r.placements_per_s_without_listeners(),
        r.seed,
        r.placements_per_cpu_s(),
    );
    println!(
        "FIGURE sim events={} placements={} commits={} checks={} http_reads={} envs={} \
         refused={} unplaced={} restarts={} left_jobs={} left_pending={}",
        r.events,
        r.placements,
        r.commits,
        r.checks,
        r.http_reads,
        r.env_checked,
        r.refused,
        r.unplaced,
        r.restarts,
        r.left_jobs,
        r.left_pending,
    );
    let churn: Vec<String> = r.churn.iter().map(|(k, n)| format!("{k}={n}")).collect();
    println!("FIGURE sim_churn {}", churn.join(" "));
    for (name, p, total) in [
        ("placing", &r.place_phases, r.load_place),
        ("load", &r.load_phases, r.load_total),
        (
            "run",
            &r.phases,
            r.setup + r.load_total + r.churn_total + r.teardown_total,
        ),
    ] {
        println!(
            "PHASES {name} total={:.2}s pick={:.2}s reserve={:.2}s commit={:.2}s \
             announce={:.2}s launch={:.2}s",
            total.as_secs_f64(),
            p.pick.as_secs_f64(),
            p.reserve.as_secs_f64(),
            p.commit.as_secs_f64(),
            p.announce.as_secs_f64(),
            p.launch.as_secs_f64(),
        );
    }
    // The placing thread's CPU time in the passes beside their wall time: the difference is
    // time it waited for a core (other processes, or the apiserver side's thread).
    println!(
        "PHASES placing_cpu total={:.2}s wall={:.2}s",
        r.load_place_cpu.as_secs_f64(),
        r.load_place.as_secs_f64(),
    );
    println!(
        "PHASES setup={:.2}s load_placing={:.2}s churn={:.2}s teardown={:.2}s checks={:.2}s",
        r.setup.as_secs_f64(),
        r.load_place.as_secs_f64(),
        r.churn_total.as_secs_f64(),
        r.teardown_total.as_secs_f64(),
        r.check_total.as_secs_f64(),
    );
    println!(
        "LOADAVG before={} after={}",
        load_before.split_whitespace().next().unwrap_or("?"),
        load().split_whitespace().next().unwrap_or("?")
    );
    if !r.violations.is_empty() {
        std::process::exit(1);
    }
}
