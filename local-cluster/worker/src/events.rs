//! The worker's outbox: events queue in order and are POSTed in batches, retried until the
//! controller acknowledges them, so a controller restart loses neither an exit nor a
//! readiness transition.
//!
//! The queue stays bounded by the job lifecycle: readiness flaps of one job that the
//! controller has not seen yet cancel out (see [`EventQueue::push`]), so between two
//! lifecycle events a job holds at most one queued readiness event.

use plugin_api::JobId;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch, Notify};

use super::client::{sleep_or_answer, CallError, Client};
use super::msg::Msg;
use retry_backoff::Backoff;
use xce_proto::worker::WorkerEvent;

/// The most events sent in one request.
const MAX_BATCH: usize = 256;

fn job_of(ev: &WorkerEvent) -> &JobId {
    match ev {
        WorkerEvent::Started { job, .. }
        | WorkerEvent::Readiness { job, .. }
        | WorkerEvent::Exited { job, .. }
        | WorkerEvent::Refused { job, .. } => job,
    }
}

/// Events in order. The first `in_flight` ones are being sent; the first `tried` ones
/// were part of some attempt (the controller may have seen them even if the answer was
/// lost) and are never coalesced away.
#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    items: VecDeque<WorkerEvent>,
    in_flight: usize,
    tried: usize,
}

impl EventQueue {
    /// Queues `ev`. A readiness event whose job's last queued, never tried event is also
    /// a readiness event takes its place: the controller needs only the newest. Two
    /// transitions without probe texts cancel out instead (readiness transitions of a job
    /// alternate, so the pair brings the controller back to what it already believes). A
    /// failing probe's new text (a repeat of `ready: false`) only ever replaces: the event
    /// it would cancel with may be the transition it repeats.
    pub(crate) fn push(&mut self, ev: WorkerEvent) {
        if let WorkerEvent::Readiness { job, ready, probe } = &ev {
            let last_of_job = self
                .items
                .iter()
                .enumerate()
                .skip(self.tried)
                .rev()
                .find(|(_, e)| job_of(e) == job);
            if let Some((
                i,
                WorkerEvent::Readiness {
                    ready: queued,
                    probe: queued_probe,
                    ..
                },
            )) = last_of_job
            {
                if queued != ready && probe.is_none() && queued_probe.is_none() {
                    self.items.remove(i);
                } else {
                    self.items[i] = ev;
                }
                return;
            }
        }
        self.items.push_back(ev);
    }

    /// The next batch to send, at most `max` events (empty when there is nothing new);
    /// marks it in flight.
    pub(crate) fn next_batch(&mut self, max: usize) -> Vec<WorkerEvent> {
        self.in_flight = self.items.len().min(max.max(1));
        self.tried = self.tried.max(self.in_flight);
        self.items.iter().take(self.in_flight).cloned().collect()
    }

    /// The batch in flight was acknowledged: drops and returns it.
    pub(crate) fn ack(&mut self) -> Vec<WorkerEvent> {
        let n = std::mem::take(&mut self.in_flight);
        self.tried -= n;
        self.items.drain(..n).collect()
    }

    /// The batch in flight failed: it will be sent again (possibly with more after it).
    pub(crate) fn nack(&mut self) {
        self.in_flight = 0;
    }

    /// Number of queued events, in flight included.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }
}

/// The queue shared by the state task (pushes) and the sender task.
#[derive(Debug)]
pub(crate) struct Outbox {
    queue: Mutex<EventQueue>,
    wake: Notify,
    pending: watch::Sender<usize>,
}

