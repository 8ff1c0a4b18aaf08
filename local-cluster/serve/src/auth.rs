//! Tokens file and bearer authentication (docs/rbac.md).
//!
//! ```toml
//! [[token]]
//! secret = "alice-example-secret"      # or secret_sha256 = "<64 hex digits>"
//! principal = "alice"
//! grants = [ { permission = "job.view", projects = ["team-a"] } ]
//!
//! [[worker]]
//! host = "exec-01"
//! secret_sha256 = "..."
//! ```
//!
//! Parsing validates ([`Tokens::parse`]); the [`Authenticator`] impl trusts the validated
//! type. Every entry is held as the SHA-256 of its secret (a `secret` is hashed when the
//! file loads, a `secret_sha256` is that hash already), and a presented token is hashed
//! once and its digest looked up in a map of the entries' digests: not compared with
//! every entry in constant time (why a lookup is safe, and what that cost: see
//! [`Tokens::find`]). Secrets are never logged: [`Secret`]'s `Debug` redacts them.
//!
//! Reloading (SIGHUP) is [`crate::keyring::Keyring`]'s; this module only reads files.
#![warn(missing_docs)]

use plugin_api::{AuthError, Authenticator, Credential, Permission, Principal, PrincipalKind};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::fmt;

/// The fewest characters a `secret` may have: anything shorter is guessable offline
/// from a leaked hash or online by a patient prober. `xced token new` makes 43.
pub const MIN_SECRET_CHARS: usize = 16;

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
    /// Its SHA-256.
    pub fn digest(&self) -> Digest {
        Digest::of(&self.0)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The SHA-256 of a secret: what a `secret_sha256` holds, and what every entry is
/// compared by.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The SHA-256 of `text`.
    pub fn of(text: &str) -> Self {
        Self(Sha256::digest(text.as_bytes()).into())
    }

    /// Lowercase hex, as `secret_sha256` holds it.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits (either case); the reason otherwise.
    pub fn from_hex(text: &str) -> Result<Self, String> {
        if text.len() != 64 {
            return Err(format!(
                "expected 64 hex digits (a SHA-256), got {} characters",
                text.chars().count()
            ));
        }
        let mut out = [0u8; 32];
        for (i, pair) in text.as_bytes().chunks(2).enumerate() {
            let hex = std::str::from_utf8(pair)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok());
            match hex {
                Some(b) if pair.iter().all(u8::is_ascii_hexdigit) => out[i] = b,
                _ => return Err("expected 64 hex digits (a SHA-256): not hex".into()),
            }
        }
        Ok(Self(out))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

/// How an entry gives its credential: the secret itself, or only its SHA-256 (so the
/// file holds nothing a reader could present).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// `secret = "..."`.
    Secret(Secret),
    /// `secret_sha256 = "<hex>"`.
    Sha256(Digest),
}

impl Key {
    /// What the entry is compared by.
    pub fn digest(&self) -> Digest {
        match self {
            Key::Secret(s) => s.digest(),
            Key::Sha256(d) => *d,
        }
    }
    /// The secret, when the file holds it (not for a `secret_sha256` entry).
    pub fn secret(&self) -> Option<&Secret> {
        match self {
            Key::Secret(s) => Some(s),
            Key::Sha256(_) => None,
        }
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserToken {
    /// What the client sends as the bearer token (or its hash).
    pub key: Key,
    /// Who it is (logs, never the secret).
    pub principal: String,
    /// What it may do.
    pub grants: Vec<Grant>,
}

impl UserToken {
    /// Its grants as a [`Principal`] holds them.
    pub fn grant_pairs(&self) -> Vec<(Permission, Vec<String>)> {
        self.grants
            .iter()
            .map(|g| (g.permission, g.projects.clone()))
            .collect()
    }
}

/// A worker credential (`[[worker]]`): may act for `host` only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCredential {
    /// The host the credential belongs to.
    pub host: String,
    /// The bearer secret (or its hash).
    pub key: Key,
}

/// `[[token]]` as written: exactly one of `secret` and `secret_sha256` is checked after
/// reading, so every entry's problems are listed together.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret: Option<Secret>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret_sha256: Option<String>,
    #[serde(default)]
    principal: String,
    #[serde(default)]
    grants: Vec<Grant>,
}

