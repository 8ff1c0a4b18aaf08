//! `xce-stdx`: the small helpers every xce daemon uses and no other crate owns: a file
//! written whole or not at all (`atomic_file`), and the log set-up and error chains
//! (`logging`).
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod atomic_file;
pub mod logging;
