//! Tokens file and bearer authentication (DESIGN §6).
//!
//! ```toml
//! [[token]]
//! secret = "alice-secret"
//! principal = "alice"
//! grants = [ { permission = "job.view", projects = ["team-a"] } ]
//!
//! [[worker]]
//! host = "exec-01"
//! secret = "..."
//! ```
//!
//! Parsing validates ([`Tokens::parse`]); the [`Authenticator`] impl trusts the validated
//! type and compares secrets in constant time. Secrets are never logged: [`Secret`]'s
//! `Debug` redacts them.
#![warn(missing_docs)]

use plugin_api::{AuthError, Authenticator, Permission, Principal, PrincipalKind};
use serde::{Deserialize, Serialize};
use std::fmt;
use subtle::ConstantTimeEq;

/// A bearer secret. `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    /// The secret itself, for sending it as a bearer token.
    pub fn expose(&self) -> &str {
        &self.0
    }
    fn matches(&self, token: &str) -> bool {
        // Constant time in the secret: the work depends on the candidate's length only
        // (which the caller knows), so neither the content nor the length of a secret
        // leaks. (`ct_eq` on slices of different lengths returns early, which would tell
        // a prober the secret's length.)
        let secret = self.0.as_bytes();
        let token = token.as_bytes();
        let mut same = secret.len().ct_eq(&token.len());
        if secret.is_empty() {
            return false;
        }
        for (i, b) in token.iter().enumerate() {
            // Wraps around past the secret's end (no branch on where that is); the length
            // check has failed there anyway.
            same &= secret[i % secret.len()].ct_eq(b);
        }
        bool::from(same)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// One `{ permission, projects }` grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// The permission.
    pub permission: Permission,
    /// Projects it applies to; `"*"` means all.
    pub projects: Vec<String>,
}

/// A user token (`[[token]]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserToken {
    /// What the client sends as the bearer token.
    pub secret: Secret,
    /// Who it is (logs, never the secret).
    pub principal: String,
    /// What it may do.
    #[serde(default)]
    pub grants: Vec<Grant>,
}

/// A worker credential (`[[worker]]`): may act for `host` only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerCredential {
    /// The host the credential belongs to.
    pub host: String,
    /// The bearer secret.
    pub secret: Secret,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default, rename = "token", skip_serializing_if = "Vec::is_empty")]
    tokens: Vec<UserToken>,
    #[serde(default, rename = "worker", skip_serializing_if = "Vec::is_empty")]
    workers: Vec<WorkerCredential>,
}

/// Why a tokens file was rejected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokensError {
    /// Not valid TOML, or a field unknown or of the wrong type.
    #[error("tokens file: {0}")]
    Parse(String),
    /// Well-formed but wrong; every problem, each naming its entry and field.
    #[error("tokens file: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// A validated tokens file: user tokens and worker credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tokens {
    users: Vec<UserToken>,
    workers: Vec<WorkerCredential>,
}

// === impl Tokens ===

impl Tokens {
    /// Parses and validates a tokens file.
    pub fn parse(text: &str) -> Result<Self, TokensError> {
        let file: TokensFile = toml::from_str(text)
            .map_err(|e| TokensError::Parse(e.message().trim_end_matches('.').to_owned()))?;
        Self::new(file.tokens, file.workers)
    }

