//! Cold replay against a store that answers like a distant one, on a real `felix` process
//! and a real S3-compatible server (SeaweedFS): with every GET slowed to 150–200 ms before
//! its first byte (`object_store_get_latency_ms`, a `FELIX_FAULT_INJECTION=1` benchmark
//! tool), a replay from offset 0 keeps several row-group GETs in flight, delivers every
//! record in order across object boundaries, and its read-ahead stays within its memory
//! budget however far the measured latency says to read ahead. A store that hangs
//! (connections accepted, nothing answered) shows in `felix_tier_store_up` within seconds.
//!
//! The broker reaches SeaweedFS through a TCP proxy the test can hang: bytes stop flowing
//! both ways on open connections and new ones, while every socket stays open.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use felix_client::{AckMode, Connection, Message, StartAt, StreamConfig};
use felix_testkit::s3server::S3Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use super::common::{
    Broker, BrokerOptions, PATIENCE, assert_contiguous, metric_lines, metric_value, read_until,
    run_to_exit,
};

const TENANT: &str = "cold";
const NS: &str = "ns";
const STREAM: &str = "slow-history";

/// A TCP proxy to the S3 server that can hang: while hung it neither reads nor writes.
struct HangingProxy {
    addr: SocketAddr,
    hung: Arc<AtomicBool>,
}

impl HangingProxy {
    async fn start(target: SocketAddr) -> HangingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let hung = Arc::new(AtomicBool::new(false));
        let h = hung.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let h = h.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::select! {
                        _ = pump(cr, sw, h.clone()) => {}
                        _ = pump(sr, cw, h) => {}
                    }
                });
            }
        });
        HangingProxy { addr, hung }
    }

    fn set_hung(&self, hung: bool) {
        self.hung.store(hung, Ordering::Release);
    }
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, hung: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 64 * 1024];
    let wait = || async {
        while hung.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    loop {
        wait().await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        wait().await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A bucket on the shared S3 server behind a [`HangingProxy`].
struct SlowStore {
    s3: &'static S3Server,
    bucket: String,
    proxy: HangingProxy,
}

impl SlowStore {
    async fn new(hint: &str) -> SlowStore {
        let s3 = S3Server::shared();
        let bucket = s3.bucket(hint).await;
        let target: SocketAddr = s3
            .endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("the S3 endpoint is IP:PORT");
        let proxy = HangingProxy::start(target).await;
        SlowStore { s3, bucket, proxy }
    }

    /// Broker options tiering to the bucket through the proxy, with the store's own
    /// timeouts and retries left at their defaults (30 s per attempt, 5 retries).
    fn options(&self) -> BrokerOptions {
        BrokerOptions::new()
            .env("FELIX_OBJECT_STORE", format!("s3://{}/felix", self.bucket))
            .env("FELIX_S3_ENDPOINT", format!("http://{}", self.proxy.addr))
            .env("AWS_ACCESS_KEY_ID", &self.s3.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &self.s3.secret_key)
            .env("AWS_REGION", &self.s3.region)
            .env("FELIX_RETENTION_CHECK_MS", 200)
    }
}

async fn metric(broker: &Broker, name: &str) -> f64 {
    let text = broker.metrics().await;
    metric_lines(&text, name)
        .first()
        .map_or(f64::NAN, |l| metric_value(l))
}

async fn create_stream(client: &Connection) {
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
                segment_bytes: Some(4096),
                segment_ms: Some(1000),
                tiered: Some(true),
                hot_retention_bytes: Some(0),
                ..Default::default()
            },
        )
        .await
        .expect("create stream");
}

fn payload(i: u64) -> String {
    format!("record-{i:06}-{}", "y".repeat((i % 40) as usize))
}

/// What the test saw of the read-ahead while a replay ran, from `/metrics` every 10 ms.
#[derive(Debug, Default, Clone, Copy)]
struct Peaks {
    fetches_in_flight: f64,
    read_ahead_bytes: f64,
    depth: f64,
}

