//! The commands that change a service (`submit`, `scale`, `restart`, `stop`), `status`, and
//! `--wait` following a rollout, against the fake apiserver.
//!
//! A `--wait` test moves the rollout only once the client is parked in a blocking query
//! for the index it last saw (`wait_for_block`), so each step is seen as one change, and
//! nothing depends on timing.

use crate::fake::{Fake, Logged, Rollout, WEB_TOML};
use crate::{bounded, check, start, Running};
use expect_test::{expect, Expect};
use std::path::Path;

/// A profile file in `dir`; returns its path.
pub(crate) fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// Runs `line` to completion and snapshots exit code, stdout and stderr, with the fake's
/// address as `API` and `dir` as `DIR`.
pub(crate) async fn check_in(fake: &Fake, dir: &Path, line: &str, expect: Expect) {
    let (code, out, err) = start(fake, line).finish().await;
    let actual = format!("exit {code}\n{out}--- stderr\n{err}");
    expect.assert_eq(&normalize(fake, dir, &actual));
}

fn normalize(fake: &Fake, dir: &Path, text: &str) -> String {
    text.replace(&dir.display().to_string(), "DIR")
        .replace(&fake.addr.to_string(), "API")
}

/// `METHOD path ?query` of every request after the first `skip`.
pub(crate) fn requests(fake: &Fake, skip: usize) -> Vec<String> {
    fake.log()
        .into_iter()
        .skip(skip)
        .map(|l| {
            let q: Vec<String> = l.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{} ?{}", l.path, q.join("&"))
        })
        .collect()
}

/// Waits until the client asks for the detail of `service` past its current index: it
/// has seen everything up to now and is parked in the blocking query.
async fn wait_for_block(fake: &Fake, service: &str) -> Logged {
    fake.parked(service, &format!("/v1/services/{service}"))
        .await
}

pub(crate) fn rollout(
    generation: u64,
    state: &'static str,
    (updated, ready, outdated): (u32, u32, u32),
    reason: Option<&str>,
) -> Rollout {
    Rollout {
        generation,
        state,
        updated,
        ready,
        outdated,
        reason: reason.map(str::to_owned),
    }
}

pub(crate) async fn finish(fake: &Fake, run: Running) -> String {
    let (code, out, err) = run.finish().await;
    let dir = Path::new("/nonexistent");
    normalize(fake, dir, &format!("exit {code}\n{out}--- stderr\n{err}"))
}

