//! The state task: one task owns the jobs, reconciles the desired set, and is told about
//! exits, readiness transitions and acknowledged events over a channel. Around it: the
//! registration, heartbeat, facts, assignments and event sender tasks.

use plugin_api::{HostFacts, JobId, LaunchContext, LaunchPlan};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tracing::Instrument;

use super::client::{heartbeat_timeout, CallError, Client};
use super::events::{Backoff, Outbox};
use super::identity::Identity;
use super::process;
use super::reconcile::{self, Action, RunState};
use super::state::{self, ExitRecord, JobRecord};
use super::sys::{PidFd, Signal};
use super::{collect_facts, probe, ShutdownMode, WorkerConfig, WorkerPlugins};
use crate::proto::{Assignment, Assignments, ExitCause, RegisterRequest, RunningJob, WorkerEvent};

/// How long a shutdown waits for queued events to be acknowledged.
const FLUSH_PATIENCE: Duration = Duration::from_secs(3);
/// The smallest heartbeat period the worker accepts from the controller.
const MIN_HEARTBEAT: Duration = Duration::from_millis(100);

/// What the other tasks tell the state task.
#[derive(Debug)]
pub(crate) enum Msg {
    /// The desired set changed.
    Assignments(Assignments),
    /// A job's process exited.
    Exited {
        job: JobId,
        pid: u32,
        cause: ExitCause,
    },
    /// A job's readiness changed.
    Ready { job: JobId, pid: u32, ready: bool },
    /// The controller acknowledged the `Exited` events of these jobs.
    Acked(Vec<JobId>),
}

/// A job whose process runs (or is being stopped).
#[derive(Debug)]
struct Job {
    record: JobRecord,
    pidfd: Arc<PidFd>,
    state: RunState,
    watcher: JoinHandle<()>,
    prober: Option<JoinHandle<()>>,
    killer: Option<JoinHandle<()>>,
}

impl Job {
    fn abort_tasks(&mut self) {
        self.watcher.abort();
        if let Some(p) = self.prober.take() {
            p.abort();
        }
        if let Some(k) = self.killer.take() {
            k.abort();
        }
    }
}

