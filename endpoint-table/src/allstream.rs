//! `GET /v1/endpoints/stream[?service=a,b][&project=p][&include=all]` (docs/api.md): one SSE
//! stream of every entry the caller may view, fed by the journal (`crate::journal`).
//!
//! Wire format: first a snapshot, one event per visible entry (the entry as
//! `GET /v1/services/{name}/endpoints` answers it, with `service`, `project` and `meta`),
//! then one event per change; `{"service","project","deleted":true,"index"}` for a service
//! that is gone. Event ids are cluster revisions and only grow; events of one revision
//! (a host event can change several services) carry the id on the last of them only, and a
//! snapshot's only on its last event (the revision the snapshot is at), so a client's
//! `Last-Event-ID` always means "everything up to here". Resuming from it sends exactly
//! the changes since (each service's newest state, removals included); where the
//! apiserver cannot rule out a gap (the id is older than what it remembers, newer than
//! what it has, or inside a resync that skipped revisions) it sends `event: reset` and a
//! full snapshot instead.
//!
//! RBAC is per entry and re-checked on every event: each time the stream wakes, its
//! credential's grants as the host holds them now are compared with the stream's (a token
//! the host does not follow is authenticated again), so changed grants apply to the next
//! event (a changed
//! set of grants restarts the stream with `event: reset` and a snapshot of what is now
//! visible), and a token that no longer authenticates ends it. A service the caller
//! cannot view never appears, not even as a deletion. Unknown or invisible names in
//! `?service=` are simply never matched.

use crate::journal::Item;
use crate::lag::{Lag, Place};
use crate::metrics::Kind;
use crate::query::{last_event_id, params, Params, RawParams};
use crate::render;
use crate::shared::{Ended, EndingFuture, Shared};
use crate::wire::{DeletedAnswer, RESET_EVENT};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::Response;
use axum::Extension;
use plugin_api::{ApiContext, ApiError, AuthError, Permission, Principal};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use tokio::sync::watch;

/// The most names `?service=` may list.
pub(crate) const MAX_SERVICES: usize = 1000;

/// How long a resume waits for this host to reach a `Last-Event-ID` it has not applied yet
/// (a client that moved from a host ahead of this one) before it resets instead.
const CATCH_UP: std::time::Duration = std::time::Duration::from_secs(2);

/// How many journal records a stream takes at once (whole revisions: a few more when the
/// last revision has more).
const CHUNK: usize = 256;

/// `GET /v1/endpoints/stream`
pub(crate) async fn all_stream(
    State(shared): State<Arc<Shared>>,
    principal: Principal,
    Extension(cx): Extension<ApiContext>,
    headers: HeaderMap,
    query: Params,
) -> Result<Response, ApiError> {
    shared.ensure_synced()?;
    let p = params(query)?;
    let filter = Filter::parse(&p)?;
    let last_event_id = last_event_id(&headers)?;
    let place = Place {
        counted: shared.watcher(&principal, Kind::AllServices)?,
        // Registered before the start is taken: it owes what it may be handed.
        recipient: Some(shared.all_recipient()),
    };
    if let Some(n) = last_event_id {
        shared.journal.reached(n, CATCH_UP).await;
    }
    // Subscribed before the start is taken: a publish in between wakes the stream, which
    // then finds nothing new rather than missing something.
    let published = shared.journal.subscribe();
    let start = shared.journal.start(last_event_id);
    tracing::debug!(
        principal = %principal.name,
        last_event_id,
        reset = start.reset,
        services = start.items.len(),
        "all-services stream opened"
    );
    let lag = Lag::new(
        start.position,
        place,
        shared.cfg.all_stream_buffer,
        "all services".to_owned(),
    );
    // Cut off by the journal's publishes if it falls behind: no task of its own.
    shared
        .all_laggards
        .register(Arc::downgrade(&lag) as std::sync::Weak<dyn crate::shared::Behind>);
    let events = AllStream {
        pending: start.items.into(),
        reset: start.reset,
        position: start.position,
        taken_id: 0,
        done: false,
        published,
        token: bearer(&headers),
        cx,
        // Visibility is checked per entry: only the token's removal ends it from outside.
        ending: shared.ending(&principal, None).boxed(),
        principal,
        filter,
        shared,
        lag,
    };
    let stream = futures_util::stream::unfold(events, |mut s| async move {
        let event = s.next().await?;
        Some((event, s))
    });
    Ok(render::sse(stream))
}

/// What a stream is restricted to, besides RBAC.
#[derive(Debug)]
struct Filter {
    /// `?service=`: these names only (in any project the caller may view).
    services: Option<HashSet<String>>,
    /// `?project=`: this project only.
    project: Option<String>,
    /// `?include=all`: non-ready replicas too.
    all: bool,
}

/// What woke a stream that had handed everything it had taken.
enum Wake {
    /// The journal has more, or the stream starts over: go on.
    More,
    /// The stream ends, with this last event if any.
    End(Option<Bytes>),
}

