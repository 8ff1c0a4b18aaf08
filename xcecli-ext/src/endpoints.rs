//! `xcecli service endpoints`: one read, `--wait-ready`, and `--watch [--exec]`, all one
//! loop over blocking queries.
//!
//! The loop: the first request is an ordinary GET; each later one is a blocking query
//! (`?index=<last>&wait=5m`) that the apiserver answers only when the service changed (or
//! when `wait` runs out, with the same index). So an idle watch costs one open request,
//! never a polling loop. After the first answer, connection failures and 5xx answers are
//! retried with capped exponential backoff, each retry logged on stderr, and the watch
//! resumes from the last index it saw: an apiserver restart loses nothing.
//!
//! What is printed when: a rendering is emitted when it differs from the last one emitted
//! (so an index change that leaves e.g. the `plain` list unchanged prints nothing, and a
//! `--exec` hook runs only when its input changed). With `--exec` the list goes to the
//! command's stdin instead of our stdout; the command's own output is passed through.
//! Successive tables are a blank line apart; with `--watch` each `plain` list ends with a
//! blank line (so an empty list is a blank line of its own, and a reader knows a list is
//! whole when it ends).
//!
//! A watch outlives its service's absence (a sidecar's reload hook starts before the
//! service, and stays when it is stopped): a service that does not exist (404) is waited
//! for — `waiting for service NAME to exist` once on stderr — and one that goes away is
//! reported as an empty list (the `--exec` hook runs with it), then waited for again.
//! The wait is a blocking query from index 0 on the absent name (absent is index 0; a
//! service's index is at least 1), which the apiserver answers when a service of that
//! name the caller may view appears. An apiserver that predates that
//! answers such a query with a 404 at once: then the next look is delayed by a capped
//! backoff ([`ABSENT_BACKOFF_START`] to [`ABSENT_BACKOFF_MAX`]), never a busy loop.
//! One-shot reads and `--wait-ready` without `--watch` still exit 4 on an unknown service.

use crate::cli::{EndpointFormat, EndpointsArgs};
use crate::client::{Answer, Client, EndpointsQuery, ServiceRef};
use crate::error::{CliError, ErrorKind};
use crate::format::{self, EndpointsView};
use crate::io::{warn, write_out, Io};
use crate::model::{self, EndpointEntry};
use retry_backoff::Backoff;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;

/// How long one blocking query may wait on the server (its default, under the 10m cap).
const BLOCK_WAIT: Duration = Duration::from_secs(300);
/// First retry delay after a failure; doubles up to [`BACKOFF_MAX`].
pub(crate) const BACKOFF_START: Duration = Duration::from_millis(200);
/// Longest retry delay.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A blocking query that comes back unchanged faster than this means the server ignored
/// `wait`; the next one is delayed so a misbehaving server cannot make us spin.
pub(crate) const MIN_UNCHANGED_INTERVAL: Duration = Duration::from_secs(1);
/// The first delay between looks for an absent service when the apiserver cannot wait for
/// it (it answered the blocking query with a 404 at once); doubles up to
/// [`ABSENT_BACKOFF_MAX`].
const ABSENT_BACKOFF_START: Duration = Duration::from_secs(1);
/// The longest delay between such looks: how late an old apiserver's watch may notice
/// the service appear.
const ABSENT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Runs the command.
pub(crate) async fn run(args: EndpointsArgs, client: &Client, io: &mut Io) -> Result<(), CliError> {
    if args.all {
        if let Some(f @ (EndpointFormat::Plain | EndpointFormat::Env)) = args.output {
            return Err(CliError::usage(format!(
                "--all shows replicas that are not ready, which -o {} never prints",
                if f == EndpointFormat::Plain {
                    "plain"
                } else {
                    "env"
                }
            ))
            .with_hint("use --all with -o table or -o json"));
        }
    }
    let deadline = args.timeout.map(|t| Instant::now() + t);
    if let Some(want) = args.wait_ready {
        check_wait_ready(&args, want, client, io).await?;
    }
    let mut run = Run {
        args: &args,
        client,
        project: args
            .project
            .project
            .as_deref()
            .or(client.project())
            .map(str::to_owned),
        format: None,
        declared: None,
        last_output: None,
        ready_reached: args.wait_ready.is_none(),
        progress_shown: false,
        last_ready: 0,
        waiting_noted: false,
        seen_ports: BTreeSet::new(),
    };
    let result = run.main_loop(io, deadline).await;
    run.clear_progress(io);
    result
}

