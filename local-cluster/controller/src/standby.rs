//! A standby controller's listener (etcd store, while another controller leads): it
//! serves `/healthz` (200, `standby`, naming the leader it follows) and `/metrics`
//! (`xce_controller_standby 1`) on the controller's own `listen` address so the standby
//! can be monitored, and answers everything else 503 `standby`: it has no state to answer
//! from. Elected, the controller stops this listener and binds the same address for the
//! whole API. A leader that loses its leadership (it could not renew its lease within
//! the renew deadline, or its key was replaced) drops its state and comes back here.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use plugin_api::{ApiContext, ApiError, Authenticator, Principal};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use xce_serve::auth::MetricsConfig;
use xce_serve::{metrics_response, ConnLimits};

/// The controller's role in the election, for `/metrics`: one per process, shared by the
/// standby's registry and every term's leader registry (clones share their values), so
/// the counters go on across terms and the gauge follows the role.
#[derive(Debug, Clone, Default)]
pub struct Role {
    standby: Gauge,
    elected: Counter,
    lost: Counter,
}

impl Role {
    /// Registers `xce_controller_standby` (1 while a standby, 0 while serving),
    /// `xce_leader_transitions_total` (times this process was elected) and
    /// `xce_leadership_lost_total` (times it stopped leading without resigning).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "xce_controller_standby",
            "Whether this controller waits as a standby (1) or serves (0)",
            self.standby.clone(),
        );
        registry.register(
            "xce_leader_transitions",
            "Times this controller process was elected leader (etcd store)",
            self.elected.clone(),
        );
        registry.register(
            "xce_leadership_lost",
            "Times this controller process lost the leadership without resigning (renew \
             deadline passed, lease or key gone) and went back to standby (etcd store)",
            self.lost.clone(),
        );
    }

    /// Now a standby.
    pub fn standby(&self) {
        self.standby.set(1);
    }

    /// Elected: serving from now on.
    pub fn elected(&self) {
        self.standby.set(0);
        self.elected.inc();
    }

    /// The leadership was lost (not resigned).
    pub fn lost(&self) {
        self.lost.inc();
    }

    /// Serving without an election (the embedded store): the gauge says 0, the counters
    /// stay 0.
    pub(crate) fn serving(&self) {
        self.standby.set(0);
    }
}

/// A standby's listener; [`stop`](Self::stop) it before binding the address again.
#[derive(Debug)]
pub struct StandbyServer {
    /// The bound address.
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    server: JoinHandle<std::io::Result<()>>,
}

/// Binds `listen` and serves a standby's routes on it; `leader` names the controller it
/// follows (`None`: not known yet). Sets `role` to standby.
pub fn serve(
    listen: SocketAddr,
    limits: ConnLimits,
    tls: Option<xce_serve::ServerTls>,
    leader: watch::Receiver<Option<String>>,
    role: &Role,
    metrics: Metrics,
) -> anyhow::Result<StandbyServer> {
    let mut registry = Registry::default();
    role.standby();
    role.register(&mut registry);
    xce_serve::register_metrics(&mut registry);
    xce_serve::version::register_build_info(&mut registry);
    let (stop, stopped) = watch::channel(false);
    let (addr, server) = xce_serve::serve(
        listen,
        router(leader, Arc::new(registry), metrics),
        limits,
        tls,
        stopped,
    )?;
    Ok(StandbyServer { addr, stop, server })
}

impl StandbyServer {
    /// Closes the listener and waits for its connections (every answer here is
    /// immediate; the drain deadline bounds the wait anyway).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.server.await;
    }
}

/// Who may read a standby's `/metrics`: as on the leader, `metrics.view` (or `admin`)
/// under the tokens in force, unless `[metrics] public = true`.
#[derive(Clone)]
pub struct Metrics {
    /// The tokens in force.
    pub auth: Arc<dyn Authenticator>,
    /// `[metrics]`.
    pub config: MetricsConfig,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn router(
    leader: watch::Receiver<Option<String>>,
    registry: Arc<Registry>,
    access: Metrics,
) -> axum::Router {
    let ctx = ApiContext { auth: access.auth };
    let config = access.config;
    let metrics = move |who: Result<Principal, ApiError>| async move {
        match config.admit(who) {
            Ok(()) => metrics_response(&registry),
            Err(e) => e.into_response(),
        }
    };
    let healthz = {
        let leader = leader.clone();
        move || async move {
            let first = match leader.borrow().as_deref() {
                Some(id) => format!("standby: following the leader {id}\n"),
                None => "standby: no leader known yet\n".to_owned(),
            };
            first + &xce_serve::version::health_lines()
        }
    };
    axum::Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(move || async move { not_served(leader.borrow().as_deref()) })
        .layer(axum::Extension(ctx))
}

/// 503 `standby`, naming the leader, with `Retry-After: 1` (a takeover is quick).
fn not_served(leader: Option<&str>) -> Response {
    let whom = match leader {
        Some(id) => format!("the leader is {id}"),
        None => "no leader is known yet".to_owned(),
    };
    let mut resp = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "standby",
        format!(
            "this controller is a standby and serves only /healthz and /metrics ({whom}): \
             send requests to the leader or to an apiserver"
        ),
    )
    .into_response();
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    // Clients with a list of controllers (xcecli --api A,B) move on when they see it,
    // without reading the body.
    resp.headers_mut()
        .insert("x-xce-standby", HeaderValue::from_static("1"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt as _;

    async fn get(app: &axum::Router, path: &str) -> (u16, String) {
        let resp = app
            .clone()
            .oneshot(
                axum::http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn a_standby_serves_health_and_metrics_only() {
        let (tx, rx) = watch::channel(None);
        let mut registry = Registry::default();
        let role = Role::default();
        role.standby();
        role.register(&mut registry);
        let registry = Arc::new(registry);
        let open = Metrics {
            auth: ApiContext::for_test(Vec::new()).auth,
            config: MetricsConfig { public: true },
        };
        let app = router(rx, registry.clone(), open.clone());
        let mut out = String::new();
        for path in [
            "/healthz",
            "/metrics",
            "/v1/services",
            "/internal/v1/register",
        ] {
            let (status, body) = get(&app, path).await;
            let first = body.lines().find(|l| !l.starts_with('#')).unwrap_or("");
            out.push_str(&format!("{path}: {status} {first}\n"));
        }
        tx.send_replace(Some("h/1@127.0.0.1:7480".into()));
        let (status, body) = get(&app, "/healthz").await;
        out.push_str(&format!("/healthz: {status} {body}"));
        expect_test::expect![[r#"
            /healthz: 200 standby: no leader known yet
            /metrics: 200 xce_controller_standby 1
            /v1/services: 503 {"error":{"code":"standby","details":[],"message":"this controller is a standby and serves only /healthz and /metrics (no leader is known yet): send requests to the leader or to an apiserver"}}
            /internal/v1/register: 503 {"error":{"code":"standby","details":[],"message":"this controller is a standby and serves only /healthz and /metrics (no leader is known yet): send requests to the leader or to an apiserver"}}
            /healthz: 200 standby: following the leader h/1@127.0.0.1:7480
            version: 0.1.0
            commit: unknown
        "#]]
        .assert_eq(&out);
        // Not public: a standby's metrics need a token like the leader's.
        let closed = Metrics {
            config: MetricsConfig { public: false },
            ..open
        };
        let (_, rx) = watch::channel(None);
        let (status, _) = get(&router(rx, registry, closed), "/metrics").await;
        assert_eq!(status, 401);
    }
}
