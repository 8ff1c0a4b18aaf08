//! `Grants` keeps the contract of the `BTreeMap<String, Grant>` it replaced: the same JSON
//! both ways (a property test against the map), the map's answers after any sequence of
//! inserts and removes, and one shared allocation per set of grants.

use super::*;
use proptest::prelude::*;
use serde_json::json;
use std::collections::BTreeMap;

fn g(n: u64) -> Grant {
    Grant::from_value(&json!({ "port": n }))
}

fn plugin() -> impl Strategy<Value = String> {
    // Few names, so that inserts and removes hit the same keys.
    prop::sample::select(vec!["address", "ports", "a", "zz", "ports2"]).prop_map(str::to_owned)
}

#[test]
fn empty_grants_allocate_nothing_and_are_an_empty_object() {
    let e = Grants::new();
    assert!(e.is_empty());
    assert_eq!(e, Grants::default());
    assert_eq!(serde_json::to_string(&e).unwrap(), "{}");
    let back: Grants = serde_json::from_str("{}").unwrap();
    assert!(back.is_empty() && back.0.is_none());
    let mut one = Grants::from([("ports", g(1))]);
    assert_eq!(one.remove("ports"), Some(g(1)));
    assert!(one.0.is_none(), "removing the last grant frees the slice");
    assert_eq!(std::mem::size_of::<Grants>(), 16);
}

#[test]
fn clones_share_one_allocation() {
    let a = Grants::from([("ports", g(1)), ("address", g(2))]);
    let b = a.clone();
    assert!(Arc::ptr_eq(a.0.as_ref().unwrap(), b.0.as_ref().unwrap()));
    let mut c = b.clone();
    c.insert("ports", g(3));
    assert!(!Arc::ptr_eq(a.0.as_ref().unwrap(), c.0.as_ref().unwrap()));
    assert_eq!(a["ports"], g(1), "a change copies: the others keep theirs");
    assert_eq!(c["ports"], g(3));
}

#[test]
fn a_repeated_key_keeps_the_last_grant_like_the_map() {
    let text = r#"{"ports":{"port":1},"address":{"ip":"10.0.0.1"},"ports":{"port":2}}"#;
    let map: BTreeMap<String, Grant> = serde_json::from_str(text).unwrap();
    let grants: Grants = serde_json::from_str(text).unwrap();
    assert_eq!(grants, Grants::from(map.clone()));
    assert_eq!(grants["ports"], g(2));
    assert_eq!(
        serde_json::to_string(&grants).unwrap(),
        serde_json::to_string(&map).unwrap()
    );
    let collected: Grants = [("b", g(1)), ("a", g(2)), ("b", g(3))]
        .into_iter()
        .collect();
    assert_eq!(collected.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(collected["b"], g(3));
}

#[test]
#[should_panic(expected = "no grant of plugin \"ports\"")]
fn indexing_a_missing_plugin_panics_like_the_map() {
    let _ = &Grants::new()["ports"];
}

#[derive(Debug, Clone)]
enum Op {
    Insert(String, u64),
    Remove(String),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (plugin(), 0..5u64).prop_map(|(k, n)| Op::Insert(k, n)),
        plugin().prop_map(Op::Remove),
    ]
}

proptest! {
    /// After any inserts and removes, `Grants` answers as the map does, and both write
    /// the same JSON, which reads back into either.
    #[test]
    fn behaves_and_serializes_like_the_map(ops in prop::collection::vec(op(), 0..12)) {
        let mut map: BTreeMap<String, Grant> = BTreeMap::new();
        let mut grants = Grants::new();
        for op in ops {
            match op {
                Op::Insert(k, n) => {
                    prop_assert_eq!(grants.insert(k.clone(), g(n)), map.insert(k, g(n)));
                }
                Op::Remove(k) => prop_assert_eq!(grants.remove(&k), map.remove(&k)),
            }
            prop_assert_eq!(grants.len(), map.len());
            prop_assert_eq!(grants.is_empty(), map.is_empty());
            let pairs: Vec<(&str, &Grant)> = grants.iter().collect();
            let want: Vec<(&str, &Grant)> = map.iter().map(|(k, v)| (k.as_str(), v)).collect();
            prop_assert_eq!(pairs, want);
            for k in ["address", "ports", "a", "zz", "ports2", "none"] {
                prop_assert_eq!(grants.get(k), map.get(k));
                prop_assert_eq!(grants.contains_key(k), map.contains_key(k));
            }
        }
        let text = serde_json::to_string(&grants).unwrap();
        prop_assert_eq!(&text, &serde_json::to_string(&map).unwrap());
        prop_assert_eq!(
            serde_json::to_string_pretty(&grants).unwrap(),
            serde_json::to_string_pretty(&map).unwrap()
        );
        let back: Grants = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&back, &grants);
        let tree: Grants = serde_json::from_value(serde_json::to_value(&map).unwrap()).unwrap();
        prop_assert_eq!(&tree, &grants);
        prop_assert_eq!(Grants::from(map.clone()), grants);
    }
}
