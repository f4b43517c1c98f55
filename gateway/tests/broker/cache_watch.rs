//! A prefix watch of a cache whose shards several brokers own: one watch per shard, each at
//! its owner. A step of `broker::cache::cache_on_a_three_broker_cluster`.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use felix_client::{Client, ClientError, WatchTarget};

use super::cluster::Cluster;
use super::common::PATIENCE;

const T: &str = "kv";
const NS: &str = "ns";

/// `cache` has `shards` shards whose owners are not all one broker: a `Client` prefix watch
/// hears a put to every shard, and the single whole-cache watch at one broker is refused
/// with `prefix_watch_across_brokers` rather than silently covering its own shards only.
pub(super) async fn a_prefix_watch_hears_every_shard_of_a_cache_several_brokers_own(
    cluster: &mut Cluster,
    client: &Client,
    cache: &str,
    shards: u32,
) {
    let stream = format!("__cache.{cache}");
    let mut owners = BTreeSet::new();
    for shard in 0..shards {
        owners.insert(shard_leader_of(client, &stream, shard).await);
    }
    assert!(
        owners.len() > 1,
        "the {shards} shards of {cache} are all led by one broker: {owners:?}"
    );
    let one = *owners.first().expect("an owner");
    let refused = cluster
        .node(one)
        .client()
        .await
        .watch_cache(T, NS, cache, WatchTarget::Prefix("user:".into()))
        .await
        .expect_err("a whole-cache prefix watch at a broker owning only some shards");
    match &refused {
        ClientError::Broker(b) => assert_eq!(b.reason, "prefix_watch_across_brokers", "{b:?}"),
        other => panic!("expected the broker's refusal, got {other}"),
    }

    let mut watch = client
        .watch_cache(T, NS, cache, WatchTarget::Prefix("user:".into()))
        .await
        .expect("a prefix watch across brokers");
    let keys: BTreeSet<String> = (0..30).map(|i| format!("user:{i}")).collect();
    for k in &keys {
        client
            .cache_put(T, NS, cache, k, Bytes::from("x"), None)
            .await
            .expect("put");
    }
    client
        .cache_put(T, NS, cache, "other:1", Bytes::from("x"), None)
        .await
        .expect("put");
    let mut heard = BTreeSet::new();
    while heard.len() < keys.len() {
        let change = tokio::time::timeout(PATIENCE, watch.next_change())
            .await
            .unwrap_or_else(|_| panic!("heard only {heard:?} of {keys:?}"))
            .expect("a change");
        assert!(
            change.key.starts_with("user:"),
            "outside the prefix: {change:?}"
        );
        assert!(heard.insert(change.key.clone()), "heard twice: {change:?}");
    }
    assert_eq!(heard, keys);
    let extra = tokio::time::timeout(Duration::from_millis(300), watch.next_change()).await;
    assert!(extra.is_err(), "a change heard beyond the puts: {extra:?}");
}

async fn shard_leader_of(client: &Client, stream: &str, shard: u32) -> u64 {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Ok(t) = client.topology(T, NS, stream).await
            && let Some((id, _)) = t.leader(shard)
        {
            return id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no leader for shard {shard} of {stream}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
