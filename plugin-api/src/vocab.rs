//! The words every module of the crate speaks: ids, grants and field errors. Their own
//! module (not `lib.rs`) so that the modules import them from here and `lib.rs` only
//! re-exports: no file names a file that names it back.

use std::fmt;

/// The id of an exec host, e.g. `exec-01`.
pub type HostId = String;
/// The id of a job (one run of one replica), e.g. `j-17`.
pub type JobId = String;

pub use crate::grant::{Grant, GrantError};
pub use crate::grants::Grants;

/// One problem with a piece of input: where it is and why it is wrong.
///
/// `path` uses dotted TOML/JSON notation from the profile root, e.g. `service.ports[1].name`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FieldError {
    /// Where the problem is, e.g. `service.ports[0].port`.
    // Defaults: a client reads whatever an error body holds (see [`ErrorBody`]).
    #[serde(default)]
    pub field: String,
    /// Why it is a problem, lowercase, no full stop.
    #[serde(default)]
    pub reason: String,
}

impl FieldError {
    /// Builds a field error.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}
