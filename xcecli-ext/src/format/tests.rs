//! Every rendering, snapshotted from parsed answers.

use super::*;
use expect_test::{expect, Expect};

const WEB: &str = r#"{"service":"web","index":42,"endpoints":[
    {"replica":0,"job":"j-17","host":"exec-01","address":"127.0.0.11","ports":{"http":20417,"metrics":9100}},
    {"replica":1,"job":"j-18","host":"exec-02","address":"127.0.0.12","ports":{"http":20533,"metrics":9100}},
    {"replica":2,"job":"j-19","host":"exec-03","address":"fd00::3","ports":{"http":20001,"metrics":9100},"ready":false,"state":"running"}]}"#;

/// `args`: `format [port=P] [all] [declared=a,b]`.
fn check(json: &str, args: &str, expect: Expect) {
    let entry: EndpointEntry = serde_json::from_str(json).unwrap();
    model::check(&entry).unwrap();
    let mut words = args.split_whitespace();
    let format = match words.next().unwrap() {
        "table" => EndpointFormat::Table,
        "json" => EndpointFormat::Json,
        "plain" => EndpointFormat::Plain,
        "env" => EndpointFormat::Env,
        f => panic!("unknown format {f}"),
    };
    let (mut port, mut all, mut declared) = (None, false, Vec::new());
    for w in words {
        if let Some(p) = w.strip_prefix("port=") {
            port = Some(p);
        } else if let Some(d) = w.strip_prefix("declared=") {
            declared = d.split(',').map(str::to_owned).collect();
        } else if w == "all" {
            all = true;
        }
    }
    let view = EndpointsView {
        format,
        port,
        all,
        declared: &declared,
    };
    let actual = match endpoints(view, &entry, json) {
        Ok(out) => out,
        Err(e) => format!("exit {}: {e}", e.exit_code()),
    };
    expect.assert_eq(&actual);
}

