//! A small tmpfs for full-disk tests, unmounted on drop. Shared by the store's unit test
//! and the end-to-end full-disk scenario, so both mount the same way.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A mounted tmpfs of a fixed size, in a temp dir of its own (removed after the unmount).
#[derive(Debug)]
pub struct SmallFs {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallFs {
    /// Mounts a tmpfs of `size` (`mount -o size=`, e.g. `"2m"`); `None` where this process
    /// may not mount (not root, or no CAP_SYS_ADMIN): the caller prints `SKIPPED: …` and
    /// checks nothing.
    pub fn mount(size: &str) -> Option<SmallFs> {
        let dir = tempfile::tempdir().ok()?;
        let path = dir.path().join("fs");
        std::fs::create_dir(&path).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(SmallFs { path, _dir: dir })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Changes the size in place (`mount -o remount,size=`).
    pub fn grow(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.path)
            .status()
            .expect("mount runs");
        assert!(st.success(), "remount of {} failed", self.path.display());
    }

    /// Fills the filesystem with `name` (written until the device is full); returns the
    /// bytes written.
    pub fn fill(&self, name: &str) -> u64 {
        use std::io::Write;
        let mut f = std::fs::File::create(self.path.join(name)).expect("filler file");
        let chunk = vec![0x5a_u8; 64 * 1024];
        let mut written = 0u64;
        // Smaller and smaller writes take the last partial pages too.
        for size in [chunk.len(), 4096, 512, 1] {
            while let Ok(n) = f.write(&chunk[..size]) {
                if n == 0 {
                    break;
                }
                written += n as u64;
            }
        }
        written
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}
