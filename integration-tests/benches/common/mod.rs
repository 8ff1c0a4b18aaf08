//! What the real-process benches share: child-process plumbing and the fake workers.
//! Each bench uses part of it.
#![allow(dead_code)]

pub(crate) mod api;
pub(crate) mod fake_worker;
pub(crate) mod procs;
