//! The `move` scenario: how long moving a shard's leadership to another broker takes, and
//! what a steady publisher sees before, during and after, on a running cluster.
//!
//! Setup: a fresh durable 1-shard Quorum stream with 3 replicas in tenant `bench`, namespace
//! `moves`, filled with `--fill-mib` MiB of `--size`-byte records (incompressible payloads;
//! not timed). The stream is not tiered unless `--tiered true`, so the destination copies
//! the whole fill from the leader's log (the hot catch-up). A tiered stream's new replica
//! starts after the history already uploaded to the object store and copies only what is
//! past it: the report says how much of the shard was uploaded and how much not when the
//! move began (read from a listing taken just before the move, so an upload finishing at
//! that moment is counted as not uploaded).
//!
//! Load: one `ClusterClient` publishes one `--size`-byte record per call, a call every
//! `--interval-ms`. After `--phase-secs`, the benchmark asks for the shard's leadership to
//! move to a broker outside its replica set (`move_shard`, as `felixctl shard move` does)
//! and polls the move list every 20 ms until the move is gone; then `--phase-secs` more.
//!
//! Figures: `move_ms` (the request to the move's end: catch-up, fence, hand-over, removal of
//! the old replica), ack latency p50/p99/max in each phase, the longest gap between two
//! acknowledgements, and the publishes that failed (none should).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use felix_client::{ClientConfig, Connection, Message};
use serde::Serialize;

use crate::cluster::{cluster_client, create_cluster_stream, first_publish};
use crate::common::{
    TENANT, histogram, incompressible, payload_template, percentiles, print_line, runtime,
};

const NAMESPACE: &str = "moves";

#[derive(Args, Debug, Clone)]
pub struct MoveArgs {
    /// The brokers' QUIC addresses, comma-separated (a loopback cluster needs no CA).
    #[arg(long, value_name = "SEEDS", value_delimiter = ',', required = true)]
    cluster: Vec<String>,
    /// MiB written to the shard before the move.
    #[arg(long, default_value_t = 64)]
    fill_mib: u64,
    #[arg(long, default_value_t = 1024)]
    size: usize,
    #[arg(long, default_value_t = 5)]
    interval_ms: u64,
    #[arg(long, default_value_t = 3)]
    phase_secs: u64,
    /// Whether the stream's sealed segments are uploaded. Off (the default), nothing is
    /// uploaded, so the destination copies the whole fill from the leader's log: the hot
    /// catch-up. On, it copies only what is past the uploaded end when the move begins.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    tiered: bool,
}

#[derive(Serialize, Default)]
struct PhaseFigures {
    acks: u64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
}

#[derive(Serialize)]
struct Report {
    scenario: &'static str,
    fill_bytes: u64,
    record_bytes: usize,
    from: u64,
    to: u64,
    move_ms: u64,
    /// Whether the stream was tiered (else the whole fill is the hot catch-up).
    tiered: bool,
    /// Bytes of the shard in uploaded objects, and not yet uploaded, when the move began.
    uploaded_bytes_at_move: u64,
    not_uploaded_bytes_at_move: u64,
    before: PhaseFigures,
    during: PhaseFigures,
    after: PhaseFigures,
    max_ack_gap_ms: u64,
    publish_errors: u64,
}

pub fn run(args: MoveArgs) -> anyhow::Result<()> {
    runtime()?.block_on(run_async(args))
}

