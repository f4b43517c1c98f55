//! Consumer groups (spec: "Delivery Guarantees", "At-least-once", "Disconnection Behavior",
//! docs/groups.md) on real `felix` processes through the Rust client: every record is
//! acknowledged exactly once across concurrent consumers and never held by two at once; a
//! claim nobody answers is redelivered after its visibility timeout, not before, as
//! attempt 2; nack redelivers at once or after its delay; a record whose last attempt is
//! nacked or lapses reaches the dead-letter stream once with its headers; answers to claims
//! not held get stable errors; and after kill -9 nothing acknowledged comes back, nothing
//! unacknowledged is lost and attempt counts survived.
//!
//! One broker serves every case but the kill, each case on its own streams.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use felix_client::{
    AckMode, Client, ClientConfig, ClientError, Connection, GroupConfig, GroupRecord, GroupStart,
    Message, StartAt, codes,
};
use parking_lot::Mutex;

use super::common::{Broker, BrokerOptions, PATIENCE, durable_stream, metric_lines, metric_value};

const T: &str = "groups";
const NS: &str = "ns";

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

async fn cluster_client(broker: &Broker) -> Client {
    Client::connect([broker.quic_addr.to_string()], ClientConfig::default())
        .await
        .expect("connect")
}

/// The next `n` events of a dead-letter subscription, each within the patience.
async fn dead_letters(dlq: &mut felix_client::Subscription, n: usize) -> Vec<felix_client::Event> {
    let mut letters = Vec::with_capacity(n);
    while letters.len() < n {
        let e = tokio::time::timeout(PATIENCE, dlq.next_event())
            .await
            .expect("dead letters within patience")
            .expect("dead-letter subscription")
            .expect("event");
        letters.push(e);
    }
    letters
}

/// Header `k` of a dead letter, as text.
fn header(e: &felix_client::Event, k: &str) -> Option<String> {
    e.headers
        .iter()
        .find(|(name, _)| name == k)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

async fn stream(conn: &Connection, name: &str, shards: u32) {
    conn.create_stream(
        T,
        NS,
        name,
        felix_client::StreamConfig {
            durable: Some(true),
            shards: Some(shards),
            ..Default::default()
        },
    )
    .await
    .expect("create stream");
}

/// Publishes `n` keyed records `{prefix}-{i}` (spread over the shards by key).
async fn publish(client: &Client, stream: &str, prefix: &str, n: usize) -> BTreeSet<Bytes> {
    let mut all = BTreeSet::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let messages: Vec<Message> = chunk
            .iter()
            .map(|i| {
                let p = Bytes::from(format!("{prefix}-{i}"));
                all.insert(p.clone());
                Message::new(p.clone()).with_key(p)
            })
            .collect();
        client
            .publish_batch(T, NS, stream, messages, AckMode::Batch)
            .await
            .expect("publish");
    }
    all
}

pub(super) fn config(
    visibility_ms: u64,
    max_attempts: u32,
    dead_letter: Option<&str>,
) -> GroupConfig {
    GroupConfig {
        visibility_timeout_ms: Some(visibility_ms),
        max_attempts: Some(max_attempts),
        dead_letter: dead_letter.map(|s| format!("{T}/{NS}/{s}")),
        start: Some(GroupStart::Earliest),
    }
}

trait WithoutStart {
    fn without_start(self) -> GroupConfig;
}

impl WithoutStart for GroupConfig {
    /// An alter leaves the start position as it is.
    fn without_start(self) -> GroupConfig {
        GroupConfig {
            start: None,
            ..self
        }
    }
}

/// Polls until `n` records are held, failing after [`PATIENCE`].
async fn poll_n(consumer: &mut felix_client::GroupConsumer, n: usize) -> Vec<GroupRecord> {
    let until = tokio::time::Instant::now() + PATIENCE;
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            tokio::time::Instant::now() < until,
            "only {} of {n} records claimed",
            out.len()
        );
        out.extend(
            consumer
                .poll(n - out.len(), Duration::from_millis(500))
                .await
                .expect("poll"),
        );
    }
    out
}

