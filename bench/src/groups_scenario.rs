//! The `groups` scenario: consume-and-acknowledge through a consumer group on a running
//! broker, against a plain subscription of the same stream.
//!
//! Setup: tenant `bench`, namespace `groups` (kept if they exist), a fresh durable stream of
//! `--shards` shards (history local only, `tiered: false`), preloaded with `--records`
//! records of `--size` bytes (key-less batches of 100, spread over the shards; not timed).
//!
//! Runs, each on the whole preloaded stream:
//! * `subscription`: one plain subscription per shard from `earliest`, each on its own
//!   client, until every record is received (no acknowledgement: the baseline);
//! * for each of `--consumers` (default 1, 4, 16): a fresh group from `earliest` and that
//!   many consumers, each with its own client, polling `--batch` records and acknowledging
//!   them in one request per shard, until every record is acknowledged;
//! * `nack10`: 4 consumers, every tenth record (by offset) nacked on a group with
//!   `max_attempts` 1 and a dead-letter stream, the rest acknowledged: what redelivery and
//!   dead-lettering cost.
//!
//! * `half_load` (`--half-load-secs`, after the others): 4 consumers of a fresh group from
//!   `latest` while one publisher sends at half the records/s the 4-consumer run reached
//!   (`groups_half_load.rs`).
//!
//! Figures: records/s from the start of consumption to the last record received (or
//! acknowledged); for groups also claim-to-ack latency per record (from the poll's return
//! to its acknowledgement's answer), at full load and at half load, where publish-to-ack
//! (from the record's timestamp) is measured too.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use felix_client::{AckMode, Client, GroupConfig, GroupStart, Message, StartAt, StreamConfig};
use serde::Serialize;

use crate::common::{
    TENANT, client, exists_ok, histogram, incompressible, payload_template, percentiles,
    print_line, runtime, unique_name,
};
use crate::groups_half_load::{HalfLoad, HalfLoadRun};

pub(crate) const NAMESPACE: &str = "groups";

#[derive(Args, Debug, Clone)]
pub struct GroupsArgs {
    /// The broker's QUIC address (a loopback broker needs no CA).
    #[arg(long, default_value = "127.0.0.1:5000")]
    pub(crate) broker: String,
    /// Records preloaded and consumed in each run.
    #[arg(long, default_value_t = 100_000)]
    records: u64,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 1024)]
    pub(crate) size: usize,
    /// Shards of the stream.
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Consumer counts to run, one group run each.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    consumers: Vec<usize>,
    /// Records per poll.
    #[arg(long, default_value_t = 100)]
    pub(crate) batch: usize,
    /// Poll one batch at a time: the next poll goes out only after the last batch's acks
    /// (default: the consumer claims its next poll's records while the caller acks,
    /// `GroupConsumer::prefetch`; `felix-bench nats-groups` does the same by default).
    #[arg(long)]
    no_prefetch: bool,
    /// Replicas of each shard (a cluster: `--broker` is one of its brokers).
    #[arg(long)]
    replicas: Option<u32>,
    /// The stream's consistency (`leader` or `quorum`), for a replicated stream.
    #[arg(long)]
    consistency: Option<String>,
    /// Seconds of the half-load run: 4 consumers of a live stream published to at half
    /// the records/s the 4-consumer run reached (0: no half-load run).
    #[arg(long, default_value_t = 10)]
    pub(crate) half_load_secs: u64,
}

#[derive(Serialize)]
struct GroupRun {
    consumers: usize,
    records_per_sec: f64,
    seconds: f64,
    /// Claim-to-ack latency per record, µs: p50, p99, p99.9, max.
    claim_to_ack_us: [u64; 4],
    redelivered_or_dead_lettered: u64,
}

#[derive(Serialize)]
struct Report {
    scenario: &'static str,
    records: u64,
    size: usize,
    shards: u32,
    batch: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    replicas: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    consistency: Option<String>,
    subscription_records_per_sec: f64,
    groups: Vec<GroupRun>,
    nack10: GroupRun,
    #[serde(skip_serializing_if = "Option::is_none")]
    half_load: Option<HalfLoadRun>,
}

pub fn run(args: GroupsArgs) -> anyhow::Result<()> {
    runtime()?.block_on(run_async(args))
}

async fn run_async(args: GroupsArgs) -> anyhow::Result<()> {
    let admin = client(&args.broker).await?;
    exists_ok(admin.create_tenant(TENANT).await)?;
    exists_ok(admin.create_namespace(TENANT, NAMESPACE).await)?;
    let stream = unique_name("groups");
    let dlq = format!("{stream}-dlq");
    for (name, shards) in [(&stream, args.shards), (&dlq, 1)] {
        admin
            .create_stream(
                TENANT,
                NAMESPACE,
                name,
                StreamConfig {
                    durable: Some(true),
                    shards: Some(shards),
                    tiered: Some(false),
                    replicas: args.replicas,
                    consistency: args.consistency.clone(),
                    ..Default::default()
                },
            )
            .await
            .with_context(|| format!("create stream {name}"))?;
    }
    preload(&admin, &stream, &args).await?;
    let subscription = subscribe_all(&args, &stream).await?;
    let mut groups = Vec::new();
    for &n in &args.consumers {
        groups.push(consume(&args, &admin, &stream, n, None).await?);
    }
    let nack10 = consume(&args, &admin, &stream, 4, Some(&dlq)).await?;
    let full4 = groups
        .iter()
        .find(|g| g.consumers == 4)
        .map(|g| g.records_per_sec);
    let half_load = match full4 {
        Some(rate) if args.half_load_secs > 0 => {
            let half = HalfLoad {
                broker: &args.broker,
                namespace: NAMESPACE,
                size: args.size,
                batch: args.batch,
                seconds: args.half_load_secs,
            };
            Some(crate::groups_half_load::run(&half, &admin, &stream, rate / 2.0).await?)
        }
        _ => None,
    };
    let _ = admin.delete_stream(TENANT, NAMESPACE, &stream).await;
    let _ = admin.delete_stream(TENANT, NAMESPACE, &dlq).await;
    print_line(&Report {
        scenario: "groups",
        records: args.records,
        size: args.size,
        shards: args.shards,
        batch: args.batch,
        replicas: args.replicas,
        consistency: args.consistency.clone(),
        subscription_records_per_sec: subscription,
        groups,
        nack10,
        half_load,
    })
}

