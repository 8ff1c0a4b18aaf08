//! How the benches' `--serve` processes serve the routes: as the apiserver does (shared by
//! the `fanout` and `allstream` benches through `#[path]`).

use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Serves `app` on `listener` as the apiserver does: HTTP/1.1 with its buffer limit
/// (`xce_serve::http1`), or HTTP/2 with prior knowledge when a connection starts with its
/// preface, with the apiserver's HTTP/2 settings, its streams run in the connection's task
/// and write batching (`xce_serve::http2`), so the per-watcher figures are the product's.
/// (The apiserver's connection limits and clocks are left out: the benches stay far below
/// them.)
pub(crate) async fn http_serve(listener: tokio::net::TcpListener, app: axum::Router) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        tokio::spawn(async move {
            let streams = xce_serve::http2::ConnStreams::new();
            let mut builder = auto::Builder::new(streams.executor());
            xce_serve::http1::configure(&mut builder.http1());
            xce_serve::http2::configure(&mut builder.http2());
            let svc = hyper::service::service_fn(move |req: axum::http::Request<Incoming>| {
                use tower::Service as _;
                app.clone().call(req.map(axum::body::Body::new))
            });
            let io = TokioIo::new(xce_serve::http2::BatchedWrites::new(tcp));
            let _ = streams.serve(builder.serve_connection(io, svc)).await;
        });
    }
}

/// Logs as `xced` does by default: `info` and above, to stderr. Without a subscriber,
/// `tracing` would hand every span that hyper and h2 open (several per HTTP/2 frame) to the
/// `log` crate (axum turns on `tracing/log`): 2-3 % of the `--serve` process's CPU in a
/// profile of the fan-out, a cost the product does not have.
pub(crate) fn log_as_xced() {
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(std::io::stderr)
                .with_filter(EnvFilter::new("info")),
        )
        .init();
}
