//! `xced store backup --to FILE` and `xced store restore FILE`: a consistent copy of the
//! controller's store taken while it runs, and that copy put back into a stopped one.
//!
//! redb: a running controller holds its file exclusively, so the backup is taken through
//! it (`GET /v1/store/backup`, one read transaction; an admin token); a stopped one's
//! file is read directly. etcd: one range read at one revision. A restore refuses a store
//! a controller runs on, checks the backup whole, and marks it restored: the controller
//! that loads it makes every worker register again before it trusts a restored job.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use xce_store::backup::{self, Header};
use xce_store::{Election, EtcdStore, Key, RedbStore, Store, StoreSpec, DEFAULT_PREFIX};

/// `xced store …`.
#[derive(Debug, Subcommand)]
pub(crate) enum StoreCmd {
    /// Write every record of the controller's store, as of one moment, to FILE; works
    /// while the controller runs (redb: through it, with an admin token; etcd: one
    /// consistent read).
    Backup {
        /// Where to write the backup (replaced whole, mode 0600).
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
        #[command(flatten)]
        at: Where,
    },
    /// Replace the store's records with a backup's. Every controller must be stopped;
    /// the workers keep running and are reconciled when the controller starts.
    Restore {
        /// A file written by `xced store backup`.
        file: PathBuf,
        #[command(flatten)]
        at: Where,
    },
}

/// Which store, as the controller finds it.
#[derive(Debug, Args)]
pub(crate) struct Where {
    /// The controller's config file: its `data_dir`, `store`, `listen` and TLS say where
    /// the store is and how to reach the controller.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// `redb` or `etcd://HOST:PORT[,HOST:PORT...]`; overrides `store` in the config.
    #[arg(long, value_name = "STORE")]
    store: Option<StoreSpec>,
    /// The controller's data dir (redb); overrides `data_dir` in the config.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The running controller (or an apiserver) to take a redb backup through; default:
    /// the config's `listen`.
    #[arg(long, value_name = "URL", env = "XCE_API")]
    api: Option<String>,
    /// An admin token, for `--api`.
    #[arg(long, env = "XCE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The CA that signed the controller's certificate, for an `https://` `--api`.
    #[arg(long, value_name = "FILE", env = "XCE_CA_FILE")]
    ca_file: Option<PathBuf>,
}

/// Where the store is, resolved.
enum Target {
    Redb { dir: PathBuf, api: Option<String> },
    Etcd(Vec<String>),
}

