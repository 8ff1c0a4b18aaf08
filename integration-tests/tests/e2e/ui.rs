//! The web view (`GET /ui`) in a real browser: headless Chromium driven over WebDriver
//! (chromedriver on a free loopback port), against a real dev cluster with real replicas.
//!
//! It opens `/ui#token=…`, sees `web` with its 3 endpoints, kills a replica process and
//! times, in the page, how long its endpoint takes to disappear (at most 2 s) and to come
//! back; a refused token shows "token refused"; and a team-b token, in the same tab, never
//! shows team-a's service: not in the page (its whole markup, polled while team-a changes)
//! and not in what the page's requests answer to that token.
//!
//! A second test serves the page from a separate `xced apiserver` on etcd: it follows a
//! killed replica there too, takes a real `event: reset` (its apiserver restarted with an
//! empty journal while the cluster changed) and rebuilds exactly what exists, and shows a
//! killed worker's host unreachable, then lost.
//!
//! With `XCE_UI_SCREENSHOT=path.png` it also saves a screenshot of the page showing `web`
//! (the README's picture is taken this way).

use crate::daemons::{EtcdCluster, Fleet};
use crate::external::{find_program, own, program_version, skipped, token, Daemon, TwoTenants};
use crate::harness::*;
use anyhow::{bail, Context, Result};
use fantoccini::{Client, ClientBuilder};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// `web`'s labels: one plain, one that would be an image with a script if it became markup.
const WEB_META: &str = "[service.meta]\nteam = \"payments\"\ntier = \"frontend\"\n";
/// `api`'s label is markup: the page must show it as text and run nothing.
const API_META: &str = "[service.meta]\nnote = \"<img src=x onerror=\\\"window.__xss=1\\\">\"\n";

const ALICE: &str = "ui-alice-7d41c2e98b3f5a06";
const BOB: &str = "ui-bob-2a9e6f13c85d0b74";

/// alice also sees the hosts (`host.view`); bob does not, and his page says so.
fn tokens() -> String {
    let [view, submit] = own("team-a");
    token(ALICE, "alice", &[view, submit, ("host.view", "*")]) + &token(BOB, "bob", &own("team-b"))
}

/// Headless Chromium under chromedriver, both ended with the test.
struct Browser {
    client: Option<Client>,
    profile: tempfile::TempDir,
    _driver: Daemon,
    version: String,
}

