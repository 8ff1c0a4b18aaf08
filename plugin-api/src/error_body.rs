//! The JSON body of every REST error, as one serde type: the apiserver writes it from an
//! [`ApiError`](crate::auth::ApiError), and clients (the CLI, the worker) read it back with it,
//! so the shape is written down once.

use crate::vocab::FieldError;
use serde::{Deserialize, Serialize};

/// `{"error": {"code", "details", "message"}}`: the body of every REST error answer.
///
/// Reading is lenient, for clients of older or newer servers: a missing `code`,
/// `message` or `details` reads as empty, and unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorInfo,
}

/// The inside of an [`ErrorBody`].
// The fields are declared in the order they are sent (alphabetical, as the answers were
// before this type existed: a serde_json map), so the bytes of every error stay the same.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// Stable machine code, e.g. `not_found`.
    #[serde(default)]
    pub code: String,
    /// Per-field problems, when any.
    #[serde(default)]
    pub details: Vec<FieldError>,
    /// Human message, lowercase.
    #[serde(default)]
    pub message: String,
}

// === impl ErrorBody ===

impl ErrorBody {
    /// Reads an error answer's body; `None` when it is not one (e.g. a proxy's HTML page).
    pub fn parse(body: &[u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::ApiError;

    #[test]
    fn written_and_read_back() {
        let e = ApiError::bad_param("port", "expected a name");
        let text = serde_json::to_string(&ErrorBody::from(e)).unwrap();
        assert_eq!(
            text,
            r#"{"error":{"code":"invalid","details":[{"field":"port","reason":"expected a name"}],"message":"port: expected a name"}}"#
        );
        let back = ErrorBody::parse(text.as_bytes()).unwrap();
        assert_eq!(back.error.code, "invalid");
        assert_eq!(
            back.error.details,
            [FieldError::new("port", "expected a name")]
        );
    }

    #[test]
    fn reading_is_lenient() {
        let body =
            ErrorBody::parse(br#"{"error":{"message":"m","details":[{"reason":"r"}],"new":1}}"#);
        let info = body.unwrap().error;
        assert_eq!((info.code.as_str(), info.message.as_str()), ("", "m"));
        assert_eq!(info.details, [FieldError::new("", "r")]);
        assert_eq!(ErrorBody::parse(b"<html>bad gateway</html>"), None);
    }
}
