//! Fanout fairness (spec: "Fanout Fairness", "Slow Subscriber Behavior"): a stalled
//! subscriber lags alone. Its QUIC stream fills, then its small queue, then it is dropped from
//! and — the stream being durable — ended with `subscription_lagged` after what was queued;
//! a fast subscriber beside it receives everything; resubscribing from the resume offset
//! yields the rest with no gap. A client without the lagged feature keeps its subscription
//! past a drop; falling behind is logged once per episode; a subscriber that stops reading
//! holds no more than its queue's byte bound, and a replay is sent a connection's egress
//! share at a time.

use bytes::Bytes;
use felix_client::{
    AckMode, ClientConfig, ClientError, Connection, Event, Message, StartAt, Subscription, features,
};

use super::common::{
    Broker, BrokerOptions, PATIENCE, assert_contiguous, durable_stream, metric_lines, metric_value,
    read_until,
};

const TENANT: &str = "fanout";
const NS: &str = "ns";
const STREAM: &str = "wide";
/// Records per batch and bytes per record: 256 KiB a batch.
const PER_BATCH: usize = 32;
const RECORD_BYTES: usize = 8 * 1024;
/// A stalled subscriber must lag well before this much is published (its QUIC stream window,
/// 16 MiB at most, plus a 4-slot queue).
const MAX_PUBLISHED: usize = 160 * 1024 * 1024;
/// Batches published after the lag, delivered live to the resumed subscription.
const AFTER_LAG: u64 = 8;

fn record(batch: u64, i: usize) -> Bytes {
    let mut v = format!("b{batch}-r{i}:").into_bytes();
    v.resize(RECORD_BYTES, b'a' + (i % 26) as u8);
    Bytes::from(v)
}

