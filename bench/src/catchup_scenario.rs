//! The `catchup` scenario: how fast a consumer replays a stream from offset 0 when the
//! stream is on the broker's disk (hot), in the object store behind an empty cache (cold,
//! empty) and behind a warm cache (cold, warm); what a concurrent cold reader does to publish
//! latency; and how long a sealed segment waits to be recorded in the manifest.
//!
//! Everything goes through a running broker over QUIC, as a consumer sees it. One phase per
//! invocation (`--phase`), so that `bench/catchup.sh` can restart the broker between them
//! (an empty cache needs a restart):
//!
//! * `load` — creates the durable, tiered stream `bench/catchup/<--stream>` of one shard and
//!   publishes `--gib` GiB (records of `--size` bytes, `--batch` per call) as fast as
//!   acknowledgements allow. Then shortens `segment_ms` so the tail seals, and waits until
//!   every record is in a recorded object. The stream is still wholly local (hot).
//! * `replay` — subscribes from `earliest` and reads every record up to the end the stream
//!   had when the phase started; checks the offsets are contiguous and the tiers are what
//!   `--expect` says. Figures: MB/s, and the broker's object-store GETs, bytes fetched and
//!   cache hits/misses during the replay (deltas of `/metrics`).
//! * `make-cold` — sets the stream's hot retention to 1 ms, so every uploaded segment is
//!   deleted locally, and waits until the hot log starts past the last record.
//! * `publish-latency` — publishes to a fresh tiered stream at `--rate` records/s for
//!   `--seconds`, with or without (`--cold-reader`) a subscriber replaying the big stream
//!   from offset 0 at the same time (again from 0 whenever it reaches the end). Figures:
//!   per-call publish-ack latency, and the reader's progress.
//! * `upload-lag` — publishes to a fresh tiered stream of small segments at `--rate` for
//!   `--seconds`, waits until every sealed segment is uploaded, and reads the broker's
//!   `felix_tier_upload_lag_seconds` histogram (seal to manifest record) around it.
//!
//! Each phase prints one JSON line.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use felix_client::{ClientConfig, Connection, ShardInfo, StreamConfig};
use serde::Serialize;
use tokio::sync::watch;

use crate::broker_metrics::{LagFigures, Scrape, StoreDelta, scrape};
use crate::common::{
    TENANT, connect, cpu_seconds, exists_ok, incompressible, percentiles, publish_acknowledged,
    runtime, unique_name,
};
use crate::load::{BatchSender, LoadArgs, Measured, RecordReceiver, drive};
use crate::replay::{ReplayFigures, replay};
use crate::upload_watch::{UploadWatch, WATCH_POLL, WatchFigures};

const NAMESPACE: &str = "catchup";
const GIB: f64 = (1u64 << 30) as f64;
/// How often the waits poll the broker.
const POLL: Duration = Duration::from_millis(250);

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Load,
    Replay,
    MakeCold,
    PublishLatency,
    UploadLag,
}

/// Where `replay` expects the stream's records to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    /// Every record on the broker's disk.
    Hot,
    /// No record on the broker's disk: all in objects.
    Cold,
    /// Whatever the tiers are.
    Any,
}

