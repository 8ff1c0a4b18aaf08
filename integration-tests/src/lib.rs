//! End-to-end tests of xce service endpoints: they run the real `xced` and `xcecli`
//! binaries, real replica processes that bind their ports, and real HTTP on loopback.
//! The tests live in `tests/e2e/` (one test binary); this library holds what they and the
//! benches in `benches/` share.

/// Sends `sig` to process `pid`; a process already gone is not an error here (the tests
/// and benches signal children that may have exited).
pub fn signal(pid: u32, sig: i32) {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    let sig = rustix::process::Signal::from_named_raw(sig);
    if let (Some(pid), Some(sig)) = (pid, sig) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}
