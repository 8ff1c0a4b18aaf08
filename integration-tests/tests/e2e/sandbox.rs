//! Replicas see nothing of the daemons, and the daemons keep their files to themselves:
//! a replica's whole environment and working directory, a replica running as another
//! user, SIGHUP, file modes under umask 022, and replica logs that rotate and go.

use crate::harness::*;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// What a replica reports of itself, one `REPORT {json}` line on its output: its exact
/// environment (`/proc/self/environ`), working directory and what lies in it, which of the
/// daemon's file names (argv[1], comma-separated) it reaches by a relative path, whether it
/// can read the worker's credential file (argv[2]), its parent's (the worker's)
/// environment and the worker's `jobs.json`, its ids, and whether it can write where it
/// works. Then it stays (a replica that exits would be restarted).
const REPORT_PY: &str = r#"
import json, os, sys, time
def attempt(path):
    try:
        with open(path, "rb") as f:
            f.read(1)
        return "read"
    except OSError as e:
        return type(e).__name__
env = {}
for var in open("/proc/self/environ", "rb").read().split(b"\0"):
    if var:
        k, _, v = var.decode().partition("=")
        env[k] = v
r = {"env": env, "cwd": os.getcwd(), "ls": sorted(os.listdir("."))}
r["reachable"] = [n for n in sys.argv[1].split(",") if os.path.exists(n)]
r["credential"] = attempt(sys.argv[2])
r["parent_environ"] = attempt("/proc/%d/environ" % os.getppid())
r["jobs_json"] = attempt("../../jobs.json")
r["uid"], r["gid"], r["groups"] = os.getuid(), os.getgid(), os.getgroups()
try:
    open("mine.txt", "w").write("x")
    r["write_cwd"] = "ok"
except OSError as e:
    r["write_cwd"] = type(e).__name__
print("REPORT " + json.dumps(r, sort_keys=True), flush=True)
while True:
    time.sleep(3600)
"#;

/// The daemon files a replica could once open by name in its working directory.
const DAEMON_FILES: &str =
    "tokens.toml,controller.toml,worker-0.toml,worker-0.secret,worker-0.log,controller.log,jobs.json,instance,worker.lock,controller.redb";

/// The variables a replica with one port `http` and `[service.env] GREETING` gets, and
/// nothing else.
const ALLOWED: &[&str] = &[
    "GREETING",
    "HOME",
    "LANG",
    "PATH",
    "XCE_ADDR_HTTP",
    "XCE_HOST_IP",
    "XCE_JOB_ID",
    "XCE_PORTS",
    "XCE_PORT_HTTP",
    "XCE_PROJECT",
    "XCE_REPLICA",
    "XCE_SERVICE",
];

fn report_profile(credential: &Path) -> String {
    let command = toml::Value::Array(
        [
            "python3",
            "-c",
            REPORT_PY,
            DAEMON_FILES,
            &credential.display().to_string(),
        ]
        .iter()
        .map(|s| toml::Value::String((*s).to_owned()))
        .collect(),
    );
    format!("[service]\nname = \"report\"\nreplicas = 1\ncommand = {command}\n[[service.ports]]\nname = \"http\"\n[service.env]\nGREETING = \"hello from the profile\"\n")
}

/// Files in `dir` and their content, for files whose name starts with `prefix`.
fn files(dir: &Path, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.starts_with(prefix)
                .then(|| (name, std::fs::read(e.path()).unwrap_or_default()))
        })
        .collect();
    out.sort();
    out
}

