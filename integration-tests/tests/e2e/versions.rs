//! Versions (UPGRADING.md), on real daemons: `--version`, `/healthz`, `X-Xce-Version` and
//! `xce_build_info` name the same build; a worker or an apiserver whose protocol version
//! is outside the skew is refused naming both versions; a store written by a newer
//! release makes a standby exit rather than campaign (the leader stays), and makes an
//! apiserver fail closed (503 `stale`) instead of serving what it had, until it can read
//! the store again.
//!
//! A peer of another protocol version is pretended with `XCE_TEST_PROTOCOL=N`, which only
//! debug builds (these tests' binaries) honour: building a real older release here would
//! take minutes, and a release binary must not let an operator switch the check off.
//! A newer release's store is pretended by writing its records into etcd directly.

use crate::daemons::*;
use crate::harness::*;
use anyhow::{Context, Result};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// `xced`/`xcecli --version`: (version, commit) of `NAME VERSION (commit C, protocol P)`.
fn version_of(binary: &str) -> (String, String) {
    let out = Command::new(bin(binary))
        .arg("--version")
        .output()
        .expect("runs");
    assert!(out.status.success());
    let line = stdout(&out);
    let rest = line
        .trim()
        .strip_prefix(&format!("{binary} "))
        .unwrap_or_else(|| panic!("{line}"));
    let (version, rest) = rest.split_once(" (commit ").expect("commit");
    let (commit, protocol) = rest.split_once(", protocol ").expect("protocol");
    assert_eq!(protocol, "2)", "{line}");
    (version.to_owned(), commit.to_owned())
}

/// The commit the workspace is at, when git can tell.
fn head() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(workspace_root())
        .output()
        .ok()?;
    out.status.success().then(|| stdout(&out).trim().to_owned())
}

