//! Tiered storage on a real `felix` process and a real S3-compatible server (SeaweedFS,
//! started by `felix_testkit::s3server`): sealed segments become Parquet objects that pyarrow
//! reads; replay from offset 0 crosses cold → hot → live with nothing skipped or repeated,
//! also after a restart with an empty cache; an unreachable object store is said plainly and
//! the hot tail is still served; an outage during heavy publishing loses nothing and deletes
//! nothing early; total retention trims the oldest objects and old offsets are refused as
//! `offset_too_old`.
//!
//! The broker reaches the S3 server through a TCP proxy the test can cut: that is how "the
//! object store is down" looks from the broker (connections refused or reset).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use felix_client::{
    AckMode, ClientError, Connection, Event, Message, StartAt, StreamConfig, codes,
};
use felix_cold::store::TierStore;
use felix_testkit::s3server::S3Server;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use super::common::{
    Broker, BrokerOptions, PATIENCE, assert_contiguous, metric_lines, metric_value, read_until,
};

const TENANT: &str = "tier";
const NS: &str = "ns";
const STREAM: &str = "history";
/// The smallest segment the control plane accepts: many segments from little data.
const SEGMENT_BYTES: u64 = 4096;

/// A TCP proxy in front of the S3 server that the test can take down: while down it
/// resets every connection, new and open.
struct Proxy {
    addr: SocketAddr,
    links: Arc<Links>,
}

/// The proxy's switch and its open connections, under one lock so that an accept either
/// sees the outage or is registered before [`Proxy::set_down`] sweeps.
#[derive(Default)]
struct Links {
    state: Mutex<LinkState>,
}

#[derive(Default)]
struct LinkState {
    down: bool,
    open: Vec<AbortHandle>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let links = Arc::new(Links::default());
        let shared = links.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let mut state = shared.state.lock().expect("proxy state");
                if state.down {
                    drop(client);
                    continue;
                }
                state.open.retain(|link| !link.is_finished());
                let link = tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut cr, &mut sw) => {}
                        _ = tokio::io::copy(&mut sr, &mut cw) => {}
                    }
                });
                state.open.push(link.abort_handle());
            }
        });
        Proxy { addr, links }
    }

    /// Taking the store down aborts every open connection before returning: a request the
    /// broker sends afterwards, even on a pooled connection, never reaches the server. (A
    /// cut that polled for the outage let a delete sent within its interval through.)
    fn set_down(&self, down: bool) {
        let mut state = self.links.state.lock().expect("proxy state");
        state.down = down;
        if down {
            for link in state.open.drain(..) {
                link.abort();
            }
        }
    }
}

/// A bucket on the shared S3 server, a proxy in front of it, and broker options that tier
/// to it.
struct Tiering {
    s3: &'static S3Server,
    bucket: String,
    proxy: Proxy,
}

impl Tiering {
    async fn new(hint: &str) -> Tiering {
        let s3 = S3Server::shared();
        let bucket = s3.bucket(hint).await;
        let target: SocketAddr = s3
            .endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("the S3 endpoint is IP:PORT");
        let proxy = Proxy::start(target).await;
        Tiering { s3, bucket, proxy }
    }

    fn options(&self) -> BrokerOptions {
        BrokerOptions::new()
            .env("FELIX_OBJECT_STORE", format!("s3://{}/felix", self.bucket))
            .env("FELIX_S3_ENDPOINT", format!("http://{}", self.proxy.addr))
            .env("AWS_ACCESS_KEY_ID", &self.s3.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &self.s3.secret_key)
            .env("AWS_REGION", &self.s3.region)
            .env("FELIX_OBJECT_STORE_TIMEOUT_MS", 3000)
            .env("FELIX_OBJECT_STORE_MAX_RETRIES", 1)
            .env("FELIX_RETENTION_CHECK_MS", 200)
            // Several row groups per object, so ranged reads pick among them.
            .env("FELIX_TIER_ROW_GROUP_BYTES", 1024)
    }

    /// The bucket as the test sees it (directly, not through the proxy).
    async fn store(&self) -> TierStore {
        TierStore::open(&self.s3.store_config(&self.bucket, "felix"))
            .await
            .expect("open the test's view of the bucket")
    }
}

