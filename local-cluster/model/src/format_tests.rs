//! The store format (see [`crate::FORMAT`]): older formats are read and migrated, a newer
//! one is refused before any record is read; format 3's events read back as format 2's.

use super::*;
use xce_store::MemStore;

fn service(project: &str, name: &str) -> ServiceRec {
    ServiceRec {
        info: ServiceInfo {
            name: name.into(),
            project: project.into(),
            replicas: 1,
            profile: serde_json::json!({}),
            rev: 1,
            generation: 1,
        },
        state: ServiceState::Active,
        rollout: Default::default(),
        older: Default::default(),
        slots: Default::default(),
        stop_now: false,
    }
}

/// A store as the releases before numbered formats wrote it: no `meta/format`, a service
/// keyed by its name alone.
fn format_1_store() -> MemStore {
    let store = MemStore::new();
    let mut b = Batch::default();
    let rec = serde_json::to_vec(&service("default", "web")).unwrap();
    b.put(Key::new(NS_SERVICE, "web"), rec);
    b.put(Key::new(NS_META, "rev"), b"1".to_vec());
    store.commit(b).unwrap();
    store
}

#[test]
fn a_format_1_store_is_read_and_migrated_to_the_default_format() {
    let store = format_1_store();
    let mut c = Cluster::load(&store).unwrap();
    assert_eq!(c.format, 1);
    assert!(c.needs_migration());
    let mut txn = Txn::new(&c);
    txn.migrate(&c);
    store.commit(txn.batch()).unwrap();
    txn.apply(&mut c);
    assert!(!c.needs_migration());

    let again = Cluster::load(&store).unwrap();
    assert_eq!(again.format, DEFAULT_STORE_FORMAT);
    assert!(!again.needs_migration());
    let keys: Vec<String> = store
        .load_all()
        .unwrap()
        .into_iter()
        .map(|(k, v)| {
            format!(
                "{k} = {}",
                String::from_utf8_lossy(&v)
                    .chars()
                    .take(20)
                    .collect::<String>()
            )
        })
        .collect();
    // The service moved to its project-scoped key, and the format is recorded.
    assert_eq!(
        keys,
        [
            format!("meta/format = {DEFAULT_STORE_FORMAT}"),
            "meta/rev = 1".to_owned(),
            r#"service/default/web = {"info":{"name":"web"#.to_owned(),
        ]
    );
}

#[test]
fn a_newer_format_is_refused_naming_both_formats_before_any_record_is_read() {
    let store = format_1_store();
    let mut b = Batch::default();
    b.put(format_key(), (FORMAT + 1).to_string().into_bytes());
    // A record of the newer format this build cannot decode: the format is what is
    // reported, not this record.
    b.put(Key::new(NS_JOB, "j-1"), b"{\"new\":\"shape\"}".to_vec());
    store.commit(b).unwrap();
    let err = Cluster::load(&store).unwrap_err();
    assert!(matches!(err, LoadError::NewerFormat { found, .. } if found == FORMAT + 1));
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "the store holds records of format {}, newer than this build (",
            FORMAT + 1
        )) && msg.contains(&format!("understands (format {FORMAT} and older)")),
        "{msg}"
    );
}

fn job(id: &str, state: JobState, ready: bool) -> JobRec {
    JobRec {
        info: JobInfo {
            job: id.into(),
            service: "web".into(),
            project: "default".into(),
            replica: 0,
            host: "exec-01".into(),
            state,
            ready,
            grants: serde_json::from_value(serde_json::json!({"ports": {"http": 31000}})).unwrap(),
            generation: 1,
        },
        held: None,
        held_ready: None,
        log: Some("/var/log/xce/web-0.log".into()),
    }
}

/// The batches of a placement and its worker's report, as a store in `format` gets them:
/// three jobs placed; then one started and ready in one report (two events, one record),
/// one started, one ended.
fn placement_batches(format: u64) -> Vec<(Batch, Vec<ClusterEvent>)> {
    let mut c = Cluster {
        format,
        ..Cluster::default()
    };
    c.services
        .insert(ServiceKey::new("default", "web"), service("default", "web"));
    let mut out = Vec::new();
    let mut txn = Txn::new(&c);
    for id in ["j-1", "j-2", "j-3"] {
        txn.put_job(&c, job(id, JobState::Placed, false));
    }
    out.push((txn.batch(), txn.events.clone()));
    txn.apply(&mut c);
    let mut txn = Txn::new(&c);
    txn.put_job(&c, job("j-1", JobState::Running, false));
    txn.put_job(&c, job("j-1", JobState::Running, true));
    txn.put_job(&c, job("j-2", JobState::Running, false));
    txn.end_job(
        &c,
        job("j-3", JobState::Placed, false),
        EndReason::Refused {
            reason: "no".into(),
        },
    );
    out.push((txn.batch(), txn.events.clone()));
    out
}