pub(crate) struct Agent {
    cfg: WorkerConfig,
    plugins: WorkerPlugins,
    client: Client,
    jobs_path: PathBuf,
    logs: PathBuf,
    jobs: BTreeMap<JobId, Job>,
    /// Exits not acknowledged yet (kept on disk until they are).
    exits: BTreeMap<JobId, JobRecord>,
    /// Jobs that ended on this worker (exited, refused, reported gone): never relaunched.
    ended: BTreeSet<JobId>,
    desired: Vec<Assignment>,
    outbox: Arc<Outbox>,
    tx: mpsc::Sender<Msg>,
    rx: mpsc::Receiver<Msg>,
    /// The facts the controller last accepted.
    facts: watch::Sender<HostFacts>,
    /// What runs, for re-registration.
    running: watch::Sender<Vec<RunningJob>>,
    probe_http: reqwest::Client,
    tasks: JoinSet<()>,
    /// The worker's span (with the host): the parent of every job span, so spans of
    /// tasks spawned while a job span is entered do not nest.
    span: tracing::Span,
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

// === impl Agent ===

impl Agent {
    /// Prepares the worker: first facts, the controller client, and the jobs of a
    /// previous worker (adopted if still running, reported exited otherwise).
    pub(crate) async fn start(cfg: WorkerConfig, plugins: WorkerPlugins) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let facts = collect_facts(&plugins)
            .await
            .context("collecting host facts")?;
        // What this worker will do, in one line: an operator checks it first.
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
        let logs = cfg.data_dir.join("logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        // Absolute: the path is reported to the controller and shown to operators, who
        // do not know the worker's working directory.
        let logs = std::fs::canonicalize(&logs)
            .with_context(|| format!("resolving {}", logs.display()))?;
        // Two workers on one data dir would each adopt (and stop) the other's replicas.
        let lock_path = cfg.data_dir.join("worker.lock");
        let lock = std::fs::File::create(&lock_path)
            .with_context(|| format!("creating {}", lock_path.display()))?;
        if !super::sys::try_lock(&lock)
            .with_context(|| format!("locking {}", lock_path.display()))?
        {
            anyhow::bail!(
                "data dir {} is in use by another worker",
                cfg.data_dir.display()
            );
        }
        // Under the lock: no other worker process reads or writes the identity files.
        let identity = Arc::new(Identity::load(&cfg.data_dir)?);
        tracing::info!(
            instance = %identity.instance(),
            cluster = %identity.cluster().as_deref().unwrap_or("none yet (joins the first controller it registers with)"),
            "worker identity"
        );
        let client = Client::new(
            &cfg.controller,
            &cfg.host,
            &cfg.credential,
            identity.clone(),
        )?;
        let jobs_path = cfg.data_dir.join("jobs.json");
        let records = state::load(&jobs_path)?;
        let (tx, rx) = mpsc::channel(256);
        let mut agent = Agent {
            client,
            jobs_path,
            logs,
            jobs: BTreeMap::new(),
            exits: BTreeMap::new(),
            ended: BTreeSet::new(),
            desired: Vec::new(),
            outbox: Outbox::new(),
            tx,
            rx,
            facts: watch::Sender::new(facts),
            running: watch::Sender::new(Vec::new()),
            probe_http: probe::http_client(),
            tasks: JoinSet::new(),
            span: tracing::Span::current(),
            _lock: lock,
            identity,
            cfg,
            plugins,
        };
        for rec in records {
            agent.readopt(rec);
        }
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
                let watcher = self.spawn_watcher(&rec, pidfd.clone(), None);
                let prober = self.spawn_prober(&rec, ready);
                self.jobs.insert(
                    rec.job.clone(),
                    Job {
                        record: rec,
                        pidfd,
                        state: RunState::Running,
                        watcher,
                        prober,
                        killer: None,
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
        loop {
            tokio::select! {
                mode = &mut shutdown => return self.shutdown(mode).await,
                msg = self.rx.recv() => match msg {
                    Some(msg) => self.handle(msg).await?,
                    None => anyhow::bail!("worker state channel closed"),
                },
            }
        }
    }

    fn spawn_background(&mut self, heartbeat: Duration) {
        let span = self.span.clone();
        self.tasks.spawn(
            heartbeat_loop(
                self.client.clone(),
                self.identity.clone(),
                self.plugins.clone(),
                heartbeat,
                self.facts.clone(),
                self.running.clone(),
            )
            .instrument(span.clone()),
        );
        self.tasks.spawn(
            facts_loop(
                self.client.clone(),
                self.plugins.clone(),
                self.cfg.facts_interval,
                self.facts.clone(),
            )
            .instrument(span.clone()),
        );
        self.tasks
            .spawn(assignments_loop(self.client.clone(), self.tx.clone()).instrument(span.clone()));
        self.tasks.spawn(
            self.outbox
                .clone()
                .send_loop(self.client.clone(), self.tx.clone())
                .instrument(span),
        );
    }

    async fn handle(&mut self, msg: Msg) -> anyhow::Result<()> {
        match msg {
            Msg::Assignments(a) => {
                tracing::info!(index = a.index, jobs = a.jobs.len(), "assignments changed");
                self.desired = a.jobs;
                self.reconcile().await?;
            }
            Msg::Exited { job, pid, cause } => self.on_exit(job, pid, cause)?,
            Msg::Ready { job, pid, ready } => {
                let Some(j) = self.jobs.get_mut(&job) else {
                    return Ok(());
                };
                if j.record.pid != pid || (!ready && super::sys::pidfd_exited(&j.pidfd)) {
                    // Stale, or the process just died: its exit is the news.
                    return Ok(());
                }
                j.record.ready = ready;
                self.persist()?;
                self.outbox.push(WorkerEvent::Readiness { job, ready });
                self.publish_running();
            }
            Msg::Acked(jobs) => {
                let before = self.exits.len();
                for j in &jobs {
                    self.exits.remove(j);
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
        Ok(())
    }

    async fn launch(&mut self, a: Assignment) -> anyhow::Result<()> {
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
                self.ended.insert(a.job);
                return Ok(());
            }
        }
        let log = process::log_path(&self.logs, &a.job);
        let spawned = match process::spawn(&a.command, &plan.env, &log) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(command = ?a.command, error = %e, log = %log.display(), "cannot start replica");
                process::note_in_log(&log, &e.to_string());
                let cause = ExitCause {
                    // Like a shell: 127 when the program is not there, 126 otherwise
                    // (what a controller that predates `error` shows).
                    code: Some(e.code()),
                    signal: None,
                    error: Some(e.to_string()),
                };
                self.outbox.push(WorkerEvent::exited(
                    a.job.clone(),
                    cause,
                    Some(log.display().to_string()),
                ));
                self.ended.insert(a.job);
                return Ok(());
            }
        };
        tracing::Span::current().record("pid", spawned.pid);
        // Without a probe the replica is ready as soon as it runs.
        let ready = a.readiness.is_none();
        let record = JobRecord {
            job: a.job.clone(),
            pid: spawned.pid,
            start_time: spawned.start_time,
            assignment: a,
            sockets: plan.sockets,
            ready,
            exited: None,
        };
        let pidfd = Arc::new(spawned.pidfd);
        let watcher = self.spawn_watcher(&record, pidfd.clone(), Some(spawned.child));
        let prober = self.spawn_prober(&record, false);
        let job = record.job.clone();
        let pid = record.pid;
        self.jobs.insert(
            job.clone(),
            Job {
                record,
                pidfd,
                state: RunState::Running,
                watcher,
                prober,
                killer: None,
            },
        );
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
            self.outbox
                .push(WorkerEvent::Readiness { job, ready: true });
        }
        self.publish_running();
        Ok(())
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
    ) -> JoinHandle<()> {
        let span = self.job_span(&rec.job, Some(rec.pid));
        tokio::spawn(
            process::watch(rec.job.clone(), rec.pid, pidfd, child, self.tx.clone())
                .instrument(span),
        )
    }

