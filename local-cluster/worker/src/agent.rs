//! The state task: one task owns the jobs, reconciles the desired set, and is told about
//! exits, readiness transitions and acknowledged events over a channel ([`Msg`]). Around
//! it: the registration, heartbeat, facts and assignments tasks (`control.rs`) and the
//! event sender (`events.rs`), which it starts and which never call back into it.

use plugin_api::{HostFacts, JobId, LaunchContext, LaunchPlan};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tracing::Instrument;

use super::client::Client;
use super::config::{collect_facts, ShutdownMode, WorkerConfig, WorkerPlugins};
use super::control::{
    assignments_loop, facts_loop, heartbeat_loop, register, AssignmentsPoll, Reported,
};
use super::events::Outbox;
use super::identity::Identity;
use super::logs;
use super::msg::Msg;
use super::probe;
use super::process;
use super::reconcile::{self, Action, RunState};
use super::state::{self, ExitRecord, JobRecord};
use super::sys::{PidFd, Signal};
use xce_proto::worker::{Assignment, ExitCause, RunningJob, WorkerEvent};

/// How long a shutdown waits for queued events to be acknowledged.
const FLUSH_PATIENCE: Duration = Duration::from_secs(3);
/// The most queued messages the state task takes in one go (it answers nothing else
/// meanwhile, so a flood of exits is recorded in bounded runs).
const MAX_BURST: usize = 1024;

/// A job whose process runs (or is being stopped).
#[derive(Debug)]
struct Job {
    record: JobRecord,
    pidfd: Arc<PidFd>,
    state: RunState,
    watcher: JoinHandle<()>,
    prober: Option<JoinHandle<()>>,
    /// Hands the stop order to the watcher, which enforces the grace.
    stop: Option<oneshot::Sender<process::StopOrder>>,
}

impl Job {
    fn abort_tasks(&mut self) {
        self.watcher.abort();
        if let Some(p) = self.prober.take() {
            p.abort();
        }
    }
}

