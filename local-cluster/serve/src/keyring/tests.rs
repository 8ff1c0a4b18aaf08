use super::*;
use crate::auth::Digest;
use plugin_api::Permission;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

const A: &str = "alice-example-secret";
const B: &str = "bob-example-secret";

fn tokens(text: &str) -> Tokens {
    Tokens::parse(text).unwrap()
}

fn file(alice_projects: &str, with_alice: bool) -> Tokens {
    let mut text = String::new();
    if with_alice {
        text += &format!(
            "[[token]]\nsecret = \"{A}\"\nprincipal = \"alice\"\n\
             grants = [{{permission = \"job.view\", projects = [{alice_projects}]}}]\n"
        );
    }
    text += &format!(
        "[[token]]\nsecret = \"{B}\"\nprincipal = \"bob\"\n\
         grants = [{{permission = \"job.view\", projects = [\"b\"]}}]\n\
         [[worker]]\nhost = \"exec-01\"\nsecret = \"w1-example-secret\"\n"
    );
    tokens(&text)
}

/// Whether `fut` has resolved, polled once (no runtime needed: the credential's futures
/// are ready or not from the channel's state alone).
fn ready(fut: impl Future<Output = ()>) -> bool {
    let fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    matches!(fut.poll(&mut cx), Poll::Ready(()))
}

#[test]
fn a_removed_token_is_refused_and_its_credential_ends_others_untouched() {
    let ring = Keyring::new(file("\"a\"", true));
    let alice = ring.authenticate(Some(A)).unwrap();
    let bob = ring.authenticate(Some(B)).unwrap();
    let worker = ring.authenticate(Some("w1-example-secret")).unwrap();
    assert!(!ready(alice.credential.removed()));

    let done = ring.replace(file("\"a\"", false));
    assert_eq!(
        done,
        Replaced {
            kept: 2,
            regranted: 0,
            added: 0,
            removed: 1
        }
    );
    assert_eq!(ring.authenticate(Some(A)).unwrap_err(), AuthError::Invalid);
    assert!(ready(alice.credential.removed()));
    assert!(ready(alice.credential.lost(Permission::JobView, "a")));
    assert!(alice.credential.is_removed());
    // Bob's and the worker's credentials are the same channels, never written.
    for p in [&bob, &worker] {
        assert!(!ready(p.credential.removed()));
        assert!(!p.credential.is_removed());
    }
    assert!(!ready(bob.credential.lost(Permission::JobView, "b")));
    assert_eq!(ring.authenticate(Some(B)).unwrap().name, "bob");
}

#[test]
fn shrunk_grants_end_only_what_they_no_longer_allow() {
    let ring = Keyring::new(file("\"a\", \"c\"", true));
    let alice = ring.authenticate(Some(A)).unwrap();
    let done = ring.replace(file("\"c\"", true));
    assert_eq!(done.regranted, 1);
    assert_eq!(done.removed, 0);
    assert!(ready(alice.credential.lost(Permission::JobView, "a")));
    assert!(!ready(alice.credential.lost(Permission::JobView, "c")));
    assert!(!ready(alice.credential.removed()));
    // The next request has the new grants.
    let again = ring.authenticate(Some(A)).unwrap();
    assert!(!again.may(Permission::JobView, "a"));
    assert!(again.may(Permission::JobView, "c"));
}

#[test]
fn a_secret_rewritten_as_its_hash_is_the_same_credential() {
    let ring = Keyring::new(file("\"a\"", true));
    let alice = ring.authenticate(Some(A)).unwrap();
    let hashed = format!(
        "[[token]]\nsecret_sha256 = \"{}\"\nprincipal = \"alice\"\n\
         grants = [{{permission = \"job.view\", projects = [\"a\"]}}]\n",
        Digest::of(A).to_hex()
    );
    let done = ring.replace(tokens(&hashed));
    assert_eq!(done.kept, 1);
    assert_eq!(done.removed, 2);
    assert!(!ready(alice.credential.removed()));
    assert_eq!(ring.authenticate(Some(A)).unwrap().name, "alice");
    assert!(!ring.has_worker("exec-01"));
    // The same secret under another principal is another credential.
    let renamed = hashed.replace("\"alice\"", "\"alice2\"");
    let done = ring.replace(tokens(&renamed));
    assert_eq!((done.added, done.removed), (1, 1));
    assert!(ready(alice.credential.removed()));
}

#[test]
fn the_metrics_count_reloads_and_entries() {
    let ring = Keyring::new(file("\"a\"", true));
    let mut registry = Registry::default();
    ring.register(&mut registry);
    ring.replace(file("\"a\"", false));
    ring.refused();
    ring.refused();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let mut lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    lines.sort();
    expect_test::expect![[r#"
        [
            "xce_tokens_loaded{kind=\"token\"} 1",
            "xce_tokens_loaded{kind=\"worker\"} 1",
            "xce_tokens_reloads_total{outcome=\"applied\"} 1",
            "xce_tokens_reloads_total{outcome=\"refused\"} 2",
        ]
    "#]]
    .assert_debug_eq(&lines);
}