    /// Validates tokens and credentials: secrets non-empty, without whitespace and
    /// unique across the file; principals non-empty; every grant names at least one
    /// project; one credential per host.
    pub fn new(users: Vec<UserToken>, workers: Vec<WorkerCredential>) -> Result<Self, TokensError> {
        let mut problems = Vec::new();
        let mut seen: Vec<(&Secret, String)> = Vec::new();
        let check_secret = |entry: &str, secret: &Secret, problems: &mut Vec<String>| {
            let raw = secret.expose();
            if raw.is_empty() {
                problems.push(format!("{entry}.secret: must not be empty"));
            } else if raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
                problems.push(format!("{entry}.secret: must not contain whitespace"));
            }
        };
        for (i, t) in users.iter().enumerate() {
            let entry = format!("token[{i}]");
            check_secret(&entry, &t.secret, &mut problems);
            if t.principal.trim().is_empty() {
                problems.push(format!("{entry}.principal: must not be empty"));
            }
            for (j, g) in t.grants.iter().enumerate() {
                if g.projects.is_empty() || g.projects.iter().any(|p| p.is_empty()) {
                    problems.push(format!(
                        "{entry}.grants[{j}].projects: must list at least one project, none empty"
                    ));
                }
            }
            seen.push((&t.secret, entry));
        }
        for (i, w) in workers.iter().enumerate() {
            let entry = format!("worker[{i}]");
            check_secret(&entry, &w.secret, &mut problems);
            if w.host.is_empty() {
                problems.push(format!("{entry}.host: must not be empty"));
            }
            if let Some(j) = workers[..i].iter().position(|o| o.host == w.host) {
                problems.push(format!(
                    "{entry}.host: {:?} already has a credential (worker[{j}])",
                    w.host
                ));
            }
            seen.push((&w.secret, entry));
        }
        for (i, (s, entry)) in seen.iter().enumerate() {
            if s.expose().is_empty() {
                continue;
            }
            if let Some((_, first)) = seen[..i].iter().find(|(o, _)| o == s) {
                problems.push(format!("{entry}.secret: same secret as {first}"));
            }
        }
        if problems.is_empty() {
            Ok(Self { users, workers })
        } else {
            Err(TokensError::Invalid(problems))
        }
    }

    /// The tokens file text (TOML) of these tokens.
    pub fn to_toml(&self) -> String {
        let file = TokensFile {
            tokens: self.users.clone(),
            workers: self.workers.clone(),
        };
        toml::to_string(&file).expect("tokens serialize to TOML")
    }

    /// Fresh random tokens for `xced dev`: one admin token (principal `admin`, `admin` on
    /// `"*"`) and one worker credential per host. Returns the admin secret too.
    pub fn generate_dev(hosts: &[String]) -> Result<(Tokens, Secret), getrandom::Error> {
        let admin = Secret::new(random_secret()?);
        let users = vec![UserToken {
            secret: admin.clone(),
            principal: "admin".into(),
            grants: vec![Grant {
                permission: Permission::Admin,
                projects: vec!["*".into()],
            }],
        }];
        let mut workers = Vec::new();
        for h in hosts {
            workers.push(WorkerCredential {
                host: h.clone(),
                secret: Secret::new(random_secret()?),
            });
        }
        let tokens = Tokens::new(users, workers)
            .expect("generated tokens are valid (random secrets, distinct hosts)");
        Ok((tokens, admin))
    }

    /// The user tokens.
    pub fn users(&self) -> &[UserToken] {
        &self.users
    }

    /// The worker credentials.
    pub fn workers(&self) -> &[WorkerCredential] {
        &self.workers
    }

    /// The credential of `host`'s worker, if any.
    pub fn worker_secret(&self, host: &str) -> Option<&Secret> {
        self.workers
            .iter()
            .find(|w| w.host == host)
            .map(|w| &w.secret)
    }
}

