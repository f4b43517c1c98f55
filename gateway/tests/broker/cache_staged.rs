//! A cache change is staged under its shard's lock and written outside it (so concurrent
//! puts share the log's writes): what that must not let anyone see. A step of
//! `broker::cache::cache_on_a_three_broker_cluster`.

use std::time::Duration;

use bytes::Bytes;
use felix_client::{CacheConfig, ChangeKind, Client, ClientError, WatchTarget, codes};

use super::cluster::{Cluster, set_isolated};
use super::common::{PATIENCE, shard_leader};
use super::leases::{await_lease, set_writes_stalled};

const T: &str = "kv";
const NS: &str = "ns";
/// Its backing stream (`__cache.<name>`) is the stream the control plane places.
const CACHE: &str = "staged";

/// Long enough for a request on loopback to have been answered, had it been answerable.
const SETTLE: Duration = Duration::from_millis(400);

/// While the owner's log writes are held, a put is not acknowledged, a read of its key does
/// not answer, and a watch does not hear it; once they go on, all three see the new value.
/// A put whose write the log then refuses (the owner's lease lapsed while it was held) is
/// refused and forgotten: the owner's state is rebuilt from the log, so a later read sees
/// the value before it.
pub(super) async fn a_staged_put_is_seen_by_nobody_until_written_and_a_lost_one_is_forgotten(
    cluster: &mut Cluster,
    client: &Client,
) {
    client
        .create_cache(
            T,
            NS,
            CACHE,
            CacheConfig {
                durable: Some(true),
                shards: Some(1),
                replicas: Some(3),
                ..Default::default()
            },
        )
        .await
        .expect("a Leader log-backed cache");
    client
        .cache_put(T, NS, CACHE, "k", Bytes::from("v1"), None)
        .await
        .expect("put v1");
    let owner = shard_leader(client, (T, NS, "__cache.staged"), None).await;
    // Straight to the owner, without retries: each answer is the owner's own.
    let direct = cluster.node(owner).client().await;
    let mut watch = direct
        .watch_cache(T, NS, CACHE, WatchTarget::Key("k".into()))
        .await
        .expect("a watch at the owner");

    set_writes_stalled(cluster.node(owner), true).await;
    let put = tokio::spawn({
        let c = direct.clone();
        async move {
            c.cache_put(T, NS, CACHE, "k", Bytes::from("v2"), None)
                .await
        }
    });
    tokio::time::sleep(SETTLE).await;
    let get = tokio::spawn({
        let c = direct.clone();
        async move { c.cache_get(T, NS, CACHE, "k").await }
    });
    // Other keys of the shard are staged behind it rather than waiting for its write.
    let others: Vec<_> = (0..8)
        .map(|i| {
            let c = direct.clone();
            tokio::spawn(async move {
                c.cache_put(T, NS, CACHE, format!("other-{i}"), Bytes::from("x"), None)
                    .await
            })
        })
        .collect();
    let heard = tokio::time::timeout(SETTLE, watch.next_change()).await;
    assert!(
        heard.is_err(),
        "a watch heard a change whose write is held: {heard:?}"
    );
    assert!(!put.is_finished(), "a put was answered before its write");
    assert!(
        !get.is_finished(),
        "a read answered from a put whose write is held: {:?}",
        get.await
    );
    set_writes_stalled(cluster.node(owner), false).await;
    put.await.expect("put task").expect("put v2 once written");
    assert_eq!(
        get.await.expect("get task").expect("get"),
        Some(Bytes::from("v2")),
        "the read waited for the write it saw"
    );
    for o in others {
        o.await
            .expect("put task")
            .expect("a put staged behind another");
    }
    let change = tokio::time::timeout(PATIENCE, watch.next_change())
        .await
        .expect("the watch hears the written put")
        .expect("watch")
        .expect("a change");
    assert_eq!(
        (change.kind, change.value),
        (ChangeKind::Put, Bytes::from("v2"))
    );

    // A write held past the owner's lease: the log refuses it when it goes on.
    set_writes_stalled(cluster.node(owner), true).await;
    let lost = tokio::spawn({
        let c = direct.clone();
        async move {
            c.cache_put(T, NS, CACHE, "k", Bytes::from("v3"), None)
                .await
        }
    });
    set_isolated(cluster.node(owner), true).await;
    await_lease(cluster.node(owner), false, Duration::from_millis(1)).await;
    set_writes_stalled(cluster.node(owner), false).await;
    let refused = lost
        .await
        .expect("put task")
        .expect_err("a put whose write the log refused was acknowledged");
    match &refused {
        ClientError::Broker(b) => assert_eq!(b.code, codes::SHARD_UNAVAILABLE, "{b:?}"),
        other => panic!("expected the owner's refusal, got {other}"),
    }
    set_isolated(cluster.node(owner), false).await;
    // Once it leads again, the owner answers from its log: v2, never the refused v3.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let value = loop {
        match direct.cache_get(T, NS, CACHE, "k").await {
            Ok(v) => break v,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the owner never answered again: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(value, Some(Bytes::from("v2")), "a refused write was read");
    // The cut owner may have led the control plane too: while it was cut off it saw the
    // others' leases lapse. Settle before the next step places a new cache's replicas.
    // All alive for longer than a lease, so no lapse seen during the cut is still to come.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut alive_since = None;
    loop {
        let brokers = client.list_brokers().await.unwrap_or_default();
        if brokers.len() == cluster.brokers.len() && brokers.iter().all(|b| b.alive) {
            let since = *alive_since.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() > Duration::from_secs(2) {
                break;
            }
        } else {
            alive_since = None;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the brokers were not all alive again after the heal: {brokers:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    client
        .cache_put(T, NS, CACHE, "k", Bytes::from("v4"), None)
        .await
        .expect("a put after the rebuild");
    assert_eq!(
        client.cache_get(T, NS, CACHE, "k").await.expect("get"),
        Some(Bytes::from("v4"))
    );
}
