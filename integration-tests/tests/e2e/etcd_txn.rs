//! The controller's `etcd_max_txn_ops`: an etcd cluster run with a lower `--max-txn-ops`
//! than its default refuses the controller's transactions unless the controller is told
//! the same limit; told, it cuts its changes to fit and places a service of more
//! replicas than one transaction holds.

use crate::daemons::*;
use crate::harness::*;

/// etcd's limit here: a placement of 12 replicas (a job record each, plus the service's
/// record, `meta/rev` and the fence) cannot be one transaction.
const ETCD_LIMIT: usize = 8;
const REPLICAS: usize = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_told_etcds_lower_txn_limit_places_in_transactions_within_it() {
    let limit = format!("--max-txn-ops={ETCD_LIMIT}");
    let etcd = EtcdCluster::start_with(1, &[&limit]).await.expect("etcd");
    let mut fleet = Fleet::new(etcd, 2, 0).expect("cluster dir");
    let config = fleet.dir.path().join("controller-0.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    // Top-level keys before the first table.
    text = text.replacen(
        "\n[address]",
        &format!("etcd_max_txn_ops = {ETCD_LIMIT}\n\n[address]"),
        1,
    );
    std::fs::write(&config, text).unwrap();
    fleet.start_leader(0).await;
    let log = fleet.log("controller-0");
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        said.contains(&format!("max_txn_ops={ETCD_LIMIT}")),
        "the controller logs the limit it uses: {said}"
    );
    fleet.start_workers(2).unwrap();
    let api = fleet.controller_api(0);
    wait_for_hosts_of(&api, 2).unwrap();
    let web = http_service("web", REPLICAS as u32)
        .interval("500ms")
        .toml();
    assert_eq!(api.submit_toml(&web).await.unwrap().0, 201);
    let eps = api.wait_ready("web", REPLICAS).await;
    assert_eq!(eps.len(), REPLICAS);
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !said.contains("too many operations"),
        "no transaction above etcd's limit: {said}"
    );
}

/// Store format 3 on real processes: a controller told `store_format = 3` (and etcd's
/// small transaction limit, so that placements go through the journal too) moves the
/// store to format 3, and an apiserver that follows the store through its job events,
/// which now refer to the job records of their revision, serves every replica the
/// controller serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiserver_follows_a_store_in_format_3() {
    let limit = format!("--max-txn-ops={ETCD_LIMIT}");
    let etcd = EtcdCluster::start_with(1, &[&limit]).await.expect("etcd");
    let mut fleet = Fleet::new(etcd, 2, 1).expect("cluster dir");
    let config = fleet.dir.path().join("controller-0.toml");
    let text = std::fs::read_to_string(&config).unwrap().replacen(
        "\n[address]",
        &format!("etcd_max_txn_ops = {ETCD_LIMIT}\nstore_format = 3\n\n[address]"),
        1,
    );
    std::fs::write(&config, text).unwrap();
    fleet.start_leader(0).await;
    fleet.start_apiserver(0).unwrap();
    fleet.start_workers(2).unwrap();
    let api = fleet.controller_api(0);
    wait_for_hosts_of(&api, 2).unwrap();
    let web = http_service("web", REPLICAS as u32)
        .interval("500ms")
        .toml();
    assert_eq!(api.submit_toml(&web).await.unwrap().0, 201);
    let mut leader = api.wait_ready("web", REPLICAS).await;
    let mut follower = fleet.apiserver(0).wait_ready("web", REPLICAS).await;
    leader.sort();
    follower.sort();
    assert_eq!(follower, leader);
    let said = std::fs::read_to_string(fleet.log("controller-0")).unwrap_or_default();
    assert!(
        said.contains("stored records migrated to the format store_format asks for"),
        "the controller moved the store to format 3: {said}"
    );
    let followed = std::fs::read_to_string(fleet.log("apiserver-0")).unwrap_or_default();
    assert!(
        !followed.contains("does not understand") && !followed.contains("reloading"),
        "the apiserver read every batch as it came: {followed}"
    );
}
