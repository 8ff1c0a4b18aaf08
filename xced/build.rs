//! Records the git commit the binaries are built from (`XCE_COMMIT`, shown by
//! `--version`, `/healthz`, `X-Xce-Version` and `xce_build_info`).
//!
//! From git when the source is a checkout (a worktree too); otherwise from
//! `XCE_BUILD_COMMIT` (a packager building from a tarball can set it); else `unknown`.
//! Cargo reruns this script when HEAD moves (a commit, a checkout): it watches the HEAD
//! file, the branch's ref file and `packed-refs`, so an incremental build never shows the
//! commit of an earlier build.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

/// A file git keeps (resolved for worktrees: HEAD is per worktree, refs are shared).
fn git_path(name: &str) -> Option<PathBuf> {
    git(&["rev-parse", "--path-format=absolute", "--git-path", name]).map(PathBuf::from)
}

fn main() {
    println!("cargo:rerun-if-env-changed=XCE_BUILD_COMMIT");
    let mut watched = vec![git_path("HEAD"), git_path("packed-refs")];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git_path(&branch));
    }
    // Only files that exist: cargo reruns a script on every build for a missing one.
    for path in watched.into_iter().flatten().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"])
        .or_else(|| std::env::var("XCE_BUILD_COMMIT").ok())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=XCE_COMMIT={commit}");
}
