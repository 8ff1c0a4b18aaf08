//! The few system calls the worker needs that std and tokio do not offer: pidfds (exit
//! watching that works for processes the worker did not spawn) and signals to a process
//! group. The only module of the crate with `unsafe`.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A pidfd: a handle to one process that stays valid (and never refers to another
/// process) even after the pid is recycled. Readable once the process has exited.
#[derive(Debug)]
pub(crate) struct PidFd(OwnedFd);

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A signal the worker sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// SIGTERM: ask to stop.
    Term,
    /// SIGKILL: the end of the grace period.
    Kill,
}

impl Signal {
    fn raw(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
        }
    }
}

fn to_pid(pid: u32) -> io::Result<libc::pid_t> {
    match libc::pid_t::try_from(pid) {
        // pid 0 and 1 are never replicas; refusing them here also keeps `kill(-pid)` from
        // ever turning into `kill(0)` (our own group) or `kill(-1)` (every process).
        Ok(p) if p > 1 => Ok(p),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to act on pid {pid}"),
        )),
    }
}

/// Opens a pidfd for `pid` (`pidfd_open(2)`, Linux 5.3+).
pub(crate) fn pidfd_open(pid: u32) -> io::Result<PidFd> {
    let pid = to_pid(pid)?;
    // SAFETY: pidfd_open takes two integers by value and reads or writes no memory of
    // ours; the return value is checked below.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd =
        RawFd::try_from(ret).map_err(|_| io::Error::other(format!("pidfd_open returned {ret}")))?;
    // SAFETY: the kernel just handed us this fresh descriptor; nothing else owns it, and
    // `OwnedFd` closes it exactly once.
    Ok(PidFd(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Registers the pidfd with tokio's reactor: the result is readable once the process
/// has exited.
pub(crate) fn async_pidfd(
    fd: std::sync::Arc<PidFd>,
) -> io::Result<tokio::io::unix::AsyncFd<std::sync::Arc<PidFd>>> {
    // SAFETY: the `Arc` moved into the `AsyncFd` keeps the `OwnedFd` inside open for the
    // whole life of the `AsyncFd`, and `PidFd::as_raw_fd` always returns that same fd
    // (nothing can replace the `OwnedFd` of a `PidFd`).
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// Whether the process behind `fd` has exited (a non-blocking poll for readability).
pub(crate) fn pidfd_exited(fd: &PidFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid, initialized pollfd that lives across the call; we pass a
    // count of 1 and a zero timeout, so the kernel touches only that struct.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP) != 0
}

/// Sends `sig` to the process group `pgid` (replicas lead their own group, so
/// `pgid` is the replica's pid). `Ok(false)`: no such group any more.
pub(crate) fn kill_group(pgid: u32, sig: Signal) -> io::Result<bool> {
    let pgid = to_pid(pgid)?;
    // SAFETY: kill takes two integers by value and touches no memory of ours; `to_pid`
    // guarantees `-pgid < -1`, so this addresses exactly one process group.
    let ret = unsafe { libc::kill(-pgid, sig.raw()) };
    if ret == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// Takes an exclusive advisory lock on `file` without waiting (`flock(2)`); released when
/// the file is closed. `Ok(false)`: someone else holds it.
pub(crate) fn try_lock(file: &std::fs::File) -> io::Result<bool> {
    // SAFETY: flock takes a descriptor that `file` keeps open for the call and flags by
    // value; it touches no memory of ours.
    let ret = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if ret == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_pids_that_would_widen_a_group_kill() {
        for pid in [0, 1, u32::MAX] {
            assert!(kill_group(pid, Signal::Term).is_err(), "{pid}");
            assert!(pidfd_open(pid).is_err(), "{pid}");
        }
    }

    #[test]
    fn a_lock_has_one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let open = || std::fs::File::create(&path).unwrap();
        let first = open();
        assert!(try_lock(&first).unwrap());
        assert!(!try_lock(&open()).unwrap());
        drop(first);
        assert!(try_lock(&open()).unwrap());
    }

    #[test]
    fn pidfd_sees_an_exit() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let fd = pidfd_open(child.id()).unwrap();
        // Reaping after the pidfd is open is fine: the pidfd keeps referring to the same
        // (now gone) process.
        child.wait().unwrap();
        assert!(pidfd_exited(&fd));
    }
}
