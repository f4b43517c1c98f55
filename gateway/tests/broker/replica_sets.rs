//! Keeping replica sets whole (docs/shard-moves.md): a shard placed while brokers were down
//! is topped up to its stream's replica count once they are back. A step of the moves
//! test, on its brokers.

use std::time::Duration;

use felix_client::{Message, StreamConfig};

use super::cluster::{Cluster, local_next_offset};
use super::common::PATIENCE;

/// A Quorum stream asking for as many replicas as there are brokers is created while one
/// broker is down, so its shard is placed on the others (one short); once that broker is
/// back, the controller adds a replica there (`AddReplica`), which catches up, and a record
/// published afterwards is held by every one of them.
pub(super) async fn a_shard_placed_short_is_topped_up(cluster: &mut Cluster) {
    let live: Vec<u64> = (0..cluster.brokers.len())
        .filter(|i| cluster.brokers[*i].is_running())
        .map(|i| i as u64 + 1)
        .collect();
    let down = *live.last().expect("a live broker");
    cluster.node(down).kill();
    // Recorded dead once its lease lapses.
    let via = live[0];
    let conn = cluster.node(via).client().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let brokers = conn.list_brokers().await.expect("list brokers");
        if brokers.iter().any(|b| b.id == down && !b.alive) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker {down} was not marked dead: {brokers:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Connected only now: a client connected before the kill may prefer `down`, and its
    // connection there looks open until QUIC's idle timeout, so an admin request sent on it
    // would be lost with the connection (an unknown outcome) instead of going elsewhere.
    let client = cluster.client(Duration::from_secs(30)).await;
    let stream = "topped-up";
    let want = live.len();
    let config = StreamConfig {
        durable: Some(true),
        shards: Some(1),
        replicas: Some(want as u32),
        consistency: Some("quorum".into()),
        ..StreamConfig::default()
    };
    client
        .create_stream("t", "ns", stream, config)
        .await
        .expect("create a stream while a broker is down");
    let placed = client.topology("t", "ns", stream).await.expect("topology");
    let placed = placed.shard(0).expect("shard 0").replicas.clone();
    assert_eq!(
        placed.len(),
        want - 1,
        "placed on the live brokers only: {placed:?}"
    );
    let first = client
        .publish_to_shard("t", "ns", stream, 0, &[Message::new("before")])
        .await
        .expect("a publish while one short");

    cluster.node(down).restart().await;
    let deadline = tokio::time::Instant::now() + 2 * PATIENCE;
    loop {
        let t = client.topology("t", "ns", stream).await.expect("topology");
        let r = t.shard(0).expect("shard 0").replicas.clone();
        let settled = conn.list_moves().await.is_ok_and(|m| m.is_empty());
        if r.len() == want && settled {
            assert!(r.contains(&down), "topped up on broker {down}: {r:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the shard was not topped up to {want} replicas: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let last = client
        .publish_to_shard("t", "ns", stream, 0, &[Message::new("after")])
        .await
        .expect("a publish once topped up");
    assert_eq!(last.base_offset, first.base_offset + 1);
    for b in &live {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while local_next_offset(&cluster.brokers[*b as usize - 1], stream).await <= last.base_offset
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "broker {b} does not hold offset {}",
                last.base_offset
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
