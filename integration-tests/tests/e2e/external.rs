//! Programs from outside the workspace that some tests drive (headless Chromium and its
//! WebDriver, Prometheus): found where `./test.sh` installs them, started on a free
//! loopback port, killed with the test.

use crate::harness::{http_service, Api, DevCluster};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The first of `names` found on `PATH` or in `/usr/bin` (Debian's place, also when
/// `PATH` is minimal).
pub fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .collect();
    names
        .iter()
        .find_map(|name| dirs.iter().map(|d| d.join(name)).find(|p| is_executable(p)))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Says loudly, on stdout and stderr, that `test` did not run because `what` is missing:
/// a skip must never look like a pass in the log.
pub fn skipped(test: &str, what: &str) {
    let msg = format!(
        "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
         SKIPPED {test}: {what} is not installed (./test.sh installs it on Debian)\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
    );
    println!("{msg}");
    eprintln!("{msg}");
}

/// A child process killed (and reaped) when dropped; its output goes to `log`.
pub struct Daemon {
    child: Child,
    pub log: PathBuf,
}

impl Daemon {
    pub fn spawn(cmd: &mut Command, log: PathBuf) -> Result<Self> {
        let out = std::fs::File::create(&log).with_context(|| format!("creating {log:?}"))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("spawning {cmd:?}"))?;
        Ok(Self { child, log })
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first line `program --version` prints (empty if it prints nothing).
pub fn program_version(program: &Path) -> String {
    Command::new(program)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned()
        })
        .unwrap_or_default()
}

/// What the outside watchers (a browser, Prometheus) look at: a 3-host dev cluster on
/// `tokens`, with `web` (team-a, 3 replicas, submitted with `owner_a`) and `api` (team-b, 1
/// replica, submitted with `owner_b`), all ready; `extra.0` and `extra.1` are appended to
/// their profiles (e.g. `[service.meta]`).
pub struct TwoTenants {
    pub cluster: DevCluster,
    pub a: Api,
    pub b: Api,
    /// `api`'s one endpoint.
    pub b_endpoint: String,
    _dir: tempfile::TempDir,
}

impl TwoTenants {
    pub async fn start(tokens: &str, owner_a: &str, owner_b: &str, extra: (&str, &str)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tokens_file = dir.path().join("tokens.toml");
        std::fs::write(&tokens_file, tokens).unwrap();
        let cluster =
            DevCluster::start_with(3, false, &["--tokens", tokens_file.to_str().unwrap()])
                .expect("dev cluster");
        let a = cluster.api.with_token(owner_a);
        let b = cluster.api.with_token(owner_b);
        let web = http_service("web", 3).project("team-a").interval("200ms");
        let (st, body) = a
            .submit_toml(&format!("{}{}", web.toml(), extra.0))
            .await
            .unwrap();
        assert_eq!(st, 201, "{body}");
        let api = http_service("api", 1).project("team-b").interval("200ms");
        let (st, body) = b
            .submit_toml(&format!("{}{}", api.toml(), extra.1))
            .await
            .unwrap();
        assert_eq!(st, 201, "{body}");
        a.wait_ready("web", 3).await;
        let b_endpoint = b.wait_ready("api", 1).await.remove(0);
        Self {
            cluster,
            a,
            b,
            b_endpoint,
            _dir: dir,
        }
    }
}

/// One `[[token]]` of a tokens file: `secret` for `principal`, with each
/// `(permission, project)` grant.
pub fn token(secret: &str, principal: &str, grants: &[(&str, &str)]) -> String {
    let grants: Vec<String> = grants
        .iter()
        .map(|(p, project)| format!("{{ permission = \"{p}\", projects = [\"{project}\"] }}"))
        .collect();
    format!(
        "[[token]]\nsecret = \"{secret}\"\nprincipal = \"{principal}\"\ngrants = [ {} ]\n\n",
        grants.join(", ")
    )
}

/// View and submit on `project`.
pub fn own(project: &str) -> [(&'static str, &str); 2] {
    [("job.view", project), ("job.submit", project)]
}
