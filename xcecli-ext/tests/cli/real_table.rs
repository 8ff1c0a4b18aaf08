//! The client against the real endpoint routes of `endpoint-table` (not the fake): the
//! contract between the two crates, checked on loopback.

use crate::{bounded, setup, spawn};
use endpoint_table::{EndpointApi, Entry, TableConfig, Update};
use expect_test::expect;
use plugin_api::{ApiContext, ApiExtension, Permission, Principal, PrincipalKind};
use serde_json::json;
use std::sync::Arc;

const TOKEN: &str = "alice-example-secret";

fn entry(index: u64, third_ready: bool) -> Arc<Entry> {
    entry_in("team-a", index, third_ready)
}

/// `web` of `project`.
fn entry_in(project: &str, index: u64, third_ready: bool) -> Arc<Entry> {
    let entry = json!({
        "service": "web", "project": project, "index": index,
        "ports": [{"name": "http", "protocol": "tcp"}, {"name": "admin-api", "protocol": "tcp"}],
        "replicas": [
            {"replica": 0, "job": "j-1", "host": "exec-01", "address": "127.0.0.11",
             "ports": {"http": 20417, "admin-api": 20418}, "state": "running", "ready": true},
            {"replica": 1, "job": "j-2", "host": "exec-02", "address": "fd00::12",
             "ports": {"http": 20533, "admin-api": 20534}, "state": "running", "ready": true},
            {"replica": 2, "job": "j-3", "host": "exec-03",
             "address": if third_ready { json!("127.0.0.13") } else { json!(null) },
             "ports": {"http": 20101, "admin-api": 20102},
             "state": if third_ready { "running" } else { "placed" }, "ready": third_ready},
        ],
    });
    Arc::new(serde_json::from_value(entry).unwrap())
}

/// Serves the real routes (`web` in team-a, alice may view team-a); returns the API and
/// its URL.
async fn serve() -> (Arc<EndpointApi>, String) {
    serve_with(vec![entry(5, false)], &["team-a"]).await
}

