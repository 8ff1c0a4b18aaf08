//! The client side: what to trust, and what a failed handshake means.

use crate::{provider, read_certs, TlsError};
use rustls::{CertificateError, Error as RustlsError};
use std::path::Path;

/// A client config trusting the certificates in `ca_file` (PEM, one or more), or the
/// system's roots when there is none.
///
/// System roots come from `rustls-native-certs` (the OS store, as curl and Go use it, and
/// already in the build through reqwest's verifier), not `webpki-roots` (a compiled-in copy
/// of Mozilla's list that goes stale and ignores the operator's own CAs).
pub fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in read_certs("ca_file", path)? {
                roots.add(cert).map_err(|e| TlsError::Invalid {
                    what: "ca_file",
                    path: path.to_owned(),
                    reason: format!("not a usable CA certificate: {e}"),
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::debug!(error = %e, "system root certificates: skipped one source");
            }
            let (added, ignored) = roots.add_parsable_certificates(found.certs);
            tracing::debug!(added, ignored, "system root certificates loaded");
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A client config that trusts nothing, for a client that only ever speaks plain
/// `http://`: handing it to reqwest keeps reqwest from building its default TLS set-up, which
/// reads and parses every system root certificate (about 4 ms of a one-shot `xcecli` call
/// that never uses them). An `https://` request through it fails as "not trusted".
pub fn trust_nothing() -> Result<rustls::ClientConfig, TlsError> {
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth())
}

/// One sentence for a TLS failure somewhere in `err`'s source chain, or `None` when the
/// chain holds no TLS error. `ca_hint` names where the trusted CA is set (`--ca-file`,
/// `ca_file`), for the "not trusted" case.
pub fn explain(err: &(dyn std::error::Error + 'static), ca_hint: &str) -> Option<String> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(r) = rustls_error(e) {
            return Some(describe(r, ca_hint));
        }
        cur = e.source();
    }
    None
}

fn rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a RustlsError> {
    if let Some(r) = e.downcast_ref::<RustlsError>() {
        return Some(r);
    }
    // tokio-rustls hands rustls errors on inside an io::Error, which the connector may wrap
    // in another; an io::Error's `source()` skips the error it wraps, so look inside.
    let mut io = e.downcast_ref::<std::io::Error>();
    while let Some(inner) = io.and_then(|io| io.get_ref()) {
        if let Some(r) = inner.downcast_ref::<RustlsError>() {
            return Some(r);
        }
        io = inner.downcast_ref::<std::io::Error>();
    }
    None
}

fn describe(e: &RustlsError, ca_hint: &str) -> String {
    match e {
        RustlsError::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                format!("certificate not trusted (is {ca_hint} right?)")
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                format!("the server's certificate has expired ({e})")
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                format!("the server's certificate is not valid yet ({e})")
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!("the server's certificate is not valid for this address ({e})")
            }
            _ => format!("the server's certificate was refused: {e}"),
        },
        // A plain-HTTP server answers the ClientHello with an HTTP response.
        RustlsError::InvalidMessage(_) => {
            "the server does not speak TLS (use http:// for it?)".to_owned()
        }
        _ => format!("tls handshake failed: {e}"),
    }
}
