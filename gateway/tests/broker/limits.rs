//! Bounded memory per client (issue: never silently wrong, item 7): Kafka connections that
//! declare large requests and stall hold no more than the broker's in-flight budget, and a
//! listener past `max_connections` refuses more, while a well-behaved client is served.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::common::{Broker, BrokerOptions, metric_lines, metric_value};

const MIB: usize = 1 << 20;
const STALLED: usize = 40;
const BUDGET: usize = 32 * MIB;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_large_kafka_requests_hold_at_most_the_inflight_budget() {
    let broker = Broker::start(
        BrokerOptions::new()
            .env("FELIX_MAX_INFLIGHT_REQUEST_BYTES", BUDGET)
            .env("FELIX_MAX_CONNECTIONS", STALLED + 2),
    )
    .await;
    let before = broker.rss_bytes();
    // Each declares a 16 MiB request and sends half of it, then stalls.
    let mut held = Vec::new();
    for _ in 0..STALLED {
        let mut c = TcpStream::connect(broker.kafka_addr)
            .await
            .expect("connect");
        c.write_all(&(16 * MIB as u32).to_be_bytes()).await.unwrap();
        held.push(c);
    }
    let chunk = vec![7u8; 256 * 1024];
    let sends = held.iter_mut().map(|c| async {
        // A connection the broker does not read fills its socket buffers and stalls here.
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            for _ in 0..32 {
                c.write_all(&chunk).await?;
            }
            Ok::<_, std::io::Error>(())
        })
        .await;
    });
    futures::future::join_all(sends).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = broker.rss_bytes().saturating_sub(before);
    // The budget, plus buffer growth and socket bookkeeping: far below the 320 MiB the
    // stalled connections sent between them.
    assert!(
        grown < (BUDGET * 3) as u64,
        "RSS grew by {} MiB with {STALLED} stalled 16 MiB requests (budget {} MiB)",
        grown >> 20,
        BUDGET >> 20
    );
    let metrics = broker.metrics().await;
    let inflight: f64 = metric_lines(&metrics, "felix_kafka_inflight_request_bytes")
        .iter()
        .map(|l| metric_value(l))
        .sum();
    assert!(inflight <= BUDGET as f64 + 1.0, "in flight: {inflight}");

    // The listener is full except for two places: one more gets in, then it is refused.
    let _last = TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect");
    let mut _spare = TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect");
    let mut refused = TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect");
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), refused.read(&mut byte))
        .await
        .expect("the refused connection is closed at once");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "a connection past max_connections is closed: {read:?}"
    );
    let metrics = broker.metrics().await;
    let refused_total: f64 = metric_lines(&metrics, "felix_connections_refused_total")
        .iter()
        .filter(|l| l.contains("listener=\"kafka\""))
        .map(|l| metric_value(l))
        .sum();
    assert!(refused_total >= 1.0, "{metrics}");

    // Closing the stalled connections frees their share.
    drop(held);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = broker.metrics().await;
        let inflight: f64 = metric_lines(&metrics, "felix_kafka_inflight_request_bytes")
            .iter()
            .map(|l| metric_value(l))
            .sum();
        if inflight == 0.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "in-flight bytes not released: {inflight}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_listener_past_max_connections_refuses_and_recovers() {
    let broker = Broker::start(BrokerOptions::new().env("FELIX_MAX_CONNECTIONS", 3)).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(broker.client().await);
    }
    let config = || felix_client::ClientConfig {
        request_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let refused = felix_client::Connection::connect(&broker.quic_addr.to_string(), config()).await;
    assert!(
        refused.is_err(),
        "a fourth connection is refused: {:?}",
        refused.map(|_| ())
    );
    let metrics = broker.metrics().await;
    assert!(
        metric_lines(&metrics, "felix_connections_refused_total")
            .iter()
            .any(|l| l.contains("listener=\"quic\"") && metric_value(l) >= 1.0),
        "{metrics}"
    );
    // A place frees once a client leaves.
    held.pop().unwrap().close().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match felix_client::Connection::connect(&broker.quic_addr.to_string(), config()).await {
            Ok(_) => break,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no place after a client left: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
