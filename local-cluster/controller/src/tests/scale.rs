//! Big services through the real core: a 10,000-replica service is placed, scaled down
//! and stopped in passes whose batches stay within the store's limit (on the embedded
//! stores and on a real etcd), a failed batch leaves exactly what the committed batches
//! made, and a retry completes it; a pass builds its facts once, not once per batch.
//! Then the numbers: 50,000 replicas on 1,000 hosts.

use super::*;
use xce_model::rollout::RolloutState;
use xce_model::Cluster;
use xce_store::testing::TestEtcd;
use xce_store::{BatchLimit, RedbStore};

/// What the etcd store allows with etcd's defaults (`--max-txn-ops=128` with the fence,
/// about 1 MiB of keys and values), for the embedded stores to cut their passes as
/// small as etcd does.
pub(super) fn etcd_like() -> BatchLimit {
    xce_store::EtcdStore::new(vec!["127.0.0.1:1".into()])
        .unwrap()
        .batch_limit()
}

/// A store that records the size of every batch it is asked to commit, claims a batch
/// limit, and can fail one commit.
pub(super) struct Recording {
    inner: Arc<dyn Store>,
    limit: BatchLimit,
    /// `(ops, bytes)` of every batch, failed ones too.
    batches: Mutex<Vec<(usize, usize)>>,
    /// Commits to let through before one fails.
    fail_after: Mutex<Option<usize>>,
}

impl Recording {
    pub(super) fn new(inner: Arc<dyn Store>, limit: BatchLimit) -> Arc<Self> {
        Arc::new(Recording {
            inner,
            limit,
            batches: Mutex::default(),
            fail_after: Mutex::default(),
        })
    }

    pub(super) fn take(&self) -> Vec<(usize, usize)> {
        std::mem::take(&mut self.batches.lock().unwrap())
    }

    /// Asserts that no batch so far was above the limit; returns how many there were.
    pub(super) fn assert_within(&self, what: &str) -> usize {
        let batches = self.take();
        for (i, (ops, bytes)) in batches.iter().enumerate() {
            assert!(
                *ops <= self.limit.ops && *bytes <= self.limit.bytes,
                "{what}: batch {i} has {ops} ops and {bytes} bytes, above {:?}",
                self.limit
            );
        }
        batches.len()
    }
}

impl Store for Recording {
    fn load_all(&self) -> Result<Vec<(Key, Vec<u8>)>, StoreError> {
        self.inner.load_all()
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.batches
            .lock()
            .unwrap()
            .push((batch.ops.len(), batch.bytes()));
        let mut fail = self.fail_after.lock().unwrap();
        match *fail {
            Some(0) => {
                *fail = None;
                return Err(StoreError::Injected);
            }
            Some(n) => *fail = Some(n - 1),
            None => {}
        }
        self.inner.commit(batch)
    }
    fn put_if_absent(&self, key: Key, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        self.inner.put_if_absent(key, value)
    }
    fn batch_limit(&self) -> BatchLimit {
        self.limit
    }
    /// As etcd, whose limits these tests hold the batches to.
    fn journals_events(&self) -> bool {
        true
    }
}

/// A core on `store` with `hosts` hosts of `slots` slots each.
fn cluster(store: Arc<dyn Store>, hosts: usize, slots: u64, now: Instant) -> (Core, SharedSlots) {
    let plugin = SharedSlots::new();
    let mut core = core_with(store, plugin.clone(), vec![], now);
    for i in 0..hosts {
        let facts = facts_at(&format!("10.{}.{}.1", i / 256, i % 256), slots);
        register_on(&mut core, &host_name(i), facts, now);
    }
    core.settle(now);
    (core, plugin)
}

fn host_name(i: usize) -> String {
    format!("exec-{i:04}")
}

/// `(job, host, grants)` of every job of the view.
fn placed(core: &Core) -> BTreeSet<(String, String, String)> {
    core.view()
        .borrow()
        .services
        .values()
        .flat_map(|s| &s.jobs)
        .map(|j| {
            (
                j.info.job.clone(),
                j.info.host.clone(),
                serde_json::to_string(&j.info.grants).unwrap(),
            )
        })
        .collect()
}

