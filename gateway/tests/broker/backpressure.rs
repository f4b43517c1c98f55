//! Publisher backpressure (spec: "Publisher queue"): every tenant has its own publish slots,
//! so one tenant flooding the broker fills only its own share. Tenant `a` floods with many
//! concurrent publishers (commit-acked and fire-and-forget) against a small queue; tenant `b`
//! publishes steadily with acknowledgements throughout and is never refused as overloaded.
//! The broker's `felix_tenant_publish_queue_full_total` names `a` and never `b`. Then what
//! becomes of a publish that finds no room, by how it is acknowledged: refused at once,
//! waiting under `pub_ingress_wait`, or refused past 1,024 answers owed on its connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use felix_client::{AckMode, ClientError, Message, codes};
use parking_lot::Mutex;

use super::common::{Broker, BrokerOptions, PATIENCE, durable_stream, metric_lines, metric_value};

const NS: &str = "ns";
const STREAM: &str = "s";
const FLOOD_CONNECTIONS: usize = 4;
const FLOOD_ACKED_TASKS: usize = 32;
const FLOOD_FIRE_AND_FORGET_TASKS: usize = 8;
/// 8 records of 16 KiB: 128 KiB a batch.
const FLOOD_RECORDS: usize = 8;
const FLOOD_RECORD_BYTES: usize = 16 * 1024;
/// Tenant b's acknowledged publishes the flood must overlap at least.
const STEADY_PUBLISHES: u64 = 40;

#[derive(Default)]
struct Tally {
    acked: AtomicU64,
    overloaded: AtomicU64,
    other_errors: Mutex<Vec<String>>,
}

/// `felix_tenant_publish_queue_full_total` per (tenant, action) line, summed per tenant.
fn queue_full(text: &str, tenant: &str) -> (f64, Vec<String>) {
    let lines: Vec<String> = metric_lines(text, "felix_tenant_publish_queue_full_total")
        .into_iter()
        .filter(|l| l.contains(&format!("tenant=\"{tenant}\"")))
        .map(str::to_owned)
        .collect();
    (lines.iter().map(|l| metric_value(l)).sum(), lines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_flooding_does_not_starve_another() {
    let broker = Broker::start(
        BrokerOptions::new()
            .fsync("on_commit")
            .env("FELIX_PUB_QUEUE_DEPTH", 8)
            // A commit-acked publish that finds no room waits this long, then is refused.
            .env("FELIX_PUBLISH_QUEUE_WAIT_TIMEOUT_MS", 20),
    )
    .await;
    let admin = broker.client().await;
    durable_stream(&admin, "a", NS, STREAM, 1).await;
    durable_stream(&admin, "b", NS, STREAM, 1).await;

    let stop = Arc::new(AtomicBool::new(false));
    let flood = Arc::new(Tally::default());
    let steady = Arc::new(Tally::default());

    let mut tasks = Vec::new();
    let mut flood_clients = Vec::new();
    for _ in 0..FLOOD_CONNECTIONS {
        flood_clients.push(broker.client().await);
    }
    let payload = Bytes::from(vec![b'a'; FLOOD_RECORD_BYTES]);
    for t in 0..FLOOD_ACKED_TASKS + FLOOD_FIRE_AND_FORGET_TASKS {
        let client = flood_clients[t % FLOOD_CONNECTIONS].clone();
        let (stop, tally, payload) = (stop.clone(), flood.clone(), payload.clone());
        let ack = if t < FLOOD_ACKED_TASKS {
            AckMode::Batch
        } else {
            AckMode::None
        };
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                let messages = (0..FLOOD_RECORDS)
                    .map(|_| Message::new(payload.clone()))
                    .collect();
                match client.publish_batch("a", NS, STREAM, messages, ack).await {
                    Ok(_) => {
                        tally.acked.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(ClientError::Broker(body)) if body.code == codes::OVERLOADED => {
                        assert_eq!(body.reason, "publish_queue_full", "{body}");
                        assert!(
                            body.retry_after_ms.is_some(),
                            "overloaded is retryable: {body}"
                        );
                        tally.overloaded.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tally.other_errors.lock().push(format!("{e:?}")),
                }
            }
        }));
    }
    {
        let client = broker.client().await;
        let (stop, tally) = (stop.clone(), steady.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) {
                let m = Message::new(format!("steady-{n}"));
                match client.publish("b", NS, STREAM, m, AckMode::Batch).await {
                    Ok(Some(p)) => {
                        assert_eq!(p.base_offset, n, "tenant b's records land in order");
                        tally.acked.fetch_add(1, Ordering::Relaxed);
                        n += 1;
                    }
                    Ok(None) => tally
                        .other_errors
                        .lock()
                        .push("an acked publish was not acknowledged".into()),
                    Err(ClientError::Broker(body)) if body.code == codes::OVERLOADED => {
                        tally.overloaded.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tally.other_errors.lock().push(format!("{e:?}")),
                }
            }
        }));
    }

    // Flood until the broker has turned tenant a away (refused or shed) and tenant b has
    // published steadily beside it; give up after a generous while.
    let deadline = tokio::time::Instant::now() + 2 * PATIENCE;
    let mut text;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        text = broker.metrics().await;
        let (a_full, _) = queue_full(&text, "a");
        let turned_away = flood.overloaded.load(Ordering::Relaxed) > 0
            || metric_lines(&text, "felix_tenant_publish_queue_full_total")
                .iter()
                .any(|l| {
                    l.contains("tenant=\"a\"")
                        && l.contains("action=\"shed\"")
                        && metric_value(l) > 0.0
                });
        let b_done = steady.acked.load(Ordering::Relaxed) >= STEADY_PUBLISHES;
        if a_full > 0.0 && turned_away && b_done {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            stop.store(true, Ordering::Release);
            panic!(
                "after {:?}: tenant a queue-full {a_full}, refused {}, turned away {turned_away}; tenant b acked {}\n{}",
                2 * PATIENCE,
                flood.overloaded.load(Ordering::Relaxed),
                steady.acked.load(Ordering::Relaxed),
                metric_lines(&text, "felix_tenant_publish_queue_full_total").join("\n")
            );
        }
    }
    stop.store(true, Ordering::Release);
    for t in tasks {
        t.await.expect("publishing task");
    }
    let text = broker.metrics().await;
    eprintln!(
        "tenant a: {} acknowledged, {} refused as overloaded; tenant b: {} acknowledged\n{}",
        flood.acked.load(Ordering::Relaxed),
        flood.overloaded.load(Ordering::Relaxed),
        steady.acked.load(Ordering::Relaxed),
        metric_lines(&text, "felix_tenant_publish_queue_full_total").join("\n")
    );

    let flood_errors = flood.other_errors.lock();
    assert!(
        flood_errors.is_empty(),
        "tenant a saw errors other than overloaded: {flood_errors:#?}"
    );
    let steady_errors = steady.other_errors.lock();
    assert!(
        steady_errors.is_empty(),
        "tenant b's publishes failed: {steady_errors:#?}"
    );
    assert_eq!(
        steady.overloaded.load(Ordering::Relaxed),
        0,
        "tenant b was refused as overloaded while tenant a flooded"
    );
    let (a_full, _) = queue_full(&text, "a");
    assert!(a_full > 0.0, "tenant a's queue was full at some point");
    // Tenant b's series exist from the start (at 0): every one of them must still be 0.
    let (b_full, b_lines) = queue_full(&text, "b");
    assert!(
        b_full == 0.0,
        "tenant b's queue was never full: {b_lines:?}"
    );
}

