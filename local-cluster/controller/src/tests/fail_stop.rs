//! A controller whose store says its view is stale, or cannot write, stops.

use super::*;

struct StaleAfter {
    inner: MemStore,
    stale: std::sync::atomic::AtomicBool,
}

impl Store for StaleAfter {
    fn load_all(&self) -> Result<Vec<(Key, Vec<u8>)>, StoreError> {
        self.inner.load_all()
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        if self.stale.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Stale("another writer moved the fence".into()));
        }
        self.inner.commit(batch)
    }
    fn put_if_absent(&self, key: Key, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        self.inner.put_if_absent(key, value)
    }
}

/// A controller whose store says its view is stale stops itself (fail-stop) and says
/// why, instead of running on refusing every change; its API answers 503 from then on.
#[tokio::test]
async fn a_stale_store_stops_the_controller() {
    let store = Arc::new(StaleAfter {
        inner: MemStore::new(),
        stale: false.into(),
    });
    let app = app_on(store.clone()).await;
    app.register("exec-01", W1, 2).await;
    store.stale.store(true, std::sync::atomic::Ordering::SeqCst);
    let (s, _) = app.submit(ADMIN, web("web", "default", 1)).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "not persisted");
    assert_eq!(
        app.failure().await,
        "the store changed under this controller: another writer moved the fence"
    );
    let (s, _) = app.get("/v1/services", ADMIN).await;
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "no answers from a stale view"
    );
}

#[tokio::test]
async fn a_full_disk_answers_507_and_stops_the_controller() {
    let store = Arc::new(MemStore::new());
    let app = app_on(store.clone()).await;
    app.register("exec-01", W1, 2).await;
    let (s, _) = app.call("GET", "/healthz", None, None).await;
    assert_eq!(s, StatusCode::OK);
    store.fail_every_commit_with(xce_store::StoreError::Io {
        no_space: true,
        message: "No space left on device (os error 28)".into(),
    });
    let (s, v) = app.submit(ADMIN, web("web", "default", 1)).await;
    assert_eq!(s, StatusCode::INSUFFICIENT_STORAGE, "{v}");
    assert_eq!(v["error"]["code"], "insufficient_storage");
    assert_eq!(
        app.failure().await,
        "store I/O error (no space left on device): No space left on device (os error 28)"
    );
    let (s, _) = app.call("GET", "/healthz", None, None).await;
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "healthz says it cannot commit"
    );
    // Nothing acknowledged was lost: the store has no trace of the refused service.
    let services = store
        .load_all()
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.ns == "service")
        .count();
    assert_eq!(services, 0);
}
