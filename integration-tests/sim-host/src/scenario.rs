//! The scenario: load a cluster, churn it, tear it down, checking the plugins' outputs
//! against the model after every event.

use crate::cluster::{host_id, Cluster, Outcome};
use crate::config::SimConfig;
use crate::error::SimError;
use crate::model::{Decl, Model};
use crate::phases::{thread_cpu, Phases};
use crate::serve::Server;
use crate::worker::{host_ip, Workers};
use endpoint_table::{endpoint_table, EndpointApi, TableConfig};
use host_address::{AddressPolicy, PolicyConfig};
use plugin_api::{ClusterListener, EndReason, JobState, ResourcePlugin, ServiceKey};
use port_resource::PortsPlugin;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

mod checks;

/// What a run did and found. Every figure is counted or timed during the run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The seed (`SIM_SEED` reproduces the run).
    pub seed: u64,
    /// Hosts.
    pub hosts: u32,
    /// Replicas placed in the load phase (a slot placed again after a refused launch counts once).
    pub replicas: u64,
    /// Placements in all (load, replacements, surges, scale-ups).
    pub placements: u64,
    /// Scenario events checked (service creations, churn events, removals).
    pub events: u64,
    /// Invariant violations, each described.
    pub violations: Vec<String>,
    /// Single checks made (entries, HTTP answers, pools).
    pub checks: u64,
    /// Entries read back over HTTP.
    pub http_reads: u64,
    /// Replica environments checked.
    pub env_checked: u64,
    /// Launches refused by a hook (a granted port found in use on this machine).
    pub refused: u64,
    /// Placement attempts that found no host (the slot waited).
    pub unplaced: u64,
    /// Store commits.
    pub commits: u64,
    /// Controller restarts (plugins restored from the store, listeners resynced).
    pub restarts: u64,
    /// Churn events by kind (`flap`, `exit`, `scale`, `roll`, `replace`, `restart`,
    /// `unreachable`, `lost`, `back`; `skipped`: a host picked to go down was down already).
    pub churn: std::collections::BTreeMap<&'static str, u64>,
    /// Slots still waiting for a placement at the end, and jobs still live (both 0 after
    /// the teardown unless something leaked).
    pub left_pending: usize,
    /// Jobs live at the end.
    pub left_jobs: usize,
    /// Registering every host (worker facts, policy check, every plugin's `host_up`).
    pub setup: Duration,
    /// Time in the placement passes of the load phase (pick, reserve, commit, announce).
    pub load_place: Duration,
    /// The placing thread's CPU time in those passes (what `load_place` is without the
    /// time the thread waited for a core).
    pub load_place_cpu: Duration,
    /// The whole load phase (placement, launch, readiness, checks).
    pub load_total: Duration,
    /// The churn phase.
    pub churn_total: Duration,
    /// The teardown (every service deleted, every pool checked).
    pub teardown_total: Duration,
    /// Time spent checking (flushing the API side, comparing, HTTP reads).
    pub check_total: Duration,
    /// The host's time per phase in the load phase.
    pub load_phases: Phases,
    /// The host's time per phase in the load phase's placement passes alone (the
    /// headline's time: `load_place`), so a missed goal says where it went.
    pub place_phases: Phases,
    /// The host's time per phase, over the run.
    pub phases: Phases,
}

impl Report {
    /// Placements per second of the load phase's placement passes.
    pub fn placements_per_s(&self) -> f64 {
        self.replicas as f64 / self.load_place.as_secs_f64().max(1e-9)
    }

    /// Placements per second of the placing thread's CPU time in the load phase's passes:
    /// readable on a shared machine, where the wall-clock figure counts other processes'
    /// load too.
    pub fn placements_per_cpu_s(&self) -> f64 {
        self.replicas as f64 / self.load_place_cpu.as_secs_f64().max(1e-9)
    }

    /// Placements per second of the load phase counting the host's own work only
    /// (scheduler, plugins' `fits`/`reserve`, store commits), not the listeners'.
    pub fn placements_per_s_without_listeners(&self) -> f64 {
        let p = &self.load_phases;
        let own = (p.pick + p.reserve + p.commit).as_secs_f64();
        self.replicas as f64 / own.max(1e-9)
    }
}

/// Port names a generated service picks from (`admin-api` checks the env form `ADMIN_API`).
const NAMES: [(&str, bool); 5] = [
    ("http", false),
    ("metrics", false),
    ("admin-api", false),
    ("grpc", false),
    ("dns", true),
];

