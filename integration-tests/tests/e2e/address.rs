//! Host addresses end to end: a worker restarted with a new advertise address updates the
//! host API and the endpoints of its replicas at once; new replicas see the new address;
//! a worker cannot report for another host.

use crate::harness::*;
use std::net::Ipv4Addr;

fn web(name: &str, envfile: &std::path::Path) -> String {
    http_service(name, 1)
        .interval("500ms")
        .before(&format!("echo $XCE_HOST_IP > {}", envfile.display()))
        .toml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_restarted_with_a_new_address_rewrites_hosts_and_endpoints() {
    let mut c = Cluster::new(2, "30s").expect("cluster");
    let old_ip = c.host_ip(0);
    let o = c.first_ip.octets();
    let new_ip = Ipv4Addr::new(o[0], o[1], o[2], o[3] + 100).to_string();

    eventually("both hosts ready", || async {
        let hosts = c.api.get_json("/v1/hosts").await?;
        let ready = hosts["hosts"]
            .as_array()
            .map_or(0, |h| h.iter().filter(|h| h["state"] == "ready").count());
        Ok((ready == 2).then_some(()))
    })
    .await;

    // A forged report: exec-01's credential reporting facts for exec-02 is refused.
    let forged = c
        .api
        .http
        .put(format!("{}/internal/v1/hosts/exec-02/facts", c.api.base))
        .bearer_auth("worker-0-example-secret")
        .json(&serde_json::json!({"ip_addr": "127.0.0.99", "addresses": [{"ip": "127.0.0.99"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        forged.status().as_u16(),
        403,
        "a worker may report only for its own host"
    );
    let hosts = c.api.get_json("/v1/hosts").await.unwrap();
    assert_eq!(
        hosts["hosts"][1]["ip_addr"],
        c.host_ip(1),
        "exec-02 keeps its address"
    );

    // Pin the first replica to exec-01: exec-02 does not exist yet for the scheduler.
    c.kill_worker(1);
    eventually("exec-02 unreachable", || async {
        let hosts = c.api.get_json("/v1/hosts").await?;
        Ok((hosts["hosts"][1]["state"] != "ready").then_some(()))
    })
    .await;
    let before_env = c.dir.path().join("before.env");
    assert_eq!(
        c.api
            .submit_toml(&web("pinned", &before_env))
            .await
            .unwrap()
            .0,
        201
    );
    let eps = c.api.wait_ready("pinned", 1).await;
    assert!(eps[0].starts_with(&format!("{old_ip}:")), "{eps:?}");
    let port = eps[0].rsplit_once(':').unwrap().1.to_owned();
    let (_, h, _) = c.api.get("/v1/services/pinned/endpoints").await.unwrap();
    let index: u64 = h["x-xce-index"].to_str().unwrap().parse().unwrap();

    // Restart exec-01 with another advertise address (its replica keeps running).
    c.kill_worker(0);
    let cfg = c.dir.path().join("worker-0.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace(
            &format!("advertise = \"{old_ip}\""),
            &format!("advertise = \"{new_ip}\""),
        ),
    )
    .unwrap();
    let waiter = {
        let api = c.api.clone();
        tokio::spawn(async move {
            api.get(&format!(
                "/v1/services/pinned/endpoints?format=plain&index={index}&wait=15s"
            ))
            .await
        })
    };
    c.start_worker(0).unwrap();

    // The blocking query wakes with the rewritten endpoint: same job, same port, new address.
    let (status, _, body) = waiter.await.unwrap().unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        body.trim(),
        format!("{new_ip}:{port}"),
        "endpoint rewritten at once"
    );
    let hosts = c.api.get_json("/v1/hosts").await.unwrap();
    assert_eq!(hosts["hosts"][0]["ip_addr"], new_ip.as_str());
    assert!(
        hosts["hosts"][0]["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["ip"] == new_ip.as_str()),
        "{hosts}"
    );

    // A replica started now sees the new address in XCE_HOST_IP.
    let after_env = c.dir.path().join("after.env");
    assert_eq!(
        c.api
            .submit_toml(&web("fresh", &after_env))
            .await
            .unwrap()
            .0,
        201
    );
    let eps = c.api.wait_ready("fresh", 1).await;
    assert!(eps[0].starts_with(&format!("{new_ip}:")), "{eps:?}");
    assert_eq!(std::fs::read_to_string(&after_env).unwrap().trim(), new_ip);
    assert!(http_ok(&eps[0]).await.unwrap());
    println!(
        "FIGURE address change: endpoints rewritten on re-registration, forged reports refused=1/1"
    );
}
