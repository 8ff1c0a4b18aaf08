use super::*;
use serde_json::json;
use std::collections::BTreeMap;

fn job<'a>(summaries: BTreeMap<String, Value>) -> JobAnswer<'a> {
    JobAnswer {
        generation: Some(2),
        host: "exec-01".into(),
        job: "j-7".into(),
        log: None,
        ready: true,
        replica: 0,
        state: "running".into(),
        summaries: Cow::Owned(summaries),
    }
}

/// The plugins' summaries go between the job's fields by name, as in the sorted map the
/// answer once was; the text is the tree's.
#[test]
fn a_jobs_summaries_are_keys_beside_its_fields_in_order() {
    let j = job([
        ("ports".to_owned(), json!({"http": 20417})),
        ("aaa".to_owned(), json!(1)),
        ("zzz".to_owned(), json!(null)),
    ]
    .into());
    let text = serde_json::to_string(&j).unwrap();
    expect_test::expect![[r#"{"aaa":1,"generation":2,"host":"exec-01","job":"j-7","log":null,"ports":{"http":20417},"ready":true,"replica":0,"state":"running","zzz":null}"#]]
        .assert_eq(&text);
    assert_eq!(text, serde_json::to_value(&j).unwrap().to_string());
    let back: JobAnswer<'_> = serde_json::from_str(&text).unwrap();
    assert_eq!(back, j);
    assert_eq!(back.summary("ports"), Some(&json!({"http": 20417})));
}

/// The list of the job's own fields (what no plugin may be named) is what it writes.
#[test]
fn the_job_fields_are_the_keys_it_writes() {
    let v = serde_json::to_value(job(BTreeMap::new())).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, JOB_FIELDS);
}

/// A summary named like a field (a plugin the host should have refused) never replaces
/// the field.
#[test]
fn a_summary_named_like_a_field_is_left_out() {
    let j = job([("state".to_owned(), json!("mine"))].into());
    expect_test::expect![[r#"{"generation":2,"host":"exec-01","job":"j-7","log":null,"ready":true,"replica":0,"state":"running"}"#]]
        .assert_eq(&serde_json::to_string(&j).unwrap());
}

/// What a server that predates generations, rollouts and replica status sends is read
/// with defaults; unknown rollout states are `Unknown`.
#[test]
fn an_older_or_newer_servers_detail_is_read() {
    let d: ServiceDetail<'_> = serde_json::from_str(
        r#"{"name":"web","replicas":2,"state":"active","jobs":[{"job":"j-1","replica":0}],
            "rollout":{"generation":3,"state":"paused","surprise":true},"new_field":1}"#,
    )
    .unwrap();
    assert_eq!(d.name, "web");
    assert_eq!(d.generation, 0);
    assert_eq!(d.jobs[0].generation, None);
    assert!(d.jobs[0].summaries.is_empty());
    assert!(d.replica_status.is_empty());
    assert_eq!(d.profile.as_ref(), &Value::Null);
    assert_eq!(d.rollout.map(|r| r.state), Some(RolloutState::Unknown));
}

/// Every object of the detail is written with its keys in order, `null`s included.
#[test]
fn the_detail_is_written_in_key_order() {
    let profile = json!({"name": "web", "replicas": 1});
    let d: ServiceDetail<'_> = ServiceDetail {
        generation: 1,
        index: 9,
        jobs: vec![job(BTreeMap::new())],
        name: "web".into(),
        pending: vec![PendingReplica {
            reason: Some("no host".into()),
            replica: 1,
        }],
        profile: Cow::Borrowed(&profile),
        project: "default".into(),
        replica_status: vec![ReplicaStatus {
            last_exit: Some(LastExit {
                at: "2026-12-03T09:00:00.000Z".into(),
                code: None,
                error: None,
                host: "exec-01".into(),
                job: "j-3".into(),
                signal: Some(9),
                signal_name: Some("SIGKILL".into()),
                summary: "SIGKILL (signal 9)".into(),
            }),
            log: None,
            log_host: None,
            replica: 0,
            restarts: 1,
        }],
        replicas: 2,
        rollout: Some(Rollout {
            dns_warning: None,
            generation: 1,
            outdated: 0,
            ready: 1,
            reason: None,
            state: RolloutState::Progressing,
            updated: 1,
        }),
        state: "active".into(),
    };
    let text = serde_json::to_string(&d).unwrap();
    assert_eq!(text, serde_json::to_value(&d).unwrap().to_string());
    let back: ServiceDetail<'_> = serde_json::from_str(&text).unwrap();
    assert_eq!(back, d);
    let list = ServiceList {
        services: vec![ServiceSummary {
            generation: 1,
            index: 9,
            name: "web".into(),
            pending: 1,
            pending_reason: Some("no host".into()),
            project: "default".into(),
            ready: 1,
            replicas: 2,
            rollout: Some(RolloutState::Progressing),
            running: 1,
            state: "active".into(),
        }],
    };
    let text = serde_json::to_string(&list).unwrap();
    expect_test::expect![[r#"{"services":[{"generation":1,"index":9,"name":"web","pending":1,"pending_reason":"no host","project":"default","ready":1,"replicas":2,"rollout":"progressing","running":1,"state":"active"}]}"#]]
        .assert_eq(&text);
    assert_eq!(text, serde_json::to_value(&list).unwrap().to_string());
    let stop = StopAnswer {
        name: "web".into(),
        stopping: 2,
    };
    assert_eq!(
        serde_json::to_string(&stop).unwrap(),
        r#"{"name":"web","stopping":2}"#
    );
}
