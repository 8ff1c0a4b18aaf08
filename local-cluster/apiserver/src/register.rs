//! This apiserver's registration in the store (`xce_store::etcd::fleet`): a key of its
//! own, attached to a lease, saying which controller revision its listeners have applied,
//! so that the leader controller sends a draining replica SIGTERM only once every live
//! apiserver has taken it out of its endpoints.
//!
//! Written when the applied revision moves, at most every [`MIN_GAP`] (a burst of commits
//! costs a few writes, not one per commit); the lease is renewed every second in between.
//! The registration is a control key, not a controller revision: writing it gives nothing
//! to apply and acknowledge, so this never feeds itself.

use super::fresh::Freshness;
use super::metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;
use xce_store::etcd::fleet::Registration;
use xce_store::EtcdStore;

/// The registration's lease TTL: a dead apiserver leaves the fleet this long after its
/// last renewal (the controller then stops waiting for it).
pub(crate) const TTL: Duration = Duration::from_secs(5);
/// How often the lease is renewed.
const RENEW: Duration = Duration::from_secs(1);
/// The shortest time between two writes of the registration.
const MIN_GAP: Duration = Duration::from_millis(200);

/// Keeps the registration up to date until dropped.
pub(crate) struct Registrar {
    pub(crate) store: Arc<EtcdStore>,
    pub(crate) fresh: Arc<Freshness>,
    pub(crate) metrics: Metrics,
    /// What is registered (its `applied` is filled in at each write).
    pub(crate) me: Registration,
}

impl Registrar {
    /// Registers (once, before returning: the controller knows this apiserver from the
    /// start of its serving, or soon after if etcd does not answer now) and returns the
    /// lease, if one was granted.
    pub(crate) async fn first(&mut self) -> Option<i64> {
        let lease = self.lease().await?;
        self.write(lease).await.then_some(lease)
    }

    /// Follows the applied revision and renews the lease until dropped.
    pub(crate) async fn run(mut self, mut lease: Option<i64>) {
        let mut applied = self.fresh.applied.subscribe();
        let mut renew = tokio::time::interval(RENEW);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut written = lease.map(|_| self.me.applied);
        loop {
            tokio::select! {
                changed = applied.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // Let a burst settle: one write covers it.
                    tokio::time::sleep(MIN_GAP).await;
                }
                _ = renew.tick() => {
                    if let Some(l) = lease {
                        match self.store.fleet_keep_alive(l).await {
                            Ok(true) => {}
                            Ok(false) => {
                                tracing::warn!(lease = %format!("{l:x}"), "registration: the lease expired; registering again");
                                lease = None;
                            }
                            Err(e) => {
                                self.metrics.registration_failures.inc();
                                tracing::debug!(error = %e, "registration: cannot renew the lease");
                            }
                        }
                    }
                }
            }
            if lease.is_none() {
                lease = self.lease().await;
                written = None;
            }
            let now = *applied.borrow_and_update();
            if let (Some(l), true) = (lease, written != Some(now)) {
                self.me.applied = now;
                if self.write(l).await {
                    written = Some(now);
                }
            }
        }
    }

    async fn lease(&self) -> Option<i64> {
        match self.store.fleet_lease(TTL).await {
            Ok(l) => Some(l),
            Err(e) => {
                self.metrics.registration_failures.inc();
                tracing::warn!(error = %e, "registration: cannot get a lease");
                None
            }
        }
    }

    async fn write(&mut self, lease: i64) -> bool {
        self.me.applied = *self.fresh.applied.borrow();
        match self.store.register(&self.me, lease).await {
            Ok(()) => true,
            Err(e) => {
                self.metrics.registration_failures.inc();
                tracing::warn!(error = %e, applied = self.me.applied, "registration: cannot write it");
                false
            }
        }
    }
}
