//! Serving TLS in the daemons: the certificate loaded at start (a bad file stops the start
//! with the file and the reason), and re-read on every SIGHUP.

use anyhow::{Context as _, Result};
use xce_serve::{ServerTls, TlsFiles};

/// Loads the serving certificate, when TLS is configured, and re-reads it on SIGHUP for as
/// long as the process runs.
pub(crate) fn serve_tls(files: Option<TlsFiles>) -> Result<Option<ServerTls>> {
    let Some(files) = files else {
        return Ok(None);
    };
    let tls = xce_serve::load_tls(files.clone()).with_context(|| {
        format!(
            "cannot serve TLS with tls_cert {} and tls_key {}",
            files.cert.display(),
            files.key.display()
        )
    })?;
    reload_on_sighup(tls.clone())?;
    tracing::info!(cert = %files.cert.display(), key = %files.key.display(), "serving TLS (certificate re-read on SIGHUP)");
    Ok(Some(tls))
}

/// A task of its own listening for SIGHUP (other parts of the daemon may listen too: every
/// listener of a signal is woken): new handshakes use the new certificate; files that do
/// not load leave the old one in use, and say why.
fn reload_on_sighup(tls: ServerTls) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("installing a SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let files = tls.files();
            match tls.reload() {
                Ok(()) => tracing::info!(
                    cert = %files.cert.display(),
                    "SIGHUP: TLS certificate re-read; new connections use it"
                ),
                Err(e) => tracing::warn!(
                    error = %e,
                    "SIGHUP: TLS certificate not re-read, the old one stays in use"
                ),
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn tls_cert_and_tls_key_go_together() {
        let file = Path::new("controller.toml");
        let some = |p: &str| Some(std::path::PathBuf::from(p));
        let err = crate::config::tls_files(file, "controller", &some("c.pem"), &None)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "invalid controller config controller.toml: tls_cert is set but tls_key is not (set both, or neither for plain HTTP)");
        let err = crate::config::tls_files(file, "apiserver", &None, &some("k.pem"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("tls_key is set but tls_cert is not"), "{err}");
        assert!(crate::config::tls_files(file, "x", &None, &None)
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_certificate_that_does_not_load_stops_the_start_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("server.pem");
        std::fs::write(&cert, "not pem\n").unwrap();
        let files = TlsFiles {
            cert: cert.clone(),
            key: dir.path().join("missing.key"),
        };
        let err = format!("{:#}", serve_tls(Some(files)).unwrap_err());
        assert!(err.starts_with("cannot serve TLS with tls_cert "), "{err}");
        assert!(
            err.ends_with(&format!(
                "tls_cert {}: no CERTIFICATE block in it",
                cert.display()
            )),
            "{err}"
        );
    }
}
