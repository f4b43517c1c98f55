//! Message ordering (spec: "Message Ordering", "Disconnection Behavior"): order per shard
//! holds through batching and fanout, every subscriber of a durable stream sees the same
//! order, and a subscription that starts in the past replays history and joins live delivery
//! with nothing skipped or repeated, even while publishers keep writing.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use felix_client::{AckMode, ClientConfig, Connection, Event, Message, StartAt};
use parking_lot::Mutex;

use super::common::{
    Broker, BrokerOptions, PATIENCE, assert_contiguous, durable_stream, read_until,
};

const NS: &str = "ns";
const STREAM: &str = "ordered";

/// `publisher`'s `n`-th message.
fn numbered(publisher: usize, n: u64) -> String {
    format!("p{publisher}-{n:07}")
}

fn parse_numbered(payload: &[u8]) -> (usize, u64) {
    let s = std::str::from_utf8(payload).expect("utf-8 payload");
    let (p, n) = s
        .strip_prefix('p')
        .and_then(|s| s.split_once('-'))
        .unwrap_or_else(|| panic!("not a numbered payload: {s:?}"));
    (p.parse().expect("publisher"), n.parse().expect("number"))
}

/// Publishes batches `batches` (each of `per_batch` numbered messages), one `publish_batch`
/// at a time, and returns offset → payload of everything acknowledged.
async fn publish_numbered(
    client: Connection,
    tenant: &'static str,
    publisher: usize,
    batches: std::ops::Range<u64>,
    per_batch: u64,
) -> BTreeMap<u64, Bytes> {
    let mut acked = BTreeMap::new();
    for b in batches {
        let payloads: Vec<Bytes> = (0..per_batch)
            .map(|i| Bytes::from(numbered(publisher, b * per_batch + i)))
            .collect();
        let messages = payloads.iter().cloned().map(Message::new).collect();
        let published = client
            .publish_batch(tenant, NS, STREAM, messages, AckMode::Batch)
            .await
            .unwrap_or_else(|e| panic!("publisher {publisher}, batch {b}: {e:?}"));
        assert_eq!(published.len(), 1, "one shard, one acknowledgement");
        let p = published[0];
        assert_eq!(
            p.last_offset - p.base_offset + 1,
            per_batch,
            "a batch of {per_batch} records takes {per_batch} offsets"
        );
        for (i, pl) in payloads.into_iter().enumerate() {
            acked.insert(p.offset_of(i), pl);
        }
    }
    acked
}

