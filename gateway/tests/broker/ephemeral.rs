//! Ephemeral streams (spec: "Delivery Guarantees", "Buffer behavior", "Slow Subscriber
//! Behavior", the idempotent producer, "Multi-Broker Consistency"), on real `felix` processes.
//!
//! * On one broker: publish and subscribe at all; at most once, with no acknowledgement
//!   from subscribers and nothing redelivered; every publish answered when it is queued,
//!   also while a subscriber reads nothing; a slow subscriber's drops counted in
//!   `felix_sub_queue_dropped_total` and not announced; a re-sent idempotent batch offered
//!   once; a restart keeps the stream and none of its records.
//! * On a cluster of three: a shard has one leader, so a subscriber on one broker receives
//!   what is published through another; `felixctl subscribe` on any broker follows the
//!   hint; a re-sent idempotent batch through a forwarding broker lands once; when the
//!   leader dies another broker takes the shard over at once, and the cluster client's
//!   subscription and idempotent producer carry on there.
//!
//! Each test walks through several promises on one broker (or cluster), one step per
//! function named after the promise, to keep CI short.

use std::time::Duration;

use bytes::Bytes;
use felix_client::{
    AckMode, ClientError, ClusterClient, Connection, Event, Message, StartAt, StreamConfig, codes,
};
use tokio::sync::mpsc;

use super::cluster::Cluster;
use super::common::{
    Broker, BrokerOptions, PATIENCE, metric_lines, metric_value, read_until, shard_leader,
};

const T: &str = "eph";
const NS: &str = "ns";

