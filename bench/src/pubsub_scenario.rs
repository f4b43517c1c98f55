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
//! The load generator itself ([`LoadArgs`], [`drive`]) is shared with the NATS JetStream
//! equivalent (`nats_scenario`, behind the `nats` feature), so both systems are driven by
//! the same code and differ only in the client calls behind [`BatchSender`] and
//! [`RecordReceiver`].

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use clap::Args;
use felix_client::{
    AckMode, Client, ClientConfig, ClientError, ClusterClient, ClusterSubscription, Message,
    StartAt, StreamConfig, Subscription, codes,
};
use hdrhistogram::Histogram;
use serde::Serialize;

/// The load shape, common to the Felix and NATS scenarios.
#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    /// Records to publish in all (rounded up to whole batches).
    #[arg(long, default_value_t = 200_000)]
    pub records: u64,
    /// Payload bytes per record (at least 8: the send time is written into the first 8).
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Records per publish call.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Concurrent publishers, each on its own connection.
    #[arg(long, default_value_t = 4)]
    pub publishers: usize,
    /// Publish calls each publisher keeps in flight.
    #[arg(long, default_value_t = 8)]
    pub inflight: usize,
    /// Subscribers, each on its own connection, each receiving every record (0: publish
    /// only; throughput is then measured to the last acknowledgement).
    #[arg(long, default_value_t = 1)]
    pub fanout: usize,
    /// Records per second across all publishers; 0 publishes as fast as acks allow.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Seconds to wait, after the last acknowledgement, for the subscribers to receive
    /// everything before giving up.
    #[arg(long, default_value_t = 120)]
    pub drain_timeout_secs: u64,
}

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

/// One JSON line of figures; the same shape for both systems.
#[derive(Serialize)]
pub struct PubsubReport {
    pub scenario: &'static str,
    pub system: &'static str,
    pub stream: String,
    pub publishers: usize,
    pub inflight: usize,
    pub fanout: usize,
    pub records: u64,
    pub record_bytes: usize,
    pub batch_records: usize,
    /// The pacing asked for (records/s, 0 = unpaced).
    pub target_rate: f64,
    /// First publish to the last record received by the slowest subscriber.
    pub seconds: f64,
    pub records_per_sec: f64,
    /// Payload megabytes (10^6) per second published and delivered to each subscriber.
    pub mb_per_sec: f64,
    /// Payload megabytes per second delivered, summed over the subscribers.
    pub delivered_mb_per_sec: f64,
    /// First publish to the last acknowledgement.
    pub publish_seconds: f64,
    pub publish_records_per_sec: f64,
    /// Publish-call latency (call to acknowledgement), microseconds.
    pub ack_p50_us: u64,
    pub ack_p99_us: u64,
    pub ack_p999_us: u64,
    pub ack_max_us: u64,
    /// Delivery latency (publish call to the subscriber decoding the record), microseconds.
    pub e2e_p50_us: u64,
    pub e2e_p99_us: u64,
    pub e2e_p999_us: u64,
    pub e2e_max_us: u64,
    /// Times a subscriber had to resubscribe (Felix: `subscription_lagged`).
    pub resubscribes: u64,
    /// CPU seconds (user + system) this benchmark process used for the load itself.
    pub bench_cpu_seconds: f64,
    /// A cluster's stream: its consistency, replicas and leader, and the brokers given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterFigures>,
}

/// What a `--cluster` run adds to the report.
#[derive(Serialize)]
pub struct ClusterFigures {
    pub brokers: usize,
    pub consistency: String,
    pub replicas: u32,
    /// The shard's replicas as placed, and its leader, at the start.
    pub placed_replicas: Vec<u64>,
    pub leader: u64,
}

/// Sends one batch of payloads and waits until the system acknowledges all of them.
pub trait BatchSender: Send + Sync + 'static {
    fn send(&self, payloads: Vec<Bytes>) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// Yields received payloads one at a time, in order; `None` when the subscription ended.
pub trait RecordReceiver: Send + 'static {
    fn next(&mut self) -> impl Future<Output = anyhow::Result<Option<Bytes>>> + Send;
    /// How many times it had to resubscribe.
    fn resubscribes(&self) -> u64 {
        0
    }
}

