//! Hermetic CLI tests: the commands parsed by clap as the binary does, run against a fake
//! apiserver on loopback, with every output snapshotted and every exit code asserted.

mod fake;
mod no_leader;
mod old_server;
mod projects;
mod real_table;
mod service;

use clap::Parser;
use expect_test::{expect, Expect};
use fake::{Fake, TOKEN};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use xcecli_ext::{execute, ClientConfig, Command, Io};

/// Every test finishes well within this, or fails.
const BOUND: Duration = Duration::from_secs(60);

async fn bounded<F: std::future::Future>(fut: F) -> F::Output {
    tokio::time::timeout(BOUND, fut)
        .await
        .expect("test ran past its bound")
}

#[derive(Parser)]
#[command(name = "xcecli")]
struct TestCli {
    #[command(subcommand)]
    command: Command,
}

/// A writer the test can read back and wait on.
#[derive(Clone)]
struct Capture {
    buf: Arc<Mutex<Vec<u8>>>,
    tick: Arc<watch::Sender<()>>,
}

impl Capture {
    fn new() -> Self {
        Self {
            buf: Arc::default(),
            tick: Arc::new(watch::channel(()).0),
        }
    }

    fn text(&self) -> String {
        String::from_utf8(self.buf.lock().unwrap().clone()).unwrap()
    }

    /// Waits until the text so far satisfies `pred` and returns it.
    async fn wait_for(&self, pred: impl Fn(&str) -> bool) -> String {
        let mut rx = self.tick.subscribe();
        loop {
            let t = self.text();
            if pred(&t) {
                return t;
            }
            rx.changed().await.unwrap();
        }
    }
}

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.lock().unwrap().extend_from_slice(b);
        self.tick.send_replace(());
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How a command is run: which api, which token, which default project, which terminals.
struct Setup {
    api: String,
    token: Option<String>,
    /// What the binary passes from `XCE_PROJECT` (or the config file's `project`).
    project: Option<String>,
    stdout_tty: bool,
    stderr_tty: bool,
}

/// A running command.
struct Running {
    stdout: Capture,
    stderr: Capture,
    task: tokio::task::JoinHandle<i32>,
}

impl Running {
    async fn finish(self) -> (i32, String, String) {
        let code = self.task.await.unwrap();
        (code, self.stdout.text(), self.stderr.text())
    }
}

fn spawn(setup: Setup, args: Vec<String>) -> Running {
    let stdout = Capture::new();
    let stderr = Capture::new();
    let (out, err) = (stdout.clone(), stderr.clone());
    let task = tokio::spawn(async move {
        let mut io = Io::new(
            Box::new(out),
            Box::new(err.clone()),
            setup.stdout_tty,
            setup.stderr_tty,
        );
        match TestCli::try_parse_from(std::iter::once("xcecli".to_owned()).chain(args)) {
            // As the binary does: clap prints its own error, exit 2.
            Err(e) => {
                write!(io.stderr, "{}", e.render()).unwrap();
                e.exit_code()
            }
            Ok(cli) => {
                let config = ClientConfig {
                    api: setup.api,
                    ca_file: None,
                    token: setup.token,
                    project: setup.project,
                };
                execute(cli.command, config, &mut io).await
            }
        }
    });
    Running {
        stdout,
        stderr,
        task,
    }
}

/// Starts `line` (prefixes as [`setup`] reads them) against the fake.
fn start(fake: &Fake, line: &str) -> Running {
    let (setup, args) = setup(&fake.url(), line);
    spawn(setup, args)
}

