//! Publisher backpressure (spec: "Publisher queue"): every tenant has its own publish slots,
//! so one tenant flooding the broker fills only its own share. Tenant `a` floods with many
//! concurrent publishers (commit-acked and fire-and-forget) against a small queue; tenant `b`
//! publishes steadily with acknowledgements throughout and is never refused as overloaded.
//! The broker's `felix_tenant_publish_queue_full_total` names `a` and never `b`.

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
                .any(|l| l.contains("tenant=\"a\"") && l.contains("action=\"shed\""));
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
    let (b_full, b_lines) = queue_full(&text, "b");
    assert!(
        b_lines.is_empty() && b_full == 0.0,
        "tenant b's queue was never full: {b_lines:?}"
    );
}
