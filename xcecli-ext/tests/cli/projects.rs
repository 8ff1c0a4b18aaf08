//! Two projects with a service of the same name (docs/api.md, docs/cli.md): `--project` and the
//! host's default project (what the binary takes from `XCE_PROJECT` or the config file)
//! add `?project=` to every request about the service; without one, the apiserver's 409
//! `ambiguous` is a final error that names the projects and `--project`; `submit` checks
//! `--project` against the file, which decides.

use crate::fake::{Fake, WEB_TOML};
use crate::service::{check_in, finish, requests, rollout, write};
use crate::{bounded, check, start};
use expect_test::expect;
use std::path::Path;

/// `web` in project `default` (ports 20417, 20533; replica 2 not ready) and in `team-b`
/// (the same on ports 21417, 21533).
async fn two_webs() -> Fake {
    let fake = Fake::start().await;
    fake.add_copy("web", "team-b");
    fake
}

/// `WEB_TOML` for `project`.
fn web_toml(project: &str) -> String {
    WEB_TOML.replace(
        "name = \"web\"\n",
        &format!("name = \"web\"\nproject = \"{project}\"\n"),
    )
}

#[tokio::test]
async fn list_shows_both() {
    bounded(async {
        let fake = two_webs().await;
        check(
            &fake.url(),
            "service list",
            expect![[r#"
                exit 0
                NAME   PROJECT  REPLICAS  READY  PENDING  STATE
                api    team-a   2         2      0        active
                batch  default  1         0      1        active
                  pending: port admin-api/tcp 8080 is taken on all 3 hosts
                web    default  3         2      0        active
                web    team-b   3         2      0        active
            "#]],
        )
        .await;
    })
    .await;
}

/// Without a project, every command on an ambiguous name fails at once (exit 1) with the
/// projects and the hint: one request each, never a retry, `--watch`, `--wait-ready` and
/// `--wait` included.
#[tokio::test]
async fn an_ambiguous_name_is_a_final_error() {
    bounded(async {
        let fake = two_webs().await;
        let dir = Path::new("/nonexistent");
        check_in(
            &fake,
            dir,
            "service endpoints web",
            expect![[r#"
                exit 1
                --- stderr
                error: service "web" exists in several of your projects (default, team-b)
                hint: pick one with --project P (or set XCE_PROJECT), e.g. --project default
            "#]],
        )
        .await;
        let same = [
            "service endpoints web --watch",
            "service endpoints web --wait-ready 3 --timeout 10s",
            "service endpoints web --watch --exec cat",
            "service status web",
            "service scale web 5 --wait",
            "service restart web --wait",
            "service stop web --now",
        ];
        let first = fake.log().len();
        for line in same {
            let before = fake.log().len();
            let (code, out, err) = start(&fake, line).finish().await;
            assert_eq!((code, out.as_str()), (1, ""), "{line}: {err}");
            assert_eq!(
                err,
                "error: service \"web\" exists in several of your projects (default, team-b)\n\
                 hint: pick one with --project P (or set XCE_PROJECT), e.g. --project default\n",
                "{line}"
            );
            assert_eq!(fake.log().len(), before + 1, "{line}: one request only");
        }
        expect![[r#"
            [
                "/v1/services/web/endpoints ?",
                "/v1/services/web ?",
                "/v1/services/web/endpoints ?",
                "/v1/services/web ?",
                "POST /v1/services/web/scale ?",
                "POST /v1/services/web/restart ?",
                "DELETE /v1/services/web ?now=true",
            ]
        "#]]
        .assert_debug_eq(&requests(&fake, first));
    })
    .await;
}

/// `--project` (or the default project) picks one, on every command and every request,
/// the follow-up reads included; `--project` wins over the default.
#[tokio::test]
async fn project_goes_with_every_request() {
    bounded(async {
        let fake = two_webs().await;
        fake.add_copy("batch", "team-b");
        let u = &fake.url();
        check(
            u,
            "service endpoints web --project team-b",
            expect![[r#"
                exit 0
                127.0.0.11:21417
                127.0.0.12:21533
            "#]],
        )
        .await;
        check(
            u,
            "@XCE_PROJECT=team-b service endpoints web",
            expect![[r#"
                exit 0
                127.0.0.11:21417
                127.0.0.12:21533
            "#]],
        )
        .await;
        check(
            u,
            "@XCE_PROJECT=team-b service endpoints web --project default",
            expect![[r#"
                exit 0
                127.0.0.11:20417
                127.0.0.12:20533
            "#]],
        )
        .await;
        // No replica ready: the port names come from the profile, of the same project.
        check(
            u,
            "@XCE_PROJECT=team-b service endpoints batch -o env",
            expect![[r#"
                exit 0
                XCE_ENDPOINTS_ADMIN_API=
                XCE_ENDPOINTS_GRPC=
            "#]],
        )
        .await;
        check(
            u,
            "service status web --project team-b",
            expect![[r#"
                exit 0
                service web in project team-b: 3 replicas, active, generation 1
                rollout: generation 1 progressing: 3/3 updated, 2 ready, 0 outdated
                REPLICA  JOB    HOST     GEN  STATE    READY  PORTS
                0        j-117  exec-01  1    running  yes    http=21417
                1        j-118  exec-02  1    running  yes    http=21533
                2        j-119  exec-03  1    running  no     http=21101
            "#]],
        )
        .await;
        check(
            u,
            "@XCE_PROJECT=team-b service scale web 4",
            expect![[r#"
                exit 0
                service web: scaling to 4 replicas (generation 1)
            "#]],
        )
        .await;
        check(
            u,
            "service restart web --project team-b",
            expect![[r#"
                exit 0
                service web: restarting as generation 2
            "#]],
        )
        .await;
        check(
            u,
            "service stop web --project team-b --now",
            expect![[r#"
                exit 0
                stopping service web (3 replicas, without draining)
            "#]],
        )
        .await;
        // A project without that service: the same 404 as an unknown name, and the hint
        // says where it looked.
        check(
            u,
            "service endpoints web --project team-c",
            expect![[r#"
                exit 4
                --- stderr
                error: service "web" not found
                hint: looked in project team-c only; `xcecli service list` shows the services you may view and their projects
            "#]],
        )
        .await;
        // A project is sent encoded, whatever it holds.
        check(
            u,
            "service status web --project a&b=c/d",
            expect![[r#"
                exit 4
                --- stderr
                error: service "web" not found
                hint: looked in project a&b=c/d only; `xcecli service list` shows the services you may view and their projects
            "#]],
        )
        .await;
        expect![[r#"
            [
                "/v1/services/web/endpoints ?project=team-b",
                "/v1/services/web/endpoints ?project=team-b",
                "/v1/services/web/endpoints ?project=default",
                "/v1/services/batch/endpoints ?project=team-b",
                "/v1/services/batch ?project=team-b",
                "/v1/services/web ?project=team-b",
                "POST /v1/services/web/scale ?project=team-b",
                "POST /v1/services/web/restart ?project=team-b",
                "DELETE /v1/services/web ?now=true&project=team-b",
                "/v1/services/web/endpoints ?project=team-c",
                "/v1/services/web ?project=a&b=c/d",
            ]
        "#]]
        .assert_debug_eq(&requests(&fake, 0));
        let odd = fake.log().pop().unwrap();
        assert_eq!(
            odd.query.into_iter().collect::<Vec<_>>(),
            [("project".to_owned(), "a&b=c/d".to_owned())]
        );
    })
    .await;
}

/// `restart --wait` follows the rollout in the project it named.
#[tokio::test]
async fn wait_follows_the_project_it_named() {
    bounded(async {
        let fake = two_webs().await;
        let run = start(&fake, "service restart web --project team-b --wait");
        run.stdout.wait_for(|t| !t.is_empty()).await;
        fake.parked("team-b/web", "/v1/services/web").await;
        fake.rollout("team-b/web", rollout(2, "complete", (3, 3, 0), None));
        expect![[r#"
            exit 0
            service web: restarting as generation 2
            service web: generation 2 complete, 3 of 3 replicas ready
            --- stderr
            generation 2: 0/3 updated, 2 ready, 3 outdated
            generation 2: 3/3 updated, 3 ready, 0 outdated
        "#]]
        .assert_eq(&finish(&fake, run).await);
        expect![[r#"
            [
                "POST /v1/services/web/restart ?project=team-b",
                "/v1/services/web ?index=44&project=team-b&wait=300000ms",
            ]
        "#]]
        .assert_debug_eq(&requests(&fake, 0));
    })
    .await;
}

/// A watch started without a project stays on the service it found, by the project its
/// first answer reported: another project getting a `web` meanwhile changes nothing.
#[tokio::test]
async fn watch_stays_on_its_project() {
    bounded(async {
        let fake = Fake::start().await;
        let run = start(&fake, "service endpoints web -o plain --watch");
        run.stdout.wait_for(|t| t.lines().count() == 3).await;
        let path = "/v1/services/web/endpoints";
        fake.parked("web", path).await;
        fake.add_copy("web", "team-b");
        fake.set_ready("default/web", 2, true);
        let out = run.stdout.wait_for(|t| t.lines().count() == 7).await;
        fake.parked("default/web", path).await;
        run.task.abort();
        expect![[r#"
            127.0.0.11:20417
            127.0.0.12:20533

            127.0.0.11:20417
            127.0.0.12:20533
            127.0.0.13:20101

        "#]]
        .assert_eq(&out);
        assert_eq!(run.stderr.text(), "");
        expect![[r#"
            [
                "/v1/services/web/endpoints ?",
                "/v1/services/web/endpoints ?index=40&project=default&wait=300000ms",
                "/v1/services/web/endpoints ?index=44&project=default&wait=300000ms",
            ]
        "#]]
        .assert_debug_eq(&requests(&fake, 0));
    })
    .await;
}

/// The file decides the project of `submit`: `--project` must agree with it (exit 2, and
/// nothing sent, when it does not); the default project is not used; the `PUT` and the
/// `--wait` reads carry the file's project.
#[tokio::test]
async fn submit_checks_project_against_the_file() {
    bounded(async {
        let fake = Fake::start().await;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let team_b = write(dir, "web-b.toml", &web_toml("team-b"));
        let none = write(dir, "web.toml", WEB_TOML);
        check_in(
            &fake,
            dir,
            &format!("service submit {team_b} --project team-a"),
            expect![[r#"
                exit 2
                --- stderr
                error: --project team-a does not match DIR/web-b.toml, which is for project "team-b"
                hint: the file decides the project: drop --project, or change project in its [service] table to "team-a"
            "#]],
        )
        .await;
        check_in(
            &fake,
            dir,
            &format!("service submit {none} --project team-b"),
            expect![[r#"
                exit 2
                --- stderr
                error: --project team-b does not match DIR/web.toml, which names no project (so it is for project "default")
                hint: the file decides the project: add project = "team-b" to its [service] table, or drop --project
            "#]],
        )
        .await;
        assert!(fake.log().is_empty(), "nothing sent");
        // The default project is for naming services, not for placing them.
        check_in(
            &fake,
            dir,
            &format!("@XCE_PROJECT=team-a service submit {team_b}"),
            expect![[r#"
                exit 0
                service web created
                --- stderr
            "#]],
        )
        .await;
        let v2 = write(
            dir,
            "web-b.toml",
            &web_toml("team-b").replace("exec server", "exec server --v2"),
        );
        let run = start(&fake, &format!("service submit {v2} --project team-b --wait"));
        run.stdout.wait_for(|t| !t.is_empty()).await;
        fake.parked("team-b/web", "/v1/services/web").await;
        fake.rollout("team-b/web", rollout(2, "complete", (3, 3, 0), None));
        expect![[r#"
            exit 0
            service web updated (generation 2)
            service web: generation 2 complete, 3 of 3 replicas ready
            --- stderr
            generation 2: 0/3 updated, 0 ready, 0 outdated
            generation 2: 3/3 updated, 3 ready, 0 outdated
        "#]]
        .assert_eq(&finish(&fake, run).await);
        check(&fake.url(), "service list", expect![[r#"
            exit 0
            NAME   PROJECT  REPLICAS  READY  PENDING  STATE
            api    team-a   2         2      0        active
            batch  default  1         0      1        active
              pending: port admin-api/tcp 8080 is taken on all 3 hosts
            web    default  3         2      0        active
            web    team-b   3         0      3        active
              pending: waiting for the scheduler
        "#]]).await;
        expect![[r#"
            [
                "PUT /v1/services/web ?project=team-b",
                "PUT /v1/services/web ?project=team-b",
                "/v1/services/web ?index=45&project=team-b&wait=300000ms",
                "/v1/services ?",
            ]
        "#]]
        .assert_debug_eq(&requests(&fake, 0));
    })
    .await;
}

/// `--project` belongs to the commands that name a service, and is never empty.
#[tokio::test]
async fn project_usage_errors_exit_2() {
    bounded(async {
        let fake = Fake::start().await;
        let u = &fake.url();
        check(
            u,
            "service endpoints web --project=",
            expect![[r#"
            exit 2
            --- stderr
            error: a value is required for '--project <P>' but none was supplied

            For more information, try '--help'.
        "#]],
        )
        .await;
        check(
            u,
            "service list --project team-a",
            expect![[r#"
            exit 2
            --- stderr
            error: unexpected argument '--project' found

            Usage: xcecli service list [OPTIONS]

            For more information, try '--help'.
        "#]],
        )
        .await;
        check(
            u,
            "host list --project team-a",
            expect![[r#"
            exit 2
            --- stderr
            error: unexpected argument '--project' found

            Usage: xcecli host list [OPTIONS]

            For more information, try '--help'.
        "#]],
        )
        .await;
        assert!(fake.log().is_empty());
    })
    .await;
}