/// The state of one run of the command.
struct Run<'a> {
    args: &'a EndpointsArgs,
    client: &'a Client,
    /// The project every query names: the one picked (`--project`, the client's default),
    /// else, once an answer reported it, the service's own. So a watch stays on its
    /// service when another of the caller's projects gets a service of the same name.
    project: Option<String>,
    /// The output format, resolved from the first answer and then fixed.
    format: Option<EndpointFormat>,
    /// The service's declared port names, fetched only when an output needs them.
    declared: Option<Vec<String>>,
    /// The last rendering emitted.
    last_output: Option<String>,
    /// `--wait-ready` was satisfied (or not asked for).
    ready_reached: bool,
    /// A progress line is on the terminal and must be cleared.
    progress_shown: bool,
    /// Ready replicas in the last answer (for the timeout message).
    last_ready: usize,
    /// `waiting for service NAME to exist` was said (it is said once).
    waiting_noted: bool,
    /// Every port name the answers had: when the service is gone (its profile with it),
    /// the empty `-o env` list still clears each `XCE_ENDPOINTS_<PORT>`.
    seen_ports: BTreeSet<String>,
}

// === impl Run ===

impl Run<'_> {
    /// The service the queries are about.
    fn svc(&self) -> ServiceRef<'_> {
        ServiceRef {
            name: &self.args.name,
            project: self.project.as_deref(),
        }
    }

    async fn main_loop(&mut self, io: &mut Io, deadline: Option<Instant>) -> Result<(), CliError> {
        let mut cursor = Cursor::new();
        loop {
            let sent = Instant::now();
            let Some(result) = until(deadline, self.query(io, cursor.block())).await else {
                return self.timed_out();
            };
            let flow = match result {
                Ok(answer) => {
                    self.on_answer(io, &mut cursor, answer, sent, deadline)
                        .await?
                }
                Err(e) if e.kind == ErrorKind::NotFound && self.args.watch => {
                    self.on_absent(io, &mut cursor, sent, deadline).await?
                }
                Err(e) if self.retries(&e, cursor.answered) => {
                    self.on_failure(io, &mut cursor, e, deadline).await?
                }
                Err(e) => return Err(e),
            };
            if flow == Flow::Done {
                return Ok(());
            }
        }
    }

    /// One read of the service's endpoints, a blocking query when `block` is set.
    async fn query(
        &self,
        io: &mut Io,
        block: Option<(u64, Duration)>,
    ) -> Result<Answer<EndpointEntry>, CliError> {
        let query = EndpointsQuery {
            port: self.args.port.as_deref(),
            all: self.args.all,
            block,
        };
        crate::client::read(io, Client::read_patience(), || {
            self.client.endpoints(self.svc(), &query)
        })
        .await
    }

    /// An answer: a failure streak ends, the service's project is learned, the answer is
    /// handled, and a server that ignored `wait` is not asked again at once.
    async fn on_answer(
        &mut self,
        io: &mut Io,
        cursor: &mut Cursor,
        answer: Answer<EndpointEntry>,
        sent: Instant,
        deadline: Option<Instant>,
    ) -> Result<Flow, CliError> {
        if cursor.recover() {
            warn(
                io,
                &format!(
                    "the apiserver at {} answers again (index {})",
                    self.client.api().as_str().trim_end_matches('/'),
                    answer.value.index
                ),
            )?;
        }
        cursor.answered = true;
        if std::mem::take(&mut cursor.absent) {
            cursor.absent_backoff.reset();
        }
        if self.project.is_none() && !answer.value.project.is_empty() {
            self.project = Some(answer.value.project.clone());
        }
        let unchanged = cursor.last_index == Some(answer.value.index);
        cursor.last_index = Some(answer.value.index);
        if self.handle(io, answer).await? == Flow::Done {
            return Ok(Flow::Done);
        }
        let elapsed = sent.elapsed();
        if unchanged && elapsed < MIN_UNCHANGED_INTERVAL {
            return self.pause(deadline, MIN_UNCHANGED_INTERVAL - elapsed).await;
        }
        Ok(Flow::More)
    }

    /// A 404 while watching: the service is absent (or went away), which is reported
    /// ([`gone`](Self::gone)) and then waited for.
    async fn on_absent(
        &mut self,
        io: &mut Io,
        cursor: &mut Cursor,
        sent: Instant,
        deadline: Option<Instant>,
    ) -> Result<Flow, CliError> {
        cursor.answered = true;
        // A blocking query that came back with a 404 at once: this apiserver cannot wait
        // for an absent service. Look again later, not at once.
        let cannot_wait = cursor.absent && sent.elapsed() < MIN_UNCHANGED_INTERVAL;
        cursor.recover();
        cursor.absent = true;
        if !self.gone(io, cursor.last_index).await? {
            // The reader of stdout went away: the watch ends quietly.
            return Ok(Flow::Done);
        }
        if cannot_wait {
            let pause = cursor.absent_backoff.next_pause();
            return self.pause(deadline, pause).await;
        }
        Ok(Flow::More)
    }

    /// A failed query that is retried: said on stderr, then the backoff is waited out.
    async fn on_failure(
        &mut self,
        io: &mut Io,
        cursor: &mut Cursor,
        e: CliError,
        deadline: Option<Instant>,
    ) -> Result<Flow, CliError> {
        // Keep the last index: the next query resumes where we were.
        self.clear_progress(io);
        let resume = match cursor.last_index {
            Some(i) => format!(" (resuming from index {i})"),
            None => String::new(),
        };
        let pause = cursor.backoff.next_pause();
        warn(
            io,
            &format!(
                "{}; retrying in {}{resume}",
                e.message,
                humantime::format_duration(pause)
            ),
        )?;
        cursor.failing = true;
        self.pause(deadline, pause).await
    }

    /// Sleeps `pause`, unless `deadline` comes first: then the run ends as
    /// [`timed_out`](Self::timed_out) says.
    async fn pause(&self, deadline: Option<Instant>, pause: Duration) -> Result<Flow, CliError> {
        match until(deadline, tokio::time::sleep(pause)).await {
            Some(()) => Ok(Flow::More),
            None => self.timed_out().map(|()| Flow::Done),
        }
    }

    /// Whether a failed query is retried: only while watching or waiting, and only when
    /// the apiserver is away or failing (not when it refuses us). Before the first answer
    /// an unreachable apiserver is an error (most likely a wrong `--api`), but a 5xx is
    /// retried: a freshly started apiserver answers 503 until it has caught up.
    fn retries(&self, e: &CliError, answered_before: bool) -> bool {
        let waiting = self.args.watch || self.args.wait_ready.is_some();
        waiting
            && match e.kind {
                ErrorKind::Server => true,
                ErrorKind::Unreachable => answered_before,
                _ => false,
            }
    }

    /// What running out of `--timeout` means: exit 3 while `--wait-ready` waits, the end
    /// of a `--watch` (exit 0, reported as `Ok` by the caller), else a slow apiserver.
    fn timed_out(&self) -> Result<(), CliError> {
        let args = self.args;
        let after = humantime::format_duration(args.timeout.unwrap_or_default());
        Err(match args.wait_ready {
            Some(n) if !self.ready_reached => CliError::new(
                ErrorKind::Timeout,
                format!(
                    "service {} has {} of {n} replicas ready after {after}",
                    args.name, self.last_ready
                ),
            )
            .with_hint("`xcecli service endpoints --all` shows replicas that are not ready"),
            _ if args.watch => return Ok(()),
            _ => CliError::new(
                ErrorKind::Unreachable,
                format!(
                    "no answer from the apiserver at {} within {after}",
                    self.client.api()
                ),
            ),
        })
    }

    /// Handles one answer: progress, rendering, emitting.
    async fn handle(
        &mut self,
        io: &mut Io,
        answer: Answer<EndpointEntry>,
    ) -> Result<Flow, CliError> {
        let args = self.args;
        let entry = &answer.value;
        self.seen_ports
            .extend(entry.endpoints.iter().flat_map(|e| e.ports.keys().cloned()));
        let ready = model::ready(entry).count();
        self.last_ready = ready;
        if !self.ready_reached {
            let want = args.wait_ready.unwrap_or_default() as usize;
            if ready < want {
                if io.stderr_is_tty {
                    let line = format!(
                        "\r\x1b[Kwaiting for service {}: {ready}/{want} replicas ready",
                        args.name
                    );
                    io.stderr.write_all(line.as_bytes()).map_err(CliError::io)?;
                    io.stderr.flush().map_err(CliError::io)?;
                    self.progress_shown = true;
                }
                return Ok(Flow::More);
            }
            self.ready_reached = true;
            self.clear_progress(io);
        }
        let format = match self.format {
            Some(f) => f,
            None => {
                let f = self.resolve_format(io.stdout_is_tty, entry).await;
                self.format = Some(f);
                f
            }
        };
        if format == EndpointFormat::Table && args.port.is_none() && self.declared.is_none() {
            // The entry's ports are a map by name; a table lists them as declared.
            self.declared = Some(self.declared_ports().await);
        }
        if format == EndpointFormat::Env
            && args.port.is_none()
            && model::ready(entry).next().is_none()
            && self.declared.is_none()
        {
            // No ready replica tells us the port names: ask the profile, so that `eval`
            // still clears every XCE_ENDPOINTS_<PORT>.
            self.declared = Some(self.declared_ports().await);
        }
        let view = EndpointsView {
            format,
            port: args.port.as_deref(),
            all: args.all,
            declared: self.declared.as_deref().unwrap_or_default(),
        };
        let output = format::endpoints(view, entry, &answer.raw)?;
        if !self.emit(io, format, output, entry.index).await? {
            return Ok(Flow::Done);
        }
        Ok(if args.watch { Flow::More } else { Flow::Done })
    }

    /// Emits `output` (to stdout, or to the `--exec` hook) unless it is the last one
    /// emitted. `false` when the reader of stdout went away.
    async fn emit(
        &mut self,
        io: &mut Io,
        format: EndpointFormat,
        output: String,
        index: u64,
    ) -> Result<bool, CliError> {
        if self.last_output.as_deref() == Some(output.as_str()) {
            return Ok(true);
        }
        let go_on = match &self.args.exec {
            Some(cmd) => {
                run_hook(io, cmd, &output, index).await?;
                true
            }
            // A watch ends each plain list with a blank line: a reader knows a list is
            // whole as soon as it ends, not only when the next one starts, and an empty
            // list is a blank line of its own.
            None if format == EndpointFormat::Plain && self.args.watch => {
                write_out(io, &format!("{output}\n"))?
            }
            // Successive tables on a terminal: a blank line between them.
            None if format == EndpointFormat::Table && self.last_output.is_some() => {
                write_out(io, &format!("\n{output}"))?
            }
            None => write_out(io, &output)?,
        };
        self.last_output = Some(output);
        Ok(go_on)
    }

    /// The service is not there (404) while watching: before any list, say once that we
    /// wait for it; after one, report the empty list (the `--exec` hook runs with it).
    /// `false` when the reader of stdout went away.
    async fn gone(&mut self, io: &mut Io, last_index: Option<u64>) -> Result<bool, CliError> {
        self.last_ready = 0;
        let Some(format) = self.format.filter(|_| self.last_output.is_some()) else {
            if !std::mem::replace(&mut self.waiting_noted, true) {
                self.clear_progress(io);
                let project = match &self.project {
                    Some(p) => format!(" in project {p}"),
                    None => String::new(),
                };
                writeln!(
                    io.stderr,
                    "waiting for service {}{project} to exist",
                    self.args.name
                )
                .and_then(|()| io.stderr.flush())
                .map_err(CliError::io)?;
            }
            return Ok(true);
        };
        if !self.ready_reached {
            // `--wait-ready` is still waiting: nothing was printed, nothing to take back.
            return Ok(true);
        }
        let empty = EndpointEntry {
            service: self.args.name.clone(),
            project: self.project.clone().unwrap_or_default(),
            index: last_index.unwrap_or(0),
            meta: Default::default(),
            endpoints: Vec::new(),
        };
        let output = match format {
            // For people: say why the list is empty.
            EndpointFormat::Table => format!("service {} does not exist\n", empty.service),
            _ => {
                let raw = serde_json::to_string(&empty).map_err(|e| {
                    CliError::new(
                        ErrorKind::Internal,
                        format!("cannot render an empty entry: {e}"),
                    )
                })?;
                let mut declared = self.declared.clone().unwrap_or_default();
                declared.extend(
                    self.seen_ports
                        .iter()
                        .filter(|p| !declared.contains(p))
                        .cloned()
                        .collect::<Vec<_>>(),
                );
                let view = EndpointsView {
                    format,
                    port: self.args.port.as_deref(),
                    all: self.args.all,
                    declared: &declared,
                };
                format::endpoints(view, &empty, &raw)?
            }
        };
        self.emit(io, format, output, empty.index).await
    }

    /// The default format: table on a terminal (unless `--exec` takes the list); otherwise
    /// plain when one port is printed (`--port`, or the service has one port), else json.
    async fn resolve_format(
        &mut self,
        stdout_is_tty: bool,
        entry: &EndpointEntry,
    ) -> EndpointFormat {
        let args = self.args;
        if let Some(f) = args.output {
            return f;
        }
        // With --exec the list goes to the command's stdin, never to the terminal.
        if stdout_is_tty && args.exec.is_none() {
            return EndpointFormat::Table;
        }
        if args.all {
            return EndpointFormat::Json;
        }
        if args.port.is_some() {
            return EndpointFormat::Plain;
        }
        let mut names: BTreeSet<String> = entry
            .endpoints
            .iter()
            .flat_map(|e| e.ports.keys().cloned())
            .collect();
        if names.is_empty() {
            let declared = self.declared_ports().await;
            names.extend(declared.iter().cloned());
            self.declared = Some(declared);
        }
        if names.len() <= 1 {
            EndpointFormat::Plain
        } else {
            EndpointFormat::Json
        }
    }

    /// The port names of the service's profile, in declaration order; empty if they cannot
    /// be had (the endpoint read succeeded, so this is a best effort for a nicer output,
    /// not a new failure).
    async fn declared_ports(&self) -> Vec<String> {
        let Ok(detail) = self.client.service(self.svc(), None).await else {
            return Vec::new();
        };
        model::declared_ports(&detail.value.profile)
    }

    fn clear_progress(&mut self, io: &mut Io) {
        if self.progress_shown {
            self.progress_shown = false;
            // Best effort: a broken terminal is no reason to fail the command.
            let _ = io.stderr.write_all(b"\r\x1b[K");
            let _ = io.stderr.flush();
        }
    }
}