struct Sim<'a> {
    cfg: &'a SimConfig,
    cluster: Cluster,
    api: std::sync::Arc<EndpointApi>,
    server: Server,
    model: Model,
    rng: fastrand::Rng,
    keys: Vec<ServiceKey>,
    next_service: u32,
    /// Hosts down: (host, lost yet).
    down: Vec<(u32, bool)>,
    lost_budget: u32,
    touched: BTreeSet<ServiceKey>,
    touched_hosts: BTreeSet<u32>,
    /// Whether the load phase runs (its placement time is the headline figure).
    loading: bool,
    report: Report,
}

/// Runs the scenario of `cfg`.
pub fn run(cfg: &SimConfig) -> Result<Report, SimError> {
    let at = Instant::now();
    let mut sim = Sim::new(cfg)?;
    sim.report.setup = at.elapsed();
    let at = Instant::now();
    sim.load()?;
    sim.report.load_total = at.elapsed();
    sim.full_check();
    let at = Instant::now();
    for i in 0..cfg.churn {
        if i == cfg.churn / 2 {
            let kind = sim.restart();
            *sim.report.churn.entry(kind).or_default() += 1;
        }
        sim.churn_event()?;
    }
    while !sim.down.is_empty() {
        let kind = sim.host_step()?;
        *sim.report.churn.entry(kind).or_default() += 1;
    }
    sim.report.churn_total = at.elapsed();
    sim.full_check();
    let at = Instant::now();
    sim.teardown();
    sim.report.teardown_total = at.elapsed();
    Ok(sim.finish())
}

impl<'a> Sim<'a> {
    fn new(cfg: &'a SimConfig) -> Result<Self, SimError> {
        let workers = Workers::new(cfg.hosts, &cfg.workers)?;
        let policy = AddressPolicy::new(PolicyConfig {
            // Every simulated host advertises a loopback address (see `host_ip`).
            allow_loopback_hosts: vec!["*".into()],
            ..Default::default()
        });
        let (feed, api) = endpoint_table(TableConfig::default());
        let api = std::sync::Arc::new(api);
        let server = Server::start(api.as_ref())?;
        let plugins = || vec![Box::new(PortsPlugin::new()) as Box<dyn ResourcePlugin>];
        let listeners: Vec<Box<dyn ClusterListener>> = vec![Box::new(feed)];
        let mut cluster = Cluster::new(
            Box::new(plugins),
            Box::new(policy),
            listeners,
            workers,
            cfg.hosts,
            cfg.seed ^ 0x5c4e_d01e,
            cfg.fault,
        );
        cluster.expect_jobs(cfg.replicas as usize);
        let (dynamic, reserved) = usable(&cfg.workers)?;
        let mut sim = Sim {
            cfg,
            cluster,
            api,
            server,
            model: Model::new(dynamic, reserved),
            rng: fastrand::Rng::with_seed(cfg.seed),
            keys: Vec::new(),
            next_service: 0,
            down: Vec::new(),
            lost_budget: (cfg.hosts * cfg.lost_hosts_percent).div_ceil(100),
            touched: BTreeSet::new(),
            touched_hosts: BTreeSet::new(),
            loading: false,
            report: Report {
                seed: cfg.seed,
                hosts: cfg.hosts,
                ..Default::default()
            },
        };
        for i in 0..cfg.hosts {
            sim.model.host(host_id(i), host_ip(i));
            sim.cluster.register(i).map_err(|reason| SimError::Host {
                host: host_id(i),
                reason,
            })?;
            sim.touched_hosts.insert(i);
        }
        Ok(sim)
    }

    // --- load ---

    fn load(&mut self) -> Result<(), SimError> {
        let sizes = split(
            &mut self.rng,
            self.cfg.replicas,
            self.cfg.services,
            self.cfg.hosts,
        );
        self.loading = true;
        for size in sizes {
            self.new_service(size)?;
            self.check();
        }
        self.loading = false;
        self.report.load_phases = self.cluster.phases.clone();
        // A launch a hook refused (a granted port found in use on this machine, by a
        // process outside the sim) ends its job, and the slot is placed again: that is one
        // replica placed twice, not two replicas.
        self.report.replicas = self.cluster.placements - self.report.refused;
        Ok(())
    }