fn broker_code(e: &ClientError) -> (u16, String) {
    match e {
        ClientError::Broker(b) => (b.code, b.reason.clone()),
        other => panic!("expected a broker error, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_groups_on_one_broker() {
    let broker = Broker::start(BrokerOptions::new()).await;
    let conn = broker.client().await;
    conn.create_tenant(T).await.expect("tenant");
    conn.create_namespace(T, NS).await.expect("namespace");
    let client = cluster_client(&broker).await;
    group_settings_live_in_the_control_plane_and_bad_ones_are_refused(&conn, &client).await;
    concurrent_consumers_ack_every_record_exactly_once_and_never_share_a_claim(&conn, &broker)
        .await;
    a_claim_never_answered_is_redelivered_after_its_visibility_timeout_as_attempt_2(&conn, &client)
        .await;
    nack_redelivers_at_once_or_after_its_delay(&conn, &client).await;
    a_group_from_latest_or_an_offset_starts_there_on_every_shard(&conn, &client).await;
    an_exhausted_record_is_dead_lettered_once_with_its_headers(&conn, &client).await;
    answers_to_claims_not_held_get_stable_errors(&conn, &client).await;
    polls_end_at_stored_batch_ends_and_hand_every_record_out_once(&conn, &client).await;
    group_metrics_count_deliveries_acks_redeliveries_and_dead_letters(&broker).await;
    felixctl_group_consume_prints_each_record_then_acks_it(&broker, &conn, &client).await;
    super::groups_binary::binary_group_headers_answer_like_json_and_a_malformed_one_changes_nothing(&broker, &conn, &client).await;
    super::fencing::publish_if_and_commit_races_have_exactly_one_winner(&conn, &client).await;
    super::fencing::a_projection_writer_that_crashes_between_output_and_commit_neither_duplicates_nor_loses(&conn, &client).await;
}

async fn group_settings_live_in_the_control_plane_and_bad_ones_are_refused(
    conn: &Connection,
    client: &Client,
) {
    stream(conn, "admin", 2).await;
    conn.create_stream(T, NS, "eph", Default::default())
        .await
        .expect("ephemeral stream");
    let info = client
        .create_group(T, NS, "admin", "g1", GroupConfig::default())
        .await
        .expect("create group");
    assert_eq!(
        (info.visibility_timeout_ms, info.max_attempts),
        (30_000, 5),
        "defaults"
    );
    let again = client
        .create_group(T, NS, "admin", "g1", GroupConfig::default())
        .await
        .expect_err("created twice");
    assert_eq!(broker_code(&again).0, codes::ALREADY_EXISTS);
    for (stream, cfg, code) in [
        ("admin", config(0, 5, None), codes::INVALID_ARGUMENT),
        ("admin", config(1000, 0, None), codes::INVALID_ARGUMENT),
        (
            "admin",
            config(1000, 3, Some("missing")),
            codes::UNKNOWN_STREAM,
        ),
        (
            "admin",
            config(1000, 3, Some("admin")),
            codes::INVALID_ARGUMENT,
        ),
        ("eph", config(1000, 3, None), codes::INVALID_ARGUMENT),
        ("nope", config(1000, 3, None), codes::UNKNOWN_STREAM),
    ] {
        let e = client
            .create_group(T, NS, stream, "bad", cfg)
            .await
            .expect_err("bad group accepted");
        assert_eq!(broker_code(&e).0, code, "{e}");
    }
    let listed = client.list_groups(T, NS, "admin").await.expect("list");
    assert_eq!(
        listed.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(),
        vec!["g1"],
        "a refused create changes nothing"
    );
    let described = client
        .describe_group(T, NS, "admin", "g1")
        .await
        .expect("describe");
    assert_eq!(described.shards.len(), 2, "every shard described");
    let altered = client
        .alter_group(T, NS, "admin", "g1", config(5_000, 9, None).without_start())
        .await
        .expect("alter");
    assert_eq!(
        (altered.visibility_timeout_ms, altered.max_attempts),
        (5_000, 9)
    );
    for (bad, code) in [
        (
            config(5_000, 0, None).without_start(),
            codes::INVALID_ARGUMENT,
        ),
        (
            config(5_000, 3, Some("missing")).without_start(),
            codes::UNKNOWN_STREAM,
        ),
        // (A new start position is not bad input: it applies where the group has not
        // started, as a Kafka share group's `share.auto.offset.reset` does; held by
        // broker::kafka_share.)
    ] {
        let e = client
            .alter_group(T, NS, "admin", "g1", bad)
            .await
            .expect_err("bad alter accepted");
        assert_eq!(broker_code(&e).0, code, "{e}");
    }
    let kept = client.list_groups(T, NS, "admin").await.expect("list");
    assert_eq!(
        (kept[0].visibility_timeout_ms, kept[0].max_attempts),
        (5_000, 9),
        "a refused alter changes nothing"
    );
    let unknown = client
        .group(T, NS, "admin", "nope")
        .poll(1, Duration::ZERO)
        .await
        .expect_err("unknown group polled");
    assert_eq!(
        broker_code(&unknown),
        (codes::UNKNOWN_GROUP, "unknown_group".into())
    );
    client
        .delete_group(T, NS, "admin", "g1")
        .await
        .expect("delete");
    let gone = client
        .describe_group(T, NS, "admin", "g1")
        .await
        .expect_err("deleted group described");
    assert_eq!(broker_code(&gone).0, codes::UNKNOWN_GROUP);
}

async fn concurrent_consumers_ack_every_record_exactly_once_and_never_share_a_claim(
    conn: &Connection,
    broker: &Broker,
) {
    const RECORDS: usize = 4_000;
    const CONSUMERS: usize = 4;
    stream(conn, "work", 4).await;
    let client = cluster_client(broker).await;
    let published = publish(&client, "work", "w", RECORDS).await;
    client
        .create_group(T, NS, "work", "workers", config(30_000, 5, None))
        .await
        .expect("group");
    // (shard, offset) held right now, and how often each payload was acknowledged.
    let held: Arc<Mutex<HashSet<(u32, u64)>>> = Arc::default();
    let acked: Arc<Mutex<BTreeMap<Bytes, u32>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..CONSUMERS {
        // A client each, as separate processes would have.
        let client = cluster_client(broker).await;
        let (held, acked) = (held.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let mut consumer = client.group(T, NS, "work", "workers");
            let until = tokio::time::Instant::now() + PATIENCE;
            let mut idle = 0;
            while tokio::time::Instant::now() < until && idle < 6 {
                let records = consumer
                    .poll(64, Duration::from_millis(300))
                    .await
                    .expect("poll");
                if records.is_empty() {
                    if acked.lock().len() >= RECORDS {
                        idle += 1;
                    }
                    continue;
                }
                for r in &records {
                    assert!(
                        held.lock().insert((r.shard, r.offset)),
                        "shard {} offset {} handed to two consumers at once",
                        r.shard,
                        r.offset
                    );
                }
                consumer.ack_all(&records).await.expect("ack");
                let mut a = acked.lock();
                let mut h = held.lock();
                for r in &records {
                    *a.entry(r.payload.clone()).or_default() += 1;
                    h.remove(&(r.shard, r.offset));
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("consumer");
    }
    let acked = acked.lock();
    let twice: Vec<_> = acked.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "acknowledged more than once: {twice:?}");
    let got: BTreeSet<Bytes> = acked.keys().cloned().collect();
    assert_eq!(got.len(), published.len(), "every record acknowledged");
    assert_eq!(got, published);
}

async fn a_claim_never_answered_is_redelivered_after_its_visibility_timeout_as_attempt_2(
    conn: &Connection,
    client: &Client,
) {
    stream(conn, "vanish", 2).await;
    publish(client, "vanish", "v", 100).await;
    client
        .create_group(T, NS, "vanish", "g", config(3_000, 5, None))
        .await
        .expect("group");
    let claimed = {
        let vanished = cluster_client_of(client).await;
        let mut a = vanished.group(T, NS, "vanish", "g");
        poll_n(&mut a, 100).await
        // `a` and its client go away without answering.
    };
    assert!(claimed.iter().all(|r| r.attempt == 1));
    let first_deadline = claimed.iter().map(|r| r.deadline_ms).min().expect("claims");
    let mut b = client.group(T, NS, "vanish", "g");
    let early = b.poll(100, Duration::ZERO).await.expect("poll");
    assert!(
        early.is_empty() || now_ms() >= first_deadline,
        "redelivered before the visibility timeout: {early:?}"
    );
    let again = poll_n(&mut b, 100).await;
    let received = now_ms();
    assert!(
        received >= first_deadline,
        "redelivered at {received}, before the deadline {first_deadline}"
    );
    let before: BTreeSet<(u32, u64)> = claimed.iter().map(|r| (r.shard, r.offset)).collect();
    let after: BTreeSet<(u32, u64)> = again.iter().map(|r| (r.shard, r.offset)).collect();
    assert_eq!(before, after, "every lapsed claim redelivered");
    assert!(again.iter().all(|r| r.attempt == 2), "attempt 2 each");
    b.ack_all(&again).await.expect("ack");
    assert!(
        b.poll(10, Duration::from_millis(300))
            .await
            .expect("poll")
            .is_empty()
    );
}

/// Another client of the same cluster (a consumer that can vanish alone).
async fn cluster_client_of(client: &Client) -> Client {
    Client::connect(client.seeds().to_vec(), ClientConfig::default())
        .await
        .expect("connect")
}

async fn a_group_from_latest_or_an_offset_starts_there_on_every_shard(
    conn: &Connection,
    client: &Client,
) {
    stream(conn, "starts", 2).await;
    let before = publish(client, "starts", "before", 20).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    client
        .create_group(
            T,
            NS,
            "starts",
            "latest",
            GroupConfig {
                start: Some(GroupStart::Latest),
                ..GroupConfig::default()
            },
        )
        .await
        .expect("group from latest");
    client
        .create_group(
            T,
            NS,
            "starts",
            "offset",
            GroupConfig {
                start: Some(GroupStart::Offset(5)),
                ..GroupConfig::default()
            },
        )
        .await
        .expect("group from offset 5");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let after = publish(client, "starts", "after", 20).await;
    let mut latest = client.group(T, NS, "starts", "latest");
    let got = poll_n(&mut latest, 20).await;
    let payloads: BTreeSet<Bytes> = got.iter().map(|r| r.payload.clone()).collect();
    assert_eq!(
        payloads, after,
        "from latest: only what came after the group's creation"
    );
    assert!(
        latest
            .poll(5, Duration::from_millis(300))
            .await
            .expect("poll")
            .is_empty()
    );
    latest.ack_all(&got).await.expect("ack");
    let mut offset = client.group(T, NS, "starts", "offset");
    let got = poll_n(&mut offset, 30).await;
    assert!(
        got.iter().all(|r| r.offset >= 5),
        "from offset 5 on each shard"
    );
    let total = before.len() + after.len();
    let per_shard: BTreeMap<u32, usize> = got.iter().fold(BTreeMap::new(), |mut m, r| {
        *m.entry(r.shard).or_default() += 1;
        m
    });
    assert_eq!(got.len() + 5 * per_shard.len(), total, "{per_shard:?}");
    offset.ack_all(&got).await.expect("ack");
}

async fn nack_redelivers_at_once_or_after_its_delay(conn: &Connection, client: &Client) {
    stream(conn, "nack", 1).await;
    publish(client, "nack", "n", 2).await;
    client
        .create_group(T, NS, "nack", "g", config(30_000, 5, None))
        .await
        .expect("group");
    let mut c = client.group(T, NS, "nack", "g");
    let first = poll_n(&mut c, 2).await;
    let (now, later) = (&first[0], &first[1]);
    now.nack(None, Some("retry now")).await.expect("nack");
    let again = c.poll(10, Duration::ZERO).await.expect("poll");
    assert_eq!(
        again
            .iter()
            .map(|r| (r.offset, r.attempt))
            .collect::<Vec<_>>(),
        vec![(now.offset, 2)],
        "a nack without delay redelivers at once"
    );
    let nacked_at = now_ms();
    later
        .nack(Some(Duration::from_millis(1_500)), None)
        .await
        .expect("nack with delay");
    let early = c.poll(10, Duration::ZERO).await.expect("poll");
    assert!(
        early.is_empty() || now_ms() >= nacked_at + 1_500,
        "{early:?}"
    );
    let delayed = poll_n(&mut c, 1).await;
    assert!(
        now_ms() >= nacked_at + 1_500,
        "redelivered before its delay"
    );
    assert_eq!((delayed[0].offset, delayed[0].attempt), (later.offset, 2));
    c.ack_all(&again).await.expect("ack");
    c.ack_all(&delayed).await.expect("ack");
}

async fn an_exhausted_record_is_dead_lettered_once_with_its_headers(
    conn: &Connection,
    client: &Client,
) {
    stream(conn, "poison", 1).await;
    stream(conn, "poison-dlq", 1).await;
    client
        .publish_batch(
            T,
            NS,
            "poison",
            vec![Message::new("poison").with_key("k").with_header("h", "v")],
            AckMode::Batch,
        )
        .await
        .expect("publish");
    client
        .create_group(T, NS, "poison", "g", config(1_000, 3, Some("poison-dlq")))
        .await
        .expect("group");
    let mut c = client.group(T, NS, "poison", "g");
    for attempt in 1..=3 {
        let r = poll_n(&mut c, 1).await;
        assert_eq!(r[0].attempt, attempt);
        r[0].nack(None, Some(&format!("failed {attempt}")))
            .await
            .expect("nack");
    }
    // A second poison record whose consumers all vanish: its third claim lapses with no
    // one polling, and it is still dead-lettered.
    client
        .publish_batch(T, NS, "poison", vec![Message::new("lapse")], AckMode::Batch)
        .await
        .expect("publish");
    for attempt in 1..=3 {
        let r = poll_n(&mut c, 1).await;
        assert_eq!(
            (r[0].payload.as_ref(), r[0].attempt),
            (&b"lapse"[..], attempt)
        );
    }
    let mut dlq = conn
        .subscribe(T, NS, "poison-dlq", 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    let letters = dead_letters(&mut dlq, 2).await;
    let nacked = &letters[0];
    assert_eq!(nacked.payload.as_ref(), b"poison");
    assert_eq!(nacked.key.as_deref(), Some(&b"k"[..]));
    assert_eq!(
        header(nacked, "felix-dlq-stream").as_deref(),
        Some("groups/ns/poison")
    );
    assert_eq!(header(nacked, "felix-dlq-shard").as_deref(), Some("0"));
    assert_eq!(header(nacked, "felix-dlq-offset").as_deref(), Some("0"));
    assert_eq!(header(nacked, "felix-dlq-group").as_deref(), Some("g"));
    assert_eq!(header(nacked, "felix-dlq-attempts").as_deref(), Some("3"));
    assert_eq!(
        header(nacked, "felix-dlq-reason").as_deref(),
        Some("failed 3")
    );
    assert_eq!(
        header(nacked, "h").as_deref(),
        Some("v"),
        "its own headers kept"
    );
    let lapsed = &letters[1];
    assert_eq!(lapsed.payload.as_ref(), b"lapse");
    assert_eq!(header(lapsed, "felix-dlq-attempts").as_deref(), Some("3"));
    assert_eq!(header(lapsed, "felix-dlq-reason"), None);
    // Once, and nowhere else again: no third letter, and the group hands out nothing.
    let more = tokio::time::timeout(Duration::from_millis(2_500), dlq.next_event()).await;
    assert!(more.is_err(), "a record dead-lettered twice: {more:?}");
    assert!(
        c.poll(5, Duration::from_millis(500))
            .await
            .expect("poll")
            .is_empty()
    );
    let info = client
        .describe_group(T, NS, "poison", "g")
        .await
        .expect("describe");
    assert_eq!(info.shards[0].dead_lettered, 2);
    assert_eq!((info.shards[0].in_flight, info.shards[0].waiting), (0, 0));

    many_records_nacked_at_once_are_each_dead_lettered_once(conn, client).await;

    // Without a dead-letter stream, an exhausted record is retired and counted.
    client
        .create_group(T, NS, "poison", "no-dlq", config(30_000, 1, None))
        .await
        .expect("group");
    let mut d = client.group(T, NS, "poison", "no-dlq");
    for r in poll_n(&mut d, 2).await {
        r.nack(None, None).await.expect("nack");
    }
    assert!(
        d.poll(5, Duration::from_millis(300))
            .await
            .expect("poll")
            .is_empty()
    );
    let info = client
        .describe_group(T, NS, "poison", "no-dlq")
        .await
        .expect("describe");
    assert_eq!(info.shards[0].dead_lettered, 2);
}

/// Thirty records nacked on their last attempt in one request: dead-lettered together (one
/// batch of the group's idempotent producer), each exactly once, in offset order, with its
/// own payload and headers.
async fn many_records_nacked_at_once_are_each_dead_lettered_once(
    conn: &Connection,
    client: &Client,
) {
    stream(conn, "poison-many", 1).await;
    stream(conn, "poison-many-dlq", 1).await;
    let published: Vec<Message> = (0..30).map(|i| Message::new(format!("p{i}"))).collect();
    client
        .publish_batch(T, NS, "poison-many", published, AckMode::Batch)
        .await
        .expect("publish");
    client
        .create_group(
            T,
            NS,
            "poison-many",
            "g",
            config(30_000, 1, Some("poison-many-dlq")),
        )
        .await
        .expect("group");
    let mut c = client.group(T, NS, "poison-many", "g");
    let records = poll_n(&mut c, 30).await;
    c.nack_all(&records, None, Some("bad")).await.expect("nack");
    let mut dlq = conn
        .subscribe(T, NS, "poison-many-dlq", 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    let letters = dead_letters(&mut dlq, 30).await;
    for (i, e) in letters.iter().enumerate() {
        assert_eq!(e.payload.as_ref(), format!("p{i}").as_bytes());
        assert_eq!(header(e, "felix-dlq-offset"), Some(i.to_string()));
        assert_eq!(header(e, "felix-dlq-attempts").as_deref(), Some("1"));
        assert_eq!(header(e, "felix-dlq-reason").as_deref(), Some("bad"));
    }
    let more = tokio::time::timeout(Duration::from_millis(1_500), dlq.next_event()).await;
    assert!(more.is_err(), "a record dead-lettered twice: {more:?}");
    let info = client
        .describe_group(T, NS, "poison-many", "g")
        .await
        .expect("describe");
    assert_eq!(info.shards[0].dead_lettered, 30);
    assert_eq!((info.shards[0].in_flight, info.shards[0].waiting), (0, 0));
}

/// Polls of few records over stored batches of ten: a poll that has a record already ends
/// where a stored batch ends rather than inside the next one (which the broker would have to
/// decode and rebuild with part of its records); a poll that has none takes part of a batch;
/// and across them every record is handed out once, with its own payload, none skipped.
async fn polls_end_at_stored_batch_ends_and_hand_every_record_out_once(
    conn: &Connection,
    client: &Client,
) {
    stream(conn, "batched", 1).await;
    for b in 0..10 {
        // One publish, one stored batch of ten.
        let messages: Vec<Message> = (0..10)
            .map(|i| Message::new(Bytes::from(format!("b-{}", b * 10 + i))))
            .collect();
        client
            .publish_batch(T, NS, "batched", messages, AckMode::Batch)
            .await
            .expect("publish");
    }
    client
        .create_group(T, NS, "batched", "g", config(30_000, 5, None))
        .await
        .expect("group");
    let mut c = client.group(T, NS, "batched", "g");
    let mut handed: Vec<GroupRecord> = Vec::new();
    // (records asked for, the offsets handed out): one shard, so a poll asks for `max`.
    for (max, want) in [
        (15, 0..10),    // the second batch would not fit: ends at the first's end
        (3, 10..13),    // nothing yet: part of a batch
        (25, 13..30),   // the rest of that batch and the next; the one after would not fit
        (7, 30..37),    // part again
        (10, 37..40),   // the rest of the batch only
        (500, 40..100), // everything left
    ] {
        let got = c.poll(max, Duration::ZERO).await.expect("poll");
        let offsets: Vec<u64> = got.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, want.collect::<Vec<_>>(), "a poll of {max}");
        handed.extend(got);
    }
    for r in &handed {
        assert_eq!(r.payload, format!("b-{}", r.offset), "offset {}", r.offset);
        assert_eq!(r.attempt, 1);
    }
    assert!(
        c.poll(10, Duration::from_millis(300))
            .await
            .expect("poll")
            .is_empty(),
        "nothing handed out twice"
    );
    c.ack_all(&handed).await.expect("ack");
    let info = client
        .describe_group(T, NS, "batched", "g")
        .await
        .expect("describe");
    assert_eq!(
        (info.shards[0].acked, info.shards[0].acked_up_to),
        (100, 100)
    );
}

async fn answers_to_claims_not_held_get_stable_errors(conn: &Connection, client: &Client) {
    stream(conn, "errs", 1).await;
    publish(client, "errs", "e", 2).await;
    client
        .create_group(T, NS, "errs", "g", config(1_000, 5, None))
        .await
        .expect("group");
    let mut a = client.group(T, NS, "errs", "g");
    let b = client.group(T, NS, "errs", "g");
    let held = poll_n(&mut a, 2).await;
    let not_mine = b
        .ack_claims(0, &[(held[0].offset, held[0].attempt)])
        .await
        .expect_err("acked another consumer's claim");
    assert_eq!(
        broker_code(&not_mine),
        (codes::CLAIM_NOT_HELD, "not_claimed_by_you".into())
    );
    let never = a
        .ack_claims(0, &[(held[0].offset, held[0].attempt), (999, 1)])
        .await
        .expect_err("acked an offset never handed out");
    assert_eq!(broker_code(&never).1, "not_claimed_by_you");
    // Refused whole: the good claim in it is still held, and acks now.
    held[0].ack().await.expect("ack after a refused batch");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let expired = held[1].ack().await.expect_err("acked a lapsed claim");
    assert_eq!(
        broker_code(&expired),
        (codes::CLAIM_NOT_HELD, "claim_expired".into())
    );
    // The acknowledged one never returns; the lapsed one does, as attempt 2.
    let again = poll_n(&mut a, 1).await;
    assert_eq!((again[0].offset, again[0].attempt), (held[1].offset, 2));
    again[0].ack().await.expect("ack");
}

async fn group_metrics_count_deliveries_acks_redeliveries_and_dead_letters(broker: &Broker) {
    let text = broker.metrics().await;
    let value = |name: &str, group_stream: &str| -> f64 {
        metric_lines(&text, name)
            .into_iter()
            .filter(|l| l.contains(&format!("stream=\"{group_stream}\"")))
            .map(metric_value)
            .sum()
    };
    assert_eq!(value("felix_group_records_acked_total", "work"), 4_000.0);
    assert!(value("felix_group_records_delivered_total", "work") >= 4_000.0);
    assert_eq!(
        value("felix_group_records_redelivered_total", "vanish"),
        100.0
    );
    assert_eq!(
        value("felix_group_records_dead_lettered_total", "poison"),
        4.0
    );
    // A group's counters exist from its first delivery, at 0 until their first event, so
    // that event shows in Prometheus' increase(): "work" never dead-lettered a record.
    assert!(
        metric_lines(&text, "felix_group_records_dead_lettered_total")
            .into_iter()
            .any(|l| l.contains("stream=\"work\"") && metric_value(l) == 0.0),
        "no zero dead-letter series for a group that has none:\n{text}"
    );
    for gauge in ["felix_group_in_flight", "felix_group_backlog_records"] {
        assert!(
            !metric_lines(&text, gauge).is_empty(),
            "{gauge} not exported:\n{text}"
        );
    }
}

/// kill -9 mid-run: acknowledged records never come back, claimed and nacked ones do with
/// their attempt counts, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_progress_and_attempt_counts_survive_kill_9() {
    let mut broker = Broker::start(BrokerOptions::new()).await;
    let conn = broker.client().await;
    durable_stream(&conn, T, NS, "kill", 2).await;
    let client = cluster_client(&broker).await;
    let published = publish(&client, "kill", "k", 600).await;
    client
        .create_group(T, NS, "kill", "g", config(2_000, 10, None))
        .await
        .expect("group");
    let mut c = client.group(T, NS, "kill", "g");
    let mut all = poll_n(&mut c, 600).await;
    all.sort_by_key(|r| (r.shard, r.offset));
    let (acked, rest) = all.split_at(300);
    let (nacked, claimed) = rest.split_at(100);
    c.ack_all(acked).await.expect("ack");
    for r in nacked {
        r.nack(None, None).await.expect("nack");
    }
    // Claimed again as attempt 2 and left unanswered, like the other 200 at attempt 1.
    let second = poll_n(&mut c, 100).await;
    assert!(second.iter().all(|r| r.attempt == 2));
    drop(c);
    drop(client);
    broker.restart().await; // SIGKILL, then start on the same data
    let client = cluster_client(&broker).await;
    let mut c = client.group(T, NS, "kill", "g");
    let after = poll_n(&mut c, 300).await;
    let acked_payloads: BTreeSet<Bytes> = acked.iter().map(|r| r.payload.clone()).collect();
    let attempts: BTreeMap<Bytes, u32> = after
        .iter()
        .map(|r| (r.payload.clone(), r.attempt))
        .collect();
    assert_eq!(attempts.len(), 300, "each unacknowledged record once");
    for r in &after {
        assert!(
            !acked_payloads.contains(&r.payload),
            "acknowledged record {:?} redelivered after the restart",
            r.payload
        );
    }
    for r in claimed {
        assert_eq!(
            attempts.get(&r.payload),
            Some(&2),
            "claimed once, then lapsed"
        );
    }
    for r in nacked {
        assert_eq!(
            attempts.get(&r.payload),
            Some(&3),
            "nacked, claimed again, lapsed"
        );
    }
    c.ack_all(&after).await.expect("ack");
    assert!(
        c.poll(10, Duration::from_millis(500))
            .await
            .expect("poll")
            .is_empty()
    );
    let mut everything = acked_payloads;
    everything.extend(attempts.into_keys());
    assert_eq!(everything, published, "nothing lost");
}

/// In a cluster (one cluster for both steps): on a stream of one replica per shard, spread
/// over the brokers, one consumer following each shard's leader acknowledges every record
/// once; then a group on a 3-replica Quorum stream survives killing the shard's leader
/// (`groups_failover`, last: it kills a broker).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn groups_in_a_cluster_follow_shard_leaders_and_survive_failover() {
    let mut cluster = super::cluster::Cluster::start(3).await;
    let client = cluster.client(Duration::from_secs(10)).await;
    client.create_tenant("t").await.expect("tenant");
    client.create_namespace("t", "ns").await.expect("namespace");
    client
        .create_stream(
            "t",
            "ns",
            "spread",
            felix_client::StreamConfig {
                durable: Some(true),
                shards: Some(6),
                replicas: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("stream");
    let mut published = BTreeSet::new();
    let messages: Vec<Message> = (0..300)
        .map(|i| {
            let p = Bytes::from(format!("s-{i}"));
            published.insert(p.clone());
            Message::new(p.clone()).with_key(p)
        })
        .collect();
    client
        .publish_batch("t", "ns", "spread", messages, AckMode::Batch)
        .await
        .expect("publish");
    client
        .create_group("t", "ns", "spread", "g", GroupConfig::default())
        .await
        .expect("group");
    let mut c = client.group("t", "ns", "spread", "g");
    let got = poll_n(&mut c, 300).await;
    c.ack_all(&got).await.expect("ack");
    let payloads: BTreeSet<Bytes> = got.iter().map(|r| r.payload.clone()).collect();
    assert_eq!((payloads.len(), payloads), (300, published));
    let info = client
        .describe_group("t", "ns", "spread", "g")
        .await
        .expect("describe");
    assert_eq!(info.shards.len(), 6, "each shard described by its leader");
    assert_eq!(info.shards.iter().map(|s| s.acked).sum::<u64>(), 300);
    super::groups_failover::a_group_on_a_quorum_stream_survives_killing_the_leader(
        &mut cluster,
        &client,
    )
    .await;
}

async fn felixctl_group_consume_prints_each_record_then_acks_it(
    broker: &Broker,
    conn: &Connection,
    client: &Client,
) {
    use super::felixctl::run;
    stream(conn, "ctl", 2).await;
    publish(client, "ctl", "c", 6).await;
    run(
        broker,
        &[
            "group",
            "create",
            "groups/ns/ctl",
            "g",
            "--visibility-timeout",
            "30s",
            "--max-attempts",
            "3",
            "--from",
            "earliest",
        ],
        b"",
    )
    .await;
    let listed = run(broker, &["group", "list", "groups/ns/ctl"], b"").await;
    assert!(listed.stdout.starts_with("g\t"), "{}", listed.stdout);
    // --nack: printed, then released at once: the next consume sees them as attempt 2.
    let nacked = run(
        broker,
        &[
            "group",
            "consume",
            "groups/ns/ctl",
            "g",
            "--count",
            "2",
            "--nack",
            "--output",
            "jsonl",
        ],
        b"",
    )
    .await;
    let lines = |out: &super::felixctl::Output| -> Vec<serde_json::Value> {
        out.stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    };
    let first = lines(&nacked);
    assert_eq!(first.len(), 2, "{}", nacked.stdout);
    let consumed = run(
        broker,
        &[
            "group",
            "consume",
            "groups/ns/ctl",
            "g",
            "--count",
            "10",
            "--wait",
            "2s",
            "--output",
            "jsonl",
        ],
        b"",
    )
    .await;
    let all = lines(&consumed);
    assert_eq!(all.len(), 6, "every record once: {}", consumed.stdout);
    for line in &all {
        for field in [
            "shard",
            "offset",
            "attempt",
            "timestamp",
            "key",
            "payload",
            "headers",
        ] {
            assert!(line.get(field).is_some(), "{field} missing in {line}");
        }
        let was_nacked = first
            .iter()
            .any(|f| f["shard"] == line["shard"] && f["offset"] == line["offset"]);
        assert_eq!(line["attempt"], if was_nacked { 2 } else { 1 }, "{line}");
    }
    // Acknowledged before felixctl exited: nothing is left to hand out.
    let info = client
        .describe_group(T, NS, "ctl", "g")
        .await
        .expect("describe");
    assert_eq!(info.shards.iter().map(|s| s.acked).sum::<u64>(), 6);
    let described = run(broker, &["group", "describe", "groups/ns/ctl", "g"], b"").await;
    assert!(
        described.stdout.contains("acked_up_to"),
        "{}",
        described.stdout
    );
    run(broker, &["group", "delete", "groups/ns/ctl", "g"], b"").await;
    assert!(
        client
            .list_groups(T, NS, "ctl")
            .await
            .expect("list")
            .is_empty()
    );
}

/// With auth on, every group request is checked before any work: consuming needs
/// `group.consume` on the stream, creating and deleting a group `stream.manage`, listing
/// any grant on the stream; a refused request changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_requests_check_their_permission_before_any_work() {
    let broker = Broker::start(BrokerOptions::new().env("FELIX_AUTH", "on")).await;
    let admin = broker.client().await;
    durable_stream(&admin, "alpha", "prod", "orders", 1).await;
    let token = |allow: &[&str]| felix_client::TokenSpec {
        tenant: "alpha".into(),
        allow: allow.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    };
    let client_with = |token: String| {
        let addr = broker.quic_addr.to_string();
        async move {
            Client::connect(
                [addr],
                ClientConfig {
                    token: Some(token),
                    ..ClientConfig::default()
                },
            )
            .await
            .expect("connect")
        }
    };
    let owner = client_with(broker.admin_token().expect("admin token")).await;
    owner
        .publish_batch(
            "alpha",
            "prod",
            "orders",
            vec![Message::new("o")],
            AckMode::Batch,
        )
        .await
        .expect("publish");
    let reader = admin
        .mint_token(token(&["stream.subscribe:alpha/prod/orders"]))
        .await
        .expect("mint");
    let consumer = admin
        .mint_token(token(&["group.consume:alpha/prod/orders"]))
        .await
        .expect("mint");
    let reader = client_with(reader.token).await;
    let consumer = client_with(consumer.token).await;
    let forbidden = |e: ClientError| assert_eq!(broker_code(&e).0, codes::FORBIDDEN, "{e}");

    forbidden(
        consumer
            .create_group("alpha", "prod", "orders", "g", GroupConfig::default())
            .await
            .expect_err("created a group with group.consume only"),
    );
    owner
        .create_group("alpha", "prod", "orders", "g", GroupConfig::default())
        .await
        .expect("stream.manage creates");
    forbidden(
        reader
            .group("alpha", "prod", "orders", "g")
            .poll(1, Duration::ZERO)
            .await
            .expect_err("polled with stream.subscribe only"),
    );
    let mut c = consumer.group("alpha", "prod", "orders", "g");
    let got = poll_n(&mut c, 1).await;
    assert_eq!(
        (got[0].offset, got[0].attempt),
        (0, 1),
        "the refused poll claimed nothing"
    );
    got[0].ack().await.expect("ack with group.consume");
    assert_eq!(
        consumer
            .list_groups("alpha", "prod", "orders")
            .await
            .expect("list with a grant on the stream")
            .len(),
        1
    );
    forbidden(
        consumer
            .delete_group("alpha", "prod", "orders", "g")
            .await
            .expect_err("deleted with group.consume only"),
    );
}
