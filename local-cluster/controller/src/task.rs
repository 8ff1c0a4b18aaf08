//! The single task that owns the controller's state: it receives commands over a channel,
//! applies them to the [`Core`], settles (removes stopped services, places replicas,
//! publishes) and answers. Timers are one `sleep_until` on the next deadline.

use super::core::{Applied, Core, CoreError, HostAction, HostAssignments, LeaveStatus, Report};
use plugin_api::{HostFacts, HostId, Principal, ServiceKey};
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use xce_proto::worker::{Caller, Heartbeat, HeartbeatAnswer, RegisterRequest, RegisterResponse};

type Reply<T> = oneshot::Sender<Result<T, CoreError>>;

/// At most this many queued commands are handled before due timers.
const QUEUED_BEFORE_TIMERS: usize = 1024;
/// At most this many queued commands are applied before one settle answers them all.
/// A settle (placement passes, then publishing the readers' view and the assignments)
/// costs about as much as the state is large, whatever one command changed: with a
/// thousand workers reporting at once, settling after each report made placing n
/// replicas O(n²) and queued heartbeats behind the rebuilds. Bounded, so the first
/// command of a burst waits for at most this many others.
pub(super) const COMMANDS_PER_SETTLE: usize = 256;
/// A batch of queued commands also ends once this many committed events wait for its
/// settle to announce them. Each is a copy of what changed (a job's event owns its
/// `JobInfo`), so 256 worker reports of up to 256 events each held a copy of every
/// replica's record at once: the controller's heap peak in a heap profile (50 hosts,
/// 2,000 replicas: 0.7 KB per replica). Bounded, it is a few MB whatever the scale.
pub(super) const EVENTS_PER_SETTLE: usize = 4096;

/// A request to the state task.
#[derive(Debug)]
pub(crate) enum Command {
    /// `path`: the name of a `PUT` (create or update); none for a `POST` (create only).
    Submit {
        doc: Value,
        path: Option<String>,
        who: Principal,
        reply: Reply<(ServiceKey, Applied)>,
    },
    Scale {
        key: ServiceKey,
        replicas: u64,
        who: Principal,
        reply: Reply<()>,
    },
    Restart {
        key: ServiceKey,
        who: Principal,
        reply: Reply<()>,
    },
    Delete {
        key: ServiceKey,
        now: bool,
        who: Principal,
        reply: Reply<usize>,
    },
    Register {
        host: HostId,
        caller: Caller,
        req: RegisterRequest,
        reply: Reply<RegisterResponse>,
    },
    Heartbeat {
        host: HostId,
        caller: Caller,
        /// The worker's digests (absent from a worker without a session).
        beat: Option<Heartbeat>,
        reply: Reply<Option<HeartbeatAnswer>>,
    },
    Facts {
        host: HostId,
        caller: Caller,
        facts: HostFacts,
        reply: Reply<()>,
    },
    /// A worker's events report (queued with the others of its burst, see [`Burst`]).
    Events { report: Report, reply: Reply<()> },
    Assignments {
        host: HostId,
        caller: Caller,
        reply: Reply<watch::Receiver<Arc<HostAssignments>>>,
    },
    /// An operator's cordon, uncordon or drain of a host.
    Maintain {
        host: HostId,
        action: HostAction,
        who: Principal,
        reply: Reply<()>,
    },
    /// A worker leaving (`xced worker --leave`): its host drains.
    Leave {
        host: HostId,
        caller: Caller,
        reply: Reply<LeaveStatus>,
    },
    /// The separate apiservers' registrations changed (`core/acks.rs`): no answer.
    Fleet {
        registrations: Vec<xce_store::etcd::fleet::Registration>,
    },
}

/// Spawns the state task. On a multi-threaded runtime it gets a thread of its own (a
/// blocking-pool thread driving it with `Handle::block_on`; the runtime's timers are still
/// its timers) instead of running on the workers. Why: glibc's malloc gives each thread
/// its own arena and reuses a freed chunk only in the arena it came from. On the workers
/// the task moved between threads (every store commit is a `block_in_place`, which hands
/// the worker to another thread), so the model's records and each settle's transient
/// copies were spread over several arenas, each keeping its own high-water mark: RSS per
/// replica was 1.5-2x the live heap (`MALLOC_ARENA_MAX=1` took a quarter off it, at more
/// CPU). On one thread, what a settle frees is what the next one reuses (RSS per replica
/// at 50,000 replicas 3.3-3.5 KB -> 2.3-2.5 KB with compact grants, integration-tests
/// README).
pub(super) fn spawn(
    task: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let rt = tokio::runtime::Handle::current();
    match rt.runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::spawn_blocking(move || rt.block_on(task))
        }
        // A current-thread runtime (tests, paused clocks) has no thread to spare.
        _ => tokio::spawn(task),
    }
}

