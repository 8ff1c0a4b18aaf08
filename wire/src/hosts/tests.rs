use super::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;

#[test]
fn a_hosts_summaries_are_keys_beside_its_fields_in_order() {
    let summaries: BTreeMap<String, Value> =
        [("ports".to_owned(), json!({"capacity": 3, "used": 1}))].into();
    let address = plugin_api::HostAddress {
        ip: "127.0.0.11".parse().unwrap(),
        interface: Some("lo".into()),
    };
    let list = HostList {
        cluster: Some("c1".into()),
        hosts: vec![HostAnswer {
            addresses: vec![HostAddress::from(&address)],
            id: "exec-01".into(),
            ip_addr: Some(address.ip),
            jobs: 1,
            maintenance: None,
            state: "ready".into(),
            summaries: Cow::Borrowed(&summaries),
        }],
    };
    let text = serde_json::to_string(&list).unwrap();
    expect_test::expect![[r#"{"cluster":"c1","hosts":[{"addresses":[{"interface":"lo","ip":"127.0.0.11"}],"id":"exec-01","ip_addr":"127.0.0.11","jobs":1,"maintenance":null,"ports":{"capacity":3,"used":1},"state":"ready"}]}"#]]
        .assert_eq(&text);
    assert_eq!(text, serde_json::to_value(&list).unwrap().to_string());
    let back: HostList<'_> = serde_json::from_str(&text).unwrap();
    assert_eq!(back, list);
    assert_eq!(
        back.hosts[0].summary("ports"),
        Some(&json!({"capacity": 3, "used": 1}))
    );
    let keys: Vec<String> = serde_json::to_value(HostAnswer {
        summaries: Cow::Owned(BTreeMap::new()),
        ..back.hosts[0].clone()
    })
    .unwrap()
    .as_object()
    .unwrap()
    .keys()
    .cloned()
    .collect();
    assert_eq!(keys, HOST_FIELDS);
}

#[test]
fn a_drained_hosts_maintenance_reads_back_and_an_older_servers_answer_has_none() {
    let text = r#"{"hosts":[{"id":"exec-02","jobs":0,"maintenance":{"by":"alice","left":0,"services":[],"since":"2026-12-05T00:00:00Z","state":"drained"},"state":"ready"}]}"#;
    let list: HostList<'_> = serde_json::from_str(text).unwrap();
    let m = list.hosts[0].maintenance.as_ref().unwrap();
    assert_eq!(
        (&*m.state, &*m.by, m.left, m.leave),
        ("drained", "alice", 0, false)
    );
    let old = r#"{"hosts":[{"id":"exec-02","jobs":0,"state":"ready"}]}"#;
    let list: HostList<'_> = serde_json::from_str(old).unwrap();
    assert_eq!(list.hosts[0].maintenance, None);
}
