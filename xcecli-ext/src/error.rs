//! The one error type of the client: every failure is sorted into a [`ErrorKind`] at the
//! edge, and the kind alone decides the exit code (docs/cli.md#exit-codes).

use std::fmt;

/// What went wrong, as far as the user (and the exit code) is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The command line is wrong in a way clap could not see (e.g. `-o plain` on a service
    /// with several ports and no `--port`). Exit 2.
    Usage,
    /// The client configuration is unusable (bad `--api` URL, a token that cannot be sent).
    /// Exit 1.
    Config,
    /// The input was rejected: a file that cannot be read, or a request the server refused
    /// as invalid (400, 409, 413, 422; every detail is listed). Exit 1.
    Invalid,
    /// Missing or invalid token (401). Exit 5.
    Auth,
    /// Authenticated, but not allowed (403). Exit 1: exit 5 means "not authenticated".
    Forbidden,
    /// The service is unknown or not visible to the caller (404). Exit 4.
    NotFound,
    /// The service name exists in several of the caller's projects and no project was
    /// picked (409 `ambiguous`; the hint names `--project`). Exit 1, like the other
    /// refusals: the command was well formed, the name alone does not say which service.
    Ambiguous,
    /// The apiserver could not be reached, or did not answer in time. Exit 1.
    Unreachable,
    /// `--wait-ready` or `--wait` ran out of time. Exit 3.
    Timeout,
    /// A rollout `--wait` followed failed, or failed and was reverted. Exit 6.
    RolloutFailed,
    /// The server is older than this client and does not have what the command needs (a
    /// route it lacks): the message names both versions. Exit 7.
    ServerTooOld,
    /// The apiserver failed (5xx) or answered something this client cannot read. Exit 1.
    Server,
    /// A bug or an environment failure in the client itself (e.g. a broken stdout). Exit 1.
    Internal,
}

/// A user-facing error: a kind (which fixes the exit code), a lowercase message, the
/// server's per-field details, and an optional hint on what to do about it.
///
/// `Display` renders what the binary prints on stderr (without a final newline):
///
/// ```text
/// error: invalid service profile
///   service.ports[1].name: duplicate port name "http"
/// hint: fix the profile and submit it again
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    /// What went wrong.
    pub kind: ErrorKind,
    /// One line, lowercase, no full stop.
    pub message: String,
    /// Per-field problems (`field: reason`), one line each; empty when there are none.
    pub details: Vec<String>,
    /// What the user can do about it.
    pub hint: Option<String>,
    /// A 503 `no_leader` (no controller leads, or the leader does not answer: a takeover
    /// is under way): a read may be repeated after this pause.
    pub(crate) no_leader: Option<std::time::Duration>,
}

// === impl ErrorKind ===

impl ErrorKind {
    /// The process exit code (docs/cli.md#exit-codes) for this kind.
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::Usage => 2,
            ErrorKind::Timeout => 3,
            ErrorKind::NotFound => 4,
            ErrorKind::Auth => 5,
            ErrorKind::RolloutFailed => 6,
            ErrorKind::ServerTooOld => 7,
            ErrorKind::Config
            | ErrorKind::Invalid
            | ErrorKind::Ambiguous
            | ErrorKind::Forbidden
            | ErrorKind::Unreachable
            | ErrorKind::Server
            | ErrorKind::Internal => 1,
        }
    }
}

// === impl CliError ===

impl CliError {
    /// An error of `kind` with `message` and no hint.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            details: Vec::new(),
            hint: None,
            no_leader: None,
        }
    }

    /// A [`ErrorKind::Usage`] error.
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Usage, message)
    }

    /// Adds a hint.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Adds detail lines.
    pub fn with_details(mut self, details: Vec<String>) -> Self {
        self.details = details;
        self
    }

    /// The process exit code (never 0).
    pub fn exit_code(&self) -> i32 {
        self.kind.exit_code()
    }

    /// An error writing to stdout or stderr.
    pub(crate) fn io(err: std::io::Error) -> Self {
        Self::new(ErrorKind::Internal, format!("cannot write output: {err}"))
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error: {}", self.message)?;
        for d in &self.details {
            write!(f, "\n  {d}")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "\nhint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CliError {}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check(err: CliError, expect: Expect) {
        let actual = format!("exit {}\n{err}", err.exit_code());
        expect.assert_eq(&actual);
    }

    #[test]
    fn renders_message_details_and_hint() {
        check(
            CliError::new(ErrorKind::Invalid, "invalid service profile")
                .with_details(vec![
                    "service.ports[1].name: duplicate port name \"http\"".into(),
                    "service.replicas: must be at least 1".into(),
                ])
                .with_hint("fix the profile and submit it again"),
            expect![[r#"
                exit 1
                error: invalid service profile
                  service.ports[1].name: duplicate port name "http"
                  service.replicas: must be at least 1
                hint: fix the profile and submit it again"#]],
        );
        check(
            CliError::usage("service \"web\" has several ports (http, metrics)"),
            expect![[r#"
                exit 2
                error: service "web" has several ports (http, metrics)"#]],
        );
    }

    #[test]
    fn exit_codes_are_the_contract() {
        let codes: Vec<_> = [
            ErrorKind::Usage,
            ErrorKind::Config,
            ErrorKind::Invalid,
            ErrorKind::Auth,
            ErrorKind::Forbidden,
            ErrorKind::NotFound,
            ErrorKind::Ambiguous,
            ErrorKind::Unreachable,
            ErrorKind::Timeout,
            ErrorKind::Server,
            ErrorKind::Internal,
            ErrorKind::RolloutFailed,
            ErrorKind::ServerTooOld,
        ]
        .iter()
        .map(|k| format!("{k:?}={}", k.exit_code()))
        .collect();
        expect![[r#"Usage=2 Config=1 Invalid=1 Auth=5 Forbidden=1 NotFound=4 Ambiguous=1 Unreachable=1 Timeout=3 Server=1 Internal=1 RolloutFailed=6 ServerTooOld=7"#]]
            .assert_eq(&codes.join(" "));
    }
}
