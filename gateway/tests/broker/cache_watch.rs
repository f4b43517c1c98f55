//! A prefix watch of a cache whose shards several brokers own: one watch per shard, each at
//! its owner. A step of `broker::cache::cache_on_a_three_broker_cluster`.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use felix_client::{
    CacheConfig, ChangeKind, Client, ClientError, Connection, WatchResume, WatchTarget, codes,
};

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

/// A watch reopened after the change it heard last hears every change made while it was
/// closed, then the live ones, each once and in order; a resume the owner's log cannot
/// honour ends the watch with `watch_diverged`, and an in-memory cache refuses to resume.
/// A step of `broker::cache::cache_on_one_broker`.
pub(super) async fn a_resumed_watch_hears_every_change_made_while_it_was_closed(
    conn: &Connection,
    client: &Client,
) {
    let cache = "resumable";
    client
        .create_cache(
            T,
            NS,
            cache,
            CacheConfig {
                durable: Some(true),
                ..Default::default()
            },
        )
        .await
        .expect("a log-backed cache");
    let scope = (T, NS, cache);
    let key = || WatchTarget::Key("a".into());
    let mut watch = conn.watch_cache(T, NS, cache, key()).await.expect("watch");
    client
        .cache_put(T, NS, cache, "a", Bytes::from("1"), None)
        .await
        .expect("put");
    let first = next(&mut watch).await;
    assert_eq!(first.value, Bytes::from("1"));
    let resume = first
        .resume_after()
        .expect("a log-backed change has an offset");
    drop(watch);

    // Made while no watch is open: two changes of the key, one of another key, a delete.
    for (k, v) in [("a", "2"), ("b", "9"), ("a", "3")] {
        client
            .cache_put(T, NS, cache, k, Bytes::from(v), None)
            .await
            .expect("put");
    }
    client
        .cache_delete(T, NS, cache, "a")
        .await
        .expect("delete");
    let mut resumed = conn
        .resume_watch(scope, key(), None, resume)
        .await
        .expect("resume");
    client
        .cache_put(T, NS, cache, "a", Bytes::from("4"), None)
        .await
        .expect("put after the resume");
    let mut heard = Vec::new();
    for _ in 0..4 {
        let c = next(&mut resumed).await;
        assert_eq!(c.key, "a", "{c:?}");
        heard.push((c.kind, c.value, c.offset.expect("an offset")));
    }
    let kinds: Vec<_> = heard.iter().map(|(k, v, _)| (*k, v.clone())).collect();
    assert_eq!(
        kinds,
        vec![
            (ChangeKind::Put, Bytes::from("2")),
            (ChangeKind::Put, Bytes::from("3")),
            (ChangeKind::Delete, Bytes::new()),
            (ChangeKind::Put, Bytes::from("4")),
        ],
        "the changes made while closed, then the live one, once each"
    );
    assert!(
        heard.windows(2).all(|w| w[0].2 < w[1].2),
        "offsets rise: {heard:?}"
    );
    let extra = tokio::time::timeout(Duration::from_millis(300), resumed.next_change()).await;
    assert!(extra.is_err(), "a change heard twice: {extra:?}");

    // A change the log does not hold at that offset, or no change there yet.
    for wrong in [
        WatchResume {
            next_offset: resume.next_offset,
            last_version: resume.last_version + 1,
        },
        WatchResume {
            next_offset: 1_000_000,
            last_version: resume.last_version,
        },
    ] {
        let mut w = conn
            .resume_watch(scope, key(), None, wrong)
            .await
            .expect("the watch opens, then ends");
        match tokio::time::timeout(PATIENCE, w.next_change()).await {
            Ok(Err(ClientError::Broker(b))) => assert_eq!(b.reason, "watch_diverged", "{b:?}"),
            other => panic!("resuming at {wrong:?}: expected watch_diverged, got {other:?}"),
        }
    }
    client
        .create_cache(T, NS, "resumable-mem", CacheConfig::default())
        .await
        .expect("an in-memory cache");
    let refused = conn
        .resume_watch((T, NS, "resumable-mem"), key(), None, resume)
        .await;
    match refused {
        Ok(mut w) => match tokio::time::timeout(PATIENCE, w.next_change()).await {
            Ok(Err(ClientError::Broker(b))) => assert_eq!(b.code, codes::INVALID_ARGUMENT, "{b:?}"),
            other => panic!("an in-memory cache resumed a watch: {other:?}"),
        },
        Err(ClientError::Broker(b)) => assert_eq!(b.code, codes::INVALID_ARGUMENT, "{b:?}"),
        Err(e) => panic!("{e}"),
    }
}

async fn next(watch: &mut felix_client::CacheWatch) -> felix_client::CacheEvent {
    tokio::time::timeout(PATIENCE, watch.next_change())
        .await
        .expect("a change within the patience")
        .expect("watch")
        .expect("a change, not the watch's end")
}
