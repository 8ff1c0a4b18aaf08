//! `local-cluster`: a small but real host for the xce plugins — controller (with the
//! scheduler and the apiserver), worker agent, and an all-in-one dev mode.
//!
//! It wires plugins in through the `plugin-api` traits only; nothing here knows what a
//! port name or an endpoint is.
#![warn(unreachable_pub)]

pub mod auth;
pub mod clientconf;
pub mod controller;
pub mod profile;
pub mod proto;
pub mod store;
pub mod worker;
