//! The daemons' log format: one event, one line, whatever clients and workers send.
//!
//! Field values can carry text from outside (a worker's refusal reason, a job id in an
//! event report, a client's header). Printed raw, a newline in it started a separate,
//! forged log line (`INFO … admin token rotated`), and an escape sequence could rewrite an
//! operator's terminal. Every field value is therefore written with control characters
//! escaped (`\n`, `\u{1b}`) and cut at [`MAX_VALUE`] characters — for every event, not call
//! by call, so a new log line cannot forget it.

use std::fmt::Write as _;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::Writer;

/// The innermost cause of an error: "Connection refused (os error 111)" where an HTTP
/// client says only "error sending request for url (…)".
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// The longest field value logged; longer ones end in `…(N more chars)`.
pub const MAX_VALUE: usize = 512;

/// `s` with control characters escaped and its length bounded.
pub fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_VALUE + 16));
    let mut chars = s.chars();
    for (n, c) in chars.by_ref().enumerate() {
        if n == MAX_VALUE {
            let rest = 1 + chars.count();
            let _ = write!(out, "…({rest} more chars)");
            return out;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            // C0, DEL, C1, and the Unicode line and paragraph separators.
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// The field formatter of every daemon: `name=value` pairs separated by spaces, the
/// message bare, each value [`clean`]ed.
pub fn fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static {
    tracing_subscriber::fmt::format::debug_fn(
        |w: &mut Writer<'_>, field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
            let text = clean(&format!("{value:?}"));
            if field.name() == "message" {
                write!(w, "{text}")
            } else {
                write!(w, "{}={text}", field.name())
            }
        },
    )
    .delimited(" ")
}

/// Whether to colour the logs: only on a terminal, and never with `NO_COLOR` set.
pub fn use_ansi() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn control_characters_are_escaped_and_length_bounded() {
        assert_eq!(
            clean("reason\nINFO admin token rotated\r\u{1b}[2J\u{7f}"),
            "reason\\nINFO admin token rotated\\r\\u{1b}[2J\\u{7f}"
        );
        let long = "x".repeat(MAX_VALUE + 10);
        assert_eq!(
            clean(&long),
            format!("{}…(10 more chars)", "x".repeat(MAX_VALUE))
        );
        assert_eq!(clean("ümlaut ok"), "ümlaut ok");
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_newline_in_any_field_stays_on_one_line() {
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(fields())
            .with_ansi(false)
            .with_writer(move || out.clone())
            .finish();
        let forged = "bad\n2026-01-01T00:00:00Z  INFO admin token rotated";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(host = "exec-01", reason = %forged, job = forged, "launch refused");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("reason=bad\\n2026"), "{text}");
        assert!(text.contains("launch refused"), "{text}");
    }
}