    /// Creates a service of `replicas` with 1-3 ports, one in ten with a fixed port.
    fn new_service(&mut self, replicas: u32) -> Result<ServiceKey, SimError> {
        let n = self.next_service;
        self.next_service += 1;
        let key = ServiceKey::new(format!("team-{}", n % 7), format!("svc-{n}"));
        let count = self.rng.usize(1..=3);
        let mut names = NAMES.to_vec();
        self.rng.shuffle(&mut names);
        let fixed = self.rng.u32(..10) == 0;
        let decls: Vec<Decl> = names[..count]
            .iter()
            .enumerate()
            .map(|(i, (name, udp))| Decl {
                name: (*name).to_owned(),
                udp: *udp,
                // A few fixed ports shared by several services, so fits sees "taken".
                fixed: (fixed && i == 0).then(|| 9000 + (n % 40) as u16),
            })
            .collect();
        let ports: Vec<serde_json::Value> = decls
            .iter()
            .map(|d| {
                let mut p = serde_json::json!({
                    "name": d.name,
                    "protocol": if d.udp { "udp" } else { "tcp" },
                });
                if let Some(f) = d.fixed {
                    p["port"] = f.into();
                }
                p
            })
            .collect();
        let profile = serde_json::json!({
            "command": ["/bin/true"],
            "ports": ports,
        });
        self.model.service(&key, decls);
        self.cluster
            .create(&key, replicas, profile)
            .map_err(|reason| SimError::Service {
                service: key.to_string(),
                reason,
            })?;
        self.keys.push(key.clone());
        self.touched.insert(key.clone());
        self.settle();
        Ok(key)
    }

    /// Places every pending slot, starts what was placed and makes it ready, until
    /// nothing more can be placed.
    fn settle(&mut self) {
        loop {
            let before = self.loading.then(|| self.cluster.phases.clone());
            let cpu = self.loading.then(thread_cpu);
            let at = Instant::now();
            let placed = self.cluster.schedule();
            if let Some(before) = before {
                self.report.load_place += at.elapsed();
                self.report.load_place_cpu += thread_cpu().saturating_sub(cpu.unwrap_or_default());
                let pass = self.cluster.phases.since(&before);
                self.report.place_phases.add(&pass);
            }
            if placed.is_empty() {
                return;
            }
            let mut jobs = Vec::with_capacity(placed.len());
            for o in placed {
                let Outcome::Placed {
                    job,
                    service,
                    slot,
                    host,
                } = o
                else {
                    continue;
                };
                let empty = Default::default();
                let grants = self.cluster.grants(&job).unwrap_or(&empty);
                self.model.placed(&job, &service, slot, host, grants);
                self.touched.insert(service);
                self.touched_hosts.insert(host);
                jobs.push(job);
            }
            self.check_batch();
            // The workers' next tick: every new job started (one batch), then the tick
            // after it: every started job ready (one batch).
            let mut started = Vec::with_capacity(jobs.len());
            for o in self.cluster.start_all(&jobs) {
                match o {
                    Outcome::Started { job, env } => {
                        self.model.started(&job, &env);
                        started.push(job);
                    }
                    Outcome::Ended { job } => {
                        self.report.refused += 1;
                        self.model.ended(&job);
                    }
                    Outcome::Placed { .. } => unreachable!("start never places"),
                }
            }
            self.check_batch();
            self.cluster.set_ready_all(&started, true);
            for job in &started {
                self.model.ready(job, true);
            }
        }
    }

    // --- churn ---

    fn churn_event(&mut self) -> Result<(), SimError> {
        let roll = self.rng.u32(..100);
        let kind = match roll {
            0..=34 => self.flap(),
            35..=49 => self.exit(),
            50..=59 => self.scale(),
            60..=69 => self.roll(),
            70..=74 => self.replace()?,
            75 if self.rng.u32(..5) == 0 => self.restart(),
            _ => {
                if self.lost_budget > 0 && self.rng.bool() {
                    self.lose_host()
                } else if !self.down.is_empty() {
                    self.host_step()?
                } else {
                    self.flap()
                }
            }
        };
        *self.report.churn.entry(kind).or_default() += 1;
        self.check();
        Ok(())
    }

    fn random_service(&mut self) -> ServiceKey {
        self.keys[self.rng.usize(..self.keys.len())].clone()
    }

    /// A random live job of a random service in `state`, if it has one.
    fn random_job(&mut self, state: JobState) -> Option<(ServiceKey, String, bool)> {
        let key = self.random_service();
        let jobs: Vec<_> = self
            .cluster
            .service_jobs(&key)
            .into_iter()
            .filter(|j| j.3 == state)
            .collect();
        if jobs.is_empty() {
            return None;
        }
        let (job, _, _, _, ready) = jobs[self.rng.usize(..jobs.len())].clone();
        Some((key, job, ready))
    }

