//! The few system calls the worker needs that std and tokio do not offer: pidfds (exit
//! watching that works for processes the worker did not spawn), signals to a process
//! group and `flock`. All through `rustix`, so the crate has no `unsafe`.

use rustix::process::{Pid, PidfdFlags};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// A pidfd: a handle to one process that stays valid (and never refers to another
/// process) even after the pid is recycled. Readable once the process has exited.
///
/// The descriptor is private and never replaced, so `as_raw_fd` returns the same open
/// descriptor for the whole life of the value: the promise tokio's reactor needs (see
/// [`async_pidfd`]).
#[derive(Debug)]
pub(crate) struct PidFd(OwnedFd);

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for PidFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
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
    fn raw(self) -> rustix::process::Signal {
        match self {
            Signal::Term => rustix::process::Signal::TERM,
            Signal::Kill => rustix::process::Signal::KILL,
        }
    }
}

fn to_pid(pid: u32) -> io::Result<Pid> {
    match i32::try_from(pid).ok().and_then(Pid::from_raw) {
        // pid 0 and 1 are never replicas; refusing them here also keeps a group kill from
        // ever turning into `kill(0)` (our own group) or `kill(-1)` (every process).
        Some(p) if !p.is_init() => Ok(p),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to act on pid {pid}"),
        )),
    }
}

/// Opens a pidfd for `pid` (`pidfd_open(2)`, Linux 5.3+).
pub(crate) fn pidfd_open(pid: u32) -> io::Result<PidFd> {
    let pid = to_pid(pid)?;
    Ok(PidFd(rustix::process::pidfd_open(
        pid,
        PidfdFlags::empty(),
    )?))
}

/// Registers the pidfd with tokio's reactor: the result is readable once the process
/// has exited.
pub(crate) fn async_pidfd(
    fd: std::sync::Arc<PidFd>,
) -> io::Result<tokio::io::unix::AsyncFd<std::sync::Arc<PidFd>>> {
    // tokio marks this constructor deprecated (its replacement is `unsafe`) because a
    // type's `as_raw_fd` might hand out a descriptor that is closed or swapped while
    // registered. `PidFd` cannot: the `Arc` moved into the `AsyncFd` keeps its private
    // `OwnedFd` open for the whole life of the `AsyncFd`, and nothing can replace it.
    #[allow(deprecated)]
    tokio::io::unix::AsyncFd::with_interest(fd, tokio::io::Interest::READABLE)
}

/// Whether the process behind `fd` has exited (a non-blocking poll for readability).
pub(crate) fn pidfd_exited(fd: &PidFd) -> bool {
    use rustix::event::{PollFd, PollFlags};
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
        && fds[0].revents().intersects(PollFlags::IN | PollFlags::HUP)
}

/// Sends `sig` to the process group `pgid` (replicas lead their own group, so
/// `pgid` is the replica's pid). `Ok(false)`: no such group any more.
pub(crate) fn kill_group(pgid: u32, sig: Signal) -> io::Result<bool> {
    let pgid = to_pid(pgid)?;
    match rustix::process::kill_process_group(pgid, sig.raw()) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::SRCH) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Takes an exclusive advisory lock on `file` without waiting (`flock(2)`); released when
/// the file is closed. `Ok(false)`: someone else holds it.
pub(crate) fn try_lock(file: &std::fs::File) -> io::Result<bool> {
    use rustix::fs::FlockOperation;
    match rustix::fs::flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
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
