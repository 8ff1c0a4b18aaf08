//! `ControllerConfig` and its checks.

use super::*;

#[test]
fn config_timing_rules() {
    let check = |f: fn(&mut ControllerConfig), expect: Expect| {
        let mut cfg = ControllerConfig::default();
        f(&mut cfg);
        let out = match cfg.validate() {
            Ok(()) => "ok".to_owned(),
            Err(e) => e.to_string(),
        };
        expect.assert_eq(&out);
    };
    check(|_| {}, expect!["ok"]);
    check(
        |c| c.grace_period = c.unreachable_after,
        expect!["grace_period (3s) must be longer than unreachable_after (3s)"],
    );
    check(
        |c| c.heartbeat_interval = Duration::from_secs(5),
        expect!["heartbeat_interval (5s) must be shorter than unreachable_after (3s)"],
    );
    check(
        |c| c.body_limit = 0,
        expect!["body_limit must be greater than zero"],
    );
}

#[test]
fn disruption_threshold_is_a_share_above_zero_up_to_one() {
    let out: Vec<String> = [0.55, 1.0, 0.0, -0.5, 1.5, f64::NAN]
        .into_iter()
        .map(|x| match DisruptionThreshold::try_new(x) {
            Ok(t) => format!("{x}: ok {}", t.get()),
            Err(e) => format!("{x}: {e}"),
        })
        .collect();
    expect![[r#"
        0.55: ok 0.55
        1: ok 1
        0: disruption_threshold (0) must be more than 0 and at most 1 (1 turns the full-disruption rule off)
        -0.5: disruption_threshold (-0.5) must be more than 0 and at most 1 (1 turns the full-disruption rule off)
        1.5: disruption_threshold (1.5) must be more than 0 and at most 1 (1 turns the full-disruption rule off)
        NaN: disruption_threshold (NaN) must be more than 0 and at most 1 (1 turns the full-disruption rule off)"#]]
    .assert_eq(&out.join("\n"));
    // (unreachable, hosts) → full disruption? With the default, and with the rule off.
    let t = DisruptionThreshold::DEFAULT;
    let off = DisruptionThreshold::try_new(1.0).unwrap();
    let cases = [
        (1, 1),
        (1, 2),
        (2, 2),
        (2, 3),
        (1, 3),
        (2, 4),
        (3, 5),
        (5, 9),
        (5, 10),
    ];
    let out: Vec<String> = cases
        .iter()
        .map(|&(u, n)| {
            format!(
                "{u}/{n}: {} {}",
                t.is_full_disruption(u, n),
                off.is_full_disruption(u, n)
            )
        })
        .collect();
    expect![[r#"
        1/1: false false
        1/2: false false
        2/2: true false
        2/3: true false
        1/3: false false
        2/4: false false
        3/5: true false
        5/9: true false
        5/10: false false"#]]
    .assert_eq(&out.join("\n"));
}

#[test]
fn open_store_creates_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ControllerConfig {
        data_dir: dir.path().join("a/b"),
        ..ControllerConfig::default()
    };
    let store = open_store(&cfg).unwrap();
    assert!(store.load_all().unwrap().is_empty());
    assert!(cfg.store_path().exists());
}

/// A resource plugin named like a field of a job (or a host) in the answers would have its
/// summaries dropped there, since they are keys beside those fields: the controller
/// refuses to start with it, naming the plugin and the field.
#[tokio::test]
async fn a_plugin_named_like_a_field_of_the_answers_is_refused_at_start() {
    let start = |name: &'static str| async move {
        let plugins = ControllerPlugins {
            resources: vec![Box::new(Slots::new(name))],
            ..ControllerPlugins::default()
        };
        let keyring = xce_serve::keyring::Keyring::new(Tokens::parse(TOKENS).unwrap());
        let store = store_of_cluster("c1c1c1c1c1c1c1c1");
        controller(
            &ControllerConfig::default(),
            keyring,
            plugins,
            store,
            plain_ids,
        )
        .await
    };
    let err = start("state").await.expect_err("a plugin named state");
    expect![[r#"cannot load the controller's resource plugins: plugin "state" cannot be loaded: its name is the field jobs[].state of GET /v1/services/{name}, and the API shows each plugin's summary under the plugin's name beside that field; rename the plugin"#]]
        .assert_eq(&format!("{err:#}"));
    for (name, field) in [
        ("job", "jobs[].job"),
        ("log", "jobs[].log"),
        ("id", "hosts[].id"),
    ] {
        let err = start(name).await.expect_err(name);
        assert!(format!("{err:#}").contains(field), "{name}: {err:#}");
    }
    let ok = start("slots").await.expect("another name is fine");
    ok.shutdown().await;
}

/// Grants, profile sections and summaries are keyed by plugin name: two resource plugins
/// of one name are refused at start, and two of different names start.
#[tokio::test]
async fn two_resource_plugins_of_one_name_are_refused_at_start() {
    let start = |a: &'static str, b: &'static str| async move {
        let plugins = ControllerPlugins {
            resources: vec![Box::new(Slots::new(a)), Box::new(Slots::new(b))],
            ..ControllerPlugins::default()
        };
        let keyring = xce_serve::keyring::Keyring::new(Tokens::parse(TOKENS).unwrap());
        let store = store_of_cluster("c1c1c1c1c1c1c1c1");
        controller(
            &ControllerConfig::default(),
            keyring,
            plugins,
            store,
            plain_ids,
        )
        .await
    };
    let err = start("slots", "slots")
        .await
        .expect_err("two plugins named slots");
    expect![[r#"cannot load the controller's resource plugins: two plugins are named "slots"; grants, profile sections and summaries are keyed by plugin name"#]]
        .assert_eq(&format!("{err:#}"));
    let ok = start("slots", "gpus").await.expect("two names are fine");
    ok.shutdown().await;
}
