//! End-to-end tests of xce service endpoints: they run the real `xced` and `xcecli`
//! binaries, real replica processes that bind their ports, and real HTTP on loopback.
//! The tests live in `tests/e2e/` (one test binary); this library is empty.