/// What [`drive`] measured.
pub struct Measured {
    pub records: u64,
    pub seconds: f64,
    pub publish_seconds: f64,
    pub ack: Histogram<u64>,
    pub e2e: Histogram<u64>,
    pub resubscribes: u64,
    pub cpu_seconds: f64,
}

impl LoadArgs {
    pub fn check(&self) -> anyhow::Result<()> {
        if self.records == 0 || self.batch == 0 || self.publishers == 0 || self.inflight == 0 {
            bail!("--records, --batch, --publishers and --inflight must be at least 1");
        }
        if self.size < 8 {
            bail!("--size must be at least 8 (the send time goes in the first 8 bytes)");
        }
        if !(self.rate >= 0.0 && self.rate.is_finite()) {
            bail!("--rate must be 0 or a positive number of records per second");
        }
        Ok(())
    }

    /// Batches in all (the record count rounded up to whole batches).
    pub fn batches(&self) -> u64 {
        self.records.div_ceil(self.batch as u64)
    }

    pub fn total_records(&self) -> u64 {
        self.batches() * self.batch as u64
    }

    pub fn report(
        &self,
        scenario: &'static str,
        system: &'static str,
        stream: String,
        m: Measured,
    ) -> PubsubReport {
        let secs = m.seconds.max(1e-9);
        let bytes = m.records as f64 * self.size as f64;
        PubsubReport {
            scenario,
            system,
            stream,
            publishers: self.publishers,
            inflight: self.inflight,
            fanout: self.fanout,
            records: m.records,
            record_bytes: self.size,
            batch_records: self.batch,
            target_rate: self.rate,
            seconds: m.seconds,
            records_per_sec: m.records as f64 / secs,
            mb_per_sec: bytes / secs / 1e6,
            delivered_mb_per_sec: bytes * self.fanout as f64 / secs / 1e6,
            publish_seconds: m.publish_seconds,
            publish_records_per_sec: m.records as f64 / m.publish_seconds.max(1e-9),
            ack_p50_us: m.ack.value_at_quantile(0.50),
            ack_p99_us: m.ack.value_at_quantile(0.99),
            ack_p999_us: m.ack.value_at_quantile(0.999),
            ack_max_us: m.ack.max(),
            e2e_p50_us: m.e2e.value_at_quantile(0.50),
            e2e_p99_us: m.e2e.value_at_quantile(0.99),
            e2e_p999_us: m.e2e.value_at_quantile(0.999),
            e2e_max_us: m.e2e.max(),
            resubscribes: m.resubscribes,
            bench_cpu_seconds: m.cpu_seconds,
            cluster: None,
        }
    }
}

/// Nanoseconds on this process's monotonic clock (what payloads carry).
fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// CPU seconds (user + system) used by this process so far.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// A payload of pseudo-random bytes (incompressible, so no codec or disk gets it cheaper).
pub(crate) fn payload_template(size: usize) -> Bytes {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut v = vec![0u8; size];
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    v.into()
}

/// A batch of copies of `template`, each carrying `sent_ns` in its first 8 bytes.
fn stamped_batch(template: &[u8], n: usize, sent_ns: u64) -> Vec<Bytes> {
    let mut buf = BytesMut::with_capacity(template.len() * n);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        buf.extend_from_slice(&sent_ns.to_le_bytes());
        buf.extend_from_slice(&template[8..]);
        out.push(buf.split().freeze());
    }
    out
}

