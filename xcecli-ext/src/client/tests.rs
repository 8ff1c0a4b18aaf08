//! The client's config checks and URLs, without a server.

use super::*;
use expect_test::{expect, Expect};

fn check_config(api: &str, token: Option<&str>, expect: Expect) {
    let actual = match Client::new(ClientConfig {
        api: api.to_owned(),
        token: token.map(str::to_owned),
        ca_file: None,
        project: None,
    }) {
        Ok(c) => format!(
            "ok {} auth={}",
            c.url(&["services", "a b/c", "endpoints"]),
            c.auth.is_some()
        ),
        Err(e) => format!("exit {}: {e}", e.exit_code()),
    };
    expect.assert_eq(&actual);
}

#[test]
fn several_apiservers_share_one_path() {
    let c = Client::new(ClientConfig {
        api: "http://a:1/x, http://b:2/y/,http://c:3".into(),
        token: None,
        ca_file: None,
        project: None,
    })
    .unwrap();
    let mut url = c.url(&["services", "web", "endpoints"]);
    url.set_query(Some("index=4&wait=1000ms"));
    let moved: Vec<String> = (0..3).map(|i| c.on_base(&url, i).to_string()).collect();
    expect![[r#"
        [
            "http://a:1/x/v1/services/web/endpoints?index=4&wait=1000ms",
            "http://b:2/y/v1/services/web/endpoints?index=4&wait=1000ms",
            "http://c:3/v1/services/web/endpoints?index=4&wait=1000ms",
        ]
    "#]]
    .assert_debug_eq(&moved);
    check_config(
        "http://a:1,not-a-url",
        None,
        expect![[r#"
            exit 1: error: invalid apiserver url "not-a-url": expected http://HOST:PORT
            hint: pass --api http://HOST:PORT or set XCE_API (default http://127.0.0.1:7480)"#]],
    );
}

#[test]
fn config() {
    check_config(
        "http://127.0.0.1:7480",
        Some("t"),
        expect!["ok http://127.0.0.1:7480/v1/services/a%20b%2Fc/endpoints auth=true"],
    );
    check_config(
        "http://h:1/prefix/?x=1",
        None,
        expect!["ok http://h:1/prefix/v1/services/a%20b%2Fc/endpoints auth=false"],
    );
    check_config(
        "https://h",
        None,
        expect!["ok https://h/v1/services/a%20b%2Fc/endpoints auth=false"],
    );
    check_config(
        "127.0.0.1:7480",
        None,
        expect![[r#"
            exit 1: error: invalid apiserver url "127.0.0.1:7480": expected http://HOST:PORT
            hint: pass --api http://HOST:PORT or set XCE_API (default http://127.0.0.1:7480)"#]],
    );
    check_config(
        "http://h",
        Some("a\nb"),
        expect![[r#"
            exit 1: error: the token contains characters that cannot be sent in an http header
            hint: check XCE_TOKEN, --token or the config file"#]],
    );
}

#[test]
fn project_in_the_query() {
    let c = Client::new(ClientConfig {
        api: "http://h:1".into(),
        token: None,
        ca_file: None,
        project: Some("  ".into()),
    })
    .unwrap();
    assert_eq!(c.project(), None, "an empty default project is none");
    let svc = |project| ServiceRef {
        name: "web",
        project,
    };
    let mut blocking = c.service_url(svc(Some("team-a")), &[]);
    blocking
        .query_pairs_mut()
        .append_pair("index", "4")
        .append_pair("wait", "1000ms");
    let urls = [
        c.service_url(svc(None), &["endpoints"]),
        c.service_url(svc(Some("team-a")), &["scale"]),
        c.service_url(svc(Some("a b&c=d/é")), &[]),
        blocking,
    ]
    .map(|u| u.to_string());
    expect![[r#"
        [
            "http://h:1/v1/services/web/endpoints",
            "http://h:1/v1/services/web/scale?project=team-a",
            "http://h:1/v1/services/web?project=a+b%26c%3Dd%2F%C3%A9",
            "http://h:1/v1/services/web?project=team-a&index=4&wait=1000ms",
        ]
    "#]]
    .assert_debug_eq(&urls);
}
