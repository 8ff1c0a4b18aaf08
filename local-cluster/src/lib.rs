//! `local-cluster`: a small but real host for the xce plugins — controller (with the
//! scheduler and the apiserver) and worker agent, as a library; the binaries (`xced`,
//! `xcecli`) live in the `xced` crate.
//!
//! It takes plugins through the `plugin-api` traits only, and its `Cargo.toml` lists no
//! plugin crate, so the compiler keeps it that way: the `xced` crate chooses the plugins
//! and hands them in. Nothing here knows what a port name or an endpoint is.
#![warn(unreachable_pub)]

pub mod apiserver;
pub mod atomic_file;
mod audit;
pub mod auth;
pub mod clientconf;
pub mod controller;
pub mod keyring;
pub mod limits;
pub mod logging;
pub mod profile;
pub mod proto;
pub mod serve;
pub mod store;
pub mod worker;
