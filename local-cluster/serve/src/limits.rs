//! The process's open-file limit: raised to the hard limit at start (a daemon holding
//! thousands of watchers needs more than the usual soft limit of 1,024), and read to size
//! the connection caps (`serve.rs`).

use rustix::process::{Resource, Rlimit};

/// The open-file limit `(soft, hard)` (`u64::MAX` for unlimited).
pub fn nofile() -> (u64, u64) {
    let r = rustix::process::getrlimit(Resource::Nofile);
    (r.current.unwrap_or(u64::MAX), r.maximum.unwrap_or(u64::MAX))
}

/// Raises the soft open-file limit to the hard limit; returns `(before, after)`.
pub fn raise_nofile() -> std::io::Result<(u64, u64)> {
    let (soft, hard) = nofile();
    if soft >= hard {
        return Ok((soft, soft));
    }
    let r = rustix::process::getrlimit(Resource::Nofile);
    rustix::process::setrlimit(
        Resource::Nofile,
        Rlimit {
            current: r.maximum,
            maximum: r.maximum,
        },
    )?;
    Ok((soft, nofile().0))
}