async fn run_async(args: MoveArgs) -> anyhow::Result<()> {
    let client = cluster_client(&args.cluster, None, Duration::from_secs(30)).await?;
    let (stream, replicas, leader) = create_cluster_stream(
        &client,
        NAMESPACE,
        "move",
        "quorum",
        3,
        Duration::from_secs(60),
        Some(args.tiered),
    )
    .await?;
    let topology = client.topology(TENANT, NAMESPACE, &stream).await?;
    let Some(to) = topology
        .brokers
        .iter()
        .filter(|b| b.alive)
        .map(|b| b.id)
        .find(|b| !replicas.contains(b))
    else {
        bail!("no live broker outside the replicas {replicas:?}: the cluster needs 4 brokers");
    };
    let template = payload_template(args.size);
    first_publish(|| async {
        client
            .publish_to_shard(
                TENANT,
                NAMESPACE,
                &stream,
                0,
                &[Message::new(template.clone())],
            )
            .await
            .map(|_| ())
    })
    .await?;
    // Fill: batches of 256 records until fill_mib is written.
    let per_batch = 256usize;
    let batches = (args.fill_mib << 20) / (per_batch * args.size) as u64;
    for _ in 0..batches {
        let payloads = incompressible(&vec![template.clone(); per_batch]);
        let messages: Vec<Message> = payloads.into_iter().map(Message::new).collect();
        client
            .publish_to_shard(TENANT, NAMESPACE, &stream, 0, &messages)
            .await
            .context("fill")?;
    }
    let fill_bytes = batches * (per_batch * args.size) as u64;

    // The steady publisher: phase 0 before, 1 during, 2 after the move.
    let phase = Arc::new(AtomicU8::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (client, stream, phase, stop) =
            (client.clone(), stream.clone(), phase.clone(), stop.clone());
        let template = template.clone();
        let interval = Duration::from_millis(args.interval_ms);
        tokio::spawn(async move {
            let mut hists = [histogram(), histogram(), histogram()];
            let (mut errors, mut last_ack, mut max_gap) = (0u64, Instant::now(), Duration::ZERO);
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop.load(Ordering::Acquire) {
                tick.tick().await;
                let p = phase.load(Ordering::Acquire) as usize;
                let t0 = Instant::now();
                match client
                    .publish_to_shard(
                        TENANT,
                        NAMESPACE,
                        &stream,
                        0,
                        &[Message::new(template.clone())],
                    )
                    .await
                {
                    Ok(_) => {
                        let now = Instant::now();
                        let _ = hists[p].record(now.duration_since(t0).as_micros().max(1) as u64);
                        max_gap = max_gap.max(now.duration_since(last_ack));
                        last_ack = now;
                    }
                    Err(e) => {
                        eprintln!("publish failed: {e}");
                        errors += 1;
                    }
                }
            }
            (hists, errors, max_gap)
        })
    };
    tokio::time::sleep(Duration::from_secs(args.phase_secs)).await;

    let admin = Connection::connect(&args.cluster[0], ClientConfig::default())
        .await
        .context("connect for the move")?;
    let segments = client
        .list_segments(TENANT, NAMESPACE, &stream)
        .await
        .context("list segments")?;
    let uploaded: u64 = segments
        .iter()
        .filter(|s| s.tier == "cold")
        .map(|s| s.size_bytes)
        .sum();
    let not_uploaded: u64 = segments
        .iter()
        .filter(|s| s.tier != "cold")
        .map(|s| s.size_bytes)
        .sum();
    phase.store(1, Ordering::Release);
    let started = Instant::now();
    admin
        .move_shard(TENANT, NAMESPACE, &stream, 0, to, None)
        .await
        .context("start the move")?;
    let deadline = started + Duration::from_secs(600);
    loop {
        let moves = admin.list_moves().await.context("list moves")?;
        if !moves.iter().any(|m| m.stream == stream) {
            break;
        }
        if Instant::now() > deadline {
            bail!("the move did not end within 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let move_ms = started.elapsed().as_millis() as u64;
    phase.store(2, Ordering::Release);
    tokio::time::sleep(Duration::from_secs(args.phase_secs)).await;
    stop.store(true, Ordering::Release);
    let (hists, publish_errors, max_gap) = publisher.await.context("publisher task")?;
    let figures = |h: &hdrhistogram::Histogram<u64>| {
        let [p50, p99, _, max] = percentiles(h);
        PhaseFigures {
            acks: h.len(),
            p50_us: p50,
            p99_us: p99,
            max_us: max,
        }
    };
    let _ = client.delete_stream(TENANT, NAMESPACE, &stream).await;
    print_line(&Report {
        scenario: "move",
        fill_bytes,
        record_bytes: args.size,
        from: leader,
        to,
        move_ms,
        tiered: args.tiered,
        uploaded_bytes_at_move: uploaded,
        not_uploaded_bytes_at_move: not_uploaded,
        before: figures(&hists[0]),
        during: figures(&hists[1]),
        after: figures(&hists[2]),
        max_ack_gap_ms: max_gap.as_millis() as u64,
        publish_errors,
    })
}