/// `[[worker]]` as written.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorker {
    #[serde(default)]
    host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret: Option<Secret>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret_sha256: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default, rename = "token", skip_serializing_if = "Vec::is_empty")]
    tokens: Vec<RawToken>,
    #[serde(default, rename = "worker", skip_serializing_if = "Vec::is_empty")]
    workers: Vec<RawWorker>,
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
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Tokens {
    users: Vec<UserToken>,
    workers: Vec<WorkerCredential>,
    /// Every entry's digest → its position, users then workers (what [`Tokens::find`]
    /// looks up; no two entries share a secret).
    digests: HashMap<Digest, usize>,
}

/// Which entry a presented token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// `users()[i]`.
    User(usize),
    /// `workers()[i]`.
    Worker(usize),
}

// === impl Tokens ===

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the digests: the entries show what the file said.
        f.debug_struct("Tokens")
            .field("users", &self.users)
            .field("workers", &self.workers)
            .finish()
    }
}

impl Tokens {
    /// Parses and validates a tokens file; every problem of a well-formed file at once.
    pub fn parse(text: &str) -> Result<Self, TokensError> {
        let file: TokensFile = toml::from_str(text)
            .map_err(|e| TokensError::Parse(e.message().trim_end_matches('.').to_owned()))?;
        let mut problems = Vec::new();
        // Entries keep their place in the file in messages (token[2] stays token[2] when
        // token[1] had no key); an entry without a usable key is checked all the same, so
        // every problem is listed at once.
        let (mut users, mut user_names) = (Vec::new(), Vec::new());
        for (i, t) in file.tokens.into_iter().enumerate() {
            let entry = format!("token[{i}]");
            match key_of(&entry, t.secret, t.secret_sha256, &mut problems) {
                Some(key) => {
                    users.push(UserToken {
                        key,
                        principal: t.principal,
                        grants: t.grants,
                    });
                    user_names.push(entry);
                }
                None => check_user(&entry, &t.principal, &t.grants, &mut problems),
            }
        }
        let (mut workers, mut worker_names) = (Vec::new(), Vec::new());
        for (i, w) in file.workers.into_iter().enumerate() {
            let entry = format!("worker[{i}]");
            match key_of(&entry, w.secret, w.secret_sha256, &mut problems) {
                Some(key) => {
                    workers.push(WorkerCredential { host: w.host, key });
                    worker_names.push(entry);
                }
                None if w.host.is_empty() => {
                    problems.push(format!("{entry}.host: must not be empty"))
                }
                None => {}
            }
        }
        Self::checked(users, &user_names, workers, &worker_names, problems)
            .map_err(TokensError::Invalid)
    }

    /// Validates tokens and credentials: secrets of at least [`MIN_SECRET_CHARS`], without
    /// whitespace, and unique across the file (a `secret` and a `secret_sha256` of the
    /// same secret are the same); principals non-empty; every grant names at least one
    /// project; one credential per host.
    pub fn new(users: Vec<UserToken>, workers: Vec<WorkerCredential>) -> Result<Self, TokensError> {
        let user_names: Vec<String> = (0..users.len()).map(|i| format!("token[{i}]")).collect();
        let names: Vec<String> = (0..workers.len()).map(|i| format!("worker[{i}]")).collect();
        Self::checked(users, &user_names, workers, &names, Vec::new()).map_err(TokensError::Invalid)
    }

