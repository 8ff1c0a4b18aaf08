//! A throwaway CA and a server certificate signed by it, written as PEM files: what
//! `xced dev --tls` serves with, and what tests make (also expired ones).

use crate::TlsError;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::net::IpAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// What the server certificate is for, and when it is valid.
#[derive(Debug, Clone)]
pub struct DevCertSpec {
    /// IP addresses it is valid for.
    pub ips: Vec<IpAddr>,
    /// DNS names it is valid for.
    pub dns: Vec<String>,
    /// Valid from January 1st of the first year to January 1st of the last (CA and server
    /// certificate alike); a range in the past makes expired certificates for tests.
    pub valid_years: Range<i32>,
}

/// The files [`generate`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevCerts {
    /// The CA's certificate: what clients trust (`ca_file`).
    pub ca: PathBuf,
    /// The server's certificate (`tls_cert`).
    pub cert: PathBuf,
    /// The server's private key (`tls_key`), mode 0600.
    pub key: PathBuf,
}

/// Generates a new CA and a server certificate per `spec` into `dir` as `ca.pem`,
/// `server.pem` and `server.key`, replacing what was there. The CA's key is not kept:
/// nothing else can be signed with it.
pub fn generate(dir: &Path, spec: &DevCertSpec) -> Result<DevCerts, TlsError> {
    let r#gen = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let start = rcgen::date_time_ymd(spec.valid_years.start, 1, 1);
    let end = rcgen::date_time_ymd(spec.valid_years.end, 1, 1);

    let ca_key = KeyPair::generate().map_err(r#gen)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(r#gen)?;
    ca.distinguished_name.push(DnType::CommonName, "xce dev CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = start;
    ca.not_after = end;
    let ca_cert = ca.self_signed(&ca_key).map_err(r#gen)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(r#gen)?;
    let mut server = CertificateParams::new(Vec::<String>::new()).map_err(r#gen)?;
    server
        .distinguished_name
        .push(DnType::CommonName, "xce dev server");
    server.subject_alt_names = spec.ips.iter().map(|ip| SanType::IpAddress(*ip)).collect();
    for name in &spec.dns {
        let name = name.clone().try_into().map_err(r#gen)?;
        server.subject_alt_names.push(SanType::DnsName(name));
    }
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server.not_before = start;
    server.not_after = end;
    let server_cert = server.signed_by(&key, &issuer).map_err(r#gen)?;

    let out = DevCerts {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    };
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.to_owned(),
        source,
    })?;
    write(&out.ca, &ca_cert.pem(), 0o644)?;
    write(&out.cert, &server_cert.pem(), 0o644)?;
    write(&out.key, &key.serialize_pem(), 0o600)?;
    Ok(out)
}

/// Writes through a temporary file and a rename, so a server re-reading the files (a
/// SIGHUP) never sees half of one.
fn write(path: &Path, text: &str, mode: u32) -> Result<(), TlsError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let err = |source| TlsError::Write {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
