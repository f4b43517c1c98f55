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

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use clap::{Args, ValueEnum};
use felix_client::{
    AckMode, Client, ClientConfig, ClientError, Message, ShardInfo, StartAt, StreamConfig, codes,
};
use serde::Serialize;
use tokio::sync::watch;

use crate::pubsub_scenario::{BatchSender, LoadArgs, drive, unique_name};

const TENANT: &str = "bench";
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start tokio runtime")?;
    let line = rt.block_on(async {
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
    admin: Client,
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

    async fn client(&self) -> anyhow::Result<Client> {
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

    async fn metrics(&self) -> anyhow::Result<Scrape> {
        let admin = self.args.admin.clone();
        tokio::task::spawn_blocking(move || scrape(&admin))
            .await
            .context("metrics task")?
    }

    /// `records` records at `rate` (0: unpaced) to `stream`, through `--publishers` new
    /// connections.
    async fn publish(
        &self,
        stream: &str,
        records: u64,
        rate: f64,
    ) -> anyhow::Result<crate::pubsub_scenario::Measured> {
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
        let clients: Vec<Client> = senders.iter().map(|s| s.client.clone()).collect();
        // No receivers: `drive` then only publishes and measures acknowledgements.
        let measured = drive(&load, senders, Vec::<NoReceiver>::new()).await?;
        for c in clients {
            c.close().await;
        }
        Ok(measured)
    }
}

async fn connect(addr: &str, config: &ClientConfig) -> anyhow::Result<Client> {
    Client::connect(addr, config.clone())
        .await
        .with_context(|| format!("connect to the broker at {addr}"))
}

/// `Ok` for success and for `already_exists`.
fn exists_ok(r: Result<(), ClientError>) -> Result<(), ClientError> {
    match r {
        Err(e) if e.code() == Some(codes::ALREADY_EXISTS) => Ok(()),
        other => other,
    }
}

struct Sender {
    client: Client,
    stream: String,
}

impl BatchSender for Sender {
    async fn send(&self, payloads: Vec<Bytes>) -> anyhow::Result<()> {
        let n = payloads.len() as u64;
        let messages = incompressible(&payloads)
            .into_iter()
            .map(Message::new)
            .collect();
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

/// The payloads with every byte after the first 8 (the send time) replaced by fresh
/// pseudo-random bytes. `drive` sends copies of one template, which the tier's Parquet
/// encoding (zstd) would shrink a hundredfold; distinct random records keep the objects as
/// large as the log, as real data of high entropy would.
fn incompressible(payloads: &[Bytes]) -> Vec<Bytes> {
    static SEED: AtomicU64 = AtomicU64::new(1);
    let mut x = SEED
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        | 1;
    let total: usize = payloads.iter().map(Bytes::len).sum();
    let mut buf = BytesMut::with_capacity(total);
    let mut out = Vec::with_capacity(payloads.len());
    for p in payloads {
        let head = p.len().min(8);
        buf.extend_from_slice(&p[..head]);
        let mut left = p.len() - head;
        while left > 0 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let take = left.min(8);
            buf.extend_from_slice(&x.to_le_bytes()[..take]);
            left -= take;
        }
        out.push(buf.split().freeze());
    }
    out
}

/// `drive` needs a receiver type even with no receivers.
struct NoReceiver;

impl crate::pubsub_scenario::RecordReceiver for NoReceiver {
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
    fn new(m: &crate::pubsub_scenario::Measured, size: usize, rate: f64) -> PublishFigures {
        let secs = m.publish_seconds.max(1e-9);
        PublishFigures {
            records: m.records,
            target_rate: rate,
            seconds: m.publish_seconds,
            records_per_sec: m.records as f64 / secs,
            payload_mb_per_sec: m.records as f64 * size as f64 / secs / 1e6,
            ack_p50_us: m.ack.value_at_quantile(0.50),
            ack_p99_us: m.ack.value_at_quantile(0.99),
            ack_p999_us: m.ack.value_at_quantile(0.999),
            ack_max_us: m.ack.max(),
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
    let watch = UploadWatch::start(b, &a.stream).await?;
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

/// What one subscriber read.
#[derive(Serialize, Default, Clone)]
struct ReplayFigures {
    records: u64,
    payload_bytes: u64,
    /// Subscribe call to the last record.
    seconds: f64,
    /// Subscribe call to the first record.
    first_record_ms: f64,
    payload_mb_per_sec: f64,
    records_per_sec: f64,
    /// Times the reader started again from offset 0 after reaching the end.
    passes_completed: u64,
}

/// Reads `stream` from `earliest` up to `end` (exclusive), checking the offsets are
/// contiguous; again from the start after reaching `end` while `repeat`, until `stop` turns
/// true. Offsets of each pass must begin at 0.
async fn replay(
    client: &Client,
    stream: &str,
    end: u64,
    repeat: bool,
    mut stop: watch::Receiver<bool>,
    progress: Arc<AtomicU64>,
) -> anyhow::Result<ReplayFigures> {
    let mut f = ReplayFigures::default();
    let start = Instant::now();
    'passes: loop {
        let mut sub = client
            .subscribe(TENANT, NAMESPACE, stream, 0, StartAt::Earliest)
            .await
            .context("subscribe from earliest")?;
        if sub.start_offset() != 0 {
            bail!(
                "the replay starts at offset {}, not 0: records were lost",
                sub.start_offset()
            );
        }
        let mut expected = 0u64;
        while expected < end {
            let event = tokio::select! {
                biased;
                _ = stop.changed() => break 'passes,
                e = sub.next_event() => e,
            };
            let event = match event {
                Ok(Some(event)) => event,
                Ok(None) => bail!("the subscription ended at offset {expected} of {end}"),
                Err(e) => {
                    return Err(e).with_context(|| format!("subscription at offset {expected}"));
                }
            };
            if event.offset != expected {
                bail!("expected offset {expected}, got {}", event.offset);
            }
            if f.records == 0 {
                f.first_record_ms = start.elapsed().as_secs_f64() * 1e3;
            }
            expected += 1;
            f.records += 1;
            f.payload_bytes += event.payload.len() as u64;
            if f.records.is_multiple_of(4096) {
                progress.store(f.records, Ordering::Relaxed);
            }
        }
        f.passes_completed += 1;
        if !repeat || *stop.borrow() {
            break;
        }
    }
    progress.store(f.records, Ordering::Relaxed);
    f.seconds = start.elapsed().as_secs_f64();
    let secs = f.seconds.max(1e-9);
    f.payload_mb_per_sec = f.payload_bytes as f64 / secs / 1e6;
    f.records_per_sec = f.records as f64 / secs;
    Ok(f)
}

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
    let client = b.client().await?;
    let before = b.metrics().await?;
    let cpu_before = cpu_seconds();
    let (_stop_tx, stop) = watch::channel(false);
    let replayed = replay(
        &client,
        &a.stream,
        end,
        false,
        stop,
        Arc::new(AtomicU64::new(0)),
    )
    .await?;
    let cpu = cpu_seconds() - cpu_before;
    let after = b.metrics().await?;
    client.close().await;
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
        gets_per_mb: store.get_requests as f64 / mb.max(1e-9),
        fetched_per_delivered: store.get_bytes as f64 / (replayed.payload_bytes.max(1)) as f64,
        replay: replayed,
        store,
        bench_cpu_seconds: cpu,
    })
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
    let live = unique_name("live");
    b.create_stream(
        &live,
        StreamConfig {
            hot_retention_ms: Some(1),
            ..Default::default()
        },
    )
    .await?;
    let records = ((a.rate * a.seconds / a.batch as f64).ceil() as u64).max(1) * a.batch as u64;
    let before = b.metrics().await?;
    let (stop_tx, stop) = watch::channel(false);
    let reader = if a.cold_reader {
        let end = b.shard(&a.stream).await?.next_offset;
        let client = b.client().await?;
        let stream = a.stream.clone();
        Some(tokio::spawn(async move {
            let r = replay(
                &client,
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
    b.admin
        .delete_stream(TENANT, NAMESPACE, &live)
        .await
        .with_context(|| format!("delete stream {live}"))?;
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
    let stream = unique_name("lag");
    b.create_stream(
        &stream,
        StreamConfig {
            hot_retention_ms: Some(1),
            ..Default::default()
        },
    )
    .await?;
    let records = ((a.rate * a.seconds / a.batch as f64).ceil() as u64).max(1) * a.batch as u64;
    let before = b.metrics().await?;
    let watch = UploadWatch::start(b, &stream).await?;
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
    b.admin
        .delete_stream(TENANT, NAMESPACE, &stream)
        .await
        .with_context(|| format!("delete stream {stream}"))?;
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

// ---------------------------------------------------------------------------------------
// upload watch: seal-to-record lag seen from outside
// ---------------------------------------------------------------------------------------

/// How often the upload watch lists a stream's segments.
const WATCH_POLL: Duration = Duration::from_millis(50);

/// Every segment's seal-to-record lag as a client sees it: `list_segments` every
/// [`WATCH_POLL`] on a connection of its own, noting when each segment (by last offset)
/// is first listed sealed (`uploading`, or `hot` with timestamps, which the active segment
/// lacks) and when first listed `cold` (recorded in the manifest). Each time is late by up
/// to one poll, so a lag is within about ±[`WATCH_POLL`]. Unlike the broker's histogram,
/// it sees every segment, including those sealed while the uploader was busy.
struct UploadWatch {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<WatchFigures>,
}

/// What the upload watch saw.
#[derive(Serialize, Default)]
struct WatchFigures {
    poll_ms: u64,
    /// Segments seen sealed and then recorded.
    segments: u64,
    /// Segments recorded without ever being listed as sealed (sealed and recorded within
    /// one poll); counted in the quantiles as a lag of 0.
    recorded_within_one_poll: u64,
    p50_seconds: Option<f64>,
    p99_seconds: Option<f64>,
    max_seconds: Option<f64>,
    mean_seconds: Option<f64>,
    /// Most sealed segments (and their bytes) waiting for upload in any one listing.
    max_backlog_segments: u64,
    max_backlog_bytes: u64,
    /// Listings that failed (ignored).
    list_errors: u64,
}

impl UploadWatch {
    async fn start(b: &Bench, stream: &str) -> anyhow::Result<UploadWatch> {
        let client = b.client().await?;
        let stream = stream.to_owned();
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut sealed: BTreeMap<u64, Instant> = BTreeMap::new();
            let mut recorded: BTreeMap<u64, Instant> = BTreeMap::new();
            let mut f = WatchFigures {
                poll_ms: WATCH_POLL.as_millis() as u64,
                ..WatchFigures::default()
            };
            let mut tick = tokio::time::interval(WATCH_POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = tick.tick() => {}
                }
                let list = match client.list_segments(TENANT, NAMESPACE, &stream).await {
                    Ok(list) => list,
                    Err(_) => {
                        f.list_errors += 1;
                        continue;
                    }
                };
                let now = Instant::now();
                let (mut waiting, mut bytes) = (0, 0);
                for seg in list.iter().filter(|s| s.shard == 0) {
                    let is_sealed = seg.tier == "uploading"
                        || (seg.tier == "hot" && (seg.min_timestamp, seg.max_timestamp) != (0, 0));
                    if seg.tier == "cold" {
                        recorded.entry(seg.last_offset).or_insert(now);
                    } else if is_sealed {
                        sealed.entry(seg.last_offset).or_insert(now);
                        waiting += 1;
                        bytes += seg.size_bytes;
                    }
                }
                f.max_backlog_segments = f.max_backlog_segments.max(waiting);
                f.max_backlog_bytes = f.max_backlog_bytes.max(bytes);
            }
            client.close().await;
            let mut lags: Vec<f64> = Vec::new();
            for (last, at) in &recorded {
                match sealed.get(last) {
                    Some(s) => lags.push(at.saturating_duration_since(*s).as_secs_f64()),
                    None => {
                        f.recorded_within_one_poll += 1;
                        lags.push(0.0);
                    }
                }
            }
            lags.sort_by(f64::total_cmp);
            f.segments = lags.len() as u64;
            let q = |q: f64| -> Option<f64> {
                // The nearest-rank quantile.
                let n = lags.len();
                (n > 0).then(|| lags[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
            };
            f.p50_seconds = q(0.50);
            f.p99_seconds = q(0.99);
            f.max_seconds = lags.last().copied();
            f.mean_seconds =
                (!lags.is_empty()).then(|| lags.iter().sum::<f64>() / lags.len() as f64);
            f
        });
        Ok(UploadWatch { stop, task })
    }

    async fn finish(self) -> anyhow::Result<WatchFigures> {
        let _ = self.stop.send(true);
        self.task.await.context("upload watch task")
    }
}

// ---------------------------------------------------------------------------------------
// /metrics
// ---------------------------------------------------------------------------------------

/// The broker's `/metrics`, as sample name (with labels) → value.
struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    fn get(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }

    /// `(upper bound, cumulative count)` of a histogram's buckets, `+Inf` last.
    fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        let prefix = format!("{name}_bucket{{le=\"");
        let mut out: Vec<(f64, f64)> = self
            .0
            .iter()
            .filter_map(|(k, v)| {
                let le = k.strip_prefix(&prefix)?.strip_suffix("\"}")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, *v))
            })
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// A plain HTTP/1.0 GET of `http://{admin}/metrics` (no client library needed for one page).
fn scrape(admin: &str) -> anyhow::Result<Scrape> {
    let mut conn = TcpStream::connect(admin)
        .with_context(|| format!("connect to the admin address {admin}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: {admin}\r\n\r\n")?;
    let mut text = String::new();
    conn.read_to_string(&mut text)
        .with_context(|| format!("read http://{admin}/metrics"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of headers in the /metrics response")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        bail!(
            "GET http://{admin}/metrics: {}",
            head.lines().next().unwrap_or("")
        );
    }
    let mut samples = BTreeMap::new();
    for line in body.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some((name, value)) = line.rsplit_once(' ')
            && let Ok(v) = value.parse::<f64>()
        {
            samples.insert(name.to_owned(), v);
        }
    }
    Ok(Scrape(samples))
}

/// Object-store traffic between two scrapes.
#[derive(Serialize, Default)]
struct StoreDelta {
    get_requests: u64,
    get_bytes: u64,
    put_requests: u64,
    cache_hits: u64,
    cache_misses: u64,
    uploaded_objects: u64,
    uploaded_bytes: u64,
    upload_errors: u64,
}

impl StoreDelta {
    fn between(before: &Scrape, after: &Scrape) -> StoreDelta {
        let d = |name: &str| (after.get(name) - before.get(name)).max(0.0) as u64;
        StoreDelta {
            get_requests: d("felix_tier_store_get_requests_total"),
            get_bytes: d("felix_tier_store_get_bytes_total"),
            put_requests: d("felix_tier_store_put_requests_total"),
            cache_hits: d("felix_cold_cache_hits_total"),
            cache_misses: d("felix_cold_cache_misses_total"),
            uploaded_objects: d("felix_tier_uploaded_objects_total"),
            uploaded_bytes: d("felix_tier_uploaded_bytes_total"),
            upload_errors: d("felix_tier_upload_errors_total"),
        }
    }
}

const LAG: &str = "felix_tier_upload_lag_seconds";

/// Seal-to-record lag observed between two scrapes. Quantiles are bucket upper bounds
/// (`None` past the last finite bound).
#[derive(Serialize, Default)]
struct LagFigures {
    count: u64,
    mean_seconds: Option<f64>,
    p50_le_seconds: Option<f64>,
    p99_le_seconds: Option<f64>,
    max_le_seconds: Option<f64>,
    /// `(upper bound, observations in this bucket)`, empty buckets left out.
    buckets: Vec<(String, u64)>,
}

impl LagFigures {
    fn between(before: &Scrape, after: &Scrape) -> LagFigures {
        let b0 = before.buckets(LAG);
        let b1 = after.buckets(LAG);
        let count = (after.get(&format!("{LAG}_count")) - before.get(&format!("{LAG}_count")))
            .max(0.0) as u64;
        let sum = after.get(&format!("{LAG}_sum")) - before.get(&format!("{LAG}_sum"));
        // Cumulative counts in the window, per upper bound.
        let cum: Vec<(f64, f64)> = b1
            .iter()
            .map(|(le, v)| {
                let was = b0.iter().find(|(l, _)| l == le).map_or(0.0, |(_, v0)| *v0);
                (*le, v - was)
            })
            .collect();
        let quantile = |q: f64| -> Option<f64> {
            if count == 0 {
                return None;
            }
            let target = q * count as f64;
            cum.iter()
                .find(|(_, c)| *c >= target - 1e-9)
                .map(|(le, _)| *le)
                .filter(|le| le.is_finite())
        };
        let mut buckets = Vec::new();
        let mut prev = 0.0;
        for (le, c) in &cum {
            let n = (c - prev).max(0.0) as u64;
            prev = *c;
            if n > 0 {
                let name = if le.is_finite() {
                    format!("{le}")
                } else {
                    "+Inf".to_owned()
                };
                buckets.push((name, n));
            }
        }
        LagFigures {
            count,
            mean_seconds: (count > 0).then(|| sum / count as f64),
            p50_le_seconds: quantile(0.50),
            p99_le_seconds: quantile(0.99),
            max_le_seconds: quantile(1.0),
            buckets,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape_of(text: &str) -> Scrape {
        let mut m = BTreeMap::new();
        for line in text.lines() {
            let (k, v) = line.rsplit_once(' ').unwrap();
            m.insert(k.to_owned(), v.parse().unwrap());
        }
        Scrape(m)
    }

    #[test]
    fn lag_quantiles_are_bucket_bounds_of_the_window() {
        let before = scrape_of(
            "felix_tier_upload_lag_seconds_bucket{le=\"0.5\"} 10\n\
             felix_tier_upload_lag_seconds_bucket{le=\"1.0\"} 10\n\
             felix_tier_upload_lag_seconds_bucket{le=\"+Inf\"} 10\n\
             felix_tier_upload_lag_seconds_count 10\n\
             felix_tier_upload_lag_seconds_sum 2.0",
        );
        let after = scrape_of(
            "felix_tier_upload_lag_seconds_bucket{le=\"0.5\"} 108\n\
             felix_tier_upload_lag_seconds_bucket{le=\"1.0\"} 109\n\
             felix_tier_upload_lag_seconds_bucket{le=\"+Inf\"} 110\n\
             felix_tier_upload_lag_seconds_count 110\n\
             felix_tier_upload_lag_seconds_sum 52.0",
        );
        let lag = LagFigures::between(&before, &after);
        assert_eq!(lag.count, 100);
        assert_eq!(lag.mean_seconds, Some(0.5));
        assert_eq!(lag.p50_le_seconds, Some(0.5));
        assert_eq!(lag.p99_le_seconds, Some(1.0));
        assert_eq!(
            lag.max_le_seconds, None,
            "one observation past the last bound"
        );
        assert_eq!(
            lag.buckets,
            vec![
                ("0.5".to_owned(), 98),
                ("1".to_owned(), 1),
                ("+Inf".to_owned(), 1)
            ]
        );
    }
}