/// 32 random bytes, hex.
fn random_secret() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Authenticator for Tokens {
    fn authenticate(&self, token: Option<&str>) -> Result<Principal, AuthError> {
        let token = token.ok_or(AuthError::Missing)?;
        // Compare against every entry, without stopping at the first match, so the time
        // taken does not tell which entry (or how many) matched.
        let mut found: Option<Principal> = None;
        for u in &self.users {
            if u.secret.matches(token) && found.is_none() {
                found = Some(Principal {
                    name: u.principal.clone(),
                    kind: PrincipalKind::User,
                    grants: u
                        .grants
                        .iter()
                        .map(|g| (g.permission, g.projects.clone()))
                        .collect(),
                });
            }
        }
        for w in &self.workers {
            if w.secret.matches(token) && found.is_none() {
                found = Some(Principal {
                    name: format!("worker:{}", w.host),
                    kind: PrincipalKind::Worker {
                        host: w.host.clone(),
                    },
                    grants: Vec::new(),
                });
            }
        }
        found.ok_or(AuthError::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check(text: &str, expect: Expect) {
        let out = match Tokens::parse(text) {
            Ok(t) => format!("{t:?}"),
            Err(e) => e.to_string(),
        };
        expect.assert_eq(&out);
    }

    #[test]
    fn secrets_match_only_themselves() {
        let s = Secret::new("s3cret-token");
        assert!(s.matches("s3cret-token"));
        for other in [
            "",
            "s",
            "s3cret-toke",
            "s3cret-tokenn",
            "s3cret-tokens3cret-token",
            "S3cret-token",
            "x3cret-token",
        ] {
            assert!(!s.matches(other), "{other:?}");
        }
        assert!(!Secret::new("").matches(""));
    }

    #[test]
    fn parses_tokens_and_workers_and_redacts_secrets() {
        check(
            r#"
            [[token]]
            secret = "alice-secret"
            principal = "alice"
            grants = [ { permission = "job.view", projects = ["team-a"] },
                       { permission = "job.submit", projects = ["team-a"] } ]
            [[worker]]
            host = "exec-01"
            secret = "w1-secret"
            "#,
            expect![[
                r#"Tokens { users: [UserToken { secret: Secret(<redacted>), principal: "alice", grants: [Grant { permission: JobView, projects: ["team-a"] }, Grant { permission: JobSubmit, projects: ["team-a"] }] }], workers: [WorkerCredential { host: "exec-01", secret: Secret(<redacted>) }] }"#
            ]],
        );
    }

    #[test]
    fn unknown_fields_and_permissions_are_rejected() {
        check(
            "[[token]]\nsecret = \"s\"\nprincipal = \"a\"\nrole = \"x\"\n",
            expect!["tokens file: unknown field `role`, expected one of `secret`, `principal`, `grants`"],
        );
        check(
            "[[token]]\nsecret = \"s\"\nprincipal = \"a\"\ngrants = [{permission = \"job.delete\", projects = [\"*\"]}]\n",
            expect!["tokens file: unknown variant `job.delete`, expected one of `job.view`, `job.submit`, `admin`"],
        );
    }

    #[test]
    fn every_problem_names_its_entry_and_field() {
        check(
            r#"
            [[token]]
            secret = ""
            principal = " "
            grants = [ { permission = "admin", projects = [] } ]
            [[token]]
            secret = "dup"
            principal = "b"
            [[worker]]
            host = "exec-01"
            secret = "dup"
            [[worker]]
            host = "exec-01"
            secret = "has space"
            "#,
            expect![[
                r#"tokens file: token[0].secret: must not be empty; token[0].principal: must not be empty; token[0].grants[0].projects: must list at least one project, none empty; worker[1].secret: must not contain whitespace; worker[1].host: "exec-01" already has a credential (worker[0]); worker[0].secret: same secret as token[1]"#
            ]],
        );
    }

    #[test]
    fn authenticates_users_and_workers() {
        let t = Tokens::parse(
            "[[token]]\nsecret = \"alice-secret\"\nprincipal = \"alice\"\ngrants = [{permission = \"job.view\", projects = [\"a\"]}]\n[[worker]]\nhost = \"exec-01\"\nsecret = \"w1\"\n",
        )
        .unwrap();
        let alice = t.authenticate(Some("alice-secret")).unwrap();
        assert_eq!(alice.name, "alice");
        assert!(alice.may(Permission::JobView, "a"));
        assert!(!alice.may(Permission::JobView, "b"));
        let w = t.authenticate(Some("w1")).unwrap();
        assert_eq!(
            w.kind,
            PrincipalKind::Worker {
                host: "exec-01".into()
            }
        );
        assert!(w.grants.is_empty());
        assert_eq!(
            t.authenticate(Some("alice-secre")).unwrap_err(),
            AuthError::Invalid
        );
        assert_eq!(t.authenticate(Some("")).unwrap_err(), AuthError::Invalid);
        assert_eq!(t.authenticate(None).unwrap_err(), AuthError::Missing);
    }

    #[test]
    fn generated_dev_tokens_round_trip() {
        let (t, admin) = Tokens::generate_dev(&["exec-01".into(), "exec-02".into()]).unwrap();
        assert_eq!(admin.expose().len(), 64);
        let p = t.authenticate(Some(admin.expose())).unwrap();
        assert!(p.is_admin());
        let w2 = t.worker_secret("exec-02").unwrap();
        assert_ne!(w2, &admin);
        let back = Tokens::parse(&t.to_toml()).unwrap();
        assert_eq!(back, t);
        assert!(!format!("{t:?}").contains(admin.expose()));
    }
}
