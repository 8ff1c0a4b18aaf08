//! An etcd of a test's own: N members on loopback ports, data and logs in a directory of
//! their own (on tmpfs when there is one: tests are about semantics, not the disk), every
//! member killed when the [`Etcd`] is dropped, also on a failed test.

use crate::{free_port, patience};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd cluster (one member or more).
#[derive(Debug)]
pub struct Etcd {
    members: Vec<Option<Child>>,
    /// Each member's command line (to restart a killed member as it was).
    args: Vec<Vec<String>>,
    clients: Vec<String>,
    root: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

/// The etcd binary: `$ETCD`, else `etcd` on PATH, else `/usr/bin/etcd`; an error that
/// says what to install when there is none.
pub fn binary() -> Result<PathBuf> {
    let named = std::env::var_os("ETCD").map(PathBuf::from);
    let found = match &named {
        Some(bin) => Some(bin.clone()).filter(|f| f.is_file()),
        None => std::env::var_os("PATH")
            .and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("etcd"))
                    .find(|f| f.is_file())
            })
            .or_else(|| Some(PathBuf::from("/usr/bin/etcd")).filter(|f| f.is_file())),
    };
    found.with_context(|| {
        format!(
            "these tests need an etcd server binary{}: install it (Debian/Ubuntu: apt-get \
             install etcd-server), put `etcd` on PATH or name it in $ETCD",
            named
                .map(|n| format!(" ({} is not a file)", n.display()))
                .unwrap_or_default()
        )
    })
}

/// Starts of a cluster whose ports were taken before etcd bound them, in all.
const START_ATTEMPTS: u32 = 3;
/// What etcd logs when it cannot bind a port (`bind: address already in use`).
const IN_USE: &str = "address already in use";

impl Etcd {
    /// `members` members in a temp dir of their own, ready (every member reports itself
    /// healthy) when it returns.
    pub fn start(members: usize) -> Result<Self> {
        Self::start_with(members, &[])
    }

