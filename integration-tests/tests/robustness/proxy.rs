//! A TCP proxy the suite puts between each worker and the controller, so that the nemesis
//! can partition a worker (both directions) without touching the machine's network: a cut
//! drops every connection through it and refuses new ones until it heals.

use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub port: u16,
    cut: watch::Sender<bool>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (cut, _) = watch::channel(false);
        let cuts = cut.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *cuts.borrow() {
                    // Partitioned: the connection is closed at once.
                    continue;
                }
                tokio::spawn(forward(client, upstream, cuts.subscribe()));
            }
        });
        Ok(Self { port, cut })
    }

    /// Cuts (`true`) or heals (`false`) the link.
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// Copies both ways until either side closes or the link is cut.
async fn forward(mut client: TcpStream, upstream: SocketAddr, mut cut: watch::Receiver<bool>) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = cut.wait_for(|c| *c) => {}
    }
}
