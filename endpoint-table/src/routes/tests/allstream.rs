//! `GET /v1/endpoints/stream`: snapshot, changes, deletions, resume, reset, RBAC per entry
//! (also when grants change), bad input, the slow-reader cut-off, and a property test that
//! what a subscriber receives rebuilds exactly the table it may view.

use super::*;
use crate::wire::EndpointsAnswer;
use plugin_api::{AuthError, Authenticator};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// One parsed SSE event.
#[derive(Debug, Default)]
struct Ev {
    event: Option<String>,
    id: Option<u64>,
    data: String,
}

fn parse(text: &str) -> Ev {
    let mut ev = Ev::default();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("event: ") {
            ev.event = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("id: ") {
            ev.id = Some(v.parse().unwrap());
        } else if let Some(v) = line.strip_prefix("data: ") {
            ev.data.push_str(v);
        }
    }
    ev
}

/// A subscriber: its stream, what it rebuilt from it, and its last event id.
struct Sub {
    events: Events,
    table: BTreeMap<(String, String), EndpointsAnswer>,
    last_id: Option<u64>,
    resets: usize,
}

impl Sub {
    fn new(resp: Response<Body>) -> Self {
        Self {
            events: Events::new(resp),
            table: BTreeMap::new(),
            last_id: None,
            resets: 0,
        }
    }

    /// Reads one event and applies it; returns it as a line for expectations.
    async fn read(&mut self) -> Option<String> {
        let text = self.events.next().await?;
        let ev = parse(&text);
        if let Some(id) = ev.id {
            assert!(
                self.last_id.is_none_or(|last| id >= last),
                "ids only grow: {id} after {:?}",
                self.last_id
            );
            self.last_id = Some(id);
        }
        if ev.event.as_deref() == Some("reset") {
            self.table.clear();
            self.resets += 1;
            return Some("reset".into());
        }
        let v: serde_json::Value = serde_json::from_str(&ev.data).unwrap();
        let key = (
            v["project"].as_str().unwrap().to_owned(),
            v["service"].as_str().unwrap().to_owned(),
        );
        let id = ev.id.map_or("-".into(), |i| i.to_string());
        if v.get("deleted") == Some(&serde_json::Value::Bool(true)) {
            self.table.remove(&key);
            return Some(format!("{id} {}/{} deleted@{}", key.0, key.1, v["index"]));
        }
        let answer: EndpointsAnswer = serde_json::from_value(v).unwrap();
        let line = format!(
            "{id} {}/{}#{} endpoints={} meta={:?}",
            key.0,
            key.1,
            answer.index,
            answer.endpoints.len(),
            answer.meta
        );
        self.table.insert(key, answer);
        Some(line)
    }

    /// Reads `n` events, one line each.
    async fn lines(&mut self, n: usize) -> String {
        let mut out = String::new();
        for _ in 0..n {
            let _ = writeln!(out, "{}", self.read().await.unwrap());
        }
        out
    }

    /// Reads until what it rebuilt is `want` (bounded by the stream reader's patience).
    async fn until(&mut self, want: &BTreeMap<(String, String), EndpointsAnswer>) {
        while &self.table != want {
            self.read().await.expect("the stream ended early");
        }
    }
}

/// What `principal` may view now, as the all-services stream must rebuild it.
fn visible(c: &Cluster, principal: &Principal) -> BTreeMap<(String, String), EndpointsAnswer> {
    c.api
        .shared()
        .visible_entries(principal, None)
        .iter()
        .map(|e| {
            (
                (e.project.clone(), e.service.clone()),
                crate::wire::answer(e, None, false),
            )
        })
        .collect()
}