/// Records the stream's one shard holds before a commit-acked marker published now: its
/// offset. Everything the broker took before is written by the time the marker is.
async fn records_before_marker(client: &felix_client::Connection, tenant: &str) -> u64 {
    client
        .publish(tenant, NS, STREAM, Message::new("marker"), AckMode::Commit)
        .await
        .expect("marker publish")
        .expect("a commit-acked publish is acknowledged")
        .base_offset
}

/// The `felix_tenant_publish_queue_full_total` count for one tenant and action.
fn queue_full_count(text: &str, tenant: &str, action: &str) -> f64 {
    metric_lines(text, "felix_tenant_publish_queue_full_total")
        .iter()
        .filter(|l| {
            l.contains(&format!("tenant=\"{tenant}\""))
                && l.contains(&format!("action=\"{action}\""))
        })
        .map(|l| metric_value(l))
        .sum()
}

/// Asserts `e` is the spec's retryable refusal: `overloaded`, reason (top level and
/// `detail.reason`) `publish_queue_full`, with `retry_after_ms`.
fn assert_retryable_queue_full(e: &felix_client::ErrorBody) {
    assert_eq!(e.code, codes::OVERLOADED, "{e}");
    assert_eq!(e.reason, "publish_queue_full", "{e}");
    assert_eq!(
        e.detail.as_ref().map(|d| d.reason.as_str()),
        Some("publish_queue_full"),
        "the reason is also given as detail.reason: {e:?}"
    );
    assert!(e.retry_after_ms.is_some(), "retryable: {e}");
}