/// One client's all-services stream.
///
/// It holds no copy of the entries: the journal keeps the newest state of each service,
/// and the stream only the records it has taken and not yet sent (at most a chunk, or
/// the snapshot it starts with). A client more than `all_stream_buffer` changes behind
/// is cut off right after the publish that puts it there (`Shared::all_laggards`, see
/// `crate::lag`) and resumes with `Last-Event-ID`.
struct AllStream {
    /// Taken, not sent yet, by id.
    pending: VecDeque<Item>,
    /// An `event: reset` is owed before `pending`.
    reset: bool,
    /// The journal position after the last record taken.
    position: u64,
    /// The highest revision taken from the journal (what the delivery histogram is
    /// settled up to once the items taken are sent).
    taken_id: u64,
    done: bool,
    published: watch::Receiver<u64>,
    /// The bearer token the stream was opened with, authenticated again on every wake.
    token: Option<String>,
    cx: ApiContext,
    ending: EndingFuture,
    principal: Principal,
    filter: Filter,
    shared: Arc<Shared>,
    lag: Arc<Lag>,
}

// === impl Filter ===

impl Filter {
    fn parse(p: &RawParams) -> Result<Self, ApiError> {
        for (name, given) in [
            ("port", p.port.is_some()),
            ("format", p.format.is_some()),
            ("index", p.index.is_some()),
            ("wait", p.wait.is_some()),
        ] {
            if given {
                return Err(ApiError::bad_param(
                    name,
                    "not supported by /v1/endpoints/stream (it sends whole entries as json)",
                ));
            }
        }
        let all = match p.include.as_deref() {
            None => false,
            Some("all") => true,
            Some(_) => return Err(ApiError::bad_param("include", "expected \"all\"")),
        };
        let services = match p.service.as_deref() {
            None => None,
            Some(list) => {
                let names: Vec<&str> = list.split(',').map(str::trim).collect();
                if names.iter().any(|n| n.is_empty()) {
                    return Err(ApiError::bad_param(
                        "service",
                        "expected service names separated by commas, without empty ones",
                    ));
                }
                if names.len() > MAX_SERVICES {
                    return Err(ApiError::bad_param(
                        "service",
                        format!(
                            "at most {MAX_SERVICES} names (got {}); leave it out to follow every service",
                            names.len()
                        ),
                    ));
                }
                Some(names.into_iter().map(str::to_owned).collect())
            }
        };
        Ok(Self {
            services,
            project: p.project.clone(),
            all,
        })
    }

    fn matches(&self, item: &Item) -> bool {
        self.project.as_ref().is_none_or(|p| *p == item.key.project)
            && self
                .services
                .as_ref()
                .is_none_or(|s| s.contains(&item.key.name))
    }
}

// === impl AllStream ===