impl Browser {
    /// `None` when Chromium or its driver is not installed.
    async fn start() -> Result<Option<Self>> {
        let (Some(driver), Some(chromium)) = (
            find_program(&["chromedriver"]),
            find_program(&["chromium", "chromium-browser"]),
        ) else {
            return Ok(None);
        };
        let version = program_version(&chromium);
        let profile = tempfile::tempdir()?;
        let port = free_port();
        let driver = Daemon::spawn(
            Command::new(driver)
                .arg(format!("--port={port}"))
                .arg("--allowed-ips=127.0.0.1"),
            profile.path().join("chromedriver.log"),
        )?;
        let url = format!("http://127.0.0.1:{port}");
        eventually("chromedriver answers /status", || async {
            let r = reqwest::get(format!("{url}/status")).await?;
            Ok(r.status().is_success().then_some(()))
        })
        .await;
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new",
                    // Root in a container has no user namespace for the sandbox.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--window-size=1180,860",
                    format!("--user-data-dir={}", profile.path().join("chrome").display()),
                ],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await
            .with_context(|| format!("WebDriver session: {}", driver.output()))?;
        Ok(Some(Self {
            client: Some(client),
            profile,
            _driver: driver,
            version,
        }))
    }

    /// Opens the web view of `base` with `token` in the URL fragment.
    async fn open(&self, base: &str, token: &str) {
        self.c()
            .goto(&format!("{base}/ui#token={token}"))
            .await
            .unwrap();
    }

    fn c(&self) -> &Client {
        self.client.as_ref().expect("session open")
    }

    async fn js(&self, script: &str, args: Vec<Value>) -> Result<Value> {
        Ok(self.c().execute(script, args).await?)
    }

    /// The cells' text of each row of table `#id`.
    async fn rows(&self, id: &str) -> Result<Vec<Vec<String>>> {
        let v = self
            .js(
                "return Array.from(document.querySelectorAll('#' + arguments[0] + ' tbody tr'))\
                 .map(tr => Array.from(tr.cells).map(td => td.textContent));",
                vec![json!(id)],
            )
            .await?;
        Ok(serde_json::from_value(v)?)
    }

    async fn conn_state(&self) -> Result<String> {
        let v = self
            .js(
                "return document.getElementById('conn').dataset.state || '';",
                vec![],
            )
            .await?;
        Ok(v.as_str().unwrap_or_default().to_owned())
    }

    /// Clicks service `key` (`project/name`) in the services table and waits until the
    /// endpoints section shows it.
    async fn select(&self, key: &str) {
        eventually(&format!("the page shows the endpoints of {key}"), || async {
            let v = self
                .js(
                    "const tr = document.querySelector('#services tbody tr[data-key=\"' + arguments[0] + '\"]');\
                     if (tr) tr.click();\
                     return !!tr && document.getElementById('ep-title').textContent === arguments[0];",
                    vec![json!(key)],
                )
                .await?;
            Ok((v == true).then_some(()))
        })
        .await
    }

    /// What the page's stream holds: the `project/service` keys of its entries, the last
    /// event id it would resume from, and how many `event: reset`s it took (the counter
    /// the page shows in its connection indicator).
    async fn stream_state(&self) -> Result<(Vec<String>, String, u64)> {
        let v = self
            .js(
                "return [Array.from(state.entries.keys()).sort(), state.lastEventId,\
                         Number(document.getElementById('conn').dataset.resets)];",
                vec![],
            )
            .await?;
        Ok(serde_json::from_value(v)?)
    }

    /// Everything in the page: markup, attributes and text, hidden parts included.
    async fn whole_page(&self) -> Result<String> {
        let v = self
            .js("return document.documentElement.outerHTML;", vec![])
            .await?;
        Ok(v.as_str().unwrap_or_default().to_owned())
    }

    async fn close(mut self) {
        if let Some(c) = self.client.take() {
            let _ = c.close().await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A failed test leaves the session open: end whatever runs on our profile.
        for pid in pids_with_cmdline(&self.profile.path().to_string_lossy()) {
            signal(pid, libc::SIGKILL);
        }
    }
}

/// Waits until the page's endpoints table lists `n` rows and its connection is live.
async fn page_shows_endpoints(b: &Browser, n: usize) -> Vec<Vec<String>> {
    eventually(&format!("the page shows {n} endpoints, live"), || async {
        let rows = b.rows("endpoints").await?;
        let live = b.conn_state().await? == "live";
        Ok((rows.len() == n && live).then_some(rows))
    })
    .await
}