impl Outbox {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(EventQueue::default()),
            wake: Notify::new(),
            pending: watch::Sender::new(0),
        })
    }

    /// Queues an event for sending.
    pub(crate) fn push(&self, ev: WorkerEvent) {
        tracing::debug!(event = ?ev, "event queued");
        let mut q = self.queue.lock().unwrap();
        q.push(ev);
        self.pending.send_replace(q.len());
        drop(q);
        self.wake.notify_one();
    }

    /// Queues the readiness `ready` of `job` again, because the controller holds the
    /// other value (a heartbeat's digest said so: a forged report, most likely). Nothing
    /// is queued while a readiness event of the job is queued already: it is on its way
    /// and says the same or newer. Returns whether one was queued.
    pub(crate) fn reassert_readiness(&self, job: &JobId, ready: bool) -> bool {
        let mut q = self.queue.lock().unwrap();
        let on_its_way = q
            .items
            .iter()
            .any(|e| matches!(e, WorkerEvent::Readiness { job: j, .. } if j == job));
        if on_its_way {
            return false;
        }
        q.push(WorkerEvent::Readiness {
            job: job.clone(),
            ready,
            probe: None,
        });
        self.pending.send_replace(q.len());
        drop(q);
        self.wake.notify_one();
        true
    }

    /// The queued events, in order (tests).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> Vec<WorkerEvent> {
        self.queue.lock().unwrap().items.iter().cloned().collect()
    }

    /// Waits until every queued event was acknowledged, at most `patience`. Returns how
    /// many are left.
    pub(crate) async fn flush(&self, patience: Duration) -> usize {
        let mut rx = self.pending.subscribe();
        let _ = tokio::time::timeout(patience, rx.wait_for(|n| *n == 0)).await;
        let left = *rx.borrow();
        left
    }

    /// Sends queued events until the task is aborted. Acknowledged `Exited` events are
    /// passed on to the state task (it keeps the exit on disk until then).
    pub(crate) async fn send_loop(self: Arc<Self>, client: Client, owner: mpsc::Sender<Msg>) {
        let mut backoff = Backoff::jittered(Duration::from_millis(100), Duration::from_secs(5));
        // Shrinks when the controller finds a batch too large; back to full on success.
        let mut max = MAX_BATCH;
        let mut answers = client.answers();
        loop {
            answers.borrow_and_update();
            let batch = self.queue.lock().unwrap().next_batch(max);
            if batch.is_empty() {
                self.wake.notified().await;
                continue;
            }
            match client.events(&batch).await {
                Ok(()) => {
                    backoff.reset();
                    max = MAX_BATCH;
                    let sent = {
                        let mut q = self.queue.lock().unwrap();
                        let sent = q.ack();
                        self.pending.send_replace(q.len());
                        sent
                    };
                    tracing::debug!(events = sent.len(), "events acknowledged");
                    let exited: Vec<JobId> = sent
                        .iter()
                        .filter_map(|e| match e {
                            WorkerEvent::Exited { job, .. } => Some(job.clone()),
                            _ => None,
                        })
                        .collect();
                    if !exited.is_empty() && owner.send(Msg::Acked(exited)).await.is_err() {
                        return;
                    }
                }
                Err(CallError::Status { status, .. })
                    if status.as_u16() == 413 && batch.len() > 1 =>
                {
                    self.queue.lock().unwrap().nack();
                    max = batch.len() / 2;
                    tracing::warn!(
                        events = batch.len(),
                        "controller found the event batch too large; splitting it"
                    );
                }
                // The controller can never take this batch (malformed, or one event larger
                // than its body limit).
                Err(CallError::Status { status, body })
                    if matches!(status.as_u16(), 400 | 413 | 422) =>
                {
                    // Retrying would block every later event behind it.
                    let dropped = {
                        let mut q = self.queue.lock().unwrap();
                        let dropped = q.ack();
                        self.pending.send_replace(q.len());
                        dropped
                    };
                    tracing::error!(%body, events = ?dropped, "controller refused events; dropped");
                }
                Err(e) => {
                    self.queue.lock().unwrap().nack();
                    let wait = backoff.next_pause();
                    if e.refused() {
                        // The registration loop the heartbeats fall back to says why.
                        tracing::debug!(error = %e, retry_in = ?wait, "sending events refused");
                    } else {
                        tracing::warn!(error = %e, retry_in = ?wait, "sending events failed");
                    }
                    if sleep_or_answer(wait, &mut answers).await {
                        backoff.reset();
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(ev: &str) -> WorkerEvent {
        let (kind, job) = ev.split_once(':').unwrap();
        let job = job.to_owned();
        match kind {
            "start" => WorkerEvent::Started {
                job,
                pid: 7,
                log: None,
            },
            "up" => WorkerEvent::Readiness {
                job,
                ready: true,
                probe: None,
            },
            "down" => WorkerEvent::Readiness {
                job,
                ready: false,
                probe: None,
            },
            // A failing probe's text while not ready: `404` for `answered 404`.
            "fail" | "fail2" => WorkerEvent::Readiness {
                job,
                ready: false,
                probe: Some(format!(
                    "answered {}",
                    if kind == "fail" { 404 } else { 500 }
                )),
            },
            "exit" => WorkerEvent::exited(job, Default::default(), None),
            other => panic!("bad event {other}"),
        }
    }

    fn show(evs: &[WorkerEvent]) -> String {
        evs.iter()
            .map(|e| match e {
                WorkerEvent::Started { job, .. } => format!("start:{job}"),
                WorkerEvent::Readiness {
                    job, ready: true, ..
                } => format!("up:{job}"),
                WorkerEvent::Readiness {
                    job,
                    ready: false,
                    probe: None,
                } => format!("down:{job}"),
                WorkerEvent::Readiness {
                    job,
                    probe: Some(p),
                    ..
                } => format!("down:{job}({p})"),
                WorkerEvent::Exited { job, .. } => format!("exit:{job}"),
                WorkerEvent::Refused { job, .. } => format!("refused:{job}"),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// `script`: events (`start:j`, `up:j`, `down:j`, `exit:j`) and `send` (take a batch,
    /// shown as `[...]`), `ack`, `nack`. Shows every batch, then what is left.
    fn check(script: &str, expect: expect_test::Expect) {
        let mut q = EventQueue::default();
        let mut out = Vec::new();
        for step in script.split_whitespace() {
            match step {
                "send" => out.push(format!("[{}]", show(&q.next_batch(MAX_BATCH)))),
                "send1" => out.push(format!("[{}]", show(&q.next_batch(1)))),
                "ack" => {
                    q.ack();
                }
                "nack" => q.nack(),
                ev => q.push(parse(ev)),
            }
        }
        let rest: Vec<_> = q.items.iter().cloned().collect();
        out.push(format!("left: {}", show(&rest)));
        expect.assert_eq(&out.join("\n"));
    }

    #[test]
    fn keeps_order_across_jobs() {
        check(
            "start:a start:b up:b up:a send ack",
            expect_test::expect![[r#"
                [start:a start:b up:b up:a]
                left: "#]],
        );
    }

    #[test]
    fn a_flap_the_controller_never_saw_cancels_out() {
        check(
            "start:a up:a down:a up:a send",
            expect_test::expect![[r#"
                [start:a up:a]
                left: start:a up:a"#]],
        );
        check(
            "start:a up:a send ack down:a up:a down:a send",
            expect_test::expect![[r#"
                [start:a up:a]
                [down:a]
                left: down:a"#]],
        );
    }

    #[test]
    fn a_new_probe_text_replaces_and_never_cancels_a_transition() {
        // Not ready with a 404, then a 500: the controller needs the newest text only.
        check(
            "start:a fail:a fail2:a send",
            expect_test::expect![[r#"
                [start:a down:a(answered 500)]
                left: start:a down:a(answered 500)"#]],
        );
        // A text (a repeat of not ready) then the transition to ready: the transition
        // stays; cancelling the pair would leave the controller thinking it not ready.
        check(
            "start:a send ack fail:a up:a send",
            expect_test::expect![[r#"
                [start:a]
                [up:a]
                left: up:a"#]],
        );
        // Ready, then not ready with a text: the newest state, with its text.
        check(
            "start:a send ack up:a fail:a send",
            expect_test::expect![[r#"
                [start:a]
                [down:a(answered 404)]
                left: down:a(answered 404)"#]],
        );
    }

    #[test]
    fn never_coalesces_into_a_batch_in_flight() {
        check(
            "up:a send down:a nack send ack",
            expect_test::expect![[r#"
                [up:a]
                [up:a down:a]
                left: "#]],
        );
    }

    #[test]
    fn never_coalesces_into_a_batch_that_may_have_arrived() {
        // The answer to the first attempt was lost: the controller may know `up:a`.
        check(
            "up:a send nack down:a send ack",
            expect_test::expect![[r#"
                [up:a]
                [up:a down:a]
                left: "#]],
        );
    }

    #[test]
    fn a_smaller_batch_after_a_too_large_one() {
        check(
            "start:a start:b send nack send1 ack send ack",
            expect_test::expect![[r#"
                [start:a start:b]
                [start:a]
                [start:b]
                left: "#]],
        );
    }

    #[test]
    fn lifecycle_events_are_never_coalesced() {
        check(
            "up:a exit:a up:b down:b start:a",
            expect_test::expect!["left: up:a exit:a start:a"],
        );
    }
}