/// Creates the tenant, namespace and a durable, tiered stream of one shard whose segments
/// are tiny and roll after a second of quiet.
async fn tiered_stream(client: &Connection, extra: StreamConfig) {
    client.create_tenant(TENANT).await.expect("create tenant");
    client
        .create_namespace(TENANT, NS)
        .await
        .expect("create namespace");
    client
        .create_stream(
            TENANT,
            NS,
            STREAM,
            StreamConfig {
                durable: Some(true),
                shards: Some(1),
                segment_bytes: Some(SEGMENT_BYTES),
                segment_ms: Some(1000),
                tiered: Some(true),
                ..extra
            },
        )
        .await
        .expect("create stream");
}

/// Record `i`: a key, a payload that names it, a header, and a timestamp of its own.
fn message(i: u64) -> Message {
    Message::new(format!("payload-{i:06}-{}", "x".repeat((i % 50) as usize)))
        .with_key(format!("key-{}", i % 97))
        .with_header("n", i.to_string())
        .with_timestamp(1_700_000_000_000 + i as i64)
}

/// Publishes records `from..to` in acknowledged batches of 10.
async fn publish(client: &Connection, from: u64, to: u64) {
    let mut i = from;
    while i < to {
        let end = (i + 10).min(to);
        let published = client
            .publish_batch(
                TENANT,
                NS,
                STREAM,
                (i..end).map(message).collect(),
                AckMode::Batch,
            )
            .await
            .unwrap_or_else(|e| panic!("publish {i}..{end}: {e:?}"));
        assert_eq!(published[0].base_offset, i, "offsets are dense");
        i = end;
    }
}

/// Checks events against what `message` published: offsets from `from`, contiguous, and each
/// record's key, payload, header and timestamp.
fn assert_records(events: &[Event], from: u64, what: &str) {
    assert_contiguous(events, from, what);
    for e in events {
        let m = message(e.offset);
        assert_eq!(e.key, m.key, "{what}: key of offset {}", e.offset);
        assert_eq!(
            e.payload, m.payload,
            "{what}: payload of offset {}",
            e.offset
        );
        assert_eq!(
            e.timestamp,
            1_700_000_000_000 + e.offset as i64,
            "{what}: timestamp of offset {}",
            e.offset
        );
        assert_eq!(
            e.headers,
            vec![("n".to_owned(), Bytes::from(e.offset.to_string()))],
            "{what}: headers of offset {}",
            e.offset
        );
    }
}