    /// A running replica's readiness probe changes its outcome.
    fn flap(&mut self) -> &'static str {
        if let Some((key, job, ready)) = self.random_job(JobState::Running) {
            self.cluster.set_ready(&job, !ready);
            self.model.ready(&job, !ready);
            self.touched.insert(key);
        }
        "flap"
    }

    /// A running replica exits by itself; its slot gets a new job.
    fn exit(&mut self) -> &'static str {
        if let Some((key, job, _)) = self.random_job(JobState::Running) {
            self.ended(&job, EndReason::Exited { code: Some(1) }, true);
            self.touched.insert(key);
            self.settle();
        }
        "exit"
    }

    fn ended(&mut self, job: &str, reason: EndReason, replace: bool) {
        let hosts = self.model.hosts_of_job(job);
        self.touched_hosts.extend(hosts);
        if let Outcome::Ended { job } = self.cluster.exited(job, reason, replace) {
            self.model.ended(&job);
        }
    }

    /// Drain, stop, gone: how every stop path ends a job. The jobs stopped together are
    /// drained in one worker tick, stopped in the next, and gone in the one after.
    fn stop_jobs(&mut self, jobs: &[String]) {
        if jobs.is_empty() {
            return;
        }
        self.cluster.drain_all(jobs);
        for job in jobs {
            self.model.draining(job);
        }
        self.check_batch();
        self.cluster.stop_all(jobs);
        for job in jobs {
            self.model.stopping(job);
        }
        self.check_batch();
        for job in jobs {
            self.touched_hosts.extend(self.model.hosts_of_job(job));
        }
        for o in self.cluster.exited_all(jobs, &EndReason::Stopped) {
            if let Outcome::Ended { job } = o {
                self.model.ended(&job);
            }
        }
    }

    /// A service scaled up or down by up to a quarter.
    fn scale(&mut self) -> &'static str {
        let key = self.random_service();
        let Some(info) = self.cluster.service(&key) else {
            return "scale";
        };
        let now = info.replicas;
        let step = (now / 4).max(1);
        let up = self.rng.bool();
        let cap = self.cfg.hosts / 2;
        let to = if up {
            (now + step).min(cap.max(now))
        } else {
            now.saturating_sub(step).max(1)
        };
        self.cluster.scale(&key, to);
        let gone: Vec<String> = (self.model.service_jobs(&key).into_iter())
            .filter(|(_, slot)| *slot >= to)
            .map(|(job, _)| job)
            .collect();
        self.stop_jobs(&gone);
        self.touched.insert(key);
        self.settle();
        "scale"
    }

    /// A rolling replacement: a new generation, then per batch of a quarter of the slots
    /// a surge (new jobs placed, started, ready) and a drain of the old ones; checked after
    /// every batch.
    fn roll(&mut self) -> &'static str {
        let key = self.random_service();
        let Some(info) = self.cluster.service(&key) else {
            return "roll";
        };
        let replicas = info.replicas;
        let generation = self.cluster.new_generation(&key);
        self.touched.insert(key.clone());
        let surge = (replicas / 4).max(1);
        let mut slot = 0;
        while slot < replicas {
            let batch = slot..(slot + surge).min(replicas);
            for s in batch.clone() {
                self.cluster.want(&key, s);
            }
            self.settle();
            let jobs = self.cluster.service_jobs(&key);
            let mut old = Vec::new();
            for s in batch.clone() {
                let new_ready = jobs
                    .iter()
                    .any(|j| j.1 == s && j.2 == generation && j.3 == JobState::Running);
                if !new_ready {
                    continue; // the old job stays until a new one runs
                }
                old.extend(
                    (jobs.iter())
                        .filter(|j| j.1 == s && j.2 < generation)
                        .map(|j| j.0.clone()),
                );
            }
            self.stop_jobs(&old);
            self.touched.insert(key.clone());
            self.check();
            slot = batch.end;
        }
        "roll"
    }

    /// A service ends (every job stopped, its ports back in the pools) and a new one of the
    /// same size takes its place.
    fn replace(&mut self) -> Result<&'static str, SimError> {
        let at = self.rng.usize(..self.keys.len());
        let key = self.keys.swap_remove(at);
        let replicas = self.cluster.service(&key).map_or(1, |s| s.replicas);
        self.delete(&key);
        self.check();
        self.new_service(replicas)?;
        Ok("replace")
    }

    fn delete(&mut self, key: &ServiceKey) {
        self.touched_hosts.extend(self.model.hosts_of(key));
        self.cluster.scale(key, 0);
        let jobs: Vec<String> = (self.model.service_jobs(key).into_iter())
            .map(|(job, _)| job)
            .collect();
        self.stop_jobs(&jobs);
        self.cluster.remove(key);
        self.model.service_removed(key);
        self.touched.insert(key.clone());
    }

    /// The controller restarts: its plugins are rebuilt from the store, its listeners
    /// resynced; then everything is checked (pools as before, no index back).
    fn restart(&mut self) -> &'static str {
        self.report.restarts += 1;
        for refused in self.cluster.restart() {
            self.model
                .violations
                .push(format!("controller restart: {refused}"));
        }
        self.full_check();
        "restart"
    }

    /// A host stops heartbeating (later: lost, then back).
    fn lose_host(&mut self) -> &'static str {
        let h = self.rng.u32(..self.cfg.hosts);
        if self.down.iter().any(|(d, _)| *d == h) {
            return "skipped"; // already down: nothing happened
        }
        self.lost_budget -= 1;
        self.down.push((h, false));
        self.cluster.unreachable(h);
        self.model.unreachable(h);
        self.touch_host_services(h);
        "unreachable"
    }

    /// The oldest down host moves on: unreachable → lost (its replicas placed elsewhere),
    /// lost → registered again.
    fn host_step(&mut self) -> Result<&'static str, SimError> {
        let (h, lost) = self.down.remove(0);
        self.touch_host_services(h);
        self.touched_hosts.insert(h);
        if !lost {
            for o in self.cluster.lost(h) {
                if let Outcome::Ended { job } = o {
                    self.model.ended(&job);
                }
            }
            self.settle();
            self.down.push((h, true));
            Ok("lost")
        } else {
            self.cluster.register(h).map_err(|reason| SimError::Host {
                host: host_id(h),
                reason,
            })?;
            Ok("back")
        }
    }

    fn touch_host_services(&mut self, h: u32) {
        for job in self.model.jobs_on(h) {
            if let Some(key) = self.model.service_of(&job) {
                self.touched.insert(key);
            }
        }
    }

    // --- teardown and checks ---

    /// Every service ends: every pool must be back to its initial free count.
    fn teardown(&mut self) {
        for key in std::mem::take(&mut self.keys) {
            self.delete(&key);
            self.check();
        }
        for h in 0..self.cfg.hosts {
            self.touched_hosts.insert(h);
        }
        self.check();
    }

    fn finish(mut self) -> Report {
        let m = &self.model;
        self.report.violations = m.violations.clone();
        self.report.checks = m.checks;
        self.report.env_checked = m.env_checked;
        self.report.placements = self.cluster.placements;
        self.report.unplaced = self.cluster.unplaced;
        self.report.commits = self.cluster.commits();
        self.report.left_pending = self.cluster.pending();
        self.report.left_jobs = self.cluster.live_jobs();
        self.report.phases = self.cluster.phases.clone();
        self.report
    }
}

