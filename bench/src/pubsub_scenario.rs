//! The `pubsub` scenario: publish to and subscribe from a running Felix broker, end to end.
//!
//! Setup: tenant `bench`, namespace `pubsub` (kept if they exist) and a fresh durable stream
//! of one shard with a unique name, deleted afterwards unless `--keep`.
//!
//! Load: `--fanout` subscribers subscribe from `latest` first, each on its own connection.
//! Then `--publishers` tasks, each on its own connection, publish `--records` records in all
//! (split evenly) of `--size` bytes, `--batch` records per `publish_batch` call with
//! `AckMode::Batch`, each keeping `--inflight` calls outstanding. `--rate` paces the publishers
//! (records per second across all of them; 0 = as fast as acknowledgements allow).
//!
//! Figures: throughput is end to end, from the first publish to the last record received by
//! the slowest subscriber. Publish-ack latency is per `publish_batch` call, from the call to
//! its acknowledgement. Delivery latency is per record, from just before its batch was
//! handed to the client (the time is written into the payload's first 8 bytes) to the
//! subscriber decoding it; publishers and subscribers share this process's monotonic clock.
//!
//! With `--cluster SEEDS` the same load goes to a cluster through [`ClusterClient`]s: the
//! stream is created with `--replicas` and `--consistency`, every publisher and subscriber
//! has its own `ClusterClient` (so its own connections) and publishes go to the shard's
//! leader. Before the timed load each publisher publishes one warm-up record (not counted),
//! so that its connection to the leader is open. `--fanout 0` measures publishing alone:
//! throughput is then up to the last acknowledgement.
//!
//! The load itself comes from the generator in `load.rs`, shared with the NATS JetStream
//! equivalent (`nats_scenario`, behind the `nats` feature).

use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use felix_client::{
    ClientConfig, ClientError, ClusterClient, ClusterSubscription, Connection, Message, StartAt,
    StreamConfig, Subscription,
};

use crate::cluster::{cluster_client, create_cluster_stream, first_publish};
use crate::common::{
    TENANT, connect, exists_ok, print_line, publish_acknowledged, runtime, unique_name,
};
use crate::load::{BatchSender, ClusterFigures, LoadArgs, PubsubReport, RecordReceiver, drive};

#[derive(Args, Debug, Clone)]
pub struct PubsubArgs {
    /// The broker's QUIC address (a loopback broker needs no CA).
    #[arg(long, default_value = "127.0.0.1:5000")]
    broker: String,
    /// A cluster instead of one broker: its brokers' QUIC addresses (comma-separated), used
    /// as the seeds of a `ClusterClient` per publisher and subscriber.
    #[arg(
        long,
        value_name = "SEEDS",
        value_delimiter = ',',
        conflicts_with = "broker"
    )]
    cluster: Vec<String>,
    /// With --cluster: the stream's consistency (when an acknowledgement goes out: once the
    /// leader wrote the records, or once a majority of the replicas did).
    #[arg(long, default_value = "quorum", value_parser = ["quorum", "leader"], requires = "cluster")]
    consistency: String,
    /// With --cluster: the stream's replicas.
    #[arg(long, default_value_t = 3, requires = "cluster")]
    replicas: u32,
    /// With --cluster: the client's request timeout, in seconds.
    #[arg(long, default_value_t = 30, requires = "cluster")]
    request_timeout_secs: u64,
    /// PEM CA file to verify a non-loopback broker with.
    #[arg(long)]
    ca: Option<std::path::PathBuf>,
    /// The Felix token every connection presents, for a broker with auth on (bench/auth.sh
    /// measures what auth costs). It needs every action on `bench/pubsub/*` and
    /// `tenant.manage` on `bench` (a tenant-admin token of `bench` has both). One broker only.
    #[arg(
        long,
        env = "FELIX_TOKEN",
        hide_env_values = true,
        conflicts_with = "cluster"
    )]
    token: Option<String>,
    /// Keep the benchmark stream afterwards instead of deleting it.
    #[arg(long)]
    keep: bool,
    /// Whether the benchmark stream uploads its sealed segments to the object store
    /// (`true`, a durable stream's default) or keeps its history on local disk only, as a
    /// NATS JetStream file-storage stream does (`false`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    tiered: bool,
    #[command(flatten)]
    load: LoadArgs,
}