/// Serves the real routes with `entries`, alice viewing `projects`.
async fn serve_with(entries: Vec<Arc<Entry>>, projects: &[&str]) -> (Arc<EndpointApi>, String) {
    let api = Arc::new(EndpointApi::standalone(TableConfig::default()));
    api.apply(Update::Resync { entries, rev: 0 });
    let alice = Principal {
        credential: Default::default(),
        name: "alice".into(),
        kind: PrincipalKind::User,
        grants: vec![(
            Permission::JobView,
            projects.iter().map(|p| (*p).to_owned()).collect(),
        )],
    };
    let router = api.router(ApiContext::for_test(vec![(TOKEN.into(), alice)]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (api, url)
}

/// Runs `line` (with `setup`'s markers) with alice's token instead of the fake's.
async fn run(url: &str, line: &str) -> (i32, String, String) {
    let (mut s, args) = setup(url, line);
    if s.token.as_deref() == Some(crate::fake::TOKEN) {
        s.token = Some(TOKEN.to_owned());
    }
    spawn(s, args).finish().await
}

#[tokio::test]
async fn formats_and_errors_against_the_real_routes() {
    bounded(async {
        let (_api, url) = serve().await;
        let mut actual = String::new();
        for line in [
            "service endpoints web -o plain --port http",
            "service endpoints web -o env",
            "service endpoints web -o json --port admin-api",
            "@tty service endpoints web --all",
            "service endpoints web -o plain",
            "service endpoints web --port nope",
            "service endpoints ghost",
            "@badtoken service endpoints web",
        ] {
            let (code, out, err) = run(&url, line).await;
            actual.push_str(&format!("$ {line}\nexit {code}\n{out}{err}\n"));
        }
        expect![[r#"
            $ service endpoints web -o plain --port http
            exit 0
            127.0.0.11:20417
            [fd00::12]:20533

            $ service endpoints web -o env
            exit 0
            XCE_ENDPOINTS_ADMIN_API=127.0.0.11:20418,[fd00::12]:20534
            XCE_ENDPOINTS_HTTP=127.0.0.11:20417,[fd00::12]:20533

            $ service endpoints web -o json --port admin-api
            exit 0
            {"service":"web","project":"team-a","index":5,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"admin-api":20418}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::12","ports":{"admin-api":20534}}]}

            $ @tty service endpoints web --all
            exit 0
            REPLICA  HOST     ADDRESS     PORTS                       READY  STATE
            0        exec-01  127.0.0.11  admin-api=20418,http=20417  yes    running
            1        exec-02  fd00::12    admin-api=20534,http=20533  yes    running
            2        exec-03  -           admin-api=20102,http=20101  no     placed

            $ service endpoints web -o plain
            exit 2
            error: service "web" has several ports (admin-api, http): -o plain prints one
            hint: pass --port admin-api, or use -o env or -o json

            $ service endpoints web --port nope
            exit 1
            error: port: service "web" has no port "nope" (it declares: http, admin-api)

            $ service endpoints ghost
            exit 4
            error: service "ghost" not found
            hint: `xcecli service list` shows the services you may view

            $ @badtoken service endpoints web
            exit 5
            error: not authenticated: invalid bearer token
            hint: set XCE_TOKEN, pass --token, or run `xced dev` which writes the client config

        "#]].assert_eq(&actual);
    })
    .await;
}

#[tokio::test]
async fn watch_and_wait_ready_against_the_real_routes() {
    bounded(async {
        let (api, url) = serve().await;
        let (mut s, args) = setup(&url, "service endpoints web -o env --port http --watch");
        s.token = Some(TOKEN.to_owned());
        let watch = spawn(s, args);
        let (mut s, args) = setup(&url, "service endpoints web --port http --wait-ready 3");
        s.token = Some(TOKEN.to_owned());
        let wait = spawn(s, args);
        watch.stdout.wait_for(|t| t.lines().count() == 1).await;
        // A change wakes the watcher (blocked on index 5) and satisfies the waiter (blocked
        // too, or reading its first answer after the change).
        api.apply(Update::Change {
            change: endpoint_table::Change::Upsert {
                entry: entry(6, true),
            },
        });
        let (code, out, err) = wait.finish().await;
        assert_eq!(code, 0, "{err}");
        let watched = watch.stdout.wait_for(|t| t.lines().count() == 2).await;
        watch.task.abort();
        expect![[r#"
            XCE_ENDPOINTS_HTTP=127.0.0.11:20417,[fd00::12]:20533
            XCE_ENDPOINTS_HTTP=127.0.0.11:20417,[fd00::12]:20533,127.0.0.13:20101
            ---
            127.0.0.11:20417
            [fd00::12]:20533
            127.0.0.13:20101
        "#]]
        .assert_eq(&format!("{watched}---\n{out}"));
    })
    .await;
}

/// Two projects with a `web`, both visible to alice: the real 409 `ambiguous` becomes the
/// hint; `--project` and the default project pick one; a project alice cannot view (or
/// that has no `web`) is the same 404.
#[tokio::test]
async fn projects_against_the_real_routes() {
    bounded(async {
        let (_api, url) = serve_with(
            vec![entry_in("team-a", 5, false), entry_in("team-b", 7, true)],
            &["team-a", "team-b"],
        )
        .await;
        let mut actual = String::new();
        for line in [
            "service endpoints web --port http",
            "service endpoints web --port http --watch",
            "service endpoints web --port http --project team-b",
            "@XCE_PROJECT=team-a service endpoints web --port http",
            "service endpoints web --port http --project team-c",
        ] {
            let (code, out, err) = run(&url, line).await;
            actual.push_str(&format!("$ {line}\nexit {code}\n{out}{err}\n"));
        }
        expect![[r#"
            $ service endpoints web --port http
            exit 1
            error: service "web" exists in several of your projects (team-a, team-b)
            hint: pick one with --project P (or set XCE_PROJECT), e.g. --project team-a

            $ service endpoints web --port http --watch
            exit 1
            error: service "web" exists in several of your projects (team-a, team-b)
            hint: pick one with --project P (or set XCE_PROJECT), e.g. --project team-a

            $ service endpoints web --port http --project team-b
            exit 0
            127.0.0.11:20417
            [fd00::12]:20533
            127.0.0.13:20101

            $ @XCE_PROJECT=team-a service endpoints web --port http
            exit 0
            127.0.0.11:20417
            [fd00::12]:20533

            $ service endpoints web --port http --project team-c
            exit 4
            error: service "web" not found
            hint: looked in project team-c only; `xcecli service list` shows the services you may view and their projects

        "#]].assert_eq(&actual);
    })
    .await;
}

/// A watch on a bare name keeps to the project of its first answer: team-b getting a `web`
/// too (which makes the bare name ambiguous) neither ends it nor switches it.
#[tokio::test]
async fn a_watch_keeps_its_project_against_the_real_routes() {
    bounded(async {
        let (api, url) =
            serve_with(vec![entry_in("team-a", 5, false)], &["team-a", "team-b"]).await;
        let (mut s, args) = setup(&url, "service endpoints web -o plain --port http --watch");
        s.token = Some(TOKEN.to_owned());
        let watch = spawn(s, args);
        watch.stdout.wait_for(|t| t.lines().count() == 3).await;
        for entry in [entry_in("team-b", 6, true), entry_in("team-a", 7, true)] {
            api.apply(Update::Change {
                change: endpoint_table::Change::Upsert { entry },
            });
        }
        let watched = watch.stdout.wait_for(|t| t.lines().count() == 7).await;
        watch.task.abort();
        assert_eq!(watch.stderr.text(), "");
        expect![[r#"
            127.0.0.11:20417
            [fd00::12]:20533

            127.0.0.11:20417
            [fd00::12]:20533
            127.0.0.13:20101

        "#]]
        .assert_eq(&watched);
    })
    .await;
}

/// A watch outlives its service's absence (usability 6): started before the service
/// exists it says so once and waits (a blocking query the real routes answer when the
/// service appears); the service going away prints an empty list (a blank line right
/// after the blank line that ends the list before), and its return the list again, all
/// from one run.
#[tokio::test]
async fn a_watch_waits_for_its_service_and_survives_its_removal() {
    bounded(async {
        let (api, url) = serve_with(Vec::new(), &["team-a"]).await;
        let (mut s, args) = setup(&url, "service endpoints web -o plain --port http --watch");
        s.token = Some(TOKEN.to_owned());
        let watch = spawn(s, args);
        watch
            .stderr
            .wait_for(|t| t.contains("waiting for service web to exist"))
            .await;
        assert_eq!(
            watch.stdout.text(),
            "",
            "nothing printed while it does not exist"
        );
        let upsert = |entry| {
            api.apply(Update::Change {
                change: endpoint_table::Change::Upsert { entry },
            })
        };
        upsert(entry(5, false));
        watch.stdout.wait_for(|t| t.lines().count() == 3).await;
        api.apply(Update::Change {
            change: endpoint_table::Change::Removed {
                service: "web".into(),
                project: "team-a".into(),
                index: 6,
            },
        });
        watch.stdout.wait_for(|t| t.lines().count() == 4).await;
        upsert(entry(9, true));
        let watched = watch.stdout.wait_for(|t| t.lines().count() == 8).await;
        assert!(!watch.task.is_finished(), "still watching");
        watch.task.abort();
        assert_eq!(
            watch.stderr.text(),
            "waiting for service web to exist\n",
            "said once"
        );
        expect![[r#"
            127.0.0.11:20417
            [fd00::12]:20533


            127.0.0.11:20417
            [fd00::12]:20533
            127.0.0.13:20101

        "#]]
        .assert_eq(&watched);
    })
    .await;
}
