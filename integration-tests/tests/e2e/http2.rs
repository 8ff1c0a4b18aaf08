//! `xced dev` speaks HTTP/2 with prior knowledge (h2c) as well as HTTP/1.1 (docs/api.md):
//! a real HTTP/2 client (reqwest, `http2_prior_knowledge`) reads, runs blocking queries and
//! follows SSE streams over one connection, and a killed replica reaches them all.

use crate::harness::*;
use futures_util::StreamExt;
use std::time::Duration;

/// Watches of each kind the one connection carries.
const BLOCKING: usize = 20;
const STREAMS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_answers_h2c_with_many_watches_on_one_connection() {
    let c = DevCluster::start(3, true).expect("dev cluster");
    let eps = c.api.wait_ready("web", 3).await;
    // One client, prior knowledge: every request below is an HTTP/2 stream, and reqwest
    // keeps one connection per host for HTTP/2.
    let http = reqwest::Client::builder()
        .http2_prior_knowledge()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let get = |path: &str| {
        http.get(format!("{}{path}", c.api.base))
            .bearer_auth(&c.api.token)
    };

    let r = get("/v1/services/web/endpoints").send().await.unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    let index: u64 = r.headers()["x-xce-index"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let entry: serde_json::Value = r.json().await.unwrap();
    assert_eq!(entry["endpoints"].as_array().unwrap().len(), 3);

    let blocking: Vec<_> = (0..BLOCKING)
        .map(|_| {
            let req = get(&format!("/v1/services/web/endpoints?index={index}&wait=5m"));
            tokio::spawn(async move {
                let r = req.send().await.unwrap();
                assert_eq!(r.version(), reqwest::Version::HTTP_2);
                let index: u64 = r.headers()["x-xce-index"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                (r.status().as_u16(), index)
            })
        })
        .collect();
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let r = get("/v1/services/web/endpoints/stream")
            .send()
            .await
            .unwrap();
        assert_eq!(r.version(), reqwest::Version::HTTP_2);
        assert_eq!(r.status(), 200);
        streams.push(Sse::new(r));
    }
    // Each stream's first event is the current entry.
    for s in &mut streams {
        let first = s.next().await;
        assert_eq!(first.0, index, "{first:?}");
    }
    // All watches are held (the gauge counts them), and reads still answer meanwhile.
    eventually("every h2 watch counted", || async {
        let n = metric(&c.api, "xce_endpoint_watchers").await?;
        Ok((n as usize == BLOCKING + STREAMS).then_some(()))
    })
    .await;
    let r = get("/v1/services/web/endpoints?format=plain")
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap().lines().count(), 3);
    assert!(
        blocking.iter().all(|b| !b.is_finished()),
        "a blocking query answered early"
    );

    // A replica dies: every blocking query answers with a newer index, every stream has
    // an event without the dead endpoint.
    kill_replica_listening_on(&eps[0]).unwrap();
    for b in blocking {
        let (status, newer) = tokio::time::timeout(patience(), b).await.unwrap().unwrap();
        assert_eq!(status, 200);
        assert!(newer > index, "{newer} > {index}");
    }
    for s in &mut streams {
        let deadline = tokio::time::Instant::now() + patience();
        loop {
            let (id, data) = tokio::time::timeout_at(deadline, s.next())
                .await
                .expect("the stream has the change");
            if id > index && !data.contains(&eps[0]) {
                break;
            }
        }
    }
}

/// An SSE stream being read: its body, the parser, and events parsed but not taken yet.
struct Sse {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<Vec<u8>>> + Send>>,
    parser: SseParser,
    pending: std::collections::VecDeque<(u64, String)>,
}

impl Sse {
    fn new(r: reqwest::Response) -> Self {
        Self {
            body: Box::pin(r.bytes_stream().map(|c| c.map(|b| b.to_vec()))),
            parser: SseParser::default(),
            pending: Default::default(),
        }
    }

    /// The next event (id, data).
    async fn next(&mut self) -> (u64, String) {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return e;
            }
            let chunk = tokio::time::timeout(patience(), self.body.next())
                .await
                .expect("an event within patience")
                .expect("the stream goes on")
                .unwrap();
            self.pending.extend(self.parser.push(&chunk));
        }
    }
}