/// Publishes batch `b` and waits until the fast subscriber has read it.
async fn publish_batch_and_follow(
    publisher: &Connection,
    fast: &mut Subscription,
    payloads: &mut Vec<Bytes>,
    fast_events: &mut Vec<Event>,
    b: u64,
) {
    let batch: Vec<Bytes> = (0..PER_BATCH).map(|i| record(b, i)).collect();
    let messages = batch.iter().cloned().map(Message::new).collect();
    let published = publisher
        .publish_batch(TENANT, NS, STREAM, messages, AckMode::Batch)
        .await
        .unwrap_or_else(|e| {
            panic!("publish of batch {b} failed (publishers never wait for subscribers): {e:?}")
        });
    assert_eq!(
        published[0].base_offset,
        payloads.len() as u64,
        "offsets are dense"
    );
    payloads.extend(batch);
    let got = read_until(fast, payloads.len() as u64, "fast subscriber").await;
    fast_events.extend(got);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_lags_alone_and_resumes_without_loss() {
    let broker =
        Broker::start(BrokerOptions::new().env("FELIX_SUBSCRIBER_QUEUE_CAPACITY", 4)).await;
    let publisher = broker.client().await;
    durable_stream(&publisher, TENANT, NS, STREAM, 1).await;

    // Each subscriber on a connection of its own, so the stalled one's unread bytes hold no
    // connection-level credit the fast one needs.
    let fast_client = broker.client().await;
    let stalled_client = broker.client().await;
    let mut fast = fast_client
        .subscribe(TENANT, NS, STREAM, 0, StartAt::Earliest)
        .await
        .expect("fast subscribe");
    let mut stalled = stalled_client
        .subscribe(TENANT, NS, STREAM, 0, StartAt::Earliest)
        .await
        .expect("stalled subscribe");

    // Publish until the broker reports the stalled subscription lagged, then stop. The
    // publisher waits for the fast subscriber to have each batch before the next one, so the
    // fast one is never more than a batch behind: if the stalled subscriber held anything
    // up, this would hang.
    let mut fast_events = Vec::new();
    let mut payloads: Vec<Bytes> = Vec::new();
    let mut batches = 0u64;
    loop {
        publish_batch_and_follow(
            &publisher,
            &mut fast,
            &mut payloads,
            &mut fast_events,
            batches,
        )
        .await;
        batches += 1;
        if batches.is_multiple_of(4) && lagged_subscriptions_of(&broker, TENANT).await >= 1.0 {
            break;
        }
        assert!(
            payloads.len() * RECORD_BYTES < MAX_PUBLISHED,
            "{} MiB published and the stalled subscriber never lagged",
            (payloads.len() * RECORD_BYTES) >> 20
        );
    }
    let lag_end = payloads.len() as u64;
    eprintln!(
        "lag reported after {batches} batches ({} MiB, {lag_end} records)",
        (payloads.len() * RECORD_BYTES) >> 20
    );

    // The stalled subscriber now reads, with nothing more being published: what was queued
    // before the drop, then the lag.
    let mut before_lag = Vec::new();
    let resume_offset = loop {
        match tokio::time::timeout(PATIENCE, stalled.next_event()).await {
            Err(_) => panic!(
                "stalled subscriber: no lag after {} events (last offset {:?})",
                before_lag.len(),
                before_lag.last().map(|e: &felix_client::Event| e.offset)
            ),
            Ok(Ok(Some(e))) => before_lag.push(e),
            Ok(Err(ClientError::SubscriptionLagged { resume_offset })) => break resume_offset,
            Ok(other) => panic!(
                "stalled subscriber: expected events then SubscriptionLagged, got {other:?} after {} events",
                before_lag.len()
            ),
        }
    };
    eprintln!(
        "stalled subscriber: {} records before subscription_lagged, resume at {resume_offset}",
        before_lag.len()
    );
    assert!(
        resume_offset < lag_end,
        "resume offset {resume_offset} is inside what was published ({lag_end})"
    );
    assert_contiguous(&before_lag, 0, "stalled subscriber before the lag");
    assert_eq!(
        before_lag.len() as u64,
        resume_offset,
        "stalled subscriber: the resume offset is the first record it did not get"
    );
    for e in &before_lag {
        assert_eq!(
            e.payload, payloads[e.offset as usize],
            "stalled subscriber: offset {}",
            e.offset
        );
    }

    // Resuming from there catches up from the log, then joins live delivery: more batches
    // are published, and it gets everything from the resume offset on, with no gap.
    let mut resumed = stalled_client
        .subscribe(TENANT, NS, STREAM, 0, StartAt::Offset(resume_offset))
        .await
        .expect("resubscribe from the resume offset");
    assert_eq!(resumed.start_offset(), resume_offset);
    let mut rest = read_until(&mut resumed, lag_end, "resumed subscriber, catching up").await;
    for _ in 0..AFTER_LAG {
        publish_batch_and_follow(
            &publisher,
            &mut fast,
            &mut payloads,
            &mut fast_events,
            batches,
        )
        .await;
        batches += 1;
        rest.extend(
            read_until(
                &mut resumed,
                payloads.len() as u64,
                "resumed subscriber, live",
            )
            .await,
        );
    }
    let end = payloads.len() as u64;
    assert_contiguous(&rest, resume_offset, "resumed subscriber");
    assert_eq!(rest.len() as u64, end - resume_offset);
    for e in &rest {
        assert_eq!(
            e.payload, payloads[e.offset as usize],
            "resumed subscriber: offset {}",
            e.offset
        );
    }

    // The fast subscriber got everything, in order, and was never ended.
    assert_eq!(fast_events.len() as u64, end);
    assert_contiguous(&fast_events, 0, "fast subscriber");
    for e in &fast_events {
        assert_eq!(
            e.payload, payloads[e.offset as usize],
            "fast subscriber: offset {}",
            e.offset
        );
    }

    // Only the stalled one lagged.
    let lagged = lagged_subscriptions_of(&broker, TENANT).await;
    assert_eq!(lagged, 1.0, "exactly one subscription ended as lagged");
}

/// Spec ("Disconnection Behavior"): a subscriber that disconnects is removed from the
/// registry at once, whether or not anything is published after. Subscriptions are dropped
/// (the client stops reading their streams) and a connection is closed on an idle stream;
/// the broker's `felix_subscriptions_active` must come back to zero without another publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_goes_away_is_removed_without_waiting_for_a_publish() {
    let broker = Broker::start(BrokerOptions::new()).await;
    let client = broker.client().await;
    durable_stream(&client, TENANT, NS, STREAM, 1).await;
    client
        .publish(TENANT, NS, STREAM, Message::new("one"), AckMode::Batch)
        .await
        .expect("publish");

    let active = |text: String| -> f64 {
        metric_lines(&text, "felix_subscriptions_active")
            .first()
            .map_or(0.0, |l| metric_value(l))
    };
    let other = broker.client().await;
    let mut subs = Vec::new();
    for from in [StartAt::Earliest, StartAt::Latest] {
        subs.push(
            client
                .subscribe(TENANT, NS, STREAM, 0, from)
                .await
                .expect("subscribe"),
        );
        subs.push(
            other
                .subscribe(TENANT, NS, STREAM, 0, from)
                .await
                .expect("subscribe"),
        );
    }
    // The ones from the earliest offset have their record; all four are now idle.
    for s in subs.iter_mut().take(2) {
        read_until(s, 1, "subscriber").await;
    }
    assert_eq!(
        active(broker.metrics().await),
        4.0,
        "four subscriptions open"
    );

    drop(subs);
    other.close().await;
    // Generous for "at once"; short enough that a failure does not stall the suite.
    let within = std::time::Duration::from_secs(20);
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let n = active(broker.metrics().await);
        if n == 0.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} subscriptions still registered {within:?} after their subscribers went away"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Drops of one tenant's subscriber queues, from `felix_sub_queue_dropped_total`.
