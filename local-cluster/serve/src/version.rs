//! Which build answers: `X-Xce-Version` (and `X-Xce-Protocol`) on every answer of every
//! server here, and the `xce_build_info{version,commit} 1` metric. A client (or an
//! operator with `curl -i`) learns the version from any answer, errors included, so a
//! client can tell a route an older server does not have from a missing service.

use axum::http::HeaderValue;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use xce_wire::version::{build, protocol, PROTOCOL_HEADER, VERSION_HEADER};

/// Adds the version headers to every answer `app` gives (an outermost layer: answers of
/// other layers and of the fallback included) that does not carry them already (a
/// forwarded answer keeps its server's).
pub fn tag(app: axum::Router) -> axum::Router {
    let version = HeaderValue::from_str(&build().header())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
    let protocol = HeaderValue::from(protocol());
    app.layer(axum::middleware::map_response(move |mut r: Response| {
        let (version, protocol) = (version.clone(), protocol.clone());
        async move {
            // An answer that already names its build keeps it: a request an apiserver
            // forwarded was answered by the leader, and a client judging what the
            // server can do (xcecli's skew check) must see the leader's version.
            r.headers_mut().entry(VERSION_HEADER).or_insert(version);
            r.headers_mut().entry(PROTOCOL_HEADER).or_insert(protocol);
            r
        }
    }))
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    commit: String,
}

/// Registers `xce_build_info{version,commit} 1` (Prometheus' `*_build_info` convention:
/// join on it to see which build each daemon runs).
pub fn register_build_info(registry: &mut Registry) {
    let info = Family::<BuildLabels, Gauge>::default();
    let b = build();
    info.get_or_create(&BuildLabels {
        version: b.version.to_owned(),
        commit: b.commit.to_owned(),
    })
    .set(1);
    registry.register(
        "xce_build_info",
        "The build this daemon runs (always 1; the labels say which)",
        info,
    );
}

/// The lines `/healthz` ends with: `version: …` and `commit: …`.
pub fn health_lines() -> String {
    let b = build();
    format!("version: {}\ncommit: {}\n", b.version, b.commit)
}
