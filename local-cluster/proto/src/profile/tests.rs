//! Profile validation, checked through one `check(input, expect)` helper.

use super::*;
use plugin_api::{Grant, HostFacts, HostId, JobId, PlacementRequest, SectionInfo, Unfit};
use serde_json::json;

fn check(doc: Value, expect: expect_test::Expect) {
    check_with(doc, &[], expect)
}

/// [`check`] with resource plugins.
fn check_with(doc: Value, plugins: &[&dyn ResourcePlugin], expect: expect_test::Expect) {
    let out = match validate(&doc, plugins) {
        Ok(p) => format!(
            "ok {} {} {} {:?}",
            p.name, p.project, p.replicas, p.readiness
        ),
        Err(errs) => errs
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    };
    expect.assert_eq(&out);
}

#[test]
fn minimal_profile_gets_defaults() {
    check(
        json!({"service": {"name": "web", "command": ["true"]}}),
        expect_test::expect!["ok web default 1 None"],
    );
}

#[test]
fn min_ready_defaults_to_ten_seconds_and_bounds_the_deadline() {
    let p = validate(
        &json!({"service": {"name": "web", "command": ["true"]}}),
        &[],
    )
    .unwrap();
    assert_eq!(p.update.min_ready, DEFAULT_MIN_READY);
    assert_eq!(DEFAULT_MIN_READY, Duration::from_secs(10));
    check(
        json!({"service": {"name": "web", "command": ["true"], "update": {"deadline": "5s"}}}),
        expect_test::expect!["service.update.deadline: must be longer than min_ready (10s, its default): no replica could make progress in time"],
    );
    check(
        json!({"service": {"name": "web", "command": ["true"], "update": {"deadline": "5s", "min_ready": "0s"}}}),
        expect_test::expect!["ok web default 1 None"],
    );
}

