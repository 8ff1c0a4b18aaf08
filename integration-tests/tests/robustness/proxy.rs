//! A TCP proxy the suite puts between a daemon and what it talks to (a worker and the
//! controller or apiservers, an apiserver and its etcd members), so that the nemesis can
//! partition it without touching the machine's network. A cut both ways drops every
//! connection through it and refuses new ones until it heals. A one-way cut stalls one
//! direction of every connection (old and new): the proxy stops reading that side, so
//! what it sends waits in the kernel's buffers, as over a link that loses one direction's
//! packets until TCP's retransmission gets through after the heal; the other direction
//! flows on.

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The state of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    Healed,
    /// Both directions: connections dropped, new ones refused.
    Both,
    /// Only what the daemon sends (to its upstream) is stalled.
    Up,
    /// Only what the upstream sends back is stalled.
    Down,
}

pub struct Proxy {
    pub port: u16,
    cut: watch::Sender<Cut>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (cut, _) = watch::channel(Cut::Healed);
        let cuts = cut.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *cuts.borrow() == Cut::Both {
                    // Partitioned: the connection is closed at once.
                    continue;
                }
                tokio::spawn(forward(client, upstream, cuts.subscribe()));
            }
        });
        Ok(Self { port, cut })
    }

    /// Cuts the link (both ways or one way) or heals it.
    pub fn set(&self, cut: Cut) {
        self.cut.send_replace(cut);
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// Copies both ways until both sides are done or the link is cut both ways.
async fn forward(client: TcpStream, upstream: SocketAddr, mut cut: watch::Receiver<Cut>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();
    let up = pump(client_r, server_w, cut.clone(), Cut::Up);
    let down = pump(server_r, client_w, cut.clone(), Cut::Down);
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = cut.wait_for(|c| *c == Cut::Both) => {}
    }
}

/// Copies `from` to `to`, reading nothing while the link is cut in this direction
/// (`stalled_by`) or both ways.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut cut: watch::Receiver<Cut>,
    stalled_by: Cut,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let flowing = |c: &Cut| *c != stalled_by && *c != Cut::Both;
        if cut.wait_for(flowing).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // A cut that began during the read holds these bytes back until it heals.
        if cut.wait_for(flowing).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A one-way cut holds back one direction and lets the other through; the held bytes
    /// arrive after the heal; a cut both ways drops the connection.
    #[tokio::test]
    async fn a_one_way_cut_stalls_one_direction_only() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        // The upstream sends "hello" first, then echoes what it gets.
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let _ = s.write_all(b"hello").await;
                    let mut b = [0u8; 64];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = Proxy::start(upstream).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"hello");
        proxy.set(Cut::Up);
        c.write_all(b"ping!").await.unwrap();
        let stalled = tokio::time::timeout(Duration::from_millis(300), c.read(&mut b)).await;
        assert!(
            stalled.is_err(),
            "an echo came back through a cut of the way up"
        );
        proxy.set(Cut::Healed);
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping!", "the held bytes arrive after the heal");
        proxy.set(Cut::Both);
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(crate::harness::patience(), c.read_to_end(&mut rest));
        assert!(
            closed.await.is_ok(),
            "a cut both ways closes the connection"
        );
    }
}