    fn spawn_prober(&self, rec: &JobRecord, last: bool) -> Option<JoinHandle<()>> {
        let readiness = rec.assignment.readiness.clone()?;
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

    /// SIGTERM to the job's group now, SIGKILL after the grace; the watcher reports the
    /// exit.
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
        let pidfd = j.pidfd.clone();
        let pid = j.record.pid;
        let grace = self.cfg.stop_timeout;
        j.killer = Some(tokio::spawn(
            async move {
                tokio::time::sleep(grace).await;
                tracing::warn!("replica did not stop within the grace; killing it");
                process::signal(&pidfd, pid, Signal::Kill);
            }
            .instrument(span.clone()),
        ));
    }

    fn on_exit(&mut self, job: JobId, pid: u32, cause: ExitCause) -> anyhow::Result<()> {
        match self.jobs.get(&job) {
            Some(j) if j.record.pid == pid => {}
            _ => return Ok(()),
        }
        let mut j = self.jobs.remove(&job).expect("checked above");
        j.abort_tasks();
        j.record.exited = Some(ExitRecord::of(&cause));
        self.exits.insert(job.clone(), j.record);
        self.ended.insert(job.clone());
        self.persist()?;
        let log = self.log_of(&job);
        self.outbox.push(WorkerEvent::exited(job, cause, Some(log)));
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
    }