/// `--wait-ready N` above the service's replica count could never be met: a usage error
/// at once (exit 2) instead of a wait until `--timeout`. An unknown service is left to the
/// main loop (exit 4, or waited for by `--watch`).
async fn check_wait_ready(
    args: &EndpointsArgs,
    want: u32,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let svc = ServiceRef {
        name: &args.name,
        project: args.project.project.as_deref().or(client.project()),
    };
    let detail = match crate::client::read(io, Client::read_patience(), || {
        client.service(svc, None)
    })
    .await
    {
        Ok(d) => d.value,
        Err(e) if e.kind == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if want <= detail.replicas {
        return Ok(());
    }
    Err(CliError::usage(format!(
        "--wait-ready {want} can never be met: service {} has {} replicas",
        detail.name, detail.replicas
    ))
    .with_hint(format!(
        "wait for at most {} ready replicas, or scale the service first (xcecli service scale {} {want})",
        detail.replicas, detail.name
    )))
}

/// Where the main loop is between two queries.
struct Cursor {
    /// The index of the last answer: the next blocking query resumes from it.
    last_index: Option<u64>,
    /// Retry delays while the apiserver is away or failing.
    backoff: Backoff,
    /// The last query failed and is being retried.
    failing: bool,
    /// The apiserver answered at least once (a 404 counts).
    answered: bool,
    /// The service was absent at the last answer (watch only).
    absent: bool,
    /// Delays between looks for an absent service when the apiserver cannot wait for it.
    absent_backoff: Backoff,
}

// === impl Cursor ===

impl Cursor {
    fn new() -> Self {
        Cursor {
            last_index: None,
            backoff: Backoff::new(BACKOFF_START, BACKOFF_MAX),
            failing: false,
            answered: false,
            absent: false,
            absent_backoff: Backoff::new(ABSENT_BACKOFF_START, ABSENT_BACKOFF_MAX),
        }
    }

    /// The blocking part of the next query: none for the first one. Absent is index 0 to
    /// a blocking query: from 0 it waits for the service to appear (a service's index is
    /// at least 1).
    fn block(&self) -> Option<(u64, Duration)> {
        match (self.absent, self.last_index) {
            (true, _) => Some((0, BLOCK_WAIT)),
            (false, i) => i.map(|i| (i, BLOCK_WAIT)),
        }
    }

    /// Ends a failure streak (the retry delays start over); `true` when there was one.
    fn recover(&mut self) -> bool {
        let was = std::mem::take(&mut self.failing);
        if was {
            self.backoff.reset();
        }
        was
    }
}

/// Whether the main loop goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    More,
    Done,
}