    /// As [`Etcd::start`], with `extra` flags for every member (`--max-txn-ops=8`).
    pub fn start_with(members: usize, extra: &[&str]) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("xce-etcd")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())?;
        let mut etcd = Self::start_in(dir.path(), members, extra)?;
        etcd._dir = Some(dir);
        Ok(etcd)
    }

    /// As [`Etcd::start_with`], with data and logs (`etcd-m0.log`, …) in `dir`, which the
    /// caller owns.
    ///
    /// The ports are picked free ([`free_port`]), and another process can take one before
    /// etcd binds it (an outgoing connection's ephemeral port, another test's pick: it
    /// happened in a full run beside two CPU burners). A member that exits because its
    /// address is in use is not the test's failure: the cluster is started again on new
    /// ports, up to [`START_ATTEMPTS`] times in all.
    pub fn start_in(dir: &Path, members: usize, extra: &[&str]) -> Result<Self> {
        Self::start_picking(dir, members, extra, free_port)
    }

    /// [`Etcd::start_in`] with its ports from `pick`.
    fn start_picking(
        dir: &Path,
        members: usize,
        extra: &[&str],
        mut pick: impl FnMut() -> u16,
    ) -> Result<Self> {
        let mut attempt = 1;
        loop {
            let ports: Vec<(u16, u16)> = (0..members).map(|_| (pick(), pick())).collect();
            match Self::start_once(dir, &ports, extra) {
                Err(e) if attempt < START_ATTEMPTS && e.to_string().contains(IN_USE) => {
                    eprintln!("testkit: etcd could not bind a port picked free, new ports: {e:#}");
                    // What the failed start left: its members' data and logs.
                    for i in 0..members {
                        let _ = std::fs::remove_dir_all(dir.join(format!("data-m{i}")));
                        let _ = std::fs::remove_file(dir.join(format!("etcd-m{i}.log")));
                    }
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    /// One try of [`Etcd::start_in`], a member per `(client, peer)` port pair; the members
    /// it started are killed if it fails.
    fn start_once(dir: &Path, ports: &[(u16, u16)], extra: &[&str]) -> Result<Self> {
        binary()?;
        let names: Vec<String> = (0..ports.len()).map(|i| format!("m{i}")).collect();
        let initial = names
            .iter()
            .zip(ports)
            .map(|(name, (_, peer))| format!("{name}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        // Unique per cluster, so that members of two tests' clusters never join up.
        let token = format!(
            "xce-{}-{}",
            std::process::id(),
            dir.file_name().unwrap_or_default().to_string_lossy()
        );
        let mut etcd = Self {
            members: Vec::new(),
            args: Vec::new(),
            clients: ports
                .iter()
                .map(|(client, _)| format!("127.0.0.1:{client}"))
                .collect(),
            root: dir.to_owned(),
            _dir: None,
        };
        for (name, (client, peer)) in names.iter().zip(ports) {
            let mut args = vec![
                "--name".to_owned(),
                name.clone(),
                format!("--data-dir={}", dir.join(format!("data-{name}")).display()),
                format!("--listen-client-urls=http://127.0.0.1:{client}"),
                format!("--advertise-client-urls=http://127.0.0.1:{client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-cluster={initial}"),
                "--initial-cluster-state=new".to_owned(),
                format!("--initial-cluster-token={token}"),
            ];
            args.extend(extra.iter().map(|e| (*e).to_owned()));
            etcd.args.push(args);
            let child = etcd.spawn(etcd.members.len())?;
            etcd.members.push(Some(child));
        }
        etcd.wait_healthy()?;
        Ok(etcd)
    }

    /// Waits until every member answers `GET /health` with `"health":"true"` (it has a
    /// leader and serves reads), up to [`patience`]; a member that exits fails at once.
    fn wait_healthy(&mut self) -> Result<()> {
        let deadline = Instant::now() + patience();
        for m in 0..self.members.len() {
            let port: u16 = self.clients[m]
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .context("client port")?;
            loop {
                let healthy = crate::http::get(port, "/health")
                    .is_some_and(|(status, body)| status == 200 && body.contains("\"true\""));
                if healthy {
                    break;
                }
                if let Some(Ok(Some(status))) = self.members[m].as_mut().map(Child::try_wait) {
                    bail!(
                        "etcd member {m} exited ({status}) at start:\n{}",
                        self.log_text(m)
                    );
                }
                if Instant::now() > deadline {
                    bail!(
                        "etcd member {m} did not answer within {:?}:\n{}",
                        patience(),
                        self.log_text(m)
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// How many members it started with.
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// Member `m`'s name (`m0`, `m1`, …).
    pub fn name(&self, m: usize) -> String {
        format!("m{m}")
    }

    /// Every member's client address, `127.0.0.1:PORT`.
    pub fn endpoints(&self) -> &[String] {
        &self.clients
    }

    /// The first member's client address.
    pub fn endpoint(&self) -> &str {
        &self.clients[0]
    }

    /// `etcd://m1,m2,m3`, as the daemons' `store` setting takes it.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.clients.join(","))
    }

    /// Member `m`'s log file.
    pub fn log(&self, m: usize) -> PathBuf {
        self.root.join(format!("etcd-{}.log", self.name(m)))
    }

    /// Member `m`'s log so far.
    pub fn log_text(&self, m: usize) -> String {
        std::fs::read_to_string(self.log(m)).unwrap_or_default()
    }

    /// Member `m`'s process id (for SIGSTOP/SIGCONT), while it runs.
    pub fn pid(&self, m: usize) -> Option<u32> {
        self.members[m].as_ref().map(Child::id)
    }

    /// Starts member `m` with its command line, its log appended to.
    fn spawn(&self, m: usize) -> Result<Child> {
        let bin = binary()?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(m))?;
        Command::new(&bin)
            .args(&self.args[m])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))
    }

    /// Starts member `m` again after [`Etcd::kill_9`], on its data dir (it rejoins the
    /// cluster it was in); does not wait for it.
    pub fn restart(&mut self, m: usize) -> Result<()> {
        if self.members[m].is_none() {
            self.members[m] = Some(self.spawn(m)?);
        }
        Ok(())
    }

    /// Kills member `m` (SIGKILL) and reaps it.
    pub fn kill_9(&mut self, m: usize) {
        if let Some(mut c) = self.members[m].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for m in 0..self.members.len() {
            self.kill_9(m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port taken between its pick and etcd's bind (here: held by this test) fails
    /// that start only: the cluster starts on new ports. (A full run beside two CPU
    /// burners lost a test to this: "bind: address already in use".)
    #[test]
    fn a_port_taken_before_etcd_binds_it_gives_new_ports() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken_port = taken.local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let mut picks = 0;
        let etcd = Etcd::start_picking(dir.path(), 1, &[], || {
            picks += 1;
            // The first client port is the taken one.
            if picks == 1 {
                taken_port
            } else {
                free_port()
            }
        })
        .expect("etcd starts on new ports");
        assert_eq!(picks, 4, "two ports for the failed start, two for the next");
        assert_ne!(etcd.endpoint(), format!("127.0.0.1:{taken_port}"));
        let port: u16 = etcd.endpoint().rsplit(':').next().unwrap().parse().unwrap();
        let health = crate::http::get(port, "/health").map(|(status, _)| status);
        assert_eq!(health, Some(200));
    }
}