/// With every GET 150–200 ms from its first byte, a cold replay from offset 0 keeps more
/// than one row-group GET in flight, delivers every record once and in order across object
/// boundaries, and its read-ahead waits at the budget instead of growing past it, although
/// the measured latency asks for deeper read-ahead than the budget allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_replay_over_a_slow_store_keeps_gets_in_flight_in_order_within_its_budget() {
    const N: u64 = 600;
    /// A few of the ~1 KiB row groups.
    const BUDGET: u64 = 4096;
    let store = SlowStore::new("slowreplay").await;
    let broker = Broker::start(
        store
            .options()
            .env("FELIX_FAULT_INJECTION", 1)
            .env("FELIX_OBJECT_STORE_GET_LATENCY_MS", 150)
            .env("FELIX_OBJECT_STORE_GET_JITTER_MS", 50)
            .env("FELIX_OBJECT_STORE_GET_BYTES_PER_SEC", 10_000_000)
            .env("FELIX_COLD_READ_AHEAD_BYTES", BUDGET)
            // Several row groups per object: read-ahead crosses row groups and objects.
            .env("FELIX_TIER_ROW_GROUP_BYTES", 1024),
    )
    .await;
    let client = broker.client().await;
    create_stream(&client).await;
    let mut i = 0;
    while i < N {
        let end = (i + 10).min(N);
        client
            .publish_batch(
                TENANT,
                NS,
                STREAM,
                (i..end).map(|n| Message::new(payload(n))).collect(),
                AckMode::Batch,
            )
            .await
            .unwrap_or_else(|e| panic!("publish {i}..{end}: {e:?}"));
        i = end;
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let objects = loop {
        let info = client
            .describe_stream(TENANT, NS, STREAM)
            .await
            .expect("describe");
        let s = &info.shards[0];
        if s.uploaded_end == N && s.hot_first_offset >= N {
            let segments = client
                .list_segments(TENANT, NS, STREAM)
                .await
                .expect("segments");
            break segments.iter().filter(|s| s.tier == "cold").count();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "history uploaded and trimmed locally: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(objects > 5, "many objects to cross, got {objects}");

    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        let admin = broker.admin_addr;
        tokio::spawn(async move {
            let mut peaks = Peaks::default();
            while !done.load(Ordering::Acquire) {
                if let Ok((200, text)) = super::common::http_get(admin, "/metrics").await {
                    let value = |name: &str| {
                        metric_lines(&text, name)
                            .first()
                            .map_or(0.0, |l| metric_value(l))
                    };
                    peaks.fetches_in_flight = peaks
                        .fetches_in_flight
                        .max(value("felix_cold_fetches_in_flight"));
                    peaks.read_ahead_bytes = peaks
                        .read_ahead_bytes
                        .max(value("felix_cold_read_ahead_bytes"));
                    peaks.depth = peaks.depth.max(value("felix_cold_read_ahead_depth"));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            peaks
        })
    };
    let mut sub = client
        .subscribe(TENANT, NS, STREAM, 0, StartAt::Earliest)
        .await
        .expect("subscribe from earliest");
    let events = read_until(&mut sub, N, "cold replay over a slow store").await;
    done.store(true, Ordering::Release);
    let peaks = watcher.await.expect("metrics watcher");

    eprintln!("read-ahead peaks during the replay: {peaks:?}");
    assert_contiguous(&events, 0, "cold replay over a slow store");
    assert_eq!(events.len() as u64, N, "every record once");
    for e in &events {
        assert_eq!(
            e.payload,
            payload(e.offset).as_bytes(),
            "offset {}",
            e.offset
        );
    }
    assert!(
        peaks.fetches_in_flight >= 2.0,
        "more than one GET in flight during the replay: {peaks:?}"
    );
    assert!(
        peaks.depth > 2.0,
        "the measured GET time asks for more than the configured 2 row groups: {peaks:?}"
    );
    assert!(
        peaks.read_ahead_bytes > 0.0 && peaks.read_ahead_bytes <= BUDGET as f64,
        "read-ahead held bytes, never more than its budget of {BUDGET}: {peaks:?}"
    );
    assert_eq!(
        metric(&broker, "felix_cold_read_ahead_budget_bytes").await,
        BUDGET as f64
    );
}

/// A store that hangs — connections accepted, nothing answered — is reported down by
/// `felix_tier_store_up` within 10 s (the store's own timeouts are left at 30 s per attempt
/// with 5 retries), and up again once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_object_store_is_reported_down_within_seconds() {
    let store = SlowStore::new("hungstore").await;
    let broker = Broker::start(store.options()).await;
    let until = |want: f64, within: Duration| {
        let broker = &broker;
        async move {
            let started = tokio::time::Instant::now();
            loop {
                if metric(broker, "felix_tier_store_up").await == want {
                    return started.elapsed();
                }
                assert!(
                    started.elapsed() < within,
                    "felix_tier_store_up did not become {want} within {within:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    until(1.0, PATIENCE).await;
    store.proxy.set_hung(true);
    let took = until(0.0, Duration::from_secs(10)).await;
    eprintln!("felix_tier_store_up fell to 0 {took:?} after the store hung");
    store.proxy.set_hung(false);
    until(1.0, Duration::from_secs(10)).await;
}

/// The simulated slow store is a benchmark tool: a broker started with it but without
/// `FELIX_FAULT_INJECTION=1` refuses to start and says which setting and why; with it, the
/// same configuration is accepted.
#[test]
fn a_simulated_slow_store_is_refused_without_fault_injection() {
    for flag in [
        "--object-store-get-latency-ms=30",
        "--object-store-get-jitter-ms=50",
        "--object-store-get-bytes-per-sec=100000000",
        "--cold-skip-content-digests=true",
    ] {
        let (code, stderr) = run_to_exit(&[flag, "--check-config"], &[]);
        assert_ne!(code, Some(0), "{flag} without fault injection: {stderr}");
        let key = flag
            .trim_start_matches("--")
            .split('=')
            .next()
            .unwrap_or_default()
            .replace('-', "_");
        assert!(
            stderr.contains(&key) && stderr.contains("FELIX_FAULT_INJECTION=1"),
            "{flag}: the refusal names the setting and the switch: {stderr}"
        );
        let (code, stderr) =
            run_to_exit(&[flag, "--check-config"], &[("FELIX_FAULT_INJECTION", "1")]);
        assert_eq!(code, Some(0), "{flag} with fault injection: {stderr}");
    }
}