#[derive(Args, Debug, Clone)]
pub struct CatchupArgs {
    /// What to do (see the module docs).
    #[arg(long, value_enum)]
    phase: Phase,
    /// The broker's QUIC address (a loopback broker needs no CA).
    #[arg(long, default_value = "127.0.0.1:5000")]
    broker: String,
    /// PEM CA file to verify a non-loopback broker with.
    #[arg(long)]
    ca: Option<std::path::PathBuf>,
    /// The broker's admin HTTP address (for /metrics).
    #[arg(long, default_value = "127.0.0.1:8080")]
    admin: String,
    /// The big stream's name (namespace bench/catchup).
    #[arg(long, default_value = "catchup")]
    stream: String,
    /// A label copied into the JSON line (e.g. `hot`, `cold-empty`, `cold-warm`).
    #[arg(long, default_value = "")]
    label: String,
    /// `load`: GiB of payload to publish (rounded up to whole batches).
    #[arg(long, default_value_t = 1.0)]
    gib: f64,
    /// `load`: records to publish instead of `--gib`.
    #[arg(long)]
    records: Option<u64>,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Records per publish call.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Publishers, each on its own connection.
    #[arg(long, default_value_t = 4)]
    publishers: usize,
    /// Publish calls each publisher keeps in flight.
    #[arg(long, default_value_t = 8)]
    inflight: usize,
    /// Segment size of the streams this phase creates.
    #[arg(long, default_value_t = 64 << 20)]
    segment_bytes: u64,
    /// `publish-latency`, `upload-lag`: records per second across the publishers.
    #[arg(long, default_value_t = 20_000.0)]
    rate: f64,
    /// `publish-latency`, `upload-lag`: seconds of publishing.
    #[arg(long, default_value_t = 15.0)]
    seconds: f64,
    /// `publish-latency`: replay the big stream from offset 0 while publishing.
    #[arg(long)]
    cold_reader: bool,
    /// `replay`: concurrent readers, each on its own connection, reader `i` of `n` from
    /// offset `i × end / n` to the end; figures are their sum over the wall time.
    #[arg(long, default_value_t = 1)]
    readers: u64,
    /// `replay`: more streams (comma-separated, same namespace), each read from 0 by one
    /// more reader at the same time (ten readers of ten streams).
    #[arg(long, value_delimiter = ',')]
    also_streams: Vec<String>,
    /// `replay`: the tiers the stream must be in.
    #[arg(long, value_enum, default_value_t = Expect::Any)]
    expect: Expect,
    /// Longest any wait or replay may take.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

pub fn run(args: CatchupArgs) -> anyhow::Result<()> {
    if args.size < 8 || args.batch == 0 || args.publishers == 0 || args.inflight == 0 {
        bail!("--size must be at least 8; --batch, --publishers and --inflight at least 1");
    }
    if !(args.rate > 0.0 && args.rate.is_finite() && args.seconds > 0.0) {
        bail!("--rate and --seconds must be positive");
    }
    let line = runtime()?.block_on(async {
        let bench = Bench::connect(&args).await?;
        let line = match args.phase {
            Phase::Load => serde_json::to_value(load(&bench).await?)?,
            Phase::Replay => serde_json::to_value(replay_phase(&bench).await?)?,
            Phase::MakeCold => serde_json::to_value(make_cold(&bench).await?)?,
            Phase::PublishLatency => serde_json::to_value(publish_latency(&bench).await?)?,
            Phase::UploadLag => serde_json::to_value(upload_lag(&bench).await?)?,
        };
        bench.admin.close().await;
        anyhow::Ok(line)
    })?;
    println!("{line}");
    Ok(())
}

/// The connection every phase uses for control calls, and how to open more.
struct Bench {
    args: CatchupArgs,
    config: ClientConfig,
    admin: Connection,
}

impl Bench {
    async fn connect(args: &CatchupArgs) -> anyhow::Result<Bench> {
        let config = ClientConfig {
            ca: args.ca.clone(),
            name: "felix-bench-catchup".into(),
            ..ClientConfig::default()
        };
        let admin = connect(&args.broker, &config).await?;
        Ok(Bench {
            args: args.clone(),
            config,
            admin,
        })
    }

    async fn client(&self) -> anyhow::Result<Connection> {
        connect(&self.args.broker, &self.config).await
    }

    fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_secs(self.args.timeout_secs)
    }

    /// Shard 0 of `stream` as the broker describes it.
    async fn shard(&self, stream: &str) -> anyhow::Result<ShardInfo> {
        let info = self
            .admin
            .describe_stream(TENANT, NAMESPACE, stream)
            .await
            .with_context(|| format!("describe stream {TENANT}/{NAMESPACE}/{stream}"))?;
        info.shards
            .into_iter()
            .find(|s| s.shard == 0)
            .with_context(|| format!("stream {stream} has no shard 0 on this broker"))
    }