    fn checked(
        users: Vec<UserToken>,
        user_names: &[String],
        workers: Vec<WorkerCredential>,
        worker_names: &[String],
        mut problems: Vec<String>,
    ) -> Result<Self, Vec<String>> {
        let mut seen: Vec<(Digest, &str)> = Vec::new();
        for (t, entry) in users.iter().zip(user_names) {
            check_key(entry, &t.key, &mut problems);
            check_user(entry, &t.principal, &t.grants, &mut problems);
            seen.push((t.key.digest(), entry));
        }
        for (i, (w, entry)) in workers.iter().zip(worker_names).enumerate() {
            check_key(entry, &w.key, &mut problems);
            if w.host.is_empty() {
                problems.push(format!("{entry}.host: must not be empty"));
            }
            if let Some(j) = workers[..i].iter().position(|o| o.host == w.host) {
                problems.push(format!(
                    "{entry}.host: {:?} already has a credential ({})",
                    w.host, worker_names[j]
                ));
            }
            seen.push((w.key.digest(), entry));
        }
        for (i, (d, entry)) in seen.iter().enumerate() {
            if let Some((_, first)) = seen[..i].iter().find(|(o, _)| o == d) {
                problems.push(format!("{entry}: same secret as {first}"));
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let digests = seen.iter().enumerate().map(|(i, (d, _))| (*d, i)).collect();
        Ok(Self {
            users,
            workers,
            digests,
        })
    }

    /// The tokens file text (TOML) of these tokens.
    pub fn to_toml(&self) -> String {
        let raw = |key: &Key| match key {
            Key::Secret(s) => (Some(s.clone()), None),
            Key::Sha256(d) => (None, Some(d.to_hex())),
        };
        let file = TokensFile {
            tokens: self
                .users
                .iter()
                .map(|u| {
                    let (secret, secret_sha256) = raw(&u.key);
                    RawToken {
                        secret,
                        secret_sha256,
                        principal: u.principal.clone(),
                        grants: u.grants.clone(),
                    }
                })
                .collect(),
            workers: self
                .workers
                .iter()
                .map(|w| {
                    let (secret, secret_sha256) = raw(&w.key);
                    RawWorker {
                        host: w.host.clone(),
                        secret,
                        secret_sha256,
                    }
                })
                .collect(),
        };
        toml::to_string(&file).expect("tokens serialize to TOML")
    }

    /// Fresh random tokens for `xced dev`: one admin token (principal `admin`, `admin` on
    /// `"*"`) and one worker credential per host. Returns the admin secret too.
    pub fn generate_dev(hosts: &[String]) -> Result<(Tokens, Secret), getrandom::Error> {
        let admin = random_secret()?;
        let users = vec![UserToken {
            key: Key::Secret(admin.clone()),
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
                key: Key::Secret(random_secret()?),
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

    /// The credential entry of `host`'s worker, if any.
    pub fn worker(&self, host: &str) -> Option<&WorkerCredential> {
        self.workers.iter().find(|w| w.host == host)
    }

    /// Which entry `token` is: the token's SHA-256, looked up among the entries' digests.
    ///
    /// A lookup, not a comparison with every entry: with one worker credential per host,
    /// comparing each request's digest with all of them in constant time cost about 7 % of
    /// a controller's CPU at 1,000 hosts (`integration-tests` README, "The real controller
    /// at scale"). What the lookup's timing can tell is how the SHA-256 of a presented
    /// token relates to a stored digest, never the secret: steering a digest towards a
    /// stored one needs a preimage of SHA-256, and a stored digest alone does not
    /// authenticate (only its secret does). How long a secret is does not show either.
    ///
    /// A token shorter than [`MIN_SECRET_CHARS`] is refused before the lookup: no entry
    /// can be a secret that short (a `secret` is checked when the file loads, but a
    /// `secret_sha256` could be the hash of a short word, which a prober would guess).
    pub fn find(&self, token: Option<&str>) -> Result<Found, AuthError> {
        let token = token.ok_or(AuthError::Missing)?;
        if token.chars().count() < MIN_SECRET_CHARS {
            return Err(AuthError::Invalid);
        }
        let at = *self
            .digests
            .get(&Digest::of(token))
            .ok_or(AuthError::Invalid)?;
        Ok(match at.checked_sub(self.users.len()) {
            None => Found::User(at),
            Some(w) => Found::Worker(w),
        })
    }

    /// The principal of an entry [`find`](Self::find) returned, with `credential`.
    pub fn principal(&self, found: Found, credential: Credential) -> Principal {
        match found {
            Found::User(i) => {
                let u = &self.users[i];
                Principal {
                    name: u.principal.clone(),
                    kind: PrincipalKind::User,
                    grants: u.grant_pairs(),
                    credential,
                }
            }
            Found::Worker(i) => {
                let w = &self.workers[i];
                Principal {
                    name: format!("worker:{}", w.host),
                    kind: PrincipalKind::Worker {
                        host: w.host.clone(),
                    },
                    grants: Vec::new(),
                    credential,
                }
            }
        }
    }
}

/// The entry's key from its two fields: exactly one must be given.
fn key_of(
    entry: &str,
    secret: Option<Secret>,
    sha256: Option<String>,
    problems: &mut Vec<String>,
) -> Option<Key> {
    match (secret, sha256) {
        (Some(s), None) => Some(Key::Secret(s)),
        (None, Some(hex)) => match Digest::from_hex(&hex) {
            Ok(d) => Some(Key::Sha256(d)),
            Err(reason) => {
                problems.push(format!("{entry}.secret_sha256: {reason}"));
                None
            }
        },
        (Some(_), Some(_)) => {
            problems.push(format!(
                "{entry}.secret_sha256: give either secret or secret_sha256, not both"
            ));
            None
        }
        (None, None) => {
            problems.push(format!(
                "{entry}.secret: missing (give secret, or secret_sha256 from `xced token new`)"
            ));
            None
        }
    }
}

fn check_key(entry: &str, key: &Key, problems: &mut Vec<String>) {
    let Key::Secret(secret) = key else {
        return;
    };
    let raw = secret.expose();
    let chars = raw.chars().count();
    if raw.is_empty() {
        problems.push(format!("{entry}.secret: must not be empty"));
    } else if raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
        problems.push(format!("{entry}.secret: must not contain whitespace"));
    } else if chars < MIN_SECRET_CHARS {
        problems.push(format!(
            "{entry}.secret: too short ({chars} characters, at least {MIN_SECRET_CHARS}); \
             `xced token new` makes a strong one"
        ));
    }
}

fn check_user(entry: &str, principal: &str, grants: &[Grant], problems: &mut Vec<String>) {
    if principal.trim().is_empty() {
        problems.push(format!("{entry}.principal: must not be empty"));
    }
    for (j, g) in grants.iter().enumerate() {
        if g.projects.is_empty() || g.projects.iter().any(|p| p.is_empty()) {
            problems.push(format!(
                "{entry}.grants[{j}].projects: must list at least one project, none empty"
            ));
        } else if g.permission.cluster_wide() && g.projects != ["*"] {
            problems.push(format!(
                "{entry}.grants[{j}].projects: {} is cluster-wide: grant it on [\"*\"]",
                g.permission.name()
            ));
        }
    }
}

/// 256 random bits from the OS, base64url without padding (43 characters).
pub fn random_secret() -> Result<Secret, getrandom::Error> {
    use base64::Engine as _;
    let mut b = [0u8; 32];
    getrandom::fill(&mut b)?;
    Ok(Secret::new(
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b),
    ))
}

impl Authenticator for Tokens {
    fn authenticate(&self, token: Option<&str>) -> Result<Principal, AuthError> {
        let found = self.find(token)?;
        Ok(self.principal(found, Credential::fixed()))
    }
}

/// `[metrics]` of the controller's and the apiserver's config: who may read `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `true`: `/metrics` answers without a token (a trusted network, a scraper that
    /// cannot send one). Off by default: the metrics' labels name every tenant's
    /// projects and services.
    #[serde(default)]
    pub public: bool,
}

impl MetricsConfig {
    /// Whether `who` (the request's [`Principal`], or why it has none) may read
    /// `/metrics`: anyone when [`public`](Self::public), else a holder of `metrics.view`
    /// (or `admin`). The refusal names the permission.
    pub fn admit(
        &self,
        who: Result<Principal, plugin_api::ApiError>,
    ) -> Result<(), plugin_api::ApiError> {
        if self.public {
            return Ok(());
        }
        require(&who?, Permission::MetricsView, "/metrics")
    }
}

/// Whether `who` holds the cluster-wide `permission` (or `admin`) that `what` needs; a
/// 403 naming the permission otherwise.
pub fn require(
    who: &Principal,
    permission: Permission,
    what: &str,
) -> Result<(), plugin_api::ApiError> {
    if who.may(permission, "*") {
        return Ok(());
    }
    Err(plugin_api::ApiError::forbidden(format!(
        "{what} needs the permission {} (or admin), which {:?} does not hold",
        permission.name(),
        who.name
    )))
}

#[cfg(test)]
mod tests;
