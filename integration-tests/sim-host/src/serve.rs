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

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