/// Runs `fut` until `deadline`; `None` when the deadline came first.
pub(crate) async fn until<F: std::future::Future>(
    deadline: Option<Instant>,
    fut: F,
) -> Option<F::Output> {
    match deadline {
        None => Some(fut.await),
        Some(d) => tokio::time::timeout_at(d, fut).await.ok(),
    }
}

/// Runs `sh -c CMD` with `input` on its stdin and passes its output through. A command
/// that fails (or cannot start) is reported on stderr; it never ends the watch.
async fn run_hook(io: &mut Io, cmd: &str, input: &str, index: u64) -> Result<(), CliError> {
    use std::process::Stdio;
    use tokio::io::AsyncWriteExt;

    let spawned = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return warn(io, &format!("cannot run `{cmd}` (index {index}): {e}")),
    };
    let stdin = child.stdin.take();
    let feed = async move {
        if let Some(mut stdin) = stdin {
            // A command that does not read its stdin closes the pipe early: not an error.
            let _ = stdin.write_all(input.as_bytes()).await;
        }
    };
    let ((), output) = tokio::join!(feed, child.wait_with_output());
    let output = match output {
        Ok(o) => o,
        Err(e) => return warn(io, &format!("cannot run `{cmd}` (index {index}): {e}")),
    };
    io.stdout.write_all(&output.stdout).map_err(CliError::io)?;
    io.stdout.flush().map_err(CliError::io)?;
    io.stderr.write_all(&output.stderr).map_err(CliError::io)?;
    if output.status.success() {
        io.stderr.flush().map_err(CliError::io)
    } else {
        warn(
            io,
            &format!(
                "`{cmd}` failed ({}) for index {index}; still watching",
                output.status
            ),
        )
    }
}