impl AllStream {
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if self.done || self.lag.is_cut() {
                return None;
            }
            if std::mem::take(&mut self.reset) {
                return Some(reset_event());
            }
            if let Some(event) = self.next_pending() {
                return Some(event);
            }
            // Everything taken was handed (or was not for this client): wait for more.
            self.lag.settle(self.taken_id, false);
            self.lag.take(self.position);
            if let Wake::End(event) = self.wake().await {
                self.done = true;
                return event;
            }
            // Changed grants start over with a reset and a snapshot, not a chunk.
            if self.reset {
                continue;
            }
            if !self.take_chunk() {
                self.done = true;
                return None;
            }
        }
    }

    /// The event of the next pending record this client may view, if any.
    fn next_pending(&mut self) -> Option<Bytes> {
        while let Some(item) = self.pending.pop_front() {
            if !self.visible(&item) {
                continue;
            }
            // The id goes on the last event of its revision this client gets: until
            // then, a resume must send the revision's other changes again.
            let last = !self
                .pending
                .iter()
                .take_while(|i| i.id == item.id)
                .any(|i| self.visible(i));
            if self.pending.is_empty() {
                self.lag.take(self.position);
            }
            let event = self.event(&item, last);
            // Handed now (`xce_endpoint_delivery_seconds{kind="all_services"}`); the
            // earlier revisions it was not handed were not for this client.
            self.lag.settle(item.id.saturating_sub(1), false);
            self.lag.settle(item.id, true);
            return Some(event);
        }
        None
    }

    /// Waits for the journal to publish more, or for the stream to end; a wake-up also
    /// checks the stream's lag and authenticates its token again.
    async fn wake(&mut self) -> Wake {
        let changed = tokio::select! {
            r = self.published.changed() => r,
            ended = &mut self.ending => {
                return Wake::End(match ended {
                    // The host stops serving: end the stream (the client resumes
                    // elsewhere with Last-Event-ID).
                    Ended::Draining => None,
                    // The entries may be out of date: end it (a reconnect gets 503
                    // `stale` until the next resync, then a reset).
                    Ended::Stale => None,
                    // Its token was removed by a reload of the host's tokens: end now,
                    // not at the next change (grants that merely changed are checked
                    // again before anything is sent, in `authenticate`).
                    Ended::Revoked => {
                        tracing::info!(principal = %self.principal.name, "all-services stream ended: its token was revoked");
                        Some(revoked_event())
                    }
                });
            }
        };
        if changed.is_err() {
            return Wake::End(None);
        }
        let end = *self.published.borrow_and_update();
        // A host that lost its authority (a leader frozen past its lease) sends nothing
        // more from its copy: the client reconnects and gets 503 `stale` here.
        if self.lag.check(end) || !self.authenticate() || self.shared.ensure_authority().is_err() {
            return Wake::End(None);
        }
        Wake::More
    }

    /// Takes the next chunk of the journal into `pending`; false when the journal no
    /// longer has the records after the stream's position (the stream ends).
    fn take_chunk(&mut self) -> bool {
        let taken = self.shared.journal.take(self.position, CHUNK);
        if taken.lost {
            // Only past the cut-off: the journal's publish cuts it off first.
            self.lag.check(u64::MAX);
            return false;
        }
        self.position = taken.position;
        if let Some(last) = taken.items.last() {
            self.taken_id = self.taken_id.max(last.id);
        }
        self.pending = taken.items.into();
        true
    }

    /// Checks the stream's credential again: false if it no longer authenticates (the
    /// stream ends); with changed grants, the stream starts over with a reset and a
    /// snapshot of what the caller may view now.
    ///
    /// A credential the host follows (its tokens file, re-read on SIGHUP) is not
    /// authenticated again: its grants as the host holds them now are one read of its
    /// watch channel, and compared only when the host changed them. A fixed one (a host
    /// that does not tell) is authenticated again with the stream's token.
    fn authenticate(&mut self) -> bool {
        let principal = match self.principal.credential.current() {
            Some(None) => {
                tracing::info!(principal = %self.principal.name, "all-services stream ended: its token was removed");
                return false;
            }
            Some(Some(grants)) => {
                if *grants == self.principal.grants {
                    return true;
                }
                Principal {
                    grants: grants.to_vec(),
                    ..self.principal.clone()
                }
            }
            None => match self.cx.auth.authenticate(self.token.as_deref()) {
                Ok(p) => p,
                Err(error) => {
                    tracing::info!(principal = %self.principal.name, %error, "all-services stream ended: its token no longer authenticates");
                    return false;
                }
            },
        };
        if principal.grants != self.principal.grants {
            tracing::info!(principal = %principal.name, "grants changed: all-services stream starts over");
            self.principal = principal;
            let (items, position) = self.shared.journal.snapshot();
            self.pending = items.into();
            self.position = position;
            self.reset = true;
        }
        true
    }

    fn visible(&self, item: &Item) -> bool {
        self.filter.matches(item) && self.principal.may(Permission::JobView, &item.key.project)
    }

    /// The item's event: an entry's is rendered once and shared by every stream.
    fn event(&self, item: &Item, with_id: bool) -> Bytes {
        let id = with_id.then_some(item.id);
        let Some(entry) = &item.entry else {
            let deleted = serde_json::to_vec(&DeletedAnswer {
                service: item.key.name.clone(),
                project: item.key.project.clone(),
                deleted: true,
                index: item.id,
            })
            .expect("an answer always serializes");
            let id = id.map(|id| id.to_string());
            return match &id {
                Some(id) => render::event(&[("data", &deleted), ("id", id.as_bytes())]),
                None => render::event(&[("data", &deleted)]),
            };
        };
        render::all_event(entry, self.filter.all, id)
    }
}

impl Drop for AllStream {
    fn drop(&mut self) {
        // Frees the place now, not when the journal's next publish forgets it.
        self.lag.release();
    }
}

/// The bearer token of a request the `Principal` extractor accepted.
fn bearer(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = v
        .strip_prefix("Bearer ")
        .or_else(|| v.strip_prefix("bearer "))?;
    Some(token.trim().to_owned())
}

/// `event: reset`: the client drops what it has; a full snapshot follows.
fn reset_event() -> Bytes {
    let data =
        r#"{"reason":"a gap cannot be ruled out: drop what you have, a full snapshot follows"}"#;
    render::event(&[("event", RESET_EVENT.as_bytes()), ("data", data.as_bytes())])
}

/// The last event of a stream whose token was revoked: the 401 body its next request would
/// get, as the per-service stream ends (so a client tells "revoked" from "server went away").
fn revoked_event() -> Bytes {
    let body = plugin_api::ErrorBody::from(ApiError::unauthenticated(AuthError::Revoked));
    let body = serde_json::to_vec(&body).expect("an error body always serializes");
    render::event(&[("event", b"error"), ("data", &body)])
}
