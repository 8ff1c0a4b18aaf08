//! Test doubles for the tests of this crate and of the crates above it (`test-util`
//! feature, turned on by their dev-dependencies): never part of a release binary.

use crate::etcd::pb;
use crate::{EtcdStore, Store};
use prost::Message as _;

/// A single-member etcd on loopback (the test kit's), killed when dropped.
#[derive(Debug)]
pub struct TestEtcd {
    etcd: testkit::etcd::Etcd,
    /// `127.0.0.1:PORT` of its client URL.
    pub endpoint: String,
}

impl TestEtcd {
    /// Starts one, with etcd's defaults.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts one with `extra` command-line flags.
    pub fn start_with(extra: &[&str]) -> Self {
        let etcd = testkit::etcd::Etcd::start_with(1, extra).unwrap_or_else(|e| panic!("{e:#}"));
        let endpoint = etcd.endpoint().to_owned();
        TestEtcd { etcd, endpoint }
    }

    /// The etcd process's id (to freeze it with SIGSTOP).
    pub fn pid(&self) -> u32 {
        self.etcd.pid(0).expect("etcd runs")
    }

    /// A fresh store instance (as a new controller process would open) under `prefix`.
    pub fn store(&self, prefix: &str) -> EtcdStore {
        EtcdStore::new(vec![self.endpoint.clone()])
            .unwrap()
            .with_prefix(prefix)
            .unwrap()
    }
}

/// Every record of `store`, one `key=value` line each, in key order.
pub fn dump(store: &dyn Store) -> String {
    store
        .load_all()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{k}={}", String::from_utf8_lossy(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A fake etcd member on loopback that answers every gRPC call with one message, a
/// created watch (`WatchResponse { created: true }`), and then sends nothing more while
/// keeping the call and the connection open: a member cut off from the others, as its
/// watchers see it. Its `HOST:PORT`; it runs until the process ends.
pub fn mute_member() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let endpoint = listener.local_addr().expect("a bound port").to_string();
    listener
        .set_nonblocking(true)
        .expect("a non-blocking listener");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime builds");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a listener");
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(mute_connection(tcp));
            }
        });
    });
    endpoint
}

/// Answers each call on `tcp` with a created watch and holds it open.
async fn mute_connection(tcp: tokio::net::TcpStream) {
    let Ok(mut conn) = h2::server::handshake(tcp).await else {
        return;
    };
    let created = pb::WatchResponse {
        header: Some(pb::ResponseHeader::default()),
        created: true,
        ..Default::default()
    }
    .encode_to_vec();
    let mut held = Vec::new();
    while let Some(Ok((_, mut respond))) = conn.accept().await {
        let head = http::Response::builder()
            .header("content-type", "application/grpc")
            .body(())
            .expect("a response head");
        let Ok(mut send) = respond.send_response(head, false) else {
            continue;
        };
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(created.len() as u32).to_be_bytes());
        framed.extend_from_slice(&created);
        let _ = send.send_data(framed.into(), false);
        // Never ended: the caller waits for more.
        held.push(send);
    }
}