/// The same, as the store has it.
fn stored(store: &dyn Store) -> BTreeSet<(String, String, String)> {
    Cluster::load(store)
        .unwrap()
        .jobs
        .into_values()
        .map(|j| {
            (
                j.info.job.clone(),
                j.info.host.clone(),
                serde_json::to_string(&j.info.grants).unwrap(),
            )
        })
        .collect()
}

/// The plugin's reservations as `(job, host)`, with every slot held once.
fn reserved(plugin: &SharedSlots) -> BTreeSet<(String, String)> {
    let s = plugin.0.lock().unwrap();
    s.used
        .iter()
        .map(|((h, _), j)| (j.clone(), h.clone()))
        .collect()
}

fn jobs_of(placed: &BTreeSet<(String, String, String)>) -> BTreeSet<(String, String)> {
    placed
        .iter()
        .map(|(j, h, _)| (j.clone(), h.clone()))
        .collect()
}

const BIG: u32 = 10_000;

#[test]
fn a_ten_thousand_replica_service_is_placed_in_passes_within_the_batch_limit() {
    let dir = tempfile::tempdir().unwrap();
    let stores: [(&str, Arc<dyn Store>, BatchLimit); 2] = [
        (
            "MemStore with etcd's limit",
            Arc::new(MemStore::new()),
            etcd_like(),
        ),
        (
            "RedbStore",
            Arc::new(RedbStore::open(dir.path().join("big.redb")).unwrap()),
            BatchLimit::EMBEDDED,
        ),
    ];
    for (name, inner, limit) in stores {
        let store = Recording::new(inner, limit);
        let (core, _) = place_big(name, store.clone(), 101, &*store);
        let view = core.view();
        let svc = &view.borrow().services[&ServiceKey::new("default", "big")];
        assert!(svc.pending.is_empty(), "{name}: {:?}", svc.pending.first());
        // Spread evenly: 100 per host.
        let per_host: BTreeSet<usize> = (0..100)
            .map(|i| {
                svc.jobs
                    .iter()
                    .filter(|j| j.info.host == host_name(i))
                    .count()
            })
            .collect();
        assert_eq!(per_host, [100].into(), "{name}");
    }
}

#[test]
fn a_failed_pass_leaves_what_the_committed_passes_made_and_a_retry_completes_it() {
    let store = Recording::new(Arc::new(MemStore::new()), etcd_like());
    let now = Instant::now();
    let (core, plugin) = cluster(store.clone(), 100, 100, now);
    failed_pass_in(core, plugin, store, now);
}

/// The body of the failed-pass test, on a core with 100 empty hosts.
fn failed_pass_in(mut core: Core, plugin: SharedSlots, store: Arc<Recording>, now: Instant) {
    let key = ServiceKey::new("default", "big");
    // The submit, two batches of the pass, then its third batch fails.
    *store.fail_after.lock().unwrap() = Some(3);
    submit_on(&mut core, web("big", "default", BIG), now);
    store.assert_within("failed pass");
    let jobs = placed(&core);
    assert!(
        !jobs.is_empty() && jobs.len() < BIG as usize,
        "two batches placed part: {}",
        jobs.len()
    );
    assert_eq!(
        stored(&*store),
        jobs,
        "the store has exactly the committed batches"
    );
    assert_eq!(
        reserved(&plugin),
        jobs_of(&jobs),
        "the failed pass's reservations were released"
    );
    let pending = core.view().borrow().services[&key].pending.clone();
    assert_eq!(pending.len(), BIG as usize - jobs.len());
    assert!(
        pending
            .iter()
            .all(|(_, why)| why == "the controller's store failed"),
        "{:?}",
        pending.first()
    );
    // The retry (the next timer's settle) completes it.
    core.mark_dirty();
    core.settle(now + Duration::from_secs(2));
    store.assert_within("retry");
    let all = placed(&core);
    assert_eq!(all.len(), BIG as usize);
    assert!(
        jobs.is_subset(&all),
        "the committed batches' jobs stay as they were"
    );
    assert_eq!(stored(&*store), all);
    assert_eq!(reserved(&plugin), jobs_of(&all));
}

/// Reports every job of the view as started and ready, one worker batch per host.
fn start_all(core: &mut Core, now: Instant) {
    let jobs: Vec<(String, String)> = placed(core).into_iter().map(|(j, h, _)| (h, j)).collect();
    let mut by_host: BTreeMap<String, Vec<WorkerEvent>> = BTreeMap::new();
    for (h, j) in jobs {
        let events = by_host.entry(h).or_default();
        events.push(started(&j));
        events.push(ready(&j, true));
    }
    for (h, events) in by_host {
        core.events(&h, &worker(&h), events, now).unwrap();
        core.settle(now);
    }
}

