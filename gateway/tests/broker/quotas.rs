//! Per-tenant publish quotas (spec: "Quota Enforcement"): a tenant publishing faster than its
//! rate on a broker is refused `overloaded` with reason `tenant_quota` and a
//! `retry_after_ms`, and a refused publish writes nothing; another tenant on the same broker
//! is never refused meanwhile; a tenant named in `FELIX_TENANT_PUBLISH_QUOTAS` gets its own
//! rate for the kinds it names and the default for the rest; a batch above one second's
//! burst goes through and its debt pushes the next publishes back; a fire-and-forget publish
//! over quota is shed; a cluster client waits a refusal out and succeeds; every refusal and
//! shed is counted in `felix_tenant_quota_throttled_total`. A Kafka producer over quota is
//! answered with `throttle_time_ms` and slowed down, never refused, and every message is
//! stored exactly once. In a cluster, a forwarded publish is charged once, where the client
//! sent it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use felix_client::{
    AckMode, ClientConfig, ClientError, ClusterClient, Connection, Message, StartAt, StreamConfig,
    codes,
};
use serde_json::Value;

use super::cluster::Cluster;
use super::common::{
    Broker, BrokerOptions, assert_contiguous, durable_stream, metric_lines, metric_value,
    read_until, shard_leader,
};
use super::kafka::python;

const NS: &str = "ns";
const STREAM: &str = "s";
/// Every tenant's default rate on the broker under test: 1 MB/s (the burst is as much).
const RATE: u64 = 1_000_000;
/// Offered by the flooding tenant: 8 publishers, each a 64 KiB batch every 50 ms (~10 MB/s).
const FLOOD_PUBLISHERS: usize = 8;
const FLOOD_RECORDS: usize = 4;
const FLOOD_RECORD_BYTES: usize = 16 * 1024;
const FLOOD_EVERY: Duration = Duration::from_millis(50);
const FLOOD_FOR: Duration = Duration::from_secs(3);

/// `felix_tenant_quota_throttled_total{tenant,action}`, or `None` when the series is absent.
fn throttled(text: &str, tenant: &str, action: &str) -> Option<f64> {
    metric_lines(text, "felix_tenant_quota_throttled_total")
        .into_iter()
        .find(|l| {
            l.contains(&format!("tenant=\"{tenant}\""))
                && l.contains(&format!("action=\"{action}\""))
        })
        .map(metric_value)
}

/// What one flooding publisher saw: the acknowledged batches (base offset, record ids) and
/// the refusals.
#[derive(Default)]
struct FloodTally {
    acked: Vec<(u64, Vec<String>)>,
    refused: u64,
    other_errors: Vec<String>,
}

/// The payload of flood record `id`: its id, padded to [`FLOOD_RECORD_BYTES`].
fn flood_payload(id: &str) -> Bytes {
    let mut p = id.as_bytes().to_vec();
    p.resize(FLOOD_RECORD_BYTES, b'.');
    Bytes::from(p)
}

