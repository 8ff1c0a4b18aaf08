//! An etcd of the bench's own, and what talking to its JSON gateway needs.

use super::*;

// === etcd ===

/// An etcd of its own (the test kit's, data on tmpfs), killed when dropped.
pub(crate) struct Etcd {
    pub(crate) _etcd: testkit::etcd::Etcd,
    pub(crate) addr: SocketAddr,
    pub(crate) pid: u32,
}

/// The etcd binary: `$ETCD`, else `etcd` on PATH.
pub(crate) fn etcd_bin() -> String {
    std::env::var("ETCD").unwrap_or_else(|_| "etcd".into())
}

pub(crate) fn b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl Etcd {
    /// A fresh single-member etcd, `None` if there is no `etcd` binary.
    pub(crate) async fn start() -> Option<Self> {
        testkit::etcd::binary().ok()?;
        // The kit waits for etcd with blocking calls: off the runtime's threads.
        let etcd = tokio::task::spawn_blocking(|| testkit::etcd::Etcd::start(1))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e:#}"));
        let addr = etcd.endpoint().parse().unwrap();
        let pid = etcd.pid(0).unwrap();
        CHILDREN.lock().unwrap().push(pid);
        Some(Etcd {
            _etcd: etcd,
            addr,
            pid,
        })
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        forget_child(self.pid);
    }
}
