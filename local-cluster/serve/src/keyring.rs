//! The tokens a running process authenticates with, replaceable while it serves (SIGHUP).
//!
//! A [`Keyring`] holds the current [`Tokens`] and, per entry, the sending half of a watch
//! channel of its grants. Every [`Principal`] it authenticates carries a receiver of its
//! entry's channel ([`plugin_api::Credential`]), so when [`Keyring::replace`] removes an
//! entry (sends `None`) or shrinks its grants, the long requests of that credential —
//! streams and blocking queries, which select on it — end at once, change-driven, while
//! every other entry's channel is not touched (their watchers do not even wake).
//!
//! An entry of the new file is the same credential as one of the old when it has the same
//! secret (by digest: a `secret` rewritten as its `secret_sha256` stays the same) and the
//! same principal (or host); its grants are then updated in place.

use crate::auth::{Found, Tokens};
use plugin_api::{AuthError, Authenticator, Credential, LiveGrants, Principal};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::{Arc, PoisonError, RwLock};
use tokio::sync::watch;

/// The live tokens of a process. Cheap to clone (one shared state).
#[derive(Clone)]
pub struct Keyring(Arc<Inner>);

struct Inner {
    loaded: RwLock<Arc<Loaded>>,
    metrics: Metrics,
}

/// One version of the tokens, with each entry's channel (users, then workers, in the
/// order of [`Tokens::users`] and [`Tokens::workers`]).
struct Loaded {
    tokens: Tokens,
    users: Vec<watch::Sender<LiveGrants>>,
    workers: Vec<watch::Sender<LiveGrants>>,
}

#[derive(Clone, Default)]
struct Metrics {
    reloads: Family<Vec<(String, String)>, Counter>,
    loaded: Family<Vec<(String, String)>, Gauge>,
}

/// What a [`Keyring::replace`] did, by entry (users and workers together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replaced {
    /// Entries of both files, grants unchanged.
    pub kept: usize,
    /// Entries of both files whose grants changed (updated in place).
    pub regranted: usize,
    /// New entries.
    pub added: usize,
    /// Entries gone: their requests answer 401 from now on, their watchers end.
    pub removed: usize,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring").finish_non_exhaustive()
    }
}

impl From<Tokens> for Keyring {
    fn from(tokens: Tokens) -> Self {
        Self::new(tokens)
    }
}

// === impl Keyring ===

impl Keyring {
    /// A keyring holding `tokens`.
    pub fn new(tokens: Tokens) -> Self {
        let metrics = Metrics::default();
        let loaded = Loaded::fresh(tokens);
        metrics.count(&loaded.tokens);
        Self(Arc::new(Inner {
            loaded: RwLock::new(Arc::new(loaded)),
            metrics,
        }))
    }

    /// Registers `xce_tokens_reloads_total{outcome}` and `xce_tokens_loaded{kind}`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "xce_tokens_reloads",
            "Re-reads of the tokens file (SIGHUP), by outcome: applied, or refused (the old tokens stay)",
            self.0.metrics.reloads.clone(),
        );
        registry.register(
            "xce_tokens_loaded",
            "Entries of the tokens file in force, by kind (token, worker)",
            self.0.metrics.loaded.clone(),
        );
    }

    fn current(&self) -> Arc<Loaded> {
        self.0
            .loaded
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The tokens in force.
    pub fn tokens(&self) -> Tokens {
        self.current().tokens.clone()
    }

    /// Whether the tokens in force have a `[[worker]]` entry for `host`.
    pub fn has_worker(&self, host: &str) -> bool {
        self.current().tokens.worker(host).is_some()
    }

    /// Puts `tokens` in force. Entries also in the old tokens keep their channel (their
    /// open requests go on; changed grants are sent on it); removed ones are told `None`,
    /// so their streams and blocking queries end.
    pub fn replace(&self, tokens: Tokens) -> Replaced {
        let mut slot = self
            .0
            .loaded
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let old = slot.clone();
        let mut done = Replaced::default();
        let mut old_users = OldEntries::new(&old.users);
        let mut old_workers = OldEntries::new(&old.workers);
        let users = tokens
            .users()
            .iter()
            .map(|u| {
                let at =
                    old.tokens.users().iter().position(|o| {
                        o.principal == u.principal && o.key.digest() == u.key.digest()
                    });
                old_users.carry(at, Some(Arc::new(u.grant_pairs())), &mut done)
            })
            .collect();
        let workers = tokens
            .workers()
            .iter()
            .map(|w| {
                let at = old
                    .tokens
                    .workers()
                    .iter()
                    .position(|o| o.host == w.host && o.key.digest() == w.key.digest());
                old_workers.carry(at, Some(Arc::new(Vec::new())), &mut done)
            })
            .collect();
        let loaded = Loaded {
            tokens,
            users,
            workers,
        };
        // In force before the removed ones are told, so a client that reconnects at once
        // is refused.
        *slot = Arc::new(loaded);
        old_users.tell_removed(&mut done);
        old_workers.tell_removed(&mut done);
        self.0.metrics.count(&slot.tokens);
        self.0.metrics.reload("applied");
        done
    }

    /// Counts a re-read that was refused (the file did not parse): the tokens in force
    /// stay.
    pub fn refused(&self) {
        self.0.metrics.reload("refused");
    }
}