/// Runs until `shutdown` turns true, every command sender is gone, or the store says this
/// controller's view is stale (then the reason goes to `fatal`, and the task ends: every
/// further commit would fail, and reads would serve a view nobody can change any more).
pub(crate) async fn run(
    mut core: Core,
    mut rx: mpsc::Receiver<Command>,
    mut shutdown: watch::Receiver<bool>,
    fatal: watch::Sender<Option<String>>,
) {
    // The first pass places what the stored state leaves pending.
    core.settle(Instant::now());
    loop {
        if let Some(reason) = core.fatal() {
            tracing::error!(%reason, "controller state task stops: the store needs a reload");
            let _ = fatal.send(Some(reason.to_owned()));
            break;
        }
        // A pause of this process (seen by its beat thread) is credited to the hosts
        // before anything judges them.
        core.notice_pause(Instant::now(), None);
        let deadline = core.next_deadline(Instant::now());
        let timer = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(cmd) => {
                    // Woken past the deadline (both branches were ready; this one was
                    // picked): a pause is judged before this command, whose heartbeat
                    // would move the deadline on and hide it from the timer branch.
                    let due = deadline.is_some_and(|d| Instant::now() >= d);
                    if due {
                        core.notice_pause(Instant::now(), deadline);
                    }
                    let mut burst = Burst::default();
                    burst.take(&mut core, cmd);
                    // A deadline already past means the timer branch is due too: leave the
                    // queue to it. It takes queued worker messages before judging hosts,
                    // which draining every queued heartbeat here would delay.
                    while !due && burst.room(&core) && core.fatal().is_none() {
                        match rx.try_recv() {
                            Ok(cmd) => burst.take(&mut core, cmd),
                            Err(_) => break,
                        }
                    }
                    burst.settle_and_answer(&mut core);
                }
                None => break,
            },
            () = timer => {
                // Worker messages queued while the loop was busy (or paused) come before
                // the timers that would judge their hosts; bounded, so a steady stream of
                // messages cannot starve the timers.
                let mut burst = Burst::default();
                for _ in 0..QUEUED_BEFORE_TIMERS {
                    match rx.try_recv() {
                        Ok(cmd) => burst.take(&mut core, cmd),
                        Err(_) => break,
                    }
                    if !burst.room(&core) {
                        std::mem::take(&mut burst).settle_and_answer(&mut core);
                    }
                }
                burst.settle_and_answer(&mut core);
                let now = Instant::now();
                core.tick(now, deadline);
                core.mark_dirty();
                core.settle(now);
            }
            _ = shutdown.wait_for(|s| *s) => break,
        }
    }
    tracing::info!("controller state task stopped");
}

/// A command's answer, sent once the state it led to is settled.
type Answer = Box<dyn FnOnce() + Send>;

/// The commands of one batch: applied, answered after one settle. Worker reports wait
/// in `reports` and are applied together ([`Core::reports`]: a few store commits for
/// the lot) before the next command that may read or write what they change, or the
/// settle, so every such command still sees the ones before it, in order. Heartbeats of
/// ready hosts and assignments queries (a thousand workers send a heartbeat a second
/// each, and a query after each change) do not end the run.
#[derive(Default)]
struct Burst {
    answers: Vec<Answer>,
    reports: Vec<(Report, Reply<()>)>,
    /// The worker events in `reports`.
    events: usize,
}

impl Burst {
    /// Applies `cmd`, or queues it with the reports before it.
    fn take(&mut self, core: &mut Core, cmd: Command) {
        match cmd {
            Command::Events { report, reply } => {
                self.events += report.events.len();
                self.reports.push((report, reply));
            }
            // Neither reads nor writes what a report changes (a heartbeat of a ready host
            // commits nothing, an assignments query is answered after the settle): it
            // leaves the reports queued, so a burst's reports still share batches.
            Command::Heartbeat { ref host, .. } if !core.heartbeat_writes(host) => {
                self.answers.push(handle(core, cmd));
            }
            cmd @ Command::Assignments { .. } => self.answers.push(handle(core, cmd)),
            cmd => {
                self.apply_reports(core);
                self.answers.push(handle(core, cmd));
            }
        }
    }

