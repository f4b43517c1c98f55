//! The `drain` scenario: how long draining a broker that holds many shards takes, and the
//! worst hold a steady publisher sees while it runs.
//!
//! Setup: a fresh durable Quorum stream of `--shards` shards with 3 replicas, untiered (so
//! every shard's destination copies its whole log from the leader), in tenant `bench`,
//! namespace `drains`; each shard filled with `--fill-mib` / `--shards` MiB of
//! `--size`-byte incompressible records (not timed).
//!
//! Load: one publisher per shard, one record per call, a call every `--interval-ms`. After
//! `--phase-secs`, the broker holding the most of the stream's replicas is drained
//! (`set_draining`, as `felixctl broker drain` does); the benchmark polls the broker list
//! every 50 ms until it holds no replica and no move is under way, then stops draining it
//! (so it can take shards again) and publishes `--phase-secs` more.
//!
//! Figures: `drain_ms` (the request to the last replica gone), the replicas the broker held
//! (of this stream, and of all streams), ack latency p50/p99/max before, during and after
//! over every shard's publisher, the longest time any one shard went without an
//! acknowledgement, and the publishes that failed (none should).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use felix_client::{Message, StreamConfig};
use serde::Serialize;

use crate::cluster::{cluster_client, first_publish};
use crate::common::{
    TENANT, exists_ok, histogram, payload_template, print_line, runtime, unique_name,
};
use crate::steady::{PhaseFigures, fill, spawn_publisher};

const NAMESPACE: &str = "drains";

#[derive(Args, Debug, Clone)]
pub struct DrainArgs {
    /// The brokers' QUIC addresses, comma-separated (4 brokers or more).
    #[arg(long, value_name = "SEEDS", value_delimiter = ',', required = true)]
    cluster: Vec<String>,
    /// Shards of the stream.
    #[arg(long, default_value_t = 20)]
    shards: u32,
    /// MiB written to the stream before the drain, spread evenly over its shards.
    #[arg(long, default_value_t = 64)]
    fill_mib: u64,
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Each shard's publisher sends one record this often.
    #[arg(long, default_value_t = 20)]
    interval_ms: u64,
    #[arg(long, default_value_t = 3)]
    phase_secs: u64,
}

#[derive(Serialize)]
struct Report {
    scenario: &'static str,
    shards: u32,
    fill_bytes: u64,
    record_bytes: usize,
    drained: u64,
    /// Replicas of this stream, and of every stream, on the drained broker as it began.
    stream_replicas_drained: usize,
    all_replicas_drained: u64,
    drain_ms: u64,
    before: PhaseFigures,
    during: PhaseFigures,
    after: PhaseFigures,
    /// The longest time one shard went without an acknowledgement, in the whole run.
    max_shard_ack_gap_ms: u64,
    publish_errors: u64,
}

pub fn run(args: DrainArgs) -> anyhow::Result<()> {
    runtime()?.block_on(run_async(args))
}

async fn run_async(args: DrainArgs) -> anyhow::Result<()> {
    if args.shards == 0 {
        bail!("--shards must be at least 1");
    }
    let client = cluster_client(&args.cluster, None, Duration::from_secs(30)).await?;
    exists_ok(client.create_tenant(TENANT).await).context("create tenant bench")?;
    exists_ok(client.create_namespace(TENANT, NAMESPACE).await)
        .context("create namespace bench/drains")?;
    let stream = unique_name("drain");
    let config = StreamConfig {
        durable: Some(true),
        shards: Some(args.shards),
        replicas: Some(3),
        consistency: Some("quorum".into()),
        tiered: Some(false),
        ..Default::default()
    };
    client
        .create_stream(TENANT, NAMESPACE, &stream, config)
        .await
        .context("create the stream")?;
    let template = payload_template(args.size);
    for shard in 0..args.shards {
        first_publish(|| async {
            client
                .publish_to_shard(
                    TENANT,
                    NAMESPACE,
                    &stream,
                    shard,
                    &[Message::new(template.clone())],
                )
                .await
                .map(|_| ())
        })
        .await?;
    }
    let fill_bytes = fill(
        &client,
        (NAMESPACE, &stream),
        args.shards,
        args.fill_mib,
        &template,
    )
    .await?;

    // The broker holding the most of the stream's replicas is the one drained.
    let topology = client.topology(TENANT, NAMESPACE, &stream).await?;
    let mut held = std::collections::BTreeMap::<u64, usize>::new();
    for shard in 0..args.shards {
        for r in topology
            .shard(shard)
            .map(|r| r.replicas.clone())
            .unwrap_or_default()
        {
            *held.entry(r).or_default() += 1;
        }
    }
    let Some((&drained, &stream_replicas)) = held.iter().max_by_key(|(_, n)| **n) else {
        bail!("the stream has no replicas in its topology");
    };

    // The publishers: phase 0 before, 1 during, 2 after the drain.
    let phase = Arc::new(AtomicU8::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let publishers: Vec<_> = (0..args.shards)
        .map(|shard| {
            spawn_publisher(
                client.clone(),
                (NAMESPACE.to_owned(), stream.clone(), shard),
                template.clone(),
                Duration::from_millis(args.interval_ms),
                (phase.clone(), stop.clone()),
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(args.phase_secs)).await;

    let brokers = client.list_brokers().await.context("list brokers")?;
    let all_replicas = brokers
        .iter()
        .find(|b| b.id == drained)
        .map_or(0, |b| b.replicas);
    phase.store(1, Ordering::Release);
    let started = Instant::now();
    client
        .set_draining(drained, true)
        .await
        .context("start the drain")?;
    let deadline = started + Duration::from_secs(1800);
    loop {
        let brokers = client.list_brokers().await.context("list brokers")?;
        let left = brokers
            .iter()
            .find(|b| b.id == drained)
            .map_or(0, |b| b.replicas);
        let moving = client.list_moves().await.context("list moves")?;
        if left == 0 && moving.iter().all(|m| m.phase == "planned") {
            break;
        }
        if Instant::now() > deadline {
            bail!("broker {drained} still held {left} replicas after 30 minutes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drain_ms = started.elapsed().as_millis() as u64;
    phase.store(2, Ordering::Release);
    client
        .set_draining(drained, false)
        .await
        .context("stop draining")?;
    tokio::time::sleep(Duration::from_secs(args.phase_secs)).await;
    stop.store(true, Ordering::Release);

    let mut merged = [histogram(), histogram(), histogram()];
    let (mut publish_errors, mut max_gap) = (0u64, Duration::ZERO);
    for p in publishers {
        let steady = p.await.context("publisher task")?;
        for (m, h) in merged.iter_mut().zip(&steady.hists) {
            m.add(h).context("merge histograms")?;
        }
        publish_errors += steady.errors;
        max_gap = max_gap.max(steady.max_gap);
    }
    let _ = client.delete_stream(TENANT, NAMESPACE, &stream).await;
    print_line(&Report {
        scenario: "drain",
        shards: args.shards,
        fill_bytes,
        record_bytes: args.size,
        drained,
        stream_replicas_drained: stream_replicas,
        all_replicas_drained: all_replicas,
        drain_ms,
        before: PhaseFigures::of(&merged[0]),
        during: PhaseFigures::of(&merged[1]),
        after: PhaseFigures::of(&merged[2]),
        max_shard_ack_gap_ms: max_gap.as_millis() as u64,
        publish_errors,
    })
}
