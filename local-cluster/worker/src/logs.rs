//! Replica logs that do not fill the disk: a small writer process per replica appends its
//! output to `logs/<job>.log` and rotates it by size (`<job>.log.1`, `.2`, …), and the
//! worker removes an ended job's logs (and its job directory) `retain` after it ended.
//!
//! Why a process and not the worker: a replica outlives its worker (a restarted worker
//! re-adopts it), so its output cannot be a pipe the worker reads. The writer is the
//! other end of that pipe, in a process group of its own (a stop signal to the replica's
//! group does not end it): it writes what is left and exits when the last holder of the
//! pipe's write end (the replica and whatever it started) is gone.

use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The default largest size of one replica log file (10 MiB).
pub(crate) const DEFAULT_MAX_SIZE: u64 = 10 * 1024 * 1024;
/// The default number of files a replica's log is kept in (the current one included).
pub(crate) const DEFAULT_KEEP: u32 = 3;
/// The default time an ended job's logs are kept.
pub(crate) const DEFAULT_RETAIN: Duration = Duration::from_secs(24 * 3600);
/// The smallest `max_size` accepted: below it rotation would be a file per line.
pub(crate) const MIN_MAX_SIZE: u64 = 1024;
/// The most files `keep` may ask for.
pub(crate) const MAX_KEEP: u32 = 100;

/// How replica logs are rotated and kept (`[logs]` in the worker config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogPolicy {
    /// The largest size of one log file, in bytes.
    pub max_size: u64,
    /// How many files a replica's log is kept in, the one being written included.
    pub keep: u32,
    /// How long an ended job's logs (and job directory) stay.
    pub retain: Duration,
}

impl Default for LogPolicy {
    fn default() -> Self {
        Self {
            max_size: DEFAULT_MAX_SIZE,
            keep: DEFAULT_KEEP,
            retain: DEFAULT_RETAIN,
        }
    }
}

impl LogPolicy {
    /// Every problem of the policy, as `(field, reason)`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.max_size < MIN_MAX_SIZE {
            out.push((
                "max_size",
                format!(
                    "{} bytes is below the smallest size, {MIN_MAX_SIZE} bytes (1KiB)",
                    self.max_size
                ),
            ));
        }
        if !(1..=MAX_KEEP).contains(&self.keep) {
            out.push((
                "keep",
                format!("{} is not between 1 and {MAX_KEEP}", self.keep),
            ));
        }
        out
    }
}

/// Parses a size: a number of bytes, or a number with a unit `B`, `KiB`, `MiB`, `GiB`
/// (powers of 1024) or `KB`, `MB`, `GB` (powers of 1000): `"10MiB"`, `"512 KiB"`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a size (write e.g. \"10MiB\" or \"512KiB\")"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        u => {
            return Err(format!(
                "unknown unit {u:?} in {text:?} (use B, KiB, MiB, GiB, KB, MB or GB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// `path.N`: the N-th older file of a log.
fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

fn open_log(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// A log file that rotates before it would grow past `max_size`.
struct Rotating<'a> {
    path: &'a Path,
    policy: LogPolicy,
    file: std::fs::File,
    size: u64,
}

impl<'a> Rotating<'a> {
    fn open(path: &'a Path, policy: LogPolicy) -> io::Result<Self> {
        let file = open_log(path)?;
        let size = file.metadata()?.len();
        Ok(Self {
            path,
            policy,
            file,
            size,
        })
    }

    /// `path` becomes `path.1`, `path.1` becomes `path.2`, …; the oldest beyond `keep`
    /// files is removed. With `keep = 1` the file is emptied instead.
    fn rotate(&mut self) -> io::Result<()> {
        let keep = self.policy.keep.max(1);
        if keep == 1 {
            self.file.set_len(0)?;
        } else {
            let _ = std::fs::remove_file(rotated(self.path, keep - 1));
            for n in (1..keep - 1).rev() {
                let _ = std::fs::rename(rotated(self.path, n), rotated(self.path, n + 1));
            }
            std::fs::rename(self.path, rotated(self.path, 1))?;
            self.file = open_log(self.path)?;
        }
        self.size = 0;
        Ok(())
    }

    /// Writes `buf`: into a fresh file when it would not fit into the current one (so a
    /// line written in one piece stays in one file), in pieces of at most `max_size` when
    /// it is larger than that.
    fn write(&mut self, mut buf: &[u8]) -> io::Result<()> {
        let max = self.policy.max_size.max(1);
        while !buf.is_empty() {
            if self.size > 0 && self.size + buf.len() as u64 > max {
                self.rotate()?;
            }
            let room = usize::try_from(max - self.size).unwrap_or(usize::MAX);
            let n = buf.len().min(room);
            self.file.write_all(&buf[..n])?;
            self.size += n as u64;
            buf = &buf[n..];
        }
        Ok(())
    }
}

/// Copies `input` to the log at `path` until `input` ends, rotating by `policy`. What
/// `xced replica-log` runs. Output that cannot be written (a full disk) is dropped, and
/// writing is tried again with the next output: the writer keeps reading, so the replica
/// neither blocks on a full pipe nor dies of SIGPIPE because its log cannot be written.
/// The log says how much was dropped once it can be written again. `Ok(n)`: the bytes
/// dropped.
pub fn write_rotating(mut input: impl Read, path: &Path, policy: LogPolicy) -> io::Result<u64> {
    let mut out = Rotating::open(path, policy)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut dropped = 0u64;
    // Dropped since the log last said so, and why.
    let (mut unsaid, mut why) = (0u64, String::new());
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(dropped),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if unsaid > 0 {
            let note = format!("xced replica-log: {unsaid} bytes of output dropped: {why}\n");
            if out.write(note.as_bytes()).is_ok() {
                unsaid = 0;
            }
        }
        if let Err(e) = out.write(&buf[..n]) {
            why = e.to_string();
            unsaid += n as u64;
            dropped += n as u64;
        }
    }
}

/// A job id as a file name: anything but `[A-Za-z0-9._-]` replaced, never starting with
/// a dot, so a job id can never name a path outside its directory.
pub(crate) fn safe_name(job: &str) -> String {
    let safe: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.starts_with('.') || safe.is_empty() {
        format!("_{safe}")
    } else {
        safe
    }
}

/// Everything the worker keeps of an ended job: its log files (`<job>.log`, `<job>.log.N`)
/// and its job directory.
#[derive(Debug, Clone)]
pub(crate) struct JobFiles {
    pub(crate) log: PathBuf,
    pub(crate) dir: PathBuf,
}

impl JobFiles {
    /// Removes them (what is already gone is fine).
    pub(crate) fn remove(&self) {
        let prefix = match self.log.file_name().and_then(|n| n.to_str()) {
            Some(n) => format!("{n}."),
            None => return,
        };
        let _ = std::fs::remove_file(&self.log);
        if let Some(parent) = self.log.parent() {
            for e in std::fs::read_dir(parent).into_iter().flatten().flatten() {
                let name = e.file_name();
                let Some(name) = name.to_str() else { continue };
                let rotation = name.strip_prefix(&prefix);
                if rotation.is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove an ended job's directory");
            }
        }
        tracing::info!(log = %self.log.display(), "ended job's logs removed (retention)");
    }

    /// When the job's files were last written: the end of a job that ended before this
    /// worker started.
    pub(crate) fn last_written(&self) -> Option<SystemTime> {
        let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        mtime(&self.log).into_iter().chain(mtime(&self.dir)).max()
    }
}

/// Removes `files` at `at`: one timer per ended job, no scanning.
pub(crate) fn remove_at(files: JobFiles, at: tokio::time::Instant) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep_until(at).await;
        files.remove();
    })
}