/// Waits for a log file in `logs` to hold a line starting with `marker`: (the job id,
/// that line).
fn wait_for_log_line(logs: &Path, marker: &str) -> Result<(String, String)> {
    let deadline = Instant::now() + patience();
    loop {
        for (name, body) in files(logs, "") {
            let text = String::from_utf8_lossy(&body);
            if let Some(line) = text.lines().find(|l| l.starts_with(marker)) {
                let job = name.split(".log").next().unwrap_or_default().to_owned();
                return Ok((job, line.to_owned()));
            }
        }
        if Instant::now() > deadline {
            bail!("no log in {} says {marker:?}", logs.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Restarts worker 0 from a daemon's point of view at its most careless: its working
/// directory is the cluster dir (tokens, configs, logs), its environment holds its
/// credential (the documented `XCE_CREDENTIAL` override), an admin token and a secret of
/// its own. Then runs the reporting replica and returns its report.
async fn report_from_worker(c: &mut Cluster, config: &Path, credential: &Path) -> Result<Value> {
    c.kill_worker(0);
    let dir = c.dir.path().to_owned();
    c.start_worker_with(0, config, |cmd| {
        cmd.current_dir(&dir)
            .env("XCE_CREDENTIAL", "worker-0-example-secret")
            .env("XCE_TOKEN", ADMIN)
            .env("DAEMON_ONLY_SECRET", "daemon-only-secret-value");
    })?;
    let (status, body) = c.api.submit_toml(&report_profile(credential)).await?;
    anyhow::ensure!(status == 201 || status == 200, "submit: {status} {body}");
    let (_, line) = wait_for_log_line(&dir.join("worker-0/logs"), "REPORT ")?;
    let report: Value = serde_json::from_str(line.trim_start_matches("REPORT "))?;
    println!("replica environment and directory: {report:#}");
    Ok(report)
}

/// What holds whatever the user: exactly the allowed variables (the profile's own among
/// them), none of the daemon's
/// values, its own (empty) job directory as working directory and `HOME`, no daemon file
/// reachable by name, and it can write where it works.
fn check_clean(report: &Value, data_dir: &Path) {
    let env = report["env"].as_object().expect("env");
    let names: BTreeSet<&str> = env.keys().map(String::as_str).collect();
    assert_eq!(names, ALLOWED.iter().copied().collect(), "{report:#}");
    assert_eq!(env["GREETING"], "hello from the profile");
    for (k, v) in env {
        let v = v.as_str().unwrap_or_default();
        for secret in ["worker-0-example-secret", ADMIN, "daemon-only-secret-value"] {
            assert!(!v.contains(secret), "{k} holds a daemon secret: {v}");
        }
    }
    let job = env["XCE_JOB_ID"].as_str().unwrap();
    let job_dir = std::fs::canonicalize(data_dir.join("jobs").join(job)).unwrap();
    assert_eq!(report["cwd"], job_dir.display().to_string(), "{report:#}");
    assert_eq!(env["HOME"], job_dir.display().to_string());
    assert_eq!(report["ls"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["reachable"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["write_cwd"], "ok", "{report:#}");
}

/// A worker started with secrets in its environment and in its working directory: its
/// replica gets exactly the allowed variables and its own empty job directory.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_sees_only_its_variables_and_its_own_directory() -> Result<()> {
    let mut c = Cluster::new(1, "30s")?;
    let config = c.dir.path().join("worker-0.toml");
    let credential = c.dir.path().join("worker-0.secret");
    let report = report_from_worker(&mut c, &config, &credential).await?;
    check_clean(&report, &c.dir.path().join("worker-0"));
    // One shared user: a replica is the worker's user, so what that user can read, it
    // can read (docs/profile.md says so); only a user of its own (the next test) closes it.
    println!(
        "same user: parent's environ {}, ../../jobs.json {}",
        report["parent_environ"], report["jobs_json"]
    );
    Ok(())
}

/// The uid and gid of `name` from the user database (`id`), if the user exists.
fn ids_of(name: &str) -> Option<(u64, u64)> {
    let id = |flag: &str| -> Option<u64> {
        let out = std::process::Command::new("id")
            .args([flag, name])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    Some((id("-u")?, id("-g")?))
}

/// `[replicas] user`: the replica runs as that user with no supplementary group, and can
/// read neither the worker's credential file (0600, the worker's), nor the worker's
/// environment, nor its `jobs.json`; it still writes its own job directory.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_of_another_user_cannot_read_the_worker_credential() -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED: running replicas as another user needs the test to run as root");
        return Ok(());
    }
    let Some((uid, gid)) = ids_of("nobody") else {
        println!("SKIPPED: no user `nobody` on this machine");
        return Ok(());
    };
    let mut c = Cluster::new(1, "30s")?;
    let d = c.dir.path().to_owned();
    let credential = d.join("worker-0.secret");
    std::fs::write(&credential, "worker-0-example-secret\n")?;
    std::fs::set_permissions(&credential, std::fs::Permissions::from_mode(0o600))?;
    let text = std::fs::read_to_string(d.join("worker-0.toml"))?.replace(
        "credential = \"worker-0-example-secret\"",
        &format!("credential_file = \"{}\"", credential.display()),
    );
    let config = d.join("worker-0-nobody.toml");
    std::fs::write(&config, format!("{text}\n[replicas]\nuser = \"nobody\"\n"))?;
    let report = report_from_worker(&mut c, &config, &credential).await?;
    check_clean(&report, &d.join("worker-0"));
    assert_eq!(report["uid"], uid, "{report:#}");
    assert_eq!(report["gid"], gid, "{report:#}");
    let groups: Vec<u64> = serde_json::from_value(report["groups"].clone())?;
    assert!(
        groups.iter().all(|g| *g == gid),
        "supplementary groups left: {groups:?}"
    );
    for what in ["credential", "parent_environ", "jobs_json"] {
        assert_eq!(report[what], "PermissionError", "{what}: {report:#}");
    }
    let meta = std::fs::metadata(&credential)?;
    assert_eq!((meta.mode() & 0o777, meta.uid()), (0o600, 0));
    Ok(())
}

/// Sends SIGHUP to `child` and waits for `log` to say it was handled; fails at once if
/// the process died of it instead.
fn hangup_survived(child: &mut Child, log: &Path, said: &str) -> Result<()> {
    let pid = rustix::process::Pid::from_child(child);
    rustix::process::kill_process(pid, rustix::process::Signal::HUP)?;
    let deadline = Instant::now() + patience();
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("the daemon died of SIGHUP: {status}");
        }
        if std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains(said)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{} never said {said:?}", log.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `xced worker` and `xced dev` (without a tokens file: nothing to reload) log a SIGHUP
/// and keep running, and so do their replicas.
#[tokio::test(flavor = "multi_thread")]
async fn a_hangup_kills_no_daemon_and_no_replica() -> Result<()> {
    let mut c = Cluster::new(1, "30s")?;
    c.api.submit_toml(&http_service("web", 1).toml()).await?;
    let addrs = c.api.wait_ready("web", 1).await;
    let log = c.dir.path().join("worker-0.log");
    let worker = c.workers[0].as_mut().context("worker 0")?;
    hangup_survived(worker, &log, "SIGHUP: nothing to reload here; ignored")?;
    assert!(
        http_ok(&addrs[0]).await?,
        "the replica behind the worker answers"
    );

    let mut dev = DevCluster::start(1, true)?;
    let addrs = dev.api.wait_ready("web", 3).await;
    let log = dev.dir.path().join("xced.log");
    hangup_survived(
        &mut dev.child,
        &log,
        "SIGHUP: nothing to reload here; ignored",
    )?;
    for a in &addrs {
        assert!(http_ok(a).await?, "{a} answers after the SIGHUP");
    }
    let (status, _, _) = dev.api.get("/v1/services/web").await?;
    assert_eq!(status, 200, "xced dev serves after the SIGHUP");
    Ok(())
}

/// The umask this process would give its children (`/proc/self/status`).
fn own_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Umask:"))?;
    u32::from_str_radix(line.trim_start_matches("Umask:").trim(), 8).ok()
}

/// Every file and directory under `root`, with its mode.
fn walk(root: &Path, out: &mut Vec<(PathBuf, u32, bool)>) {
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let Ok(meta) = e.path().symlink_metadata() else {
            continue;
        };
        out.push((e.path(), meta.permissions().mode() & 0o777, meta.is_dir()));
        if meta.is_dir() {
            walk(&e.path(), out);
        }
    }
}

/// Started with umask 022, `xced dev` makes nothing readable to others: its data dir,
/// `xced.log` (the audit log), the store, the workers' state and identities, the TLS
/// material, the replicas' job directories and logs are 0600 / 0700.
#[tokio::test(flavor = "multi_thread")]
async fn every_daemon_file_is_private_under_umask_022() -> Result<()> {
    match own_umask() {
        Some(m) if m & 0o077 == 0o022 => {}
        other => {
            println!("SKIPPED: the test runs with umask {other:?}, not 022");
            return Ok(());
        }
    }
    let dev = DevCluster::start_logging_to_file(2, true)?;
    dev.api.wait_ready("web", 3).await;
    let data = dev.dir.path().join("data");
    let mut all = vec![(data.clone(), std::fs::metadata(&data)?.mode() & 0o777, true)];
    walk(&data, &mut all);
    let names: BTreeSet<String> = all
        .iter()
        .filter_map(|(p, ..)| Some(p.file_name()?.to_string_lossy().into_owned()))
        .collect();
    for want in [
        "xced.log",
        "controller.redb",
        "jobs.json",
        "instance",
        "logs",
    ] {
        assert!(names.contains(want), "{want} not among {names:?}");
    }
    // A replica's log: `<job id>.log`, the id `j-<n>-<tag>`.
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("j-") && n.ends_with(".log")),
        "no replica log among {names:?}"
    );
    let open: Vec<String> = all
        .iter()
        .filter(|(_, mode, _)| mode & 0o077 != 0)
        .map(|(p, mode, _)| format!("{} {mode:o}", p.display()))
        .collect();
    println!(
        "modes: {} files and directories under {}, {} open to others",
        all.len(),
        data.display(),
        open.len()
    );
    assert!(open.is_empty(), "readable by others: {open:#?}");
    Ok(())
}

