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

/// A store whose commits wait while `closed` is set (a commit blocked on a slow etcd).
#[derive(Default)]
struct Gated {
    inner: MemStore,
    closed: Mutex<bool>,
    opened: std::sync::Condvar,
    entered: std::sync::atomic::AtomicBool,
}

impl Gated {
    fn set(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.opened.notify_all();
    }
}

impl Store for Gated {
    fn load_all(&self) -> Result<Vec<(Key, Vec<u8>)>, StoreError> {
        self.inner.load_all()
    }
    fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        let mut closed = self.closed.lock().unwrap();
        if *closed {
            self.entered
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        while *closed {
            closed = self.opened.wait(closed).unwrap();
        }
        drop(closed);
        self.inner.commit(batch)
    }
    fn put_if_absent(&self, key: Key, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        self.inner.put_if_absent(key, value)
    }
}

/// A term whose leadership is lost steps down (its listener closed, the call returns)
/// while its state task is blocked in a commit: the commit is left to end by itself.
/// `shutdown` (what a lost term used before) waits for that commit, for as long as the
/// store holds it (a quorum loss: until etcd has its quorum again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_term_steps_down_while_a_commit_is_blocked() {
    use std::io::Write as _;
    let store = Arc::new(Gated::default());
    let cfg = ControllerConfig {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        ..ControllerConfig::default()
    };
    let keyring = xce_serve::keyring::Keyring::new(Tokens::parse(app::TOKENS).unwrap());
    let running = crate::start(cfg, keyring, ControllerPlugins::default(), store.clone())
        .await
        .unwrap();
    let addr = running.addr;
    store.set(true);
    // A submission: its commit blocks in the store.
    let body = web("web", "default", 1).to_string();
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "POST /v1/services HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let until = std::time::Instant::now() + testkit::patience();
    while !store.entered.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            std::time::Instant::now() < until,
            "the commit never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stepped = tokio::time::timeout(
        testkit::patience(),
        running.step_down(Duration::from_millis(200)),
    )
    .await;
    assert_eq!(
        stepped,
        Ok(false),
        "stepped down, the state task still busy"
    );
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the listener is closed for the standby"
    );
    assert!(
        *store.closed.lock().unwrap(),
        "the commit was still blocked all along"
    );
    store.set(false);
    drop(conn);
}
