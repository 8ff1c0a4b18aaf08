//! Programs from outside the workspace that some tests drive (headless Chromium and its
//! WebDriver, Prometheus): found where `./test.sh` installs them, started on a free
//! loopback port, killed with the test.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The first of `names` found on `PATH` or in `/usr/bin` (Debian's place, also when
/// `PATH` is minimal).
pub fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .collect();
    names
        .iter()
        .find_map(|name| dirs.iter().map(|d| d.join(name)).find(|p| is_executable(p)))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Says loudly, on stdout and stderr, that `test` did not run because `what` is missing:
/// a skip must never look like a pass in the log.
pub fn skipped(test: &str, what: &str) {
    let msg = format!(
        "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
         SKIPPED {test}: {what} is not installed (./test.sh installs it on Debian)\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
    );
    println!("{msg}");
    eprintln!("{msg}");
}

/// A child process killed (and reaped) when dropped; its output goes to `log`.
pub struct Daemon {
    child: Child,
    pub log: PathBuf,
}

impl Daemon {
    pub fn spawn(cmd: &mut Command, log: PathBuf) -> Result<Self> {
        let out = std::fs::File::create(&log).with_context(|| format!("creating {log:?}"))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("spawning {cmd:?}"))?;
        Ok(Self { child, log })
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