/// Reports every job the view shows as stopping as exited, one worker batch per host.
fn exit_stopping(core: &mut Core, now: Instant) {
    let mut by_host: BTreeMap<String, Vec<WorkerEvent>> = BTreeMap::new();
    for s in core.view().borrow().services.values() {
        for j in s.jobs.iter().filter(|j| j.info.state == JobState::Stopping) {
            by_host
                .entry(j.info.host.clone())
                .or_default()
                .push(exited(&j.info.job));
        }
    }
    for (h, events) in by_host {
        core.events(&h, &worker(&h), events, now).unwrap();
    }
    core.settle(now);
}

/// 6 s later (every drain over), every host heard: the timers fire and settle. Returns
/// the new time.
fn after_the_drains(core: &mut Core, now: Instant) -> Instant {
    let now = now + Duration::from_secs(6);
    heartbeat_all(core, now);
    core.tick(now, None);
    core.settle(now);
    now
}

/// Every host's worker heartbeats (so a tick finds none of them silent).
fn heartbeat_all(core: &mut Core, now: Instant) {
    for i in 0..100 {
        let h = host_name(i);
        core.heartbeat(&h, &worker(&h), None, now).unwrap();
    }
}

fn states(core: &Core, key: &ServiceKey) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    if let Some(s) = core.view().borrow().services.get(key) {
        for j in &s.jobs {
            *out.entry(j.info.state.to_string()).or_default() += 1;
        }
    }
    out
}

#[test]
fn scaling_down_and_stopping_a_ten_thousand_replica_service_are_bounded_batches() {
    let store = Recording::new(Arc::new(MemStore::new()), etcd_like());
    let mut now = Instant::now();
    let (mut core, plugin) = cluster(store.clone(), 100, 100, now);
    let key = ServiceKey::new("default", "big");
    submit_on(&mut core, web("big", "default", BIG), now);
    start_all(&mut core, now);
    assert_eq!(
        states(&core, &key),
        [("running".into(), BIG as usize)].into()
    );

    // Scale-down: 9,990 drains, then 9,990 stops when the drain is over, then exits.
    core.scale(&key, 10, &admin(), now).unwrap();
    core.settle(now);
    assert_eq!(
        states(&core, &key),
        [("draining".into(), 9990), ("running".into(), 10)].into()
    );
    now = after_the_drains(&mut core, now);
    assert_eq!(
        states(&core, &key),
        [("running".into(), 10), ("stopping".into(), 9990)].into()
    );
    exit_stopping(&mut core, now);
    assert_eq!(states(&core, &key), [("running".into(), 10)].into());
    assert_eq!(
        reserved(&plugin).len(),
        10,
        "the scaled-away grants are released"
    );
    store.assert_within("scale-down");

    // Back to 10,000 and a stop: every job drains, stops and ends, in bounded batches.
    core.scale(&key, u64::from(BIG), &admin(), now).unwrap();
    core.settle(now);
    start_all(&mut core, now);
    assert_eq!(
        states(&core, &key),
        [("running".into(), BIG as usize)].into()
    );
    store.take();
    assert_eq!(
        core.delete(&key, false, &admin(), now).unwrap(),
        BIG as usize
    );
    core.settle(now);
    assert_eq!(
        states(&core, &key),
        [("draining".into(), BIG as usize)].into()
    );
    now = after_the_drains(&mut core, now);
    assert_eq!(
        states(&core, &key),
        [("stopping".into(), BIG as usize)].into()
    );
    exit_stopping(&mut core, now);
    assert!(
        !core.view().borrow().services.contains_key(&key),
        "the service is gone"
    );
    assert!(reserved(&plugin).is_empty(), "every grant released");
    let batches = store.assert_within("stop");
    assert!(
        batches > 2 * (BIG as usize).div_ceil(etcd_like().ops),
        "{batches}"
    );
}

