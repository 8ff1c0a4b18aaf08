//! The controller README's "Numbers": one batch per scheduling pass, and the events
//! journaled only to a store others follow.

use super::*;

/// A store that counts the batches committed to it.
struct Counting {
    inner: Arc<dyn Store>,
    commits: std::sync::atomic::AtomicUsize,
    /// What it answers to `journals_events` (as etcd when true).
    journals: bool,
}

impl Counting {
    /// A core with one slots plugin on a counting `inner`.
    fn core(inner: Arc<dyn Store>, journals: bool, now: Instant) -> (Arc<Counting>, Core) {
        let store = Arc::new(Counting {
            inner,
            commits: 0.into(),
            journals,
        });
        let core = core_with(store.clone(), SharedSlots::new(), vec![], now);
        (store, core)
    }
}

impl Store for Counting {
    fn load_all(&self) -> Result<Vec<(Key, Vec<u8>)>, StoreError> {
        self.inner.load_all()
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        self.commits
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.commit(batch)
    }
    fn put_if_absent(&self, key: Key, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        self.inner.put_if_absent(key, value)
    }
    fn journals_events(&self) -> bool {
        self.journals
    }
}

/// Each batch carries its events (`meta/events`) only to a store others follow: an
/// embedded store has no reader for them. In the followed one they are the last batch's.
#[test]
fn only_a_followed_store_gets_the_batches_events() {
    for journals in [false, true] {
        let inner = Arc::new(MemStore::new());
        let now = Instant::now();
        let (store, mut core) = Counting::core(inner.clone(), journals, now);
        register_on(&mut core, "exec-01", facts_of("exec-01", 10), now);
        submit_on(&mut core, web("web", "default", 3), now);
        let stored = inner.load_all().unwrap();
        let events = stored.iter().find(|(k, _)| *k == xce_model::events_key());
        match (journals, events) {
            (false, None) => {}
            (true, Some((_, bytes))) => {
                let last = xce_model::decode_events(bytes, |_| None).unwrap();
                let placed = last
                    .iter()
                    .filter(|e| matches!(e, ClusterEvent::Job { .. }))
                    .count();
                assert_eq!(placed, 3, "the placing batch's events: {last:?}");
            }
            (j, e) => panic!("journals_events={j}: meta/events stored: {}", e.is_some()),
        }
        assert!(store.commits.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    }
}

/// The stored format and the events' references, read back from `store`.
fn format_and_references(store: &dyn Store) -> (u64, usize) {
    let stored = store.load_all().unwrap();
    let format = stored
        .iter()
        .find(|(k, _)| *k == xce_model::format_key())
        .map(|(_, v)| xce_model::decode_format(v).unwrap())
        .unwrap();
    let events = stored
        .iter()
        .find(|(k, _)| *k == xce_model::events_key())
        .map(|(_, v)| v.clone())
        .unwrap();
    let jobs: std::collections::HashMap<String, Vec<u8>> = stored
        .iter()
        .filter(|(k, _)| k.ns == xce_model::JOB_NAMESPACE)
        .map(|(k, v)| (k.key.clone(), v.clone()))
        .collect();
    // Every reference resolves to the job record stored with it.
    let resolved = xce_model::decode_events(&events, |id| jobs.get(id).map(Vec::as_slice));
    assert!(resolved.is_ok(), "{resolved:?}");
    let refs = xce_model::decode_stored_events(&events)
        .unwrap()
        .iter()
        .filter(|e| e.is_reference())
        .count();
    (format, refs)
}

/// A controller writes format 2 (what the previous release's apiservers read) until its
/// `store_format` says 3: then it moves the store to 3 at load and its events refer to
/// their batch's job records. A store in format 3 stays there under a controller told 2.
#[test]
fn store_format_3_is_written_only_when_asked_and_kept() {
    let inner = Arc::new(MemStore::new());
    let now = Instant::now();
    let (_, mut core) = Counting::core(inner.clone(), true, now);
    register_on(&mut core, "exec-01", facts_of("exec-01", 10), now);
    submit_on(&mut core, web("web", "default", 3), now);
    assert_eq!(format_and_references(&*inner), (2, 0));

    core.upgrade_format(3, now);
    submit_on(&mut core, web("api", "default", 3), now);
    assert_eq!(format_and_references(&*inner), (3, 3));
    drop(core);

    let (_, mut again) = Counting::core(inner.clone(), true, now);
    again.upgrade_format(xce_model::DEFAULT_STORE_FORMAT, now);
    submit_on(&mut again, web("db", "default", 2), now);
    assert_eq!(format_and_references(&*inner), (3, 2));
}

/// A 1000-replica service on 10 hosts is placed by one scheduling pass that commits one
/// batch, not one per placement; then 10 worker event batches of 100 `Started` each are
/// settled. On both stores. The times it prints are the controller README's "Numbers"
/// (run in a release build: `cargo test --release -p xce-controller --lib
/// numbers_ -- --nocapture`); only the counts are asserted.
#[test]
fn numbers_a_thousand_replicas_are_placed_with_one_batch_per_pass() {
    let dir = tempfile::tempdir().unwrap();
    let stores: [(&str, Arc<dyn Store>); 2] = [
        ("MemStore", Arc::new(MemStore::new())),
        (
            "RedbStore",
            Arc::new(xce_store::RedbStore::open(dir.path().join("n.redb")).unwrap()),
        ),
    ];
    let hosts = host_names(10);
    for (name, inner) in stores {
        let now = Instant::now();
        let (store, mut core) = Counting::core(inner, false, now);
        for h in &hosts {
            register_on(&mut core, h, facts_of(h, 100), now);
            core.settle(now);
        }
        let commits = || store.commits.load(std::sync::atomic::Ordering::SeqCst);
        let before = commits();
        let t = std::time::Instant::now();
        submit_on(&mut core, web("web", "default", 1000), now);
        let placed_in = t.elapsed();
        let placed_commits = commits() - before;
        let jobs: Vec<(String, String)> = core.view().borrow().services
            [&ServiceKey::new("default", "web")]
            .jobs
            .iter()
            .map(|j| (j.info.host.clone(), j.info.job.clone()))
            .collect();
        assert_eq!(jobs.len(), 1000, "{name}: every replica placed");
        assert!(
            placed_commits <= 2,
            "{name}: the submit and one pass, not a batch per placement: {placed_commits}"
        );

        let t = std::time::Instant::now();
        let mut batches = 0;
        for h in &hosts {
            let events = jobs
                .iter()
                .filter(|(host, _)| host == h)
                .map(|(_, j)| started(j))
                .collect();
            core.events(h, &worker(h), events, now).unwrap();
            core.settle(now);
            batches += 1;
        }
        let events_in = t.elapsed();
        let running = core.view().borrow().services[&ServiceKey::new("default", "web")]
            .jobs
            .iter()
            .filter(|j| j.info.state == JobState::Running)
            .count();
        assert_eq!(running, 1000, "{name}: every Started applied");
        println!(
            "FIGURE {name}: {} replicas on {} hosts placed in {:.1} ms ({placed_commits} \
             commits); {batches} event batches of {} Started settled in {:.1} ms",
            jobs.len(),
            hosts.len(),
            placed_in.as_secs_f64() * 1e3,
            jobs.len() / batches,
            events_in.as_secs_f64() * 1e3,
        );
    }

    // Why one batch per pass: the same 1000 placements as 1000 redb commits, side by side
    // with one commit of all of them.
    let redb = xce_store::RedbStore::open(dir.path().join("ratio.redb")).unwrap();
    let key = |i: usize| Key {
        ns: "job".into(),
        key: format!("j-{i}"),
    };
    let value = vec![b'x'; 200];
    let t = std::time::Instant::now();
    for i in 0..1000 {
        let mut b = Batch::default();
        b.put(key(i), value.clone());
        redb.commit(b).unwrap();
    }
    let one_each = t.elapsed();
    let t = std::time::Instant::now();
    let mut b = Batch::default();
    for i in 1000..2000 {
        b.put(key(i), value.clone());
    }
    redb.commit(b).unwrap();
    let one_batch = t.elapsed();
    assert_eq!(redb.load_all().unwrap().len(), 2000);
    println!(
        "FIGURE redb: 1000 puts as 1000 commits {:.1} ms, as one commit {:.1} ms (x{:.0})",
        one_each.as_secs_f64() * 1e3,
        one_batch.as_secs_f64() * 1e3,
        one_each.as_secs_f64() / one_batch.as_secs_f64()
    );
}