/// Waits until `check` holds for the shard's info, failing after [`PATIENCE`].
async fn wait_for_shard(
    client: &Connection,
    what: &str,
    check: impl Fn(&felix_client::ShardInfo) -> bool,
) -> felix_client::ShardInfo {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let info = client
            .describe_stream(TENANT, NS, STREAM)
            .await
            .expect("describe");
        let shard = info.shards[0].clone();
        if check(&shard) {
            return shard;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not reached within {PATIENCE:?}; shard is {shard:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `.log` segment files of shard 0 on local disk.
fn local_segments(broker: &Broker) -> usize {
    let dir = broker
        .data_dir()
        .join("streams")
        .join(TENANT)
        .join(NS)
        .join(STREAM)
        .join("0");
    std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
                .count()
        })
        .unwrap_or(0)
}

async fn subscribe_all(client: &Connection, from: StartAt, end: u64, what: &str) -> Vec<Event> {
    let mut sub = client
        .subscribe(TENANT, NS, STREAM, 0, from)
        .await
        .unwrap_or_else(|e| panic!("{what}: subscribe: {e:?}"));
    read_until(&mut sub, end, what).await
}

async fn metric(broker: &Broker, name: &str) -> f64 {
    let text = broker.metrics().await;
    metric_lines(&text, name)
        .first()
        .map_or(0.0, |l| metric_value(l))
}

/// Every sealed segment becomes a Parquet object under the documented key layout, and
/// pyarrow reads back exactly what was published: offsets, keys, payloads and timestamps,
/// in order, with no gaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_segments_become_parquet_objects_that_pyarrow_reads() {
    const N: u64 = 1500;
    let env = Tiering::new("parquet").await;
    let broker = Broker::start(env.options()).await;
    let client = broker.client().await;
    tiered_stream(&client, StreamConfig::default()).await;
    publish(&client, 0, N).await;
    // The idle active segment seals after a second, so eventually everything is uploaded.
    wait_for_shard(&client, "all records uploaded", |s| s.uploaded_end == N).await;

    let segments = client
        .list_segments(TENANT, NS, STREAM)
        .await
        .expect("segments");
    assert!(
        segments.len() > 5,
        "tiny segments: many objects, got {segments:?}"
    );
    let mut expect = 0;
    for s in &segments {
        assert_eq!(s.tier, "cold", "every sealed segment is uploaded: {s:?}");
        assert_eq!(
            s.base_offset, expect,
            "objects are contiguous: {segments:?}"
        );
        let key = s.object_key.as_deref().expect("a cold segment has a key");
        assert_eq!(
            key,
            format!(
                "tenant={TENANT}/namespace={NS}/stream={STREAM}/shard=0/{:020}-{:020}.parquet",
                s.base_offset, s.last_offset
            )
        );
        expect = s.last_offset + 1;
    }
    assert_eq!(expect, N);

    // Download the objects and let pyarrow read them as one dataset.
    let store = env.store().await;
    let listed = store
        .list(&format!("tenant={TENANT}/"))
        .await
        .expect("list objects");
    assert_eq!(
        listed.len(),
        segments.len(),
        "one object per manifest entry"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    for (key, size) in &listed {
        let bytes = store.get_range(key, 0..*size).await.expect("get object");
        let path = dir.path().join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &bytes).unwrap();
    }
    let script = r#"
import json, sys
import pyarrow.dataset as ds
t = ds.dataset(sys.argv[1], format="parquet", partitioning="hive").to_table().sort_by("offset")
for r in t.select(["offset", "timestamp", "key", "payload", "shard"]).to_pylist():
    print(json.dumps({"offset": r["offset"], "ts": int(r["timestamp"].timestamp() * 1000),
                      "key": r["key"].decode(), "payload": r["payload"].decode(), "shard": r["shard"]}))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(dir.path())
        .output()
        .expect("run python3 (scripts/test.sh installs pyarrow)");
    assert!(
        out.status.success(),
        "pyarrow could not read the objects (scripts/test.sh installs pyarrow): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(rows.len() as u64, N, "pyarrow sees every record once");
    for (i, row) in rows.iter().enumerate() {
        let m = message(i as u64);
        assert_eq!(row["offset"], i as u64, "offsets in order, no gaps");
        assert_eq!(row["ts"], 1_700_000_000_000 + i as i64);
        assert_eq!(
            row["key"].as_str().unwrap().as_bytes(),
            m.key.as_deref().unwrap()
        );
        assert_eq!(row["payload"].as_str().unwrap().as_bytes(), &m.payload[..]);
        assert_eq!(row["shard"], 0);
    }
}

/// With hot retention at zero the local sealed segments go once uploaded, and a replay from
/// offset 0 still returns every record, in order, then continues live; after a restart with
/// the cache directory wiped too. With the object store unreachable, a restarted broker
/// still serves the hot tail and answers a cold read with a clear `cold_tier_unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_crosses_cold_hot_and_live_and_survives_an_empty_cache() {
    const N: u64 = 1200;
    const MORE: u64 = 300;
    let env = Tiering::new("replay").await;
    let mut broker = Broker::start(env.options()).await;
    let client = broker.client().await;
    tiered_stream(
        &client,
        StreamConfig {
            hot_retention_bytes: Some(0),
            ..Default::default()
        },
    )
    .await;
    let segments_at_start = local_segments(&broker);
    publish(&client, 0, N).await;
    // Retention takes a segment out of the shard's list before it unlinks the file, so the
    // status can lead the directory by a moment: wait for both.
    let shard = wait_for_shard(&client, "uploaded and trimmed locally", |s| {
        s.uploaded_end == N
            && s.hot_first_offset >= N
            && local_segments(&broker) <= segments_at_start + 1
    })
    .await;
    assert_eq!(shard.first_offset, 0, "offset 0 is still readable (cold)");

    // From offset 0: cold, then live.
    let mut sub = client
        .subscribe(TENANT, NS, STREAM, 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    assert_eq!(sub.start_offset(), 0);
    let mut events = read_until(&mut sub, N, "cold replay").await;
    let publisher = client.clone();
    let live = tokio::spawn(async move { publish(&publisher, N, N + MORE).await });
    events.extend(read_until(&mut sub, N + MORE, "live after cold").await);
    live.await.expect("live publisher");
    assert_records(&events, 0, "earliest → live");

    // A start by timestamp inside the cold tier.
    let by_time = client
        .subscribe(
            TENANT,
            NS,
            STREAM,
            0,
            StartAt::Timestamp(1_700_000_000_000 + 500),
        )
        .await
        .expect("subscribe by time");
    assert!(
        by_time.start_offset() <= 500 && by_time.start_offset() + 20 > 500,
        "a timestamp in the cold tier starts at its batch, got {}",
        by_time.start_offset()
    );
    drop(by_time);

    // Restart with an empty cache directory: every read is a fresh GET. (With the cache
    // kept, the disk tier recovers and serves it: see the store-down case below.)
    drop(sub);
    drop(client);
    broker.kill();
    let cache = broker.data_dir().join("cache");
    assert!(
        cache.exists(),
        "the cache lives under the data dir by default"
    );
    std::fs::remove_dir_all(&cache).expect("wipe the cache");
    broker.restart().await;
    let client = broker.client().await;
    let events = subscribe_all(&client, StartAt::Earliest, N + MORE, "after restart").await;
    assert_records(&events, 0, "replay after a restart with an empty cache");

    // The object store unreachable: the broker starts, serves the hot tail, and says what
    // is missing.
    let hot_first = wait_for_shard(&client, "tail uploaded", |s| s.uploaded_end == N + MORE)
        .await
        .hot_first_offset;
    drop(client);
    // The disk cache survives restarts (entries are versioned by checksum) and would serve
    // these reads without the store: wipe it, so a cold read has to reach the store.
    broker.kill();
    std::fs::remove_dir_all(&cache).expect("wipe the cache");
    env.proxy.set_down(true);
    broker.restart().await;
    let client = broker.client().await;
    publish(&client, N + MORE, N + MORE + 50).await;
    let tail = subscribe_all(
        &client,
        StartAt::Offset(hot_first),
        N + MORE + 50,
        "hot tail while the store is down",
    )
    .await;
    assert_records(&tail, hot_first, "hot tail");
    let mut cold = client
        .subscribe(TENANT, NS, STREAM, 0, StartAt::Earliest)
        .await
        .expect("a subscription from earliest opens");
    let err = tokio::time::timeout(PATIENCE, cold.next_event())
        .await
        .expect("the cold read ends within the object store timeout")
        .expect_err("history in an unreachable object store cannot be read");
    match &err {
        ClientError::Broker(body) => {
            assert_eq!(body.code, codes::SHARD_UNAVAILABLE, "{body:?}");
            assert_eq!(body.reason, "cold_tier_unavailable", "{body:?}");
        }
        other => panic!("expected cold_tier_unavailable, got {other:?}"),
    }
    // The startup probe says so once its check has run out of retries, which may be after
    // the read above failed (the gauge reads 0 before the probe's first answer, too).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let log = std::fs::read_to_string(broker.log_path()).unwrap_or_default();
        if log.contains("object store unreachable") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the broker says the object store is unreachable"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(&broker, "felix_tier_store_up").await, 0.0);
    env.proxy.set_down(false);
}

/// The object store goes down during heavy publishing: publishes keep being acknowledged,
/// the backlog and the errors show in the metrics, no local segment is deleted before its
/// upload is recorded, and once the store returns the uploads catch up and every
/// acknowledged record reads back from offset 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_store_outage_loses_nothing_and_uploads_catch_up() {
    const PUBLISHERS: u64 = 4;
    const EACH: u64 = 1000;
    const N: u64 = PUBLISHERS * EACH;
    let env = Tiering::new("outage").await;
    let broker = Broker::start(env.options()).await;
    let client = broker.client().await;
    tiered_stream(
        &client,
        StreamConfig {
            hot_retention_bytes: Some(0),
            ..Default::default()
        },
    )
    .await;
    env.proxy.set_down(true);
    // Concurrent publishers; each record's payload names it, offsets are assigned by the
    // broker, so remember offset → payload from the acknowledgements.
    let mut tasks = Vec::new();
    for p in 0..PUBLISHERS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = BTreeMap::new();
            for b in 0..EACH / 10 {
                let payloads: Vec<Bytes> = (0..10)
                    .map(|i| Bytes::from(format!("p{p}-b{b}-i{i}-{}", "y".repeat(40))))
                    .collect();
                let published = client
                    .publish_batch(
                        TENANT,
                        NS,
                        STREAM,
                        payloads.iter().cloned().map(Message::new).collect(),
                        AckMode::Batch,
                    )
                    .await
                    .expect("publishing does not depend on the object store");
                for (i, p) in payloads.into_iter().enumerate() {
                    acked.insert(published[0].offset_of(i), p);
                }
            }
            acked
        }));
    }
    let mut acked = BTreeMap::new();
    for t in tasks {
        acked.extend(t.await.expect("publisher"));
    }
    assert_eq!(acked.len() as u64, N);
    // Let the uploader fail a few times and the idle segment seal.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let info = client
        .describe_stream(TENANT, NS, STREAM)
        .await
        .expect("describe");
    let shard = &info.shards[0];
    assert_eq!(
        shard.uploaded_end, 0,
        "nothing can be recorded while the store is down"
    );
    assert_eq!(
        shard.hot_first_offset, 0,
        "no local segment is deleted before its upload is recorded"
    );
    assert!(shard.upload_backlog_segments > 0, "{shard:?}");
    assert!(metric(&broker, "felix_tier_upload_backlog_segments").await > 0.0);
    assert!(metric(&broker, "felix_tier_upload_errors_total").await > 0.0);

    env.proxy.set_down(false);
    wait_for_shard(&client, "uploads caught up and local copies trimmed", |s| {
        s.uploaded_end == N && s.hot_first_offset >= N
    })
    .await;
    assert_eq!(
        metric(&broker, "felix_tier_upload_backlog_segments").await,
        0.0
    );
    let events = subscribe_all(&client, StartAt::Earliest, N, "replay after the outage").await;
    assert_contiguous(&events, 0, "replay after the outage");
    for e in &events {
        assert_eq!(
            Some(&e.payload),
            acked.get(&e.offset),
            "acknowledged record at offset {} reads back",
            e.offset
        );
    }
}