pub(crate) struct Agent {
    cfg: WorkerConfig,
    plugins: WorkerPlugins,
    client: Client,
    jobs_path: PathBuf,
    logs: PathBuf,
    /// Where the job directories are (`data_dir/jobs`).
    job_dirs: PathBuf,
    jobs: BTreeMap<JobId, Job>,
    /// Exits not acknowledged yet (kept on disk until they are).
    exits: BTreeMap<JobId, JobRecord>,
    /// Jobs that ended on this worker (exited, refused, reported gone): never relaunched.
    ended: BTreeSet<JobId>,
    /// Ended jobs whose `Exited` the controller acknowledged: it knows they ended.
    acked: BTreeSet<JobId>,
    /// Acknowledged ended jobs the controller listed again, whose end was reported again
    /// (once each).
    reported_again: BTreeSet<JobId>,
    /// Running jobs the controller does not list, draining until their stop.
    orphans: BTreeSet<JobId>,
    desired: Vec<Assignment>,
    outbox: Arc<Outbox>,
    tx: mpsc::Sender<Msg>,
    rx: mpsc::Receiver<Msg>,
    /// The facts the controller last accepted.
    facts: watch::Sender<HostFacts>,
    /// What runs, for re-registration.
    running: watch::Sender<Vec<RunningJob>>,
    /// The readiness of the jobs that run and are not being stopped: what heartbeats
    /// assert.
    ready: watch::Sender<BTreeMap<JobId, bool>>,
    /// Wakes the facts loop to report the facts again.
    resend_facts: Arc<tokio::sync::Notify>,
    probe_http: reqwest::Client,
    tasks: JoinSet<()>,
    /// The worker's span (with the host): the parent of every job span, so spans of
    /// tasks spawned while a job span is entered do not nest.
    span: tracing::Span,
    /// Set when a shutdown stops the replicas: their exits are reported as stopped by
    /// the worker, so the controller counts no restart and logs no "ended by itself".
    shutting_down: bool,
    /// Held (flock) for the agent's life.
    _lock: std::fs::File,
    /// The worker instance and the cluster it serves.
    identity: Arc<Identity>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("host", &self.cfg.host)
            .field("jobs", &self.jobs.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// What this worker will do, in one line: an operator checks it first.
fn log_start(cfg: &WorkerConfig, facts: &HostFacts) {
    let sections: Vec<String> = facts
        .sections
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    tracing::info!(
        controller = %cfg.controller,
        ip_addr = %facts.ip_addr.map_or_else(|| "none".to_owned(), |ip| ip.to_string()),
        facts = %sections.join(" "),
        data_dir = %cfg.data_dir.display(),
        stop_timeout = %humantime::format_duration(cfg.stop_timeout),
        "worker starting"
    );
}

fn private_dir(dir: &Path, mode: u32) -> anyhow::Result<()> {
    use anyhow::Context as _;
    xce_stdx::atomic_file::private_dir(dir, mode)
        .with_context(|| format!("creating {} (mode {mode:o})", dir.display()))
}

/// The data dir (0700), the replicas' log directory (0700) and the job directories'
/// parent, as absolute paths: the log path is reported to the controller and shown to
/// operators, who do not know the worker's working directory. When the replicas run as
/// another user, the data dir and `jobs/` are 0711: that user may pass through them to
/// its own job directory, but list and open nothing else.
fn make_dirs(cfg: &WorkerConfig) -> anyhow::Result<(PathBuf, PathBuf)> {
    use anyhow::Context as _;
    let passable = if cfg.replicas.user.is_some() {
        0o711
    } else {
        0o700
    };
    private_dir(&cfg.data_dir, passable)?;
    let logs = cfg.data_dir.join("logs");
    private_dir(&logs, 0o700)?;
    let jobs = cfg.data_dir.join("jobs");
    private_dir(&jobs, passable)?;
    let abs =
        |p: &Path| std::fs::canonicalize(p).with_context(|| format!("resolving {}", p.display()));
    Ok((abs(&logs)?, abs(&jobs)?))
}

/// Replicas can run as another user only when the worker may switch users.
fn check_user(cfg: &WorkerConfig) -> anyhow::Result<()> {
    let Some(u) = &cfg.replicas.user else {
        return Ok(());
    };
    let euid = rustix::process::geteuid().as_raw();
    if euid != 0 && euid != u.uid {
        anyhow::bail!(
            "[replicas] user = {:?} needs a worker running as root (it runs as uid {euid}): \
             only root can start processes as another user",
            u.name
        );
    }
    tracing::info!(user = %u.name, uid = u.uid, gid = u.gid, "replicas run as another user");
    Ok(())
}

/// Locks the data dir (`worker.lock`, held while the file is open): two workers on one
/// data dir would each adopt (and stop) the other's replicas.
fn lock_data_dir(cfg: &WorkerConfig) -> anyhow::Result<std::fs::File> {
    use anyhow::Context as _;
    let lock_path = cfg.data_dir.join("worker.lock");
    let lock = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
    }
    .with_context(|| format!("creating {}", lock_path.display()))?;
    if !super::sys::try_lock(&lock).with_context(|| format!("locking {}", lock_path.display()))? {
        anyhow::bail!(
            "data dir {} is in use by another worker",
            cfg.data_dir.display()
        );
    }
    Ok(lock)
}

// === impl Agent ===

impl Agent {
    /// Prepares the worker: first facts, the controller client, and the jobs of a
    /// previous worker (adopted if still running, reported exited otherwise).
    pub(crate) async fn start(cfg: WorkerConfig, plugins: WorkerPlugins) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let facts = collect_facts(&plugins)
            .await
            .context("collecting host facts")?;
        log_start(&cfg, &facts);
        check_user(&cfg)?;
        let (logs, job_dirs) = make_dirs(&cfg)?;
        let lock = lock_data_dir(&cfg)?;
        // Under the lock: no other worker process reads or writes the identity files.
        let identity = Arc::new(Identity::load(&cfg.data_dir)?);
        tracing::info!(
            instance = %identity.instance(),
            cluster = %identity.cluster().as_deref().unwrap_or("none yet (joins the first controller it registers with)"),
            "worker identity"
        );
        let client = Client::with_ca_file(
            &cfg.controller,
            &cfg.host,
            &cfg.credential,
            identity.clone(),
            cfg.ca_file.as_deref(),
        )?;
        let jobs_path = cfg.data_dir.join("jobs.json");
        let records = state::load(&jobs_path)?;
        let (tx, rx) = mpsc::channel(256);
        let mut agent = Agent {
            client,
            jobs_path,
            logs,
            job_dirs,
            jobs: BTreeMap::new(),
            exits: BTreeMap::new(),
            ended: BTreeSet::new(),
            acked: BTreeSet::new(),
            reported_again: BTreeSet::new(),
            orphans: BTreeSet::new(),
            desired: Vec::new(),
            outbox: Outbox::new(),
            tx,
            rx,
            facts: watch::Sender::new(facts),
            running: watch::Sender::new(Vec::new()),
            ready: watch::Sender::new(BTreeMap::new()),
            resend_facts: Arc::new(tokio::sync::Notify::new()),
            probe_http: probe::http_client(),
            tasks: JoinSet::new(),
            span: tracing::Span::current(),
            shutting_down: false,
            _lock: lock,
            identity,
            cfg,
            plugins,
        };
        for rec in records {
            agent.readopt(rec);
        }
        agent.retain_ended_at_start();
        agent.persist()?;
        agent.publish_running();
        Ok(agent)
    }