impl Where {
    fn target(&self) -> Result<Target> {
        let cfg = match &self.config {
            Some(p) => Some(crate::config::load_controller(p)?),
            None => None,
        };
        let spec = self
            .store
            .clone()
            .or_else(|| cfg.as_ref().and_then(|c| c.store.clone()));
        if let Some(StoreSpec::Etcd(endpoints)) = spec {
            return Ok(Target::Etcd(endpoints));
        }
        let dir = match (&self.data_dir, &cfg) {
            (Some(d), _) => d.clone(),
            (None, Some(c)) => c.data_dir.clone(),
            (None, None) => bail!("which store? pass --config (the controller's config file), or --data-dir DIR, or --store etcd://HOST:PORT"),
        };
        let api = self.api.clone().or_else(|| {
            cfg.as_ref().map(|c| {
                let scheme = if c.tls_cert.is_some() {
                    "https"
                } else {
                    "http"
                };
                let mut addr = c.listen;
                if addr.ip().is_unspecified() {
                    addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                format!("{scheme}://{addr}")
            })
        });
        Ok(Target::Redb { dir, api })
    }
}

pub(crate) async fn run(cmd: StoreCmd) -> Result<()> {
    match cmd {
        StoreCmd::Backup { to, at } => backup_to(&to, &at).await,
        StoreCmd::Restore { file, at } => restore_from(&file, &at).await,
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn redb_path(dir: &Path) -> PathBuf {
    dir.join("controller.redb")
}

/// Opens a stopped controller's redb file; `Ok(None)` when a running one holds it.
fn open_stopped(dir: &Path) -> Result<Option<RedbStore>> {
    let path = redb_path(dir);
    if !path.exists() {
        bail!(
            "{} does not exist: is {} the controller's data_dir?",
            path.display(),
            dir.display()
        );
    }
    match RedbStore::open(&path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.to_string().contains("already open") => Ok(None),
        Err(e) => Err(e).with_context(|| format!("opening {}", path.display())),
    }
}

async fn backup_to(to: &Path, at: &Where) -> Result<()> {
    let (file, how) = match at.target()? {
        Target::Etcd(endpoints) => {
            let store = EtcdStore::new(endpoints.clone())?;
            let records = tokio::task::spawn_blocking(move || store.load_all()).await??;
            let how = format!("etcd {} (one revision)", endpoints.join(","));
            (backup::encode(&records, "etcd", now_secs())?, how)
        }
        Target::Redb { dir, api } => match open_stopped(&dir)? {
            Some(store) => {
                let records = store.load_all()?;
                let how = format!("{} (no controller running)", redb_path(&dir).display());
                (backup::encode(&records, "redb", now_secs())?, how)
            }
            None => {
                let Some(api) = api else {
                    bail!("a running controller holds {}: take the backup through it with --api URL (or --config) and --token (an admin token)", redb_path(&dir).display());
                };
                (
                    fetch(&api, at).await?,
                    format!("the running controller at {api}"),
                )
            }
        },
    };
    // Checked before it is kept: what is written reads back whole.
    let (header, _) = backup::decode(&file).context("the backup read back")?;
    xce_stdx::atomic_file::write_atomic_private(to, &file)
        .with_context(|| format!("writing {}", to.display()))?;
    println!(
        "backup of {} records written to {} ({} bytes), from {how}",
        header.records,
        to.display(),
        file.len()
    );
    Ok(())
}

/// The backup a running controller takes of its own store.
async fn fetch(api: &str, at: &Where) -> Result<Vec<u8>> {
    let Some(token) = &at.token else {
        bail!("a backup through the controller needs an admin token: --token T (or XCE_TOKEN)");
    };
    let mut client = reqwest::Client::builder();
    if api.starts_with("https://") {
        client = client
            .tls_backend_preconfigured(control_tls::client::client_config(at.ca_file.as_deref())?);
    }
    let url = format!("{}/v1/store/backup", api.trim_end_matches('/'));
    let resp = client
        .build()?
        .get(&url)
        .bearer_auth(token)
        .send()
        .await
        .with_context(|| format!("asking {url}"))?;
    let status = resp.status();
    let body = resp
        .bytes()
        .await
        .with_context(|| format!("reading {url}"))?;
    if !status.is_success() {
        bail!(
            "{url} answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        );
    }
    Ok(body.to_vec())
}

async fn restore_from(file: &Path, at: &Where) -> Result<()> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let (header, records) = backup::decode(&bytes)
        .with_context(|| format!("{} is not a usable backup", file.display()))?;
    let records = xce_model::restored_records(records)
        .with_context(|| format!("{} holds a record this version cannot load", file.display()))?;
    let into = match at.target()? {
        Target::Redb { dir, .. } => restore_redb(&dir, records)?,
        Target::Etcd(endpoints) => {
            tokio::task::spawn_blocking(move || restore_etcd(endpoints, records)).await??
        }
    };
    println!(
        "restored {} records (a {} backup taken at unix time {}) into {into}. Start the controller: every worker registers again; replicas the backup does not know are drained and stopped, jobs no worker runs are replaced.",
        header.records, header.source, header.taken_at
    );
    print_header_note(&header);
    Ok(())
}

fn print_header_note(header: &Header) {
    if header.source == "etcd" || header.source == "redb" {
        return;
    }
    println!("note: the backup says it comes from {:?}", header.source);
}

fn restore_redb(dir: &Path, records: Vec<(Key, Vec<u8>)>) -> Result<String> {
    let path = redb_path(dir);
    let Some(store) = open_stopped(dir)? else {
        bail!(
            "a controller is running on {} (it holds {}): stop it first, then restore",
            dir.display(),
            path.display()
        );
    };
    // What it held is kept next to it, in case the wrong backup was restored.
    let before = dir.join(format!("controller.before-restore-{}.backup", now_secs()));
    let old = backup::encode(&store.load_all()?, "redb", now_secs())?;
    xce_stdx::atomic_file::write_atomic_private(&before, &old)
        .with_context(|| format!("saving the current records to {}", before.display()))?;
    backup::replace_all(&store, records, true)?;
    Ok(format!(
        "{} (its previous records are in {})",
        path.display(),
        before.display()
    ))
}

fn restore_etcd(endpoints: Vec<String>, records: Vec<(Key, Vec<u8>)>) -> Result<String> {
    let election = Election::new(
        endpoints.clone(),
        DEFAULT_PREFIX,
        "xced-store-restore",
        xce_store::DEFAULT_LEADER_TTL,
    )?;
    if let Some(leader) = election.leader()? {
        bail!("controller {leader:?} leads on this etcd: stop every controller (standbys too), then restore");
    }
    let store = EtcdStore::new(endpoints.clone())?;
    backup::replace_all(&store, records, false)?;
    Ok(format!(
        "etcd {} (prefix {DEFAULT_PREFIX})",
        endpoints.join(",")
    ))
}