async fn dropped_batches(broker: &Broker, tenant: &str) -> f64 {
    let text = broker.metrics().await;
    metric_lines(&text, "felix_sub_queue_dropped_total")
        .iter()
        .filter(|l| l.contains(&format!("tenant=\"{tenant}\"")))
        .map(|l| metric_value(l))
        .sum()
}

/// How many lines of the broker's log contain `needle`.
fn log_lines_with(broker: &Broker, needle: &str) -> usize {
    std::fs::read_to_string(broker.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

const FELL_BEHIND: &str = "fell behind live delivery";
const DELIVERED_AGAIN: &str = "fell behind is being delivered to again";

/// Spec ("Fanout Fairness"): a client that did not offer FEATURE_SUBSCRIPTION_LAGGED keeps
/// its durable subscription through a drop and sees it as a jump between consecutive
/// offsets. Spec ("Slow Subscriber Behavior"): the broker logs when a subscriber falls
/// behind, once per episode however many batches it drops, not only counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_without_the_lagged_feature_keeps_its_subscription_and_falling_behind_is_logged_once()
 {
    const TENANT: &str = "jumps";
    let broker =
        Broker::start(BrokerOptions::new().env("FELIX_SUBSCRIBER_QUEUE_CAPACITY", 4)).await;
    let publisher = broker.client().await;
    durable_stream(&publisher, TENANT, NS, STREAM, 1).await;
    let fast_client = broker.client().await;
    let old_client = Connection::connect(
        &broker.quic_addr.to_string(),
        ClientConfig {
            features: features::ALL & !features::SUBSCRIPTION_LAGGED,
            ..Default::default()
        },
    )
    .await
    .expect("connect without the lagged feature");
    assert!(!old_client.has_feature(features::SUBSCRIPTION_LAGGED));
    let mut fast = fast_client
        .subscribe(TENANT, NS, STREAM, 0, StartAt::Earliest)
        .await
        .expect("fast subscribe");
    let mut stalled = old_client
        .subscribe(TENANT, NS, STREAM, 0, StartAt::Earliest)
        .await
        .expect("stalled subscribe");

    // Publish (the fast subscriber following) until the stalled one has had several
    // batches dropped: one episode of falling behind, many drops.
    let mut total = 0u64;
    let mut b = 0u64;
    // (A subscription ended as lagged stops being dropped from: stop then too, and fail
    // below.)
    while dropped_batches(&broker, TENANT).await < 3.0
        && lagged_subscriptions_of(&broker, TENANT).await == 0.0
    {
        let messages = (0..PER_BATCH).map(|i| Message::new(record(b, i))).collect();
        publisher
            .publish_batch(TENANT, NS, STREAM, messages, AckMode::Batch)
            .await
            .expect("publish");
        b += 1;
        total += PER_BATCH as u64;
        read_until(&mut fast, total, "fast subscriber").await;
        assert!(
            total as usize * RECORD_BYTES < MAX_PUBLISHED,
            "the stalled subscriber never had a batch dropped"
        );
    }
    // Logged once for the episode, and not as ending the subscription.
    assert_eq!(
        log_lines_with(&broker, FELL_BEHIND),
        1,
        "one log line for one episode of falling behind"
    );
    assert_eq!(
        lagged_subscriptions_of(&broker, TENANT).await,
        0.0,
        "no subscription was ended as lagged"
    );

    // The stalled subscriber reads now, and publishing goes on until a batch published
    // after the drops reaches it: what it was sent, a jump, then live records again, without
    // the subscription ending.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        loop {
            let event = stalled.next_event().await;
            let end = !matches!(event, Ok(Some(_)));
            if tx.send(event).is_err() || end {
                return;
            }
        }
    });
    let after_drops = total;
    let mut seen: Vec<Event> = Vec::new();
    while seen.last().is_none_or(|e| e.offset < after_drops) {
        let messages = (0..PER_BATCH).map(|i| Message::new(record(b, i))).collect();
        publisher
            .publish_batch(TENANT, NS, STREAM, messages, AckMode::Batch)
            .await
            .expect("publish after the drops");
        b += 1;
        total += PER_BATCH as u64;
        read_until(&mut fast, total, "fast subscriber").await;
        while let Ok(event) = rx.try_recv() {
            match event {
                Ok(Some(e)) => seen.push(e),
                other => panic!(
                    "the subscription without the lagged feature ended after {} records: {other:?}",
                    seen.len()
                ),
            }
        }
        assert!(
            total as usize * RECORD_BYTES < 2 * MAX_PUBLISHED,
            "nothing published after the drops reached the subscriber ({} records seen)",
            seen.len()
        );
    }
    reader.abort();
    let jumps: Vec<(u64, u64)> = seen
        .windows(2)
        .filter(|w| w[1].offset != w[0].offset + 1)
        .map(|w| (w[0].offset, w[1].offset))
        .collect();
    eprintln!("offset jumps seen: {jumps:?}");
    assert_contiguous(&seen[..1], 0, "subscriber without the lagged feature");
    assert!(!jumps.is_empty(), "the drop shows as an offset jump");
    assert!(
        jumps.iter().all(|(a, b)| b > a),
        "offsets only move forward"
    );
    // The episode was logged once, and its end when the subscriber was delivered to again.
    assert_eq!(log_lines_with(&broker, FELL_BEHIND), 1);
    assert_eq!(log_lines_with(&broker, DELIVERED_AGAIN), 1);
}