/// A replica writing fast keeps at most `keep` files of at most `max_size`; once its job
/// has ended, its logs and job directory are gone after `retain`.
#[tokio::test(flavor = "multi_thread")]
async fn replica_logs_rotate_by_size_and_go_after_retain() -> Result<()> {
    const MAX: u64 = 4096;
    const KEEP: usize = 3;
    let cfg = ClusterConfig {
        extra_worker: format!("[logs]\nmax_size = \"4KiB\"\nkeep = {KEEP}\nretain = \"1s\"\n"),
        ..ClusterConfig::default()
    };
    let c = Cluster::start(1, "30s", &cfg)?;
    let lines = 20_000;
    let profile = format!(
        "[service]\nname = \"chatty\"\nreplicas = 1\ncommand = [\"sh\", \"-c\", \"i=0; while [ $i -lt {lines} ]; do echo line $i of a replica that writes fast; i=$((i+1)); done; echo FINISHED; exec sleep 100000\"]\n"
    );
    let (status, body) = c.api.submit_toml(&profile).await?;
    anyhow::ensure!(status == 201 || status == 200, "submit: {status} {body}");
    let data = c.dir.path().join("worker-0");
    let logs = data.join("logs");
    let (job, _) = wait_for_log_line(&logs, "FINISHED")?;
    let kept = files(&logs, &format!("{job}.log"));
    let sizes: Vec<u64> = kept.iter().map(|(_, b)| b.len() as u64).collect();
    let written: usize = (0..lines)
        .map(|i| format!("line {i} of a replica that writes fast\n").len())
        .sum();
    println!(
        "SUMMARY logs written_bytes={written} files={} sizes={sizes:?} max_size={MAX} keep={KEEP}",
        kept.len()
    );
    assert!(
        kept.len() <= KEEP,
        "{:?}",
        kept.iter().map(|k| &k.0).collect::<Vec<_>>()
    );
    assert!(sizes.iter().all(|s| *s <= MAX), "{sizes:?}");
    let newest = String::from_utf8_lossy(&kept[0].1).into_owned();
    assert!(
        newest.ends_with("FINISHED\n"),
        "the current file holds the newest output"
    );

    let ended = Instant::now();
    let status = c.api.delete("/v1/services/chatty").await?;
    assert!((200..300).contains(&status), "stop: {status}");
    let job_dir = data.join("jobs").join(&job);
    while !files(&logs, &format!("{job}.log")).is_empty() || job_dir.exists() {
        assert!(
            ended.elapsed() < patience(),
            "logs of the ended {job} are still there"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "SUMMARY retain job={job} gone_after_ms={}",
        ended.elapsed().as_millis()
    );
    Ok(())
}
