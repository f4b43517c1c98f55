//! A log-backed cache's compaction and segments, on real `felix` processes: a compaction
//! does not stop puts and gets while it writes its snapshot, and loses none of the changes
//! made meanwhile, across a kill -9 either; a follower's log rolls at the segment size the
//! owner gives a busy cache. Steps of `broker::cache::cache_on_one_broker` and
//! `broker::cache::cache_on_a_three_broker_cluster`.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use felix_client::Client;

use super::cache::{client_of, durable};
use super::cluster::Cluster;
use super::common::{Broker, PATIENCE, http_request, metric_lines, metric_value, shard_leader};

const T: &str = "kv";
const NS: &str = "ns";

async fn set_compactions_held(broker: &Broker, held: bool) {
    let method = if held { "POST" } else { "DELETE" };
    let (status, body) = http_request(broker.admin_addr, method, "/v1/faults/hold_compactions")
        .await
        .expect("the fault-injection route");
    assert_eq!(status, 200, "{method} /v1/faults/hold_compactions: {body}");
}

/// Waits until the broker's log says a compaction of `cache` is held.
async fn compaction_held(broker: &Broker, cache: &str) {
    let stream = format!("__cache.{cache}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let log = std::fs::read_to_string(broker.log_path()).unwrap_or_default();
        if log
            .lines()
            .any(|l| l.contains("cache compaction held") && l.contains(&stream))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no compaction of {cache} began within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn compactions_of(broker: &Broker, cache: &str) -> f64 {
    let metrics = broker.metrics().await;
    metric_lines(&metrics, "felix_cache_compactions_total")
        .into_iter()
        .filter(|l| l.contains(&format!("cache=\"{cache}\"")))
        .map(metric_value)
        .sum()
}

/// `f` must answer while a compaction is held; a hang fails the step (never a timing).
async fn answered<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(PATIENCE, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer while a compaction was in progress"))
}

/// A compaction held between its floor record and its snapshot (fault injection) does not
/// hold up a put, a delete or a get of its shard; once it goes on and raises the floor, and
/// the broker is killed and restarted, the changes made meanwhile are all there: the
/// snapshot's older copies of the keys they changed did not undo them.
pub(super) async fn a_put_and_a_get_are_answered_while_a_compaction_is_held_and_no_change_is_lost_across_it_and_a_restart(
    broker: &mut Broker,
) {
    const CACHE: &str = "held";
    let client = client_of(&broker.quic_addr.to_string(), broker.admin_token()).await;
    client
        .create_cache(T, NS, CACHE, durable())
        .await
        .expect("cache");
    for k in ["stays", "changed", "deleted"] {
        client
            .cache_put(T, NS, CACHE, k, Bytes::from("old"), None)
            .await
            .expect("put");
    }
    set_compactions_held(broker, true).await;
    // Overwrites of one key until the log is well past 4x its live data and three 256 KiB
    // segments: the once-a-second pass starts a compaction, which stops at the hold.
    let writers = (0..8).map(|w| {
        let (client, filler) = (client.clone(), filler_value());
        tokio::spawn(async move {
            for _ in 0..150 {
                client
                    .cache_put(T, NS, CACHE, format!("filler-{w}"), filler.clone(), None)
                    .await
                    .expect("overwrite");
            }
        })
    });
    for w in futures::future::join_all(writers).await {
        w.expect("writer");
    }
    compaction_held(broker, CACHE).await;
    answered(
        "a put",
        client.cache_put(T, NS, CACHE, "changed", Bytes::from("new"), None),
    )
    .await
    .expect("a put during compaction");
    assert!(
        answered("a delete", client.cache_delete(T, NS, CACHE, "deleted"))
            .await
            .expect("a delete during compaction"),
        "the key held a value"
    );
    answered(
        "a put of a new key",
        client.cache_put(T, NS, CACHE, "during", Bytes::from("new"), None),
    )
    .await
    .expect("a put during compaction");
    assert_eq!(
        answered("a get", client.cache_get(T, NS, CACHE, "stays"))
            .await
            .expect("a get during compaction"),
        Some(Bytes::from("old"))
    );
    set_compactions_held(broker, false).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while compactions_of(broker, CACHE).await < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the released compaction of {CACHE} did not finish within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let expect = |client: Client, when: &'static str| async move {
        for (k, v) in [
            ("stays", Some("old")),
            ("changed", Some("new")),
            ("deleted", None),
            ("during", Some("new")),
        ] {
            assert_eq!(
                client.cache_get(T, NS, CACHE, k).await.expect("get"),
                v.map(Bytes::from),
                "{k} {when}"
            );
        }
        assert_eq!(
            client
                .cache_get(T, NS, CACHE, "filler-0")
                .await
                .expect("get"),
            Some(filler_value()),
            "filler-0 {when}"
        );
    };
    expect(client, "after the compaction").await;
    broker.kill();
    broker.restart().await;
    let client = client_of(&broker.quic_addr.to_string(), broker.admin_token()).await;
    // The log now starts at the compaction's floor: the state is rebuilt from its snapshot
    // and the changes written between the snapshot's copies.
    expect(client, "after kill -9 and a restart").await;
}

fn filler_value() -> Bytes {
    Bytes::from(vec![b'f'; 1000])
}

/// The largest segment file in the cache's shard directory on `broker`.
fn largest_segment(broker: &Broker, cache: &str) -> u64 {
    fn walk(p: &Path) -> u64 {
        let Ok(dir) = std::fs::read_dir(p) else {
            return 0;
        };
        dir.flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => walk(&e.path()),
                Ok(m) if e.file_name().to_string_lossy().ends_with(".log") => m.len(),
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }
    walk(
        &broker
            .data_dir()
            .join("streams")
            .join(T)
            .join(NS)
            .join(format!("__cache.{cache}")),
    )
}

/// A busy cache's owner grows its log's segments with the live data (as large as it); its
/// followers roll at the same size, not at the 256 KiB a cache's log starts with.
pub(super) async fn a_followers_log_rolls_at_the_segment_size_the_owner_gives_a_busy_cache(
    cluster: &Cluster,
    client: &Client,
) {
    const CACHE: &str = "busy";
    client
        .create_cache(
            T,
            NS,
            CACHE,
            felix_client::CacheConfig {
                durable: Some(true),
                shards: Some(1),
                replicas: Some(3),
                ..Default::default()
            },
        )
        .await
        .expect("cache");
    let owner = shard_leader(client, (T, NS, "__cache.busy"), None).await;
    // 12,000 keys of 1 KiB: about 13 MB live, so the owner rolls at about 13 MB. A
    // follower rolls only between the write groups of its fetches (up to 1 MiB each), so
    // one rolling at 256 KiB holds segments of up to 1.25 MiB; rounds of puts go on until
    // every follower holds one over 2 MiB (the owner sizes its segments once a second, and
    // followers learn the size on their next fetch).
    const KEYS: usize = 12_000;
    const OVER: u64 = 2 << 20;
    let value = Bytes::from(vec![b'b'; 1024]);
    let followers: Vec<&Broker> = (1..=cluster.brokers.len() as u64)
        .filter(|id| *id != owner)
        .map(|id| &cluster.brokers[id as usize - 1])
        .collect();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let writers = (0..16).map(|w| {
            let (client, value) = (client.clone(), value.clone());
            tokio::spawn(async move {
                for i in (w..KEYS).step_by(16) {
                    client
                        .cache_put(T, NS, CACHE, format!("key-{i}"), value.clone(), None)
                        .await
                        .expect("put");
                }
            })
        });
        for w in futures::future::join_all(writers).await {
            w.expect("writer");
        }
        let largest: Vec<u64> = followers
            .iter()
            .map(|f| largest_segment(f, CACHE))
            .collect();
        if largest.iter().all(|n| *n > OVER) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after rounds of {KEYS} 1 KiB puts the followers' largest segments are {largest:?} \
             bytes (the owner's: {}), none over {OVER}: they still roll at 256 KiB",
            largest_segment(&cluster.brokers[owner as usize - 1], CACHE)
        );
    }
}