/// Kills the replica shown in the row of `replica` (of `rows`, the page's endpoints) and
/// times in the page, with a `MutationObserver` set up just before the kill, how long its
/// row takes to leave and to come back. Fails past 2 s to leave, or if the killed address
/// is still listed once the page shows as many endpoints again. Returns the rows then and
/// the two times in ms.
async fn kill_replica_timed_in_page(
    b: &Browser,
    rows: &[Vec<String>],
    replica: &str,
) -> (Vec<Vec<String>>, f64, f64) {
    let victim = rows
        .iter()
        .find(|r| r[0] == replica)
        .unwrap_or_else(|| panic!("replica {replica} shown: {rows:?}"))[3]
        .clone();
    let t0 = b
        .js(
            r#"const target = arguments[0];
               const has = () => !!document.querySelector('#endpoints tbody tr[data-replica="' + target + '"]');
               window.__ui = { gone: null, back: null, t0: performance.now() };
               new MutationObserver(() => {
                 const now = performance.now();
                 if (window.__ui.gone === null) { if (!has()) window.__ui.gone = now; }
                 else if (window.__ui.back === null && has()) window.__ui.back = now;
               }).observe(document.getElementById('endpoints'), { childList: true, subtree: true });
               return window.__ui.t0;"#,
            vec![json!(replica)],
        )
        .await
        .unwrap();
    assert!(t0.is_number());
    kill_replica_listening_on(&victim).unwrap();
    let (gone_ms, back_ms) = eventually(
        &format!("the page shows replica {replica} gone and back"),
        || async {
            let v = b.js("return window.__ui;", vec![]).await?;
            let t0 = v["t0"].as_f64().context("t0")?;
            Ok(match (v["gone"].as_f64(), v["back"].as_f64()) {
                (Some(g), Some(b)) => Some((g - t0, b - t0)),
                _ => None,
            })
        },
    )
    .await;
    let rows_after = page_shows_endpoints(b, rows.len()).await;
    assert!(
        gone_ms <= 2000.0,
        "the page still showed the killed replica after {gone_ms:.0} ms"
    );
    assert!(
        rows_after.iter().all(|r| r[3] != victim),
        "the killed replica's address is still listed: {rows_after:?}"
    );
    (rows_after, gone_ms, back_ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_view_follows_a_killed_replica_and_shows_a_tenant_only_its_own() {
    let Some(browser) = Browser::start().await.expect("starting chromedriver") else {
        skipped("ui (browser test)", "chromium or chromium-driver");
        return;
    };
    let t = TwoTenants::start(&tokens(), ALICE, BOB, (WEB_META, API_META)).await;
    let (c, alice, bob) = (&t.cluster, &t.a, &t.b);

    // --- alice: web with 3 endpoints, the token taken out of the address bar ---
    browser.open(&c.api.base, ALICE).await;
    let rows = page_shows_endpoints(&browser, 3).await;
    let services = browser.rows("services").await.unwrap();
    assert_eq!(services.len(), 1, "{services:?}");
    assert_eq!(services[0][0], "web");
    assert_eq!(services[0][1], "team-a");
    assert_eq!(services[0][2], "3/3");
    assert_eq!(
        meta_chips(&browser).await["chips"],
        json!(["team=payments", "tier=frontend"])
    );
    let url = browser.c().current_url().await.unwrap();
    assert!(
        !url.as_str().contains(ALICE),
        "the token stays in the URL: {url}"
    );
    let hosts = browser.rows("hosts").await.unwrap();
    assert_eq!(hosts.len(), 3, "{hosts:?}");
    // The page's addresses are the ones the REST API answers.
    let plain = alice.plain("web").await.unwrap();
    let shown: Vec<String> = rows.iter().map(|r| r[3].clone()).collect();
    let mut expected = plain.clone();
    expected.sort();
    let mut shown_sorted = shown.clone();
    shown_sorted.sort();
    assert_eq!(shown_sorted, expected, "page rows {rows:?}");
    if let Some(path) = std::env::var_os("XCE_UI_SCREENSHOT") {
        let png = browser.c().screenshot().await.unwrap();
        std::fs::write(PathBuf::from(&path), &png).unwrap();
        println!("FIGURE ui screenshot: {} bytes in {path:?}", png.len());
    }

    // A narrow window (a phone, a side panel): the page itself never scrolls sideways (wide
    // tables scroll inside their box), and the endpoints are still there.
    let wide = browser.c().get_window_size().await.unwrap();
    browser.c().set_window_size(420, 900).await.unwrap();
    let fits = browser
        .js(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth];",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        fits[1].as_u64().unwrap() <= 420,
        "the window did not narrow: {fits}"
    );
    assert!(
        fits[0].as_u64().unwrap() <= fits[1].as_u64().unwrap(),
        "the page is wider than a narrow window (scrollWidth, clientWidth): {fits}"
    );
    assert_eq!(browser.rows("endpoints").await.unwrap().len(), 3);
    browser
        .c()
        .set_window_size(wide.0 as u32, wide.1 as u32)
        .await
        .unwrap();

    // The page's SSE parser, fed a stream cut at every possible place: CRLF, CR and LF line
    // ends, a comment, a multi-line data field, an event without data (`reset` may be one).
    let parsed = browser
        .js(
            r#"const text = ": keep-alive\r\nid: 7\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n"
                 + "event: reset\n\n" + "id: 9\rdata:x\r\r" + "data: no end";
               const out = [];
               for (let cut = 0; cut <= text.length; cut++) {
                 const got = [];
                 const p = new SseParser((e) => got.push([e.event, e.data, e.id]));
                 p.push(text.slice(0, cut));
                 p.push(text.slice(cut));
                 out.push(JSON.stringify(got));
               }
               return out;"#,
            vec![],
        )
        .await
        .unwrap();
    let parsed: Vec<String> = serde_json::from_value(parsed).unwrap();
    let want = r#"[["message","{\"a\":\n1}","7"],["reset","",null],["message","x","9"]]"#;
    for (cut, got) in parsed.iter().enumerate() {
        assert_eq!(got, want, "SSE parser, input cut at {cut}");
    }

    // --- kill replica 1: timed in the page, from just before the kill ---
    let (rows_after, gone_ms, back_ms) = kill_replica_timed_in_page(&browser, &rows, "1").await;
    println!(
        "SUMMARY ui killed replica's endpoint: gone from the page after {gone_ms:.0} ms (limit 2000), back after {back_ms:.0} ms; {}",
        browser.version
    );

    // --- the stream drops (as when an apiserver restarts): the page reconnects with
    // Last-Event-ID and follows the next change ---
    let last_id = browser
        .js(
            "window.__dropped = state.abort; state.abort.abort(); return state.lastEventId;",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        last_id.as_str().is_some_and(|id| !id.is_empty()),
        "an event id to resume from: {last_id}"
    );
    eventually("the page reconnects its stream", || async {
        let v = browser
            .js("return state.abort !== window.__dropped;", vec![])
            .await?;
        Ok((v == true && browser.conn_state().await? == "live").then_some(()))
    })
    .await;
    let victim0 = rows_after.iter().find(|r| r[0] == "0").unwrap()[3].clone();
    kill_replica_listening_on(&victim0).unwrap();
    let reconnected = eventually(
        "the reconnected page follows replica 0's replacement",
        || async {
            let rows = browser.rows("endpoints").await?;
            let mut shown: Vec<String> = rows.iter().map(|r| r[3].clone()).collect();
            let mut ready = alice.plain("web").await?;
            shown.sort();
            ready.sort();
            Ok((rows.len() == 3 && !shown.contains(&victim0) && shown == ready).then_some(shown))
        },
    )
    .await;
    println!(
        "FIGURE ui reconnect: the dropped stream reconnected with Last-Event-ID {last_id}, then the page showed replica 0's replacement: {reconnected:?}"
    );

    // --- a refused token: a clear state, nothing shown ---
    browser.open(&c.api.base, "not-a-token").await;
    eventually("the page says the token is refused", || async {
        let refused = browser.conn_state().await? == "refused";
        let text = browser
            .js("return document.body.innerText;", vec![])
            .await?;
        let text = text.as_str().unwrap_or_default();
        Ok((refused && text.contains("token refused") && !text.contains("team-a")).then_some(()))
    })
    .await;

    // --- bob, in the same tab: only team-b, also while team-a changes ---
    browser.open(&c.api.base, BOB).await;
    let bob_rows = page_shows_endpoints(&browser, 1).await;
    let services = browser.rows("services").await.unwrap();
    assert_eq!(services.len(), 1, "{services:?}");
    assert_eq!((&*services[0][0], &*services[0][1]), ("api", "team-b"));
    assert_eq!(bob_rows[0][3], t.b_endpoint);
    let meta = meta_chips(&browser).await;
    assert_eq!(
        meta["chips"],
        json!(["note=<img src=x onerror=\"window.__xss=1\">"]),
        "{meta}"
    );
    assert_eq!(meta["imgs"], 0, "a meta value became markup: {meta}");
    assert_eq!(meta["xss"], Value::Null, "a meta value ran: {meta}");

    // What bob's token gets from the stream the page reads, across a change of team-a.
    let mut stream = sse_open(bob, "/v1/endpoints/stream", None)
        .await
        .unwrap()
        .bytes_stream();
    let (_, _, before) = alice.get("/v1/services/web/endpoints").await.unwrap();
    let web_before = entry_endpoints(&serde_json::from_str(&before).unwrap());
    let victim2 = web_before
        .iter()
        .find(|(r, _, _)| *r == 2)
        .expect("replica 2")
        .clone();
    kill_replica_listening_on(&victim2.2).unwrap();
    let mut web_addrs: Vec<String> = web_before.iter().map(|e| e.2.clone()).collect();
    let (page_while, web_now) = eventually("team-a's web replaced replica 2", || async {
        let page = browser.whole_page().await?;
        // Checked on every round while team-a changes, not only at the end.
        check_no_team_a(&page, &web_addrs)?;
        let (_, _, now) = alice.get("/v1/services/web/endpoints").await?;
        let now = entry_endpoints(&serde_json::from_str(&now)?);
        let replaced = now.len() == 3 && now.iter().any(|e| e.0 == 2 && e.1 != victim2.1);
        Ok(replaced.then_some((page, now)))
    })
    .await;
    web_addrs.extend(web_now.iter().map(|e| e.2.clone()));
    web_addrs.sort();
    web_addrs.dedup();
    assert!(page_while.contains("team-b"), "bob's page shows team-b");
    let page = browser.whole_page().await.unwrap();
    check_no_team_a(&page, &web_addrs).unwrap();

    // The network data: every request the page completed was one of its three, and what
    // those answer bob's token holds nothing of team-a; nor does the stream it keeps open.
    let urls = browser
        .js(
            "return performance.getEntriesByType('resource').map(e => new URL(e.name).pathname);",
            vec![],
        )
        .await
        .unwrap();
    let urls: Vec<String> = serde_json::from_value(urls).unwrap();
    for u in &urls {
        assert!(
            [
                "/ui/app.js",
                "/ui/app.css",
                "/v1/services",
                "/v1/hosts",
                "/v1/endpoints/stream"
            ]
            .contains(&u.as_str()),
            "the page requested {u}"
        );
    }
    // bob lacks host.view: the hosts are refused him (and the page says so), his
    // services are not.
    for (path, want) in [("/v1/services", 200), ("/v1/hosts", 403)] {
        let (st, _, body) = bob.get(path).await.unwrap();
        assert_eq!(st, want, "{path}: {body}");
        check_no_team_a(&body, &web_addrs).unwrap();
    }
    assert!(
        page.contains("lacks host.view"),
        "bob's page says why it shows no hosts"
    );
    let mut got = Vec::new();
    // Whatever the stream sent bob up to now: the snapshot, and no event of team-a's change.
    while let Ok(Some(chunk)) =
        tokio::time::timeout(Duration::from_millis(300), stream.next()).await
    {
        got.extend_from_slice(&chunk.unwrap());
    }
    let got = String::from_utf8_lossy(&got);
    assert!(got.contains("\"team-b\""), "bob's stream: {got}");
    check_no_team_a(&got, &web_addrs).unwrap();
    println!(
        "FIGURE ui tenant check: bob's page polled while team-a's web replaced a replica; {} team-a addresses never appeared in the page, /v1/services, /v1/hosts or the stream",
        web_addrs.len()
    );
    browser.close().await;
}

/// The same page served by a separate `xced apiserver` following a controller on etcd.
///
/// It shows `web`'s endpoints and follows a killed replica, as on the dev cluster. Then the
/// page is made to resume from a revision the server cannot bridge: its apiserver is
/// killed, the cluster changes while it is down (a replica of `web` replaced, service `old`
/// deleted; the workers report through the other apiserver), and it is started again with
/// an empty journal, whose first revision is past the page's `Last-Event-ID`. The page
/// reconnects on its own; the server must answer `event: reset` and a snapshot, and the
/// page must end up with exactly what exists: no entry of `old` (its deletion fell in the
/// gap, so only the reset can clear it), `web`'s current endpoints once each. Last, a
/// worker is killed: the page shows its host unreachable with the endpoints on it flagged
/// (they are kept for the grace period), then lost, with `web`'s endpoints all elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_an_etcd_apiserver_the_web_view_follows_a_killed_replica_a_reset_and_a_lost_host() {
    let Some(browser) = Browser::start().await.expect("starting chromedriver") else {
        skipped("ui on etcd (browser test)", "chromium or chromium-driver");
        return;
    };
    let etcd = EtcdCluster::start(1).await.expect("etcd");
    // Two apiservers: the workers reach the controller through either, so they keep
    // reporting while the page's one (0) is down.
    let mut fleet = Fleet::new(etcd, 2, 2).expect("fleet dir");
    // A lost host's replicas are replaced after the grace period: short enough to watch.
    let config = fleet.dir.path().join("controller-0.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace(
            "grace_period = \"30s\"",
            &format!("grace_period = \"{GRACE_S}s\""),
        ),
    )
    .unwrap();
    fleet.start_controller(0).unwrap();
    eventually("the controller serves", || async {
        Ok(fleet.controllers[0]
            .as_ref()
            .is_some_and(|d| d.announced())
            .then_some(()))
    })
    .await;
    fleet.start_apiserver(0).unwrap();
    fleet.start_apiserver(1).unwrap();
    fleet.start_workers(2).unwrap();
    let (api, controller) = (fleet.apiserver(0), fleet.controller_api(0));
    wait_for_hosts_of(&api, 2).expect("2 ready hosts through the apiserver");
    for (name, n) in [("web", 3), ("old", 1)] {
        let toml = http_service(name, n).interval("500ms").toml();
        assert_eq!(api.submit_toml(&toml).await.unwrap().0, 201, "{name}");
        api.wait_ready(name, n as usize).await;
    }

    // --- web's endpoints, from the apiserver, and a killed replica followed ---
    browser.open(&api.base, ADMIN).await;
    browser.select("default/web").await;
    let rows = page_shows_endpoints(&browser, 3).await;
    let mut shown: Vec<String> = rows.iter().map(|r| r[3].clone()).collect();
    let mut listed = api.plain("web").await.unwrap();
    shown.sort();
    listed.sort();
    assert_eq!(shown, listed, "page rows {rows:?}");
    let services: Vec<String> = browser
        .rows("services")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    assert_eq!(services, ["old", "web"]);
    assert_eq!(browser.rows("hosts").await.unwrap().len(), 2);
    let (rows, gone_ms, back_ms) = kill_replica_timed_in_page(&browser, &rows, "1").await;
    println!(
        "SUMMARY ui on a separate apiserver on etcd, killed replica's endpoint: gone from the page after {gone_ms:.0} ms (limit 2000), back after {back_ms:.0} ms"
    );

    // --- a gap: the apiserver restarts with an empty journal while the cluster changes ---
    browser.select("default/old").await;
    page_shows_endpoints(&browser, 1).await;
    let (_, resume_from, resets) = browser.stream_state().await.unwrap();
    assert_eq!(resets, 0, "no reset before the gap");
    let resume_from: u64 = resume_from.parse().expect("the page holds an event id");
    fleet.kill_9_apiserver(0);
    eventually("the page says its stream is down", || async {
        Ok((browser.conn_state().await? != "live").then_some(()))
    })
    .await;
    let victim = rows.iter().find(|r| r[0] == "0").expect("replica 0")[3].clone();
    kill_replica_listening_on(&victim).unwrap();
    assert_eq!(
        controller
            .delete("/v1/services/old?now=true")
            .await
            .unwrap(),
        202
    );
    eventually(
        "on the controller: old gone, web's replica 0 replaced",
        || async {
            let (old, _, _) = controller.get("/v1/services/old/endpoints").await?;
            let web = controller.plain("web").await?;
            Ok((old == 404 && web.len() == 3 && !web.contains(&victim)).then_some(()))
        },
    )
    .await;
    let restarted = std::time::Instant::now();
    fleet.start_apiserver(0).unwrap();
    // Its page reconnects by itself (its backoff grew while the apiserver was away).
    let (entries, resumed_at, resets) = eventually(
        "the page took a reset and rebuilt from the snapshot",
        || async {
            let (entries, last, resets) = browser.stream_state().await?;
            let live = browser.conn_state().await? == "live";
            let services = browser.rows("services").await?;
            let services: Vec<&str> = services.iter().map(|r| r[0].as_str()).collect();
            if !(live && resets > 0 && entries == ["default/web"] && services == ["web"]) {
                // The failure message shows where the page stood.
                bail!("live {live}, resets {resets}, entries {entries:?}, services {services:?}");
            }
            Ok(Some((entries, last, resets)))
        },
    )
    .await;
    let rebuilt = restarted.elapsed();
    assert_eq!(resets, 1, "one reset for one gap");
    assert_eq!(entries, ["default/web"]);
    let resumed_at: u64 = resumed_at.parse().unwrap();
    assert!(
        resumed_at > resume_from,
        "the snapshot's id {resumed_at} is past the page's {resume_from}"
    );
    // The service that was shown is gone: its rows too, also from the hidden markup.
    assert_eq!(
        browser.rows("endpoints").await.unwrap(),
        Vec::<Vec<String>>::new()
    );
    let hidden = browser
        .js(
            "return document.getElementById('endpoints-section').hidden;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        hidden, true,
        "the endpoints of a deleted service still shown"
    );
    let conn = browser
        .js(
            "const c = document.getElementById('conn'); return [c.innerText, c.title];",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        conn[0].as_str().unwrap().contains("resynced")
            && conn[1].as_str().unwrap().contains("1 time"),
        "the page says it was rebuilt from a snapshot: {conn}"
    );
    // web: exactly the endpoints there are now, each once.
    browser.select("default/web").await;
    let now = eventually("the page shows web as the apiserver lists it", || async {
        let rows = browser.rows("endpoints").await?;
        let mut shown: Vec<String> = rows.iter().map(|r| r[3].clone()).collect();
        let mut listed = api.plain("web").await?;
        shown.sort();
        listed.sort();
        Ok((shown == listed).then_some(shown))
    })
    .await;
    let mut once = now.clone();
    once.dedup();
    assert_eq!((now.len(), once.len()), (3, 3), "{now:?}");
    assert!(!now.contains(&victim), "{now:?}");
    println!(
        "FIGURE ui reset: the page resumed from id {resume_from} on an apiserver restarted at a later revision; it took 1 reset and a snapshot (now at id {resumed_at}) and showed only web's 3 current endpoints, {:.1} s after the restart (its reconnect backoff included)",
        rebuilt.as_secs_f64()
    );

    // --- a host lost: the hosts view says so at once, the endpoints on it leave the list
    // at `unreachable_after` (their ports kept until the grace period), then they move ---
    eventually("both hosts ready again", || async {
        let hosts = browser.rows("hosts").await?;
        Ok((hosts.len() == 2 && hosts.iter().all(|h| h[1] == "ready")).then_some(()))
    })
    .await;
    // The host of web's first endpoint is lost (worker `exec-0N` is worker N-1).
    let rows = browser.rows("endpoints").await.unwrap();
    let (lost_host, w) = match rows[0][2].as_str() {
        "exec-01" => ("exec-01", 0),
        "exec-02" => ("exec-02", 1),
        other => panic!("web on an unknown host {other}: {rows:?}"),
    };
    let other_host = ["exec-01", "exec-02"][1 - w];
    let on_lost: Vec<&str> = rows
        .iter()
        .filter(|r| r[2] == lost_host)
        .map(|r| r[3].as_str())
        .collect();
    let killed = std::time::Instant::now();
    signal(fleet.workers[w].id(), libc::SIGKILL);
    // On a busy machine the page may only be looked at once the host is lost already.
    let flagged = eventually(
        &format!("the page shows {lost_host} unreachable and its endpoints gone"),
        || async {
            let hosts = browser.rows("hosts").await?;
            let rows = browser.rows("endpoints").await?;
            let lost = hosts
                .iter()
                .find(|h| h[0] == lost_host)
                .context("the lost host listed")?;
            let still: Vec<&str> = rows
                .iter()
                .map(|r| r[3].as_str())
                .filter(|a| on_lost.contains(a))
                .collect();
            if !(lost[1] == "unreachable" || lost[1] == "lost") || !still.is_empty() {
                bail!("{lost_host} {:?}, endpoints {rows:?}", lost[1]);
            }
            Ok(Some(killed.elapsed()))
        },
    )
    .await;
    let moved = eventually(
        &format!("the page shows {lost_host} lost and web's 3 endpoints on {other_host}"),
        || async {
            let hosts = browser.rows("hosts").await?;
            let lost = hosts
                .iter()
                .find(|h| h[0] == lost_host)
                .context("the lost host listed")?;
            let rows = browser.rows("endpoints").await?;
            let mut shown: Vec<String> = rows.iter().map(|r| r[3].clone()).collect();
            let mut listed = api.plain("web").await?;
            shown.sort();
            listed.sort();
            if lost[1] != "lost"
                || rows.len() != 3
                || rows.iter().any(|r| r[2] != other_host)
                || shown != listed
            {
                bail!(
                    "{lost_host} {:?}, endpoints {rows:?}, listed {listed:?}",
                    lost[1]
                );
            }
            Ok(Some(killed.elapsed()))
        },
    )
    .await;
    println!(
        "FIGURE ui host loss (unreachable_after 3 s, grace_period {GRACE_S} s): after the worker's SIGKILL the page showed {lost_host} unreachable with its {} endpoint(s) gone after {:.1} s, and {lost_host} lost with web's 3 endpoints on {other_host} after {:.1} s",
        on_lost.len(),
        flagged.as_secs_f64(),
        moved.as_secs_f64()
    );
    browser.close().await;
}

/// The grace period of the etcd test's controller: how long a lost host's replicas stay.
const GRACE_S: u64 = 10;

/// The meta labels the page shows (text of each), how many images the page holds, and
/// whether the markup-looking label ran (`window.__xss`).
async fn meta_chips(b: &Browser) -> Value {
    b.js(
        "return { chips: Array.from(document.querySelectorAll('#ep-meta li')).map(li => li.textContent), \
                  imgs: document.querySelectorAll('img').length, \
                  xss: window.__xss === undefined ? null : window.__xss };",
        vec![],
    )
    .await
    .unwrap()
}

/// Fails if `text` names team-a or any of web's endpoints.
fn check_no_team_a(text: &str, web_addrs: &[String]) -> Result<()> {
    if text.contains("team-a") {
        bail!("team-a appears: {text}");
    }
    if let Some(a) = web_addrs.iter().find(|a| text.contains(a.as_str())) {
        bail!("team-a's endpoint {a} appears: {text}");
    }
    Ok(())
}