// ---------------------------------------------------------------------------------------
// Felix
// ---------------------------------------------------------------------------------------

const NAMESPACE: &str = "pubsub";

struct FelixSender {
    client: Connection,
    stream: String,
}

impl BatchSender for FelixSender {
    async fn send(&self, payloads: Vec<Bytes>) -> anyhow::Result<()> {
        publish_acknowledged(&self.client, NAMESPACE, &self.stream, payloads).await
    }
}

struct FelixReceiver {
    client: Connection,
    stream: String,
    sub: Subscription,
    resubscribes: u64,
}

impl RecordReceiver for FelixReceiver {
    async fn next(&mut self) -> anyhow::Result<Option<Bytes>> {
        loop {
            match self.sub.next_event().await {
                Ok(Some(event)) => return Ok(Some(event.payload)),
                Ok(None) => return Ok(None),
                Err(ClientError::SubscriptionLagged { resume_offset }) => {
                    self.resubscribes += 1;
                    self.sub = self
                        .client
                        .subscribe(
                            TENANT,
                            NAMESPACE,
                            &self.stream,
                            0,
                            StartAt::Offset(resume_offset),
                        )
                        .await
                        .context("resubscribe after subscription_lagged")?;
                }
                Err(e) => return Err(e).context("subscription"),
            }
        }
    }

    fn resubscribes(&self) -> u64 {
        self.resubscribes
    }
}

pub fn run(args: PubsubArgs) -> anyhow::Result<()> {
    args.load.check()?;
    let rt = runtime()?;
    if !args.cluster.is_empty() {
        return print_line(&rt.block_on(run_cluster(&args))?);
    }
    let report = rt.block_on(async {
        let config = ClientConfig {
            ca: args.ca.clone(),
            name: "felix-bench".into(),
            token: args.token.clone(),
            ..ClientConfig::default()
        };
        let open = || connect(&args.broker, &config);
        let admin = open().await?;
        exists_ok(admin.create_tenant(TENANT).await).context("create tenant bench")?;
        exists_ok(admin.create_namespace(TENANT, NAMESPACE).await)
            .context("create namespace bench/pubsub")?;
        let stream = unique_name("pubsub");
        let stream_config = StreamConfig {
            durable: Some(true),
            shards: Some(1),
            tiered: Some(args.tiered),
            ..Default::default()
        };
        admin
            .create_stream(TENANT, NAMESPACE, &stream, stream_config)
            .await
            .with_context(|| format!("create stream bench/pubsub/{stream}"))?;

        let mut receivers = Vec::new();
        for _ in 0..args.load.fanout {
            let client = open().await?;
            let sub = client
                .subscribe(TENANT, NAMESPACE, &stream, 0, StartAt::Latest)
                .await
                .context("subscribe")?;
            receivers.push(FelixReceiver {
                client,
                stream: stream.clone(),
                sub,
                resubscribes: 0,
            });
        }
        let mut senders = Vec::new();
        for _ in 0..args.load.publishers {
            let client = open().await?;
            // Learn the shard count now, not inside the timed loop.
            client.shard_count(TENANT, NAMESPACE, &stream).await?;
            senders.push(FelixSender {
                client,
                stream: stream.clone(),
            });
        }
        let clients: Vec<Connection> = senders
            .iter()
            .map(|s| s.client.clone())
            .chain(receivers.iter().map(|r| r.client.clone()))
            .collect();

        let measured = drive(&args.load, senders, receivers).await?;

        for c in &clients {
            c.close().await;
        }
        if !args.keep {
            admin
                .delete_stream(TENANT, NAMESPACE, &stream)
                .await
                .with_context(|| format!("delete stream bench/pubsub/{stream}"))?;
        }
        admin.close().await;
        anyhow::Ok(args.load.report("pubsub", "felix", stream, measured))
    })?;
    print_line(&report)
}

// ---------------------------------------------------------------------------------------
// A Felix cluster, through ClusterClient
// ---------------------------------------------------------------------------------------

