//! Figures for the etcd gateway (issue 13): commit latency of [`EtcdStore`] and follower
//! lag (from a commit's start to the follower's listener having the event), against a
//! real single-member etcd on tmpfs. A measurement, not a check, so it is ignored by
//! default; run it with
//! `cargo test -p xce-apiserver --release --lib follow::bench -- --ignored --nocapture`.

use super::*;
use plugin_api::ClusterSnapshot;
use std::time::Instant;
use tokio::sync::mpsc;
use xce_model::Txn;
use xce_store::testing::TestEtcd;
use xce_store::Store;

/// Commits before measuring (connections, etcd warm-up), then measured ones.
const WARMUP: usize = 50;
const ROUNDS: usize = 500;

/// Tells the bench when each event reached the listener.
struct Stamp(mpsc::UnboundedSender<(u64, Instant)>);

impl ClusterListener for Stamp {
    fn resync(&self, _: &ClusterSnapshot) {}
    fn on_event(&self, e: &ClusterEvent) {
        let _ = self.0.send((e.rev(), Instant::now()));
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement that prints a table: run with --ignored --nocapture"]
async fn commit_latency_and_follower_lag() {
    let etcd = TestEtcd::start();
    let writer = etcd.store("/xce/");
    let mut c = tokio::task::block_in_place(|| Cluster::load(&writer)).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut f = Follower::new(
        Arc::new(etcd.store("/xce/")),
        vec![Arc::new(Stamp(tx))],
        Metrics::default(),
        super::tests::fresh(),
    );
    f.load().await.unwrap();
    let task = tokio::spawn(f.run());
    let (mut commits, mut lags) = (Vec::new(), Vec::new());
    for i in 0..WARMUP + ROUNDS {
        let mut txn = Txn::new(&c);
        txn.put_service(super::tests::service(&format!("s{}", i % 20)));
        let start = Instant::now();
        tokio::task::block_in_place(|| writer.commit(txn.batch())).unwrap();
        let committed = start.elapsed();
        txn.apply(&mut c);
        let applied = loop {
            let (rev, at) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("the follower applies within 10s")
                .unwrap();
            if rev == c.rev {
                break at;
            }
        };
        if i >= WARMUP {
            commits.push(committed);
            lags.push(applied.duration_since(start));
        }
    }
    task.abort();
    commits.sort();
    lags.sort();
    println!(
        "etcd gateway figures, {ROUNDS} sequential one-event commits (after {WARMUP} unmeasured):"
    );
    println!("| figure | p50 | p99 | max |");
    println!("|---|---|---|---|");
    for (name, v) in [
        ("commit latency", &commits),
        ("commit start → follower applied", &lags),
    ] {
        println!(
            "| {name} | {:.2} ms | {:.2} ms | {:.2} ms |",
            percentile(v, 0.5).as_secs_f64() * 1e3,
            percentile(v, 0.99).as_secs_f64() * 1e3,
            v[v.len() - 1].as_secs_f64() * 1e3,
        );
    }
}
