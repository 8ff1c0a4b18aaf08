//! Who this worker is and which cluster it serves, kept in its data dir (which the
//! worker holds locked, so no other worker process shares them):
//! - `instance`: a random id created at the first start. A restarted worker on the same
//!   data dir is the same instance and keeps its host at once; a second worker with the
//!   same host id (another data dir) is another instance, refused while this one lives.
//! - `cluster`: the cluster id of the controller it first registered with. It refuses
//!   to register with, or take orders from, a controller of another cluster. Absent
//!   (first start, or a data dir from before cluster ids): it joins the first cluster it
//!   registers with.

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
#[derive(Debug)]
pub(crate) struct Identity {
    instance: String,
    cluster_path: PathBuf,
    cluster: RwLock<Option<String>>,
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
        Ok(Self {
            instance,
            cluster_path,
            cluster: RwLock::new(cluster),
        })
    }

    /// An identity that is not kept anywhere (client tests).
    #[cfg(test)]
    pub(crate) fn for_test(instance: &str, cluster: Option<&str>) -> Self {
        Self {
            instance: instance.to_owned(),
            cluster_path: PathBuf::from("/nonexistent/cluster"),
            cluster: RwLock::new(cluster.map(str::to_owned)),
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
        std::fs::write(dir.path().join("cluster"), "not an id\n").unwrap();
        let e = Identity::load(dir.path()).unwrap_err().to_string();
        assert!(e.ends_with("cluster: must be at most 128 characters of letters, digits, '-', '_' or '.' (delete the file to start over)"), "{e}");
    }
}