    fn readopt(&mut self, mut rec: JobRecord) {
        let span = self.job_span(&rec.job, Some(rec.pid));
        let _e = span.enter();
        if rec.exited.is_none() {
            if let Some(fd) = process::adopt(rec.pid, rec.start_time) {
                tracing::info!(ready = rec.ready, "re-adopted running replica");
                let pidfd = Arc::new(fd);
                let ready = rec.ready;
                let (watcher, stop) = self.spawn_watcher(&rec, pidfd.clone(), None);
                let prober = self.spawn_prober(&rec, ready);
                self.jobs.insert(
                    rec.job.clone(),
                    Job {
                        record: rec,
                        pidfd,
                        state: RunState::Running,
                        watcher,
                        prober,
                        stop: Some(stop),
                    },
                );
                return;
            }
            tracing::info!("replica of a previous worker is gone");
            rec.exited = Some(ExitRecord::of(&ExitCause::default()));
        }
        let cause = rec.exited.map(ExitRecord::cause).unwrap_or_default();
        self.outbox.push(WorkerEvent::exited(
            rec.job.clone(),
            cause,
            Some(self.log_of(&rec.job)),
        ));
        self.ended.insert(rec.job.clone());
        self.exits.insert(rec.job.clone(), rec);
    }

    /// Registers (retrying while the controller is unreachable), then runs until
    /// `shutdown` resolves.
    pub(crate) async fn run<F>(mut self, shutdown: F) -> anyhow::Result<()>
    where
        F: std::future::Future<Output = ShutdownMode>,
    {
        let mut shutdown = std::pin::pin!(shutdown);
        let heartbeat = tokio::select! {
            mode = &mut shutdown => return self.shutdown(mode).await,
            hb = register(&self.client, &self.identity, &self.plugins, &self.facts, &self.running) => hb,
        };
        self.spawn_background(heartbeat);
        // A leave in progress (`ShutdownMode::Leave`): the worker keeps running its
        // replicas' lifecycle until the controller has drained the host.
        let mut leaving = None;
        loop {
            tokio::select! {
                mode = &mut shutdown, if leaving.is_none() => match mode {
                    ShutdownMode::Leave { timeout } => {
                        let client = self.client.clone();
                        let ask = async move { super::leave::leave(&client, timeout).await };
                        leaving = Some(Box::pin(ask.instrument(self.span.clone())));
                    }
                    mode => return self.shutdown(mode).await,
                },
                _ = async { leaving.as_mut().expect("guarded").await }, if leaving.is_some() => {
                    return self.shutdown(ShutdownMode::Detach).await;
                }
                msg = self.rx.recv() => match msg {
                    Some(msg) => self.handle_burst(msg).await?,
                    None => anyhow::bail!("worker state channel closed"),
                },
            }
        }
    }