async fn preload(admin: &Client, stream: &str, args: &GroupsArgs) -> anyhow::Result<()> {
    let template = payload_template(args.size);
    let mut left = args.records;
    while left > 0 {
        let n = left.min(100);
        let payloads = incompressible(&vec![template.clone(); n as usize]);
        let messages: Vec<Message> = payloads.into_iter().map(Message::new).collect();
        admin
            .publish_batch(TENANT, NAMESPACE, stream, messages, AckMode::Batch)
            .await
            .context("preload")?;
        left -= n;
    }
    Ok(())
}

/// One plain subscription per shard from `earliest`: records/s until all are received.
async fn subscribe_all(args: &GroupsArgs, stream: &str) -> anyhow::Result<f64> {
    let received = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for shard in 0..args.shards {
        let c = client(&args.broker).await?;
        let mut sub = c
            .subscribe_shard(TENANT, NAMESPACE, stream, shard, StartAt::Earliest)
            .await
            .context("subscribe")?;
        let (received, total) = (received.clone(), args.records);
        tasks.push(tokio::spawn(async move {
            while received.load(Ordering::Relaxed) < total {
                match tokio::time::timeout(Duration::from_millis(500), sub.next_event()).await {
                    Ok(Ok(Some(_))) => {
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Ok(None)) | Ok(Err(_)) => return,
                    Err(_) => {}
                }
            }
            drop(c);
        }));
    }
    for t in tasks {
        t.await?;
    }
    let got = received.load(Ordering::Relaxed);
    if got < args.records {
        bail!(
            "the subscriptions received {got} of {} records",
            args.records
        );
    }
    Ok(args.records as f64 / start.elapsed().as_secs_f64())
}

/// A fresh group with `n` consumers: records/s until every record is answered. With a
/// dead-letter stream, every tenth record is nacked (and dead-lettered: `max_attempts` 1).
async fn consume(
    args: &GroupsArgs,
    admin: &Client,
    stream: &str,
    n: usize,
    dead_letter: Option<&str>,
) -> anyhow::Result<GroupRun> {
    let group = unique_name(&format!("g{n}"));
    admin
        .create_group(
            TENANT,
            NAMESPACE,
            stream,
            &group,
            GroupConfig {
                visibility_timeout_ms: Some(60_000),
                max_attempts: Some(if dead_letter.is_some() { 1 } else { 5 }),
                dead_letter: dead_letter.map(|d| format!("{TENANT}/{NAMESPACE}/{d}")),
                start: Some(GroupStart::Earliest),
            },
        )
        .await
        .context("create group")?;
    let answered = Arc::new(AtomicU64::new(0));
    let nacked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..n {
        let c = client(&args.broker).await?;
        let (answered, nacked) = (answered.clone(), nacked.clone());
        let (stream, group, total, batch) =
            (stream.to_owned(), group.clone(), args.records, args.batch);
        let nack_some = dead_letter.is_some();
        let prefetch = !args.no_prefetch;
        tasks.push(tokio::spawn(async move {
            let mut consumer = c
                .group(TENANT, NAMESPACE, &stream, &group)
                .prefetch(prefetch);
            let mut h = histogram();
            while answered.load(Ordering::Relaxed) < total {
                let records = consumer.poll(batch, Duration::from_millis(200)).await?;
                if records.is_empty() {
                    continue;
                }
                let claimed = Instant::now();
                let (bad, good): (Vec<_>, Vec<_>) = records
                    .into_iter()
                    .partition(|r| nack_some && r.offset % 10 == 0);
                if !bad.is_empty() {
                    consumer.nack_all(&bad, None, Some("bench")).await?;
                }
                consumer.ack_all(&good).await?;
                let us = claimed.elapsed().as_micros() as u64;
                for _ in 0..(good.len() + bad.len()) {
                    let _ = h.record(us.max(1));
                }
                nacked.fetch_add(bad.len() as u64, Ordering::Relaxed);
                answered.fetch_add((good.len() + bad.len()) as u64, Ordering::Relaxed);
            }
            Ok::<_, felix_client::ClientError>(h)
        }));
    }
    let mut all = histogram();
    for t in tasks {
        all.add(t.await??)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(GroupRun {
        consumers: n,
        records_per_sec: args.records as f64 / seconds,
        seconds,
        claim_to_ack_us: percentiles(&all),
        redelivered_or_dead_lettered: nacked.load(Ordering::Relaxed),
    })
}