/// The events record and the job records of a batch.
fn events_and_jobs(b: &Batch) -> (Vec<u8>, BTreeMap<String, Vec<u8>>) {
    let mut events = None;
    let mut jobs = BTreeMap::new();
    for op in &b.ops {
        if let xce_store::Op::Put(k, v) = op {
            if *k == events_key() {
                events = Some(v.clone());
            } else if k.ns == NS_JOB {
                jobs.insert(k.key.clone(), v.clone());
            }
        }
    }
    (events.expect("the batch has events"), jobs)
}

/// Format 3's events record refers to the job records of its batch, and reads back as
/// the very events format 2 repeats whole (an earlier event of a job the batch changes
/// twice included, and an ended job's, whose record goes).
#[test]
fn both_event_formats_read_back_as_the_same_events() {
    let (old, new) = (placement_batches(2), placement_batches(3));
    let (mut old_bytes, mut new_bytes) = (0, 0);
    for ((b2, want2), (b3, want3)) in old.iter().zip(&new) {
        assert_eq!(want2, want3);
        let (e2, jobs2) = events_and_jobs(b2);
        let (e3, jobs3) = events_and_jobs(b3);
        // The records themselves are the same in both formats.
        assert_eq!(jobs2, jobs3);
        let read = |e: &[u8], jobs: &BTreeMap<String, Vec<u8>>| {
            decode_events(e, |id| jobs.get(id).map(Vec::as_slice)).unwrap()
        };
        assert_eq!(&read(&e2, &jobs2), want2);
        assert_eq!(&read(&e3, &jobs3), want3);
        let refs = |e: &[u8]| {
            decode_stored_events(e)
                .unwrap()
                .iter()
                .filter(|e| e.is_reference())
                .count()
        };
        assert_eq!(refs(&e2), 0);
        old_bytes += e2.len();
        new_bytes += e3.len();
    }
    // Placed ×3, then started (and ready) of j-1 and j-2 refer; j-3's end is whole.
    assert_eq!(
        new.iter()
            .map(|(b, _)| decode_stored_events(&events_and_jobs(b).0)
                .unwrap()
                .iter()
                .filter(|e| e.is_reference())
                .count())
            .collect::<Vec<_>>(),
        [3, 3]
    );
    assert!(
        new_bytes * 2 < old_bytes,
        "format 3's events: {new_bytes} bytes, format 2's {old_bytes}"
    );
}

/// What a reader of the previous release (format 2) does with format 3's events: it
/// decodes them as whole events, which a reference is not: an error, which its follower
/// treats as an event it does not understand (it fails closed, 503).
#[test]
fn a_format_2_reader_cannot_decode_format_3_events() {
    for (format, readable) in [(2, true), (3, false)] {
        let (b, _) = &placement_batches(format)[1];
        let (events, _) = events_and_jobs(b);
        let old_reader = serde_json::from_slice::<Vec<ClusterEvent>>(&events);
        assert_eq!(
            old_reader.is_ok(),
            readable,
            "format {format}: {old_reader:?}"
        );
    }
}

/// A reference whose job record its revision does not write does not add up: an error
/// naming the event and the job, never an event made up from elsewhere.
#[test]
fn a_reference_without_its_record_is_an_error() {
    let (b, _) = &placement_batches(3)[0];
    let (events, _) = events_and_jobs(b);
    let err = decode_events(&events, |_| None).unwrap_err();
    assert!(matches!(err, EventsError::Missing { rev: 1, .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "event 1 refers to the record of job j-1, which its revision does not write"
    );
}

/// A format 2 store stays in format 2 until told (`store_format`), then moves to 3 with
/// nothing but `meta/format` changed; a store in format 3 is never migrated back.
#[test]
fn a_store_moves_to_format_3_only_when_asked_and_never_back() {
    let store = format_1_store();
    let mut c = Cluster::load(&store).unwrap();
    let mut txn = Txn::new(&c);
    txn.migrate(&c);
    store.commit(txn.batch()).unwrap();
    txn.apply(&mut c);
    let at_2 = store.load_all().unwrap();
    assert_eq!(Cluster::load(&store).unwrap().format, DEFAULT_STORE_FORMAT);
    assert!(!c.needs_migration());

    let mut txn = Txn::new(&c);
    txn.upgrade_format(3);
    store.commit(txn.batch()).unwrap();
    txn.apply(&mut c);
    let at_3 = store.load_all().unwrap();
    let changed: Vec<String> = at_3
        .iter()
        .filter(|kv| !at_2.contains(kv))
        .map(|(k, v)| format!("{k} = {}", String::from_utf8_lossy(v)))
        .collect();
    assert_eq!(changed, ["meta/format = 3"]);
    let loaded = Cluster::load(&store).unwrap();
    assert_eq!(loaded.format, 3);
    assert!(!loaded.needs_migration());
    // A migration of a format 3 store (what a load does) keeps it in format 3.
    let mut txn = Txn::new(&loaded);
    txn.migrate(&loaded);
    store.commit(txn.batch()).unwrap();
    assert_eq!(Cluster::load(&store).unwrap().format, 3);
}