    fn spawn_background(&mut self, heartbeat: Duration) {
        let span = self.span.clone();
        let reported = Reported {
            facts: self.facts.clone(),
            running: self.running.clone(),
            ready: self.ready.clone(),
            outbox: self.outbox.clone(),
            resend_facts: self.resend_facts.clone(),
            poll: Arc::new(AssignmentsPoll::default()),
        };
        let poll = reported.poll.clone();
        self.tasks.spawn(
            heartbeat_loop(
                self.client.clone(),
                self.identity.clone(),
                self.plugins.clone(),
                heartbeat,
                reported,
            )
            .instrument(span.clone()),
        );
        self.tasks.spawn(
            facts_loop(
                self.client.clone(),
                self.plugins.clone(),
                self.cfg.facts_interval,
                self.facts.clone(),
                self.resend_facts.clone(),
            )
            .instrument(span.clone()),
        );
        self.tasks.spawn(
            assignments_loop(self.client.clone(), self.tx.clone(), poll).instrument(span.clone()),
        );
        self.tasks.spawn(
            self.outbox
                .clone()
                .send_loop(self.client.clone(), self.tx.clone())
                .instrument(span),
        );
    }

    /// Handles `first` and every message already queued behind it (at most
    /// [`MAX_BURST`]), recording runs of exits together: one `jobs.json` write for a
    /// run instead of one per exit, so stopping hundreds of replicas at once costs a few
    /// writes, not hundreds of whole-file writes (each with two fsyncs) in a row.
    async fn handle_burst(&mut self, first: Msg) -> anyhow::Result<()> {
        let mut exits = Vec::new();
        let mut next = Some(first);
        let mut taken = 1;
        while let Some(msg) = next.take() {
            match msg {
                Msg::Exited { job, pid, cause } => exits.push((job, pid, cause)),
                other => {
                    self.on_exits(std::mem::take(&mut exits))?;
                    self.handle(other).await?;
                }
            }
            if taken < MAX_BURST {
                next = self.rx.try_recv().ok();
                taken += 1;
            }
        }
        self.on_exits(exits)
    }

    async fn handle(&mut self, msg: Msg) -> anyhow::Result<()> {
        match msg {
            Msg::Assignments(a) => {
                tracing::info!(index = a.index, jobs = a.jobs.len(), "assignments changed");
                self.desired = a.jobs;
                self.reconcile().await?;
            }
            Msg::Exited { job, pid, cause } => self.on_exits(vec![(job, pid, cause)])?,
            Msg::Ready {
                job,
                pid,
                ready,
                probe,
            } => {
                let Some(j) = self.jobs.get_mut(&job) else {
                    return Ok(());
                };
                if j.record.pid != pid || (!ready && super::sys::pidfd_exited(&j.pidfd)) {
                    // Stale, or the process just died: its exit is the news.
                    return Ok(());
                }
                // A new probe text of a job that stays not ready changes nothing on disk.
                if j.record.ready != ready {
                    j.record.ready = ready;
                    self.persist()?;
                }
                self.outbox
                    .push(WorkerEvent::Readiness { job, ready, probe });
                self.publish_running();
            }
            Msg::OrphanDrained(job) => {
                self.orphans.remove(&job);
                if !self.desired.iter().any(|a| a.job == job) {
                    self.stop(&job);
                }
            }
            Msg::Acked(jobs) => {
                let before = self.exits.len();
                for j in &jobs {
                    self.exits.remove(j);
                    if self.ended.contains(j) {
                        self.acked.insert(j.clone());
                    }
                }
                if self.exits.len() != before {
                    self.persist()?;
                }
            }
        }
        Ok(())
    }

