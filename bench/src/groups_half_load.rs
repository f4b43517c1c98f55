//! The `groups` scenario's half-load run: four consumers of a group keeping up with a live
//! stream that one publisher sends to at a fixed rate — half of what four consumers reached
//! on the preloaded stream — so the latencies are those of a group that is not saturated.
//!
//! The publisher sends a batch every 5 ms, sized to the rate, with up to 8 unanswered, for
//! `--half-load-secs`; the
//! consumers poll `--batch` records (waiting up to 200 ms) and acknowledge them, until every
//! published record is acknowledged. Claim-to-ack is from a poll's return to its
//! acknowledgement's answer; publish-to-ack from the record's timestamp (set by the
//! publishing client, ms) to that answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use felix_client::{AckMode, Client, GroupConfig, GroupStart, Message};

use crate::common::{
    TENANT, client, histogram, incompressible, payload_template, percentiles, unique_name,
};
use serde::Serialize;

/// Where and what the half-load run drives (from the `groups` scenario's arguments).
pub(crate) struct HalfLoad<'a> {
    pub broker: &'a str,
    pub namespace: &'a str,
    pub size: usize,
    pub batch: usize,
    pub seconds: u64,
}

/// Four consumers keeping up with a live stream published to at a fixed rate.
#[derive(Serialize)]
pub(crate) struct HalfLoadRun {
    pub consumers: usize,
    /// Records/s offered: half of what the 4-consumer run consumed.
    pub offered_per_sec: f64,
    /// Records/s the publisher got acknowledged while it sent.
    pub published_per_sec: f64,
    /// Records/s acknowledged over the run.
    pub records_per_sec: f64,
    /// Claim-to-ack latency per record, µs: p50, p99, p99.9, max.
    pub claim_to_ack_us: [u64; 4],
    /// From a record's publish (its timestamp) to its acknowledgement's answer, µs.
    pub publish_to_ack_us: [u64; 4],
}

const CONSUMERS: usize = 4;
/// The publisher sends one batch this often.
const TICK: Duration = Duration::from_millis(5);
/// Batches the publisher may have unanswered.
const IN_FLIGHT: usize = 8;

pub(crate) async fn run(
    args: &HalfLoad<'_>,
    admin: &Client,
    stream: &str,
    offered_per_sec: f64,
) -> anyhow::Result<HalfLoadRun> {
    let group = unique_name("half");
    admin
        .create_group(
            TENANT,
            args.namespace,
            stream,
            &group,
            GroupConfig {
                visibility_timeout_ms: Some(60_000),
                max_attempts: Some(5),
                dead_letter: None,
                start: Some(GroupStart::Latest),
            },
        )
        .await
        .context("create the half-load group")?;
    let published = Arc::new(AtomicU64::new(0));
    let answered = Arc::new(AtomicU64::new(0));
    let done_publishing = Arc::new(AtomicBool::new(false));
    let mut consumers = Vec::new();
    for _ in 0..CONSUMERS {
        let c = client(args.broker).await?;
        let (published, answered, done) =
            (published.clone(), answered.clone(), done_publishing.clone());
        let (stream, group, batch) = (stream.to_owned(), group.clone(), args.batch);
        let namespace = args.namespace.to_owned();
        consumers.push(tokio::spawn(async move {
            let mut consumer = c.group(TENANT, &namespace, &stream, &group);
            let (mut claim, mut end_to_end) = (histogram(), histogram());
            while !(done.load(Ordering::Acquire)
                && answered.load(Ordering::Acquire) >= published.load(Ordering::Acquire))
            {
                let records = consumer.poll(batch, Duration::from_millis(200)).await?;
                if records.is_empty() {
                    continue;
                }
                let claimed = Instant::now();
                consumer.ack_all(&records).await?;
                let us = claimed.elapsed().as_micros() as u64;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                for r in &records {
                    let _ = claim.record(us.max(1));
                    let since = (now - r.timestamp).max(0) as u64 * 1000;
                    let _ = end_to_end.record(since.max(1));
                }
                answered.fetch_add(records.len() as u64, Ordering::AcqRel);
            }
            Ok::<_, felix_client::ClientError>((claim, end_to_end))
        }));
    }
    // Consumers are polling before the first record: the group starts at `latest`.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let template = payload_template(args.size);
    // A batch every TICK, sized to the rate; up to IN_FLIGHT batches unanswered, so the
    // offered rate does not depend on one publish's round trip.
    let per_batch = ((offered_per_sec * TICK.as_secs_f64()).round() as usize).max(1);
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut publishes = tokio::task::JoinSet::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(args.seconds) {
        ticks.tick().await;
        let slot = slots.clone().acquire_owned().await?;
        let payloads = incompressible(&vec![template.clone(); per_batch]);
        let messages: Vec<Message> = payloads.into_iter().map(Message::new).collect();
        let (admin, stream, published) = (admin.clone(), stream.to_owned(), published.clone());
        let namespace = args.namespace.to_owned();
        publishes.spawn(async move {
            let r = admin
                .publish_batch(TENANT, &namespace, &stream, messages, AckMode::Batch)
                .await;
            if r.is_ok() {
                published.fetch_add(per_batch as u64, Ordering::AcqRel);
            }
            drop(slot);
            r.map(|_| ())
        });
    }
    while let Some(r) = publishes.join_next().await {
        r?.context("publish at half load")?;
    }
    let offered_seconds = start.elapsed().as_secs_f64();
    done_publishing.store(true, Ordering::Release);
    let (mut claim, mut end_to_end) = (histogram(), histogram());
    for c in consumers {
        let (h, e) = tokio::time::timeout(Duration::from_secs(120), c)
            .await
            .context("the consumers did not catch up within 120 s")???;
        claim.add(h)?;
        end_to_end.add(e)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(HalfLoadRun {
        consumers: CONSUMERS,
        offered_per_sec,
        published_per_sec: published.load(Ordering::Acquire) as f64 / offered_seconds,
        records_per_sec: answered.load(Ordering::Acquire) as f64 / seconds,
        claim_to_ack_us: percentiles(&claim),
        publish_to_ack_us: percentiles(&end_to_end),
    })
}
