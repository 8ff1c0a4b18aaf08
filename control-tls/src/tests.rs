//! Real handshakes over an in-memory pipe: what a client sees for each certificate.

use crate::client::{client_config, explain};
use crate::dev::{generate, DevCertSpec, DevCerts};
use crate::server::{ServerTls, TlsFiles};
use rustls_pki_types::ServerName;
use std::path::Path;
use std::sync::Arc;

fn spec(valid_years: std::ops::Range<i32>) -> DevCertSpec {
    DevCertSpec {
        ips: vec!["127.0.0.1".parse().unwrap()],
        dns: vec!["localhost".to_owned()],
        valid_years,
    }
}

fn files(c: &DevCerts) -> TlsFiles {
    TlsFiles {
        cert: c.cert.clone(),
        key: c.key.clone(),
    }
}

/// Handshakes `server` with a client trusting `ca`; the client's error, explained, or the
/// DER of the certificate the server presented.
async fn handshake(server: &ServerTls, ca: &Path, name: &str) -> Result<Vec<u8>, String> {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let acceptor = server.acceptor().clone();
    let srv = tokio::spawn(async move { acceptor.accept(b).await.map(|_| ()) });
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(Some(ca)).unwrap()));
    let name = ServerName::try_from(name.to_owned()).unwrap();
    let out = match connector.connect(name, a).await {
        Ok(s) => Ok(s.get_ref().1.peer_certificates().unwrap()[0].to_vec()),
        Err(e) => Err(explain(&e, "--ca-file").unwrap_or_else(|| format!("unexplained: {e}"))),
    };
    let _ = srv.await;
    out
}

#[tokio::test]
async fn a_client_trusting_the_ca_connects_by_ip_and_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let certs = generate(dir.path(), &spec(2020..2100)).unwrap();
    let server = ServerTls::load(files(&certs), &[b"http/1.1"]).unwrap();
    assert!(handshake(&server, &certs.ca, "127.0.0.1").await.is_ok());
    assert!(handshake(&server, &certs.ca, "localhost").await.is_ok());
    let err = handshake(&server, &certs.ca, "example.com")
        .await
        .unwrap_err();
    assert!(err.contains("not valid for this address"), "{err}");
}

#[tokio::test]
async fn a_wrong_ca_and_an_expired_certificate_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    let good = generate(&dir.path().join("good"), &spec(2020..2100)).unwrap();
    let other = generate(&dir.path().join("other"), &spec(2020..2100)).unwrap();
    let old = generate(&dir.path().join("old"), &spec(2000..2001)).unwrap();
    let server = ServerTls::load(files(&good), &[]).unwrap();
    let err = handshake(&server, &other.ca, "127.0.0.1")
        .await
        .unwrap_err();
    assert_eq!(err, "certificate not trusted (is --ca-file right?)");
    let expired = ServerTls::load(files(&old), &[]).unwrap();
    let err = handshake(&expired, &old.ca, "127.0.0.1").await.unwrap_err();
    assert!(
        err.starts_with("the server's certificate has expired"),
        "{err}"
    );
}

#[tokio::test]
async fn reload_swaps_the_certificate_and_a_broken_file_keeps_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let first = generate(dir.path(), &spec(2020..2100)).unwrap();
    let first_ca = std::fs::read(&first.ca).unwrap();
    let server = ServerTls::load(files(&first), &[]).unwrap();
    let before = handshake(&server, &first.ca, "127.0.0.1").await.unwrap();

    // New files in the same place (a renewal): new handshakes see the new certificate.
    let second = generate(dir.path(), &spec(2020..2100)).unwrap();
    assert_ne!(std::fs::read(&second.ca).unwrap(), first_ca);
    server.reload().unwrap();
    let after = handshake(&server, &second.ca, "127.0.0.1").await.unwrap();
    assert_ne!(before, after);

    // A half-written key: refused with the file's name, and the last good one stays.
    std::fs::write(&second.key, "-----BEGIN PRIVATE KEY-----\nnope\n").unwrap();
    let err = server.reload().unwrap_err().to_string();
    assert!(
        err.starts_with("tls_key ") && err.contains("server.key"),
        "{err}"
    );
    assert_eq!(
        handshake(&server, &second.ca, "127.0.0.1").await.unwrap(),
        after
    );

    // A key that is not the certificate's.
    let third = generate(&dir.path().join("x"), &spec(2020..2100)).unwrap();
    std::fs::copy(&third.key, &second.key).unwrap();
    let err = server.reload().unwrap_err().to_string();
    assert!(err.contains("does not match the certificate"), "{err}");
}

#[test]
fn a_ca_file_without_certificates_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ca.pem");
    std::fs::write(&p, "hello\n").unwrap();
    let err = client_config(Some(&p)).unwrap_err().to_string();
    assert!(
        err.starts_with("ca_file ") && err.ends_with("no CERTIFICATE block in it"),
        "{err}"
    );
    let err = client_config(Some(&dir.path().join("missing.pem")))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("cannot read ca_file "), "{err}");
}