/// Subscriptions of `tenant` ended as lagged so far.
async fn lagged_subscriptions_of(broker: &Broker, tenant: &str) -> f64 {
    let text = broker.metrics().await;
    metric_lines(&text, "felix_sub_lagged_total")
        .iter()
        .filter(|l| l.contains(&format!("tenant=\"{tenant}\"")))
        .map(|l| metric_value(l))
        .sum()
}

/// Spec ("Fanout Fairness"): a subscription whose writes to QUIC are blocked stops taking
/// from its queue (what it holds outside the queue is bounded by its egress share), so its
/// queue fills; the queue holds at most `subscriber_queue_max_bytes` of payload however
/// many slots it has; past that it is dropped from while the others keep receiving, and
/// the broker's memory stays bounded.
/// The broker is configured as the spec's example shows, writer lanes and all: settings
/// this design has no use for are accepted and noted in the log, not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_holds_at_most_its_queue_bytes_while_others_keep_receiving()
{
    const TENANT: &str = "bounded";
    /// 256 batches of 256 KiB: 64 MiB, four times what the stalled subscriber's QUIC
    /// stream (16 MiB) takes in before the broker must hold the rest.
    const BATCHES: u64 = 256;
    const QUEUE_MAX_BYTES: usize = 1 << 20;
    /// Well below one live batch (sent whole anyway), and small enough that a replay's
    /// frames show the share.
    const EGRESS_MAX_BYTES: usize = 16 << 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("felix.toml");
    std::fs::write(
        &config,
        format!(
            "# The spec's example, with a byte bound small enough to reach.\n\
             subscriber_queue_capacity = 4096\n\
             subscriber_queue_max_bytes = {QUEUE_MAX_BYTES}\n\
             subscriber_egress_max_bytes = {EGRESS_MAX_BYTES}\n\
             subscriber_writer_lanes = 4\n\
             subscriber_lane_shard = \"auto\"\n"
        ),
    )
    .expect("write the config file");
    let broker = Broker::start(
        BrokerOptions::new()
            .env("FELIX_CONFIG", config.display())
            .env("FELIX_PUB_WORKERS_PER_CONN", 4),
    )
    .await;
    // Started; each inert setting is named once in the log.
    for key in [
        "subscriber_writer_lanes",
        "subscriber_lane_shard",
        "pub_workers_per_conn",
    ] {
        assert_eq!(
            log_lines_with(&broker, &format!("setting {key} has no effect")),
            1,
            "{key} is noted at start"
        );
    }

    let publisher = broker.client().await;
    publisher.create_tenant(TENANT).await.expect("tenant");
    publisher.create_namespace(TENANT, NS).await.expect("ns");
    publisher
        .create_stream(
            TENANT,
            NS,
            STREAM,
            felix_client::StreamConfig {
                durable: Some(false),
                shards: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("ephemeral stream");
    let fast_client = broker.client().await;
    let stalled_client = broker.client().await;
    let mut fast = fast_client
        .subscribe(TENANT, NS, STREAM, 0, StartAt::Latest)
        .await
        .expect("fast subscribe");
    let _stalled = stalled_client
        .subscribe(TENANT, NS, STREAM, 0, StartAt::Latest)
        .await
        .expect("stalled subscribe");

    let rss_before = broker.rss_bytes();
    let mut fast_events = Vec::new();
    for b in 0..BATCHES {
        let messages = (0..PER_BATCH).map(|i| Message::new(record(b, i))).collect();
        publisher
            .publish_batch(TENANT, NS, STREAM, messages, AckMode::Batch)
            .await
            .expect("publish");
        let end = (b + 1) * PER_BATCH as u64;
        fast_events.extend(read_until(&mut fast, end, "fast subscriber").await);
    }
    let rss_after = broker.rss_bytes();
    let published = BATCHES as usize * PER_BATCH * RECORD_BYTES;
    let grown = rss_after.saturating_sub(rss_before);
    eprintln!(
        "published {} MiB; broker RSS {} -> {} MiB",
        published >> 20,
        rss_before >> 20,
        rss_after >> 20
    );

    // The fast subscriber got every record, in order.
    assert_contiguous(&fast_events, 0, "fast subscriber");
    assert_eq!(fast_events.len(), BATCHES as usize * PER_BATCH);
    // The stalled one was dropped from: with 4096 slots and 256 batches, only its byte
    // bound can have filled.
    assert!(
        dropped_batches(&broker, TENANT).await >= 1.0,
        "a subscriber that stopped reading was never dropped from"
    );
    // And the broker did not keep what it was not reading: well under the 48 MiB its QUIC
    // stream could not take.
    assert!(
        (grown as usize) < published / 4,
        "broker RSS grew {} MiB while a stalled subscriber's queue is bounded to {} MiB",
        grown >> 20,
        QUEUE_MAX_BYTES >> 20
    );

    a_replay_is_sent_in_frames_of_each_subscriptions_egress_share(&broker, &publisher, TENANT)
        .await;
}

/// Records of a replay, each about 1 KiB stored (with its batch's header).
const REPLAY_RECORDS: u64 = 64;
const REPLAY_RECORD_BYTES: usize = 1000;

/// Reads `sub` from the start through [`REPLAY_RECORDS`] records; the most records one
/// frame carried.
async fn largest_frame(sub: &mut Subscription) -> usize {
    let mut largest = 0;
    for n in 0..REPLAY_RECORDS {
        let e = tokio::time::timeout(PATIENCE, sub.next_event())
            .await
            .expect("replayed records in time")
            .expect("the replay")
            .expect("not ended");
        assert_eq!(e.offset, n, "the replay in order");
        largest = largest.max(sub.buffered() + 1);
    }
    largest
}

/// Spec ("Buffer behavior"): what a subscription takes out but has not written counts
/// against its share of the connection's `subscriber_egress_max_bytes` (16 KiB here), split
/// equally between the connection's subscriptions. A replay is read a share at a time: one
/// subscription's frames carry at most 16 KiB of records, each of two subscriptions' on one
/// connection at most 8 KiB. (Unbounded, a replay's frame would carry up to 256 KiB: all 64
/// records at once.)
async fn a_replay_is_sent_in_frames_of_each_subscriptions_egress_share(
    broker: &Broker,
    publisher: &Connection,
    tenant: &str,
) {
    publisher
        .create_stream(
            tenant,
            NS,
            "replayed",
            felix_client::StreamConfig {
                durable: Some(true),
                shards: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("durable stream");
    for i in 0..REPLAY_RECORDS {
        let mut v = format!("{i}:").into_bytes();
        v.resize(REPLAY_RECORD_BYTES, b'r');
        publisher
            .publish(tenant, NS, "replayed", Message::new(v), AckMode::Commit)
            .await
            .expect("publish");
    }
    let alone = broker.client().await;
    let mut sub = alone
        .subscribe(tenant, NS, "replayed", 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    let one_share = largest_frame(&mut sub).await;
    // A second subscription on the connection, open before the replay starts: the share
    // halves.
    let shared = broker.client().await;
    let _other = shared
        .subscribe(tenant, NS, STREAM, 0, StartAt::Latest)
        .await
        .expect("another subscription on the connection");
    let mut sub = shared
        .subscribe(tenant, NS, "replayed", 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    let half_share = largest_frame(&mut sub).await;
    eprintln!("largest replay frame: {one_share} records alone, {half_share} with two");
    // Stored, a record takes a little over 1 KiB: at most 16 of them in 16 KiB, 8 in 8 KiB.
    assert!(
        (12..=16).contains(&one_share),
        "a replay's frames fill the subscription's 16 KiB share: {one_share} records"
    );
    assert!(
        half_share <= 8,
        "two subscriptions on a connection share its egress: {half_share} records in a frame"
    );
}