#[test]
fn a_stop_now_of_a_ten_thousand_replica_service_skips_the_drain_in_every_batch() {
    let store = Recording::new(Arc::new(MemStore::new()), etcd_like());
    let now = Instant::now();
    let (mut core, _) = cluster(store.clone(), 100, 100, now);
    let key = ServiceKey::new("default", "big");
    submit_on(&mut core, web("big", "default", BIG), now);
    start_all(&mut core, now);
    store.take();
    core.delete(&key, true, &admin(), now).unwrap();
    let first = Cluster::load(&*store)
        .unwrap()
        .jobs
        .values()
        .filter(|j| j.info.state == JobState::Stopping)
        .count();
    assert!(first < BIG as usize, "one batch holds part: {first}");
    // The jobs the stop's own batch had no room for skip the drain too, also after a
    // restart (`stop_now` is stored with the service).
    drop(core);
    let wiring = Wiring {
        resources: vec![Box::new(SharedSlots::new())],
        policies: vec![Arc::new(Policy)],
        listeners: vec![],
        job_tag: plain_ids,
    };
    let mut core = Core::load(TIMING, store.clone(), wiring, Metrics::default(), now).unwrap();
    core.settle(now);
    assert_eq!(
        states(&core, &key),
        [("stopping".into(), BIG as usize)].into()
    );
    store.assert_within("stop now");
}

#[test]
fn a_ten_thousand_replica_service_is_placed_on_etcd_in_transactions_without_the_journal() {
    let etcd = TestEtcd::start();
    let inner = Arc::new(etcd.store("/xce/"));
    let limit = inner.batch_limit();
    let store = Recording::new(inner, limit);
    // Within the limit, every batch is one etcd transaction: the journal is never used;
    // and a fresh reader of the store sees every replica.
    place_big("etcd", store, 100, &etcd.store("/xce/"));
}

/// Places a service of [`BIG`] replicas on 100 hosts of `slots` in one settle and checks
/// what every store must show: every batch within `store`'s limit, at least as many
/// batches as the limit needs, every replica placed, `reader` (the store, or a fresh
/// reader of it) holding exactly the placed jobs, and one grant per job.
fn place_big(
    name: &str,
    store: Arc<Recording>,
    slots: u64,
    reader: &dyn Store,
) -> (Core, SharedSlots) {
    let now = Instant::now();
    let limit = store.batch_limit();
    let (mut core, plugin) = cluster(store.clone(), 100, slots, now);
    store.take();
    submit_on(&mut core, web("big", "default", BIG), now);
    let batches = store.assert_within(name);
    let jobs = placed(&core);
    assert_eq!(jobs.len(), BIG as usize, "{name}: every replica placed");
    // The submit and the passes: at least as many as the limit needs.
    let least = (BIG as usize).div_ceil(limit.ops) + 1;
    assert!(
        batches >= least,
        "{name}: {batches} batches, at least {least}"
    );
    assert_eq!(
        stored(reader),
        jobs,
        "{name}: the store has what the view shows"
    );
    assert_eq!(
        reserved(&plugin),
        jobs_of(&jobs),
        "{name}: one grant per job"
    );
    (core, plugin)
}

