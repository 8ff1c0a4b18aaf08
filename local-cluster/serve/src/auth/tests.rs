use super::*;
use expect_test::{expect, Expect};
use proptest::prelude::*;

fn check(text: &str, expect: Expect) {
    let out = match Tokens::parse(text) {
        Ok(t) => format!("{t:?}"),
        Err(e) => e.to_string(),
    };
    expect.assert_eq(&out);
}

/// `secret_sha256` of `secret`, for the files below.
fn sha(secret: &str) -> String {
    Digest::of(secret).to_hex()
}

#[test]
fn digest_hex_round_trips_and_matches_sha256() {
    // The SHA-256 test vector of "abc" (FIPS 180-2).
    let d = Digest::of("abc");
    assert_eq!(
        d.to_hex(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(Digest::from_hex(&d.to_hex().to_uppercase()), Ok(d));
}

#[test]
fn parses_tokens_and_workers_and_redacts_secrets() {
    check(
        r#"
        [[token]]
        secret = "alice-example-secret"
        principal = "alice"
        grants = [ { permission = "job.view", projects = ["team-a"] },
                   { permission = "job.submit", projects = ["team-a"] } ]
        [[worker]]
        host = "exec-01"
        secret = "w1-example-secret"
        "#,
        expect![[
            r#"Tokens { users: [UserToken { key: Secret(Secret(<redacted>)), principal: "alice", grants: [Grant { permission: JobView, projects: ["team-a"] }, Grant { permission: JobSubmit, projects: ["team-a"] }] }], workers: [WorkerCredential { host: "exec-01", key: Secret(Secret(<redacted>)) }] }"#
        ]],
    );
}

#[test]
fn a_file_may_mix_secrets_and_hashes() {
    let text = format!(
        "[[token]]\nsecret = \"alice-example-secret\"\nprincipal = \"alice\"\n\
         [[token]]\nsecret_sha256 = \"{}\"\nprincipal = \"bob\"\n\
         [[worker]]\nhost = \"exec-01\"\nsecret_sha256 = \"{}\"\n\
         [[worker]]\nhost = \"exec-02\"\nsecret = \"w2-example-secret\"\n",
        sha("bob-example-secret"),
        sha("w1-example-secret").to_uppercase(),
    );
    let t = Tokens::parse(&text).unwrap();
    assert_eq!(
        t.authenticate(Some("alice-example-secret")).unwrap().name,
        "alice"
    );
    assert_eq!(
        t.authenticate(Some("bob-example-secret")).unwrap().name,
        "bob"
    );
    assert_eq!(
        t.authenticate(Some("w1-example-secret")).unwrap().name,
        "worker:exec-01"
    );
    assert_eq!(
        t.authenticate(Some("w2-example-secret")).unwrap().name,
        "worker:exec-02"
    );
    // The hash itself is not a credential.
    assert_eq!(
        t.authenticate(Some(&sha("bob-example-secret")))
            .unwrap_err(),
        AuthError::Invalid
    );
    assert!(t.worker("exec-01").unwrap().key.secret().is_none());
    // Written back as it was read (the hash lowercase).
    assert_eq!(Tokens::parse(&t.to_toml()).unwrap(), t);
    assert!(t.to_toml().contains(&sha("w1-example-secret")));
}

#[test]
fn unknown_fields_and_permissions_are_rejected() {
    check(
        "[[token]]\nsecret = \"alice-example-secret\"\nprincipal = \"a\"\nrole = \"x\"\n",
        expect!["tokens file: unknown field `role`, expected one of `secret`, `secret_sha256`, `principal`, `grants`"],
    );
    check(
        "[[token]]\nsecret = \"alice-example-secret\"\nprincipal = \"a\"\ngrants = [{permission = \"job.delete\", projects = [\"*\"]}]\n",
        expect!["tokens file: unknown variant `job.delete`, expected one of `job.view`, `job.submit`, `admin`, `metrics.view`, `host.view`"],
    );
}

/// Issue 27 finding 9: a `secret_sha256` of a short word must not make that word a
/// token. The file cannot tell (it holds only the hash), so a presented token shorter
/// than `MIN_SECRET_CHARS` is refused before the lookup, as a worker's is.
#[test]
fn a_short_presented_token_is_refused_even_when_its_hash_is_listed() {
    let text = format!(
        "[[token]]\nsecret_sha256 = \"{}\"\nprincipal = \"weak\"\n\
         [[worker]]\nhost = \"exec-01\"\nsecret_sha256 = \"{}\"\n",
        sha("letmein"),
        sha("w1-short"),
    );
    let t = Tokens::parse(&text).unwrap();
    for short in ["letmein", "w1-short", ""] {
        assert_eq!(t.find(Some(short)), Err(AuthError::Invalid), "{short:?}");
    }
    // A listed token of exactly the minimum length still authenticates.
    let sixteen = "a".repeat(MIN_SECRET_CHARS);
    let t = Tokens::parse(&format!(
        "[[token]]\nsecret_sha256 = \"{}\"\nprincipal = \"ok\"\n",
        sha(&sixteen)
    ))
    .unwrap();
    assert_eq!(t.find(Some(&sixteen)), Ok(Found::User(0)));
}

/// `metrics.view` and `host.view` are cluster-wide: granted on `["*"]` only.
#[test]
fn cluster_wide_permissions_are_granted_on_every_project_only() {
    check(
        "[[token]]\nsecret = \"ops-example-secret\"\nprincipal = \"ops\"\n\
         grants = [{permission = \"metrics.view\", projects = [\"team-a\"]},\
                   {permission = \"host.view\", projects = [\"*\", \"team-b\"]},\
                   {permission = \"host.view\", projects = [\"*\"]}]\n",
        expect![[
            r#"tokens file: token[0].grants[0].projects: metrics.view is cluster-wide: grant it on ["*"]; token[0].grants[1].projects: host.view is cluster-wide: grant it on ["*"]"#
        ]],
    );
}

#[test]
fn both_or_neither_bad_hex_and_short_secrets_are_refused_naming_the_entry() {
    check(
        &format!(
            "[[token]]\nsecret = \"alice-example-secret\"\nsecret_sha256 = \"{}\"\nprincipal = \"a\"\n",
            sha("x")
        ),
        expect!["tokens file: token[0].secret_sha256: give either secret or secret_sha256, not both"],
    );
    check(
        "[[worker]]\nhost = \"exec-01\"\n",
        expect!["tokens file: worker[0].secret: missing (give secret, or secret_sha256 from `xced token new`)"],
    );
    check(
        "[[token]]\nsecret_sha256 = \"abc\"\nprincipal = \"a\"\n",
        expect!["tokens file: token[0].secret_sha256: expected 64 hex digits (a SHA-256), got 3 characters"],
    );
    check(
        &format!(
            "[[token]]\nsecret_sha256 = \"{}zz\"\nprincipal = \"a\"\n",
            &sha("x")[..62]
        ),
        expect!["tokens file: token[0].secret_sha256: expected 64 hex digits (a SHA-256): not hex"],
    );
    check(
        "[[token]]\nsecret = \"alice-secret\"\nprincipal = \"alice\"\n",
        expect!["tokens file: token[0].secret: too short (12 characters, at least 16); `xced token new` makes a strong one"],
    );
}

#[test]
fn every_problem_names_its_entry_and_field() {
    check(
        &format!(
            r#"
            [[token]]
            secret = ""
            principal = " "
            grants = [ {{ permission = "admin", projects = [] }} ]
            [[token]]
            secret = "duplicate-example-secret"
            principal = "b"
            [[token]]
            principal = ""
            [[token]]
            secret = "short"
            principal = "c"
            [[token]]
            secret_sha256 = "{dup}"
            principal = "d"
            [[worker]]
            host = "exec-01"
            secret = "duplicate-example-secret"
            [[worker]]
            host = "exec-01"
            secret = "has space in the middle"
            [[worker]]
            host = ""
            secret_sha256 = "0123"
            "#,
            dup = sha("duplicate-example-secret")
        ),
        expect![[
            r#"tokens file: token[2].secret: missing (give secret, or secret_sha256 from `xced token new`); token[2].principal: must not be empty; worker[2].secret_sha256: expected 64 hex digits (a SHA-256), got 4 characters; worker[2].host: must not be empty; token[0].secret: must not be empty; token[0].principal: must not be empty; token[0].grants[0].projects: must list at least one project, none empty; token[3].secret: too short (5 characters, at least 16); `xced token new` makes a strong one; worker[1].secret: must not contain whitespace; worker[1].host: "exec-01" already has a credential (worker[0]); token[4]: same secret as token[1]; worker[0]: same secret as token[1]"#
        ]],
    );
}

#[test]
fn authenticates_users_and_workers() {
    let t = Tokens::parse(
        "[[token]]\nsecret = \"alice-example-secret\"\nprincipal = \"alice\"\ngrants = [{permission = \"job.view\", projects = [\"a\"]}]\n[[worker]]\nhost = \"exec-01\"\nsecret = \"w1-example-secret\"\n",
    )
    .unwrap();
    let alice = t.authenticate(Some("alice-example-secret")).unwrap();
    assert_eq!(alice.name, "alice");
    assert!(alice.may(Permission::JobView, "a"));
    assert!(!alice.may(Permission::JobView, "b"));
    let w = t.authenticate(Some("w1-example-secret")).unwrap();
    assert_eq!(
        w.kind,
        PrincipalKind::Worker {
            host: "exec-01".into()
        }
    );
    assert!(w.grants.is_empty());
    for wrong in [
        "alice-example-secre",
        "alice-example-secrett",
        "",
        "Alice-example-secret",
    ] {
        assert_eq!(
            t.authenticate(Some(wrong)).unwrap_err(),
            AuthError::Invalid,
            "{wrong:?}"
        );
    }
    assert_eq!(t.authenticate(None).unwrap_err(), AuthError::Missing);
}

#[test]
fn generated_dev_tokens_round_trip() {
    let (t, admin) = Tokens::generate_dev(&["exec-01".into(), "exec-02".into()]).unwrap();
    // 256 bits, base64url without padding.
    assert_eq!(admin.expose().len(), 43);
    let p = t.authenticate(Some(admin.expose())).unwrap();
    assert!(p.is_admin());
    let w2 = t.worker("exec-02").unwrap().key.secret().unwrap();
    assert_ne!(w2, &admin);
    let back = Tokens::parse(&t.to_toml()).unwrap();
    assert_eq!(back, t);
    assert!(!format!("{t:?}").contains(admin.expose()));
}

/// A secret strong enough to load: at least 16 characters, no whitespace.
fn secret() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_-]{16,24}"
}