/// Total retention deletes the oldest objects (manifest first, then the objects), moves
/// the shard's earliest offset, and a subscriber asking for a deleted offset gets
/// `offset_too_old` with the earliest offset still available.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn total_retention_deletes_the_oldest_objects() {
    const N: u64 = 1500;
    let env = Tiering::new("retention").await;
    let broker = Broker::start(env.options()).await;
    let client = broker.client().await;
    tiered_stream(
        &client,
        StreamConfig {
            hot_retention_bytes: Some(0),
            ..Default::default()
        },
    )
    .await;
    publish(&client, 0, N).await;
    wait_for_shard(&client, "all uploaded", |s| s.uploaded_end == N).await;
    let store = env.store().await;
    let prefix = format!("tenant={TENANT}/");
    let before = store.list(&prefix).await.expect("list").len();

    // Keep about a third of the stream's bytes.
    let info = client
        .describe_stream(TENANT, NS, STREAM)
        .await
        .expect("describe");
    let keep = info.shards[0].cold_bytes / 3;
    client
        .alter_stream(
            TENANT,
            NS,
            STREAM,
            StreamConfig {
                retention_bytes: Some(keep),
                ..Default::default()
            },
        )
        .await
        .expect("alter retention");
    let shard = wait_for_shard(&client, "retention moved the earliest offset", |s| {
        s.first_offset > 0 && s.cold_bytes <= keep + 64 * 1024
    })
    .await;
    let earliest = shard.first_offset;
    assert!(earliest < N, "the newest records stay");

    // The deleted objects are gone from the bucket, the rest start at the earliest offset.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let after = loop {
        let after = store.list(&prefix).await.expect("list");
        let first_base = after
            .iter()
            .map(|(k, _)| k.rsplit('/').next().unwrap()[..20].parse::<u64>().unwrap())
            .min();
        if first_base == Some(earliest) {
            break after;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "objects below {earliest} still listed: {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        after.len() < before,
        "{} objects before, {} after",
        before,
        after.len()
    );

    // A deleted offset: a typed refusal naming the earliest offset.
    match client
        .subscribe(TENANT, NS, STREAM, 0, StartAt::Offset(0))
        .await
    {
        Err(ClientError::Broker(body)) => {
            assert_eq!(body.code, codes::OFFSET_TOO_OLD, "{body:?}");
            assert_eq!(body.reason, "offset_too_old");
            assert_eq!(body.earliest_offset, Some(earliest), "{body:?}");
        }
        Err(e) => panic!("expected offset_too_old, got {e:?}"),
        Ok(_) => panic!("a subscription from a deleted offset was accepted"),
    }
    // From earliest: what is left, in order, with nothing missing.
    let events = subscribe_all(&client, StartAt::Earliest, N, "after retention").await;
    assert_records(&events, earliest, "after retention");
}