    /// Polls shard 0 of `stream` until `done` holds; returns it and the seconds waited.
    async fn wait_for(
        &self,
        stream: &str,
        what: &str,
        done: impl Fn(&ShardInfo) -> bool,
    ) -> anyhow::Result<(ShardInfo, f64)> {
        let start = Instant::now();
        let deadline = self.deadline();
        loop {
            let s = self.shard(stream).await?;
            if done(&s) {
                return Ok((s, start.elapsed().as_secs_f64()));
            }
            if Instant::now() > deadline {
                bail!("timed out waiting for {what} on stream {stream}: {s:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn alter(&self, stream: &str, config: StreamConfig) -> anyhow::Result<()> {
        self.admin
            .alter_stream(TENANT, NAMESPACE, stream, config)
            .await
            .with_context(|| format!("alter stream {stream}"))?;
        Ok(())
    }

    /// Creates the tenant and namespace if missing, and a durable, tiered stream of one
    /// shard.
    async fn create_stream(&self, stream: &str, extra: StreamConfig) -> anyhow::Result<()> {
        exists_ok(self.admin.create_tenant(TENANT).await).context("create tenant")?;
        exists_ok(self.admin.create_namespace(TENANT, NAMESPACE).await)
            .context("create namespace")?;
        let config = StreamConfig {
            durable: Some(true),
            shards: Some(1),
            segment_bytes: Some(self.args.segment_bytes),
            segment_ms: Some(3_600_000),
            tiered: Some(true),
            ..extra
        };
        self.admin
            .create_stream(TENANT, NAMESPACE, stream, config)
            .await
            .with_context(|| format!("create stream {TENANT}/{NAMESPACE}/{stream}"))?;
        Ok(())
    }

    /// A fresh stream named after `prefix` whose records leave the broker's disk once
    /// uploaded (a hot retention of 1 ms), for a phase that publishes at a pace.
    async fn create_passing_stream(&self, prefix: &str) -> anyhow::Result<String> {
        let stream = unique_name(prefix);
        let config = StreamConfig {
            hot_retention_ms: Some(1),
            ..Default::default()
        };
        self.create_stream(&stream, config).await?;
        Ok(stream)
    }

    async fn delete_stream(&self, stream: &str) -> anyhow::Result<()> {
        self.admin
            .delete_stream(TENANT, NAMESPACE, stream)
            .await
            .with_context(|| format!("delete stream {stream}"))
    }

    /// Records for `--seconds` at `--rate`, in whole batches (at least one).
    fn paced_records(&self) -> u64 {
        let a = &self.args;
        ((a.rate * a.seconds / a.batch as f64).ceil() as u64).max(1) * a.batch as u64
    }

    async fn metrics(&self) -> anyhow::Result<Scrape> {
        let admin = self.args.admin.clone();
        tokio::task::spawn_blocking(move || scrape(&admin))
            .await
            .context("metrics task")?
    }

    /// `records` records at `rate` (0: unpaced) to `stream`, through `--publishers` new
    /// connections.
    async fn publish(&self, stream: &str, records: u64, rate: f64) -> anyhow::Result<Measured> {
        let load = LoadArgs {
            records,
            size: self.args.size,
            batch: self.args.batch,
            publishers: self.args.publishers,
            inflight: self.args.inflight,
            fanout: 0,
            rate,
            drain_timeout_secs: self.args.timeout_secs,
        };
        let mut senders = Vec::new();
        for _ in 0..self.args.publishers {
            let client = self.client().await?;
            // Learn the shard count now, not inside the timed loop.
            client.shard_count(TENANT, NAMESPACE, stream).await?;
            senders.push(Sender {
                client,
                stream: stream.to_owned(),
            });
        }
        let clients: Vec<Connection> = senders.iter().map(|s| s.client.clone()).collect();
        // No receivers: `drive` then only publishes and measures acknowledgements.
        let measured = drive(&load, senders, Vec::<NoReceiver>::new()).await?;
        for c in clients {
            c.close().await;
        }
        Ok(measured)
    }
}

struct Sender {
    client: Connection,
    stream: String,
}

impl BatchSender for Sender {
    async fn send(&self, payloads: Vec<Bytes>) -> anyhow::Result<()> {
        let payloads = incompressible(&payloads);
        publish_acknowledged(&self.client, NAMESPACE, &self.stream, payloads).await
    }
}

/// `drive` needs a receiver type even with no receivers.
struct NoReceiver;

impl RecordReceiver for NoReceiver {
    async fn next(&mut self) -> anyhow::Result<Option<Bytes>> {
        Ok(None)
    }
}

/// Publish-ack latency and throughput of one publishing run.
#[derive(Serialize, Default)]
struct PublishFigures {
    records: u64,
    target_rate: f64,
    seconds: f64,
    records_per_sec: f64,
    payload_mb_per_sec: f64,
    ack_p50_us: u64,
    ack_p99_us: u64,
    ack_p999_us: u64,
    ack_max_us: u64,
    bench_cpu_seconds: f64,
}

impl PublishFigures {
    fn new(m: &Measured, size: usize, rate: f64) -> PublishFigures {
        let secs = m.publish_seconds.max(1e-9);
        let [ack_p50_us, ack_p99_us, ack_p999_us, ack_max_us] = percentiles(&m.ack);
        PublishFigures {
            records: m.records,
            target_rate: rate,
            seconds: m.publish_seconds,
            records_per_sec: m.records as f64 / secs,
            payload_mb_per_sec: m.records as f64 * size as f64 / secs / 1e6,
            ack_p50_us,
            ack_p99_us,
            ack_p999_us,
            ack_max_us,
            bench_cpu_seconds: m.cpu_seconds,
        }
    }
}

// ---------------------------------------------------------------------------------------
// load
// ---------------------------------------------------------------------------------------

#[derive(Serialize)]
struct LoadReport {
    scenario: &'static str,
    phase: Phase,
    label: String,
    stream: String,
    record_bytes: usize,
    batch_records: usize,
    publishers: usize,
    inflight: usize,
    segment_bytes: u64,
    publish: PublishFigures,
    /// Payload bytes published.
    payload_bytes: u64,
    /// Bytes of the shard's log (record batches as stored) once everything is published.
    log_bytes: u64,
    next_offset: u64,
    /// From the last acknowledgement until every record was in a recorded object (the tail
    /// segment seals after `segment_ms` = 1 s of quiet).
    upload_drain_seconds: f64,
    /// Bytes of the recorded objects.
    cold_bytes: u64,
    /// Object-store traffic and uploads during the phase (`/metrics` deltas).
    store: StoreDelta,
    /// Seal-to-record lag of every segment, seen from outside (the last one's seal waits
    /// for `segment_ms` after the last publish, not for the uploader).
    watched: WatchFigures,
    /// The broker's `felix_tier_upload_lag_seconds` over the phase.
    upload_lag: LagFigures,
}

async fn load(b: &Bench) -> anyhow::Result<LoadReport> {
    let a = &b.args;
    let wanted = a
        .records
        .unwrap_or_else(|| (a.gib * GIB / a.size as f64).ceil() as u64);
    let records = wanted.div_ceil(a.batch as u64) * a.batch as u64;
    b.create_stream(&a.stream, StreamConfig::default()).await?;
    let before = b.metrics().await?;
    let watch = UploadWatch::start(b.client().await?, NAMESPACE, &a.stream);
    let m = b.publish(&a.stream, records, 0.0).await?;
    let publish = PublishFigures::new(&m, a.size, 0.0);
    let published = b.shard(&a.stream).await?;
    // Seal the tail (it rolls after a second without appends), then wait for the uploads.
    b.alter(
        &a.stream,
        StreamConfig {
            segment_ms: Some(1000),
            ..Default::default()
        },
    )
    .await?;
    let (shard, waited) = b
        .wait_for(&a.stream, "every record uploaded", |s| {
            s.uploaded_end == s.next_offset && s.upload_backlog_segments == 0
        })
        .await?;
    tokio::time::sleep(WATCH_POLL * 2).await;
    let watched = watch.finish().await?;
    let after = b.metrics().await?;
    if shard.next_offset != records || shard.first_offset != 0 || shard.hot_first_offset != 0 {
        bail!("after loading {records} records the shard is not as expected: {shard:?}");
    }
    Ok(LoadReport {
        scenario: "catchup",
        phase: Phase::Load,
        label: a.label.clone(),
        stream: a.stream.clone(),
        record_bytes: a.size,
        batch_records: a.batch,
        publishers: a.publishers,
        inflight: a.inflight,
        segment_bytes: a.segment_bytes,
        publish,
        payload_bytes: records * a.size as u64,
        log_bytes: published.hot_bytes,
        next_offset: shard.next_offset,
        upload_drain_seconds: waited,
        cold_bytes: shard.cold_bytes,
        store: StoreDelta::between(&before, &after),
        watched,
        upload_lag: LagFigures::between(&before, &after),
    })
}

// ---------------------------------------------------------------------------------------
// replay
// ---------------------------------------------------------------------------------------

#[derive(Serialize)]
struct ReplayReport {
    scenario: &'static str,
    phase: Phase,
    label: String,
    stream: String,
    expect: Expect,
    /// The shard when the replay began.
    first_offset: u64,
    hot_first_offset: u64,
    next_offset: u64,
    hot_bytes: u64,
    cold_bytes: u64,
    /// Concurrent readers (`--readers` plus one per `--also-streams`); `replay` is their sum.
    readers: u64,
    replay: ReplayFigures,
    /// Object-store traffic during the replay.
    store: StoreDelta,
    /// GETs per MB (10^6 payload bytes) delivered.
    gets_per_mb: f64,
    /// Object-store bytes fetched per payload byte delivered.
    fetched_per_delivered: f64,
    bench_cpu_seconds: f64,
}

async fn replay_phase(b: &Bench) -> anyhow::Result<ReplayReport> {
    let a = &b.args;
    let shard = b.shard(&a.stream).await?;
    let end = shard.next_offset;
    match a.expect {
        Expect::Hot if shard.hot_first_offset > shard.first_offset => bail!(
            "expected every record local, but the hot log starts at {}: {shard:?}",
            shard.hot_first_offset
        ),
        Expect::Cold if shard.hot_first_offset < end => bail!(
            "expected no record local, but the hot log starts at {} (end {end}): {shard:?}",
            shard.hot_first_offset
        ),
        _ => {}
    }
    let readers = a.readers.max(1);
    // (stream, from, end) per reader: `--readers` on the stream, one on each other stream.
    let mut jobs: Vec<(String, u64, u64)> = (0..readers)
        .map(|i| (a.stream.clone(), end * i / readers, end))
        .collect();
    for other in &a.also_streams {
        jobs.push((other.clone(), 0, b.shard(other).await?.next_offset));
    }
    let mut clients = Vec::new();
    for _ in &jobs {
        clients.push(b.client().await?);
    }
    let before = b.metrics().await?;
    let cpu_before = cpu_seconds();
    let (_stop_tx, stop) = watch::channel(false);
    let started = std::time::Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .zip(jobs)
        .map(|(client, (stream, from, end))| {
            let (client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let progress = Arc::new(AtomicU64::new(0));
                let (ns, s) = (NAMESPACE, &stream);
                crate::replay::replay_from(&client, ns, s, from, end, false, stop, progress).await
            })
        })
        .collect();
    let mut runs = Vec::new();
    for task in tasks {
        runs.push(task.await.context("replay task")??);
    }
    let replayed = combine(runs, started.elapsed().as_secs_f64());
    let cpu = cpu_seconds() - cpu_before;
    let after = b.metrics().await?;
    for client in clients {
        client.close().await;
    }
    let store = StoreDelta::between(&before, &after);
    let mb = replayed.payload_bytes as f64 / 1e6;
    Ok(ReplayReport {
        scenario: "catchup",
        phase: Phase::Replay,
        label: a.label.clone(),
        stream: a.stream.clone(),
        expect: a.expect,
        first_offset: shard.first_offset,
        hot_first_offset: shard.hot_first_offset,
        next_offset: end,
        hot_bytes: shard.hot_bytes,
        cold_bytes: shard.cold_bytes,
        readers: readers + a.also_streams.len() as u64,
        gets_per_mb: store.get_requests as f64 / mb.max(1e-9),
        fetched_per_delivered: store.get_bytes as f64 / (replayed.payload_bytes.max(1)) as f64,
        replay: replayed,
        store,
        bench_cpu_seconds: cpu,
    })
}

/// Several readers' figures as one: their records and bytes summed over the wall time of
/// them all; the first record is the slowest reader's (no timeline: it is per reader).
fn combine(runs: Vec<ReplayFigures>, seconds: f64) -> ReplayFigures {
    if let [one] = runs.as_slice() {
        // One reader: its own figures, timeline included.
        return one.clone();
    }
    let mut f = ReplayFigures {
        seconds,
        ..ReplayFigures::default()
    };
    for r in runs {
        f.records += r.records;
        f.payload_bytes += r.payload_bytes;
        f.first_record_ms = f.first_record_ms.max(r.first_record_ms);
        f.passes_completed += r.passes_completed;
    }
    let secs = seconds.max(1e-9);
    f.payload_mb_per_sec = f.payload_bytes as f64 / secs / 1e6;
    f.records_per_sec = f.records as f64 / secs;
    f
}

// ---------------------------------------------------------------------------------------
// make-cold
// ---------------------------------------------------------------------------------------

#[derive(Serialize)]
struct MakeColdReport {
    scenario: &'static str,
    phase: Phase,
    label: String,
    stream: String,
    /// From the alter to the hot log starting past the last record.
    seconds: f64,
    first_offset: u64,
    hot_first_offset: u64,
    next_offset: u64,
    hot_bytes: u64,
    cold_bytes: u64,
}

async fn make_cold(b: &Bench) -> anyhow::Result<MakeColdReport> {
    let a = &b.args;
    // A hot retention of 1 ms: every sealed, uploaded segment goes at the next retention
    // pass (the active segment never does, and it is empty). Not `hot_retention_bytes`: its
    // `0` meant "no limit" before `hot_limit` made it "keep nothing", and a limit of one byte
    // keeps the last sealed segment (Kafka's rule: delete only while what remains still holds
    // the limit). One millisecond means the same under either rule.
    b.alter(
        &a.stream,
        StreamConfig {
            hot_retention_ms: Some(1),
            ..Default::default()
        },
    )
    .await?;
    let (shard, waited) = b
        .wait_for(&a.stream, "the local copy deleted", |s| {
            s.uploaded_end == s.next_offset && s.hot_first_offset >= s.next_offset
        })
        .await?;
    if shard.first_offset != 0 {
        bail!("offset 0 is no longer readable: {shard:?}");
    }
    Ok(MakeColdReport {
        scenario: "catchup",
        phase: Phase::MakeCold,
        label: a.label.clone(),
        stream: a.stream.clone(),
        seconds: waited,
        first_offset: shard.first_offset,
        hot_first_offset: shard.hot_first_offset,
        next_offset: shard.next_offset,
        hot_bytes: shard.hot_bytes,
        cold_bytes: shard.cold_bytes,
    })
}

// ---------------------------------------------------------------------------------------
// publish-latency
// ---------------------------------------------------------------------------------------

#[derive(Serialize)]
struct PublishLatencyReport {
    scenario: &'static str,
    phase: Phase,
    label: String,
    /// The stream published to (fresh, deleted afterwards).
    stream: String,
    cold_reader: bool,
    segment_bytes: u64,
    publish: PublishFigures,
    /// The concurrent reader of the big stream, if any, over the publishing window.
    reader: Option<ReplayFigures>,
    /// Whether the reader was still on its first pass (so every read it made was of records
    /// it had not read before) when publishing ended.
    reader_first_pass_covered_window: Option<bool>,
    store: StoreDelta,
}

async fn publish_latency(b: &Bench) -> anyhow::Result<PublishLatencyReport> {
    let a = &b.args;
    let live = b.create_passing_stream("live").await?;
    let records = b.paced_records();
    let before = b.metrics().await?;
    let (stop_tx, stop) = watch::channel(false);
    let reader = if a.cold_reader {
        let end = b.shard(&a.stream).await?.next_offset;
        let client = b.client().await?;
        let stream = a.stream.clone();
        Some(tokio::spawn(async move {
            let r = replay(
                &client,
                NAMESPACE,
                &stream,
                end,
                true,
                stop,
                Arc::new(AtomicU64::new(0)),
            )
            .await;
            client.close().await;
            r
        }))
    } else {
        None
    };
    let m = b.publish(&live, records, a.rate).await;
    let _ = stop_tx.send(true);
    let reader = match reader {
        Some(task) => Some(task.await.context("reader task")??),
        None => None,
    };
    let m = m?;
    let after = b.metrics().await?;
    b.delete_stream(&live).await?;
    Ok(PublishLatencyReport {
        scenario: "catchup",
        phase: Phase::PublishLatency,
        label: a.label.clone(),
        stream: live,
        cold_reader: a.cold_reader,
        segment_bytes: a.segment_bytes,
        publish: PublishFigures::new(&m, a.size, a.rate),
        reader_first_pass_covered_window: reader.as_ref().map(|r| r.passes_completed == 0),
        reader,
        store: StoreDelta::between(&before, &after),
    })
}

// ---------------------------------------------------------------------------------------
// upload-lag
// ---------------------------------------------------------------------------------------

#[derive(Serialize)]
struct UploadLagReport {
    scenario: &'static str,
    phase: Phase,
    label: String,
    stream: String,
    segment_bytes: u64,
    publish: PublishFigures,
    /// From the last acknowledgement until every sealed segment was uploaded.
    drain_seconds: f64,
    /// Seal-to-record lag of every segment, seen from outside.
    watched: WatchFigures,
    /// The broker's `felix_tier_upload_lag_seconds` over the phase.
    upload_lag: LagFigures,
    store: StoreDelta,
}

async fn upload_lag(b: &Bench) -> anyhow::Result<UploadLagReport> {
    let a = &b.args;
    let stream = b.create_passing_stream("lag").await?;
    let records = b.paced_records();
    let before = b.metrics().await?;
    let watch = UploadWatch::start(b.client().await?, NAMESPACE, &stream);
    let m = b.publish(&stream, records, a.rate).await;
    let (_, drained) = b
        .wait_for(&stream, "every sealed segment uploaded", |s| {
            s.upload_backlog_segments == 0
        })
        .await?;
    // One more listing after the last record, so the watch sees it.
    tokio::time::sleep(WATCH_POLL * 2).await;
    let watched = watch.finish().await?;
    let m = m?;
    let after = b.metrics().await?;
    b.delete_stream(&stream).await?;
    Ok(UploadLagReport {
        scenario: "catchup",
        phase: Phase::UploadLag,
        label: a.label.clone(),
        stream,
        segment_bytes: a.segment_bytes,
        publish: PublishFigures::new(&m, a.size, a.rate),
        drain_seconds: drained,
        watched,
        upload_lag: LagFigures::between(&before, &after),
        store: StoreDelta::between(&before, &after),
    })
}
