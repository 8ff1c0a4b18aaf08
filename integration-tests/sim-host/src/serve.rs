//! The sim host's apiserver: the endpoint table's [`ApiExtension`] mounted the way the
//! trait says (the [`ApiContext`] installed as a request extension), served over real
//! HTTP on loopback, and a client that reads entries back.

use endpoint_table::wire::EndpointsAnswer;
use plugin_api::{ApiContext, ApiExtension, Permission, Principal, PrincipalKind, ServiceKey};
use std::net::SocketAddr;

/// The one token of the simulation: a viewer of every project.
const TOKEN: &str = "sim-viewer-token";

/// A running apiserver and its client.
#[derive(Debug)]
pub(crate) struct Server {
    addr: SocketAddr,
    client: reqwest::Client,
    rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Server {
    /// Binds `127.0.0.1:0` and serves `ext`'s routes on a runtime of its own (the
    /// extension's own tasks, e.g. the endpoint table's feed pump, run there too).
    pub(crate) fn start(ext: &dyn ApiExtension) -> Result<Self, crate::error::SimError> {
        let io = |e: std::io::Error| crate::error::SimError::Serve(e.to_string());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .on_thread_start(batch_policy)
            .enable_all()
            .build()
            .map_err(io)?;
        let cx = ApiContext::for_test(vec![(
            TOKEN.to_owned(),
            Principal {
                credential: Default::default(),
                name: "sim".into(),
                kind: PrincipalKind::User,
                grants: vec![(Permission::JobView, vec!["*".into()])],
            },
        )]);
        let mut registry = prometheus_client::registry::Registry::default();
        ext.register_metrics(&mut registry);
        let router = {
            let _in_rt = rt.enter();
            ext.router(cx.clone()).layer(axum::Extension(cx))
        };
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
            .map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(async move {
            let serve = axum::serve(listener, router).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            if let Err(error) = serve.await {
                tracing::error!(%error, "sim apiserver stopped");
            }
        });
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| crate::error::SimError::Serve(e.to_string()))?;
        tracing::info!(%addr, "sim apiserver listening");
        Ok(Self {
            addr,
            client,
            rt,
            stop: Some(stop),
        })
    }

    /// Runs `f` to completion on the server's runtime.
    pub(crate) fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// `GET /v1/services/{name}/endpoints?project=…` over HTTP.
    pub(crate) fn read(&self, key: &ServiceKey) -> Result<EndpointsAnswer, String> {
        let url = format!(
            "http://{}/v1/services/{}/endpoints?project={}",
            self.addr, key.name, key.project
        );
        self.rt.block_on(async {
            let resp = self
                .client
                .get(&url)
                .bearer_auth(TOKEN)
                .send()
                .await
                .map_err(|e| format!("GET {url}: {e}"))?;
            let status = resp.status();
            let body = resp.bytes().await.map_err(|e| format!("GET {url}: {e}"))?;
            if !status.is_success() {
                return Err(format!(
                    "GET {url}: {status}: {}",
                    String::from_utf8_lossy(&body)
                ));
            }
            serde_json::from_slice(&body).map_err(|e| format!("GET {url}: {e}"))
        })
    }
}

/// Puts the calling thread (each thread of the apiserver side's runtime, as it starts)
/// under the `SCHED_BATCH` policy: same share of the CPU, but waking it never preempts a
/// running thread.
///
/// Why: in a cluster the apiserver side runs apart from the controller; here it shares 2
/// cores with the placing thread, and the batch a placement pass announces wakes its feed
/// pump at the pass's end. On a busy machine the woken pump preempted the placing thread
/// there, nearly once per announced batch (8,800–12,000 involuntary switches of the
/// placing thread while announcing in the load phase at load 7–9, also with the pump at
/// nice 19; 1,500–2,100 with it under `SCHED_BATCH`), and its time queued for a core again
/// counted in the pass (a third to a half of the passes' wall time). Under `SCHED_BATCH`
/// the pump runs when the placing thread waits for it (the checks wait for it to catch
/// up): the same work, the same entries checked. The price, on a busy machine only: a
/// check waits longer for the pump, which no longer preempts anything to run.
///
/// `chrt` (util-linux) sets it: the workspace forbids the `unsafe` of a direct
/// `sched_setscheduler` call, and no safe wrapper of it is in the dependencies. Without
/// `chrt` the pump keeps the normal policy (slower wall-clock figures on a busy machine,
/// nothing else).
fn batch_policy() {
    let tid = rustix::thread::gettid().as_raw_nonzero().to_string();
    let set = std::process::Command::new("chrt")
        .args(["--batch", "--pid", "0", &tid])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    match set {
        Ok(status) if status.success() => {}
        Ok(status) => tracing::warn!(%tid, %status, "apiserver thread: SCHED_BATCH not set"),
        Err(error) => {
            tracing::warn!(%tid, %error, "apiserver thread: no chrt, SCHED_BATCH not set")
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