/// Creates the tenant and namespace (if missing) and an ephemeral stream of one shard.
async fn ephemeral_stream(client: &Connection, name: &str) {
    for r in [
        client.create_tenant(T).await,
        client.create_namespace(T, NS).await,
    ] {
        match r {
            Ok(()) => {}
            Err(ClientError::Broker(e)) if e.code == codes::ALREADY_EXISTS => {}
            Err(e) => panic!("create tenant/namespace: {e}"),
        }
    }
    let info = client
        .create_stream(
            T,
            NS,
            name,
            StreamConfig {
                shards: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("create stream");
    assert_eq!(
        info.config.durable,
        Some(false),
        "a stream is ephemeral unless declared durable"
    );
}

/// The sum of a per-tenant counter over this module's tenant (0 when never counted).
fn tenant_counter(metrics: &str, name: &str) -> f64 {
    metric_lines(metrics, name)
        .iter()
        .filter(|l| l.contains(&format!("tenant=\"{T}\"")))
        .map(|l| metric_value(l))
        .sum()
}

async fn publish(client: &Connection, stream: &str, payloads: &[Bytes]) -> (u64, u64) {
    let messages = payloads.iter().cloned().map(Message::new).collect();
    let published = client
        .publish_batch(T, NS, stream, messages, AckMode::Batch)
        .await
        .unwrap_or_else(|e| panic!("publish to {stream}: {e:?}"));
    (published[0].base_offset, published[0].last_offset)
}

fn text(e: &Event) -> String {
    String::from_utf8_lossy(&e.payload).into_owned()
}

// --- one broker ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_streams_on_one_broker() {
    // A small queue, so a stalled subscriber overflows after little more than its QUIC
    // window.
    let mut broker =
        Broker::start(BrokerOptions::new().env("FELIX_SUBSCRIBER_QUEUE_CAPACITY", 4)).await;
    let client = broker.client().await;
    ephemeral_stream(&client, "live").await;
    an_ephemeral_stream_delivers_at_most_once_with_no_acknowledgement_from_subscribers(&client)
        .await;
    an_ephemeral_stream_answers_when_the_publish_is_queued_and_drops_unannounced(&broker).await;
    ephemeral_stream(&client, "idem").await;
    an_idempotent_batch_resent_to_an_ephemeral_stream_is_offered_once(&client).await;
    an_ephemeral_stream_outlives_a_restart_with_none_of_its_records(&mut broker).await;
}

/// Published records reach a live subscriber, in order. The subscriber acknowledges
/// nothing and nothing is redelivered: a subscriber that comes back, even asking for the
/// earliest offset, starts at the tail.
async fn an_ephemeral_stream_delivers_at_most_once_with_no_acknowledgement_from_subscribers(
    client: &Connection,
) {
    let mut sub = client
        .subscribe(T, NS, "live", 0, StartAt::Latest)
        .await
        .expect("subscribe");
    assert_eq!(sub.start_offset(), 0);
    let payloads: Vec<Bytes> = ["a", "b", "c"].into_iter().map(Bytes::from).collect();
    assert_eq!(publish(client, "live", &payloads).await, (0, 2));
    let events = read_until(&mut sub, 3, "ephemeral subscriber").await;
    let got: Vec<(u64, String)> = events.iter().map(|e| (e.offset, text(e))).collect();
    assert_eq!(got, vec![(0, "a".into()), (1, "b".into()), (2, "c".into())]);
    drop(sub);

    // No history to replay: the earliest an ephemeral subscription can start is the tail.
    let mut again = client
        .subscribe(T, NS, "live", 0, StartAt::Earliest)
        .await
        .expect("subscribe again");
    assert_eq!(again.start_offset(), 3, "nothing before the tail is kept");
    assert_eq!(publish(client, "live", &[Bytes::from("d")]).await, (3, 3));
    let next = read_until(&mut again, 4, "returning subscriber").await;
    let got: Vec<(u64, String)> = next.iter().map(|e| (e.offset, text(e))).collect();
    assert_eq!(got, vec![(3, "d".into())], "only what came after it joined");
}

/// Records per batch and bytes per record: 256 KiB a batch.
const PER_BATCH: usize = 4;
const RECORD_BYTES: usize = 64 * 1024;
/// A stalled subscriber must overflow well before this much is published (its QUIC stream
/// window, 16 MiB at most, plus a 4-slot queue).
const MAX_PUBLISHED: usize = 160 * 1024 * 1024;

/// A stalled subscriber takes nothing, yet every publish is answered at once, with dense
/// offsets: it was queued, which is all an ephemeral stream waits for. The subscriber's
/// queue overflows; the drops are counted in `felix_sub_queue_dropped_total` and not
/// announced: no `subscription_lagged`, the subscription goes on, and the subscriber sees
/// the drop only as a jump in offsets.
async fn an_ephemeral_stream_answers_when_the_publish_is_queued_and_drops_unannounced(
    broker: &Broker,
) {
    let publisher = broker.client().await;
    // Each subscriber on a connection of its own, so the stalled one holds no
    // connection-level credit the fast one needs.
    let fast_client = broker.client().await;
    let stalled_client = broker.client().await;
    let mut fast = fast_client
        .subscribe(T, NS, "live", 0, StartAt::Latest)
        .await
        .expect("fast subscribe");
    let stalled = stalled_client
        .subscribe(T, NS, "live", 0, StartAt::Latest)
        .await
        .expect("stalled subscribe");
    let start = fast.start_offset();
    assert_eq!(stalled.start_offset(), start);

    let mut next = start;
    let mut published = 0usize;
    let mut batch_no = 0u64;
    // Publish until the broker has dropped for the stalled subscriber. The fast one reads
    // each batch before the next is sent, so it never falls behind.
    loop {
        let payloads: Vec<Bytes> = (0..PER_BATCH)
            .map(|i| {
                let mut v = format!("b{batch_no}-r{i}:").into_bytes();
                v.resize(RECORD_BYTES, b'x');
                Bytes::from(v)
            })
            .collect();
        let (first, last) = publish(&publisher, "live", &payloads).await;
        assert_eq!(
            (first, last),
            (next, next + PER_BATCH as u64 - 1),
            "every publish is answered, with dense offsets, whatever the stalled subscriber does"
        );
        next = last + 1;
        published += PER_BATCH * RECORD_BYTES;
        batch_no += 1;
        read_until(&mut fast, next, "fast subscriber").await;
        if batch_no.is_multiple_of(4)
            && tenant_counter(&broker.metrics().await, "felix_sub_queue_dropped_total") >= 1.0
        {
            break;
        }
        assert!(
            published < MAX_PUBLISHED,
            "{} MiB published and nothing was dropped for the stalled subscriber",
            published >> 20
        );
    }
    eprintln!(
        "dropped for the stalled subscriber after {batch_no} batches ({} MiB)",
        published >> 20
    );
    let metrics = broker.metrics().await;
    assert_eq!(
        tenant_counter(&metrics, "felix_sub_lagged_total"),
        0.0,
        "an ephemeral subscription is never ended as lagged"
    );

    // The stalled subscriber reads again. It gets what was queued before the drops, then
    // (after a jump in offsets) live records again: it was never ended. Markers are
    // published until one reaches it, since any sent while its queue is still full drop.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let mut stalled = stalled;
        loop {
            let next = stalled.next_event().await;
            let end = !matches!(next, Ok(Some(_)));
            if tx.send(next).is_err() || end {
                return;
            }
        }
    });
    let mut seen: Vec<Event> = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    'markers: for m in 0.. {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled subscriber got no marker within {PATIENCE:?} ({} events)",
            seen.len()
        );
        let (first, _) = publish(&publisher, "live", &[Bytes::from(format!("marker-{m}"))]).await;
        read_until(&mut fast, first + 1, "fast subscriber, markers").await;
        // Pace the markers on what the reader gets; stop at the first marker it sees.
        while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            match ev {
                Ok(Some(e)) => {
                    let marker = text(&e).starts_with("marker-");
                    seen.push(e);
                    if marker {
                        break 'markers;
                    }
                }
                other => panic!(
                    "an ephemeral subscription that dropped must go on, not end: {other:?} after {} events",
                    seen.len()
                ),
            }
        }
    }
    reader.abort();
    let offsets: Vec<u64> = seen.iter().map(|e| e.offset).collect();
    eprintln!(
        "stalled subscriber: {} records, offsets {:?}..{:?}",
        offsets.len(),
        offsets.first(),
        offsets.last()
    );
    assert!(
        offsets.windows(2).all(|w| w[0] < w[1]),
        "in order: {offsets:?}"
    );
    assert!(
        offsets.windows(2).any(|w| w[1] > w[0] + 1),
        "the drop shows as a jump in offsets: {offsets:?}"
    );
    assert!(
        tenant_counter(&broker.metrics().await, "felix_sub_lagged_total") == 0.0,
        "still never announced"
    );
}

