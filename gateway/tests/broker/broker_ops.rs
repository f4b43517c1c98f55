//! Operating a cluster's brokers (docs/shard-moves.md, docs/operations.md "Scaling out (and
//! in)"): the broker list's zones and hot bytes, and removing a broker for good. A step of
//! `broker::moves::shard_moves_and_drains_hold_publishes_and_lose_nothing`, on its brokers.

use std::time::Duration;

use serde_json::Value;

use super::cluster::Cluster;
use super::common::PATIENCE;
use super::felixctl::{run, run_status_in};

/// The zone every broker of the moves test is started in (`FELIX_ZONE`).
pub(super) const ZONE: &str = "az-1";

async fn broker_list(cluster: &Cluster, via: usize) -> Vec<Value> {
    let out = run(
        &cluster.brokers[via],
        &["broker", "list", "--output", "json"],
        b"",
    )
    .await;
    serde_json::from_str(&out.stdout).expect("broker list json")
}

/// Broker `gone` is drained, refused removal while alive, stopped, removed: the list and
/// the control plane's members no longer name it, and the others keep working.
pub(super) async fn a_drained_and_stopped_broker_is_removed(cluster: &mut Cluster, gone: u64) {
    // The list: every broker's zone, and each live broker's hot bytes as it reports them.
    let brokers = broker_list(cluster, 0).await;
    assert_eq!(brokers.len(), cluster.brokers.len(), "{brokers:?}");
    for b in &brokers {
        assert_eq!(b["zone"], ZONE, "registered with its zone: {b}");
        if b["alive"] == true {
            assert!(
                b["hot_bytes"].is_u64(),
                "a live broker reports hot bytes: {b}"
            );
        }
    }
    let total: u64 = brokers.iter().filter_map(|b| b["hot_bytes"].as_u64()).sum();
    assert!(
        total > 0,
        "the streams' logs take bytes somewhere: {brokers:?}"
    );

    let via = if gone == 1 { 1 } else { 0 };
    let id = gone.to_string();
    let cwd = std::env::temp_dir();
    // Alive: refused, and nothing changes.
    let (ok, stderr) =
        run_status_in(&cluster.brokers[via], &cwd, &["broker", "remove", &id], b"").await;
    assert!(!ok, "removing a live broker is refused");
    assert!(stderr.contains("is alive"), "{stderr}");
    run(&cluster.brokers[via], &["broker", "drain", &id], b"").await;
    let deadline = tokio::time::Instant::now() + 2 * PATIENCE;
    loop {
        let brokers = broker_list(cluster, via).await;
        let b = brokers
            .iter()
            .find(|b| b["id"] == gone)
            .expect("still listed");
        if b["replicas"] == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker {gone} still holds replicas: {b}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.node(gone).kill();
    // Removed once the control plane has seen it dead (its lease lapses first).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (ok, stderr) =
            run_status_in(&cluster.brokers[via], &cwd, &["broker", "remove", &id], b"").await;
        if ok {
            break;
        }
        assert!(
            stderr.contains("is alive") && tokio::time::Instant::now() < deadline,
            "broker remove {gone}: {stderr}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let brokers = broker_list(cluster, via).await;
    assert!(
        brokers.iter().all(|b| b["id"] != gone),
        "broker {gone} is gone from the list: {brokers:?}"
    );
    // Members are [id, address] pairs.
    let status = meta_status(cluster, via).await;
    let members = status["members"].as_array().cloned().unwrap_or_default();
    assert!(!members.is_empty(), "{status}");
    assert!(
        members.iter().all(|m| m[0] != gone),
        "broker {gone} is no longer a control-plane member: {members:?}"
    );
    // Asking again names what is missing.
    let (ok, stderr) =
        run_status_in(&cluster.brokers[via], &cwd, &["broker", "remove", &id], b"").await;
    assert!(!ok && stderr.contains("no broker"), "{stderr}");
}

/// `GET /meta/status` of broker `via`'s control plane.
async fn meta_status(cluster: &Cluster, via: usize) -> Value {
    let addr = cluster.brokers[via].internal_addr();
    let (code, body) = super::common::http_get(addr, "/meta/status")
        .await
        .expect("meta status");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status json")
}