/// Each publisher's numbers appear in the order it sent them, with none missing.
fn assert_per_publisher_order(events: &[Event], publishers: usize, per_publisher: u64, what: &str) {
    let mut next = vec![0u64; publishers];
    for e in events {
        let (p, n) = parse_numbered(&e.payload);
        assert_eq!(
            n, next[p],
            "{what}: publisher {p}'s message {n} arrived at offset {} where {} was due",
            e.offset, next[p]
        );
        next[p] += 1;
    }
    assert!(
        next.iter().all(|&n| n == per_publisher),
        "{what}: per-publisher counts {next:?}, expected {per_publisher} each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_per_shard_holds_through_batching_and_fanout() {
    const TENANT: &str = "order";
    const PUBLISHERS: usize = 3;
    const BATCHES: u64 = 25;
    const PER_BATCH: u64 = 40;
    let total = PUBLISHERS as u64 * BATCHES * PER_BATCH;

    let broker = Broker::start(BrokerOptions::new()).await;
    let client = broker.client().await;
    durable_stream(&client, TENANT, NS, STREAM, 1).await;

    // Live subscribers, before anything is published: two on connections of their own, two
    // sharing the publishers' connection.
    let mut clients = vec![client.clone()];
    let mut readers = Vec::new();
    for i in 0..4 {
        let c = if i < 2 {
            broker.client().await
        } else {
            client.clone()
        };
        let mut sub = c
            .subscribe(TENANT, NS, STREAM, 0, StartAt::Latest)
            .await
            .expect("subscribe");
        assert_eq!(sub.start_offset(), 0, "an empty stream's latest is 0");
        clients.push(c);
        readers.push(tokio::spawn(async move {
            read_until(&mut sub, total, &format!("live subscriber {i}")).await
        }));
    }

    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|p| {
            tokio::spawn(publish_numbered(
                client.clone(),
                TENANT,
                p,
                0..BATCHES,
                PER_BATCH,
            ))
        })
        .collect();
    let mut acked = BTreeMap::new();
    for p in publishers {
        acked.extend(p.await.expect("publisher task"));
    }
    assert_eq!(
        acked.len() as u64,
        total,
        "every record acknowledged at its own offset"
    );
    assert_eq!(acked.keys().next_back(), Some(&(total - 1)));

    // A late subscriber replays the same shard from the log.
    let mut late = client
        .subscribe(TENANT, NS, STREAM, 0, StartAt::Earliest)
        .await
        .expect("subscribe from earliest");
    let replayed = read_until(&mut late, total, "replaying subscriber").await;

    let mut all = vec![("replaying subscriber".to_owned(), replayed)];
    for (i, r) in readers.into_iter().enumerate() {
        all.push((
            format!("live subscriber {i}"),
            r.await.expect("reader task"),
        ));
    }
    for (what, events) in &all {
        assert_eq!(events.len() as u64, total, "{what}: every record once");
        assert_contiguous(events, 0, what);
        assert_per_publisher_order(events, PUBLISHERS, BATCHES * PER_BATCH, what);
        for e in events {
            assert_eq!(
                Some(&e.payload),
                acked.get(&e.offset),
                "{what}: offset {} holds what its publisher was told",
                e.offset
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_from_earliest_joins_live_without_gap_or_duplicate() {
    const TENANT: &str = "catchup";
    const BEFORE: u64 = 2_000;
    const PUBLISHERS: usize = 2;
    const BATCHES: u64 = 60;
    const PER_BATCH: u64 = 15;

    let broker = Broker::start(BrokerOptions::new()).await;
    let client = broker.client().await;
    durable_stream(&client, TENANT, NS, STREAM, 1).await;

    // History, written by a publisher of its own before the others start.
    let history = publish_numbered(client.clone(), TENANT, PUBLISHERS, 0..BEFORE / 100, 100).await;
    assert_eq!(history.len() as u64, BEFORE);

    // Publishers keep writing while subscribers start from the earliest offset at successive
    // points of the publishing, so their catch-up races live writes.
    let acked = Arc::new(Mutex::new(history));
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|p| {
            let (client, acked) = (client.clone(), acked.clone());
            tokio::spawn(async move {
                for b in 0..BATCHES {
                    let got =
                        publish_numbered(client.clone(), TENANT, p, b..b + 1, PER_BATCH).await;
                    acked.lock().extend(got);
                }
            })
        })
        .collect();

    let mut subs = Vec::new();
    for i in 0..3u64 {
        let threshold = BEFORE + (i + 1) * 4 * PER_BATCH;
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while (acked.lock().len() as u64) < threshold {
            assert!(
                tokio::time::Instant::now() < deadline,
                "publishers stalled below {threshold} records"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let c = broker.client().await;
        let sub = c
            .subscribe(TENANT, NS, STREAM, 0, StartAt::Earliest)
            .await
            .expect("subscribe from earliest");
        assert_eq!(
            sub.start_offset(),
            0,
            "subscriber {i} starts at the first offset"
        );
        subs.push((c, sub));
    }
    for p in publishers {
        p.await.expect("publisher task");
    }
    let acked = acked.lock().clone();
    let end = BEFORE + PUBLISHERS as u64 * BATCHES * PER_BATCH;
    assert_eq!(
        acked.len() as u64,
        end,
        "every record acknowledged at its own offset"
    );

    for (i, (_c, mut sub)) in subs.into_iter().enumerate() {
        let what = format!("subscriber {i} (live from {})", sub.live_offset());
        let events = read_until(&mut sub, end, &what).await;
        assert_eq!(events.len() as u64, end, "{what}: {end} records, each once");
        assert_contiguous(&events, 0, &what);
        for e in &events {
            assert_eq!(
                Some(&e.payload),
                acked.get(&e.offset),
                "{what}: offset {} holds what its publisher was told",
                e.offset
            );
        }
    }
}

/// Spec ("Consistency"): a durable stream's default acknowledgement comes after the write,
/// so unlike an ack on enqueue it leaves no gap: a replay sent right after the ack sees the
/// record. Each round publishes a batch and at once subscribes at one of its offsets (its
/// first, or its last), while another publisher keeps the shard busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_sent_right_after_the_ack_reads_the_acknowledged_record() {
    replay_right_after_the_ack(BrokerOptions::new(), ClientConfig::default()).await;
}

/// Spec ("Consistency"): a client of a broker started with `ack_on_commit: false` can ask
/// for commit acknowledgements on its own connection (`ack_on_commit: true` in its
/// ClientConfig) and then has the same guarantee: an acknowledged record is written, so a
/// replay right after the ack sees it (an ack on enqueue would often be refused here as
/// past the end of the shard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_asking_for_commit_acks_gets_them_from_an_enqueue_ack_broker() {
    replay_right_after_the_ack(
        BrokerOptions::new().env("FELIX_ACK_ON_COMMIT", 0),
        ClientConfig {
            ack_on_commit: true,
            ..ClientConfig::default()
        },
    )
    .await;
}

async fn replay_right_after_the_ack(options: BrokerOptions, config: ClientConfig) {
    const TENANT: &str = "replay";
    let broker = Broker::start(options).await;
    let client = Connection::connect(&broker.quic_addr.to_string(), config)
        .await
        .expect("connect");
    durable_stream(&client, TENANT, NS, STREAM, 1).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let background = {
        let (client, stop) = (broker.client().await, stop.clone());
        tokio::spawn(async move {
            let filler = Bytes::from(vec![b'f'; 4096]);
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                let messages = (0..16).map(|_| Message::new(filler.clone())).collect();
                client
                    .publish_batch(TENANT, NS, STREAM, messages, AckMode::Batch)
                    .await
                    .expect("background publish");
            }
        })
    };
    for n in 0..300u64 {
        let messages = (0..3)
            .map(|i| Message::new(numbered(0, n * 3 + i)))
            .collect();
        let p = client
            .publish_batch(TENANT, NS, STREAM, messages, AckMode::Batch)
            .await
            .expect("publish")[0];
        let from = if n % 2 == 0 {
            p.base_offset
        } else {
            p.last_offset
        };
        let what = format!(
            "round {n}, replay from {from} of [{}, {}]",
            p.base_offset, p.last_offset
        );
        let mut sub = client
            .subscribe(TENANT, NS, STREAM, 0, StartAt::Offset(from))
            .await
            .unwrap_or_else(|e| {
                panic!("{what}: subscribing at an acknowledged offset failed: {e:?}")
            });
        let events = read_until(&mut sub, p.last_offset + 1, &what).await;
        assert_contiguous(&events, from, &what);
        assert_eq!(events.len() as u64, p.last_offset + 1 - from, "{what}");
        for e in &events {
            assert_eq!(
                e.payload,
                numbered(0, n * 3 + e.offset - p.base_offset).as_bytes(),
                "{what}"
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    background.await.expect("background publisher");
}

/// The spec's `client.subscribe(tenant, namespace, stream)` reads a whole stream: through a
/// `Client` on a single broker (a cluster of one), every shard's records arrive, each
/// shard's in log order from its first offset, nothing repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_stream_subscription_reads_every_shard_in_order() {
    let broker = Broker::start(BrokerOptions::new()).await;
    durable_stream(&broker.client().await, "whole", NS, STREAM, 3).await;
    let addr = broker.quic_addr.to_string();
    let client = felix_client::Client::connect([addr], ClientConfig::default())
        .await
        .expect("connect a client to a cluster of one");
    let messages: Vec<Message> = (0..60)
        .map(|i| Message::new(format!("m{i}")).with_key(format!("k{}", i % 7)))
        .collect();
    let acks = client
        .publish_batch("whole", NS, STREAM, messages, AckMode::Batch)
        .await
        .expect("publish");
    assert!(acks.len() > 1, "the keys span several shards: {acks:?}");

    let mut sub = client
        .subscribe_from("whole", NS, STREAM, StartAt::Earliest)
        .await
        .expect("subscribe to the whole stream");
    let mut by_shard: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut payloads = Vec::new();
    while payloads.len() < 60 {
        let event = tokio::time::timeout(PATIENCE, sub.next_event())
            .await
            .expect("the next record in time")
            .expect("no error")
            .expect("the subscription stays open");
        let shard = sub.last_shard().expect("a record names its shard");
        by_shard.entry(shard).or_default().push(event.offset);
        payloads.push(String::from_utf8(event.payload.to_vec()).expect("utf-8"));
    }
    for ack in &acks {
        let offsets = &by_shard[&ack.shard];
        let expected: Vec<u64> = (0..=ack.last_offset).collect();
        assert_eq!(offsets, &expected, "shard {} in log order", ack.shard);
    }
    payloads.sort();
    let mut sent: Vec<String> = (0..60).map(|i| format!("m{i}")).collect();
    sent.sort();
    assert_eq!(payloads, sent, "every record once");
}
