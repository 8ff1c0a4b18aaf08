//! A TCP proxy the tests put between a worker and the controller, to make partitions they
//! fully control: [`cut`](FaultProxy::cut) stops every byte both ways on every connection,
//! open or new (they stay open, silent, as behind a dropped network); after
//! [`heal`](FaultProxy::heal) new connections pass, and the ones from before stay silent
//! for good (a connection that died in the partition, which its client learns of only by
//! a timeout of its own).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Default)]
struct State {
    cut: AtomicBool,
    /// Only the client's bytes (to the controller) stop: the answers still come.
    one_way: AtomicBool,
    /// Raised at every cut and heal: a connection passes only in the epoch it was born
    /// in, and only while not cut.
    epoch: AtomicU64,
}

impl State {
    fn passes(&self, born: u64, upstream: bool) -> bool {
        if upstream && self.one_way.load(Ordering::SeqCst) {
            return false;
        }
        !self.cut.load(Ordering::SeqCst) && self.epoch.load(Ordering::SeqCst) == born
    }
}

/// The proxy; it stops (and drops its connections) when dropped.
pub struct FaultProxy {
    pub port: u16,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:to`.
    pub async fn start(to: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let task = tokio::spawn(accept(listener, to, state.clone()));
        Self { port, state, task }
    }

    /// The partition starts.
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        self.state.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// An asymmetric partition: nothing the worker sends reaches the controller, but
    /// what the controller sends on open connections (an assignments query's answer)
    /// still reaches the worker.
    pub fn cut_to_controller(&self) {
        self.state.one_way.store(true, Ordering::SeqCst);
    }

    /// The partition ends: new connections pass; those from before stay dead.
    pub fn heal(&self) {
        self.state.epoch.fetch_add(1, Ordering::SeqCst);
        self.state.cut.store(false, Ordering::SeqCst);
        self.state.one_way.store(false, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, to: u16, state: Arc<State>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let born = state.epoch.load(Ordering::SeqCst);
        let state = state.clone();
        conns.spawn(async move {
            let Ok(server) = TcpStream::connect(("127.0.0.1", to)).await else {
                return;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::join!(
                pipe(cr, sw, &state, born, true),
                pipe(sr, cw, &state, born, false)
            );
        });
        while conns.try_join_next().is_some() {}
    }
}

/// Copies `from` to `to` while the connection passes; once it does not, holds both ends
/// open and silent until the proxy is dropped.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: &State,
    born: u64,
    upstream: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !state.passes(born, upstream) {
            std::future::pending::<()>().await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if !state.passes(born, upstream) {
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
