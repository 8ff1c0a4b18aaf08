//! Reading `/proc/<pid>/stat`: a process's state and its start time, which together with
//! the pid identify one process across pid recycling.

use std::io;

/// What the worker needs of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub(crate) state: char,
    /// Field 22: start time after boot, in clock ticks.
    pub(crate) start_time: u64,
}

impl ProcStat {
    /// Whether the process still runs (a zombie has exited, it only waits to be reaped).
    pub(crate) fn is_live(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Why a stat line could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed /proc stat line: {0}")]
pub(crate) struct StatError(&'static str);

/// Parses the content of `/proc/<pid>/stat`.
pub(crate) fn parse_stat(text: &str) -> Result<ProcStat, StatError> {
    // The command name (field 2) is in parentheses and may itself contain spaces and
    // parentheses, so the fields after it start after the *last* ')'.
    let close = text
        .rfind(')')
        .ok_or(StatError("no ')' after the command name"))?;
    let mut rest = text[close + 1..].split_ascii_whitespace();
    let state = rest
        .next()
        .and_then(|s| {
            let mut c = s.chars();
            let first = c.next()?;
            c.next().is_none().then_some(first)
        })
        .ok_or(StatError("no state field"))?;
    // `rest` is now at field 4; field 22 is 18 further on.
    let start = rest.nth(18).ok_or(StatError("too few fields"))?;
    let start_time = start
        .parse()
        .map_err(|_| StatError("start time is not a number"))?;
    Ok(ProcStat { state, start_time })
}

/// Reads `/proc/<pid>/stat`; `Ok(None)` when there is no such process.
pub(crate) fn read_stat(pid: u32) -> io::Result<Option<ProcStat>> {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => parse_stat(&text)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        // ESRCH: the process went away between open and read.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether the process `pid` that started at `start_time` still runs (not recycled, not
/// a zombie).
pub(crate) fn is_same_and_live(pid: u32, start_time: u64) -> bool {
    matches!(read_stat(pid), Ok(Some(s)) if s.start_time == start_time && s.is_live())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(line: &str, expect: expect_test::Expect) {
        let out = match parse_stat(line) {
            Ok(s) => format!(
                "state={} start={} live={}",
                s.state,
                s.start_time,
                s.is_live()
            ),
            Err(e) => e.to_string(),
        };
        expect.assert_eq(&out);
    }

    #[test]
    fn parses_plain_and_tricky_command_names() {
        check(
            "4242 (python3) S 1 4242 4242 0 -1 4194560 1234 0 0 0 5 2 0 0 20 0 1 0 987654 12345678 2048 18446744073709551615",
            expect_test::expect!["state=S start=987654 live=true"],
        );
        check(
            "17 (a) b) (c) Z 1 17 17 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0",
            expect_test::expect!["state=Z start=55 live=false"],
        );
    }

    #[test]
    fn rejects_malformed_lines() {
        check(
            "17 python3 S 1",
            expect_test::expect!["malformed /proc stat line: no ')' after the command name"],
        );
        check(
            "17 (sh) S 1 2 3",
            expect_test::expect!["malformed /proc stat line: too few fields"],
        );
        check(
            "17 (sh) S 1 17 17 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 x 0",
            expect_test::expect!["malformed /proc stat line: start time is not a number"],
        );
    }

    #[test]
    fn reads_our_own_process() {
        let me = read_stat(std::process::id()).unwrap().unwrap();
        assert!(me.is_live());
        assert!(is_same_and_live(std::process::id(), me.start_time));
        assert!(!is_same_and_live(std::process::id(), me.start_time + 1));
    }
}