/// The controller README's scale numbers, in-process (`cargo test --release -p
/// xce-controller --lib numbers_fifty -- --nocapture`): 50,000 replicas — one service of
/// 10,000 and forty of 1,000 — on 1,000 hosts of 60 slots, submitted and settled one
/// service at a time as the state task does, on MemStore, RedbStore and a real etcd;
/// then a fresh core loads each store's state (store read, records rebuilt, `host_up` and
/// `restore` into the plugin, the listeners' resync, the first view), and the resident
/// memory the loaded core added is divided by its replicas (the first core stays alive,
/// so the new one cannot reuse its memory). A debug build runs a tenth of everything.
/// Only counts are asserted; every figure is printed as a `SUMMARY scale` line.
#[test]
fn numbers_fifty_thousand_replicas_on_a_thousand_hosts() {
    let tenth = if cfg!(debug_assertions) { 10 } else { 1 };
    let hosts = 1000 / tenth;
    let mut services: Vec<(String, u32)> = vec![("big".into(), BIG / tenth as u32)];
    services.extend((0..40).map(|i| (format!("s{i:02}"), 1000 / tenth as u32)));
    let total: usize = services.iter().map(|(_, n)| *n as usize).sum();
    let dir = tempfile::tempdir().unwrap();
    let etcd = TestEtcd::start();
    let stores: [(&str, Arc<dyn Store>); 3] = [
        ("mem", Arc::new(MemStore::new())),
        (
            "redb",
            Arc::new(RedbStore::open(dir.path().join("n.redb")).unwrap()),
        ),
        ("etcd", Arc::new(etcd.store("/xce/"))),
    ];
    let mut line = vec![format!("replicas={total} hosts={hosts}")];
    let mut kept = Vec::new();
    for (name, inner) in stores {
        let limit = inner.batch_limit();
        let store = Recording::new(inner.clone(), limit);
        let now = Instant::now();
        let (mut core, _) = cluster(store.clone(), hosts, 60, now);
        store.take();
        let t = std::time::Instant::now();
        for (svc, n) in &services {
            submit_on(&mut core, web(svc, "default", *n), now);
        }
        let took = t.elapsed().as_secs_f64();
        let batches = store.assert_within(name);
        let view = core.view();
        let jobs: usize = view.borrow().services.values().map(|s| s.jobs.len()).sum();
        let pending: usize = view
            .borrow()
            .services
            .values()
            .map(|s| s.pending.len())
            .sum();
        assert_eq!((jobs, pending), (total, 0), "{name}: every replica placed");
        // A sample of 100 workers reports its jobs started and ready, one batch each,
        // each settled as the state task does: what one report costs at this size (each
        // settle is still a pass over every service and a new view of every job).
        let mut by_host: BTreeMap<String, Vec<WorkerEvent>> = BTreeMap::new();
        for (j, h, _) in placed(&core) {
            if by_host.len() < 100 || by_host.contains_key(&h) {
                let events = by_host.entry(h).or_default();
                events.push(started(&j));
                events.push(ready(&j, true));
            }
        }
        let sample = by_host.values().map(|e| e.len() / 2).sum::<usize>();
        let t = std::time::Instant::now();
        for (h, events) in by_host {
            core.events(&h, &worker(&h), events, now).unwrap();
            core.settle(now);
        }
        let started = t.elapsed().as_secs_f64();
        let ready = view
            .borrow()
            .services
            .values()
            .flat_map(|s| &s.jobs)
            .filter(|j| j.info.ready)
            .count();
        assert_eq!(ready, sample, "{name}: every sampled replica ready");
        store.assert_within(name);
        line.push(format!(
            "placements_per_s_{name}={:.0} batches_{name}={batches} ready_per_s_{name}={:.0}",
            total as f64 / took,
            sample as f64 / started
        ));
        if name == "mem" {
            continue;
        }
        // A fresh controller loads what the store holds (for etcd, a new client as a
        // restarted process would have).
        let source: Arc<dyn Store> = if name == "etcd" {
            Arc::new(etcd.store("/xce/"))
        } else {
            inner
        };
        let wiring = Wiring {
            resources: vec![Box::new(SharedSlots::new())],
            policies: vec![Arc::new(Policy)],
            listeners: vec![],
            job_tag: plain_ids,
        };
        let rss = testkit::rss_kib(std::process::id());
        let t = std::time::Instant::now();
        let loaded = Core::load(TIMING, source, wiring, Metrics::default(), now).unwrap();
        let load = t.elapsed().as_secs_f64();
        let grew = testkit::rss_kib(std::process::id()).saturating_sub(rss);
        let loaded_jobs: usize = loaded
            .view()
            .borrow()
            .services
            .values()
            .map(|s| s.jobs.len())
            .sum();
        assert_eq!(loaded_jobs, total, "{name}: the load sees every job");
        let goal = if name == "etcd" { 5.0 } else { 2.0 };
        line.push(format!(
            "load_{name}_s={load:.3} load_{name}_of_goal={:.2} controller_bytes_per_replica_{name}={:.0}",
            load / goal,
            grew as f64 * 1024.0 / total as f64
        ));
        kept.push((core, loaded));
    }
    println!("SUMMARY scale {}", line.join(" "));
}

/// The slot plugin, refusing more replicas than every host's slots together
/// ([`ResourcePlugin::check_replicas`], as the ports plugin does for ports).
struct Capped(SharedSlots);

