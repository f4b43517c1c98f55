//! The `meta` scenario: how many control-plane commands per second a 1-node or 3-node
//! group commits on loopback, and at what latency, with K concurrent proposers. Proposals
//! that queue up while Raft writes are in flight are batched into one log entry, which is
//! what this measures for manifest updates (`--kind segment`).
//!
//! All nodes run in this process (one tokio runtime, real HTTP on 127.0.0.1 between them,
//! data directories on disk with fsync).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use felix_meta::model::{Broker, Command, SegmentEntry, ShardKey, StreamSettings, TierState};
use felix_meta::{MetaConfig, MetaNode};
use hdrhistogram::Histogram;
use serde::Serialize;

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// CreateNamespace with a new name each time.
    Namespace,
    /// AddSegment to a shard's manifest (each proposer has its own shard).
    Segment,
}

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// Propose on the Raft leader's handle.
    Leader,
    /// Propose on a follower's handle (forwarded to the leader).
    Follower,
}

#[derive(Args, Debug, Clone)]
pub struct MetaArgs {
    /// Directory for the nodes' data (a fresh subdirectory is made and removed afterwards).
    #[arg(long)]
    dir: PathBuf,
    /// Group size: 1 or 3 (or 5).
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Commands to commit in all.
    #[arg(long, default_value_t = 20_000)]
    commands: u64,
    /// Concurrent proposers; each waits for its command to apply before the next.
    #[arg(long, default_value_t = 64)]
    concurrency: u64,
    /// What to propose.
    #[arg(long, value_enum, default_value_t = Kind::Segment)]
    kind: Kind,
    /// Which node's handle the proposers use.
    #[arg(long, value_enum, default_value_t = Via::Leader)]
    via: Via,
}

#[derive(Serialize)]
struct MetaReport {
    scenario: &'static str,
    nodes: u64,
    kind: Kind,
    via: Via,
    concurrency: u64,
    commands: u64,
    seconds: f64,
    commands_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    max_us: u64,
    raft_entries: u64,
    commands_per_raft_entry: f64,
}

pub fn run(args: MetaArgs) -> anyhow::Result<()> {
    if !(1..=7).contains(&args.nodes) || args.concurrency == 0 || args.commands == 0 {
        bail!("--nodes must be 1..=7, --concurrency and --commands at least 1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start tokio runtime")?;
    let report = rt.block_on(run_async(&args))?;
    crate::common::print_line(&report)
}

async fn run_async(args: &MetaArgs) -> anyhow::Result<MetaReport> {
    let root = args
        .dir
        .join(format!("felix-bench-meta-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mut cluster = BTreeMap::new();
    for id in 1..=args.nodes {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        cluster.insert(id, format!("127.0.0.1:{port}"));
    }
    let mut nodes = Vec::new();
    for (id, addr) in &cluster {
        let mut config = MetaConfig::single(*id, root.join(format!("node-{id}")), addr.parse()?);
        if args.nodes > 1 {
            config.cluster = cluster.clone();
            config.advertise = Some(addr.clone());
        }
        nodes.push(
            MetaNode::start(config)
                .await
                .with_context(|| format!("start node {id}"))?,
        );
    }
    for n in &nodes {
        if !n.handle().wait_ready(Duration::from_secs(30)).await {
            bail!("node {} found no leader within 30 s", n.handle().node_id());
        }
    }
    let leader = nodes[0].handle().leader().context("a leader")?;
    let handle = match args.via {
        Via::Leader => nodes.iter().find(|n| n.handle().node_id() == leader),
        Via::Follower => nodes.iter().find(|n| n.handle().node_id() != leader),
    }
    .context("no node of the requested role (a follower needs --nodes > 1)")?
    .handle()
    .clone();

    // Setup: a tenant, a namespace, a stream with one shard per proposer, a broker.
    let setup = [
        Command::CreateTenant {
            name: "bench".into(),
        },
        Command::CreateNamespace {
            tenant: "bench".into(),
            name: "meta".into(),
        },
        Command::CreateStream {
            tenant: "bench".into(),
            namespace: "meta".into(),
            name: "manifest".into(),
            settings: StreamSettings {
                shards: args.concurrency.min(4096) as u32,
                ..StreamSettings::default()
            },
        },
        Command::RegisterBroker {
            broker: Broker {
                id: 1,
                client_addr: "127.0.0.1:5000".into(),
                kafka_addr: None,
                internal_addr: cluster[&1].clone(),
                zone: None,
                alive: true,
                draining: false,
            },
        },
    ];
    for cmd in setup {
        handle.propose(cmd).await.context("setup command")?;
    }
    let entries_before = handle.raft().metrics().borrow().last_log_index.unwrap_or(0);

    let per_task = args.commands / args.concurrency;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..args.concurrency {
        let handle = handle.clone();
        let kind = args.kind;
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let shard = ShardKey {
                tenant: "bench".into(),
                namespace: "meta".into(),
                stream: "manifest".into(),
                shard: (t % 4096) as u32,
            };
            for i in 0..per_task {
                let cmd = match kind {
                    Kind::Namespace => Command::CreateNamespace {
                        tenant: "bench".into(),
                        name: format!("ns-{t}-{i}"),
                    },
                    Kind::Segment => Command::AddSegment {
                        shard: shard.clone(),
                        segment: SegmentEntry {
                            base_offset: i * 1000,
                            last_offset: i * 1000 + 999,
                            min_timestamp: i as i64,
                            max_timestamp: i as i64,
                            size_bytes: 256 << 20,
                            tier: TierState::Hot,
                            object_key: None,
                            checksum: None,
                            local_copies: BTreeSet::from([1]),
                        },
                    },
                };
                let t0 = Instant::now();
                handle.propose(cmd).await?;
                hist.saturating_record(t0.elapsed().as_micros().max(1) as u64);
            }
            anyhow::Ok(hist)
        }));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for t in tasks {
        hist.add(t.await.context("proposer task")??)?;
    }
    let elapsed = start.elapsed().as_secs_f64().max(1e-9);
    let committed = per_task * args.concurrency;
    let entries = handle.raft().metrics().borrow().last_log_index.unwrap_or(0) - entries_before;
    let report = MetaReport {
        scenario: "meta",
        nodes: args.nodes,
        kind: args.kind,
        via: args.via,
        concurrency: args.concurrency,
        commands: committed,
        seconds: elapsed,
        commands_per_sec: committed as f64 / elapsed,
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        max_us: hist.max(),
        raft_entries: entries,
        commands_per_raft_entry: committed as f64 / entries.max(1) as f64,
    };
    for n in nodes {
        n.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(report)
}