/// Parses `@tty`, `@tty-err`, `@notoken`, `@badtoken`, `@api=URL`, `@XCE_PROJECT=P`
/// prefixes, then the args.
fn setup(fake_url: &str, line: &str) -> (Setup, Vec<String>) {
    let mut s = Setup {
        api: fake_url.to_owned(),
        token: Some(TOKEN.to_owned()),
        project: None,
        stdout_tty: false,
        stderr_tty: false,
    };
    let mut args = Vec::new();
    for w in line.split_whitespace() {
        match w {
            "@tty" => (s.stdout_tty, s.stderr_tty) = (true, true),
            "@tty-err" => s.stderr_tty = true,
            "@notoken" => s.token = None,
            "@badtoken" => s.token = Some("wrong".into()),
            w if w.starts_with("@api=") => s.api = w["@api=".len()..].to_owned(),
            w if w.starts_with("@XCE_PROJECT=") => {
                s.project = Some(w["@XCE_PROJECT=".len()..].to_owned())
            }
            w => args.push(w.to_owned()),
        }
    }
    (s, args)
}

/// Runs `line` to completion and snapshots exit code, stdout and stderr (the fake's
/// address replaced by `API`).
async fn check(fake_url: &str, line: &str, expect: Expect) {
    let (setup, args) = setup(fake_url, line);
    let (code, out, err) = spawn(setup, args).finish().await;
    let addr = fake_url.trim_start_matches("http://");
    let mut actual = format!("exit {code}\n{out}");
    if !err.is_empty() {
        actual.push_str("--- stderr\n");
        actual.push_str(&err);
    }
    expect.assert_eq(&actual.replace(addr, "API"));
}

