//! The fleet of separate apiservers, as the store knows it: each live `xced apiserver`
//! keeps one registration `<prefix>.apiservers/<id>` (a control key, like the leader key:
//! no state record, so neither [`Store::load_all`](crate::Store::load_all) nor the
//! apiservers' followers read it as one) attached to a lease of its own, saying which
//! controller revision its copy of the cluster has applied. The lease makes it live: an
//! apiserver that dies (or stops renewing) is gone from the fleet a TTL later.
//!
//! The leader controller follows the registrations ([`follow`]) to learn when every live
//! apiserver has applied the revision that took a draining replica out of the endpoint.
//! An apiserver writes its registration when its applied revision moves (at most a few
//! times a second) and renews its lease in between; the registration is no revision an
//! apiserver applies (only the controller's events are), so writing it never makes more
//! to acknowledge.

use super::gateway::{b64, int, Gateway, Limits};
use super::{pb, EtcdStore};
use retry_backoff::Backoff;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// The registrations' directory after the store prefix (starts with `.`: control keys).
const DIR: &str = ".apiservers/";
/// How long one read, write or lease call may take on one member.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the controller's watch of the registrations may stay silent before it reads
/// them again (a half-open connection to a frozen member must not hide changes for good).
const SILENCE: Duration = Duration::from_secs(10);

/// One apiserver's registration (the JSON value of its key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The apiserver's id: `HOST/PID@ADDR`, unique while it runs.
    pub id: String,
    /// The address it serves on.
    pub addr: String,
    /// Its release.
    pub version: String,
    /// The controller revision its copy of the cluster has applied.
    pub applied: u64,
    /// Its `max_lag`, in milliseconds: past this lag it fails closed. The controller holds
    /// a drain for it at most that long (plus the time the apiserver may take to learn
    /// that a revision exists) beyond `drain_ack_timeout` when that is shorter.
    pub max_lag_ms: u64,
}

/// Why a registration call failed.
#[derive(Debug, thiserror::Error)]
#[error("apiserver registration: {0}")]
pub struct FleetError(pub String);

impl EtcdStore {
    /// The etcd key of registration `id`.
    pub fn registration_key(&self, id: &str) -> String {
        format!("{}{DIR}{id}", self.prefix)
    }

    /// A count-only range over the store's prefix of the keys modified at `from` or later:
    /// its answer's `count` says whether anything under the prefix changed since (0: no),
    /// its header's `revision` is the store's current revision. Linearizable: a member
    /// cut off from the others cannot answer it.
    pub fn changes_since_request(&self, from: i64) -> pb::RangeRequest {
        pb::RangeRequest {
            key: self.prefix.as_bytes().to_vec(),
            range_end: super::prefix_end(self.prefix.as_bytes()),
            count_only: true,
            min_mod_revision: from.max(0),
            ..Default::default()
        }
    }

    /// A new lease of `ttl` (whole seconds, at least 1) for a registration.
    pub async fn fleet_lease(&self, ttl: Duration) -> Result<i64, FleetError> {
        let body = json!({ "TTL": ttl.as_secs().max(1).to_string() });
        let r = self.fleet_call("/v3/lease/grant", &body).await?;
        match int(&r["ID"]) {
            0 => Err(FleetError(format!("lease grant answered no lease: {r}"))),
            id => Ok(id),
        }
    }

    /// Renews `lease`; `Ok(false)`: it has expired (a new one is needed).
    pub async fn fleet_keep_alive(&self, lease: i64) -> Result<bool, FleetError> {
        let r = match self
            .fleet_call("/v3/lease/keepalive", &json!({ "ID": lease.to_string() }))
            .await
        {
            Err(e) if e.0.contains("lease not found") => return Ok(false),
            r => r?,
        };
        if r.to_string().contains("lease not found") {
            return Ok(false);
        }
        if r.get("error").is_some() || r.get("result").is_none() {
            return Err(FleetError(format!(
                "lease keepalive answered no result: {r}"
            )));
        }
        Ok(int(&r["result"]["TTL"]) > 0)
    }

    /// Writes `reg` under its key, attached to `lease`.
    pub async fn register(&self, reg: &Registration, lease: i64) -> Result<(), FleetError> {
        let value = serde_json::to_vec(reg).expect("a registration serializes");
        let body = json!({
            "key": b64(self.registration_key(&reg.id).as_bytes()),
            "value": b64(&value),
            "lease": lease.to_string(),
        });
        self.fleet_call("/v3/kv/put", &body).await.map(|_| ())
    }

    /// Revokes `lease` (its registration goes with it): a clean shutdown leaves the fleet
    /// at once.
    pub async fn fleet_leave(&self, lease: i64) -> Result<(), FleetError> {
        self.fleet_call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }))
            .await
            .map(|_| ())
    }

    async fn fleet_call(&self, path: &str, body: &Value) -> Result<Value, FleetError> {
        self.gateway
            .call(path, body, Limits::each(CALL_TIMEOUT))
            .await
            .map_err(|e| FleetError(e.message))
    }

    /// Every registration now, and the etcd revision of the read.
    async fn read_fleet(&self) -> Result<(BTreeMap<String, Registration>, i64), FleetError> {
        let dir = format!("{}{DIR}", self.prefix);
        let req = pb::RangeRequest {
            range_end: super::prefix_end(dir.as_bytes()),
            key: dir.into_bytes(),
            ..Default::default()
        };
        let r: pb::RangeResponse = self
            .gateway
            .unary("KV/Range", &req, Limits::each(CALL_TIMEOUT))
            .await
            .map_err(|e| FleetError(e.message))?;
        let mut fleet = BTreeMap::new();
        for kv in &r.kvs {
            if let Some(reg) = decode(&kv.value) {
                fleet.insert(reg.id.clone(), reg);
            }
        }
        Ok((fleet, r.revision()))
    }
}