impl ResourcePlugin for Capped {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn validate(&self, s: Option<&Value>) -> Result<SectionInfo, Vec<FieldError>> {
        self.0.validate(s)
    }
    fn check_replicas(&self, _: Option<&Value>, replicas: u32) -> Result<(), Vec<FieldError>> {
        let total: u64 = self.0 .0.lock().unwrap().capacity.values().sum();
        if u64::from(replicas) > total {
            return Err(vec![FieldError::new(
                "service.slots",
                format!("{replicas} replicas need more slots than all hosts have ({total})"),
            )]);
        }
        Ok(())
    }
    fn host_up(&mut self, host: &HostId, facts: &HostFacts) -> Result<(), FieldError> {
        self.0.host_up(host, facts)
    }
    fn host_removed(&mut self, host: &HostId) {
        self.0.host_removed(host)
    }
    fn fits(&self, host: &HostId, req: &PlacementRequest<'_>) -> Result<(), Unfit> {
        self.0.fits(host, req)
    }
    fn reserve(&mut self, host: &HostId, req: &PlacementRequest<'_>) -> Result<Grant, Unfit> {
        self.0.reserve(host, req)
    }
    fn release(&mut self, host: &HostId, job: &JobId) {
        self.0.release(host, job)
    }
    fn restore(&mut self, host: &HostId, job: &JobId, grant: &Grant) -> Result<(), String> {
        self.0.restore(host, job, grant)
    }
}