/// An idempotent producer's batch sent twice is answered twice with the same offsets and
/// offered to subscribers once; its next batch follows; a gap is refused.
async fn an_idempotent_batch_resent_to_an_ephemeral_stream_is_offered_once(client: &Connection) {
    let mut sub = client
        .subscribe(T, NS, "idem", 0, StartAt::Latest)
        .await
        .expect("subscribe");
    let producer = client.idempotent_producer().await.expect("producer id");
    let batch = producer
        .encode(T, NS, "idem", 0, &[Message::new("once")])
        .await
        .expect("encode");
    let sent = client
        .publish_raw(T, NS, "idem", 0, batch.clone(), AckMode::Batch)
        .await
        .expect("send")
        .expect("acknowledged");
    // The acknowledgement "was lost": the same bytes again.
    let resent = client
        .publish_raw(T, NS, "idem", 0, batch, AckMode::Batch)
        .await
        .expect("re-send")
        .expect("acknowledged");
    assert_eq!(
        sent, resent,
        "a re-send is answered with the original offsets"
    );
    let then = producer
        .publish_to_shard(T, NS, "idem", 0, &[Message::new("then")])
        .await
        .expect("next batch");
    assert_eq!(then.base_offset, sent.last_offset + 1);
    let events = read_until(&mut sub, then.last_offset + 1, "idempotent subscriber").await;
    let got: Vec<String> = events.iter().map(text).collect();
    assert_eq!(
        got,
        vec!["once", "then"],
        "the re-send was not offered again"
    );

    let _skipped = producer
        .encode(T, NS, "idem", 0, &[Message::new("never sent")])
        .await
        .expect("encode");
    let gap = producer
        .encode(T, NS, "idem", 0, &[Message::new("after a gap")])
        .await
        .expect("encode");
    let refused = client
        .publish_raw(T, NS, "idem", 0, gap, AckMode::Batch)
        .await;
    assert_eq!(
        refused.as_ref().err().and_then(|e| e.code()),
        Some(codes::OUT_OF_ORDER_SEQUENCE),
        "{refused:?}"
    );
}

/// A restart (SIGKILL, then the same data directory) keeps the stream, whose name and
/// settings live in the control plane, and none of its records: they were only ever in
/// memory. A subscriber asking for the earliest offset gets only what is published after
/// it joined, and the stream takes publishes as before.
async fn an_ephemeral_stream_outlives_a_restart_with_none_of_its_records(broker: &mut Broker) {
    broker.restart().await;
    let client = broker.client().await;
    let info = client
        .describe_stream(T, NS, "live")
        .await
        .expect("the stream outlives the restart");
    assert_eq!(info.config.durable, Some(false));
    let mut sub = client
        .subscribe(T, NS, "live", 0, StartAt::Earliest)
        .await
        .expect("subscribe after the restart");
    let (first, _) = publish(&client, "live", &[Bytes::from("after-restart")]).await;
    let events = read_until(&mut sub, first + 1, "subscriber after the restart").await;
    let got: Vec<(u64, String)> = events.iter().map(|e| (e.offset, text(e))).collect();
    assert_eq!(
        got,
        vec![(first, "after-restart".into())],
        "nothing published before the restart is replayed"
    );
}