/// `GET /healthz` and `/metrics` (with the admin token, which any permission `/metrics`
/// may require includes) of `api`: the build each names.
async fn builds_named(api: &Api) -> Result<Vec<String>> {
    let (status, headers, body) = api.get("/healthz").await?;
    anyhow::ensure!(status == 200, "healthz {status}: {body}");
    let line = |key: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(key))
            .with_context(|| format!("no {key} in {body}"))
    };
    let header = headers
        .get("x-xce-version")
        .context("no X-Xce-Version")?
        .to_str()?
        .to_owned();
    let (_, _, metrics) = api.get("/metrics").await?;
    let info = metrics
        .lines()
        .find(|l| l.starts_with("xce_build_info{"))
        .with_context(|| format!("no xce_build_info in {metrics}"))?
        .to_owned();
    Ok(vec![
        format!("{}+{}", line("version: ")?, line("commit: ")?),
        header,
        info,
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_healthz_header_and_build_info_name_the_same_build() {
    let (version, commit) = version_of("xced");
    assert_eq!(version_of("xcecli"), (version.clone(), commit.clone()));
    // Built from this checkout: the build script read the commit (and reran when HEAD
    // moved, or an incremental build would show an older one).
    if let Some(head) = head() {
        assert_eq!(commit, head, "xced --version names the workspace's commit");
    }
    let etcd = EtcdCluster::start(1).await.expect("etcd");
    let mut fleet = Fleet::new(etcd, 0, 1).expect("fleet");
    fleet.start_leader_and_standby().await;
    fleet.start_apiserver(0).unwrap();
    let want = vec![
        format!("{version}+{commit}"),
        format!("{version}+{commit}"),
        format!("xce_build_info{{version=\"{version}\",commit=\"{commit}\"}} 1"),
    ];
    for (what, api) in [
        ("leader", fleet.controller_api(0)),
        ("standby", fleet.controller_api(1)),
        ("apiserver", fleet.apiserver(0)),
    ] {
        let got = eventually(&format!("the {what} answers"), || async {
            builds_named(&api).await.map(Some)
        })
        .await;
        assert_eq!(got, want, "{what}");
    }
    // Every answer, an error too (here a route that does not exist).
    let (status, headers, _) = fleet.apiserver(0).get("/no/such/route").await.unwrap();
    assert_eq!(status, 404);
    assert_eq!(
        headers["x-xce-version"],
        format!("{version}+{commit}").as_str()
    );
}

/// `xced KIND --config NAME.toml` of `fleet`, pretending protocol `protocol`.
fn spawn_pretending(fleet: &Fleet, kind: &str, name: &str, protocol: u32, owner: &Owner) -> Child {
    let log = std::fs::File::create(fleet.log(name)).unwrap();
    owner
        .mark(&mut Command::new(bin("xced")))
        .args([kind, "--config"])
        .arg(fleet.dir.path().join(format!("{name}.toml")))
        .env("XCE_LOG", "info")
        .env("XCE_TEST_PROTOCOL", protocol.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap()
}

fn log_line_with(path: &Path, needles: &[&str]) -> Result<Option<String>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    Ok(text
        .lines()
        .find(|l| needles.iter().all(|n| l.contains(n)))
        .map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_or_an_apiserver_outside_the_skew_is_refused_naming_both_versions() {
    let etcd = EtcdCluster::start(1).await.expect("etcd");
    let mut fleet = Fleet::new(etcd, 1, 1).expect("fleet");
    fleet.start_leader(0).await;
    let owner = Owner::new();
    // An apiserver two protocol versions ahead (upgraded before the controllers).
    let mut children = vec![spawn_pretending(
        &fleet,
        "apiserver",
        "apiserver-0",
        4,
        &owner,
    )];
    let api = fleet.apiserver(0);
    let (status, headers, body) = eventually("the apiserver forwards", || async {
        match api.get("/v1/hosts").await {
            Ok((status, headers, body)) if status != 503 => Ok(Some((status, headers, body))),
            Ok(_) => Ok(None),
            Err(e) => Err(e),
        }
    })
    .await;
    assert_eq!(status, 400, "{body}");
    // The refusal is the leader's answer and names the leader's protocol; what the
    // apiserver answers itself names its own.
    assert_eq!(
        headers["x-xce-protocol"], "2",
        "a forwarded answer keeps the leader's"
    );
    let (_, own, _) = api.get("/healthz").await.unwrap();
    assert_eq!(own["x-xce-protocol"], "4", "the apiserver's own answer");
    assert!(
        body.contains(r#""code":"version_skew""#)
            && body.contains("this apiserver speaks protocol 4, the controller speaks protocol 2"),
        "{body}"
    );
    let said = eventually("the apiserver logs the refusal", || async {
        log_line_with(
            &fleet.log("apiserver-0"),
            &["refuses this apiserver", "protocol 4", "protocol 2"],
        )
    })
    .await;
    println!("apiserver: {said}");

    // A worker two versions behind, talking to the leader directly: refused, said in
    // its log with both versions, and never registered.
    std::fs::write(
        fleet.dir.path().join("worker-old.toml"),
        std::fs::read_to_string(fleet.dir.path().join("worker-0.toml"))
            .unwrap()
            .replace(
                &format!("http://127.0.0.1:{}", fleet.apiserver_ports[0]),
                &format!("http://127.0.0.1:{}", fleet.controller_ports[0]),
            ),
    )
    .unwrap();
    children.push(spawn_pretending(&fleet, "worker", "worker-old", 0, &owner));
    let said = eventually("the worker logs the refusal", || async {
        log_line_with(
            &fleet.log("worker-old"),
            &[
                "refused this worker's protocol version",
                "speaks protocol 0",
                "protocol 2",
            ],
        )
    })
    .await;
    println!("worker: {said}");
    let hosts = fleet.controller_api(0).get_json("/v1/hosts").await.unwrap();
    assert_eq!(hosts["hosts"].as_array().map(Vec::len), Some(0), "{hosts}");
    teardown(children.iter_mut(), &owner);
}

/// etcd's JSON gateway on the fleet's first member: put (`Some`) or delete a key.
async fn etcd_write(fleet: &Fleet, key: &str, value: Option<&str>) {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let member = fleet.etcd.as_ref().unwrap().url();
    let member = member
        .trim_start_matches("etcd://")
        .split(',')
        .next()
        .unwrap()
        .to_owned();
    let (path, body) = match value {
        Some(v) => (
            "put",
            format!(r#"{{"key":"{}","value":"{}"}}"#, b64(key), b64(v)),
        ),
        None => ("deleterange", format!(r#"{{"key":"{}"}}"#, b64(key))),
    };
    let r = reqwest::Client::new()
        .post(format!("http://{member}/v3/kv/{path}"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "etcd {path} {key}");
}

/// The endpoints of `web` on `api`: (status, error code or the endpoint count, message).
async fn endpoints_answer(api: &Api) -> Result<(u16, String)> {
    let (status, _, body) = api.get("/v1/services/web/endpoints").await?;
    Ok((status, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_a_newer_release_stops_a_standby_and_closes_an_apiserver() {
    let etcd = EtcdCluster::start(1).await.expect("etcd");
    let mut fleet = Fleet::new(etcd, 1, 1).expect("fleet");
    fleet.start_leader_and_standby().await;
    fleet.start_apiserver(0).unwrap();
    fleet.start_workers(1).unwrap();
    let leader = fleet.controller_api(0);
    wait_for_hosts_of(&leader, 1).unwrap();
    let (status, body) = leader
        .submit_toml(&http_service("web", 1).toml())
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    let api = fleet.apiserver(0);
    let served = api.wait_ready("web", 1).await;

    // A newer release's leader migrated the store (format 4; this release reads 1 to 3).
    etcd_write(&fleet, "/xce/meta/format", Some("4")).await;
    let (status, body) = eventually("the apiserver fails closed", || async {
        let (status, body) = endpoints_answer(&api).await?;
        Ok((status == 503).then_some((status, body)))
    })
    .await;
    assert!(
        body.contains(r#""code":"stale""#)
            && body.contains("records of format 4")
            && body.contains("(format 3 and older)"),
        "{body}"
    );
    println!("apiserver on format 4: {status} {body}");
    // The standby exits rather than campaign for a store it cannot lead; the leader stays.
    let standby = std::sync::Mutex::new(fleet.controllers[1].take().unwrap());
    let code = eventually("the standby exits", || async {
        Ok(standby.lock().unwrap().child.try_wait()?.map(|s| s.code()))
    })
    .await;
    assert_eq!(code, Some(1));
    let said = log_line_with(
        &fleet.log("controller-1"),
        &["format 4", "format 3", "leader stays in place"],
    )
    .unwrap()
    .expect("the standby says why, naming both formats");
    println!("standby: {said}");
    let (status, _, _) = leader.get("/healthz").await.unwrap();
    assert_eq!(status, 200, "the leader still serves");

    // Readable again (this apiserver "upgraded"): served again, the same endpoints.
    etcd_write(&fleet, "/xce/meta/format", Some("2")).await;
    assert_eq!(api.wait_ready("web", 1).await, served);

    // A record and an event of a kind this release does not know (a job state, as
    // `draining` once was): 503 `stale` naming it, never the old list.
    let job = r#"{"info":{"job":"j-999","service":"web","project":"default","replica":9,"host":"exec-01","state":"hibernating","ready":false,"grants":{}}}"#;
    etcd_write(&fleet, "/xce/job/j-999", Some(job)).await;
    etcd_write(
        &fleet,
        "/xce/meta/events",
        Some(&format!(
            r#"[{{"event":"job","rev":999999,"job":{}}}]"#,
            &job[8..job.len() - 1]
        )),
    )
    .await;
    let (_, body) = eventually("the apiserver fails closed", || async {
        let (status, body) = endpoints_answer(&api).await?;
        Ok((status == 503).then_some((status, body)))
    })
    .await;
    assert!(
        body.contains(r#""code":"stale""#) && body.contains("unknown variant `hibernating`"),
        "{body}"
    );
    println!("apiserver on an unknown job state: {body}");
    etcd_write(&fleet, "/xce/job/j-999", None).await;
    assert_eq!(api.wait_ready("web", 1).await, served);
}
