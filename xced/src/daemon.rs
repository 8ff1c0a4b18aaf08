//! What the daemon modes share with `xced dev`: the tokens file, the line that announces
//! the apiserver, and the stop signal. In a file of its own so that `dev.rs` needs nothing
//! from `main.rs` (no import circle between the two).

use anyhow::{Context, Result};
use std::net::SocketAddr;

/// Reads and validates a tokens file.
pub(crate) fn load_tokens(path: &std::path::Path) -> Result<local_cluster::auth::Tokens> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading tokens file {}", path.display()))?;
    local_cluster::auth::Tokens::parse(&text)
        .with_context(|| format!("invalid tokens file {}", path.display()))
}

/// The line tests and scripts read to find the apiserver (also when listening on port 0).
pub(crate) fn announce(addr: SocketAddr, tls: bool) {
    let scheme = if tls { "https" } else { "http" };
    println!("xced: apiserver listening on {scheme}://{addr}");
}

/// SIGTERM or SIGINT (ctrl-c): `xced dev` and the worker stop on either.
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