/// A broker whose local stream data is gone (a replaced instance's empty NVMe) continues the
/// shard's offsets after the uploaded history instead of handing them out again, and a
/// replay from offset 0 reads the old records from the object store, then the new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_local_volume_continues_offsets_after_the_uploaded_history() {
    const N: u64 = 800;
    const MORE: u64 = 100;
    let env = Tiering::new("wiped").await;
    let mut broker = Broker::start(env.options()).await;
    let client = broker.client().await;
    tiered_stream(&client, StreamConfig::default()).await;
    publish(&client, 0, N).await;
    // The idle segment seals after a second: then everything is in the object store.
    wait_for_shard(&client, "all uploaded", |s| s.uploaded_end == N).await;
    drop(client);
    broker.kill();
    std::fs::remove_dir_all(broker.data_dir().join("streams")).expect("wipe the shard logs");
    broker.restart().await;
    let client = broker.client().await;
    let info = client
        .describe_stream(TENANT, NS, STREAM)
        .await
        .expect("describe");
    assert_eq!(info.shards[0].next_offset, N, "the shard continues at {N}");
    assert_eq!(info.shards[0].first_offset, 0, "history is still readable");
    publish(&client, N, N + MORE).await;
    let events = subscribe_all(&client, StartAt::Earliest, N + MORE, "after the wipe").await;
    assert_records(
        &events,
        0,
        "uploaded history, then the records published after the wipe",
    );
}

