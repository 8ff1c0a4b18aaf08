//! `xced worker --leave` (or `leave_on_stop = true`): on SIGTERM the worker asks the
//! controller to drain its host and keeps running (heartbeats, assignments, stopping
//! what the controller stops) until no replica is left there, so each replica leaves the
//! endpoint and is replaced elsewhere before it gets SIGTERM, instead of dying with the
//! worker's host. Bounded by the leave's timeout; then the worker detaches from what is
//! left, as a plain stop does.

use super::client::Client;
use retry_backoff::Backoff;
use std::time::Duration;
use tokio::time::Instant;

/// How often the worker asks again while replicas are left (each ask is also its
/// progress report).
const ASK_EVERY: Duration = Duration::from_millis(500);

/// Asks for the drain until the controller says no replica is left on the host (`true`)
/// or `timeout` runs out (`false`). Logs what is left whenever it changes.
pub(crate) async fn leave(client: &Client, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut last: Option<u32> = None;
    // Only failed asks back off (an unreachable controller); progress asks are steady.
    let mut retry = Backoff::jittered(ASK_EVERY, Duration::from_secs(5));
    tracing::info!(timeout = ?timeout, "leaving: asking the controller to drain this host");
    loop {
        let pause = match client.leave().await {
            Ok(a) if a.left == 0 => {
                tracing::info!("leaving: the host is drained; the worker exits");
                return true;
            }
            Ok(a) => {
                if last != Some(a.left) {
                    tracing::info!(left = a.left, "leaving: replicas still on this host");
                    last = Some(a.left);
                }
                retry.reset();
                ASK_EVERY
            }
            Err(e) => {
                let pause = retry.next_pause();
                tracing::warn!(error = %e, retry_in = ?pause, "leaving: the drain request failed");
                pause
            }
        };
        let now = Instant::now();
        if now >= deadline {
            tracing::warn!(left = ?last, timeout = ?timeout, "leaving: the drain did not finish in time; the worker exits and leaves what is left running");
            return false;
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
    }
}