/// Runs the load: receivers first (already subscribed), then the publishers; returns once
/// every receiver has every record.
pub async fn drive<S: BatchSender, R: RecordReceiver>(
    load: &LoadArgs,
    senders: Vec<S>,
    receivers: Vec<R>,
) -> anyhow::Result<Measured> {
    let total = load.total_records();
    let template = payload_template(load.size);
    let cpu_before = cpu_seconds();

    // ---- subscribers: count every record, time each one ----
    let progress: Vec<Arc<AtomicU64>> = receivers
        .iter()
        .map(|_| Arc::new(AtomicU64::new(0)))
        .collect();
    let mut sub_tasks = Vec::new();
    for (mut r, seen) in receivers.into_iter().zip(progress.iter().cloned()) {
        sub_tasks.push(tokio::spawn(async move {
            let mut hist = histogram();
            let mut count = 0u64;
            while count < total {
                let Some(payload) = r.next().await? else {
                    bail!("the subscription ended after {count} of {total} records");
                };
                let now = now_ns();
                let sent = u64::from_le_bytes(payload[..8].try_into().context("short payload")?);
                hist.saturating_record((now.saturating_sub(sent) / 1000).max(1));
                count += 1;
                if count.is_multiple_of(1024) {
                    seen.store(count, Ordering::Relaxed);
                }
            }
            seen.store(count, Ordering::Relaxed);
            anyhow::Ok((hist, Instant::now(), r.resubscribes()))
        }));
    }

    // ---- publishers ----
    let start = Instant::now();
    let p = load.publishers as u64;
    let batches = load.batches();
    let mut pub_tasks = Vec::new();
    for (w, sender) in senders.into_iter().enumerate() {
        let w = w as u64;
        let mine = batches / p + u64::from(w < batches % p);
        let (batch, inflight) = (load.batch, load.inflight);
        let template = template.clone();
        // Each publisher's share of the rate, its batches spread evenly and staggered
        // against the other publishers'.
        let interval =
            (load.rate > 0.0).then(|| Duration::from_secs_f64(batch as f64 * p as f64 / load.rate));
        pub_tasks.push(tokio::spawn(async move {
            let mut hist = histogram();
            let sender = Arc::new(sender);
            // Each call is its own task, so calls in flight progress while this loop waits
            // for the pacer or for a free slot.
            let mut in_flight = tokio::task::JoinSet::new();
            for i in 0..mine {
                if let Some(interval) = interval {
                    let due = start + interval.mul_f64(i as f64 + w as f64 / p as f64);
                    tokio::time::sleep_until(due.into()).await;
                }
                while in_flight.len() >= inflight {
                    let took = in_flight.join_next().await.expect("non-empty")??;
                    hist.saturating_record(took);
                }
                let payloads = stamped_batch(&template, batch, now_ns());
                let sender = sender.clone();
                in_flight.spawn(async move {
                    let t = Instant::now();
                    sender.send(payloads).await?;
                    anyhow::Ok(t.elapsed().as_micros().max(1) as u64)
                });
            }
            while let Some(took) = in_flight.join_next().await {
                hist.saturating_record(took??);
            }
            anyhow::Ok(hist)
        }));
    }
    let mut ack = histogram();
    for t in pub_tasks {
        ack.add(t.await.context("publisher task")??)?;
    }
    let published = Instant::now();
    let publish_seconds = (published - start).as_secs_f64();

    // ---- wait for the slowest subscriber ----
    let deadline = tokio::time::Instant::now() + Duration::from_secs(load.drain_timeout_secs);
    let mut e2e = histogram();
    // No subscribers: throughput is to the last acknowledgement.
    let mut end = if sub_tasks.is_empty() {
        published
    } else {
        start
    };
    let mut resubscribes = 0;
    for t in sub_tasks {
        match tokio::time::timeout_at(deadline, t).await {
            Ok(joined) => {
                let (hist, last, resubs) = joined.context("subscriber task")??;
                e2e.add(hist)?;
                end = end.max(last);
                resubscribes += resubs;
            }
            Err(_) => {
                let seen: Vec<u64> = progress.iter().map(|s| s.load(Ordering::Relaxed)).collect();
                bail!(
                    "subscribers still short of {total} records {}s after the last ack: received {seen:?}",
                    load.drain_timeout_secs
                );
            }
        }
    }
    Ok(Measured {
        records: total,
        seconds: (end - start).as_secs_f64(),
        publish_seconds,
        ack,
        e2e,
        resubscribes,
        cpu_seconds: cpu_seconds() - cpu_before,
    })
}

// ---------------------------------------------------------------------------------------
// Felix
// ---------------------------------------------------------------------------------------

pub(crate) const TENANT: &str = "bench";
const NAMESPACE: &str = "pubsub";

struct FelixSender {
    client: Client,
    stream: String,
}