/// Deletes that stay deleted, in the object store too: a deleted tiered stream's objects are
/// removed even when the broker that took the delete is killed before it could remove them
/// (here the object store is unreachable from the delete until after the kill), and the
/// name stays reserved, with a typed retryable refusal, until they are gone. The
/// reservation is control-plane state; it used to live in the deleting broker's memory, so
/// a kill left the objects behind for good and freed the name at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_streams_objects_are_removed_after_a_crash_and_its_name_waits_for_them() {
    let env = Tiering::new("deleted").await;
    let mut broker = Broker::start(env.options()).await;
    let client = broker.client().await;
    tiered_stream(&client, StreamConfig::default()).await;
    publish(&client, 0, 300).await;
    wait_for_shard(&client, "some segments uploaded", |s| s.uploaded_end > 0).await;
    let store = env.store().await;
    let prefix = format!("tenant={TENANT}/namespace={NS}/stream={STREAM}/");
    let objects = store.list(&prefix).await.expect("list").len();
    assert!(objects > 0, "the stream has objects to delete");

    env.proxy.set_down(true);
    client
        .delete_stream(TENANT, NS, STREAM)
        .await
        .expect("delete while the object store is down");
    let again = StreamConfig {
        durable: Some(true),
        tiered: Some(true),
        ..StreamConfig::default()
    };
    match client
        .create_stream(TENANT, NS, STREAM, again.clone())
        .await
    {
        Err(ClientError::Broker(body)) => {
            assert_eq!(body.code, codes::ALREADY_EXISTS, "{body:?}");
            assert_eq!(body.reason, "stream_being_deleted", "{body:?}");
            assert!(body.retry_after_ms.is_some(), "retryable: {body:?}");
        }
        other => panic!("the name of a stream whose objects remain was taken: {other:?}"),
    }
    drop(client);
    broker.kill();
    // (An upload in flight when the store went down may have landed as well.)
    let left = store.list(&prefix).await.expect("list").len();
    assert!(
        left >= objects,
        "nothing could be removed while the store was down: {left} of {objects} left"
    );

    env.proxy.set_down(false);
    broker.restart().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let left = store.list(&prefix).await.expect("list");
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a deleted stream's objects outlived a restart: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The name frees itself once the objects are gone; the new stream starts empty.
    let client = broker.client().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while let Err(e) = client
        .create_stream(TENANT, NS, STREAM, again.clone())
        .await
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the name stayed reserved after the objects were gone: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let shard = wait_for_shard(&client, "the new stream", |_| true).await;
    assert_eq!(
        (shard.first_offset, shard.next_offset),
        (0, 0),
        "a new, empty stream"
    );
}

