//! Host records with and without a maintenance state: the records written before it
//! existed read as hosts in service, and one in service is written as before.

use super::maintenance::{Maintenance, Mode};
use super::*;

/// A host record as the releases before maintenance wrote it.
const OLD_HOST: &str = r#"{"info":{"id":"exec-01","state":"ready","facts":{"sections":{}}},"orphans":[],"released":[],"instance":"i-1"}"#;

#[test]
fn a_host_record_from_before_maintenance_reads_as_in_service_and_is_written_unchanged() {
    let h: HostRec = serde_json::from_str(OLD_HOST).expect("an old host record reads");
    assert_eq!(h.maintenance, None);
    let again = serde_json::to_string(&h).unwrap();
    assert!(!again.contains("maintenance"), "{again}");
}

#[test]
fn a_drained_host_record_keeps_who_when_and_whether_its_worker_left() {
    let mut h: HostRec = serde_json::from_str(OLD_HOST).unwrap();
    h.maintenance = Some(Maintenance {
        mode: Mode::Drain,
        since: 1_700_000_000,
        by: "worker:exec-01".into(),
        leave: true,
    });
    let text = serde_json::to_string(&h).unwrap();
    assert!(
        text.contains(r#""maintenance":{"mode":"drain","since":1700000000,"by":"worker:exec-01","leave":true}"#),
        "{text}"
    );
    let back: HostRec = serde_json::from_str(&text).unwrap();
    assert_eq!(back, h);
    assert!(back.maintenance.unwrap().drains());
}