impl BatchSender for FelixSender {
    async fn send(&self, payloads: Vec<Bytes>) -> anyhow::Result<()> {
        let n = payloads.len() as u64;
        let messages = payloads.into_iter().map(Message::new).collect();
        let acks = self
            .client
            .publish_batch(TENANT, NAMESPACE, &self.stream, messages, AckMode::Batch)
            .await?;
        let acked: u64 = acks.iter().map(|p| p.last_offset + 1 - p.base_offset).sum();
        if acked != n {
            bail!("published {n} records, {acked} acknowledged");
        }
        Ok(())
    }
}

struct FelixReceiver {
    client: Client,
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

/// `Ok` for success and for `already_exists`.
fn exists_ok(r: Result<(), ClientError>) -> Result<(), ClientError> {
    match r {
        Err(e) if e.code() == Some(codes::ALREADY_EXISTS) => Ok(()),
        other => other,
    }
}

pub fn run(args: PubsubArgs) -> anyhow::Result<()> {
    args.load.check()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start tokio runtime")?;
    if !args.cluster.is_empty() {
        let report = rt.block_on(run_cluster(&args))?;
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    let report = rt.block_on(async {
        let config = ClientConfig {
            ca: args.ca.clone(),
            name: "felix-bench".into(),
            ..ClientConfig::default()
        };
        let connect = || async {
            Client::connect(&args.broker, config.clone())
                .await
                .with_context(|| format!("connect to the broker at {}", args.broker))
        };
        let admin = connect().await?;
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
            let client = connect().await?;
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
            let client = connect().await?;
            // Learn the shard count now, not inside the timed loop.
            client.shard_count(TENANT, NAMESPACE, &stream).await?;
            senders.push(FelixSender {
                client,
                stream: stream.clone(),
            });
        }
        let clients: Vec<Client> = senders
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
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
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

/// A `ClusterClient` on `seeds` with this benchmark's settings.
pub async fn cluster_client(
    seeds: &[String],
    ca: Option<std::path::PathBuf>,
    request_timeout: Duration,
) -> anyhow::Result<ClusterClient> {
    let config = ClientConfig {
        ca,
        name: "felix-bench".into(),
        request_timeout,
        ..ClientConfig::default()
    };
    ClusterClient::connect(seeds, config)
        .await
        .with_context(|| format!("connect to the cluster at {}", seeds.join(",")))
}

/// Creates tenant `bench`, `namespace` and a fresh durable 1-shard stream with
/// `replicas` and `consistency`, and waits until its shard has a leader and all `replicas`
/// placed (a stream created while a broker is still marked dead gets fewer: it is deleted
/// and created again, within `patience`). Returns the stream's name, replicas and leader.
pub async fn create_cluster_stream(
    admin: &ClusterClient,
    namespace: &str,
    prefix: &str,
    consistency: &str,
    replicas: u32,
    patience: Duration,
) -> anyhow::Result<(String, Vec<u64>, u64)> {
    exists_ok(admin.create_tenant(TENANT).await).context("create tenant bench")?;
    exists_ok(admin.create_namespace(TENANT, namespace).await)
        .with_context(|| format!("create namespace bench/{namespace}"))?;
    let deadline = Instant::now() + patience;
    let mut last = String::new();
    while Instant::now() < deadline {
        let stream = unique_name(prefix);
        let config = StreamConfig {
            durable: Some(true),
            shards: Some(1),
            replicas: Some(replicas),
            consistency: Some(consistency.to_owned()),
            ..Default::default()
        };
        if let Err(e) = admin
            .create_stream(TENANT, namespace, &stream, config)
            .await
        {
            // e.g. fewer live brokers than replicas, while a restarted one rejoins.
            last = format!("create stream bench/{namespace}/{stream}: {e}");
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        // Placement and the first leader may take a controller tick.
        let placed = Instant::now() + Duration::from_secs(10).min(patience);
        while Instant::now() < placed {
            match admin.topology(TENANT, namespace, &stream).await {
                Ok(t) => {
                    let route = t.shard(0).map(|r| r.replicas.clone()).unwrap_or_default();
                    let leader = t.leader(0).map(|l| l.0);
                    let alive = t.brokers.iter().filter(|b| b.alive).count();
                    last = format!(
                        "leader {leader:?}, replicas {route:?}, {alive} of {} brokers alive",
                        t.brokers.len()
                    );
                    if let Some(leader) = leader
                        && route.len() as u32 >= replicas
                    {
                        return Ok((stream, route, leader));
                    }
                    if !route.is_empty() && (route.len() as u32) < replicas {
                        break; // placed on too few brokers: try a new stream
                    }
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = admin.delete_stream(TENANT, namespace, &stream).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("no stream with {replicas} replicas and a leader within {patience:?} (last: {last})")
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
    )
    .await?;

    let mut receivers = Vec::new();
    for _ in 0..args.load.fanout {
        let client = cluster_client(&args.cluster, args.ca.clone(), timeout).await?;
        let sub = client
            .subscribe(TENANT, CLUSTER_NAMESPACE, &stream, 0, StartAt::Latest)
            .await
            .context("subscribe")?;
        receivers.push(ClusterReceiver { sub });
    }
    let mut senders = Vec::new();
    for _ in 0..args.load.publishers {
        let client = cluster_client(&args.cluster, args.ca.clone(), timeout).await?;
        // Opens the connection to the leader outside the timed load. The subscribers start
        // from `latest` before it, so they receive these records and skip them.
        crate::failover_scenario::first_publish(|| async {
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

/// `PREFIX-<pid>-<ms since the epoch>`: unique across runs on one machine.
pub fn unique_name(prefix: &str) -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{prefix}-{}-{ms}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamped_payloads_carry_the_time_and_keep_their_size() {
        let t = payload_template(64);
        let batch = stamped_batch(&t, 3, 0x0102_0304_0506_0708);
        assert_eq!(batch.len(), 3);
        for p in &batch {
            assert_eq!(p.len(), 64);
            assert_eq!(
                u64::from_le_bytes(p[..8].try_into().unwrap()),
                0x0102_0304_0506_0708
            );
            assert_eq!(&p[8..], &t[8..]);
        }
    }

    #[test]
    fn records_round_up_to_whole_batches() {
        let load = LoadArgs {
            records: 1001,
            size: 1024,
            batch: 100,
            publishers: 4,
            inflight: 8,
            fanout: 1,
            rate: 0.0,
            drain_timeout_secs: 1,
        };
        load.check().unwrap();
        assert_eq!(load.batches(), 11);
        assert_eq!(load.total_records(), 1100);
        assert!(
            LoadArgs {
                size: 7,
                ..load.clone()
            }
            .check()
            .is_err()
        );
        assert!(LoadArgs { rate: -1.0, ..load }.check().is_err());
    }

    /// The driver against an in-process loopback "system": every record reaches every
    /// receiver, paced publishing takes about as long as the rate says.
    #[test]
    fn the_driver_delivers_everything_to_every_receiver() {
        use tokio::sync::broadcast;
        struct Tx(broadcast::Sender<Bytes>);
        impl BatchSender for Tx {
            async fn send(&self, payloads: Vec<Bytes>) -> anyhow::Result<()> {
                for p in payloads {
                    self.0.send(p)?;
                }
                Ok(())
            }
        }
        struct Rx(broadcast::Receiver<Bytes>);
        impl RecordReceiver for Rx {
            async fn next(&mut self) -> anyhow::Result<Option<Bytes>> {
                Ok(Some(self.0.recv().await?))
            }
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, _) = broadcast::channel(100_000);
            let load = LoadArgs {
                records: 2_000,
                size: 32,
                batch: 10,
                publishers: 2,
                inflight: 4,
                fanout: 3,
                rate: 20_000.0,
                drain_timeout_secs: 10,
            };
            let receivers: Vec<Rx> = (0..3).map(|_| Rx(tx.subscribe())).collect();
            let senders = vec![Tx(tx.clone()), Tx(tx.clone())];
            let m = drive(&load, senders, receivers).await.unwrap();
            assert_eq!(m.records, 2_000);
            assert_eq!(m.e2e.len(), 3 * 2_000);
            assert_eq!(m.ack.len(), 200);
            // 2,000 records at 20,000/s: about 0.1 s.
            assert!(m.publish_seconds >= 0.09, "{}", m.publish_seconds);
            assert!(m.seconds >= m.publish_seconds * 0.9);
        });
    }
}