/// A damaged local segment whose records were uploaded before the damage is served around:
/// a reader from earliest gets every record from the object store's verified copy instead of
/// a `corrupt_data` refusal, and the damage is still counted and logged for the operator
/// (docs/integrity.md, "Corruption is its own error"); then the broker rewrites the damaged
/// file from that copy, and after a restart the log reads whole with nothing detected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_local_segment_that_was_uploaded_is_served_from_the_object_store() {
    const N: u64 = 600;
    let env = Tiering::new("heal").await;
    let mut broker = Broker::start(env.options()).await;
    let client = broker.client().await;
    tiered_stream(&client, StreamConfig::default()).await;
    publish(&client, 0, N).await;
    wait_for_shard(&client, "all records uploaded", |s| s.uploaded_end == N).await;
    drop(client);
    broker.kill();

    let dir = broker
        .data_dir()
        .join("streams")
        .join(TENANT)
        .join(NS)
        .join(STREAM)
        .join("0");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the shard's directory")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "uploaded segments are still on local disk (hot retention keeps them): {files:?}"
    );
    let victim = super::corruption::bump_a_base_offset(&files[1]);
    broker.restart().await;

    let client = broker.client().await;
    let events = subscribe_all(&client, StartAt::Earliest, N, "read across the damage").await;
    assert_records(
        &events,
        0,
        "every record, the damaged range from the object store",
    );
    assert!(events.iter().any(|e| e.offset == victim));

    let detected: f64 = metric_lines(&broker.metrics().await, "felix_corruption_detected_total")
        .iter()
        .filter(|l| l.contains("tier=\"hot\""))
        .map(|l| metric_value(l))
        .sum();
    assert!(detected >= 1.0, "the damage is counted ({detected})");
    let log = std::fs::read_to_string(broker.log_path()).unwrap_or_default();
    assert_eq!(
        log.matches("served from the object store instead").count(),
        1,
        "logged once for the damaged file"
    );

    // The broker rewrites the damaged file from the object store's copy: after a restart
    // the whole log reads locally again with nothing detected.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let log = std::fs::read_to_string(broker.log_path()).unwrap_or_default();
        if log.contains("rewrote a damaged local segment") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the damaged segment was not rewritten within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(client);
    broker.kill();
    broker.restart().await;
    let client = broker.client().await;
    let events = subscribe_all(&client, StartAt::Earliest, N, "read after the repair").await;
    assert_records(&events, 0, "every record, read locally");
    let detected: f64 = metric_lines(&broker.metrics().await, "felix_corruption_detected_total")
        .iter()
        .map(|l| metric_value(l))
        .sum();
    assert_eq!(detected, 0.0, "the rewritten segment passes its checks");
}