    async fn reconcile(&mut self) -> anyhow::Result<()> {
        let running: BTreeMap<JobId, RunState> = self
            .jobs
            .iter()
            .map(|(k, j)| (k.clone(), j.state))
            .collect();
        let actions = reconcile::reconcile(&self.desired, &running, &self.ended);
        for action in actions {
            match action {
                Action::Launch(job) => {
                    let Some(a) = self.desired.iter().find(|a| a.job == job).cloned() else {
                        continue;
                    };
                    let span = self.job_span(&job, None);
                    self.launch(a).instrument(span).await?;
                }
                Action::Stop(job) => self.stop(&job),
                Action::Orphan(job) => self.drain_orphan(job),
                Action::AlreadyEnded(job) => self.report_ended_again(job),
                Action::ReportGone(job) => {
                    tracing::info!(job = %job, "asked to stop a job that does not run; reporting it exited");
                    self.outbox
                        .push(WorkerEvent::exited(job.clone(), ExitCause::default(), None));
                    self.ended.insert(job);
                }
            }
        }
        // Forget ended jobs the controller no longer lists (it never lists them again),
        // keeping those whose exit it has not acknowledged.
        let listed: BTreeSet<&JobId> = self.desired.iter().map(|a| &a.job).collect();
        let exits = &self.exits;
        self.ended
            .retain(|j| listed.contains(j) || exits.contains_key(j));
        let ended = &self.ended;
        self.acked.retain(|j| ended.contains(j));
        self.reported_again.retain(|j| listed.contains(j));
        Ok(())
    }

    /// A running job the controller does not list: it is in no endpoint, so it keeps
    /// running for `orphan_drain` (clients holding an older list finish with it), then
    /// is stopped unless the controller lists it again meanwhile.
    fn drain_orphan(&mut self, job: JobId) {
        if self.cfg.orphan_drain.is_zero() {
            return self.stop(&job);
        }
        if !self.orphans.insert(job.clone()) {
            return;
        }
        let pid = self.jobs.get(&job).map(|j| j.record.pid);
        let _e = self.job_span(&job, pid).entered();
        tracing::info!(drain = ?self.cfg.orphan_drain, "the controller does not list this replica (its store does not know it); draining it before its stop");
        let (tx, drain) = (self.tx.clone(), self.cfg.orphan_drain);
        // Detached: after a shutdown the send finds the channel closed, and that is all.
        tokio::spawn(async move {
            tokio::time::sleep(drain).await;
            let _ = tx.send(Msg::OrphanDrained(job)).await;
        });
    }

    /// The controller lists a job that already ended here. An end not acknowledged yet
    /// is the answer on its way; one the controller acknowledged and forgot (its store
    /// went back) is reported again (once), saying why.
    fn report_ended_again(&mut self, job: JobId) {
        if !self.acked.contains(&job) || !self.reported_again.insert(job.clone()) {
            return;
        }
        let _e = self.job_span(&job, None).entered();
        let why = format!("job {job} already ran and ended on this worker, and a job id runs at most once: the controller lists it again (was its store restored from a backup?)");
        tracing::warn!("{why}; reporting its end again so the controller replaces it");
        let cause = ExitCause {
            error: Some(why),
            ..ExitCause::default()
        };
        self.outbox.push(WorkerEvent::exited(job, cause, None));
    }