/// The ports "any free" may come from, as the model sees the workers' settings: the range
/// below the ephemeral range, and the reserved list. Read here, independently of the
/// plugin's own parsing.
fn usable(w: &crate::worker::WorkerSettings) -> Result<((u16, u16), Vec<u16>), SimError> {
    let bad = || SimError::Config(format!("range {:?} is not lo-hi", w.range));
    let (lo, hi) = w.range.split_once('-').ok_or_else(bad)?;
    let (lo, mut hi): (u16, u16) = (
        lo.trim().parse().map_err(|_| bad())?,
        hi.trim().parse().map_err(|_| bad())?,
    );
    if let Ok(text) = std::fs::read_to_string(&w.ephemeral_range_file) {
        if let Some(e_lo) = text
            .split_whitespace()
            .next()
            .and_then(|t| t.parse::<u16>().ok())
        {
            if e_lo <= hi {
                hi = e_lo.saturating_sub(1);
            }
        }
    }
    Ok(((lo, hi), w.reserved.clone()))
}

/// Splits `total` replicas over `services` at random (each at least 1, at most `hosts / 2`
/// so a fixed port always has room), summing to `total` exactly.
fn split(rng: &mut fastrand::Rng, total: u32, services: u32, hosts: u32) -> Vec<u32> {
    let cap = (hosts / 2).max(1);
    let weights: Vec<u64> = (0..services).map(|_| rng.u64(1..=100)).collect();
    let sum: u64 = weights.iter().sum();
    let mut sizes: Vec<u32> = weights
        .iter()
        .map(|w| ((u64::from(total) * w / sum) as u32).clamp(1, cap))
        .collect();
    let mut have: i64 = sizes.iter().map(|&s| i64::from(s)).sum();
    let mut i = 0;
    while have != i64::from(total) {
        let len = sizes.len();
        let s = &mut sizes[i % len];
        if have < i64::from(total) && *s < cap {
            *s += 1;
            have += 1;
        } else if have > i64::from(total) && *s > 1 {
            *s -= 1;
            have -= 1;
        }
        i += 1;
    }
    sizes
}
