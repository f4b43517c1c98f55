//! `felix-meta`: runs one control-plane node on its own, without the broker. Used by the
//! cluster tests and the meta benchmark, and handy to explore the control plane with curl
//! (`POST /meta/propose`, `GET /meta/status`, `GET /meta/dump`, `GET /healthz`). The broker
//! binary `felix` embeds the same node.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use felix_meta::{MetaConfig, MetaNode, NodeId};

#[derive(Parser, Debug)]
#[command(
    name = "felix-meta",
    version,
    about = "Run one Felix control-plane (Raft metadata) node"
)]
struct Args {
    /// This node's id.
    #[arg(long, env = "FELIX_NODE_ID", default_value_t = 1)]
    node_id: NodeId,
    /// Every member's internal address, this node included: `1=HOST:PORT,2=HOST:PORT,3=HOST:PORT`.
    /// Without it, the node forms a one-member group.
    #[arg(long, env = "FELIX_CLUSTER")]
    cluster: Option<String>,
    /// Data directory; metadata lives in DIR/meta.
    #[arg(long, env = "FELIX_DATA_DIR", default_value = "./felix-data")]
    data_dir: PathBuf,
    /// Internal listen address. Defaults to this node's address in --cluster, else 127.0.0.1:5100.
    #[arg(long, env = "FELIX_INTERNAL_ADDR")]
    listen: Option<SocketAddr>,
    /// Snapshot and compact the Raft log every this many entries.
    #[arg(long, env = "FELIX_META_SNAPSHOT_LOGS", default_value_t = 5000)]
    snapshot_logs: u64,
    /// Shard-leader lease duration in milliseconds: a broker that has not renewed for this
    /// long is marked dead and its quorum shards get a new leader.
    #[arg(long, env = "FELIX_META_LEASE_MS", default_value_t = 10_000)]
    lease_ms: u64,
}

/// Parses `1=host:port,2=host:port`.
fn parse_cluster(s: &str) -> anyhow::Result<BTreeMap<NodeId, String>> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .with_context(|| format!("cluster member {part:?} is not ID=HOST:PORT"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .with_context(|| format!("node id {id:?} is not a number"))?;
        if out.insert(id, addr.trim().to_owned()).is_some() {
            bail!("node id {id} appears twice in --cluster");
        }
    }
    if out.is_empty() {
        bail!("--cluster lists no members");
    }
    Ok(out)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FELIX_LOG")
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let cluster = args
        .cluster
        .as_deref()
        .map(parse_cluster)
        .transpose()?
        .unwrap_or_default();
    let listen = match (args.listen, cluster.get(&args.node_id)) {
        (Some(l), _) => l,
        (None, Some(addr)) => addr.parse().with_context(|| {
            format!("this node's cluster address {addr:?} is not HOST:PORT with an IP")
        })?,
        (None, None) => "127.0.0.1:5100".parse().expect("valid default"),
    };
    let mut config = MetaConfig::single(args.node_id, &args.data_dir, listen);
    config.advertise = cluster.get(&args.node_id).cloned();
    config.cluster = cluster;
    config.snapshot_after_logs = args.snapshot_logs;
    config.lease = Duration::from_millis(args.lease_ms.max(1));
    let node = MetaNode::start(config)
        .await
        .context("start the metadata node")?;
    eprintln!(
        "felix-meta node {} listening on {}",
        args.node_id,
        node.local_addr()
    );
    let ready = node.handle().wait_ready(Duration::from_secs(30)).await;
    if ready {
        eprintln!(
            "felix-meta node {} ready (leader {:?})",
            args.node_id,
            node.handle().leader()
        );
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    node.shutdown().await;
    Ok(())
}