#[tokio::test]
async fn snapshot_changes_deletions_and_resume() {
    let c = Cluster::new(TableConfig::default()).await;
    let mut out = String::new();
    let mut alice = Sub::new(c.get("alice /v1/endpoints/stream").await);
    // The snapshot: team-a's three services, the id (the revision it is at) on the last.
    let _ = writeln!(out, "snapshot:\n{}", alice.lines(3).await);

    // A change of web, then one of team-b's secret (never seen), then a removal.
    c.event(ev_job(11, web_job("j-3", 2, "exec-01", 20419)))
        .await;
    c.event(ev_job(
        12,
        job("j-6", "secret", "team-b", 0, "exec-02", &[("http", 22001)]),
    ))
    .await;
    c.event(ev_removed(13, "secret", "team-b")).await;
    c.event(ev_removed(14, "noports", "team-a")).await;
    let _ = writeln!(out, "changes:\n{}", alice.lines(2).await);

    // A host event changes two services at one revision: the id on the last only.
    let mut multi = service("multi", "team-a", &["http", "metrics"]);
    multi.profile["meta"] = serde_json::json!({"team": "payments", "tier": "1"});
    c.event(ev_service(15, multi)).await;
    c.event(ev_host(16, host("exec-01", Some("127.0.0.21")), &[]))
        .await;
    // Read after both: multi's state at 15 is superseded by 16 (a stream behind skips
    // intermediate states, as a per-service stream does).
    let _ = writeln!(
        out,
        "meta, then one host for two:\n{}",
        alice.lines(2).await
    );

    // Resume from 11: exactly what came after it, as it is now.
    let mut resumed = Sub::new(
        c.get("alice /v1/endpoints/stream | last-event-id: 11")
            .await,
    );
    let _ = writeln!(out, "resumed from 11:\n{}", resumed.lines(3).await);
    // Resume from the newest id: nothing until the next change.
    let mut current = Sub::new(
        c.get("alice /v1/endpoints/stream?service=web | last-event-id: 16")
            .await,
    );
    c.event(ev_ended(17, web_job("j-3", 2, "exec-01", 20419)))
        .await;
    let _ = writeln!(
        out,
        "resumed from 16, web only:\n{}",
        current.lines(1).await
    );
    // Older than what the apiserver remembers (before its first resync at 10), or newer
    // than what it has: a gap cannot be ruled out.
    for id in [9, 99] {
        let mut reset = Sub::new(
            c.get(&format!("alice /v1/endpoints/stream | last-event-id: {id}"))
                .await,
        );
        let _ = writeln!(out, "resumed from {id}:\n{}", reset.lines(3).await);
    }
    // Bob (team-b) saw secret go; alice never did, not even its deletion.
    let mut bob = Sub::new(c.get("bob /v1/endpoints/stream | last-event-id: 10").await);
    let _ = writeln!(out, "bob from 10:\n{}", bob.lines(1).await);
    let _ = writeln!(out, "alice, still open:\n{}", alice.lines(1).await);
    assert_eq!(
        alice.table,
        visible(&c, &user("alice", &[(Permission::JobView, "team-a")]))
    );
    // One revision ahead of this host (a client that moved from a host ahead of it): the
    // resume waits for this host to reach 18, then goes on from there without a reset.
    let (ahead, ()) = tokio::join!(
        c.get("alice /v1/endpoints/stream?service=web | last-event-id: 18"),
        c.event(ev_job(18, web_job("j-9", 3, "exec-01", 20430))),
    );
    let mut ahead = Sub::new(ahead);
    c.event(ev_ended(19, web_job("j-9", 3, "exec-01", 20430)))
        .await;
    let _ = writeln!(
        out,
        "resumed from 18 before it was here:\n{}",
        ahead.lines(1).await
    );
    expect![[r#"
        snapshot:
        - team-a/multi#8 endpoints=1 meta={}
        - team-a/noports#5 endpoints=0 meta={}
        10 team-a/web#10 endpoints=2 meta={}

        changes:
        11 team-a/web#11 endpoints=3 meta={}
        14 team-a/noports deleted@14

        meta, then one host for two:
        - team-a/multi#16 endpoints=1 meta={"team": "payments", "tier": "1"}
        16 team-a/web#16 endpoints=3 meta={}

        resumed from 11:
        14 team-a/noports deleted@14
        - team-a/multi#16 endpoints=1 meta={"team": "payments", "tier": "1"}
        16 team-a/web#16 endpoints=3 meta={}

        resumed from 16, web only:
        17 team-a/web#17 endpoints=2 meta={}

        resumed from 9:
        reset
        - team-a/multi#16 endpoints=1 meta={"team": "payments", "tier": "1"}
        17 team-a/web#17 endpoints=2 meta={}

        resumed from 99:
        reset
        - team-a/multi#16 endpoints=1 meta={"team": "payments", "tier": "1"}
        17 team-a/web#17 endpoints=2 meta={}

        bob from 10:
        13 team-b/secret deleted@13

        alice, still open:
        17 team-a/web#17 endpoints=2 meta={}

        resumed from 18 before it was here:
        19 team-a/web#19 endpoints=2 meta={}

    "#]]
    .assert_eq(&out);
}

#[tokio::test]
async fn bad_input() {
    let c = Cluster::new(TableConfig::default()).await;
    let many: Vec<String> = (0..1001).map(|i| format!("s{i}")).collect();
    let five_hundred: Vec<String> = (0..500).map(|i| format!("s{i}")).collect();
    check(
        &c,
        &[
            "alice /v1/endpoints/stream | last-event-id: soon",
            "alice /v1/endpoints/stream | last-event-id: -1",
            "alice /v1/endpoints/stream?port=http",
            "alice /v1/endpoints/stream?format=plain",
            "alice /v1/endpoints/stream?index=3&wait=1s",
            "alice /v1/endpoints/stream?include=some",
            "alice /v1/endpoints/stream?service=web,,multi",
            "alice /v1/endpoints/stream?project=",
            &format!("alice /v1/endpoints/stream?service={}", many.join(",")),
            "- /v1/endpoints/stream",
            "nobody /v1/endpoints/stream",
        ],
        expect![[r#"
            > alice /v1/endpoints/stream | last-event-id: soon
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"Last-Event-ID","reason":"expected a non-negative integer"}],"message":"Last-Event-ID: expected a non-negative integer"}}

            > alice /v1/endpoints/stream | last-event-id: -1
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"Last-Event-ID","reason":"expected a non-negative integer"}],"message":"Last-Event-ID: expected a non-negative integer"}}

            > alice /v1/endpoints/stream?port=http
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"port","reason":"not supported by /v1/endpoints/stream (it sends whole entries as json)"}],"message":"port: not supported by /v1/endpoints/stream (it sends whole entries as json)"}}

            > alice /v1/endpoints/stream?format=plain
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"format","reason":"not supported by /v1/endpoints/stream (it sends whole entries as json)"}],"message":"format: not supported by /v1/endpoints/stream (it sends whole entries as json)"}}

            > alice /v1/endpoints/stream?index=3&wait=1s
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"index","reason":"not supported by /v1/endpoints/stream (it sends whole entries as json)"}],"message":"index: not supported by /v1/endpoints/stream (it sends whole entries as json)"}}

            > alice /v1/endpoints/stream?include=some
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"include","reason":"expected \"all\""}],"message":"include: expected \"all\""}}

            > alice /v1/endpoints/stream?service=web,,multi
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"service","reason":"expected service names separated by commas, without empty ones"}],"message":"service: expected service names separated by commas, without empty ones"}}

            > alice /v1/endpoints/stream?project=
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"project","reason":"must not be empty"}],"message":"project: must not be empty"}}

            > alice /v1/endpoints/stream?service=s0,s1,s2,s3,s4,s5,s6,s7,s8,s9,s10,s11,s12,s13,s14,s15,s16,s17,s18,s19,s20,s21,s22,s23,s24,s25,s26,s27,s28,s29,s30,s31,s32,s33,s34,s35,s36,s37,s38,s39,s40,s41,s42,s43,s44,s45,s46,s47,s48,s49,s50,s51,s52,s53,s54,s55,s56,s57,s58,s59,s60,s61,s62,s63,s64,s65,s66,s67,s68,s69,s70,s71,s72,s73,s74,s75,s76,s77,s78,s79,s80,s81,s82,s83,s84,s85,s86,s87,s88,s89,s90,s91,s92,s93,s94,s95,s96,s97,s98,s99,s100,s101,s102,s103,s104,s105,s106,s107,s108,s109,s110,s111,s112,s113,s114,s115,s116,s117,s118,s119,s120,s121,s122,s123,s124,s125,s126,s127,s128,s129,s130,s131,s132,s133,s134,s135,s136,s137,s138,s139,s140,s141,s142,s143,s144,s145,s146,s147,s148,s149,s150,s151,s152,s153,s154,s155,s156,s157,s158,s159,s160,s161,s162,s163,s164,s165,s166,s167,s168,s169,s170,s171,s172,s173,s174,s175,s176,s177,s178,s179,s180,s181,s182,s183,s184,s185,s186,s187,s188,s189,s190,s191,s192,s193,s194,s195,s196,s197,s198,s199,s200,s201,s202,s203,s204,s205,s206,s207,s208,s209,s210,s211,s212,s213,s214,s215,s216,s217,s218,s219,s220,s221,s222,s223,s224,s225,s226,s227,s228,s229,s230,s231,s232,s233,s234,s235,s236,s237,s238,s239,s240,s241,s242,s243,s244,s245,s246,s247,s248,s249,s250,s251,s252,s253,s254,s255,s256,s257,s258,s259,s260,s261,s262,s263,s264,s265,s266,s267,s268,s269,s270,s271,s272,s273,s274,s275,s276,s277,s278,s279,s280,s281,s282,s283,s284,s285,s286,s287,s288,s289,s290,s291,s292,s293,s294,s295,s296,s297,s298,s299,s300,s301,s302,s303,s304,s305,s306,s307,s308,s309,s310,s311,s312,s313,s314,s315,s316,s317,s318,s319,s320,s321,s322,s323,s324,s325,s326,s327,s328,s329,s330,s331,s332,s333,s334,s335,s336,s337,s338,s339,s340,s341,s342,s343,s344,s345,s346,s347,s348,s349,s350,s351,s352,s353,s354,s355,s356,s357,s358,s359,s360,s361,s362,s363,s364,s365,s366,s367,s368,s369,s370,s371,s372,s373,s374,s375,s376,s377,s378,s379,s380,s381,s382,s383,s384,s385,s386,s387,s388,s389,s390,s391,s392,s393,s394,s395,s396,s397,s398,s399,s400,s401,s402,s403,s404,s405,s406,s407,s408,s409,s410,s411,s412,s413,s414,s415,s416,s417,s418,s419,s420,s421,s422,s423,s424,s425,s426,s427,s428,s429,s430,s431,s432,s433,s434,s435,s436,s437,s438,s439,s440,s441,s442,s443,s444,s445,s446,s447,s448,s449,s450,s451,s452,s453,s454,s455,s456,s457,s458,s459,s460,s461,s462,s463,s464,s465,s466,s467,s468,s469,s470,s471,s472,s473,s474,s475,s476,s477,s478,s479,s480,s481,s482,s483,s484,s485,s486,s487,s488,s489,s490,s491,s492,s493,s494,s495,s496,s497,s498,s499,s500,s501,s502,s503,s504,s505,s506,s507,s508,s509,s510,s511,s512,s513,s514,s515,s516,s517,s518,s519,s520,s521,s522,s523,s524,s525,s526,s527,s528,s529,s530,s531,s532,s533,s534,s535,s536,s537,s538,s539,s540,s541,s542,s543,s544,s545,s546,s547,s548,s549,s550,s551,s552,s553,s554,s555,s556,s557,s558,s559,s560,s561,s562,s563,s564,s565,s566,s567,s568,s569,s570,s571,s572,s573,s574,s575,s576,s577,s578,s579,s580,s581,s582,s583,s584,s585,s586,s587,s588,s589,s590,s591,s592,s593,s594,s595,s596,s597,s598,s599,s600,s601,s602,s603,s604,s605,s606,s607,s608,s609,s610,s611,s612,s613,s614,s615,s616,s617,s618,s619,s620,s621,s622,s623,s624,s625,s626,s627,s628,s629,s630,s631,s632,s633,s634,s635,s636,s637,s638,s639,s640,s641,s642,s643,s644,s645,s646,s647,s648,s649,s650,s651,s652,s653,s654,s655,s656,s657,s658,s659,s660,s661,s662,s663,s664,s665,s666,s667,s668,s669,s670,s671,s672,s673,s674,s675,s676,s677,s678,s679,s680,s681,s682,s683,s684,s685,s686,s687,s688,s689,s690,s691,s692,s693,s694,s695,s696,s697,s698,s699,s700,s701,s702,s703,s704,s705,s706,s707,s708,s709,s710,s711,s712,s713,s714,s715,s716,s717,s718,s719,s720,s721,s722,s723,s724,s725,s726,s727,s728,s729,s730,s731,s732,s733,s734,s735,s736,s737,s738,s739,s740,s741,s742,s743,s744,s745,s746,s747,s748,s749,s750,s751,s752,s753,s754,s755,s756,s757,s758,s759,s760,s761,s762,s763,s764,s765,s766,s767,s768,s769,s770,s771,s772,s773,s774,s775,s776,s777,s778,s779,s780,s781,s782,s783,s784,s785,s786,s787,s788,s789,s790,s791,s792,s793,s794,s795,s796,s797,s798,s799,s800,s801,s802,s803,s804,s805,s806,s807,s808,s809,s810,s811,s812,s813,s814,s815,s816,s817,s818,s819,s820,s821,s822,s823,s824,s825,s826,s827,s828,s829,s830,s831,s832,s833,s834,s835,s836,s837,s838,s839,s840,s841,s842,s843,s844,s845,s846,s847,s848,s849,s850,s851,s852,s853,s854,s855,s856,s857,s858,s859,s860,s861,s862,s863,s864,s865,s866,s867,s868,s869,s870,s871,s872,s873,s874,s875,s876,s877,s878,s879,s880,s881,s882,s883,s884,s885,s886,s887,s888,s889,s890,s891,s892,s893,s894,s895,s896,s897,s898,s899,s900,s901,s902,s903,s904,s905,s906,s907,s908,s909,s910,s911,s912,s913,s914,s915,s916,s917,s918,s919,s920,s921,s922,s923,s924,s925,s926,s927,s928,s929,s930,s931,s932,s933,s934,s935,s936,s937,s938,s939,s940,s941,s942,s943,s944,s945,s946,s947,s948,s949,s950,s951,s952,s953,s954,s955,s956,s957,s958,s959,s960,s961,s962,s963,s964,s965,s966,s967,s968,s969,s970,s971,s972,s973,s974,s975,s976,s977,s978,s979,s980,s981,s982,s983,s984,s985,s986,s987,s988,s989,s990,s991,s992,s993,s994,s995,s996,s997,s998,s999,s1000
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"service","reason":"at most 1000 names (got 1001); leave it out to follow every service"}],"message":"service: at most 1000 names (got 1001); leave it out to follow every service"}}

            > - /v1/endpoints/stream
            401 content-type=application/json www-authenticate=Bearer
            {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}

            > nobody /v1/endpoints/stream
            401 content-type=application/json www-authenticate=Bearer
            {"error":{"code":"unauthenticated","details":[],"message":"invalid bearer token"}}

        "#]],
    )
    .await;
    // 500 names, unknown and invisible ones among them: accepted; only what the caller may
    // view and named shows, and nothing says which names matched nothing.
    let mut names = five_hundred;
    names.extend(["web".into(), "secret".into()]);
    let mut sub = Sub::new(
        c.get(&format!(
            "alice /v1/endpoints/stream?service={}",
            names.join(",")
        ))
        .await,
    );
    expect![[r#"
        10 team-a/web#10 endpoints=2 meta={}
    "#]]
    .assert_eq(&sub.lines(1).await);
    c.event(ev_job(
        11,
        job("j-6", "secret", "team-b", 0, "exec-02", &[("http", 22001)]),
    ))
    .await;
    c.event(ev_removed(12, "secret", "team-b")).await;
    c.event(ev_removed(13, "web", "team-a")).await;
    expect![[r#"
        13 team-a/web deleted@13
    "#]]
    .assert_eq(&sub.lines(1).await);
}

/// An authenticator whose tokens can be changed while streams are open (the tokens file
/// re-read on SIGHUP).
#[derive(Default)]
struct Tokens(Mutex<BTreeMap<String, Principal>>);

impl Authenticator for Tokens {
    fn authenticate(&self, token: Option<&str>) -> Result<Principal, AuthError> {
        let token = token.ok_or(AuthError::Missing)?;
        self.0
            .lock()
            .unwrap()
            .get(token)
            .cloned()
            .ok_or(AuthError::Invalid)
    }
}

/// RBAC is checked again on every event: a changed grant restarts the stream with what is
/// visible now (deletions of what is no longer visible are not needed: the reset drops
/// everything), and a removed token ends it at the next event.
#[tokio::test]
async fn grants_are_checked_again_on_every_event() {
    let tokens = Arc::new(Tokens::default());
    let eve = |project: &str| user("eve", &[(Permission::JobView, project)]);
    tokens.0.lock().unwrap().insert("eve".into(), eve("team-a"));
    let c = Cluster::with_context(
        ApiContext {
            auth: tokens.clone(),
        },
        snapshot(true),
    )
    .await;
    let mut sub = Sub::new(c.get("eve /v1/endpoints/stream").await);
    let mut out = sub.lines(3).await;
    tokens.0.lock().unwrap().insert("eve".into(), eve("team-b"));
    // team-a's web changes: what eve receives is a reset and team-b's services only.
    c.event(ev_job(11, web_job("j-3", 2, "exec-01", 20419)))
        .await;
    out += &sub.lines(2).await;
    assert_eq!(sub.table, visible(&c, &eve("team-b")));
    c.event(ev_job(
        12,
        job("j-6", "secret", "team-b", 0, "exec-02", &[("http", 22001)]),
    ))
    .await;
    out += &sub.lines(1).await;
    tokens.0.lock().unwrap().clear();
    c.event(ev_removed(13, "secret", "team-b")).await;
    let _ = writeln!(out, "token removed: {:?}", sub.read().await);
    c.watchers_reach(0).await;
    expect![[r#"
        - team-a/multi#8 endpoints=1 meta={}
        - team-a/noports#5 endpoints=0 meta={}
        10 team-a/web#10 endpoints=2 meta={}
        reset
        11 team-b/secret#9 endpoints=1 meta={}
        12 team-b/secret#12 endpoints=1 meta={}
        token removed: None
    "#]]
    .assert_eq(&out);
}

/// A credential the host follows is not authenticated again when the stream wakes (issue
/// 31: authenticate once per stream): its grants are read from the host's channel, and a
/// change there restarts the stream with a reset, as a changed grant does. Before, every
/// wake-up ran the authenticator (here: four calls for three changes).
#[tokio::test]
async fn a_followed_credential_is_authenticated_once_per_stream() {
    use plugin_api::{Credential, LiveGrants};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::watch;

    /// eve's grants on a channel, as the host's keyring publishes them; counts its calls.
    struct Followed(watch::Sender<LiveGrants>, AtomicUsize);
    impl Authenticator for Followed {
        fn authenticate(&self, token: Option<&str>) -> Result<Principal, AuthError> {
            self.1.fetch_add(1, Ordering::SeqCst);
            if token != Some("eve") {
                return Err(AuthError::Invalid);
            }
            let grants = self.0.borrow().as_ref().ok_or(AuthError::Invalid)?.to_vec();
            Ok(Principal {
                credential: Credential::following(self.0.subscribe()),
                grants,
                ..user("eve", &[])
            })
        }
    }
    let view = |project: &str| -> LiveGrants {
        Some(Arc::new(vec![(
            Permission::JobView,
            vec![project.to_owned()],
        )]))
    };
    let tokens = Arc::new(Followed(
        watch::channel(view("team-a")).0,
        AtomicUsize::new(0),
    ));
    let c = Cluster::with_context(
        ApiContext {
            auth: tokens.clone(),
        },
        snapshot(true),
    )
    .await;
    let mut sub = Sub::new(c.get("eve /v1/endpoints/stream").await);
    let mut out = sub.lines(3).await;
    let mut j3 = web_job("j-3", 2, "exec-01", 20419);
    for rev in 11..=13 {
        j3.ready = !j3.ready;
        c.event(ev_job(rev, j3.clone())).await;
        out += &sub.lines(1).await;
    }
    let _ = writeln!(out, "authenticated: {}", tokens.1.load(Ordering::SeqCst));
    // The host re-reads its tokens: eve now sees team-b only.
    tokens.0.send_replace(view("team-b"));
    j3.ready = !j3.ready;
    c.event(ev_job(14, j3)).await;
    out += &sub.lines(2).await;
    assert_eq!(
        sub.table,
        visible(&c, &user("eve", &[(Permission::JobView, "team-b")]))
    );
    let _ = writeln!(out, "authenticated: {}", tokens.1.load(Ordering::SeqCst));
    expect![[r#"
        - team-a/multi#8 endpoints=1 meta={}
        - team-a/noports#5 endpoints=0 meta={}
        10 team-a/web#10 endpoints=2 meta={}
        11 team-a/web#11 endpoints=2 meta={}
        12 team-a/web#12 endpoints=3 meta={}
        13 team-a/web#13 endpoints=2 meta={}
        authenticated: 1
        reset
        14 team-b/secret#9 endpoints=1 meta={}
        authenticated: 1
    "#]]
    .assert_eq(&out);
}

/// An all-services stream costs no task of its own (issue 31: a watchdog task per stream
/// woke on every publish beside the stream itself; five streams were five more tasks on
/// the old code), and one batch of changes to several services wakes it once: its token,
/// which this host does not follow, is authenticated again on every wake, here once for
/// a batch of three services (and once when it opened).
#[tokio::test]
async fn all_services_streams_spawn_no_task_and_wake_once_per_batch() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    /// root, fixed (not followed); counts its calls.
    struct Counting(AtomicUsize);
    impl Authenticator for Counting {
        fn authenticate(&self, token: Option<&str>) -> Result<Principal, AuthError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            match token {
                Some("root") => Ok(user("root", &[(Permission::Admin, "*")])),
                _ => Err(AuthError::Invalid),
            }
        }
    }
    let tokens = Arc::new(Counting(AtomicUsize::new(0)));
    let cx = ApiContext {
        auth: tokens.clone(),
    };
    let c = Cluster::with_context(cx, snapshot(true)).await;
    let runtime = tokio::runtime::Handle::current().metrics();
    let before = runtime.num_alive_tasks();
    let mut streams = Vec::new();
    for _ in 0..5 {
        let mut sub = Sub::new(c.get("root /v1/endpoints/stream").await);
        sub.lines(4).await;
        streams.push(sub);
    }
    assert_eq!(runtime.num_alive_tasks(), before, "tasks per stream");
    let opened = tokens.0.load(Ordering::SeqCst);
    assert_eq!(opened, 5, "one authentication per stream as it opens");
    let batch: Vec<_> = (0..3)
        .map(|i| ev_service(11 + i, service(&format!("new-{i}"), "team-a", &["http"])))
        .collect();
    c.feed.on_events(&batch);
    c.api.flushed().await;
    let mut out = String::new();
    for sub in &mut streams {
        out = sub.lines(3).await;
    }
    let _ = writeln!(
        out,
        "authenticated again: {} for 5 streams",
        tokens.0.load(Ordering::SeqCst) - opened
    );
    expect![[r#"
        11 team-a/new-0#11 endpoints=0 meta={}
        12 team-a/new-1#12 endpoints=0 meta={}
        13 team-a/new-2#13 endpoints=0 meta={}
        authenticated again: 5 for 5 streams
    "#]]
    .assert_eq(&out);
}

/// A client more than `all_stream_buffer` changes behind is cut off (counted with
/// `kind="all_services"`), even if it never reads; one that reads stays.
#[tokio::test]
async fn slow_reader_is_cut_off() {
    let c = Cluster::new(small(|c| c.all_stream_buffer = 3)).await;
    let mut silent = Sub::new(c.get("alice /v1/endpoints/stream").await);
    silent.lines(3).await;
    let mut reader = Sub::new(c.get("root /v1/endpoints/stream").await);
    reader.lines(4).await;
    let mut j3 = web_job("j-3", 2, "exec-01", 20419);
    for rev in 11..=14 {
        j3.ready = !j3.ready;
        c.event(ev_job(rev, j3.clone())).await;
        reader.read().await.unwrap();
    }
    // Four changes behind, never polled: cut off all the same.
    c.watchers_reach(1).await;
    let metrics = c.metrics();
    assert!(
        metrics.contains("xce_endpoint_streams_lagged_total{kind=\"all_services\"} 1\n")
            && metrics.contains("xce_endpoint_watchers{kind=\"all_services\"} 1\n"),
        "{metrics}"
    );
    // The silent client reads at last: the end.
    assert_eq!(silent.read().await, None);
    // It resumes with its last id, still within what the apiserver remembers: the newest
    // web, no reset.
    let id = silent.last_id.unwrap();
    let mut again = Sub::new(
        c.get(&format!("alice /v1/endpoints/stream | last-event-id: {id}"))
            .await,
    );
    again.table = silent.table.clone();
    expect![[r#"
        14 team-a/web#14 endpoints=3 meta={}
    "#]]
    .assert_eq(&again.lines(1).await);
    assert_eq!(
        again.table,
        visible(&c, &user("alice", &[(Permission::JobView, "team-a")]))
    );
}

// === property: what a subscriber receives rebuilds exactly what it may view ===

/// One random step of the cluster.
#[derive(Debug, Clone)]
enum Op {
    /// Create or change service `s` of project `p` (meta label value `m`).
    Service {
        p: usize,
        s: usize,
        m: u8,
    },
    /// Place (or change) replica `r` of a service, ready or not, on host `h`.
    Job {
        p: usize,
        s: usize,
        r: u32,
        h: usize,
        ready: bool,
    },
    /// End replica `r` of a service.
    End {
        p: usize,
        s: usize,
        r: u32,
    },
    Remove {
        p: usize,
        s: usize,
    },
    /// Host `h` changes its address.
    Host {
        h: usize,
        ip: u8,
    },
    /// Subscriber `i` disconnects (whatever it has not read is lost) and resumes with its
    /// last event id `after` steps later.
    Resume {
        i: usize,
        after: usize,
    },
}

const PROJECTS: [&str; 3] = ["team-a", "team-b", "team-c"];
const SERVICES: [&str; 3] = ["web", "api", "db"];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 0..3usize, 0..3u8).prop_map(|(p, s, m)| Op::Service { p, s, m }),
        (0..3usize, 0..3usize, 0..3u32, 0..2usize, any::<bool>())
            .prop_map(|(p, s, r, h, ready)| Op::Job { p, s, r, h, ready }),
        (0..3usize, 0..3usize, 0..3u32).prop_map(|(p, s, r)| Op::End { p, s, r }),
        (0..3usize, 0..3usize).prop_map(|(p, s)| Op::Remove { p, s }),
        (0..2usize, 1..4u8).prop_map(|(h, ip)| Op::Host { h, ip }),
        (0..3usize, 0..4usize).prop_map(|(i, after)| Op::Resume { i, after }),
    ]
}

fn job_id(p: usize, s: usize, r: u32) -> String {
    format!("j-{p}-{s}-{r}")
}

async fn run(ops: Vec<Op>, grants: Vec<Vec<bool>>) {
    let principals: Vec<Principal> = grants
        .iter()
        .enumerate()
        .map(|(i, g)| Principal {
            credential: Default::default(),
            name: format!("u{i}"),
            kind: PrincipalKind::User,
            grants: PROJECTS
                .iter()
                .zip(g)
                .filter(|(_, yes)| **yes)
                .map(|(p, _)| (Permission::JobView, vec![(*p).to_owned()]))
                .collect(),
        })
        .collect();
    let (feed, api) = endpoint_table(TableConfig::default());
    let tokens = principals
        .iter()
        .map(|p| (p.name.clone(), p.clone()))
        .collect();
    let router = api.router(ApiContext::for_test(tokens));
    let c = Cluster { feed, api, router };
    c.resync(ClusterSnapshot {
        rev: 1,
        services: vec![],
        jobs: vec![],
        hosts: vec![host("h0", Some("127.0.0.1")), host("h1", Some("127.0.0.2"))],
    })
    .await;
    let mut subs = Vec::new();
    for p in &principals {
        subs.push(Sub::new(
            c.get(&format!("{} /v1/endpoints/stream", p.name)).await,
        ));
    }
    let mut services: BTreeMap<(usize, usize), ServiceInfo> = BTreeMap::new();
    let mut jobs: BTreeMap<String, JobInfo> = BTreeMap::new();
    let mut rev = 1;
    // Per subscriber: disconnected, reconnecting after that many more steps.
    let mut away: Vec<Option<usize>> = vec![None; subs.len()];
    for op in ops {
        rev += 1;
        let event = match op {
            Op::Service { p, s, m } => {
                let mut svc = service(SERVICES[s], PROJECTS[p], &["http"]);
                svc.profile["meta"] = serde_json::json!({"v": m.to_string()});
                services.insert((p, s), svc.clone());
                Some(ev_service(rev, svc))
            }
            Op::Job { p, s, r, h, ready } if services.contains_key(&(p, s)) => {
                let mut j = job(
                    &job_id(p, s, r),
                    SERVICES[s],
                    PROJECTS[p],
                    r,
                    &format!("h{h}"),
                    &[("http", 20000 + r as u16)],
                );
                j.ready = ready;
                jobs.insert(j.job.clone(), j.clone());
                Some(ev_job(rev, j))
            }
            Op::End { p, s, r } => jobs.remove(&job_id(p, s, r)).map(|j| ev_ended(rev, j)),
            Op::Remove { p, s } => {
                let gone = services.remove(&(p, s)).is_some();
                let prefix = format!("j-{p}-{s}-");
                jobs.retain(|id, _| !id.starts_with(&prefix));
                gone.then(|| ev_removed(rev, SERVICES[s], PROJECTS[p]))
            }
            Op::Host { h, ip } => Some(ev_host(
                rev,
                host(&format!("h{h}"), Some(&format!("127.0.1.{ip}"))),
                &[],
            )),
            Op::Resume { i, after } => {
                let i = i % subs.len();
                if away[i].is_none() {
                    // The connection is gone: events not read yet are lost with it.
                    // (A fresh stream stands in for the dead one; it is never read.)
                    let dead = c
                        .get(&format!("{} /v1/endpoints/stream", principals[i].name))
                        .await;
                    subs[i].events = Events::new(dead);
                    away[i] = Some(after);
                }
                None
            }
            Op::Job { .. } => None,
        };
        if let Some(event) = event {
            c.event(event).await;
        }
        for (i, (sub, p)) in subs.iter_mut().zip(&principals).enumerate() {
            match away[i] {
                Some(0) => {
                    // Back: resumes from the last id it got.
                    away[i] = None;
                    let header = sub
                        .last_id
                        .map_or(String::new(), |id| format!(" | last-event-id: {id}"));
                    let resp = c
                        .get(&format!("{} /v1/endpoints/stream{header}", p.name))
                        .await;
                    sub.events = Events::new(resp);
                }
                Some(n) => {
                    away[i] = Some(n - 1);
                    continue;
                }
                None => {}
            }
            sub.until(&visible(&c, p)).await;
            for (project, _) in sub.table.keys() {
                assert!(
                    p.may(Permission::JobView, project),
                    "{} saw {project}",
                    p.name
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn subscribers_rebuild_exactly_what_they_may_view(
        ops in proptest::collection::vec(op(), 1..40),
        grants in proptest::collection::vec(proptest::collection::vec(any::<bool>(), 3), 1..4),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run(ops, grants));
    }
}

/// `xce_endpoint_delivery_seconds{kind="all_services"}`: a change an all-services stream
/// was sent is observed once; one it may not view (team-b's) is settled as not sent and not
/// observed. Events are produced only when read, which orders the steps; no timing is
/// asserted.
#[tokio::test]
async fn deliveries_are_observed_under_their_kind() {
    let c = Cluster::new(TableConfig::default()).await;
    let mut alice = Sub::new(c.get("alice /v1/endpoints/stream").await);
    alice.lines(3).await;
    let observed = |c: &Cluster| {
        c.metrics()
            .lines()
            .filter(|l| l.starts_with("xce_endpoint_delivery_seconds_count"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut out = format!("after the snapshot:\n{}\n", observed(&c));
    c.event(ev_job(11, web_job("j-3", 2, "exec-01", 20419)))
        .await;
    alice.lines(1).await;
    c.event(ev_job(
        12,
        job("j-6", "secret", "team-b", 0, "exec-02", &[("http", 22001)]),
    ))
    .await;
    c.event(ev_removed(14, "noports", "team-a")).await;
    alice.lines(1).await;
    let _ = writeln!(
        out,
        "after 11 (sent), 12 (invisible), 14 (sent):\n{}",
        observed(&c)
    );
    expect![[r#"
        after the snapshot:
        xce_endpoint_delivery_seconds_count{kind="all_services"} 0
        xce_endpoint_delivery_seconds_count{kind="blocking"} 0
        xce_endpoint_delivery_seconds_count{kind="stream"} 0
        after 11 (sent), 12 (invisible), 14 (sent):
        xce_endpoint_delivery_seconds_count{kind="all_services"} 2
        xce_endpoint_delivery_seconds_count{kind="blocking"} 0
        xce_endpoint_delivery_seconds_count{kind="stream"} 0
    "#]]
    .assert_eq(&out);
}
