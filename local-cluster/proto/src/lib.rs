//! `xce-proto`: the vocabulary the host's components share, and nothing that runs:
//! the service profile as users write it and the controller validates it (`profile`),
//! and the wire protocol between the controller and its workers (`worker`).
//!
//! It depends on `plugin-api` and serde alone, so the worker, the controller and the
//! apiserver can all use it without one reaching into another.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod profile;
pub mod worker;