const CLUSTER_NAMESPACE: &str = "cluster";

struct ClusterSender {
    client: ClusterClient,
    stream: String,
}

impl BatchSender for ClusterSender {
    async fn send(&self, payloads: Vec<Bytes>) -> anyhow::Result<()> {
        let n = payloads.len() as u64;
        let messages: Vec<Message> = payloads.into_iter().map(Message::new).collect();
        let p = self
            .client
            .publish_to_shard(TENANT, CLUSTER_NAMESPACE, &self.stream, 0, &messages)
            .await?;
        let acked = p.last_offset + 1 - p.base_offset;
        if acked != n {
            bail!("published {n} records, {acked} acknowledged");
        }
        Ok(())
    }
}

struct ClusterReceiver {
    sub: ClusterSubscription,
}

impl RecordReceiver for ClusterReceiver {
    async fn next(&mut self) -> anyhow::Result<Option<Bytes>> {
        Ok(self
            .sub
            .next_event()
            .await
            .context("cluster subscription")?
            .map(|e| e.payload))
    }

    fn resubscribes(&self) -> u64 {
        self.sub.resumptions()
    }
}

async fn run_cluster(args: &PubsubArgs) -> anyhow::Result<PubsubReport> {
    let timeout = Duration::from_secs(args.request_timeout_secs);
    let admin = cluster_client(&args.cluster, args.ca.clone(), timeout).await?;
    let (stream, placed, leader) = create_cluster_stream(
        &admin,
        CLUSTER_NAMESPACE,
        "cluster",
        &args.consistency,
        args.replicas,
        Duration::from_secs(60),
        None,
    )
    .await?;

    let mut receivers = Vec::new();
    for _ in 0..args.load.fanout {
        let client = cluster_client(&args.cluster, args.ca.clone(), timeout).await?;
        let sub = client
            .subscribe_shard(TENANT, CLUSTER_NAMESPACE, &stream, 0, StartAt::Latest)
            .await
            .context("subscribe")?;
        receivers.push(ClusterReceiver { sub });
    }
    let mut senders = Vec::new();
    for _ in 0..args.load.publishers {
        let client = cluster_client(&args.cluster, args.ca.clone(), timeout).await?;
        // Opens the connection to the leader outside the timed load. The subscribers start
        // from `latest` before it, so they receive these records and skip them.
        first_publish(|| async {
            client
                .publish_to_shard(
                    TENANT,
                    CLUSTER_NAMESPACE,
                    &stream,
                    0,
                    &[Message::new(vec![0u8; 8])],
                )
                .await
                .map(|_| ())
        })
        .await?;
        senders.push(ClusterSender {
            client,
            stream: stream.clone(),
        });
    }
    let warmups = args.load.publishers;
    let receivers: Vec<SkipFirst<ClusterReceiver>> = receivers
        .into_iter()
        .map(|r| SkipFirst {
            inner: r,
            skip: warmups,
        })
        .collect();

    let measured = drive(&args.load, senders, receivers).await?;

    if !args.keep {
        admin
            .delete_stream(TENANT, CLUSTER_NAMESPACE, &stream)
            .await
            .with_context(|| format!("delete stream bench/{CLUSTER_NAMESPACE}/{stream}"))?;
    }
    let mut report = args
        .load
        .report("pubsub", "felix-cluster", stream, measured);
    report.cluster = Some(ClusterFigures {
        brokers: args.cluster.len(),
        consistency: args.consistency.clone(),
        replicas: args.replicas,
        placed_replicas: placed,
        leader,
    });
    Ok(report)
}

/// A receiver that drops its first `skip` records (the warm-up publishes).
struct SkipFirst<R> {
    inner: R,
    skip: usize,
}

impl<R: RecordReceiver> RecordReceiver for SkipFirst<R> {
    async fn next(&mut self) -> anyhow::Result<Option<Bytes>> {
        while self.skip > 0 {
            if self.inner.next().await?.is_none() {
                return Ok(None);
            }
            self.skip -= 1;
        }
        self.inner.next().await
    }

    fn resubscribes(&self) -> u64 {
        self.inner.resubscribes()
    }
}
