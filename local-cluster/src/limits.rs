//! The process's open-file limit: raised to the hard limit at start (a daemon holding
//! thousands of watchers needs more than the usual soft limit of 1,024), and read to size
//! the connection caps (`serve.rs`).
#![allow(unsafe_code)]

/// The open-file limit `(soft, hard)`.
pub fn nofile() -> (u64, u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; no other memory is touched.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return (1024, 1024);
    }
    // rlim_t is u64 on Linux, but not everywhere.
    #[allow(clippy::useless_conversion)]
    let limits = (u64::from(r.rlim_cur), u64::from(r.rlim_max));
    limits
}

/// Raises the soft open-file limit to the hard limit; returns `(before, after)`.
pub fn raise_nofile() -> std::io::Result<(u64, u64)> {
    let (soft, hard) = nofile();
    if soft >= hard {
        return Ok((soft, soft));
    }
    let r = libc::rlimit {
        rlim_cur: hard as libc::rlim_t,
        rlim_max: hard as libc::rlim_t,
    };
    // SAFETY: setrlimit only reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((soft, nofile().0))
}