/// Spec ("Publisher queue"), on one broker with one publish slot per tenant and publishes
/// that would wait a minute for room:
/// 1. an enqueue-acked publish that finds no room is answered at once with the retryable
///    `overloaded` (`detail.reason = "publish_queue_full"`), and nothing of it was queued;
/// 2. with `pub_ingress_wait`, a fire-and-forget publish waits for room instead of being
///    shed, so every record lands;
/// 3. past 1,024 answers owed on a connection (every request being its own QUIC stream,
///    the limit is per connection), the next acked publish is refused with the same
///    retryable `overloaded` before it is queued.
///
/// Each refusal or wait is counted in `felix_tenant_publish_queue_full_total{tenant,action}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_without_room_are_refused_at_once_wait_with_pub_ingress_wait_or_are_refused_past_1024_answers_owed()
 {
    let broker = Broker::start(
        BrokerOptions::new()
            .fsync("on_commit")
            .env("FELIX_ACK_ON_COMMIT", 0)
            .env("FELIX_PUB_QUEUE_DEPTH", 1)
            .env("FELIX_PUBLISH_QUEUE_WAIT_TIMEOUT_MS", 60_000)
            .env("FELIX_PUB_INGRESS_WAIT", 1),
    )
    .await;
    let admin = broker.client().await;
    let payload = Bytes::from(vec![b'p'; 64 * 1024]);
    let clients = [broker.client().await, broker.client().await];

    // 1. Enqueue-acked publishes (`batch` on a broker that acks on enqueue) race for the one
    // slot until one is refused. Were it made to wait, it would wait a minute and pass.
    durable_stream(&admin, "enq", NS, STREAM, 1).await;
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let refusal = Arc::new(Mutex::new(None));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let client = clients[t % 2].clone();
        let (stop, acked, refusal, payload) = (
            stop.clone(),
            acked.clone(),
            refusal.clone(),
            payload.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                let m = Message::new(payload.clone());
                match client.publish("enq", NS, STREAM, m, AckMode::Batch).await {
                    Ok(_) => {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(ClientError::Broker(body)) => {
                        *refusal.lock() = Some(body);
                        stop.store(true, Ordering::Release);
                    }
                    Err(e) => panic!("enqueue-acked publish: {e:?}"),
                }
            }
        }));
    }
    let finished = tokio::time::timeout(PATIENCE, async {
        for t in tasks {
            t.await.expect("publishing task");
        }
    })
    .await;
    stop.store(true, Ordering::Release);
    assert!(
        finished.is_ok(),
        "no enqueue-acked publish was refused within {PATIENCE:?} ({} acknowledged): \
         did one wait for room?",
        acked.load(Ordering::Relaxed)
    );
    let body = refusal.lock().take().expect("a refusal");
    assert_retryable_queue_full(&body);
    // Nothing of a refused publish was queued: the log holds exactly the acknowledged ones.
    assert_eq!(
        records_before_marker(&admin, "enq").await,
        acked.load(Ordering::Relaxed)
    );
    let text = broker.metrics().await;
    assert!(queue_full_count(&text, "enq", "rejected") >= 1.0);
    assert_eq!(
        queue_full_count(&text, "enq", "waited"),
        0.0,
        "an enqueue-acked publish never waits for room"
    );

    // 2. Fire-and-forget publishes race for the slot until one has had to wait; none is
    // shed, so every record published lands.
    durable_stream(&admin, "faf", NS, STREAM, 1).await;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let client = clients[t % 2].clone();
        let (stop, sent, payload) = (stop.clone(), sent.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                let m = Message::new(payload.clone());
                client
                    .publish("faf", NS, STREAM, m, AckMode::None)
                    .await
                    .expect("fire-and-forget publish");
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = broker.metrics().await;
        assert_eq!(
            queue_full_count(&text, "faf", "shed"),
            0.0,
            "a fire-and-forget publish was shed under pub_ingress_wait"
        );
        if queue_full_count(&text, "faf", "waited") >= 1.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no fire-and-forget publish found the slot taken"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Release);
    for t in tasks {
        t.await.expect("publishing task");
    }
    // Each publish returned once the broker had taken it; all of them are written.
    let sent = sent.load(Ordering::Relaxed);
    assert_eq!(records_before_marker(&admin, "faf").await, sent);
    assert_eq!(
        queue_full_count(&broker.metrics().await, "faf", "shed"),
        0.0
    );

    // 3. More commit-acked publishes than a connection may owe answers for, all arriving
    // at once: the broker is paused while the client sends them, then let go. They queue
    // behind the one slot, each waiting its turn to be written, so the broker owes more
    // than 1,024 answers before it has given many.
    const OWED: usize = 2_000;
    durable_stream(&admin, "owed", NS, STREAM, 1).await;
    // A connection that has carried the floods above: its congestion window is open, so
    // its requests go out together rather than a slow-start window at a time.
    let client = clients[0].clone();
    broker.pause(true);
    let mut tasks = Vec::new();
    for i in 0..OWED {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let m = Message::new(format!("owed-{i}"));
            client.publish("owed", NS, STREAM, m, AckMode::Commit).await
        }));
    }
    // Let the client put its requests on the wire (how long does not matter to what is
    // checked: requests that arrive later are just answered sooner).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    broker.pause(false);
    let (mut acked, mut refused) = (0u64, 0u64);
    for t in tasks {
        match t.await.expect("publishing task") {
            Ok(Some(_)) => acked += 1,
            Ok(None) => panic!("a commit-acked publish was not acknowledged"),
            Err(ClientError::Broker(body)) => {
                assert_retryable_queue_full(&body);
                refused += 1;
            }
            Err(e) => panic!("commit-acked publish: {e:?}"),
        }
    }
    eprintln!("{OWED} commit-acked publishes at once: {acked} acknowledged, {refused} refused");
    assert!(
        refused >= 1,
        "no publish was refused with {OWED} answers owed on one connection"
    );
    // Refused before queueing: the log holds exactly the acknowledged ones.
    assert_eq!(records_before_marker(&admin, "owed").await, acked);
    assert_eq!(
        queue_full_count(&broker.metrics().await, "owed", "rejected"),
        refused as f64
    );
}
