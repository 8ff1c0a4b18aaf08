//! The serving side: a certificate and key from PEM files, reloadable.

use crate::{provider, read_certs, TlsError};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// Where a server's certificate chain and private key are (`tls_cert`, `tls_key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM: the server's certificate first, then any intermediates.
    pub cert: PathBuf,
    /// PEM: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// A server's TLS: the acceptor for new connections, and the certificate it presents,
/// which [`ServerTls::reload`] replaces for the handshakes that follow (established
/// connections keep theirs).
#[derive(Clone)]
pub struct ServerTls {
    files: TlsFiles,
    current: Arc<Current>,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// Equal when loaded from the same files (for comparing configs).
impl PartialEq for ServerTls {
    fn eq(&self, other: &Self) -> bool {
        self.files == other.files
    }
}

impl Eq for ServerTls {}

impl ServerTls {
    /// Loads the files; `alpn` lists the protocols offered, most preferred first.
    pub fn load(files: TlsFiles, alpn: &[&[u8]]) -> Result<Self, TlsError> {
        let key = load_certified_key(&files)?;
        let current = Arc::new(Current(RwLock::new(Arc::new(key))));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(ServerTls {
            files,
            current,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// The files it was loaded from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The acceptor: wraps an accepted stream in TLS.
    pub fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }

    /// Re-reads the files. On success new handshakes present the new certificate; on an
    /// error nothing changes (the old certificate stays in use).
    pub fn reload(&self) -> Result<(), TlsError> {
        let key = load_certified_key(&self.files)?;
        *self.current.0.write().unwrap() = Arc::new(key);
        Ok(())
    }
}

/// The certificate in use, shared by the config (which reads it at every handshake) and
/// [`ServerTls::reload`].
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap().clone())
    }
}

fn load_certified_key(files: &TlsFiles) -> Result<CertifiedKey, TlsError> {
    let certs = read_certs("tls_cert", &files.cert)?;
    let key = read_key(&files.key)?;
    let signing = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| invalid_key(&files.key, format!("unusable private key: {e}")))?;
    let certified = CertifiedKey::new(certs, signing);
    certified.keys_match().map_err(|e| TlsError::Invalid {
        what: "tls_key",
        path: files.key.clone(),
        reason: format!(
            "does not match the certificate in {}: {e}",
            files.cert.display()
        ),
    })?;
    Ok(certified)
}

fn read_key(path: &Path) -> Result<rustls_pki_types::PrivateKeyDer<'static>, TlsError> {
    use rustls_pki_types::pem::PemObject as _;
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what: "tls_key",
        path: path.to_owned(),
        source,
    })?;
    rustls_pki_types::PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        invalid_key(
            path,
            format!("no private key (PKCS#8, PKCS#1 or SEC1 PEM block) in it: {e}"),
        )
    })
}

fn invalid_key(path: &Path, reason: String) -> TlsError {
    TlsError::Invalid {
        what: "tls_key",
        path: path.to_owned(),
        reason,
    }
}