    async fn shutdown(mut self, mode: ShutdownMode) -> anyhow::Result<()> {
        tracing::info!(?mode, jobs = self.jobs.len(), "worker shutting down");
        if mode == ShutdownMode::StopReplicas {
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

/// Registers with the controller, retrying with capped backoff until it answers.
/// Returns the heartbeat period. Joins the controller's cluster if this worker has none
/// yet. A refusal (another live worker holds the host, or the controller serves another
/// cluster) is retried the same way: nothing is launched or stopped meanwhile, as
/// assignments are only asked for once registered.
async fn register(
    client: &Client,
    identity: &Identity,
    plugins: &WorkerPlugins,
    facts: &watch::Sender<HostFacts>,
    running: &watch::Sender<Vec<RunningJob>>,
) -> Duration {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    // A refused credential needs an operator: retried slower, up to twice a minute.
    let mut refused = Backoff::new(REFUSED_BACKOFF_START, REFUSED_BACKOFF_MAX);
    loop {
        let req = RegisterRequest {
            facts: facts.borrow().clone(),
            running: running.borrow().clone(),
        };
        match client.register(&req).await {
            Ok(resp) => {
                if let Some(cluster) = &resp.cluster {
                    match identity.join(cluster) {
                        Ok(true) => {
                            tracing::info!(cluster = %cluster, "joined the cluster; this worker serves it from now on")
                        }
                        Ok(false) => {}
                        // Remembered in memory for this run; the next start joins again.
                        Err(e) => {
                            tracing::error!(cluster = %cluster, error = %e, "cannot remember the cluster joined")
                        }
                    }
                }
                tracing::info!(
                    running = req.running.len(),
                    heartbeat_ms = resp.heartbeat_ms,
                    cluster = %resp.cluster.as_deref().unwrap_or("none"),
                    instance = %identity.instance(),
                    "registered with the controller"
                );
                return Duration::from_millis(resp.heartbeat_ms).max(MIN_HEARTBEAT);
            }
            Err(e) if e.refused() => {
                let wait = refused.next();
                tracing::error!(
                    problem = %e,
                    fix = refusal_fix(&e),
                    retry_in = %format_args!("{:.1}s", wait.as_secs_f64()),
                    "controller refused the worker credential"
                );
                tokio::time::sleep(wait).await;
            }
            Err(e) => {
                refused.reset();
                let wait = backoff.next();
                match e.status().map(|s| s.as_u16()) {
                    _ if matches!(e, CallError::WrongCluster { .. }) => {
                        tracing::error!(error = %e, retry_in = ?wait, "registration refused: the controller belongs to another cluster; the replicas keep running untouched")
                    }
                    Some(409) if e.code().as_deref() == Some("host_taken") => {
                        tracing::error!(error = %e.message(), instance = %identity.instance(), retry_in = ?wait, "registration refused: another live worker holds this host; nothing is launched or stopped until it is gone")
                    }
                    Some(409) if e.code().as_deref() == Some("wrong_cluster") => {
                        tracing::error!(error = %e.message(), retry_in = ?wait, "registration refused: the controller belongs to another cluster; the replicas keep running untouched")
                    }
                    Some(400) => {
                        let body = match &e {
                            CallError::Status { body, .. } => body.as_str(),
                            _ => "",
                        };
                        for problem in problems(body) {
                            tracing::error!(%problem, retry_in = ?wait, "controller refused the registration");
                        }
                        // The facts may have been the problem: retry with fresh ones.
                        match collect_facts(plugins).await {
                            Ok(fresh) => {
                                facts.send_replace(fresh);
                            }
                            Err(e) => tracing::warn!(error = %e, "re-reading host facts failed"),
                        }
                    }
                    _ => {
                        tracing::warn!(error = %e, retry_in = ?wait, "registration failed; retrying")
                    }
                }
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// The first and the longest pause between registrations the controller refused (401,
/// 403): exponential between them.
const REFUSED_BACKOFF_START: Duration = Duration::from_secs(1);
const REFUSED_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// What the operator changes to fix a refused credential, by the controller's error code.
fn refusal_fix(e: &CallError) -> &'static str {
    match (e.status().map(|s| s.as_u16()), e.code().as_deref()) {
        (_, Some("no_worker_entry")) => {
            "add a [[worker]] entry for this host, with this worker's credential as its secret, to the controller's tokens file and restart the controller"
        }
        (Some(401), _) => {
            "set `credential` in this worker's config to the secret of this host's [[worker]] entry in the controller's tokens file"
        }
        _ => "set `credential` to this host's own [[worker]] secret, not another host's or a user token",
    }
}

/// Heartbeats every `period`, counted from the start of the previous one (a beat that
/// timed out on a frozen controller is followed at once by the next, which starts at
/// another controller). Each waits at most [`heartbeat_timeout`] for its answer.
async fn heartbeat_loop(
    client: Client,
    identity: Arc<Identity>,
    plugins: WorkerPlugins,
    mut period: Duration,
    facts: watch::Sender<HostFacts>,
    running: watch::Sender<Vec<RunningJob>>,
) {
    // Only the first failure of a streak is a warning (the period may be short).
    let mut failing = false;
    let mut next = tokio::time::Instant::now() + period;
    loop {
        tokio::time::sleep_until(next).await;
        next = tokio::time::Instant::now() + period;
        match client.heartbeat(heartbeat_timeout(period)).await {
            Ok(()) => {
                if std::mem::take(&mut failing) {
                    tracing::info!("heartbeats go through again");
                }
            }
            Err(e) if e.status().map(|s| s.as_u16()) == Some(404) => {
                tracing::warn!("controller does not know this host; registering again");
                period = register(&client, &identity, &plugins, &facts, &running).await;
                next = tokio::time::Instant::now() + period;
            }
            // Another instance took the host over (this one was gone too long), or the
            // controller is another cluster's: registering again says so, and waits.
            Err(e)
                if matches!(e, CallError::WrongCluster { .. })
                    || e.status().map(|s| s.as_u16()) == Some(409) =>
            {
                tracing::error!(error = %e, "heartbeat refused; registering again");
                period = register(&client, &identity, &plugins, &facts, &running).await;
                next = tokio::time::Instant::now() + period;
            }
            // The credential is refused now (the tokens file changed): registering again
            // says why, once per retry, and backs off, instead of a refused heartbeat
            // every period.
            Err(e) if e.refused() => {
                tracing::debug!(error = %e, "heartbeat refused; registering again");
                period = register(&client, &identity, &plugins, &facts, &running).await;
                next = tokio::time::Instant::now() + period;
            }
            Err(e) if failing => tracing::debug!(error = %e, "heartbeat failed"),
            Err(e) => {
                failing = true;
                tracing::warn!(error = %e, "heartbeat failed");
            }
        }
    }
}

/// Re-reads the facts every `interval` and reports them when they differ from the last
/// report (accepted or refused: a refused report is not repeated until the facts change).
async fn facts_loop(
    client: Client,
    plugins: WorkerPlugins,
    interval: Duration,
    accepted: watch::Sender<HostFacts>,
) {
    let mut last_sent = accepted.borrow().clone();
    loop {
        tokio::time::sleep(interval).await;
        let facts = match collect_facts(&plugins).await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "re-reading host facts failed; keeping the last ones");
                continue;
            }
        };
        if facts == last_sent {
            continue;
        }
        match client.put_facts(&facts).await {
            Ok(()) => {
                tracing::info!(ip_addr = %facts.ip_addr.map_or_else(|| "none".to_owned(), |ip| ip.to_string()), "host facts changed; reported");
                last_sent = facts.clone();
                accepted.send_replace(facts);
            }
            Err(CallError::Status { status, body }) if status.as_u16() == 400 => {
                for problem in problems(&body) {
                    tracing::error!(%problem, "controller refused the host facts");
                }
                last_sent = facts;
            }
            Err(e) if e.refused() => {
                tracing::debug!(error = %e, "reporting host facts refused; will retry")
            }
            Err(e) => tracing::warn!(error = %e, "reporting host facts failed; will retry"),
        }
    }
}

/// The problems of an `ApiError` body (`{"error": {"message", "details": [...]}}`), or the
/// raw body when it is not one.
fn problems(body: &str) -> Vec<String> {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let err = parsed.as_ref().and_then(|v| v.get("error"));
    let details: Vec<String> = err
        .and_then(|e| e.get("details"))
        .and_then(|d| d.as_array())
        .map(|d| {
            d.iter()
                .filter_map(|p| serde_json::from_value::<plugin_api::FieldError>(p.clone()).ok())
                .map(|p| p.to_string())
                .collect()
        })
        .unwrap_or_default();
    if !details.is_empty() {
        return details;
    }
    match err.and_then(|e| e.get("message")).and_then(|m| m.as_str()) {
        Some(m) => vec![m.to_owned()],
        None => vec![body.to_owned()],
    }
}

/// The blocking query loop: one outstanding request; the controller answers when the
/// host's desired set changes (or the wait runs out). After a failure it backs off, but
/// retries at once when a controller answers another call (the heartbeats found the new
/// leader), so it does not lag a takeover by a whole backoff.
async fn assignments_loop(client: Client, owner: mpsc::Sender<Msg>) {
    let mut index = 0;
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let mut answers = client.answers();
    loop {
        answers.borrow_and_update();
        match client.assignments(index).await {
            Ok(a) => {
                backoff.reset();
                // Any other index is news; a lower one means the controller started over.
                if a.index != index {
                    index = a.index;
                    if owner.send(Msg::Assignments(a)).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let wait = backoff.next();
                if e.refused() {
                    // The registration loop the heartbeats fall back to says why.
                    tracing::debug!(error = %e, retry_in = ?wait, "assignments query refused");
                } else {
                    tracing::warn!(error = %e, retry_in = ?wait, "assignments query failed");
                }
                if sleep_or_answer(wait, &mut answers).await {
                    backoff.reset();
                }
            }
        }
    }
}

/// Sleeps `wait`, or less when a controller answers meanwhile (`true` then).
pub(crate) async fn sleep_or_answer(
    wait: Duration,
    answers: &mut watch::Receiver<(u64, usize)>,
) -> bool {
    tokio::select! {
        () = tokio::time::sleep(wait) => false,
        changed = answers.changed() => changed.is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: &str, expect: expect_test::Expect) {
        expect.assert_eq(&problems(body).join("\n"));
    }

    #[test]
    fn lists_every_problem_of_a_refusal() {
        check(
            r#"{"error": {"code": "invalid", "message": "bad facts", "details": [
                {"field": "ip_addr", "reason": "not an address of the host"},
                {"field": "sections.ports.range", "reason": "empty"}]}}"#,
            expect_test::expect![[r#"
                ip_addr: not an address of the host
                sections.ports.range: empty"#]],
        );
        check(
            r#"{"error": {"code": "invalid", "message": "bad facts", "details": []}}"#,
            expect_test::expect!["bad facts"],
        );
        check("oops", expect_test::expect!["oops"]);
    }
}
