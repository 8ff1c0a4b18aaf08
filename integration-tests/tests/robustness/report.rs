//! The report of a run that found violations: the seed and how to replay it, the fault
//! schedule, each violation with the slice of the history around it, and a directory
//! with the whole history (JSON), the replicas' log and copies of the daemons' logs —
//! enough to tell a bug from a test mistake after the run's temp dirs are gone.

use crate::harness::workspace_root;
use crate::history::{History, Ns, SEC};
use crate::nemesis::Planned;
use crate::replica::Replicas;
use crate::shapes::Shape;
use crate::validators::Violation;
use std::fmt::Write as _;
use std::path::PathBuf;

/// How much history before (and after) a violation its slice shows.
const BEFORE: Ns = 3 * SEC;
const AFTER: Ns = SEC;
/// Violations of one validator printed (all are in `report.txt`).
const PRINTED: usize = 3;
/// At most this many lines of history per violation.
const SLICE_LINES: usize = 40;

/// The history's events that name one of `keys` (a service or an address), within the
/// window around `at`, in time order, one line each.
pub fn slice(h: &History, keys: &[String], at: Ns) -> Vec<String> {
    let (from, to) = (at.saturating_sub(BEFORE), at + AFTER);
    let hit = |s: &str| keys.iter().any(|k| k == s);
    let mut lines: Vec<(Ns, String)> = Vec::new();
    for o in h.ops.iter().filter(|o| hit(&o.service)) {
        lines.push((o.call_ns, format!("op      {}", json(o))));
    }
    for r in h
        .reads
        .iter()
        .filter(|r| hit(&r.service) || r.endpoints.iter().any(|e| hit(e)))
    {
        lines.push((r.ret_ns, format!("read    {}", json(r))));
    }
    for r in h
        .replicas
        .iter()
        .filter(|r| hit(&r.addr) || hit(&r.service))
    {
        lines.push((r.ns, format!("replica {}", json(r))));
    }
    for q in h.requests.iter().filter(|q| hit(&q.addr) && !q.ok) {
        lines.push((q.call_ns, format!("request {}", json(q))));
    }
    for f in &h.faults {
        lines.push((f.start_ns, format!("fault   {}", json(f))));
    }
    lines.retain(|(t, _)| (from..=to).contains(t));
    lines.sort_by_key(|(t, _)| *t);
    let skip = lines.len().saturating_sub(SLICE_LINES);
    lines.into_iter().skip(skip).map(|(_, l)| l).collect()
}

/// One recorded event as a JSON line.
fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// Writes the report directory and prints the report; returns the directory.
pub fn write(
    shape: &dyn Shape,
    seed: u64,
    plan: &[Planned],
    h: &History,
    violations: &[Violation],
    reps: &Replicas,
) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let dir = target
        .join("robustness-reports")
        .join(format!("{}-{seed}", shape.name()));
    let _ = std::fs::create_dir_all(&dir);
    let mut text = format!(
        "robustness report: shape={} seed={seed} (replay: XCE_TEST_SEED={seed} cargo test -p integration-tests --test robustness -- shape_{} --exact)\n\nfault schedule:\n",
        shape.name(),
        shape.name()
    );
    let names = shape.daemons();
    for p in plan {
        let _ = writeln!(text, "  {}", p.line(&names));
    }
    // Every violation in the file; the first few of each validator printed.
    let mut shown: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut printed = text.clone();
    for v in violations {
        let n = shown.entry(v.validator).or_default();
        *n += 1;
        if *n == PRINTED + 1 {
            let _ = writeln!(
                printed,
                "\n(more {} violations: see report.txt)",
                v.validator
            );
        }
        let before = text.len();
        let _ = writeln!(
            text,
            "\nVIOLATION {} at {} ns: {}\n  history around it:",
            v.validator, v.at_ns, v.what
        );
        for l in slice(h, &v.keys, v.at_ns) {
            let _ = writeln!(text, "    {l}");
        }
        if *n <= PRINTED {
            printed.push_str(&text[before..]);
        }
    }
    let _ = std::fs::write(
        dir.join("history.json"),
        serde_json::to_string(h).unwrap_or_default(),
    );
    let _ = std::fs::copy(&reps.log, dir.join("replicas.log"));
    let _ = writeln!(text, "\nlogs (copied to {}):", dir.display());
    for log in shape.logs() {
        let name = log.file_name().map(|n| n.to_owned()).unwrap_or_default();
        let _ = std::fs::copy(&log, dir.join(&name));
        let _ = writeln!(text, "  {}", log.display());
    }
    let _ = std::fs::write(dir.join("report.txt"), &text);
    println!(
        "{printed}{}",
        &text[text.find("\nlogs (copied").unwrap_or(text.len())..]
    );
    dir
}