    async fn launch(&mut self, a: Assignment) -> anyhow::Result<()> {
        let Some(plan) = self.prepare(&a).await else {
            return Ok(());
        };
        let log = process::log_path(&self.logs, &a.job);
        let dir = process::job_dir(&self.job_dirs, &a.job);
        let launch = process::Launch {
            argv: &a.command,
            profile_env: &a.env,
            env: &plan.env,
            dir: &dir,
            log: &log,
            settings: &self.cfg.replicas,
        };
        let started = process::make_job_dir(&dir, self.cfg.replicas.user.as_ref())
            .and_then(|()| process::spawn(&launch));
        let spawned = match started {
            Ok(s) => s,
            Err(e) => {
                self.start_failed(a, &e, &log);
                return Ok(());
            }
        };
        tracing::Span::current().record("pid", spawned.pid);
        let (job, pid) = (a.job.clone(), spawned.pid);
        // Without a probe the replica is ready as soon as it runs.
        let ready = a.readiness.is_none();
        self.supervise(a, spawned, plan.sockets, ready);
        // On disk before the controller hears of it: a worker restart re-adopts it.
        if let Err(e) = self.persist() {
            // Unrecorded, the replica would outlive this worker unsupervised.
            if let Some(mut j) = self.jobs.remove(&job) {
                j.abort_tasks();
                process::signal(&j.pidfd, pid, Signal::Kill);
            }
            return Err(e.into());
        }
        tracing::info!(log = %log.display(), "replica started");
        self.outbox.push(WorkerEvent::Started {
            job: job.clone(),
            pid,
            log: Some(log.display().to_string()),
        });
        if ready {
            self.outbox.push(WorkerEvent::Readiness {
                job,
                ready: true,
                probe: None,
            });
        }
        self.publish_running();
        Ok(())
    }

    /// Runs the launch hooks (`XCE_*` env, bind checks) for `a`: the plan they made, or
    /// `None` when one refused (reported to the controller, and the job ended here).
    async fn prepare(&mut self, a: &Assignment) -> Option<LaunchPlan> {
        let cx = LaunchContext {
            job: a.job.clone(),
            service: a.service.clone(),
            project: a.project.clone(),
            replica: a.replica,
            host: self.cfg.host.clone(),
            host_ip: self.facts.borrow().ip_addr,
            grants: a.grants.clone(),
        };
        let mut plan = LaunchPlan::default();
        for hook in &self.plugins.hooks {
            if let Err(refusal) = hook.prepare(&cx, &mut plan).await {
                tracing::warn!(hook = hook.name(), reason = %refusal.reason, "launch refused");
                self.outbox.push(WorkerEvent::Refused {
                    job: a.job.clone(),
                    refusal,
                });
                self.ended.insert(a.job.clone());
                return None;
            }
        }
        Some(plan)
    }

    /// Reports a replica that could not be started as exited, with the cause, and ends
    /// its job here.
    fn start_failed(&mut self, a: Assignment, e: &process::SpawnError, log: &Path) {
        tracing::error!(command = ?a.command, error = %e, log = %log.display(), "cannot start replica");
        let cause = ExitCause {
            // Like a shell: 127 when the program is not there, 126 otherwise (what a
            // controller that predates `error` shows).
            code: Some(e.code()),
            signal: None,
            error: Some(e.to_string()),
            worker_stopped: false,
        };
        self.outbox.push(WorkerEvent::exited(
            a.job.clone(),
            cause,
            Some(log.display().to_string()),
        ));
        self.retain_from_now(&a.job);
        self.ended.insert(a.job);
    }

    /// The files of `job` (its logs, its job directory).
    fn files_of(&self, job: &str) -> logs::JobFiles {
        logs::JobFiles {
            log: process::log_path(&self.logs, job),
            dir: process::job_dir(&self.job_dirs, job),
        }
    }

    /// `job` just ended: its files go `retain` from now.
    fn retain_from_now(&self, job: &str) {
        let at = tokio::time::Instant::now() + self.cfg.replicas.logs.retain;
        logs::remove_at(self.files_of(job), at);
    }

