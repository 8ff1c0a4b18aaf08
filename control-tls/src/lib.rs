//! TLS for xce's control plane: the one crate that knows rustls.
//!
//! - [`server`]: a serving certificate read from PEM files, re-read on demand (a SIGHUP in
//!   the hosts) without disturbing open connections; a file that fails to load keeps the
//!   old certificate.
//! - [`client`]: what a client trusts (a CA file, or the system's roots) and
//!   [`client::explain`], which turns a failed handshake into one sentence a user can act
//!   on ("certificate not trusted (is --ca-file right?)").
//! - [`dev`]: a throwaway CA and a server certificate for `xced dev --tls` and tests.
//!
//! The crypto provider is `aws-lc-rs`, chosen explicitly for every config made here. Not
//! `ring`, though it builds faster: reqwest 0.13 ships `aws-lc-rs` as its only built-in
//! provider, and with `ring` instead every `reqwest::Client` in the workspace (the etcd
//! gateway, readiness probes, every test's client) panics at build time unless the process
//! installed a default provider first: a trap for every binary and test binary. `aws-lc-sys`
//! needs no cmake for non-FIPS builds (a C compiler only), so the reason to avoid it is gone.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod client;
pub mod dev;
pub mod server;

use std::path::PathBuf;
use std::sync::Arc;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        /// What the file was for (`tls_cert`, `tls_key`, `ca_file`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file was read but holds nothing usable.
    #[error("{what} {}: {reason}", path.display())]
    Invalid {
        /// What the file was for (`tls_cert`, `tls_key`, `ca_file`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// rustls refused the settings.
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    /// Certificates could not be generated (`dev`).
    #[error("cannot generate certificates: {0}")]
    Generate(String),
    /// Generated certificates could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The crypto provider every config here uses (see the crate docs for why `aws-lc-rs`).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Reads every `CERTIFICATE` block of a PEM file; none is an error.
fn read_certs(
    what: &'static str,
    path: &std::path::Path,
) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, TlsError> {
    use rustls_pki_types::pem::PemObject as _;
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Invalid {
            what,
            path: path.to_owned(),
            reason: format!("not a PEM file: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Invalid {
            what,
            path: path.to_owned(),
            reason: "no CERTIFICATE block in it".to_owned(),
        });
    }
    Ok(certs)
}

#[cfg(test)]
mod tests;