/// `replicas` above 10,000, or above what every host together holds, is refused on
/// submit and on scale, naming the field and the reason; at the limit it is accepted.
#[test]
fn replicas_above_the_limit_or_the_whole_cluster_are_refused() {
    let wiring = Wiring {
        resources: vec![Box::new(Capped(SharedSlots::new()))],
        policies: vec![Arc::new(Policy)],
        listeners: vec![],
        job_tag: plain_ids,
    };
    let now = Instant::now();
    let store = Arc::new(MemStore::new());
    let mut core = Core::load(TIMING, store, wiring, Metrics::default(), now).unwrap();
    for i in 0..2 {
        let h = host_name(i);
        let req = RegisterRequest {
            facts: facts_at(&format!("10.0.0.{}", i + 1), 4999),
            running: vec![],
            wants_session: false,
        };
        core.register(&h, &worker(&h), req, now).unwrap();
    }
    let err = |r: Result<(), core::CoreError>| match r {
        Err(core::CoreError::Invalid(errs)) => errs
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; "),
        other => format!("{other:?}"),
    };
    let mut out = Vec::new();
    for n in [10_001, 10_000, 9_000] {
        let r = core.submit(web("big", "default", n), None, &admin(), now);
        out.push(format!("submit {n}: {}", err(r.map(|_| ()))));
    }
    // (Not settled: placing 9,000 replicas is not what this test is about.)
    let key = ServiceKey::new("default", "big");
    for n in [10_001, 10_000, 2] {
        let r = core.scale(&key, n, &admin(), now);
        out.push(format!("scale {n}: {}", err(r)));
    }
    expect![[r#"
        submit 10001: service.replicas: must be between 1 and 10000
        submit 10000: service.slots: 10000 replicas need more slots than all hosts have (9998)
        submit 9000: Ok(())
        scale 10001: replicas: must be between 1 and 10000
        scale 10000: replicas: service.slots: 10000 replicas need more slots than all hosts have (9998)
        scale 2: Ok(())"#]]
    .assert_eq(&out.join("\n"));
}

/// A pass's cost follows what it changes, not the service's size: placing a
/// 10,000-replica service in etcd's batches (~120 jobs each) builds each job's facts a
/// few times in all (once in the pass, twice for the view: 30,000). When every batch was
/// a pass of its own, each pass built the facts of every job placed so far again: 85
/// passes, 876,640 facts.
#[test]
fn placing_a_ten_thousand_replica_service_in_small_batches_builds_its_facts_a_few_times() {
    let store = Recording::new(Arc::new(MemStore::new()), etcd_like());
    let now = Instant::now();
    let (mut core, _) = cluster(store.clone(), 100, 100, now);
    store.take();
    let before = core.facts_built();
    submit_on(&mut core, web("big", "default", BIG), now);
    let built = core.facts_built() - before;
    let batches = store.assert_within("placing");
    assert!(
        batches > (BIG as usize).div_ceil(etcd_like().ops),
        "cut into many batches: {batches}"
    );
    assert_eq!(placed(&core).len(), BIG as usize);
    assert!(
        built <= 4 * BIG as usize,
        "{built} job facts built for {BIG} replicas placed in {batches} batches"
    );
}

/// A settle's cost follows what its commits wrote, not the size of the services they
/// wrote: with `min_ready`, readiness moves a rollout on, so every settle of a wave of
/// reports visits the service; reports starting and readying a 10,000-replica service
/// host by host (100 settles) build each job's facts a few times in all, the view's
/// included (39,900). Built whole at every visit they were 1,020,000. Then time alone
/// makes them available (the kept facts ripen) and the rollout completes.
#[test]
fn settles_while_a_ten_thousand_replica_service_gets_ready_build_its_facts_a_few_times() {
    let store = Recording::new(Arc::new(MemStore::new()), etcd_like());
    let now = Instant::now();
    let (mut core, _) = cluster(store.clone(), 100, 100, now);
    let doc = json!({"service": {"name": "big", "replicas": BIG, "command": ["sleep", "1000"],
                                 "update": {"min_ready": "10s"}}});
    submit_on(&mut core, doc, now);
    let key = ServiceKey::new("default", "big");
    let before = core.facts_built();
    let visits = core.metrics().pass_visits.get();
    start_all(&mut core, now);
    let built = core.facts_built() - before;
    assert!(
        core.metrics().pass_visits.get() - visits >= 100,
        "every settle visits the service"
    );
    assert!(
        built <= 6 * BIG as usize,
        "{built} job facts built while {BIG} replicas got ready in 100 settles"
    );
    let rollout = |core: &Core| core.view().borrow().services[&key].rollout.state;
    assert_eq!(rollout(&core), RolloutState::Progressing);
    let later = now + Duration::from_secs(11);
    heartbeat_all(&mut core, later);
    core.tick(later, None);
    // The state task's timer for the service's `min_ready` fired.
    core.mark_dirty();
    core.settle(later);
    assert_eq!(rollout(&core), RolloutState::Complete);
    assert_eq!(core.view().borrow().services[&key].counts.available, BIG);
}

/// A limit of a few records per batch: a visit that places many replicas goes on over
/// many batches, and every replica is placed exactly once across
/// them — one job per slot, each announced placed once, each with its own grant, the
/// store holding what the view shows.
#[test]
fn a_big_placement_in_tiny_batches_places_every_replica_exactly_once() {
    const N: u32 = 2_000;
    let tiny = BatchLimit {
        ops: 16,
        ..etcd_like()
    };
    let store = Recording::new(Arc::new(MemStore::new()), tiny);
    let now = Instant::now();
    let raw = RawEvents::default();
    let plugin = SharedSlots::new();
    let mut core = core_with(
        store.clone(),
        plugin.clone(),
        vec![Arc::new(raw.clone())],
        now,
    );
    for i in 0..20 {
        let facts = facts_at(&format!("10.0.{i}.1"), 100);
        register_on(&mut core, &host_name(i), facts, now);
    }
    core.settle(now);
    store.take();
    raw.take();
    submit_on(&mut core, web("big", "default", N), now);
    let batches = store.assert_within("tiny batches");
    assert!(batches > N as usize / tiny.ops, "{batches} batches");
    let mut placed_events: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for e in raw.take() {
        if let ClusterEvent::Job { job, .. } = e {
            if job.state == JobState::Placed {
                placed_events.entry(job.replica).or_default().push(job.job);
            }
        }
    }
    let once: BTreeSet<u32> = placed_events
        .iter()
        .filter(|(_, jobs)| jobs.len() == 1)
        .map(|(r, _)| *r)
        .collect();
    assert_eq!(once, (0..N).collect(), "every replica placed exactly once");
    let jobs = placed(&core);
    let ids: BTreeSet<String> = jobs.iter().map(|(j, _, _)| j.clone()).collect();
    let announced: BTreeSet<String> = placed_events.into_values().flatten().collect();
    assert_eq!(ids, announced, "the view holds the jobs announced");
    let view = core.view();
    let slots: BTreeSet<u32> = view.borrow().services[&ServiceKey::new("default", "big")]
        .jobs
        .iter()
        .map(|j| j.info.replica)
        .collect();
    assert_eq!(slots.len(), N as usize, "one job per slot");
    assert_eq!(stored(&*store), jobs, "the store has what the view shows");
    assert_eq!(reserved(&plugin), jobs_of(&jobs), "one grant per job");
}