// --- a cluster -----------------------------------------------------------------------------

/// The shard's leader as the cluster's topology names it, once it is not `not`.
async fn ephemeral_leader(client: &ClusterClient, stream: &str, not: Option<u64>) -> u64 {
    shard_leader(client, (T, NS, stream), not).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ephemeral_streams_across_a_cluster() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    let any = client.any_connection().await.expect("a broker");
    ephemeral_stream(&any, "wide").await;
    let leader = ephemeral_leader(&client, "wide", None).await;
    let others: Vec<u64> = (1..=3).filter(|b| *b != leader).collect();

    let mut sub = client
        .subscribe_shard(T, NS, "wide", 0, StartAt::Latest)
        .await
        .expect("cluster subscribe");
    assert_eq!(
        sub.broker_id(),
        Some(leader),
        "routed to the shard's leader"
    );
    a_subscriber_on_one_broker_receives_an_ephemeral_stream_published_through_another(
        &mut cluster,
        &mut sub,
        leader,
        others[0],
    )
    .await;
    felixctl_subscribe_on_any_broker_follows_the_ephemeral_leader(
        &mut cluster,
        others[1],
        others[0],
    )
    .await;
    an_idempotent_batch_resent_through_a_forwarding_broker_lands_once(
        &mut cluster,
        &mut sub,
        others[1],
    )
    .await;
    an_ephemeral_shard_is_taken_over_at_once_when_its_leader_dies(
        &mut cluster,
        &client,
        sub,
        leader,
    )
    .await;
}

/// A plain client of a broker that does not lead the shard: its subscription is answered
/// with `not_leader` naming the leader, and its publishes are forwarded there, so the
/// subscriber on the leader receives them.
async fn a_subscriber_on_one_broker_receives_an_ephemeral_stream_published_through_another(
    cluster: &mut Cluster,
    sub: &mut felix_client::ClusterSubscription,
    leader: u64,
    other: u64,
) {
    let plain = cluster.node(other).client().await;
    match plain.subscribe(T, NS, "wide", 0, StartAt::Latest).await {
        Err(ClientError::Broker(e)) => {
            assert_eq!(e.code, codes::NOT_LEADER, "{e:?}");
            assert_eq!(e.leader, Some(leader), "the hint names the leader: {e:?}");
            assert!(e.leader_addr.is_some(), "{e:?}");
        }
        other => panic!("a broker that does not lead the shard served it: {other:?}"),
    }
    let mut expected = Vec::new();
    for i in 0..5 {
        let payload = format!("via-{other}-{i}");
        let published = plain
            .publish_batch(
                T,
                NS,
                "wide",
                vec![Message::new(payload.clone())],
                AckMode::Batch,
            )
            .await
            .expect("a publish through a broker that does not lead");
        expected.push((published[0].base_offset, payload));
    }
    let forwarded = metric_lines(
        &cluster.node(other).metrics().await,
        "felix_publishes_forwarded_total",
    )
    .first()
    .map(|l| metric_value(l));
    assert_eq!(forwarded, Some(5.0), "forwarded to the leader");
    let mut got = Vec::new();
    while got.len() < expected.len() {
        let e = tokio::time::timeout(PATIENCE, sub.next_event())
            .await
            .expect("the subscriber on the leader gets the records")
            .expect("subscription")
            .expect("not ended");
        got.push((e.offset, text(&e)));
    }
    assert_eq!(got, expected);
}

/// `felixctl subscribe` pointed at a broker that does not lead follows its hint to the
/// leader, and prints what is published through yet another broker.
async fn felixctl_subscribe_on_any_broker_follows_the_ephemeral_leader(
    cluster: &mut Cluster,
    subscribe_at: u64,
    publish_at: u64,
) {
    let publisher = cluster.node(publish_at).client().await;
    let node = cluster.node(subscribe_at);
    let felixctl = super::felixctl::run(node, &["subscribe", "eph/ns/wide", "--count", "1"], b"");
    tokio::pin!(felixctl);
    // Live only: publish until felixctl (once subscribed) has printed one.
    let out = loop {
        tokio::select! {
            out = &mut felixctl => break out,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                publish(&publisher, "wide", &[Bytes::from("to-felixctl")]).await;
            }
        }
    };
    assert_eq!(out.stdout.trim(), "to-felixctl", "{}", out.stderr);
}

