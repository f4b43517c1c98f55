//! Leases, the quorum mark and a broker cut off from the control plane, on one 3-broker
//! cluster (spec: "Consistency", "How Quorum is enforced", "What each one costs", "What a
//! reader sees of a Quorum stream", "Multi-Broker Consistency", "Broker-Control Plane
//! partition"). One cluster walks through every step, each commented with the promise it
//! holds: cluster tests are the most expensive ones.
//!
//! The brokers answer publishes on enqueue (`FELIX_ACK_ON_COMMIT=0`) and give up on a quorum
//! after one second. A broker is cut off the internal network (and so from the control
//! plane) with the fault-injection route, and its log writes can be held to outlast its
//! lease.

use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use felix_client::{
    AckMode, ClientError, ClusterClient, Connection, Event, GroupConfig, GroupConsumer, GroupStart,
    Message, StartAt, StreamConfig, codes,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::cluster::{Cluster, set_isolated};
use super::common::{Broker, PATIENCE, http_request, metric_lines, metric_value, shard_leader};

/// Long enough for the checks a cut-off broker must pass while its lease still holds, short
/// enough that a lapse takes seconds.
const LEASE_MS: u64 = 3000;
/// The Kafka listener's tenant and namespace, so one stream is readable both ways.
const T: &str = "default";
const NS: &str = "default";

async fn create(client: &ClusterClient, name: &str, consistency: &str, replicas: u32) {
    match client.create_namespace(T, NS).await {
        Ok(()) => {}
        Err(ClientError::Broker(e)) if e.code == codes::ALREADY_EXISTS => {}
        Err(ClientError::Broker(e)) if e.code == codes::UNKNOWN_TENANT => {
            client.create_tenant(T).await.expect("create tenant");
            client.create_namespace(T, NS).await.expect("create ns");
        }
        Err(e) => panic!("create namespace: {e}"),
    }
    let config = StreamConfig {
        durable: Some(true),
        shards: Some(1),
        replicas: Some(replicas),
        consistency: Some(consistency.into()),
        ..StreamConfig::default()
    };
    client
        .create_stream(T, NS, name, config)
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

/// The shard's leader as the cluster client sees it, once it is not `not`.
async fn leader_of(client: &ClusterClient, stream: &str, not: Option<u64>) -> u64 {
    shard_leader(client, (T, NS, stream), not).await
}

/// `prefix-0..n`, one acknowledged publish each, through an idempotent producer (a publish
/// whose outcome was unknown is re-sent and still lands once).
async fn publish_n(client: &ClusterClient, stream: &str, prefix: &str, n: usize) {
    let producer = client.idempotent_producer().await.expect("producer id");
    for i in 0..n {
        producer
            .publish_to_shard(T, NS, stream, 0, &[Message::new(format!("{prefix}-{i}"))])
            .await
            .unwrap_or_else(|e| panic!("{stream}: publish {prefix}-{i}: {e}"));
    }
}

async fn publish_one(client: &Connection, stream: &str, payload: &str) -> Result<u64, ClientError> {
    let message = Message::new(payload.to_owned());
    let published = client
        .publish_batch(T, NS, stream, vec![message], AckMode::Batch)
        .await?;
    Ok(published[0].base_offset)
}

fn text(e: &Event) -> String {
    String::from_utf8_lossy(&e.payload).into_owned()
}

/// Events until the subscription ends; the error it ended with.
async fn until_end(sub: &mut felix_client::Subscription, what: &str) -> (Vec<Event>, ClientError) {
    let mut events = Vec::new();
    loop {
        match tokio::time::timeout(PATIENCE, sub.next_event()).await {
            Err(_) => panic!(
                "{what}: still open after {PATIENCE:?}, {} events",
                events.len()
            ),
            Ok(Ok(Some(e))) => events.push(e),
            Ok(Ok(None)) => panic!("{what}: ended cleanly, without saying why"),
            Ok(Err(e)) => return (events, e),
        }
    }
}

fn code_and_reason(e: &ClientError) -> (u16, String) {
    match e {
        ClientError::Broker(b) => (b.code, b.reason.clone()),
        other => panic!("expected a broker's error, got {other:?}"),
    }
}

pub(super) async fn set_writes_stalled(broker: &Broker, stalled: bool) {
    let method = if stalled { "POST" } else { "DELETE" };
    let (status, body) = http_request(broker.admin_addr, method, "/v1/faults/stall_writes")
        .await
        .expect("the fault-injection route");
    assert_eq!(status, 200, "{method} /v1/faults/stall_writes: {body}");
}

async fn acked_publishes_dropped(broker: &Broker) -> f64 {
    let metrics = broker.metrics().await;
    metric_lines(&metrics, "felix_broker_acked_publishes_dropped_total")
        .first()
        .map_or(0.0, |l| metric_value(l))
}

/// How long the broker's lease still holds, from its metrics.
async fn lease_remaining(broker: &Broker) -> Duration {
    let metrics = broker.metrics().await;
    let line = metric_lines(&metrics, "felix_broker_lease_remaining_seconds");
    Duration::from_secs_f64(line.first().map_or(0.0, |l| metric_value(l)))
}

/// Waits until the broker's lease holds more (`above`) or less than `bound`: renewals are
/// steady again after a heal (each leaves at least three quarters of the lease), or the cut
/// has eaten into it.
pub(super) async fn await_lease(broker: &Broker, above: bool, bound: Duration) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while (lease_remaining(broker).await > bound) != above {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease never went {} {bound:?}",
            if above { "above" } else { "below" }
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Kafka Fetch (v4) of partition 0 from `offset`, as a Kafka consumer sends it (encoded
/// here by hand: the protocol crate is built for the broker's side only): the high
/// watermark and the records answered, as (offset, value).
async fn kafka_fetch(broker: &Broker, topic: &str, offset: i64) -> (i64, Vec<(i64, String)>) {
    let mut frame = BytesMut::new();
    frame.put_i16(1); // Fetch
    frame.put_i16(4);
    frame.put_i32(7); // correlation id
    frame.put_i16(-1); // no client id
    frame.put_i32(-1); // replica id: a consumer
    frame.put_i32(0); // max wait
    frame.put_i32(0); // min bytes
    frame.put_i32(1 << 20); // max bytes
    frame.put_i8(0); // read uncommitted: still bounded by the high watermark
    frame.put_i32(1);
    frame.put_i16(topic.len() as i16);
    frame.put_slice(topic.as_bytes());
    frame.put_i32(1);
    frame.put_i32(0); // partition
    frame.put_i64(offset);
    frame.put_i32(1 << 20);
    let mut s = tokio::net::TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect to the Kafka listener");
    s.write_all(&(frame.len() as u32).to_be_bytes())
        .await
        .expect("write");
    s.write_all(&frame).await.expect("write");
    let len = s.read_u32().await.expect("response length");
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).await.expect("response");
    let mut r = bytes::Bytes::from(body);
    assert_eq!(r.get_i32(), 7, "correlation id");
    r.get_i32(); // throttle time
    assert_eq!(r.get_i32(), 1, "one topic");
    let name_len = r.get_i16() as usize;
    r.advance(name_len);
    assert_eq!(r.get_i32(), 1, "one partition");
    assert_eq!(r.get_i32(), 0, "partition 0");
    let error_code = r.get_i16();
    assert_eq!(error_code, 0, "Fetch of {topic}: error {error_code}");
    let high_watermark = r.get_i64();
    r.get_i64(); // last stable offset
    let aborted = r.get_i32();
    r.advance(aborted.max(0) as usize * 16);
    let records_len = r.get_i32().max(0) as usize;
    let batches = r.split_to(records_len);
    let mut records = Vec::new();
    for item in felix_wire::BatchIter::new(&batches, usize::MAX) {
        let (_, batch) = item.expect("a whole batch");
        let decoded = felix_wire::DecodedBatch::decode(batch, 1 << 24).expect("decode");
        for rec in decoded.records {
            let value = String::from_utf8_lossy(&rec.value.unwrap_or_default()).into_owned();
            records.push((rec.offset, value));
        }
    }
    (high_watermark, records)
}

/// Creates group `g` on `stream` from its earliest record, then claims and acknowledges the
/// stream's ten records through it.
async fn group_caught_up(client: &ClusterClient, stream: &str) -> GroupConsumer {
    let config = GroupConfig {
        visibility_timeout_ms: Some(30_000),
        max_attempts: Some(10),
        dead_letter: None,
        start: Some(GroupStart::Earliest),
    };
    client
        .create_group(T, NS, stream, "g", config)
        .await
        .expect("a group on a Quorum stream");
    let mut group = client.group(T, NS, stream, "g");
    let mut offsets = Vec::new();
    while offsets.len() < 10 {
        let records = group
            .poll(10, Duration::from_secs(1))
            .await
            .expect("a poll before the cut");
        group.ack_all(&records).await.expect("acks before the cut");
        offsets.extend(records.iter().map(|r| r.offset));
    }
    assert_eq!(offsets, (0..10).collect::<Vec<u64>>());
    group
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_quorum_marks_failover_and_a_control_plane_partition_keep_their_promises() {
    let mut cluster = Cluster::start_with(
        3,
        LEASE_MS,
        &[
            ("FELIX_ACK_ON_COMMIT", "0"),
            ("FELIX_PUBLISH_QUORUM_TIMEOUT_MS", "1000"),
            // A subscriber that stops reading lags soon (once its QUIC stream is full).
            ("FELIX_SUBSCRIBER_QUEUE_CAPACITY", "4"),
        ],
    )
    .await;
    let client = cluster.client(Duration::from_secs(30)).await;
    // A Leader stream and a Quorum stream led by the same broker X, so one cut hits both.
    create(&client, "lead", "leader", 3).await;
    let x = leader_of(&client, "lead", None).await;
    let mut q = None;
    for i in 0..20 {
        let name = format!("q{i}");
        create(&client, &name, "quorum", 3).await;
        if leader_of(&client, &name, None).await == x {
            q = Some(name);
            break;
        }
    }
    let q = q.expect("a Quorum stream placed on the Leader stream's leader");
    publish_n(&client, "lead", "l", 10).await;
    publish_n(&client, &q, "q", 10).await;
    // A cluster client's subscription, to follow the Quorum shard through its failover.
    let mut follow = client
        .subscribe_shard(T, NS, &q, 0, StartAt::Earliest)
        .await
        .expect("subscribe through the cluster client");
    // A consumer group on the Quorum stream that has claimed and acknowledged all ten records.
    let mut group = group_caught_up(&client, &q).await;
    let mut followed = Vec::new();
    while followed.len() < 10 {
        let e = tokio::time::timeout(PATIENCE, follow.next_event())
            .await
            .expect("records in time")
            .expect("the subscription")
            .expect("not ended");
        followed.push(e);
    }

    // --- X is cut off from the rest of the cluster, and so from the control plane.
    let direct = cluster.node(x).client().await;
    await_lease(
        cluster.node(x),
        true,
        Duration::from_millis(LEASE_MS * 7 / 10),
    )
    .await;
    set_isolated(cluster.node(x), true).await;
    // Creating a stream needs the control plane: a typed, retryable refusal (started now,
    // answered whenever the broker gives up on the control plane).
    let creating = {
        let direct = direct.clone();
        tokio::spawn(async move {
            direct
                .create_stream(T, NS, "new-while-cut", StreamConfig::default())
                .await
        })
    };
    // While its lease holds, X serves the streams it knows from its cached metadata: a
    // publish to the Leader stream it leads, and a subscription reading it back.
    let cached = publish_one(&direct, "lead", "cached").await;
    assert_eq!(
        cached.expect("a publish to a cut-off leader within its lease"),
        10
    );
    let mut lead_sub = direct
        .subscribe(T, NS, "lead", 0, StartAt::Earliest)
        .await
        .expect("subscribe on a cut-off leader within its lease");
    let mut lead_seen = Vec::new();
    while lead_seen.len() < 11 {
        let e = tokio::time::timeout(PATIENCE, lead_sub.next_event())
            .await
            .expect("records in time")
            .expect("the subscription")
            .expect("not ended");
        lead_seen.push(text(&e));
    }
    let mut expected: Vec<String> = (0..10).map(|i| format!("l-{i}")).collect();
    expected.push("cached".into());
    assert_eq!(lead_seen, expected, "a cut-off leader serves what it holds");

    // A Quorum publish X writes but no majority can confirm.
    let during = {
        let direct = direct.clone();
        let q = q.clone();
        tokio::spawn(async move { publish_one(&direct, &q, "during").await })
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let info = direct.describe_stream(T, NS, &q).await.expect("describe");
        if info.shards[0].next_offset == 11 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "X never wrote it");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // What a reader sees of a Quorum stream: a consumer group's poll finds nothing new (X
    // would otherwise claim "during", and that claim could not be confirmed either)...
    let polled = group
        .poll(10, Duration::ZERO)
        .await
        .expect("a poll within the lease finds nothing new (had it claimed \"during\", past the mark, the claim could not be confirmed)");
    let offsets: Vec<u64> = polled.iter().map(|r| r.offset).collect();
    assert!(
        offsets.is_empty(),
        "a group poll reads up to the quorum mark only: {offsets:?}"
    );
    // ...a Kafka fetch stops at the quorum mark, not at the end of the leader's log...
    let (high_watermark, records) = kafka_fetch(cluster.node(x), &q, 0).await;
    assert_eq!(high_watermark, 10, "the high watermark is the quorum mark");
    let expected: Vec<(i64, String)> = (0..10).map(|i| (i, format!("q-{i}"))).collect();
    assert_eq!(records, expected, "a Kafka fetch reads up to the mark only");
    // ...and so does the history of a resumed subscription, which then ends (shard
    // unavailable) when X's lease lapses, having delivered nothing past the mark.
    let mut resumed = direct
        .subscribe(T, NS, &q, 0, StartAt::Offset(5))
        .await
        .expect("resume a subscription within the lease");
    let (events, end) = until_end(&mut resumed, "resumed Quorum subscription").await;
    let got: Vec<(u64, String)> = events.iter().map(|e| (e.offset, text(e))).collect();
    let expected: Vec<(u64, String)> = (5..10).map(|i| (i, format!("q-{i}"))).collect();
    assert_eq!(
        got, expected,
        "a resumed subscription's history stops at the mark"
    );
    assert_eq!(code_and_reason(&end).0, codes::SHARD_UNAVAILABLE, "{end:?}");

    // A Leader stream whose leader's lease lapsed is fenced: its reader is ended...
    let (rest, end) = until_end(&mut lead_sub, "Leader stream subscription").await;
    assert!(rest.is_empty(), "{} more records", rest.len());
    assert_eq!(code_and_reason(&end).0, codes::SHARD_UNAVAILABLE, "{end:?}");
    // ...and its publishes refused, as fenced.
    let refused = publish_one(&direct, "lead", "after-lapse").await;
    let e = refused.expect_err("a Leader stream accepted a write after its lease lapsed");
    assert_eq!(
        code_and_reason(&e),
        (codes::SHARD_UNAVAILABLE, "fenced".into())
    );

    // quorum_timeout carries its code and reason, and the client calls the outcome unknown.
    let e = during
        .await
        .expect("publish task")
        .expect_err("a Quorum publish without a majority was acknowledged");
    assert_eq!(
        code_and_reason(&e),
        (codes::QUORUM_TIMEOUT, "quorum_timeout".into())
    );
    assert_eq!(codes::QUORUM_TIMEOUT, 13);
    assert!(e.outcome_unknown(), "quorum_timeout is an unknown outcome");

    // Creating a stream while cut off failed with a typed error.
    let created = creating.await.expect("create task");
    match created {
        Err(ClientError::Broker(e)) => {
            assert_eq!(e.code, codes::METADATA_UNAVAILABLE, "{e:?}");
            assert!(e.retry_after_ms.is_some(), "{e:?}");
        }
        other => panic!("a stream created without the control plane: {other:?}"),
    }

    // --- The cut heals. The Quorum shard failed over to a follower meanwhile; the cluster
    // client's subscription followed it, with nothing repeated or skipped ("during" was
    // never acknowledged and is dropped by the new leader).
    set_isolated(cluster.node(x), false).await;
    let new_q_leader = leader_of(&client, &q, Some(x)).await;
    publish_n(&client, &q, "after", 10).await;
    while followed.last().is_none_or(|e| text(e) != "after-9") {
        let e = tokio::time::timeout(PATIENCE, follow.next_event())
            .await
            .unwrap_or_else(|_| panic!("followed {} records, then nothing", followed.len()))
            .expect("the subscription survives the failover")
            .expect("not ended");
        followed.push(e);
    }
    let payloads: Vec<String> = followed.iter().map(text).collect();
    let expected: Vec<String> = (0..10)
        .map(|i| format!("q-{i}"))
        .chain((0..10).map(|i| format!("after-{i}")))
        .collect();
    assert_eq!(payloads, expected, "across the failover to {new_q_leader}");
    assert!(
        followed.windows(2).all(|w| w[0].offset < w[1].offset),
        "offsets rise"
    );
    assert!(follow.resumptions() >= 1, "the subscription was resumed");

    // --- ack_on_commit: false. X leads the Leader stream again once its lease is renewed.
    publish_n(&client, "lead", "back", 1).await;
    let x = leader_of(&client, "lead", None).await;
    let direct = cluster.node(x).client().await;
    // "b" is an idempotent producer's batch (the id comes from the control plane, so now).
    let (producer, epoch) = direct.producer_init().await.expect("a producer id");
    let b_batch = bytes::Bytes::from(
        felix_wire::BatchBuilder::new(felix_wire::Compression::None)
            .producer(producer, epoch, 0)
            .with(felix_wire::Record::value(1_700_000_000_000, "b"))
            .build()
            .expect("a batch"),
    );
    let publish_b = |direct: Connection, batch: bytes::Bytes| async move {
        direct
            .publish_raw(T, NS, "lead", 0, batch, AckMode::Batch)
            .await
            .map(|p| p.expect("an acked publish is answered").base_offset)
    };
    // X's writes are held: a publish is still acknowledged at once, on enqueue (once the
    // renewals after the heal are steady: far from the lease's end).
    await_lease(
        cluster.node(x),
        true,
        Duration::from_millis(LEASE_MS * 7 / 10),
    )
    .await;
    set_writes_stalled(cluster.node(x), true).await;
    let a = publish_one(&direct, "lead", "a").await;
    assert_eq!(a.expect("an enqueue acknowledgement"), 12);
    let mut watch = direct
        .subscribe(T, NS, "lead", 0, StartAt::Latest)
        .await
        .expect("subscribe");
    set_isolated(cluster.node(x), true).await;
    // Near the end of the lease (less than half left) the broker waits for the write before
    // answering.
    await_lease(
        cluster.node(x),
        false,
        Duration::from_millis(LEASE_MS * 45 / 100),
    )
    .await;
    let b = tokio::spawn(publish_b(direct.clone(), b_batch.clone()));
    // The lease lapses (the reader is ended); then the held writes go on.
    let (_, end) = until_end(&mut watch, "Leader stream subscription").await;
    assert_eq!(code_and_reason(&end).0, codes::SHARD_UNAVAILABLE, "{end:?}");
    set_writes_stalled(cluster.node(x), false).await;
    // The publish sent near the end of the lease: refused, not acknowledged.
    let e = b
        .await
        .expect("publish task")
        .expect_err("a publish near the end of the lease was acknowledged before its write");
    assert_eq!(code_and_reason(&e).0, codes::SHARD_UNAVAILABLE, "{e:?}");
    // The write of "a" came after the lapse: refused, and the loss of its ack counted.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while acked_publishes_dropped(cluster.node(x)).await < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the refused write of an acknowledged publish was not counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(acked_publishes_dropped(cluster.node(x)).await, 1.0);
    set_isolated(cluster.node(x), false).await;
    // Neither was written: the log goes on from the last written record, and "b" sent again
    // under its sequence once X leads again is appended there (the sequence of a refused
    // write must not be taken for one already stored).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let b_again = loop {
        match publish_b(direct.clone(), b_batch.clone()).await {
            Err(ClientError::Broker(e)) if e.code == codes::SHARD_UNAVAILABLE => {
                assert!(tokio::time::Instant::now() < deadline, "X never led again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other.expect("the re-sent batch"),
        }
    };
    assert_eq!(
        b_again, 12,
        "the re-sent batch takes the first offset given back"
    );
    publish_n(&client, "lead", "c", 1).await;
    let mut sub = client
        .subscribe_shard(T, NS, "lead", 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    let mut all = Vec::new();
    while all.last().is_none_or(|p: &String| p != "c-0") {
        let e = tokio::time::timeout(PATIENCE, sub.next_event())
            .await
            .expect("records in time")
            .expect("the subscription")
            .expect("not ended");
        assert_eq!(e.offset, all.len() as u64, "offsets are dense");
        all.push(text(&e));
    }
    let expected: Vec<String> = (0..10)
        .map(|i| format!("l-{i}"))
        .chain(["cached", "back-0", "b", "c-0"].map(String::from))
        .collect();
    assert_eq!(
        all, expected,
        "the refused writes are not in the log, \"b\" is once"
    );

    // --- A cluster client's subscription to a durable stream that lags resumes by itself:
    // it stops reading while about 20 MiB are published, the broker ends it with
    // subscription_lagged, and reading on yields every record once, in order.
    create(&client, "lagging", "leader", 1).await;
    let lag_leader = leader_of(&client, "lagging", None).await;
    let mut slow = client
        .subscribe_shard(T, NS, "lagging", 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    let record = |b: usize, i: usize| {
        let mut v = format!("{b}-{i}:").into_bytes();
        v.resize(8 * 1024, b'x');
        v
    };
    let mut batches = 0;
    loop {
        let messages: Vec<Message> = (0..32).map(|i| Message::new(record(batches, i))).collect();
        client
            .publish_to_shard(T, NS, "lagging", 0, &messages)
            .await
            .expect("publish to the lagging stream");
        batches += 1;
        if batches % 8 == 0 {
            let metrics = cluster.node(lag_leader).metrics().await;
            let lagged: f64 = metric_lines(&metrics, "felix_sub_lagged_total")
                .iter()
                .map(|l| metric_value(l))
                .sum();
            if lagged >= 1.0 {
                break;
            }
        }
        assert!(
            batches < 640,
            "160 MiB published and the subscriber never lagged"
        );
    }
    for n in 0..batches * 32 {
        let e = tokio::time::timeout(PATIENCE, slow.next_event())
            .await
            .unwrap_or_else(|_| panic!("lagging subscriber: nothing after {n} records"))
            .expect("the subscription resumes after subscription_lagged")
            .expect("not ended");
        assert_eq!(e.offset, n as u64, "nothing skipped or repeated");
        assert_eq!(&e.payload[..], &record(n / 32, n % 32)[..]);
    }
    assert!(
        slow.resumptions() >= 1,
        "the subscription lagged and resumed"
    );
}