/// The job ids whose log files lie in `logs` (`<job>.log` and rotations).
pub(crate) fn logged_jobs(logs: &Path) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let stem = name
            .trim_end_matches(|c: char| c.is_ascii_digit())
            .trim_end_matches('.');
        if let Some(job) = stem.strip_suffix(".log") {
            out.insert(job.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_and_bad_ones_say_why() {
        assert_eq!(parse_size("10MiB"), Ok(10 << 20));
        assert_eq!(parse_size("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_size("2000"), Ok(2000));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert!(parse_size("10 furlongs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("MiB").unwrap_err().contains("not a size"));
        assert!(parse_size("99999999999GiB")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn a_policy_names_each_bad_field() {
        let bad = LogPolicy {
            max_size: 10,
            keep: 0,
            retain: Duration::ZERO,
        };
        let fields: Vec<_> = bad.problems().into_iter().map(|(f, _)| f).collect();
        assert_eq!(fields, ["max_size", "keep"]);
        assert!(LogPolicy::default().problems().is_empty());
    }

    /// Far more output than `keep` files of `max_size` hold: at most `keep` files, none
    /// larger than `max_size`, and the newest output in the current file.
    #[test]
    fn output_rotates_into_at_most_keep_files_of_at_most_max_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j-1.log");
        let policy = LogPolicy {
            max_size: 4096,
            keep: 3,
            retain: Duration::ZERO,
        };
        let mut text = String::new();
        for i in 0..5000 {
            text += &format!("line {i}\n");
        }
        // Pieces of assorted sizes, one larger than max_size.
        let reader = io::Cursor::new(text.clone().into_bytes());
        write_rotating(reader.chain(io::repeat(b'x').take(9000)), &path, policy).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["j-1.log", "j-1.log.1", "j-1.log.2"]);
        for n in &names {
            let len = std::fs::metadata(dir.path().join(n)).unwrap().len();
            assert!(len <= policy.max_size, "{n}: {len} bytes");
        }
        let current = std::fs::read(&path).unwrap();
        assert!(current.ends_with(b"xxx"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// A log that cannot be written (`/dev/full`: every write is ENOSPC) does not end the
    /// writer: it reads to the end (the replica never meets a closed pipe) and counts
    /// what it dropped.
    #[test]
    fn an_unwritable_log_drops_output_and_keeps_reading() {
        if !Path::new("/dev/full").exists() {
            return;
        }
        let input = io::repeat(b'x').take(200_000);
        let dropped = write_rotating(input, Path::new("/dev/full"), LogPolicy::default()).unwrap();
        assert_eq!(dropped, 200_000);
    }

    #[test]
    fn removal_takes_the_rotations_and_the_job_dir_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        for name in ["j-1.log", "j-1.log.1", "j-1.log.2", "j-10.log", "j-1.logx"] {
            std::fs::write(logs.join(name), "x").unwrap();
        }
        let job_dir = dir.path().join("jobs/j-1");
        std::fs::create_dir_all(&job_dir).unwrap();
        std::fs::write(job_dir.join("data"), "x").unwrap();
        assert_eq!(
            logged_jobs(&logs).into_iter().collect::<Vec<_>>(),
            ["j-1", "j-10"]
        );
        JobFiles {
            log: logs.join("j-1.log"),
            dir: job_dir.clone(),
        }
        .remove();
        let mut left: Vec<String> = std::fs::read_dir(&logs)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["j-1.logx", "j-10.log"]);
        assert!(!job_dir.exists());
    }
}
