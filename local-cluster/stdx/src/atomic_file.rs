//! Replacing a file atomically, for every file a daemon or the CLI rewrites (the worker's
//! `jobs.json` and identity files, `xced dev`'s client config): after a crash at any point
//! the path holds either the old content or the new, never a torn or empty file. Every
//! file and directory made here is its owner's alone (0600 / 0700), whatever the umask.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Replaces `path` with `bytes`, readable by its owner only (mode 0o600, whatever the
/// umask): a daemon's state (job lists, identities) is nobody else's business, least of
/// all a replica's running as another user.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_with_mode(path, bytes, 0o600)
}

/// [`write_atomic`], named for the callers whose file holds a secret (a token).
pub fn write_atomic_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic(path, bytes)
}

/// Makes `dir` (and missing parents, 0o700) and gives it `mode` (0o700 for a daemon's
/// data dir), whatever the umask and whatever an older version left there.
pub fn private_dir(dir: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// Gives an existing file mode 0o600 (a store file an older version made 0o644, a file a
/// library created as the umask allowed).
pub fn make_private(path: &Path) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// Writes a temp file beside `path` (same directory, so the rename cannot cross a
/// filesystem), syncs it, renames it over `path`, then syncs the directory: without that
/// last step a crash could bring the old name back.
fn write_with_mode(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = temp_path(path);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        // A temp file left over by a crash keeps its old mode on open: set it.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        // Best effort: a half-written temp file is garbage whatever happened.
        let _ = std::fs::remove_file(&tmp);
        return written;
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

/// `dir/name` → `dir/name.tmp`.
fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.json");
        write_atomic(&path, b"old").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["jobs.json"]);
    }

    #[test]
    fn every_atomic_file_is_readable_by_its_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        for (name, write) in [
            ("client.toml", write_atomic_private as fn(&Path, &[u8]) -> _),
            ("jobs.json", write_atomic),
        ] {
            let path = dir.path().join(name);
            // A leftover temp file of another mode does not lend it its mode.
            std::fs::write(temp_path(&path), b"").unwrap();
            std::fs::set_permissions(temp_path(&path), std::fs::Permissions::from_mode(0o644))
                .unwrap();
            write(&path, b"token").unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
    }

    #[test]
    fn a_private_dir_is_0700_also_when_it_was_not() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("a/b");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&data, 0o700).unwrap();
        let mode = std::fs::metadata(&data).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let fresh = dir.path().join("c/d");
        private_dir(&fresh, 0o711).unwrap();
        let parent = std::fs::metadata(dir.path().join("c"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(parent & 0o777, 0o700);
    }

    #[test]
    fn a_failed_write_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("instance");
        write_atomic(&path, b"old").unwrap();
        // The temp file's name is taken by a directory: the write fails before the rename.
        std::fs::create_dir(dir.path().join("instance.tmp")).unwrap();
        assert!(write_atomic(&path, b"new").is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
    }
}