#[test]
fn table() {
    check(
        WEB,
        "table",
        expect![[r#"
            REPLICA  HOST     ADDRESS     PORTS
            0        exec-01  127.0.0.11  http=20417,metrics=9100
            1        exec-02  127.0.0.12  http=20533,metrics=9100
        "#]],
    );
    // Ports as the profile declares them (the order of XCE_PORTS), not by name; one
    // the profile does not list (a rollout added it) after those.
    check(
        WEB,
        "table declared=metrics,http",
        expect![[r#"
            REPLICA  HOST     ADDRESS     PORTS
            0        exec-01  127.0.0.11  metrics=9100,http=20417
            1        exec-02  127.0.0.12  metrics=9100,http=20533
        "#]],
    );
    check(
        WEB,
        "table declared=metrics",
        expect![[r#"
            REPLICA  HOST     ADDRESS     PORTS
            0        exec-01  127.0.0.11  metrics=9100,http=20417
            1        exec-02  127.0.0.12  metrics=9100,http=20533
        "#]],
    );
    check(
        WEB,
        "table port=http all",
        expect![[r#"
            REPLICA  HOST     ADDRESS     PORTS       READY  STATE
            0        exec-01  127.0.0.11  http=20417  yes    -
            1        exec-02  127.0.0.12  http=20533  yes    -
            2        exec-03  fd00::3     http=20001  no     running
        "#]],
    );
    // A service with `[service.meta]` labels: a META column; JSON carries them as sent.
    let labelled = WEB.replace(
        r#""index":42,"#,
        r#""index":42,"meta":{"team":"payments","tier":"1"},"#,
    );
    check(
        &labelled,
        "table port=http",
        expect![[r#"
        REPLICA  HOST     ADDRESS     PORTS       META
        0        exec-01  127.0.0.11  http=20417  team=payments,tier=1
        1        exec-02  127.0.0.12  http=20533  team=payments,tier=1
    "#]],
    );
    check(
        r#"{"service":"web","index":7,"meta":{"team":"a"},"endpoints":[]}"#,
        "json",
        expect![[r#"
            {"service":"web","index":7,"meta":{"team":"a"},"endpoints":[]}
        "#]],
    );
    check(
        r#"{"service":"web","index":7,"endpoints":[]}"#,
        "table",
        expect![[r#"
            no ready endpoints for service web (index 7)
        "#]],
    );
}

#[test]
fn plain() {
    check(
        WEB,
        "plain port=http",
        expect![[r#"
            127.0.0.11:20417
            127.0.0.12:20533
        "#]],
    );
    check(
        WEB,
        "plain",
        expect![[r#"
            exit 2: error: service "web" has several ports (http, metrics): -o plain prints one
            hint: pass --port http, or use -o env or -o json"#]],
    );
    check(
        r#"{"service":"db","index":3,"endpoints":[
            {"replica":0,"job":"j-1","host":"h","address":"fd00::1","ports":{"pg":5432}}]}"#,
        "plain",
        expect![[r#"
            [fd00::1]:5432
        "#]],
    );
    check(
        r#"{"service":"db","index":3,"endpoints":[]}"#,
        "plain",
        expect![""],
    );
}

#[test]
fn env() {
    check(
        WEB,
        "env",
        expect![[r#"
            XCE_ENDPOINTS_HTTP=127.0.0.11:20417,127.0.0.12:20533
            XCE_ENDPOINTS_METRICS=127.0.0.11:9100,127.0.0.12:9100
        "#]],
    );
    check(
        WEB,
        "env port=metrics",
        expect![[r#"
            XCE_ENDPOINTS_METRICS=127.0.0.11:9100,127.0.0.12:9100
        "#]],
    );
    check(
        r#"{"service":"web","index":9,"endpoints":[]}"#,
        "env declared=http,admin-api",
        expect![[r#"
            XCE_ENDPOINTS_ADMIN_API=
            XCE_ENDPOINTS_HTTP=
        "#]],
    );
}

#[test]
fn json_is_the_entry_as_sent() {
    check(
        r#"{"service":"web","endpoints":[],"index":9}"#,
        "json",
        expect![[r#"
            {"service":"web","endpoints":[],"index":9}
        "#]],
    );
}

/// Whatever a (checked) entry holds, `env` lines are `NAME=VALUE` where neither part
/// needs shell quoting, so `eval "$(xcecli ... -o env)"` cannot run anything.
#[test]
fn env_values_never_need_quoting() {
    let entry = r#"{"service":"s","index":1,"endpoints":[
        {"replica":0,"job":"j-1","host":"h","address":"fe80::1","ports":{"a-b-9":1,"http":65535}},
        {"replica":1,"job":"j-2","host":"h","address":"::ffff:10.0.0.2","ports":{"a-b-9":2}},
        {"replica":2,"job":"j-3","host":"h","address":"10.0.0.1","ports":{"http":3}}]}"#;
    let entry: EndpointEntry = serde_json::from_str(entry).unwrap();
    model::check(&entry).unwrap();
    let view = EndpointsView {
        format: EndpointFormat::Env,
        port: None,
        all: false,
        declared: &[],
    };
    let out = endpoints(view, &entry, "").unwrap();
    assert_eq!(out.lines().count(), 2, "{out}");
    for line in out.lines() {
        let (name, value) = line.split_once('=').unwrap();
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
            "{line}"
        );
        assert!(
            value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b":.,[]%-".contains(&b)),
            "{line}"
        );
    }
}

/// 2026-12-03T09:00:00Z.
fn test_now() -> SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_288_400)
}

#[test]
fn ages_read_at_a_glance() {
    let now = test_now();
    let lines: Vec<String> = [
        "2026-12-03T08:59:48.250Z",
        "2026-12-03T08:56:48Z",
        "2026-12-03T06:55:00Z",
        "2026-11-29T05:00:00Z",
        "2026-12-03T09:00:05Z",
        "yesterday",
        "",
    ]
    .iter()
    .map(|at| format!("{at:?} -> {}", ago(at, now)))
    .collect();
    expect![[r#"
        "2026-12-03T08:59:48.250Z" -> 11s ago
        "2026-12-03T08:56:48Z" -> 3m12s ago
        "2026-12-03T06:55:00Z" -> 2h5m ago
        "2026-11-29T05:00:00Z" -> 4d4h ago
        "2026-12-03T09:00:05Z" -> just now
        "yesterday" -> yesterday
        "" -> -"#]]
    .assert_eq(&lines.join("\n"));
}

/// Issue 27 finding 9: `[service.meta]` values are the submitter's text. With a terminal
/// escape and a newline in one, a raw table cleared bob's screen and printed a row of a
/// replica that does not exist; escaped, each row stays one line and no escape reaches
/// the terminal.
#[test]
fn control_characters_in_meta_are_escaped_in_tables() {
    let forged = WEB.replace(
        r#""index":42,"#,
        r#""index":42,"meta":{"team":"\u001b[2J\u001b[31mpay\rx\n9        exec-09  10.6.6.6    http=1\u0007\u009b"},"#,
    );
    check(
        &forged,
        "table port=http",
        expect![[r#"
            REPLICA  HOST     ADDRESS     PORTS       META
            0        exec-01  127.0.0.11  http=20417  team=\u{1b}[2J\u{1b}[31mpay\rx\n9        exec-09  10.6.6.6    http=1\u{7}\u{9b}
            1        exec-02  127.0.0.12  http=20533  team=\u{1b}[2J\u{1b}[31mpay\rx\n9        exec-09  10.6.6.6    http=1\u{7}\u{9b}
        "#]],
    );
}

/// Every character a terminal acts on is escaped in any table, whatever column holds
/// it, and the row count is the row count.
#[test]
fn table_cells_and_notes_never_carry_control_characters() {
    let nasty: String = (0u32..0x20)
        .chain([0x7f, 0x85, 0x9b])
        .filter_map(char::from_u32)
        .collect();
    let out = super::table(
        &["A", "B"],
        &[
            Line::Row(vec![nasty.clone(), "b".into()]),
            Line::Note(format!("note{nasty}")),
        ],
    );
    assert_eq!(out.lines().count(), 3, "{out:?}");
    assert!(
        !out.trim_end_matches('\n')
            .chars()
            .any(|c| c.is_control() && c != '\n'),
        "{out:?}"
    );
}

fn check_list(kind: &str, json: &str, expect: Expect) {
    let actual = match kind {
        "services" => service_list(&serde_json::from_str(json).unwrap()),
        "hosts" => host_list(&serde_json::from_str(json).unwrap()),
        "status" => status(&serde_json::from_str(json).unwrap(), test_now()),
        "stopped" => stopped(&serde_json::from_str(json).unwrap(), false),
        "stopped-now" => stopped(&serde_json::from_str(json).unwrap(), true),
        k => panic!("unknown kind {k}"),
    };
    expect.assert_eq(&actual);
}

#[test]
fn lists() {
    check_list(
        "services",
        r#"{"services":[
            {"name":"web","project":"default","replicas":3,"running":3,"ready":3,"pending":0,"pending_reason":null,"state":"active","index":42},
            {"name":"metrics-exporter","project":"team-a","replicas":4,"running":3,"ready":2,"pending":1,"pending_reason":"port metrics/tcp 9100 is taken on all 3 hosts","state":"active","index":7}]}"#,
        expect![[r#"
            NAME              PROJECT  REPLICAS  READY  PENDING  STATE
            web               default  3         3      0        active
            metrics-exporter  team-a   4         2      1        active
              pending: port metrics/tcp 9100 is taken on all 3 hosts
        "#]],
    );
    check_list(
        "services",
        r#"{"services":[]}"#,
        expect![[r#"
        no services
    "#]],
    );
    check_list(
        "hosts",
        r#"{"hosts":[
            {"id":"exec-01","state":"ready","ip_addr":"127.0.0.11","addresses":[{"ip":"127.0.0.11","interface":"lo"}],"jobs":3,"ports":{"range":"20000-32000","capacity":12001,"used":3,"unavailable":0}},
            {"id":"exec-02","state":"lost","ip_addr":null,"addresses":[],"jobs":0,"ports":{"range":"20000-32000","capacity":12001,"used":0,"unavailable":2}},
            {"id":"exec-03","state":"ready","ip_addr":"fd00::3","addresses":[{"ip":"fd00::3","interface":"eth0"},{"ip":"10.0.0.3"}],"jobs":1}]}"#,
        expect![[r#"
            ID       STATE  IP_ADDR     ADDRESSES               JOBS  PORTS-USED
            exec-01  ready  127.0.0.11  127.0.0.11(lo)          3     3/12001
            exec-02  lost   -           -                       0     0/12001 (2 unavailable)
            exec-03  ready  fd00::3     fd00::3(eth0),10.0.0.3  1     -
        "#]],
    );
    check_list(
        "status",
        r#"{"name":"web","project":"default","replicas":3,"state":"active","index":42,"generation":2,
            "rollout":{"generation":2,"state":"progressing","updated":2,"ready":3,"outdated":1,
                       "reason":"replica 2: port metrics/tcp 9100 is taken on all 3 hosts"},
            "profile":{},
            "pending":[{"replica":2,"reason":"port metrics/tcp 9100 is taken\non all 3 hosts"}],
            "jobs":[{"job":"j-23","replica":1,"host":"exec-02","state":"running","ready":true,"generation":2,"ports":{"http":20419}},
                    {"job":"j-17","replica":0,"host":"exec-01","state":"draining","ready":false,"generation":1,"ports":{"http":20417}},
                    {"job":"j-22","replica":0,"host":"exec-03","state":"running","ready":true,"generation":2,"ports":{"http":20418}},
                    {"job":"j-19","replica":2,"host":"exec-03","state":"running","ready":true,"generation":1,"ports":{}}]}"#,
        expect![[r#"
            service web in project default: 3 replicas, active, generation 2
            rollout: generation 2 progressing: 2/3 updated, 3 ready, 1 outdated
              waiting: replica 2: port metrics/tcp 9100 is taken on all 3 hosts
            REPLICA  JOB   HOST     GEN  STATE     READY  PORTS
            0        j-17  exec-01  1    draining  no     http=20417
            0        j-22  exec-03  2    running   yes    http=20418
            1        j-23  exec-02  2    running   yes    http=20419
            2        j-19  exec-03  1    running   yes    -
            pending replica 2: port metrics/tcp 9100 is taken\non all 3 hosts
        "#]],
    );
    // From an apiserver that predates rollouts: no rollout line, no generations.
    check_list(
        "status",
        r#"{"name":"web","project":"default","replicas":1,"state":"stopping","index":42,"profile":{},
            "pending":[],
            "jobs":[{"job":"j-17","replica":0,"host":"exec-01","state":"stopping","ready":false,"ports":{"http":20417}}]}"#,
        expect![[r#"
            service web in project default: 1 replicas, stopping
            REPLICA  JOB   HOST     GEN  STATE     READY  PORTS
            0        j-17  exec-01  -    stopping  no     http=20417
        "#]],
    );
    check_list(
        "status",
        r#"{"name":"web","project":"default","replicas":2,"state":"active","index":9,"generation":4,
            "rollout":{"generation":4,"state":"reverted","updated":0,"ready":0,"outdated":0,
                       "reason":"generation 3 failed: no progress for 5m; restored the profile of generation 2"},
            "profile":{},"pending":[],"jobs":[]}"#,
        expect![[r#"
            service web in project default: 2 replicas, active, generation 4
            rollout: generation 4 reverted: 0/2 updated, 0 ready, 0 outdated
              reason: generation 3 failed: no progress for 5m; restored the profile of generation 2
            no replicas placed
        "#]],
    );
    // A crash-looping replica: what ended it, when, how often, and where its log is.
    check_list(
        "status",
        r#"{"name":"api","project":"default","replicas":3,"state":"active","index":51,"generation":1,
            "rollout":{"generation":1,"state":"progressing","updated":2,"ready":1,"outdated":0,"reason":null},
            "profile":{},
            "pending":[{"replica":1,"reason":"restarting in 4s: cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"}],
            "jobs":[{"job":"j-9","replica":0,"host":"exec-01","state":"running","ready":true,"generation":1,"log":"/var/lib/xce/logs/j-9.log"},
                    {"job":"j-8","replica":2,"host":"exec-02","state":"running","ready":false,"generation":1,"log":"/var/lib/xce/logs/j-8.log"}],
            "replica_status":[
              {"replica":0,"restarts":2,"log":"/var/lib/xce/logs/j-9.log","log_host":"exec-01",
               "last_exit":{"job":"j-4","host":"exec-02","at":"2026-12-03T08:58:30.120Z","code":null,"signal":9,"signal_name":"SIGKILL","error":null,"summary":"SIGKILL (signal 9)"}},
              {"replica":1,"restarts":3,"log":"/var/lib/xce/logs/j-7.log","log_host":"exec-02",
               "last_exit":{"job":"j-7","host":"exec-02","at":"2026-12-03T08:59:48Z","code":127,"signal":null,"signal_name":null,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","summary":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"}},
              {"replica":2,"restarts":0,"log":"/var/lib/xce/logs/j-8.log","log_host":"exec-02","last_exit":null}]}"#,
        expect![[r#"
            service api in project default: 3 replicas, active, generation 1
            rollout: generation 1 progressing: 2/3 updated, 1 ready, 0 outdated
            REPLICA  JOB  HOST     GEN  STATE    READY  PORTS
            0        j-9  exec-01  1    running  yes    -
            2        j-8  exec-02  1    running  no     -
            pending replica 1: restarting in 4s: cannot start "no-such-binary-xyz": No such file or directory (os error 2)
            REPLICA  RESTARTS  LAST-EXIT  LOG                                CAUSE
            0        2         1m29s ago  exec-01:/var/lib/xce/logs/j-9.log  j-4 on exec-02: SIGKILL (signal 9)
            1        3         12s ago    exec-02:/var/lib/xce/logs/j-7.log  j-7 on exec-02: cannot start "no-such-binary-xyz": No such file or directory (os error 2)
            2        0         -          exec-02:/var/lib/xce/logs/j-8.log  -
        "#]],
    );
    check_list(
        "stopped",
        r#"{"name":"web","stopping":3}"#,
        expect![[r#"
            stopping service web (3 replicas)
        "#]],
    );
    check_list(
        "stopped-now",
        r#"{"name":"web","stopping":3}"#,
        expect![[r#"
            stopping service web (3 replicas, without draining)
        "#]],
    );
}