fn id_of(payload: &[u8]) -> String {
    String::from_utf8_lossy(payload)
        .trim_end_matches('.')
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_publish_rate_is_refused_and_writes_nothing_while_others_publish() {
    let broker = Broker::start(
        BrokerOptions::new()
            .env("FELIX_TENANT_PUBLISH_BYTES_PER_SEC", "1MB/s")
            // `tiny`: bytes overridden; `few`: records overridden, bytes on the default.
            .env("FELIX_TENANT_PUBLISH_QUOTAS", "tiny=1KiB/s, few=10msg/s"),
    )
    .await;
    let admin = broker.client().await;
    for tenant in ["flood", "calm", "tiny", "few"] {
        durable_stream(&admin, tenant, NS, STREAM, 1).await;
    }

    // 1. `flood` offers ten times its rate from several connections; `calm`, on the same
    //    default rate, publishes well under it at the same time.
    let stop = Arc::new(AtomicBool::new(false));
    let started = tokio::time::Instant::now();
    let mut floods = Vec::new();
    let connections = [broker.client().await, broker.client().await];
    for p in 0..FLOOD_PUBLISHERS {
        let client = connections[p % connections.len()].clone();
        floods.push(tokio::spawn(async move {
            let mut tally = FloodTally::default();
            let mut tick = tokio::time::interval(FLOOD_EVERY);
            let mut n = 0;
            while started.elapsed() < FLOOD_FOR {
                tick.tick().await;
                let ids: Vec<String> = (0..FLOOD_RECORDS)
                    .map(|r| format!("p{p}-b{n}-r{r}"))
                    .collect();
                n += 1;
                let messages = ids
                    .iter()
                    .map(|id| Message::new(flood_payload(id)))
                    .collect();
                match client
                    .publish_batch("flood", NS, STREAM, messages, AckMode::Batch)
                    .await
                {
                    Ok(acks) => tally.acked.push((acks[0].base_offset, ids)),
                    Err(ClientError::Broker(body)) if body.reason == "tenant_quota" => {
                        assert_eq!(body.code, codes::OVERLOADED, "{body}");
                        assert!(body.retry_after_ms.is_some_and(|ms| ms > 0), "{body}");
                        tally.refused += 1;
                    }
                    Err(e) => tally.other_errors.push(format!("{e:?}")),
                }
            }
            tally
        }));
    }
    let calm = {
        let (client, stop) = (broker.client().await, stop.clone());
        tokio::spawn(async move {
            let (mut acked, mut errors) = (0u64, Vec::new());
            while !stop.load(Ordering::Acquire) {
                let m = Message::new(vec![b'c'; 1024]);
                match client.publish("calm", NS, STREAM, m, AckMode::Batch).await {
                    Ok(_) => acked += 1,
                    Err(e) => errors.push(format!("{e:?}")),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (acked, errors)
        })
    };
    let mut tallies = Vec::new();
    for f in floods {
        tallies.push(f.await.expect("flooding publisher"));
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Release);
    let (calm_acked, calm_errors) = calm.await.expect("calm publisher");

    let other: Vec<&String> = tallies.iter().flat_map(|t| &t.other_errors).collect();
    assert!(
        other.is_empty(),
        "flood saw errors other than tenant_quota: {other:#?}"
    );
    assert!(
        calm_errors.is_empty(),
        "calm was refused while flood flooded: {calm_errors:#?}"
    );
    assert!(calm_acked > 0, "calm published nothing");
    let refused: u64 = tallies.iter().map(|t| t.refused).sum();
    let acked: Vec<&(u64, Vec<String>)> = tallies.iter().flat_map(|t| &t.acked).collect();
    let accepted_bytes = (acked.len() * FLOOD_RECORDS * FLOOD_RECORD_BYTES) as f64;
    eprintln!(
        "flood: {} batches acknowledged ({accepted_bytes} payload bytes), {refused} refused in {elapsed:?}; calm: {calm_acked} acknowledged",
        acked.len()
    );
    assert!(
        refused > 0,
        "offering ten times its rate, flood was never refused"
    );
    // The payload is less than the batches' bytes the bucket counts, so this bounds it too.
    let bound = 2.0 * RATE as f64 * elapsed.as_secs_f64() + RATE as f64;
    assert!(
        accepted_bytes <= bound,
        "flood got {accepted_bytes} bytes through at {RATE} B/s in {elapsed:?} (bound {bound})"
    );

    // Every refused publish wrote nothing: the log holds exactly the acknowledged records,
    // densely, each where its acknowledgement said.
    let records = (acked.len() * FLOOD_RECORDS) as u64;
    let mut sub = admin
        .subscribe("flood", NS, STREAM, 0, StartAt::Earliest)
        .await
        .expect("subscribe to flood");
    let events = read_until(&mut sub, records, "flood's acknowledged records").await;
    assert_contiguous(&events, 0, "flood");
    for (base, ids) in &acked {
        for (i, id) in ids.iter().enumerate() {
            let e = &events[*base as usize + i];
            assert_eq!(&id_of(&e.payload), id, "offset {}", e.offset);
        }
    }
    let marker = publish_until_admitted(&admin, ("flood", NS, STREAM)).await;
    assert_eq!(
        marker, records,
        "records beyond the acknowledged ones were written"
    );

    // 2. Overrides: `few` is limited to 10 records/s and keeps the default byte rate. A batch
    //    above the burst (30 records) goes through on a full bucket; its debt refuses the next.
    let thirty: Vec<Message> = (0..30).map(|i| Message::new(format!("few-{i}"))).collect();
    admin
        .publish_batch("few", NS, STREAM, thirty, AckMode::Batch)
        .await
        .expect("a batch above the burst is admitted on a full bucket");
    let refusal = expect_tenant_quota(
        admin
            .publish("few", NS, STREAM, Message::new("next"), AckMode::Batch)
            .await,
    );
    assert!(
        refusal.message.contains("10 records/s") && refusal.message.contains("1000000 bytes/s"),
        "few's own record rate and the default byte rate: {refusal}"
    );

    // 3. `tiny` is limited to 1 KiB/s: a 4 KiB batch goes through on the full bucket and
    //    leaves 3 KiB of debt, so the next acknowledged publish is refused for seconds, a
    //    fire-and-forget one is shed, and a cluster client's publish waits the refusal out.
    let first = admin
        .publish(
            "tiny",
            NS,
            STREAM,
            Message::new(vec![b't'; 4096]),
            AckMode::Batch,
        )
        .await
        .expect("the oversized batch is admitted")
        .expect("acknowledged");
    assert_eq!(first.base_offset, 0);
    let refusal = expect_tenant_quota(
        admin
            .publish("tiny", NS, STREAM, Message::new("refused"), AckMode::Batch)
            .await,
    );
    let wait = refusal.retry_after_ms.expect("retry_after_ms");
    assert!(
        wait > 1000,
        "3 KiB of debt at 1 KiB/s is seconds away: {refusal}"
    );
    admin
        .publish("tiny", NS, STREAM, Message::new("shed"), AckMode::None)
        .await
        .expect("a fire-and-forget publish over quota is shed, not refused");
    let cluster = ClusterClient::connect(
        [broker.quic_addr.to_string()],
        ClientConfig {
            request_timeout: Duration::from_secs(30),
            ..ClientConfig::default()
        },
    )
    .await
    .expect("cluster client");
    let retried = cluster
        .publish("tiny", NS, STREAM, Message::new("retried"), AckMode::Batch)
        .await
        .expect("the cluster client waits out tenant_quota and succeeds")
        .expect("acknowledged");
    assert_eq!(
        retried.base_offset, 1,
        "neither the refused nor the shed publish was written"
    );
    let mut sub = admin
        .subscribe("tiny", NS, STREAM, 0, StartAt::Earliest)
        .await
        .expect("subscribe to tiny");
    let events = read_until(&mut sub, 2, "tiny").await;
    assert_eq!(&events[1].payload[..], b"retried");

    // 4. The metric counts them, by tenant and action; calm's series exist, at 0.
    let text = broker.metrics().await;
    let flood_refused = throttled(&text, "flood", "refused").expect("flood's refused series");
    // The marker above may have been refused a few times too.
    assert!(
        flood_refused >= refused as f64,
        "{flood_refused} < {refused}"
    );
    // The direct refusal and the cluster client's first try, at least.
    assert!(
        throttled(&text, "tiny", "refused").is_some_and(|n| n >= 2.0),
        "{text}"
    );
    assert!(
        throttled(&text, "tiny", "shed").is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert!(
        throttled(&text, "few", "refused").is_some_and(|n| n >= 1.0),
        "{text}"
    );
    for action in ["refused", "shed", "kafka_throttled"] {
        assert_eq!(throttled(&text, "calm", action), Some(0.0), "calm {action}");
    }
}

/// The refusal in `result`, which must be `overloaded` for `tenant_quota` with a wait.
fn expect_tenant_quota<T: std::fmt::Debug>(
    result: Result<T, ClientError>,
) -> felix_client::ErrorBody {
    match result {
        Err(ClientError::Broker(body)) => {
            assert_eq!(body.code, codes::OVERLOADED, "{body}");
            assert_eq!(body.reason, "tenant_quota", "{body}");
            assert!(body.retry_after_ms.is_some_and(|ms| ms > 0), "{body}");
            body
        }
        other => panic!("expected a tenant_quota refusal, got {other:?}"),
    }
}

/// Publishes a one-record marker, waiting out `tenant_quota` refusals as asked; its offset.
async fn publish_until_admitted(
    client: &Connection,
    (tenant, ns, stream): (&str, &str, &str),
) -> u64 {
    loop {
        match client
            .publish(tenant, ns, stream, Message::new("marker"), AckMode::Batch)
            .await
        {
            Ok(Some(p)) => return p.base_offset,
            Err(ClientError::Broker(body)) if body.reason == "tenant_quota" => {
                let ms = body.retry_after_ms.unwrap_or(100);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            other => panic!("marker publish: {other:?}"),
        }
    }
}

/// Kafka messages produced over quota, and the size of each.
const KAFKA_MESSAGES: usize = 600;
const KAFKA_VALUE_BYTES: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_producer_over_its_quota_is_throttled_and_stores_every_message_once() {
    // The Kafka listener's tenant is `default`: 100 KB/s, so 600 KB take seconds.
    let broker =
        Broker::start(BrokerOptions::new().env("FELIX_TENANT_PUBLISH_QUOTAS", "default=100KB/s"))
            .await;
    let bootstrap = broker.kafka_addr.to_string();
    let produced = python(&[
        "produce",
        &bootstrap,
        "metered",
        &KAFKA_MESSAGES.to_string(),
        "--partitions",
        "1",
        "--batch",
        "20",
        "--value-bytes",
        &KAFKA_VALUE_BYTES.to_string(),
    ])
    .await;
    assert_eq!(produced["errors"], Value::Array(vec![]), "{produced}");
    assert_eq!(produced["unflushed"], 0, "{produced}");
    let throttles = produced["throttles_ms"].as_array().expect("throttles_ms");
    eprintln!(
        "librdkafka reported {} throttles: {throttles:?}",
        throttles.len()
    );
    assert!(
        throttles
            .iter()
            .any(|t| t.as_i64().is_some_and(|ms| ms > 0)),
        "producing 600 KB at 100 KB/s, librdkafka reported no throttle: {produced}"
    );
    let delivered = produced["delivered"].as_array().expect("delivered");
    assert_eq!(delivered.len(), KAFKA_MESSAGES, "{produced}");

    // Stored exactly once: every key once among the first 600 records, and nothing after
    // them (a Felix publish lands at offset 600).
    let read = python(&[
        "consume",
        &bootstrap,
        "metered",
        &KAFKA_MESSAGES.to_string(),
    ])
    .await;
    let keys: BTreeSet<String> = read
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["k"].as_str().expect("key").to_owned())
        .collect();
    let expected: BTreeSet<String> = (0..KAFKA_MESSAGES).map(|i| format!("key-{i}")).collect();
    assert_eq!(keys, expected, "every produced message, once");
    let admin = broker.client().await;
    let marker = publish_until_admitted(&admin, ("default", "default", "metered")).await;
    assert_eq!(marker, KAFKA_MESSAGES as u64, "duplicates were stored");

    let text = broker.metrics().await;
    assert!(
        throttled(&text, "default", "kafka_throttled").is_some_and(|n| n > 0.0),
        "{:?}",
        metric_lines(&text, "felix_tenant_quota_throttled_total")
    );
}

/// In a cluster, a publish sent to a broker that does not lead its shard is charged to the
/// tenant's quota there, once: the leader it is forwarded to does not charge it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_publish_is_charged_once_by_the_broker_the_client_sent_it_to() {
    let mut cluster =
        Cluster::start_with(3, 1500, &[("FELIX_TENANT_PUBLISH_QUOTAS", "fwd=1KiB/s")]).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    client.create_tenant("fwd").await.expect("create tenant");
    client
        .create_namespace("fwd", NS)
        .await
        .expect("create namespace");
    client
        .create_stream(
            "fwd",
            NS,
            STREAM,
            StreamConfig {
                durable: Some(true),
                shards: Some(1),
                replicas: Some(3),
                ..StreamConfig::default()
            },
        )
        .await
        .expect("create stream");
    let leader = shard_leader(&client, ("fwd", NS, STREAM), None).await;
    let follower = (1..=3).find(|b| *b != leader).expect("a follower");

    // 4 KiB through the follower: admitted on its full bucket, forwarded, 3 KiB of debt there.
    let via_follower = cluster.node(follower).client().await;
    let first = via_follower
        .publish(
            "fwd",
            NS,
            STREAM,
            Message::new(vec![b'f'; 4096]),
            AckMode::Batch,
        )
        .await
        .expect("forwarded")
        .expect("acknowledged");
    assert_eq!(first.base_offset, 0);
    expect_tenant_quota(
        via_follower
            .publish("fwd", NS, STREAM, Message::new("refused"), AckMode::Batch)
            .await,
    );
    // The leader's bucket was not charged for the forwarded 4 KiB: it takes a publish at once.
    let at_leader = cluster.node(leader).client().await;
    let second = at_leader
        .publish(
            "fwd",
            NS,
            STREAM,
            Message::new(vec![b'l'; 512]),
            AckMode::Batch,
        )
        .await
        .expect("the leader did not charge the forwarded publish")
        .expect("acknowledged");
    assert_eq!(second.base_offset, 1, "the refused publish wrote nothing");

    let on_follower = cluster.node(follower).metrics().await;
    let on_leader = cluster.node(leader).metrics().await;
    assert_eq!(throttled(&on_follower, "fwd", "refused"), Some(1.0));
    assert_eq!(throttled(&on_leader, "fwd", "refused"), Some(0.0));
}
