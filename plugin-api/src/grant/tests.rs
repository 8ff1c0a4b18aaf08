//! The grant keeps the wire and store format of the `serde_json::Value` it replaced: it
//! serializes as the JSON it holds, reads any JSON (also buffered inside tagged events and
//! from trees), and equal JSON gives equal grants.

use super::*;
use crate::{ClusterEvent, Grants, JobInfo, JobState};
use proptest::prelude::*;
use serde_json::{json, Value};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Port<'a> {
    name: &'a str,
    port: u16,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Ports<'a> {
    #[serde(borrow)]
    ports: Vec<Port<'a>>,
}

fn job(grant: Grant) -> JobInfo {
    JobInfo {
        job: "j-1".into(),
        service: "web".into(),
        project: "team-a".into(),
        replica: 0,
        host: "exec-01".into(),
        state: JobState::Running,
        ready: true,
        grants: Grants::from([("ports", grant)]),
        generation: 1,
    }
}

/// The record as a host whose grants were `Value`s wrote it.
fn old_record(grant: &Value) -> Value {
    json!({
        "job": "j-1", "service": "web", "project": "team-a", "replica": 0,
        "host": "exec-01", "state": "running", "ready": true,
        "grants": {"ports": grant}, "generation": 1,
    })
}

#[test]
fn encode_writes_compact_text_without_a_tree_and_decodes_borrowed() {
    let g = Grant::encode(&Ports {
        ports: vec![Port {
            name: "http",
            port: 20417,
        }],
    })
    .unwrap();
    assert_eq!(g.as_str(), r#"{"ports":[{"name":"http","port":20417}]}"#);
    let back: Ports<'_> = g.decode().unwrap();
    assert_eq!(back.ports[0].name, "http");
    // Borrowed: the name points into the grant's own text.
    let text = g.as_str().as_bytes().as_ptr_range();
    assert!(text.contains(&back.ports[0].name.as_ptr()));
    assert_eq!(
        g.to_value(),
        json!({"ports": [{"name": "http", "port": 20417}]})
    );
}

#[test]
fn clones_share_one_allocation() {
    let g = Grant::from_value(&json!({"ports": []}));
    let c = g.clone();
    assert_eq!(g.as_str().as_ptr(), c.as_str().as_ptr());
}

#[test]
fn wire_format_is_the_json_not_a_string() {
    let grant = json!({"ports": [{"name": "http", "port": 20417, "protocol": "tcp"}]});
    let new = job(Grant::from_value(&grant));
    // The same tree the Value-based host wrote, and the grant's bytes are the Value's.
    assert_eq!(serde_json::to_value(&new).unwrap(), old_record(&grant));
    let text = serde_json::to_string(&new).unwrap();
    assert!(
        text.contains(&format!(r#""grants":{{"ports":{grant}}}"#)),
        "{text}"
    );
}

#[test]
fn old_records_load_from_bytes_pretty_text_and_trees() {
    let grant = json!({"ports": [{"name": "http", "port": 20417, "protocol": "tcp"}]});
    let want = job(Grant::from_value(&grant));
    let pretty = serde_json::to_string_pretty(&old_record(&grant)).unwrap();
    let from_text: JobInfo = serde_json::from_str(&pretty).unwrap();
    assert_eq!(from_text, want);
    // Compact whatever the spacing of the input.
    assert_eq!(from_text.grants["ports"].as_str(), grant.to_string());
    let from_tree: JobInfo = serde_json::from_value(old_record(&grant)).unwrap();
    assert_eq!(from_tree, want);
    let bytes = serde_json::to_vec(&want).unwrap();
    let from_bytes: JobInfo = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(from_bytes, want);
}

#[test]
fn grants_inside_internally_tagged_events_round_trip() {
    // `ClusterEvent` is tagged by a field, so serde buffers the job before the grant sees
    // it: the grant must read serde's buffer, not only serde_json's input.
    let ev = ClusterEvent::Job {
        rev: 7,
        job: job(Grant::from_value(
            &json!({"a": [1, -2, 2.5, null, true, "x\"y"]}),
        )),
    };
    let text = serde_json::to_string(&ev).unwrap();
    let back: ClusterEvent = serde_json::from_str(&text).unwrap();
    assert_eq!(back, ev);
    let back: ClusterEvent = serde_json::from_value(serde_json::to_value(&ev).unwrap()).unwrap();
    assert_eq!(back, ev);
}

#[test]
fn equal_json_is_an_equal_grant_whatever_the_key_order() {
    let a = Grant::from_json(r#"{"name":"http","port":1}"#).unwrap();
    let b = Grant::from_json(r#"{ "port": 1, "name": "http" }"#).unwrap();
    assert_ne!(a.as_str(), b.as_str());
    assert_eq!(a, b);
    let c = Grant::from_json(r#"{"port":2,"name":"http"}"#).unwrap();
    assert_ne!(a, c);
    assert_eq!(a, json!({"port": 1, "name": "http"}));
}

#[test]
fn bad_text_is_refused() {
    for bad in ["", "{", r#"{"a":1} x"#, "[1,]", "nul"] {
        assert!(Grant::from_json(bad).is_err(), "{bad:?} accepted");
    }
    let e = Grant::encode(&std::collections::BTreeMap::from([((1, 2), 3)])).unwrap_err();
    assert!(e.to_string().contains("key must be a string"), "{e}");
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            // serde_json reads some floats back one ulp off (its fast parser), a `Value`
            // as much as a grant: only those it reads back exactly make a fair test.
            .prop_filter("finite, read back exactly", |f| {
                f.is_finite()
                    && serde_json::from_str::<f64>(&serde_json::to_string(f).unwrap()).ok()
                        == Some(*f)
            })
            .prop_map(Value::from),
        ".*".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            proptest::collection::btree_map(".*", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn any_json_round_trips_through_bytes_trees_and_records(v in json_value()) {
        let g = Grant::from_value(&v);
        prop_assert_eq!(g.to_value(), v.clone());
        // Text identical to the Value's compact form: the stored bytes do not change.
        prop_assert_eq!(serde_json::to_string(&g).unwrap(), v.to_string());
        prop_assert_eq!(serde_json::to_value(&g).unwrap(), v.clone());
        let from_pretty = Grant::from_json(&serde_json::to_string_pretty(&v).unwrap()).unwrap();
        prop_assert_eq!(from_pretty.as_str(), g.as_str());
        let from_tree: Grant = serde_json::from_value(v.clone()).unwrap();
        prop_assert_eq!(from_tree.as_str(), g.as_str());
        let rec = job(g.clone());
        let back: JobInfo = serde_json::from_slice(&serde_json::to_vec(&rec).unwrap()).unwrap();
        prop_assert_eq!(back.grants["ports"].as_str(), g.as_str());
        let back: JobInfo = serde_json::from_value(old_record(&v)).unwrap();
        prop_assert_eq!(&back, &rec);
    }
}
