//! Where the commands write: the host's writers ([`Io`]) and the few ways this crate writes
//! to them (results on stdout, `warning:` lines on stderr).

use crate::error::CliError;
use std::io::Write;

/// Where the commands write, and whether those are terminals (the host finds out; this
/// crate does not look).
pub struct Io {
    /// Standard output: results.
    pub stdout: Box<dyn Write + Send>,
    /// Standard error: warnings, progress, errors.
    pub stderr: Box<dyn Write + Send>,
    /// Whether stdout is a terminal (picks the default `-o` of `service endpoints`).
    pub stdout_is_tty: bool,
    /// Whether stderr is a terminal (enables the `--wait-ready` progress line).
    pub stderr_is_tty: bool,
}

impl Io {
    /// Bundles the writers.
    pub fn new(
        stdout: Box<dyn Write + Send>,
        stderr: Box<dyn Write + Send>,
        stdout_is_tty: bool,
        stderr_is_tty: bool,
    ) -> Self {
        Self {
            stdout,
            stderr,
            stdout_is_tty,
            stderr_is_tty,
        }
    }
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Io")
            .field("stdout_is_tty", &self.stdout_is_tty)
            .field("stderr_is_tty", &self.stderr_is_tty)
            .finish_non_exhaustive()
    }
}

/// A `warning:` line on stderr.
pub(crate) fn warn(io: &mut Io, message: &str) -> Result<(), CliError> {
    writeln!(io.stderr, "warning: {message}").map_err(CliError::io)?;
    io.stderr.flush().map_err(CliError::io)
}

/// Writes to stdout; `false` when the reader went away (`| head`), which ends a watch
/// quietly rather than as an error.
pub(crate) fn write_out(io: &mut Io, s: &str) -> Result<bool, CliError> {
    match io
        .stdout
        .write_all(s.as_bytes())
        .and_then(|()| io.stdout.flush())
    {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(CliError::io(e)),
    }
}

/// A JSON answer as sent, on one line of its own.
pub(crate) fn json_line(raw: &str) -> String {
    let mut s = raw.trim_end().to_owned();
    s.push('\n');
    s
}
