//! Who this worker is and which cluster it serves, kept in its data dir (which the
//! worker holds locked, so no other worker process shares them):
//! - `instance`: a random id created at the first start. A restarted worker on the same
//!   data dir is the same instance and keeps its host at once; a second worker with the
//!   same host id (another data dir) is another instance, refused while this one lives.
//! - `cluster`: the cluster id of the controller it first registered with. It refuses
//!   to register with, or take orders from, a controller of another cluster. Absent
//!   (first start, or a data dir from before cluster ids): it joins the first cluster it
//!   registers with.
//! - `session`: the session secret the controller handed this instance at its last
//!   registration (mode 0600; the controller keeps only its hash). Every call proves it;
//!   a restarted worker presents it when it registers again and keeps its host at once.
//!   Without it (deleted, or a data dir from before sessions) the worker registers as
//!   new: while the controller still hears the host's session from elsewhere it is
//!   refused, and once the host has gone unheard for `unreachable_after` it gets a new
//!   session.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

/// Why the identity files are unusable.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IdentityError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {reason} (delete the file to start over)")]
    Invalid { path: String, reason: &'static str },
}

/// The worker's instance id and the cluster it joined.
pub(crate) struct Identity {
    instance: String,
    cluster_path: PathBuf,
    cluster: RwLock<Option<String>>,
    /// Where the session is kept (`None`: nowhere, a test's identity).
    session_path: Option<PathBuf>,
    session: RwLock<Option<String>>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("instance", &self.instance)
            .field("cluster", &self.cluster())
            .field("session", &self.session().map(|_| "<redacted>"))
            .finish()
    }
}

impl Identity {
    /// Reads the identity from `data_dir` (which the caller has locked), creating the
    /// instance id at the first start.
    pub(crate) fn load(data_dir: &Path) -> Result<Self, IdentityError> {
        let instance_path = data_dir.join("instance");
        let instance = match read_id(&instance_path)? {
            Some(id) => id,
            None => {
                let id = xce_proto::worker::random_id();
                write_atomic(&instance_path, &id)?;
                tracing::info!(instance = %id, "worker instance id created");
                id
            }
        };
        let cluster_path = data_dir.join("cluster");
        let cluster = read_id(&cluster_path)?;
        let session_path = data_dir.join("session");
        let session = read_id(&session_path)?;
        Ok(Self {
            instance,
            cluster_path,
            cluster: RwLock::new(cluster),
            session_path: Some(session_path),
            session: RwLock::new(session),
        })
    }

    /// An identity that is not kept anywhere (client tests).
    #[cfg(test)]
    pub(crate) fn for_test(instance: &str, cluster: Option<&str>) -> Self {
        Self {
            instance: instance.to_owned(),
            cluster_path: PathBuf::from("/nonexistent/cluster"),
            cluster: RwLock::new(cluster.map(str::to_owned)),
            session_path: None,
            session: RwLock::new(None),
        }
    }

    /// The instance id.
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// The cluster joined, if any yet.
    pub(crate) fn cluster(&self) -> Option<String> {
        self.cluster
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Remembers `cluster` as the one this worker serves, unless it already serves one
    /// (that never changes). On disk before it is used: a restarted worker serves it too.
    pub(crate) fn join(&self, cluster: &str) -> Result<bool, IdentityError> {
        let mut current = self
            .cluster
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.is_some() {
            return Ok(false);
        }
        write_atomic(&self.cluster_path, cluster)?;
        *current = Some(cluster.to_owned());
        Ok(true)
    }
}

impl Identity {
    /// The session secret, if the controller has handed one.
    pub(crate) fn session(&self) -> Option<String> {
        self.session
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Keeps `secret` as this instance's session from now on, in memory and on disk (mode
    /// 0600), so a restarted worker proves it. When it cannot be written it is still used
    /// for this run (the error says so); a restart then registers as new.
    pub(crate) fn set_session(&self, secret: &str) -> Result<(), IdentityError> {
        let mut current = self
            .session
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *current = Some(secret.to_owned());
        let Some(path) = &self.session_path else {
            return Ok(());
        };
        xce_stdx::atomic_file::write_atomic_private(path, format!("{secret}\n").as_bytes()).map_err(
            |source| IdentityError::Write {
                path: path.display().to_string(),
                source,
            },
        )
    }
}

/// A one-line id file: `None` when absent.
fn read_id(path: &Path) -> Result<Option<String>, IdentityError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(IdentityError::Read {
                path: path.display().to_string(),
                source,
            })
        }
    };
    let id = text.trim();
    let invalid = |reason| IdentityError::Invalid {
        path: path.display().to_string(),
        reason,
    };
    if id.is_empty() {
        return Err(invalid("is empty"));
    }
    // It travels in an HTTP header.
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        || id.len() > 128
    {
        return Err(invalid(
            "must be at most 128 characters of letters, digits, '-', '_' or '.'",
        ));
    }
    Ok(Some(id.to_owned()))
}

/// Replaces `path` with `id` and a newline, atomically.
fn write_atomic(path: &Path, id: &str) -> Result<(), IdentityError> {
    xce_stdx::atomic_file::write_atomic(path, format!("{id}\n").as_bytes()).map_err(|source| {
        IdentityError::Write {
            path: path.display().to_string(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_survives_a_restart_and_the_cluster_is_joined_once() {
        let dir = tempfile::tempdir().unwrap();
        let a = Identity::load(dir.path()).unwrap();
        assert_eq!(a.instance().len(), 16);
        assert_eq!(a.cluster(), None);
        assert!(a.join("c-1").unwrap());
        assert!(!a.join("c-2").unwrap(), "a worker never changes cluster");
        let b = Identity::load(dir.path()).unwrap();
        assert_eq!(
            (b.instance(), b.cluster().as_deref()),
            (a.instance(), Some("c-1"))
        );
        let other = tempfile::tempdir().unwrap();
        assert_ne!(
            Identity::load(other.path()).unwrap().instance(),
            a.instance()
        );
        // The session: kept across a restart, readable by the worker's user only.
        assert_eq!(b.session(), None);
        let secret = xce_proto::worker::new_session_secret().unwrap();
        b.set_session(&secret).unwrap();
        let c = Identity::load(dir.path()).unwrap();
        assert_eq!(c.session().as_deref(), Some(secret.as_str()));
        let mode = std::fs::metadata(dir.path().join("session"))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        assert!(!format!("{c:?}").contains(&secret), "{c:?}");
        std::fs::write(dir.path().join("cluster"), "not an id\n").unwrap();
        let e = Identity::load(dir.path()).unwrap_err().to_string();
        assert!(e.ends_with("cluster: must be at most 128 characters of letters, digits, '-', '_' or '.' (delete the file to start over)"), "{e}");
    }
}
