//! What the daemon modes share with `xced dev`: the tokens file (and its reload on
//! SIGHUP), the line that announces the apiserver, and the stop signal. In a file of its own so that `dev.rs` needs nothing
//! from `main.rs` (no import circle between the two).

use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use xce_serve::auth::Tokens;
use xce_serve::keyring::Keyring;

/// Reads and validates a tokens file.
pub(crate) fn load_tokens(path: &std::path::Path) -> Result<Tokens> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading tokens file {}", path.display()))?;
    Tokens::parse(&text).with_context(|| format!("invalid tokens file {}", path.display()))
}

/// Re-reads the tokens on every SIGHUP, for as long as the process runs: `load` reads
/// (and, for `xced dev`, completes) the file at `path`. A file that does not load is
/// refused whole, every problem logged, and the tokens in force stay. Installed before the
/// process serves, so a SIGHUP never finds the default action (exit) in place.
pub(crate) fn reload_tokens_on_sighup(
    keyring: Keyring,
    path: PathBuf,
    load: impl Fn() -> Result<Tokens> + Send + 'static,
) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("installing a SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let file = path.display();
            match load() {
                Ok(tokens) => {
                    let (users, workers) = (tokens.users().len(), tokens.workers().len());
                    let done = keyring.replace(tokens);
                    tracing::info!(
                        %file,
                        tokens = users,
                        workers,
                        kept = done.kept,
                        regranted = done.regranted,
                        added = done.added,
                        removed = done.removed,
                        "tokens file reloaded (SIGHUP)"
                    );
                }
                Err(e) => {
                    keyring.refused();
                    tracing::error!(
                        %file,
                        error = %format!("{e:#}"),
                        "tokens file refused on reload (SIGHUP): the tokens in force stay"
                    );
                }
            }
        }
    });
    Ok(())
}

/// For a daemon with nothing to reload: a SIGHUP (a terminal closing, an operator's
/// habit) is logged and ignored instead of ending the process, which would leave its
/// replicas to init. Installed before anything runs.
pub(crate) fn ignore_sighup(what: &'static str) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("installing a SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!(daemon = what, "SIGHUP: nothing to reload here; ignored");
        }
    });
    Ok(())
}

/// The program a worker starts beside each replica to write its rotating log: this
/// binary, as `xced replica-log`.
pub(crate) fn log_writer() -> Result<PathBuf> {
    std::env::current_exe().context("finding the xced binary (it writes the replicas' logs)")
}

/// Opens the embedded store `<data_dir>/controller.redb`, its owner's alone (0600, also
/// when an older version made it readable to all).
pub(crate) fn open_redb(data_dir: &std::path::Path) -> Result<xce_store::RedbStore> {
    let path = data_dir.join("controller.redb");
    let store = xce_store::RedbStore::open(&path)
        .with_context(|| format!("opening the store in {}", data_dir.display()))?;
    xce_stdx::atomic_file::make_private(&path)
        .with_context(|| format!("making {} private", path.display()))?;
    Ok(store)
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