    /// Files of jobs that ended before this worker started (nothing of this worker runs
    /// them) go `retain` after they were last written, which is when their job ended.
    fn retain_ended_at_start(&self) {
        let mut ended = logs::logged_jobs(&self.logs);
        for e in std::fs::read_dir(&self.job_dirs)
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Some(name) = e.file_name().to_str() {
                ended.insert(name.to_owned());
            }
        }
        let running: BTreeSet<String> = self.jobs.keys().map(|j| logs::safe_name(j)).collect();
        let now = (std::time::SystemTime::now(), tokio::time::Instant::now());
        for job in ended.difference(&running) {
            let files = self.files_of(job);
            let ended_at = files.last_written().unwrap_or(now.0);
            let left = (ended_at + self.cfg.replicas.logs.retain)
                .duration_since(now.0)
                .unwrap_or_default();
            logs::remove_at(files, now.1 + left);
        }
    }

    /// Takes a just-spawned replica into the jobs: its exit watcher and its readiness
    /// prober run from now on.
    fn supervise(
        &mut self,
        a: Assignment,
        spawned: process::Spawned,
        sockets: BTreeMap<String, SocketAddr>,
        ready: bool,
    ) {
        let record = JobRecord {
            job: a.job.clone(),
            pid: spawned.pid,
            start_time: spawned.start_time,
            assignment: a,
            sockets,
            ready,
            exited: None,
        };
        if let Some(writer) = spawned.writer {
            process::reap(writer);
        }
        let pidfd = Arc::new(spawned.pidfd);
        let (watcher, stop) = self.spawn_watcher(&record, pidfd.clone(), Some(spawned.child));
        let prober = self.spawn_prober(&record, false);
        self.jobs.insert(
            record.job.clone(),
            Job {
                record,
                pidfd,
                state: RunState::Running,
                watcher,
                prober,
                stop: Some(stop),
            },
        );
    }

    /// The job's log file, as reported to the controller.
    fn log_of(&self, job: &str) -> String {
        process::log_path(&self.logs, job).display().to_string()
    }

    fn job_span(&self, job: &str, pid: Option<u32>) -> tracing::Span {
        tracing::info_span!(parent: &self.span, "job", job = %job, pid)
    }

    fn spawn_watcher(
        &self,
        rec: &JobRecord,
        pidfd: Arc<PidFd>,
        child: Option<std::process::Child>,
    ) -> (JoinHandle<()>, oneshot::Sender<process::StopOrder>) {
        let span = self.job_span(&rec.job, Some(rec.pid));
        let (stop, orders) = oneshot::channel();
        let watcher = tokio::spawn(
            process::watch(
                rec.job.clone(),
                rec.pid,
                pidfd,
                child,
                self.tx.clone(),
                orders,
            )
            .instrument(span),
        );
        (watcher, stop)
    }

    fn spawn_prober(&self, rec: &JobRecord, last: bool) -> Option<JoinHandle<()>> {
        let readiness = rec.assignment.readiness.as_deref().cloned()?;
        let span = self.job_span(&rec.job, Some(rec.pid));
        let pj = probe::ProbeJob {
            job: rec.job.clone(),
            pid: rec.pid,
            start_time: rec.start_time,
            readiness,
            sockets: rec.sockets.clone(),
            last,
        };
        Some(tokio::spawn(
            probe::run(pj, self.probe_http.clone(), self.tx.clone()).instrument(span),
        ))
    }

    /// SIGTERM to the job's group now; its watcher SIGKILLs the group if it is still there
    /// the grace after this SIGTERM, and reports the exit.
    fn stop(&mut self, job: &JobId) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        if j.state == RunState::Stopping {
            return;
        }
        let span = tracing::info_span!(parent: &self.span, "job", job = %job, pid = j.record.pid);
        let _e = span.enter();
        tracing::info!(grace = ?self.cfg.stop_timeout, "stopping replica");
        j.state = RunState::Stopping;
        process::signal(&j.pidfd, j.record.pid, Signal::Term);
        // The grace runs from this replica's own SIGTERM, just sent.
        let order = process::StopOrder {
            sent: tokio::time::Instant::now(),
            grace: self.cfg.stop_timeout,
        };
        if let Some(stop) = j.stop.take() {
            // Fails only when the watcher has ended: the exit is on its way already.
            let _ = stop.send(order);
        }
        // Its readiness is not asserted any more (the controller stops it too).
        self.publish_running();
    }

    /// Records exits (stale ones, of a job's earlier process, are ignored), on disk
    /// before any of them is queued for the controller.
    fn on_exits(&mut self, exits: Vec<(JobId, u32, ExitCause)>) -> anyhow::Result<()> {
        let mut recorded = Vec::with_capacity(exits.len());
        for (job, pid, mut cause) in exits {
            cause.worker_stopped = self.shutting_down;
            match self.jobs.get(&job) {
                Some(j) if j.record.pid == pid => {}
                _ => continue,
            }
            let mut j = self.jobs.remove(&job).expect("checked above");
            j.abort_tasks();
            j.record.exited = Some(ExitRecord::of(&cause));
            self.exits.insert(job.clone(), j.record);
            self.ended.insert(job.clone());
            recorded.push((job, cause));
        }
        if recorded.is_empty() {
            return Ok(());
        }
        self.persist()?;
        if recorded.len() > 1 {
            tracing::debug!(exits = recorded.len(), "recorded exits together");
        }
        for (job, cause) in recorded {
            self.retain_from_now(&job);
            let log = self.log_of(&job);
            self.outbox.push(WorkerEvent::exited(job, cause, Some(log)));
        }
        self.publish_running();
        Ok(())
    }

    fn persist(&self) -> Result<(), state::StateError> {
        let records: Vec<JobRecord> = self
            .jobs
            .values()
            .map(|j| j.record.clone())
            .chain(self.exits.values().cloned())
            .collect();
        state::save(&self.jobs_path, &records)
    }

    fn publish_running(&self) {
        let running = self
            .jobs
            .values()
            .map(|j| RunningJob {
                job: j.record.job.clone(),
                pid: j.record.pid,
                ready: j.record.ready,
            })
            .collect();
        self.running.send_replace(running);
        let ready = self
            .jobs
            .values()
            .filter(|j| j.state == RunState::Running)
            .map(|j| (j.record.job.clone(), j.record.ready))
            .collect();
        self.ready.send_replace(ready);
    }

    async fn shutdown(mut self, mode: ShutdownMode) -> anyhow::Result<()> {
        tracing::info!(?mode, jobs = self.jobs.len(), "worker shutting down");
        if mode == ShutdownMode::StopReplicas {
            self.shutting_down = true;
            let jobs: Vec<JobId> = self.jobs.keys().cloned().collect();
            for job in &jobs {
                self.stop(job);
            }
            // Bounded: every replica is SIGKILLed after the grace.
            let patience = self.cfg.stop_timeout + Duration::from_secs(5);
            let deadline = tokio::time::Instant::now() + patience;
            while !self.jobs.is_empty() {
                let msg = tokio::time::timeout_at(deadline, self.rx.recv()).await;
                match msg {
                    Ok(Some(m @ Msg::Exited { .. })) | Ok(Some(m @ Msg::Acked(_))) => {
                        self.handle(m).await?
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => {
                        tracing::error!(left = self.jobs.len(), "replicas did not exit in time");
                        break;
                    }
                }
            }
        }
        // Assignments and heartbeats end now; the sender keeps going for the flush.
        // Before registration there is no sender to wait for.
        let patience = if self.tasks.is_empty() {
            Duration::ZERO
        } else {
            FLUSH_PATIENCE
        };
        let left = self.outbox.flush(patience).await;
        if left > 0 {
            tracing::warn!(events = left, "events not delivered before shutdown");
        }
        self.tasks.abort_all();
        // Late acknowledgements: drop their exit records.
        while let Ok(msg) = self.rx.try_recv() {
            if let m @ Msg::Acked(_) = msg {
                self.handle(m).await?;
            }
        }
        for j in self.jobs.values_mut() {
            // Detach: the processes keep running; only our watchers end.
            j.abort_tasks();
        }
        self.persist()?;
        Ok(())
    }
}