impl Keyring {
    /// The principal of the first `[[token]]` whose `principal` is `name`, as if that
    /// token had authenticated: its credential follows the entry across reloads (a
    /// reload that narrows its grants narrows what it sees at once). For a server that
    /// answers as a configured principal without a token of its own (DNS). `None`: no
    /// token has that principal.
    pub fn principal_named(&self, name: &str) -> Option<Principal> {
        let loaded = self.current();
        let i = loaded
            .tokens
            .users()
            .iter()
            .position(|u| u.principal == name)?;
        let credential = Credential::following(loaded.users[i].subscribe());
        Some(loaded.tokens.principal(Found::User(i), credential))
    }
}

impl Authenticator for Keyring {
    fn authenticate(&self, token: Option<&str>) -> Result<Principal, AuthError> {
        let loaded = self.current();
        let found = loaded.tokens.find(token)?;
        let chan = match found {
            Found::User(i) => &loaded.users[i],
            Found::Worker(i) => &loaded.workers[i],
        };
        Ok(loaded
            .tokens
            .principal(found, Credential::following(chan.subscribe())))
    }
}

// === impl OldEntries ===

/// One kind of entry (users, or workers) of the tokens being replaced: their channels,
/// and which of them the new tokens keep.
struct OldEntries<'a> {
    chans: &'a [watch::Sender<LiveGrants>],
    reused: Vec<bool>,
}

impl<'a> OldEntries<'a> {
    fn new(chans: &'a [watch::Sender<LiveGrants>]) -> Self {
        Self {
            chans,
            reused: vec![false; chans.len()],
        }
    }

    /// The channel of a new entry with `grants`: the old entry's at `at` (the same
    /// credential), updated in place, or a new channel.
    fn carry(
        &mut self,
        at: Option<usize>,
        grants: LiveGrants,
        done: &mut Replaced,
    ) -> watch::Sender<LiveGrants> {
        let Some(i) = at else {
            done.added += 1;
            return watch::channel(grants).0;
        };
        self.reused[i] = true;
        // Sent only when the grants differ: a kept entry's watchers do not even wake.
        let changed = self.chans[i].send_if_modified(|g| {
            let same = *g == grants;
            if !same {
                *g = grants.clone();
            }
            !same
        });
        if changed {
            done.regranted += 1;
        } else {
            done.kept += 1;
        }
        self.chans[i].clone()
    }

    /// Tells every entry the new tokens did not keep that it is gone (`None`), so its
    /// streams and blocking queries end.
    fn tell_removed(&self, done: &mut Replaced) {
        for (chan, reused) in self.chans.iter().zip(&self.reused) {
            if !reused {
                done.removed += 1;
                chan.send_replace(None);
            }
        }
    }
}

// === impl Loaded ===

impl Loaded {
    fn fresh(tokens: Tokens) -> Self {
        let users = tokens
            .users()
            .iter()
            .map(|u| watch::channel(Some(Arc::new(u.grant_pairs()))).0)
            .collect();
        let workers = tokens
            .workers()
            .iter()
            .map(|_| watch::channel(Some(Arc::new(Vec::new()))).0)
            .collect();
        Self {
            tokens,
            users,
            workers,
        }
    }
}

// === impl Metrics ===

impl Metrics {
    fn count(&self, tokens: &Tokens) {
        let kind = |k: &str| vec![("kind".to_owned(), k.to_owned())];
        self.loaded
            .get_or_create(&kind("token"))
            .set(tokens.users().len() as i64);
        self.loaded
            .get_or_create(&kind("worker"))
            .set(tokens.workers().len() as i64);
    }

    fn reload(&self, outcome: &str) {
        self.reloads
            .get_or_create(&vec![("outcome".to_owned(), outcome.to_owned())])
            .inc();
    }
}

#[cfg(test)]
mod tests;