#[tokio::test]
async fn endpoint_formats() {
    bounded(async {
        let fake = Fake::start().await;
        let u = &fake.url();
        check(u, "@tty service endpoints web", expect![[r#"
            exit 0
            REPLICA  HOST     ADDRESS     PORTS
            0        exec-01  127.0.0.11  http=20417
            1        exec-02  127.0.0.12  http=20533
        "#]]).await;
        check(u, "@tty service endpoints web --all", expect![[r#"
            exit 0
            REPLICA  HOST     ADDRESS     PORTS       READY  STATE
            0        exec-01  127.0.0.11  http=20417  yes    -
            1        exec-02  127.0.0.12  http=20533  yes    -
            2        exec-03  127.0.0.13  http=20101  no     running
        "#]]).await;
        // Not a terminal, one port: plain.
        check(u, "service endpoints web", expect![[r#"
            exit 0
            127.0.0.11:20417
            127.0.0.12:20533
        "#]]).await;
        check(u, "service endpoints web -o plain", expect![[r#"
            exit 0
            127.0.0.11:20417
            127.0.0.12:20533
        "#]]).await;
        check(u, "service endpoints web -o json", expect![[r#"
            exit 0
            {"endpoints":[{"address":"127.0.0.11","host":"exec-01","job":"j-17","ports":{"http":20417},"replica":0},{"address":"127.0.0.12","host":"exec-02","job":"j-18","ports":{"http":20533},"replica":1}],"index":40,"project":"default","service":"web"}
        "#]]).await;
        check(u, "service endpoints web -o env", expect![[r#"
            exit 0
            XCE_ENDPOINTS_HTTP=127.0.0.11:20417,127.0.0.12:20533
        "#]]).await;
        // Not a terminal, several ports: json.
        check(u, "service endpoints api", expect![[r#"
            exit 0
            {"endpoints":[{"address":"127.0.0.11","host":"exec-01","job":"j-21","ports":{"http":20001,"metrics":9100},"replica":0},{"address":"127.0.0.12","host":"exec-02","job":"j-22","ports":{"http":20002,"metrics":9100},"replica":1}],"index":41,"project":"team-a","service":"api"}
        "#]]).await;
        check(u, "service endpoints api --port metrics", expect![[r#"
            exit 0
            127.0.0.11:9100
            127.0.0.12:9100
        "#]]).await;
        check(u, "service endpoints api -o env", expect![[r#"
            exit 0
            XCE_ENDPOINTS_HTTP=127.0.0.11:20001,127.0.0.12:20002
            XCE_ENDPOINTS_METRICS=127.0.0.11:9100,127.0.0.12:9100
        "#]]).await;
        // Nothing ready: the declared ports still get a line, so eval clears them.
        check(u, "service endpoints batch -o env", expect![[r#"
            exit 0
            XCE_ENDPOINTS_ADMIN_API=
            XCE_ENDPOINTS_GRPC=
        "#]]).await;
        check(u, "@tty service endpoints batch", expect![[r#"
            exit 0
            no ready endpoints for service batch (index 42)
        "#]]).await;
        check(u, "service endpoints batch", expect![[r#"
            exit 0
            {"endpoints":[],"index":42,"project":"default","service":"batch"}
        "#]]).await;
    })
    .await;
}

#[tokio::test]
async fn usage_errors_exit_2() {
    bounded(async {
        let fake = Fake::start().await;
        let u = &fake.url();
        check(
            u,
            "service endpoints api -o plain",
            expect![[r#"
            exit 2
            --- stderr
            error: service "api" has several ports (http, metrics): -o plain prints one
            hint: pass --port http, or use -o env or -o json
        "#]],
        )
        .await;
        check(
            u,
            "service endpoints web -o env --all",
            expect![[r#"
            exit 2
            --- stderr
            error: --all shows replicas that are not ready, which -o env never prints
            hint: use --all with -o table or -o json
        "#]],
        )
        .await;
        check(
            u,
            "service endpoints web --exec true",
            expect![[r#"
            exit 2
            --- stderr
            error: the following required arguments were not provided:
              --watch

            Usage: xcecli service endpoints --watch --exec <CMD> <NAME>

            For more information, try '--help'.
        "#]],
        )
        .await;
        check(
            u,
            "service endpoints web -o yaml",
            expect![[r#"
            exit 2
            --- stderr
            error: invalid value 'yaml' for '--output <OUTPUT>'
              [possible values: table, json, plain, env]

            For more information, try '--help'.
        "#]],
        )
        .await;
        check(
            u,
            "service endpoints web --wait-ready 0",
            expect![[r#"
            exit 2
            --- stderr
            error: invalid value '0' for '--wait-ready <N>': 0 is not in 1..=4294967295

            For more information, try '--help'.
        "#]],
        )
        .await;
        // Only the first one needed an answer (to learn the ports); the others were
        // refused before any request.
        let paths: Vec<String> = fake.log().into_iter().map(|l| l.path).collect();
        assert_eq!(paths, ["/v1/services/api/endpoints"]);
    })
    .await;
}

#[tokio::test]
async fn error_kinds_and_exit_codes() {
    bounded(async {
        let fake = Fake::start().await;
        let u = &fake.url();
        check(
            u,
            "@notoken service endpoints web",
            expect![[r#"
            exit 5
            --- stderr
            error: not authenticated: missing bearer token
            hint: set XCE_TOKEN, pass --token, or run `xced dev` which writes the client config
        "#]],
        )
        .await;
        check(
            u,
            "@badtoken host list",
            expect![[r#"
            exit 5
            --- stderr
            error: not authenticated: invalid bearer token
            hint: set XCE_TOKEN, pass --token, or run `xced dev` which writes the client config
        "#]],
        )
        .await;
        check(
            u,
            "service endpoints ghost",
            expect![[r#"
            exit 4
            --- stderr
            error: service "ghost" not found
            hint: `xcecli service list` shows the services you may view
        "#]],
        )
        .await;
        check(
            u,
            "service stop ghost",
            expect![[r#"
            exit 4
            --- stderr
            error: service "ghost" not found
            hint: `xcecli service list` shows the services you may view
        "#]],
        )
        .await;
        check(
            u,
            "service endpoints web --port nope",
            expect![[r#"
                exit 1
                --- stderr
                error: port: service "web" has no port "nope"
            "#]],
        )
        .await;
        // https:// to a server that speaks plain HTTP: said so, exit 1.
        let tls_url = u.replacen("http://", "https://", 1);
        check(
            u,
            &format!("@api={tls_url} service list"),
            expect![[r#"
            exit 1
            --- stderr
            error: cannot reach the apiserver at https://API/v1/services: the server does not speak TLS (use http:// for it?)
            hint: the CA comes from --ca-file, XCE_CA_FILE or the config file's ca_file
        "#]],
        )
        .await;

        // A port nobody listens on: bind one, then let it go.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = format!("http://{}", free.local_addr().unwrap());
        drop(free);
        let (setup, args) = setup(&dead, "service endpoints web -o plain");
        let (code, out, err) = spawn(setup, args).finish().await;
        assert_eq!((code, out.as_str()), (1, ""), "{err}");
        let tried = format!("{dead}/v1/services/web/endpoints");
        assert!(
            err.starts_with(&format!("error: cannot reach the apiserver at {tried}: ")),
            "{err}"
        );
        assert!(err.contains("hint: is the apiserver running"), "{err}");
    })
    .await;
}

/// `--api A,B`: an apiserver that cannot be connected to is skipped for the next one; when
/// none can, the error names every one tried.
#[tokio::test]
async fn several_apiservers_fail_over_on_connection_errors() {
    bounded(async {
        let fake = Fake::start().await;
        let dead = |_: ()| {
            let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}", free.local_addr().unwrap());
            drop(free);
            url
        };
        let (d1, d2) = (dead(()), dead(()));
        let apis = format!("{d1},{}", fake.url());
        let (s, args) = setup(&apis, "service endpoints web -o plain");
        let (code, out, err) = spawn(s, args).finish().await;
        assert_eq!(code, 0, "{err}");
        assert!(!out.is_empty() && err.is_empty(), "{out}{err}");

        let (s, args) = setup(&format!("{d1},{d2}"), "service list");
        let (code, out, err) = spawn(s, args).finish().await;
        assert_eq!((code, out.as_str()), (1, ""), "{err}");
        assert!(
            err.starts_with(&format!(
                "error: cannot reach the apiserver at {d2}/v1/services: "
            )) && err.contains(&format!("(could not connect to {d1}/v1/services either)")),
            "{err}"
        );
    })
    .await;
}

/// `--api A,B`: an apiserver failing closed (503 `stale`: behind the store by more than
/// its `max_lag`) is skipped for the next one, as a load balancer health-checking
/// `/healthz` would; with no next one, its 503 is the answer.
#[tokio::test]
async fn a_stale_apiserver_is_skipped_for_the_next_one() {
    bounded(async {
        let fake = Fake::start().await;
        let stale = axum::Router::new().fallback(|| async {
            (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                [("retry-after", "1"), ("content-type", "application/json")],
                r#"{"error":{"code":"stale","message":"this apiserver is 2s 300ms behind the store (max_lag 2s)","details":[]}}"#,
            )
        });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stale_url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, stale).await.unwrap() });
        let (s, args) = setup(
            &format!("{stale_url},{}", fake.url()),
            "service endpoints web -o plain",
        );
        let (code, out, err) = spawn(s, args).finish().await;
        assert_eq!(code, 0, "{err}");
        assert!(!out.is_empty() && err.is_empty(), "{out}{err}");

        let (s, args) = setup(&stale_url, "service endpoints web -o plain");
        let (code, out, err) = spawn(s, args).finish().await;
        assert_eq!((code, out.as_str()), (1, ""), "{err}");
        assert!(err.contains("behind the store"), "{err}");
    })
    .await;
}

#[tokio::test]
async fn lists() {
    bounded(async {
        let fake = Fake::start().await;
        let u = &fake.url();
        check(u, "service list", expect![[r#"
            exit 0
            NAME   PROJECT  REPLICAS  READY  PENDING  STATE
            api    team-a   2         2      0        active
            batch  default  1         0      1        active
              pending: port admin-api/tcp 8080 is taken on all 3 hosts
            web    default  3         2      0        active
        "#]]).await;
        check(u, "service list -o json", expect![[r#"
            exit 0
            {"services":[{"index":41,"name":"api","pending":0,"pending_reason":null,"project":"team-a","ready":2,"replicas":2,"running":2,"state":"active"},{"index":42,"name":"batch","pending":1,"pending_reason":"port admin-api/tcp 8080 is taken on all 3 hosts","project":"default","ready":0,"replicas":1,"running":0,"state":"active"},{"index":40,"name":"web","pending":0,"pending_reason":null,"project":"default","ready":2,"replicas":3,"running":3,"state":"active"}]}
        "#]]).await;
        check(u, "host list", expect![[r#"
            exit 0
            ID       STATE  IP_ADDR     ADDRESSES       JOBS  PORTS-USED
            exec-01  ready  127.0.0.11  127.0.0.11(lo)  2     2/12001
            exec-02  ready  127.0.0.12  127.0.0.12(lo)  2     2/12001
            exec-03  ready  127.0.0.13  127.0.0.13(lo)  1     1/12001 (1 unavailable)
            --- stderr
            cluster: 5e1f0c0ffee0a11d
        "#]]).await;
        check(u, "host list -o json", expect![[r#"
            exit 0
            {"cluster":"5e1f0c0ffee0a11d","hosts":[{"addresses":[{"interface":"lo","ip":"127.0.0.11"}],"id":"exec-01","ip_addr":"127.0.0.11","jobs":2,"ports":{"capacity":12001,"range":"20000-32000","unavailable":0,"used":2},"state":"ready"},{"addresses":[{"interface":"lo","ip":"127.0.0.12"}],"id":"exec-02","ip_addr":"127.0.0.12","jobs":2,"ports":{"capacity":12001,"range":"20000-32000","unavailable":0,"used":2},"state":"ready"},{"addresses":[{"interface":"lo","ip":"127.0.0.13"}],"id":"exec-03","ip_addr":"127.0.0.13","jobs":1,"ports":{"capacity":12001,"range":"20000-32000","unavailable":1,"used":1},"state":"ready"}]}
        "#]]).await;
    })
    .await;
}

#[tokio::test]
async fn wait_ready_times_out_with_exit_3() {
    bounded(async {
        let fake = Fake::start().await;
        check(
            &fake.url(),
            "service endpoints web --wait-ready 3 --timeout 300ms",
            expect![[r#"
            exit 3
            --- stderr
            error: service web has 2 of 3 replicas ready after 300ms
            hint: `xcecli service endpoints --all` shows replicas that are not ready
        "#]],
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn wait_ready_prints_once_enough_are_ready() {
    bounded(async {
        let fake = Fake::start().await;
        let run = start(&fake, "@tty-err service endpoints web --wait-ready 3");
        // The progress line shows 2 of 3, and the client is now in a blocking query.
        run.stderr
            .wait_for(|t| t.contains("2/3 replicas ready"))
            .await;
        let before = fake.index("web");
        fake.wait_index(None, before).await;
        assert_eq!(run.stdout.text(), "", "nothing printed before 3 are ready");
        fake.set_ready("web", 2, true);
        let (code, out, err) = run.finish().await;
        assert_eq!(code, 0, "{err}");
        expect![[r#"
            127.0.0.11:20417
            127.0.0.12:20533
            127.0.0.13:20101
        "#]]
        .assert_eq(&out);
        // The progress line was drawn, then cleared.
        expect![[r#""\r\u{1b}[Kwaiting for service web: 2/3 replicas ready\r\u{1b}[K""#]]
            .assert_eq(&format!("{err:?}"));
    })
    .await;
}

/// A warming apiserver answers 503: `--wait-ready` retries it (a one-shot read does not).
#[tokio::test]
async fn wait_ready_retries_a_warming_apiserver() {
    bounded(async {
        let fake = Fake::start().await;
        fake.unavailable_for(2);
        check(&fake.url(), "service endpoints web --wait-ready 2 -o plain", expect![[r#"
            exit 0
            127.0.0.11:20417
            127.0.0.12:20533
            --- stderr
            warning: the apiserver failed (503) on http://API/v1/services/web/endpoints: the endpoint table is catching up; retrying in 200ms
            warning: the apiserver failed (503) on http://API/v1/services/web/endpoints: the endpoint table is catching up; retrying in 400ms
            warning: the apiserver at http://API answers again (index 40)
        "#]]).await;
        fake.unavailable_for(1);
        check(&fake.url(), "service endpoints web -o plain", expect![[r#"
            exit 1
            --- stderr
            error: the apiserver failed (503) on http://API/v1/services/web/endpoints: the endpoint table is catching up
        "#]]).await;
    })
    .await;
}

/// An index change that leaves the rendering as it was prints nothing.
#[tokio::test]
async fn watch_prints_only_changes() {
    bounded(async {
        let fake = Fake::start().await;
        let run = start(&fake, "service endpoints web -o plain --watch");
        run.stdout.wait_for(|t| t.lines().count() == 3).await;
        let first = fake.index("web");
        fake.wait_index(None, first).await;
        let touched = fake.touch("web");
        // The client got the new index (it now blocks on it) and printed nothing.
        fake.wait_index(None, touched).await;
        fake.set_ready("web", 1, false);
        let out = run.stdout.wait_for(|t| t.lines().count() == 5).await;
        run.task.abort();
        // A watch ends each plain list with a blank line.
        expect![[r#"
            127.0.0.11:20417
            127.0.0.12:20533

            127.0.0.11:20417

        "#]]
        .assert_eq(&out);
        assert_eq!(run.stderr.text(), "");
    })
    .await;
}

/// A watch whose service is removed reports an empty list (`--exec` runs with it) and
/// keeps watching. Against an apiserver that cannot wait for an absent service (the fake
/// answers such a blocking query with a 404 at once, as servers before usability 6 did),
/// the looks are spaced by the capped backoff, never a busy loop.
#[tokio::test]
async fn watch_survives_the_removal_of_its_service() {
    bounded(async {
        let fake = Fake::start().await;
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("runs");
        let hook = dir.path().join("hook.sh");
        std::fs::write(
            &hook,
            format!(
                "#!/bin/sh\n{{ echo '--- run'; cat; }} >> '{}'\n",
                runs.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        let line = format!(
            "service endpoints web -o plain --watch --exec {}",
            hook.display()
        );
        let (setup, args) = setup(&fake.url(), &line);
        let run = spawn(setup, args);
        let first = fake.index("web");
        fake.wait_index(None, first).await;
        let before = fake.log().len();
        let removed = std::time::Instant::now();
        fake.remove("web");
        // The parked query answers 404 (logged before); then the looks for the absent
        // service: the first at once, the next after 1s, then 2s.
        let mut at = Vec::new();
        for n in 1..=3 {
            fake.wait_log_len(before + n).await;
            at.push(removed.elapsed());
        }
        let queries: Vec<String> = fake.log()[before..before + 3]
            .iter()
            .map(|l| format!("{} {:?}", l.path, l.query.get("index")))
            .collect();
        println!("FIGURE absent looks after removal at {at:?}");
        // A lower bound only (the sleeps guarantee it); a busy loop would take millis.
        assert!(at[2] - at[0] >= Duration::from_secs(3), "{at:?}");
        assert!(!run.task.is_finished(), "still watching");
        run.task.abort();
        let hook_input = std::fs::read_to_string(&runs).unwrap();
        expect![[r#"
            --- run
            127.0.0.11:20417
            127.0.0.12:20533
            --- run
        "#]]
        .assert_eq(&hook_input);
        assert_eq!(run.stderr.text(), "");
        expect![[r#"
            [
                "/v1/services/web/endpoints Some(\"0\")",
                "/v1/services/web/endpoints Some(\"0\")",
                "/v1/services/web/endpoints Some(\"0\")",
            ]
        "#]]
        .assert_debug_eq(&queries);
    })
    .await;
}

/// `-o env` of a service that went away clears every variable it had set, so an `eval` of
/// the list does not keep the gone endpoints.
#[tokio::test]
async fn watch_env_clears_the_ports_of_a_removed_service() {
    bounded(async {
        let fake = Fake::start().await;
        let run = start(&fake, "service endpoints web -o env --watch");
        run.stdout.wait_for(|t| t.lines().count() == 1).await;
        let first = fake.index("web");
        fake.wait_index(None, first).await;
        fake.remove("web");
        let out = run.stdout.wait_for(|t| t.lines().count() == 2).await;
        run.task.abort();
        expect![[r#"
            XCE_ENDPOINTS_HTTP=127.0.0.11:20417,127.0.0.12:20533
            XCE_ENDPOINTS_HTTP=
        "#]]
        .assert_eq(&out);
    })
    .await;
}

/// On a terminal, each change prints a new table, a blank line apart.
#[tokio::test]
async fn watch_tables_on_a_terminal() {
    bounded(async {
        let fake = Fake::start().await;
        let run = start(&fake, "@tty service endpoints web --watch");
        run.stdout.wait_for(|t| t.lines().count() == 3).await;
        let first = fake.index("web");
        fake.wait_index(None, first).await;
        fake.set_ready("web", 2, true);
        let out = run.stdout.wait_for(|t| t.lines().count() == 8).await;
        run.task.abort();
        expect![[r#"
            REPLICA  HOST     ADDRESS     PORTS
            0        exec-01  127.0.0.11  http=20417
            1        exec-02  127.0.0.12  http=20533

            REPLICA  HOST     ADDRESS     PORTS
            0        exec-01  127.0.0.11  http=20417
            1        exec-02  127.0.0.12  http=20533
            2        exec-03  127.0.0.13  http=20101
        "#]]
        .assert_eq(&out);
    })
    .await;
}

#[tokio::test]
async fn watch_ends_with_exit_0_after_timeout() {
    bounded(async {
        let fake = Fake::start().await;
        check(
            &fake.url(),
            "service endpoints web -o env --watch --timeout 300ms",
            expect![[r#"
            exit 0
            XCE_ENDPOINTS_HTTP=127.0.0.11:20417,127.0.0.12:20533
        "#]],
        )
        .await;
    })
    .await;
}

/// `--watch` prints on each change, and an apiserver restart loses nothing: the client
/// retries (logging it) and resumes its blocking query from the last index it saw.
#[tokio::test]
async fn watch_follows_changes_and_survives_a_restart() {
    bounded(async {
        let mut fake = Fake::start().await;
        let run = start(&fake, "service endpoints web -o plain --watch");
        run.stdout.wait_for(|t| t.lines().count() == 3).await;

        // A change while watching.
        let first = fake.index("web");
        fake.wait_index(None, first).await;
        let second = fake.set_ready("web", 0, false);
        run.stdout.wait_for(|t| t.lines().count() == 5).await;

        // The apiserver goes away; the replica becomes ready meanwhile.
        fake.wait_index(None, second).await;
        fake.stop().await;
        fake.set_ready("web", 2, true);
        run.stderr.wait_for(|t| t.contains("retrying")).await;
        fake.restart().await;
        let out = run.stdout.wait_for(|t| t.lines().count() == 8).await;
        expect![[r#"
            127.0.0.11:20417
            127.0.0.12:20533

            127.0.0.12:20533

            127.0.0.12:20533
            127.0.0.13:20101

        "#]]
        .assert_eq(&out);

        // After the restart, the first query resumed from the last index seen.
        let generation = fake.generation();
        let resumed = fake
            .log()
            .into_iter()
            .find(|l| l.generation == generation && l.path.ends_with("/endpoints"))
            .unwrap();
        assert_eq!(resumed.query.get("index"), Some(&second.to_string()));
        let err = run.stderr.wait_for(|t| t.contains("answers again")).await;
        let addr = fake.addr.to_string();
        let first_line = err.lines().next().unwrap().replace(&addr, "API");
        expect!["warning: cannot reach the apiserver at http://API/v1/services/web/endpoints: Connection refused (os error 111); retrying in 200ms (resuming from index 43)"]
            .assert_eq(&first_line);
        run.task.abort();
    })
    .await;
}

/// `--watch --exec` feeds the list to the command initially and on each change; a failing
/// command is reported and the watch goes on.
#[tokio::test]
async fn watch_exec_runs_the_hook_on_each_change() {
    bounded(async {
        let fake = Fake::start().await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lists");
        let hook = format!(
            "cat >> '{}'; echo '--' >> '{0}'; echo ran; test -e '{0}.fail' && exit 7; true",
            file.display()
        );
        let (setup, mut args) = setup(&fake.url(), "service endpoints web -o env --watch --exec");
        args.push(hook);
        let run = spawn(setup, args);
        run.stdout.wait_for(|t| t.lines().count() == 1).await;

        // Make the hook fail from now on, then change the service.
        std::fs::write(format!("{}.fail", file.display()), "").unwrap();
        let first = fake.index("web");
        fake.wait_index(None, first).await;
        let second = fake.set_ready("web", 2, true);
        run.stderr.wait_for(|t| t.contains("failed")).await;

        // The watch goes on: the next change runs the hook again.
        fake.wait_index(None, second).await;
        fake.set_ready("web", 0, false);
        run.stdout.wait_for(|t| t.lines().count() == 3).await;
        let err = run
            .stderr
            .wait_for(|t| t.matches("failed").count() == 2)
            .await;
        run.task.abort();

        expect![[r#"
            XCE_ENDPOINTS_HTTP=127.0.0.11:20417,127.0.0.12:20533
            --
            XCE_ENDPOINTS_HTTP=127.0.0.11:20417,127.0.0.12:20533,127.0.0.13:20101
            --
            XCE_ENDPOINTS_HTTP=127.0.0.12:20533,127.0.0.13:20101
            --
        "#]]
        .assert_eq(&std::fs::read_to_string(&file).unwrap());
        expect![[r#"
            ran
            ran
            ran
        "#]]
        .assert_eq(&run.stdout.text());
        expect![[r#"
            warning: `HOOK` failed (exit status: 7) for index 43; still watching
            warning: `HOOK` failed (exit status: 7) for index 44; still watching
        "#]]
        .assert_eq(&err.replace(&run_hook_text(&file), "HOOK"));
    })
    .await;
}

fn run_hook_text(file: &std::path::Path) -> String {
    format!(
        "cat >> '{}'; echo '--' >> '{0}'; echo ran; test -e '{0}.fail' && exit 7; true",
        file.display()
    )
}

/// On a terminal, `--exec` still gets a machine format by default (plain for one port).
#[tokio::test]
async fn watch_exec_default_format_is_for_machines() {
    bounded(async {
        let fake = Fake::start().await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("list");
        let (setup, mut args) = setup(&fake.url(), "@tty service endpoints web --watch --exec");
        args.push(format!("cat > '{}'; echo ran", file.display()));
        let run = spawn(setup, args);
        run.stdout.wait_for(|t| t == "ran\n").await;
        run.task.abort();
        expect![[r#"
            127.0.0.11:20417
            127.0.0.12:20533
        "#]]
        .assert_eq(&std::fs::read_to_string(&file).unwrap());
    })
    .await;
}