#[test]
fn every_problem_is_listed() {
    check(
        json!({"svc": 1, "service": {"name": "Web_", "replicas": 0, "command": [], "extra": true}}),
        expect_test::expect![[r#"
            svc: unknown field
            service.extra: unknown field
            service.name: may contain only a-z, 0-9 and '-'
            service.replicas: must be between 1 and 10000
            service.command: must not be empty"#]],
    );
}

#[test]
fn readiness_must_name_a_declared_socket() {
    check(
        json!({"service": {"name": "web", "command": ["x"], "readiness": {"tcp": "http", "interval": "fast"}}}),
        expect_test::expect![[r#"
            service.readiness.tcp: names no declared port: "http"
            service.readiness.interval: not a duration (expected number at 0)"#]],
    );
}

/// A stand-in for the ports plugin, for validation only: `service.ports` is an array of
/// port names, all "any free", and every host holds `holds` of them.
struct Ports {
    holds: usize,
}

impl ResourcePlugin for Ports {
    fn name(&self) -> &'static str {
        "ports"
    }
    fn validate(&self, s: Option<&Value>) -> Result<SectionInfo, Vec<FieldError>> {
        let names = self.socket_names(s).ok_or_else(|| {
            vec![FieldError::new(
                "service.ports",
                "expected an array of names",
            )]
        })?;
        if names.len() > self.holds {
            return Err(vec![FieldError::new(
                "service.ports",
                format!(
                    "{} \"any free\" tcp ports are more than any host's range can hold (at most {})",
                    names.len(),
                    self.holds
                ),
            )]);
        }
        Ok(SectionInfo {
            socket_names: names,
            quantities: Default::default(),
        })
    }
    fn socket_names(&self, s: Option<&Value>) -> Option<Vec<String>> {
        match s {
            None => Some(Vec::new()),
            Some(v) => v
                .as_array()?
                .iter()
                .map(|n| n.as_str().map(str::to_owned))
                .collect(),
        }
    }
    fn host_up(&mut self, _: &HostId, _: &HostFacts) -> Result<(), FieldError> {
        unreachable!("validation only")
    }
    fn host_removed(&mut self, _: &HostId) {
        unreachable!("validation only")
    }
    fn fits(&self, _: &HostId, _: &PlacementRequest<'_>) -> Result<(), Unfit> {
        unreachable!("validation only")
    }
    fn reserve(&mut self, _: &HostId, _: &PlacementRequest<'_>) -> Result<Grant, Unfit> {
        unreachable!("validation only")
    }
    fn release(&mut self, _: &HostId, _: &JobId) {
        unreachable!("validation only")
    }
    fn restore(&mut self, _: &HostId, _: &JobId, _: &Grant) -> Result<(), String> {
        unreachable!("validation only")
    }
}

/// A plugin that refuses its section does not make the probe's reference to a port it
/// declares a second problem; a reference to a port it does not declare still is one,
/// and when the section is unreadable no reference is judged.
#[test]
fn a_refused_ports_section_still_declares_its_names() {
    let ports = Ports { holds: 3 };
    let with = |ports: Value, port: &str| {
        json!({"service": {
            "name": "web", "command": ["x"], "ports": ports,
            "readiness": {"http": {"port": port}},
        }})
    };
    let four = json!(["http", "a", "b", "c"]);
    check_with(
        with(four.clone(), "http"),
        &[&ports],
        expect_test::expect![[
            r#"service.ports: 4 "any free" tcp ports are more than any host's range can hold (at most 3)"#
        ]],
    );
    check_with(
        with(four, "web"),
        &[&ports],
        expect_test::expect![[r#"
            service.ports: 4 "any free" tcp ports are more than any host's range can hold (at most 3)
            service.readiness.http.port: names no declared port: "web""#]],
    );
    check_with(
        with(json!("http"), "http"),
        &[&ports],
        expect_test::expect!["service.ports: expected an array of names"],
    );
    // Accepted sections are checked as before.
    check_with(
        with(json!(["http"]), "web"),
        &[&ports],
        expect_test::expect![[r#"service.readiness.http.port: names no declared port: "web""#]],
    );
}

#[test]
fn probe_thresholds_default_to_one_and_are_bounded() {
    let parse = |r: Value| {
        let mut errs = Vec::new();
        let sockets = DeclaredSockets {
            names: vec!["http".to_owned()],
            complete: true,
        };
        let r = parse_readiness(r.as_object().unwrap(), &sockets, &mut errs);
        match r {
            Some(r) => format!("ok {} {}", r.failure_threshold, r.success_threshold),
            None => errs
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    };
    assert_eq!(parse(json!({"tcp": "http"})), "ok 1 1");
    assert_eq!(
        parse(json!({"tcp": "http", "failure_threshold": 3, "success_threshold": 100})),
        "ok 3 100"
    );
    expect_test::expect![[r#"
        service.readiness.failure_threshold: must be an integer between 1 and 100
        service.readiness.success_threshold: must be an integer between 1 and 100"#]]
    .assert_eq(&parse(
        json!({"tcp": "http", "failure_threshold": 0, "success_threshold": "3"}),
    ));
    expect_test::expect![
        "service.readiness.failure_threshold: must be an integer between 1 and 100"
    ]
    .assert_eq(&parse(json!({"tcp": "http", "failure_threshold": 101})));
    // A record stored before the thresholds existed reads as one probe either way.
    let old: Readiness = serde_json::from_value(
        json!({"probe": {"tcp": {"socket": "http"}}, "interval": 1000, "timeout": 500}),
    )
    .unwrap();
    assert_eq!((old.failure_threshold, old.success_threshold), (1, 1));
}

#[test]
fn toml_errors_name_the_profile() {
    let e = toml_to_json("[service\nname=").unwrap_err();
    assert_eq!(e.field, "profile");
}

mod fuzz {
    use super::super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|f| json!(f)),
            "\\PC{0,20}".prop_map(Value::String),
            prop::sample::select(vec!["web", "", "a-", "HTTP", "1s", "\0", "/"])
                .prop_map(|s| json!(s)),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop::sample::select(vec![
                        "service",
                        "name",
                        "project",
                        "replicas",
                        "command",
                        "readiness",
                        "tcp",
                        "http",
                        "interval",
                        "timeout",
                        "failure_threshold",
                        "success_threshold",
                        "port",
                        "path",
                        "extra",
                    ])
                    .prop_map(str::to_owned),
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

        /// Any JSON document: validation answers (never panics), and a rejection names
        /// a field and a reason for every problem.
        #[test]
        fn any_document_is_answered_with_named_problems(doc in any_json()) {
            match validate(&doc, &[]) {
                Ok(p) => {
                    prop_assert!(plugin_api::check_name(&p.name).is_ok());
                    prop_assert!(!p.command.is_empty());
                    prop_assert!((1..=MAX_REPLICAS as u32).contains(&p.replicas));
                }
                Err(errs) => {
                    prop_assert!(!errs.is_empty());
                    for e in errs {
                        prop_assert!(!e.field.is_empty() && !e.reason.is_empty(), "{e:?}");
                    }
                }
            }
        }

        /// A valid profile with one field replaced by anything: still answered, and
        /// accepted only if the result is itself valid.
        #[test]
        fn one_field_mutated(key in prop::sample::select(vec!["name", "project", "replicas", "command", "readiness"]), v in any_json()) {
            let mut doc = json!({"service": {"name": "web", "replicas": 2, "command": ["true"]}});
            doc["service"][key] = v;
            if let Ok(p) = validate(&doc, &[]) {
                prop_assert!(plugin_api::check_name(&p.name).is_ok());
                prop_assert!(plugin_api::check_name(&p.project).is_ok());
            }
        }

        /// Arbitrary text as TOML: parsed or rejected with a `profile` error, never a panic.
        #[test]
        fn any_text_as_toml(text in "\\PC{0,200}") {
            if let Err(e) = toml_to_json(&text) {
                prop_assert_eq!(e.field, "profile");
            }
        }
    }
}

mod nesting {
    #[test]
    fn deeply_nested_input_is_rejected_not_a_stack_overflow() {
        for depth in [200, 10_000, 500_000] {
            let toml = format!("a = {}{}", "[".repeat(depth), "]".repeat(depth));
            let r = std::thread::Builder::new()
                .stack_size(2 << 20)
                .spawn(move || super::super::toml_to_json(&toml).is_err())
                .unwrap()
                .join();
            let rejected = r.unwrap_or_else(|_| {
                panic!("depth {depth}: the parser must not overflow a 2 MiB stack")
            });
            assert!(rejected, "depth {depth}: nesting this deep is rejected");
            let json = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            assert!(
                serde_json::from_str::<serde_json::Value>(&json).is_err(),
                "depth {depth}: JSON nesting this deep is rejected"
            );
        }
    }
}

#[test]
fn meta_labels() {
    let with = |meta: Value| json!({"service": {"name": "web", "command": ["x"], "meta": meta}});
    let p = validate(&with(json!({"team": "payments", "tier_1": ""})), &[]).unwrap();
    assert_eq!(
        format!("{:?}", p.meta),
        r#"{"team": "payments", "tier_1": ""}"#
    );
    let many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
    check(
        with(Value::Object(many)),
        expect_test::expect!["service.meta: at most 32 labels (got 33)"],
    );
    // Every problem, each with its field path, together with the profile's others.
    let mut doc = with(json!({
        "Team": "a", "cost-center": "b", "": "c", "ok": 1,
        "big": "x".repeat(257), "just_fits": "x".repeat(256),
        "a_very_long_label_name_that_is_longer_than_sixty_three_characters": "d",
    }));
    doc["service"]["replicas"] = json!(0);
    check(
        doc,
        expect_test::expect![[r#"
            service.replicas: must be between 1 and 10000
            service.meta.: label names must be 1-63 characters
            service.meta.Team: label names may contain only a-z, 0-9 and '_' (they become Prometheus label names)
            service.meta.a_very_long_label_name_that_is_longer_than_sixty_three_characters: label names must be 1-63 characters
            service.meta.big: value must be at most 256 bytes (got 257)
            service.meta.cost-center: label names may contain only a-z, 0-9 and '_' (they become Prometheus label names)
            service.meta.ok: value must be a string"#]],
    );
    check(
        with(json!("team=a")),
        expect_test::expect!["service.meta: must be a table of string labels"],
    );
}

#[test]
fn env_variables() {
    let with = |env: Value| json!({"service": {"name": "web", "command": ["x"], "env": env}});
    let p = validate(
        &with(json!({"RUST_LOG": "info", "_x1": "", "PATH": "/opt/app/bin:/usr/bin"})),
        &[],
    )
    .unwrap();
    assert_eq!(
        format!("{:?}", p.env),
        r#"{"PATH": "/opt/app/bin:/usr/bin", "RUST_LOG": "info", "_x1": ""}"#
    );
    assert!(validate(&with(json!({})), &[]).unwrap().env.is_empty());
    let many: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("V{i}"), json!("v"))).collect();
    check(
        with(Value::Object(many)),
        expect_test::expect!["service.env: at most 64 variables (got 65)"],
    );
    check(
        with(json!({
            "XCE_PORT_HTTP": "1", "xce_job_id": "j-1", "1ST": "a", "A-B": "b", "": "c",
            "N": 1, "BIG": "x".repeat(4097), "NUL": "a\u{0}b", "FITS": "x".repeat(4096),
        })),
        expect_test::expect![[r#"
            service.env.: variable names are 1-128 characters of A-Z, a-z, 0-9 and '_', not starting with a digit
            service.env.1ST: variable names are 1-128 characters of A-Z, a-z, 0-9 and '_', not starting with a digit
            service.env.A-B: variable names are 1-128 characters of A-Z, a-z, 0-9 and '_', not starting with a digit
            service.env.BIG: value must be at most 4096 bytes (got 4097)
            service.env.N: value must be a string
            service.env.NUL: value must not contain NUL
            service.env.XCE_PORT_HTTP: XCE_ variables are set by the worker (ports, addresses, the job's identity)
            service.env.xce_job_id: XCE_ variables are set by the worker (ports, addresses, the job's identity)"#]],
    );
    check(
        with(json!("A=b")),
        expect_test::expect!["service.env: must be a table of string values (NAME = \"value\")"],
    );
}
