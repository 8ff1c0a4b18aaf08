//! Job ids across loads of one store copy, and what a restore writes.

use super::*;
use plugin_api::{JobInfo, JobState};
use xce_store::MemStore;

fn running_job(id: &str, ready: bool) -> JobRec {
    JobRec {
        info: JobInfo {
            job: id.into(),
            service: "web".into(),
            project: "default".into(),
            replica: 0,
            host: "h1".into(),
            state: JobState::Running,
            ready,
            grants: Default::default(),
            generation: 1,
        },
        held: None,
        held_ready: None,
        log: None,
    }
}

/// Takes `n` ids from a fresh load of `store` (as a controller start does) and commits.
fn take_ids(store: &MemStore, n: usize) -> Vec<JobId> {
    let mut c = Cluster::load(store).unwrap();
    c.job_tag = job_tag();
    let mut txn = Txn::new(&c);
    let ids: Vec<JobId> = (0..n).map(|_| txn.new_job_id(&c)).collect();
    store.commit(txn.batch_for(false)).unwrap();
    txn.apply(&mut c);
    ids
}

#[test]
fn a_store_copy_loaded_twice_never_hands_out_an_id_twice() {
    let store = MemStore::new();
    take_ids(&store, 19);
    let copy = store.load_all().unwrap();
    let after_backup = take_ids(&store, 5);
    // The copy is put back: its counter is where it was before the five.
    let restored = MemStore::new();
    let mut b = Batch::default();
    for (k, v) in copy {
        b.put(k, v);
    }
    restored.commit(b).unwrap();
    let after_restore = take_ids(&restored, 5);
    let numbers: Vec<_> = after_restore.iter().map(|id| job_number(id)).collect();
    assert_eq!(
        numbers,
        after_backup
            .iter()
            .map(|id| job_number(id))
            .collect::<Vec<_>>()
    );
    assert_eq!(numbers[0], Some(20), "ids: {after_restore:?}");
    for id in &after_restore {
        assert!(
            !after_backup.contains(id),
            "{id} handed out twice: {after_backup:?} and {after_restore:?}"
        );
    }
}

#[test]
fn job_ids_are_short_and_their_number_reads_back() {
    let tag = job_tag();
    assert_eq!(tag.len(), TAG_LEN);
    assert!(tag.bytes().all(|b| TAG_ALPHABET.contains(&b)), "{tag}");
    let id = job_id(21, &tag);
    assert_eq!(id, format!("j-21-{tag}"));
    assert_eq!(job_number(&id), Some(21));
    assert_eq!(job_number("j-7"), Some(7));
    assert_eq!(job_number("x-7"), None);
}

#[test]
fn restored_records_list_no_job_as_ready_and_ask_workers_to_register() {
    let store = MemStore::new();
    let c = Cluster::load(&store).unwrap();
    let mut txn = Txn::new(&c);
    txn.put_job(&c, running_job("j-2", true));
    store.commit(txn.batch_for(true)).unwrap();
    let restored = restored_records(store.load_all().unwrap()).unwrap();
    assert!(restored.iter().all(|(k, _)| *k != events_key()));
    let loaded = Cluster::from_records(restored.clone()).unwrap();
    assert!(loaded.restored);
    let j = loaded.jobs.get("j-2").expect("the job is restored");
    assert!(
        !j.info.ready,
        "a restored job is no endpoint before its worker reports it"
    );
    assert_eq!(j.info.state, JobState::Running);

    // Once every worker registered again, the mark goes.
    let into = MemStore::new();
    let mut b = Batch::default();
    for (k, v) in restored {
        b.put(k, v);
    }
    into.commit(b).unwrap();
    let mut c = Cluster::load(&into).unwrap();
    let mut txn = Txn::new(&c);
    txn.clear_restored();
    into.commit(txn.batch_for(false)).unwrap();
    txn.apply(&mut c);
    assert!(!c.restored);
    assert!(!Cluster::load(&into).unwrap().restored);
}

#[test]
fn a_record_this_version_cannot_read_is_refused_before_anything_is_restored() {
    let records = vec![(Key::new("meta", "from-the-future"), b"1".to_vec())];
    let e = restored_records(records).unwrap_err();
    assert!(e.to_string().contains("meta/from-the-future"), "{e}");
}
