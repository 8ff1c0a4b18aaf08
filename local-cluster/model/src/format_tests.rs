//! The store format (see [`crate::FORMAT`]): older formats are read and migrated, a newer
//! one is refused before any record is read.

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
fn a_format_1_store_is_read_and_migrated_to_the_current_format() {
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
    assert_eq!(again.format, FORMAT);
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
            format!("meta/format = {FORMAT}"),
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