/// An idempotent producer's batch sent twice through a broker that forwards it: the
/// leader answers the re-send with the original offsets and offers the batch once.
async fn an_idempotent_batch_resent_through_a_forwarding_broker_lands_once(
    cluster: &mut Cluster,
    sub: &mut felix_client::ClusterSubscription,
    through: u64,
) {
    let plain = cluster.node(through).client().await;
    let producer = plain.idempotent_producer().await.expect("producer id");
    let batch = producer
        .encode(T, NS, "wide", 0, &[Message::new("idempotent")])
        .await
        .expect("encode");
    let sent = plain
        .publish_raw(T, NS, "wide", 0, batch.clone(), AckMode::Batch)
        .await
        .expect("send")
        .expect("acknowledged");
    let resent = plain
        .publish_raw(T, NS, "wide", 0, batch, AckMode::Batch)
        .await
        .expect("re-send")
        .expect("acknowledged");
    assert_eq!(sent, resent, "the leader recognised the re-send");
    let (marker, _) = publish(&plain, "wide", &[Bytes::from("after-idempotent")]).await;
    assert_eq!(marker, sent.last_offset + 1);
    // Skip what felixctl's step published; then the batch once, then the marker.
    let mut got = Vec::new();
    while got.last().is_none_or(|(o, _)| *o < marker) {
        let e = tokio::time::timeout(PATIENCE, sub.next_event())
            .await
            .expect("records")
            .expect("subscription")
            .expect("not ended");
        if e.offset >= sent.base_offset {
            got.push((e.offset, text(&e)));
        }
    }
    assert_eq!(
        got,
        vec![
            (sent.base_offset, "idempotent".into()),
            (marker, "after-idempotent".into())
        ]
    );
}

/// The leader is killed. Another broker leads the shard as soon as the old one is judged
/// dead, with the old one still down (a Leader durable shard would wait for it). The
/// cluster client's subscription resumes there, and an idempotent producer's next batch is
/// taken by the new leader, which knew nothing of it.
async fn an_ephemeral_shard_is_taken_over_at_once_when_its_leader_dies(
    cluster: &mut Cluster,
    client: &ClusterClient,
    sub: felix_client::ClusterSubscription,
    leader: u64,
) {
    let producer = client.idempotent_producer().await.expect("producer id");
    producer
        .publish_to_shard(T, NS, "wide", 0, &[Message::new("before")])
        .await
        .expect("an idempotent batch on the old leader");

    let (tx, mut rx) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let mut sub = sub;
        loop {
            let next = sub.next_event().await;
            let end = !matches!(next, Ok(Some(_)));
            if tx.send((sub.broker_id(), next)).is_err() || end {
                return;
            }
        }
    });

    cluster.node(leader).kill();
    let successor = ephemeral_leader(client, "wide", Some(leader)).await;
    assert_ne!(successor, leader);

    // Publish until the resumed subscription delivers: it rejoins live delivery on the
    // new leader, and what was published before it did is not kept for it.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    'published: for i in 0.. {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the subscription did not resume on the new leader within {PATIENCE:?}"
        );
        producer
            .publish_to_shard(T, NS, "wide", 0, &[Message::new(format!("after-{i}"))])
            .await
            .expect("the new leader takes the producer's next batch");
        while let Ok(Some((broker, ev))) =
            tokio::time::timeout(Duration::from_millis(200), rx.recv()).await
        {
            match ev {
                Ok(Some(e)) if text(&e).starts_with("after-") => {
                    assert_eq!(broker, Some(successor), "resumed on the new leader");
                    break 'published;
                }
                Ok(Some(_)) => {}
                other => panic!("the cluster subscription did not resume: {other:?}"),
            }
        }
    }
    reader.abort();
    // Judged dead, not returned: the old leader is still down.
    let topology = client.topology(T, NS, "wide").await.expect("topology");
    assert_eq!(topology.leader(0).map(|(id, _)| id), Some(successor));
    assert!(
        topology.brokers.iter().any(|b| b.id == leader && !b.alive),
        "{topology:?}"
    );
}