/// A registration's value; `None` (logged) when it is not one this build reads.
fn decode(value: &[u8]) -> Option<Registration> {
    match serde_json::from_slice(value) {
        Ok(reg) => Some(reg),
        Err(e) => {
            tracing::warn!(error = %e, "fleet: an apiserver registration this build cannot read; ignored");
            None
        }
    }
}

/// Follows the registrations until the task is dropped: reads them all, hands them to
/// `publish`, then watches the directory and hands over the whole fleet again after every
/// change. A broken or silent watch is met with a new read (after a pause growing with
/// the failures): change-driven, with no periodic read while the watch works.
pub async fn follow(store: std::sync::Arc<EtcdStore>, mut publish: impl FnMut(Vec<Registration>)) {
    let mut backoff = Backoff::jittered(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        let why = match store.read_fleet().await {
            Ok((mut fleet, rev)) => {
                publish(fleet.values().cloned().collect());
                watch_fleet(&store, &mut fleet, rev + 1, &mut publish, &mut backoff).await
            }
            Err(e) => e.0,
        };
        let pause = backoff.next_pause();
        tracing::warn!(reason = %why, retry_in = ?pause, "fleet: reading the apiserver registrations again");
        tokio::time::sleep(pause).await;
    }
}

/// One watch of the registrations from `from`, until it breaks or stays silent: why.
async fn watch_fleet(
    store: &EtcdStore,
    fleet: &mut BTreeMap<String, Registration>,
    from: i64,
    publish: &mut impl FnMut(Vec<Registration>),
    backoff: &mut Backoff,
) -> String {
    let gateway: &Gateway = store.gateway();
    let dir = format!("{}{DIR}", store.prefix);
    let range_end = super::prefix_end(dir.as_bytes());
    let create = pb::WatchCreateRequest::new(dir.as_bytes(), range_end, from);
    let mut watch = match gateway
        .watch_stream(gateway.current(), create, SILENCE)
        .await
    {
        Ok(w) => w,
        Err(e) if e.silent => return "the watch was not created in time".into(),
        Err(e) => return e.message,
    };
    loop {
        let answer = match tokio::time::timeout(SILENCE, watch.next()).await {
            Ok(Ok(Some(answer))) => answer,
            Ok(Ok(None)) => return format!("{}: the watch ended", watch.endpoint()),
            Ok(Err(e)) => return e,
            // Quiet is normal (registrations change only when revisions are applied);
            // read again anyway, so that a stuck stream costs at most this long.
            Err(_) => return format!("{}: silent for {SILENCE:?}", watch.endpoint()),
        };
        if answer.canceled {
            return format!(
                "{}: the watch failed: {:?} (compacted at {})",
                watch.endpoint(),
                answer.cancel_reason,
                answer.compact_revision
            );
        }
        if answer.created {
            backoff.reset();
        }
        for ev in &answer.events {
            let Some(kv) = &ev.kv else { continue };
            let id = String::from_utf8_lossy(&kv.key[dir.len().min(kv.key.len())..]).into_owned();
            if ev.r#type == pb::event_type::DELETE {
                fleet.remove(&id);
            } else if let Some(reg) = decode(&kv.value) {
                fleet.insert(id, reg);
            }
        }
        if !answer.events.is_empty() {
            publish(fleet.values().cloned().collect());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestEtcd;
    use std::sync::Arc;

    fn reg(id: &str, applied: u64) -> Registration {
        Registration {
            id: id.into(),
            addr: "127.0.0.1:1".into(),
            version: "0.1.0".into(),
            applied,
            max_lag_ms: 2000,
        }
    }

    /// The controller's view of the fleet follows registrations as they are written and
    /// as their leases end (a revocation here: an expiry deletes the key the same way);
    /// the registrations are control keys, which no load of the state reads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_fleet_follows_registrations_and_their_leases() {
        let etcd = TestEtcd::start();
        let store = Arc::new(etcd.store("/xce/"));
        let (tx, mut rx) = tokio::sync::watch::channel(Vec::new());
        let follower = tokio::spawn(follow(store.clone(), move |f| {
            tx.send_replace(f);
        }));
        let until = |rx: &mut tokio::sync::watch::Receiver<Vec<Registration>>,
                     want: Vec<Registration>| {
            let mut rx = rx.clone();
            async move {
                tokio::time::timeout(testkit::patience(), rx.wait_for(|f| *f == want))
                    .await
                    .unwrap_or_else(|_| panic!("the fleet never became {want:?}"))
                    .unwrap();
            }
        };
        let a = store.fleet_lease(Duration::from_secs(5)).await.unwrap();
        let b = store.fleet_lease(Duration::from_secs(5)).await.unwrap();
        store.register(&reg("a", 3), a).await.unwrap();
        store.register(&reg("b", 2), b).await.unwrap();
        until(&mut rx, vec![reg("a", 3), reg("b", 2)]).await;
        assert!(store.fleet_keep_alive(b).await.unwrap());
        store.register(&reg("b", 4), b).await.unwrap();
        until(&mut rx, vec![reg("a", 3), reg("b", 4)]).await;
        store.fleet_leave(a).await.unwrap();
        until(&mut rx, vec![reg("b", 4)]).await;
        assert!(
            !matches!(store.fleet_keep_alive(a).await, Ok(true)),
            "a revoked lease is gone"
        );
        use crate::Store as _;
        assert!(store.load_all().unwrap().is_empty(), "no state record");
        follower.abort();
    }
}