/// `submit` is a `PUT` named after the file's service: `created` on a 201, else the
/// generation it runs now (a new one when the profile changed). A file without a usable
/// name is POSTed, so the server lists every problem.
#[tokio::test]
async fn submit_creates_and_updates() {
    bounded(async {
        let fake = Fake::start().await;
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let cache = "[service]\nname = \"cache\"\nreplicas = 2\ncommand = [\"true\"]\n\n\
                     [[service.ports]]\nname = \"redis\"\n";
        let good = write(dir, "cache.toml", cache);
        check_in(
            &fake,
            dir,
            &format!("service submit {good}"),
            expect![[r#"
            exit 0
            service cache created
            --- stderr
        "#]],
        )
        .await;
        // The same profile again: unchanged, still generation 1.
        check_in(
            &fake,
            dir,
            &format!("service submit {good}"),
            expect![[r#"
                exit 0
                service cache unchanged (generation 1)
                --- stderr
            "#]],
        )
        .await;
        let more = write(
            dir,
            "cache.toml",
            &cache.replace("replicas = 2", "replicas = 3"),
        );
        check_in(
            &fake,
            dir,
            &format!("service submit {more}"),
            expect![[r#"
                exit 0
                service cache updated (generation 2)
                --- stderr
            "#]],
        )
        .await;
        let web = write(dir, "web.toml", WEB_TOML);
        check_in(
            &fake,
            dir,
            &format!("service submit {web}"),
            expect![[r#"
                exit 0
                service web unchanged (generation 1)
                --- stderr
            "#]],
        )
        .await;

        let bad = write(
            dir,
            "bad.toml",
            "[service]\nname = \"Bad\"\nreplicas = 0\n\n[[service.ports]]\nname = \"http\"\n\
             port = 70000\n\n[[service.ports]]\nname = \"http\"\n",
        );
        check_in(
            &fake,
            dir,
            &format!("service submit {bad}"),
            expect![[r#"
            exit 1
            --- stderr
            error: invalid service profile
              service.name: must be 1-63 chars of [a-z0-9-], starting with a letter
              service.replicas: must be at least 1
              service.ports[0].port: must be 1-65535
              service.ports[1].name: duplicate port name "http"
            hint: fix DIR/bad.toml and submit it again
        "#]],
        )
        .await;
        check_in(
            &fake,
            dir,
            &format!("service submit {}/missing.toml", dir.display()),
            expect![[r#"
                exit 1
                --- stderr
                error: cannot read DIR/missing.toml: No such file or directory (os error 2)
            "#]],
        )
        .await;
        expect![[r#"
            [
                "PUT /v1/services/cache ?",
                "PUT /v1/services/cache ?",
                "PUT /v1/services/cache ?",
                "PUT /v1/services/web ?",
                "POST /v1/services ?",
            ]
        "#]]
        .assert_debug_eq(&requests(&fake, 0));
    })
    .await;
}

/// Old scripts keep working against an apiserver from before rollouts: its 405 on `PUT`
/// sends the profile to `POST /v1/services`. `--wait` there cannot work and says so.
#[tokio::test]
async fn submit_falls_back_to_post_on_an_old_apiserver() {
    bounded(async {
        let fake = Fake::start().await;
        fake.legacy();
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let one = write(dir, "one.toml", "[service]\nname = \"one\"\n");
        check_in(
            &fake,
            dir,
            &format!("service submit {one}"),
            expect![[r#"
            exit 0
            service one created
            --- stderr
        "#]],
        )
        .await;
        let two = write(dir, "two.toml", "[service]\nname = \"two\"\n");
        check_in(
            &fake,
            dir,
            &format!("service submit {two} --wait"),
            expect![[r#"
            exit 1
            service two created
            --- stderr
            error: the apiserver reports no rollout for service two: cannot --wait
            hint: the apiserver may be older than this xcecli; run the command without --wait
        "#]],
        )
        .await;
        expect![[r#"
            [
                "PUT /v1/services/one ?",
                "POST /v1/services ?",
                "PUT /v1/services/two ?",
                "POST /v1/services ?",
            ]
        "#]]
        .assert_debug_eq(&requests(&fake, 0));
    })
    .await;
}

/// `--wait` prints one progress line per change of the line (an index change that moves
/// nothing prints nothing), with the reason while the rollout waits, then the result.
/// Every read after the first is a blocking query from the last `X-Xce-Index`.
#[tokio::test]
async fn submit_wait_follows_the_rollout_until_complete() {
    bounded(async {
        let fake = Fake::start().await;
        let dir = tempfile::tempdir().unwrap();
        let file = write(
            dir.path(),
            "web.toml",
            &WEB_TOML.replace("exec server", "exec server --v2"),
        );
        let run = start(&fake, &format!("service submit {file} --wait"));
        run.stdout.wait_for(|t| !t.is_empty()).await;

        wait_for_block(&fake, "web").await;
        fake.rollout(
            "web",
            rollout(
                2,
                "progressing",
                (1, 3, 2),
                Some("replica 0: ready for 2s of min_ready 5s"),
            ),
        );
        wait_for_block(&fake, "web").await;
        fake.touch("web");
        wait_for_block(&fake, "web").await;
        fake.rollout("web", rollout(2, "progressing", (2, 3, 1), None));
        wait_for_block(&fake, "web").await;
        fake.rollout("web", rollout(2, "complete", (3, 3, 0), None));

        expect![[r#"
            exit 0
            service web updated (generation 2)
            service web: generation 2 complete, 3 of 3 replicas ready
            --- stderr
            generation 2: 0/3 updated, 2 ready, 3 outdated
            generation 2: 1/3 updated, 3 ready, 2 outdated
              waiting: replica 0: ready for 2s of min_ready 5s
            generation 2: 2/3 updated, 3 ready, 1 outdated
            generation 2: 3/3 updated, 3 ready, 0 outdated
        "#]]
        .assert_eq(&finish(&fake, run).await);
        expect![[r#"
            [
                "PUT /v1/services/web ?",
                "/v1/services/web ?index=43&project=default&wait=300000ms",
                "/v1/services/web ?index=44&project=default&wait=300000ms",
                "/v1/services/web ?index=45&project=default&wait=300000ms",
                "/v1/services/web ?index=46&project=default&wait=300000ms",
            ]
        "#]]
        .assert_debug_eq(&requests(&fake, 0));
    })
    .await;
}

/// A failed rollout that was rolled back: exit 6, saying it was reverted and why.
#[tokio::test]
async fn restart_wait_exits_6_when_reverted() {
    bounded(async {
        let fake = Fake::start().await;
        let run = start(&fake, "service restart web --wait");
        // The command's own answer is in: the fake's index is the one it starts from.
        run.stdout.wait_for(|t| !t.is_empty()).await;
        wait_for_block(&fake, "web").await;
        fake.rollout(
            "web",
            rollout(
                3,
                "reverted",
                (0, 2, 1),
                Some("generation 2: replica 2 exited 3 times; restored the profile of generation 1"),
            ),
        );
        expect![[r#"
            exit 6
            service web: restarting as generation 2
            --- stderr
            generation 2: 0/3 updated, 2 ready, 3 outdated
            generation 3: 0/3 updated, 2 ready, 1 outdated
            error: rollout of service web failed and was reverted (generation 3): generation 2: replica 2 exited 3 times; restored the profile of generation 1
            hint: `xcecli service status web` shows the replicas and their generations
        "#]].assert_eq(&finish(&fake, run).await);
    })
    .await;
}

/// A failed rollout without a revert: exit 6 too. Scale keeps the generation.
#[tokio::test]
async fn scale_wait_exits_6_when_failed() {
    bounded(async {
        let fake = Fake::start().await;
        let run = start(&fake, "service scale web 5 --wait");
        // The command's own answer is in: the fake's index is the one it starts from.
        run.stdout.wait_for(|t| !t.is_empty()).await;
        wait_for_block(&fake, "web").await;
        fake.rollout(
            "web",
            rollout(
                1,
                "failed",
                (3, 2, 0),
                Some("no progress for 5m: replica 3: no host has a free port http"),
            ),
        );
        expect![[r#"
            exit 6
            service web: scaling to 5 replicas (generation 1)
            --- stderr
            generation 1: 3/5 updated, 2 ready, 0 outdated
            error: rollout of service web to generation 1 failed: no progress for 5m: replica 3: no host has a free port http
            hint: `xcecli service status web` shows the replicas and their generations
        "#]].assert_eq(&finish(&fake, run).await);
    })
    .await;
}

/// A scale to the count the service already has is complete at once: no blocking query.
#[tokio::test]
async fn scale_wait_on_a_complete_service_returns_at_once() {
    bounded(async {
        let fake = Fake::start().await;
        check(
            &fake.url(),
            "service scale api 2 --wait",
            expect![[r#"
            exit 0
            service api: scaling to 2 replicas (generation 1)
            service api: generation 1 complete, 2 of 2 replicas ready
            --- stderr
            generation 1: 2/2 updated, 2 ready, 0 outdated
        "#]],
        )
        .await;
        expect![[r#"
            [
                "POST /v1/services/api/scale ?",
            ]
        "#]]
        .assert_debug_eq(&requests(&fake, 0));
    })
    .await;
}

#[tokio::test]
async fn wait_times_out_with_exit_3() {
    bounded(async {
        let fake = Fake::start().await;
        check(
            &fake.url(),
            "service restart web --wait --timeout 300ms",
            expect![[r#"
                exit 3
                service web: restarting as generation 2
                --- stderr
                generation 2: 0/3 updated, 2 ready, 3 outdated
                error: rollout of service web not complete after 300ms: generation 2 has 0/3 updated, 2 ready, 3 outdated
                hint: the rollout goes on; `xcecli service status web` shows where it is
            "#]],
        )
        .await;
    })
    .await;
}

/// The service is stopped (and gone) while `--wait` follows it: exit 4.
#[tokio::test]
async fn wait_exits_4_when_the_service_is_gone() {
    bounded(async {
        let fake = Fake::start().await;
        let run = start(&fake, "service restart api --wait");
        // The command's own answer is in: the fake's index is the one it starts from.
        run.stdout.wait_for(|t| !t.is_empty()).await;
        wait_for_block(&fake, "api").await;
        fake.remove("api");
        expect![[r#"
            exit 4
            service api: restarting as generation 2
            --- stderr
            generation 2: 0/2 updated, 2 ready, 2 outdated
            error: service api in project team-a is gone (stopped, or no longer visible) while waiting for its rollout
        "#]]
        .assert_eq(&finish(&fake, run).await);
    })
    .await;
}

/// The apiserver restarts during a `--wait`: the client retries, then resumes its
/// blocking query from the last index it saw, and sees the rollout complete.
#[tokio::test]
async fn wait_resumes_after_an_apiserver_restart() {
    bounded(async {
        let mut fake = Fake::start().await;
        let run = start(&fake, "service restart web --wait");
        run.stdout.wait_for(|t| !t.is_empty()).await;
        let parked = wait_for_block(&fake, "web").await;
        fake.stop().await;
        fake.rollout("web", rollout(2, "complete", (3, 3, 0), None));
        run.stderr.wait_for(|t| t.contains("retrying")).await;
        fake.restart().await;
        let (code, out, err) = run.finish().await;
        assert_eq!(code, 0, "{err}");
        let generation = fake.generation();
        let resumed = fake
            .log()
            .into_iter()
            .find(|l| l.generation == generation)
            .unwrap();
        assert_eq!(resumed.query.get("index"), parked.query.get("index"));
        let addr = fake.addr.to_string();
        let err = err.replace(&addr, "API");
        let lines: Vec<&str> = err.lines().collect();
        expect![[r#"
            (
                "service web: restarting as generation 2\nservice web: generation 2 complete, 3 of 3 replicas ready\n",
                [
                    "generation 2: 0/3 updated, 2 ready, 3 outdated",
                    "warning: cannot reach the apiserver at http://API/v1/services/web: Connection refused (os error 111); retrying in 200ms (resuming from index 43)",
                ],
                [
                    "warning: the apiserver at http://API answers again",
                    "generation 2: 3/3 updated, 3 ready, 0 outdated",
                ],
            )
        "#]].assert_debug_eq(&(
            out,
            lines[..2].to_vec(),
            lines[lines.len() - 2..].to_vec(),
        ));
    })
    .await;
}

#[tokio::test]
async fn status_shows_the_rollout_and_the_replicas() {
    bounded(async {
        let fake = Fake::start().await;
        let u = &fake.url();
        check(u, "service status web", expect![[r#"
            exit 0
            service web in project default: 3 replicas, active, generation 1
            rollout: generation 1 progressing: 3/3 updated, 2 ready, 0 outdated
            REPLICA  JOB   HOST     GEN  STATE    READY  PORTS
            0        j-17  exec-01  1    running  yes    http=20417
            1        j-18  exec-02  1    running  yes    http=20533
            2        j-19  exec-03  1    running  no     http=20101
        "#]]).await;
        check(u, "service status batch", expect![[r#"
            exit 0
            service batch in project default: 1 replicas, active, generation 1
            rollout: generation 1 progressing: 0/1 updated, 0 ready, 0 outdated
              waiting: replica 0: port admin-api/tcp 8080 is taken on all 3 hosts
            no replicas placed
            pending replica 0: port admin-api/tcp 8080 is taken on all 3 hosts
        "#]]).await;
        check(u, "service status api -o json", expect![[r#"
            exit 0
            {"generation":1,"index":41,"jobs":[{"generation":1,"host":"exec-01","job":"j-21","ports":{"http":20001,"metrics":9100},"ready":true,"replica":0,"state":"running"},{"generation":1,"host":"exec-02","job":"j-22","ports":{"http":20002,"metrics":9100},"ready":true,"replica":1,"state":"running"}],"name":"api","pending":[],"profile":{"command":["sh","-c","exec server"],"name":"api","ports":[{"name":"http","protocol":"tcp"},{"name":"metrics","protocol":"tcp"}],"project":"team-a","replicas":2},"project":"team-a","replicas":2,"rollout":{"generation":1,"outdated":0,"ready":2,"reason":null,"state":"complete","updated":2},"state":"active"}
        "#]]).await;
        check(u, "service status ghost", expect![[r#"
            exit 4
            --- stderr
            error: service "ghost" not found
            hint: `xcecli service list` shows the services you may view
        "#]]).await;
    })
    .await;
}

#[tokio::test]
async fn scale_restart_and_stop() {
    bounded(async {
        let fake = Fake::start().await;
        let u = &fake.url();
        check(
            u,
            "service scale web 5",
            expect![[r#"
            exit 0
            service web: scaling to 5 replicas (generation 1)
        "#]],
        )
        .await;
        check(
            u,
            "service scale web 0",
            expect![[r#"
            exit 1
            --- stderr
            error: invalid scale request
              replicas: must be between 1 and 10000
        "#]],
        )
        .await;
        check(
            u,
            "service scale ghost 2",
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
            "service restart api",
            expect![[r#"
            exit 0
            service api: restarting as generation 2
        "#]],
        )
        .await;
        check(
            u,
            "service restart ghost",
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
            "service stop web --now",
            expect![[r#"
            exit 0
            stopping service web (3 replicas, without draining)
        "#]],
        )
        .await;
        check(
            u,
            "service stop api",
            expect![[r#"
            exit 0
            stopping service api (2 replicas)
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
        // `--now` is the query `now=true`; without it nothing, so replicas drain.
        expect![[r#"
            [
                "POST /v1/services/web/scale ?",
                "POST /v1/services/web/scale ?",
                "POST /v1/services/ghost/scale ?",
                "POST /v1/services/api/restart ?",
                "POST /v1/services/ghost/restart ?",
                "DELETE /v1/services/web ?now=true",
                "DELETE /v1/services/api ?",
                "DELETE /v1/services/ghost ?",
            ]
        "#]]
        .assert_debug_eq(&requests(&fake, 0));
    })
    .await;
}
