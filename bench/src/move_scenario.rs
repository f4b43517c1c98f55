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
use crate::common::{TENANT, payload_template, print_line, runtime};
use crate::steady::{PhaseFigures, Steady, fill, spawn_publisher};

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
    let fill_bytes = fill(&client, (NAMESPACE, &stream), 1, args.fill_mib, &template).await?;

    // The steady publisher: phase 0 before, 1 during, 2 after the move.
    let phase = Arc::new(AtomicU8::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = spawn_publisher(
        client.clone(),
        (NAMESPACE.to_owned(), stream.clone(), 0),
        template.clone(),
        Duration::from_millis(args.interval_ms),
        (phase.clone(), stop.clone()),
    );
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
    let Steady {
        hists,
        errors: publish_errors,
        max_gap,
    } = publisher.await.context("publisher task")?;
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
        before: PhaseFigures::of(&hists[0]),
        during: PhaseFigures::of(&hists[1]),
        after: PhaseFigures::of(&hists[2]),
        max_ack_gap_ms: max_gap.as_millis() as u64,
        publish_errors,
    })
}