    /// Whether another command may join: at most [`COMMANDS_PER_SETTLE`] commands and
    /// about [`EVENTS_PER_SETTLE`] events waiting for the settle.
    fn room(&self, core: &Core) -> bool {
        self.answers.len() + self.reports.len() < COMMANDS_PER_SETTLE
            && core.unannounced() + self.events < EVENTS_PER_SETTLE
    }

    fn apply_reports(&mut self, core: &mut Core) {
        if self.reports.is_empty() {
            return;
        }
        let (reports, replies): (Vec<Report>, Vec<Reply<()>>) =
            std::mem::take(&mut self.reports).into_iter().unzip();
        self.events = 0;
        let results = core.reports(reports, Instant::now());
        for (reply, r) in replies.into_iter().zip(results) {
            self.answers.push(done(reply, r));
        }
    }

    /// Applies the reports still queued, settles, then answers: every answer (and the
    /// view its handler reads next) includes the placements its command made possible.
    fn settle_and_answer(mut self, core: &mut Core) {
        self.apply_reports(core);
        if self.answers.is_empty() {
            return;
        }
        core.settle(Instant::now());
        for answer in self.answers {
            answer();
        }
    }
}

fn done<T: Send + 'static>(reply: Reply<T>, r: Result<T, CoreError>) -> Answer {
    Box::new(move || {
        let _ = reply.send(r);
    })
}

/// Applies one command to the core; its answer waits for the next settle.
fn handle(core: &mut Core, cmd: Command) -> Answer {
    let now = Instant::now();
    match cmd {
        Command::Submit {
            doc,
            path,
            who,
            reply,
        } => {
            let r = core.submit(doc, path.as_deref(), &who, now);
            done(reply, r)
        }
        Command::Scale {
            key,
            replicas,
            who,
            reply,
        } => {
            let r = core.scale(&key, replicas, &who, now);
            done(reply, r)
        }
        Command::Restart { key, who, reply } => {
            let r = core.restart(&key, &who, now);
            done(reply, r)
        }
        Command::Delete {
            key,
            now: now_please,
            who,
            reply,
        } => {
            let r = core.delete(&key, now_please, &who, now);
            done(reply, r)
        }
        Command::Register {
            host,
            caller,
            req,
            reply,
        } => {
            let r = core.register(&host, &caller, req, now);
            done(reply, r)
        }
        Command::Heartbeat {
            host,
            caller,
            beat,
            reply,
        } => {
            let r = core.heartbeat(&host, &caller, beat.as_ref(), now);
            done(reply, r)
        }
        Command::Facts {
            host,
            caller,
            facts,
            reply,
        } => {
            let r = core.facts(&host, &caller, facts, now);
            done(reply, r)
        }
        // A burst queues reports (`Burst::take`); one alone is the same path.
        Command::Events { report, reply } => {
            let r = core.reports(vec![report], now).pop();
            done(reply, r.expect("one result per report"))
        }
        Command::Assignments {
            host,
            caller,
            reply,
        } => {
            let r = core.assignments(&host, &caller);
            done(reply, r)
        }
        cmd @ (Command::Maintain { .. } | Command::Leave { .. } | Command::Fleet { .. }) => {
            handle_host(core, cmd, now)
        }
    }
}

/// [`handle`] for the commands about hosts other than the worker protocol: host
/// maintenance, and the separate apiservers' registrations (no answer).
fn handle_host(core: &mut Core, cmd: Command, now: Instant) -> Answer {
    match cmd {
        Command::Fleet { registrations } => {
            core.fleet(&registrations);
            Box::new(|| {})
        }
        Command::Maintain {
            host,
            action,
            who,
            reply,
        } => done(reply, core.maintain(&host, action, &who, now)),
        Command::Leave {
            host,
            caller,
            reply,
        } => done(reply, core.worker_leaves(&host, &caller, now)),
        other => handle(core, other),
    }
}
