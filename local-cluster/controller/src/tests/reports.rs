//! What the controller writes per placement: worker reports queued together share store
//! batches (within the store's limit, each report whole), and a job write moves its
//! service's `rev` without rewriting the service's record, yet a reload finds the same
//! `rev`.

use super::scale::Recording;
use super::*;
use crate::core::Report;
use xce_model::Cluster;

/// A core on `store` with `hosts` registered (10 slots each) and a service of `replicas`
/// placed; the listeners' events so far are dropped.
fn placed(store: Arc<dyn Store>, hosts: &[String], replicas: u32) -> (Core, RawEvents) {
    let raw = RawEvents::default();
    let now = Instant::now();
    let mut core = core_with(store, SharedSlots::new(), vec![Arc::new(raw.clone())], now);
    for h in hosts {
        register_on(&mut core, h, facts_of(h, 10), now);
    }
    submit_on(&mut core, web("web", "default", replicas), now);
    raw.take();
    (core, raw)
}

/// Each host's report `(host, worker, events)`: `started` and `ready` for each of its
/// jobs, in job order.
fn reports_of(core: &Core, hosts: &[String]) -> Vec<(String, Caller, Vec<WorkerEvent>)> {
    let view = core.view().borrow().clone();
    let jobs = &view.services[&ServiceKey::new("default", "web")].jobs;
    hosts
        .iter()
        .map(|h| {
            let events = jobs
                .iter()
                .filter(|j| j.info.host == *h)
                .flat_map(|j| [started(&j.info.job), ready(&j.info.job, true)])
                .collect();
            (h.clone(), worker(h), events)
        })
        .collect()
}

#[test]
fn reports_queued_together_share_batches_and_change_nothing_else() {
    let hosts = host_names(30);
    // The same start twice: the reports one commit each, then queued together.
    let one = Recording::new(Arc::new(MemStore::new()), super::scale::etcd_like());
    let (mut a, raw_a) = placed(one.clone(), &hosts, 150);
    let together = Arc::new(MemStore::new());
    let rec = Recording::new(together.clone(), super::scale::etcd_like());
    let (mut b, raw_b) = placed(rec.clone(), &hosts, 150);
    one.take();
    rec.take();
    let now = Instant::now();

    // The same reports to both, and one from a worker that does not hold its host (it
    // is refused alone).
    let mut reports = reports_of(&a, &hosts);
    let mut intruder = reports[0].clone();
    intruder.1 = worker("someone-else");
    reports.insert(7, intruder);
    let mut alone = Vec::new();
    for (host, caller, events) in reports.clone() {
        alone.push(a.events(&host, &caller, events, now).is_ok());
    }
    let reports = reports
        .into_iter()
        .map(|(host, caller, events)| Report {
            host,
            caller,
            events,
        })
        .collect();
    let grouped: Vec<bool> = b.reports(reports, now).iter().map(Result::is_ok).collect();
    assert_eq!(grouped, alone, "the same answers, in order");
    assert_eq!(grouped.iter().filter(|ok| !**ok).count(), 1);

    // 30 reports of 5 jobs each: 30 commits alone, a few within the limit together.
    let (n_alone, n_together) = (one.assert_within("alone"), rec.assert_within("together"));
    assert_eq!(n_alone, 30);
    assert!(
        (2..=5).contains(&n_together),
        "150 job records in batches of at most {} ops: {n_together} commits",
        super::scale::etcd_like().ops
    );
    // The same events (revisions included) and the same stored state.
    a.settle(now);
    b.settle(now);
    assert_eq!(raw_a.take(), raw_b.take());
    // Every record but the cluster's id (each store its own) and the last batch's events
    // (more of them when the batch is shared).
    let state = |store: &dyn Store| -> Vec<(Key, Vec<u8>)> {
        let mut all = store.load_all().unwrap();
        all.retain(|(k, _)| k.ns != "meta" || k.key == "rev" || k.key == "next_job");
        all
    };
    assert_eq!(state(&*one), state(&*together));
    let running = b.view().borrow().services[&ServiceKey::new("default", "web")]
        .jobs
        .iter()
        .filter(|j| j.info.state == JobState::Running && j.info.ready)
        .count();
    assert_eq!(running, 150);
}

#[test]
fn a_job_write_moves_its_services_rev_without_rewriting_its_record() {
    let hosts = host_names(3);
    let store = Arc::new(MemStore::new());
    let rec = Recording::new(store.clone(), super::scale::etcd_like());
    let (mut core, raw) = placed(rec.clone(), &hosts, 6);
    let key = ServiceKey::new("default", "web");
    let stored_rev = |store: &MemStore| Cluster::load(store).unwrap().services[&key].info.rev;
    let view_rev = |core: &Core| core.view().borrow().services[&key].info.rev;
    assert_eq!(stored_rev(&store), view_rev(&core));

    let now = Instant::now();
    let (host, caller, events) = reports_of(&core, &hosts).remove(0);
    let before = store.load_all().unwrap();
    core.events(&host, &caller, events, now).unwrap();
    core.settle(now);
    // The report wrote its jobs, `meta/rev` and `meta/events`; the service's record is
    // the one stored before.
    let after = store.load_all().unwrap();
    let record = |all: &[(Key, Vec<u8>)]| {
        all.iter()
            .find(|(k, _)| k.ns == "service")
            .map(|(_, v)| v.clone())
    };
    assert_eq!(record(&before), record(&after));
    let last = raw.take().last().map(ClusterEvent::rev).unwrap();
    assert_eq!(
        view_rev(&core),
        last,
        "the service's rev moved with its jobs"
    );
    assert_eq!(stored_rev(&store), last, "and a reload finds it");

    // A job's end rewrites the record (the job's own record, which held the newest rev,
    // goes).
    let job = core.view().borrow().services[&key]
        .jobs
        .iter()
        .next()
        .unwrap()
        .info
        .clone();
    core.events(&job.host, &worker(&job.host), vec![exited(&job.job)], now)
        .unwrap();
    core.settle(now);
    assert_ne!(record(&store.load_all().unwrap()), record(&after));
    assert_eq!(stored_rev(&store), view_rev(&core));
}

#[test]
fn a_store_written_before_job_revs_loads_its_services_rev() {
    // A job record of an older controller (no `rev`), its service's record holding the
    // exact `rev`.
    let store = MemStore::new();
    let mut b = Batch::default();
    b.put(
        Key::new("service", "default/web"),
        serde_json::to_vec(&json!({"info": {"name": "web", "project": "default",
            "replicas": 1, "profile": {}, "rev": 9, "generation": 1}, "state": "active"}))
        .unwrap(),
    );
    b.put(
        Key::new("job", "j-1"),
        serde_json::to_vec(&json!({"info": {"job": "j-1", "service": "web",
            "project": "default", "replica": 0, "host": "h", "state": "running",
            "ready": true, "grants": {}, "generation": 1}, "held": null}))
        .unwrap(),
    );
    store.commit(b).unwrap();
    let c = Cluster::load(&store).unwrap();
    assert_eq!(c.services[&ServiceKey::new("default", "web")].info.rev, 9);
}