proptest! {
    /// A presented token authenticates iff it equals an entry's `secret` or hashes to
    /// an entry's `secret_sha256`, and then as exactly that entry.
    #[test]
    fn a_token_matches_iff_it_is_a_secret_or_hashes_to_one(
        entries in proptest::collection::btree_set(secret(), 1..6),
        hashed in proptest::collection::vec(any::<bool>(), 6),
        probe in prop_oneof![secret(), "[a-z]{16,20}"],
        pick in any::<prop::sample::Index>(),
    ) {
        let entries: Vec<String> = entries.into_iter().collect();
        let mut text = String::new();
        for (i, s) in entries.iter().enumerate() {
            if hashed[i] {
                text += &format!("[[token]]\nsecret_sha256 = \"{}\"\nprincipal = \"p{i}\"\n", sha(s));
            } else {
                text += &format!("[[token]]\nsecret = \"{s}\"\nprincipal = \"p{i}\"\n");
            }
        }
        let t = Tokens::parse(&text).unwrap();
        // A probe that is one of the secrets, and one that may be anything.
        let known = &entries[pick.index(entries.len())];
        for token in [known, &probe] {
            let want = entries.iter().position(|s| s == token);
            let got = t.find(Some(token)).ok();
            prop_assert_eq!(got, want.map(Found::User));
            if let Some(i) = want {
                prop_assert_eq!(t.authenticate(Some(token)).unwrap().name, format!("p{i}"));
            }
        }
    }
}
