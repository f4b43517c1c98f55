//! The `log` scenario: how fast one shard's log appends durably and reads back.
//!
//! Append figures are counted up to and including a final fsync of everything appended, so
//! `append_bytes_per_sec` is a durable rate, comparable with `dd ... conv=fdatasync`.
//! Latency is per append, from the call to its commit under the fsync policy. Each writer
//! keeps `--inflight` appends outstanding, as a pipelining producer does (Kafka clients
//! default to 5 in flight); `--inflight 1` waits for every commit before the next append.
//! Before reading, the log's files are dropped from the page cache (posix_fadvise), so the
//! read rate is the disk's, comparable with `dd ... iflag=direct`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use felix_hot::{FsyncPolicy, LogConfig, ShardLog};
use felix_wire::{BatchBuilder, BatchIter, Compression, Record};
use hdrhistogram::Histogram;
use serde::Serialize;

#[derive(Args, Debug, Clone)]
pub struct LogArgs {
    /// Directory to create the log in (a fresh subdirectory is made and removed afterwards).
    #[arg(long)]
    dir: PathBuf,
    /// Records to append in all.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Records per batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// fsync policy: periodic, periodic:MS or on_commit.
    #[arg(long, default_value = "periodic")]
    fsync: FsyncPolicy,
    /// Concurrent writers; each waits for its append to commit before sending the next.
    #[arg(long, default_value_t = 1)]
    writers: usize,
    /// Appends each writer keeps in flight, as a pipelining producer does (16 batches of
    /// 64 KiB is 1 MiB in flight); 1 waits for each commit before the next append.
    #[arg(long, default_value_t = 16)]
    inflight: usize,
    /// Segment size in bytes.
    #[arg(long, default_value_t = 256 * 1024 * 1024)]
    segment_bytes: u64,
    /// Codec of the appended batches: none, gzip, snappy, lz4 or zstd. Payloads are random,
    /// so compression only costs CPU here.
    #[arg(long, default_value = "none")]
    compression: Compression,
    /// Bytes per read call in the read-back phase.
    #[arg(long, default_value_t = 1 << 20)]
    read_bytes: usize,
    /// Read back from the page cache instead of dropping the log's files from it first.
    #[arg(long)]
    warm_read: bool,
    /// Keep the log directory afterwards.
    #[arg(long)]
    keep: bool,
}

#[derive(Serialize)]
struct LogReport {
    scenario: &'static str,
    fsync: String,
    writers: usize,
    inflight: usize,
    records: u64,
    record_bytes: usize,
    batch_records: usize,
    compression: &'static str,
    batches: u64,
    log_bytes: u64,
    segments: usize,
    append_seconds: f64,
    append_records_per_sec: f64,
    append_bytes_per_sec: f64,
    append_mib_per_sec: f64,
    append_p50_us: u64,
    append_p99_us: u64,
    append_p999_us: u64,
    append_max_us: u64,
    read_seconds: f64,
    read_bytes_per_sec: f64,
    read_mib_per_sec: f64,
    read_records_per_sec: f64,
    read_cold: bool,
}

fn fsync_name(p: FsyncPolicy) -> String {
    match p {
        FsyncPolicy::OnCommit => "on_commit".into(),
        FsyncPolicy::Periodic { interval } => format!("periodic:{}", interval.as_millis()),
    }
}

/// A pool of distinct batches with random payloads, built before timing starts so the
/// figures measure the log, not the encoder.
fn batch_pool(args: &LogArgs) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut pool = Vec::new();
    for _ in 0..16 {
        let mut b = BatchBuilder::new(args.compression);
        for _ in 0..args.batch {
            let mut value = vec![0u8; args.size];
            for chunk in value.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let bytes = x.to_le_bytes();
                chunk.copy_from_slice(&bytes[..chunk.len()]);
            }
            b.push(Record::value(1_700_000_000_000, value));
        }
        pool.push(b.build().context("encode benchmark batch")?);
    }
    Ok(pool)
}

fn drop_from_page_cache(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "log") {
            let f = std::fs::File::open(&path)?;
            // SAFETY: plain syscall on a valid, open descriptor.
            let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            if rc != 0 {
                bail!("posix_fadvise on {}: error {rc}", path.display());
            }
        }
    }
    Ok(())
}

pub fn run(args: LogArgs) -> anyhow::Result<()> {
    if args.batch == 0 || args.records == 0 || args.writers == 0 || args.inflight == 0 {
        bail!("--records, --batch, --writers and --inflight must be at least 1");
    }
    let dir = args
        .dir
        .join(format!("felix-bench-log-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clear {}", dir.display()))?;
    }
    let pool = Arc::new(batch_pool(&args)?);
    let batches = args.records.div_ceil(args.batch as u64);
    let config = LogConfig {
        shard: "bench/log/0/0".into(),
        segment_bytes: args.segment_bytes,
        segment_age: None,
        fsync: args.fsync,
        max_pending_bytes: 256 * 1024 * 1024,
        ..LogConfig::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start tokio runtime")?;

    let report = rt.block_on(async {
        let log = ShardLog::open(&dir, config)
            .with_context(|| format!("open log in {}", dir.display()))?;

        // ---- append ----
        let start = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..args.writers as u64 {
            let log = log.clone();
            let pool = pool.clone();
            let inflight = args.inflight;
            let mine = batches / args.writers as u64 + u64::from(w < batches % args.writers as u64);
            tasks.push(tokio::spawn(async move {
                let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
                let mut in_flight = std::collections::VecDeque::with_capacity(inflight);
                for i in 0..mine {
                    let batch = pool[((i + w) % pool.len() as u64) as usize].clone();
                    let t = Instant::now();
                    in_flight.push_back((t, log.append(batch).await?));
                    if in_flight.len() >= inflight {
                        // Commits resolve in offset order, so the oldest is the next to finish.
                        let (t, ticket) = in_flight.pop_front().expect("non-empty");
                        ticket.committed().await?;
                        hist.saturating_record(t.elapsed().as_micros().max(1) as u64);
                    }
                }
                for (t, ticket) in in_flight {
                    ticket.committed().await?;
                    hist.saturating_record(t.elapsed().as_micros().max(1) as u64);
                }
                anyhow::Ok(hist)
            }));
        }
        let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
        for t in tasks {
            hist.add(t.await.context("writer task")??)?;
        }
        log.sync().await.context("final fsync")?;
        let append_elapsed = start.elapsed();
        let log_bytes = log.size_bytes();
        let segments = log.sealed_segments().len() + 1;

        // ---- read back ----
        if !args.warm_read {
            drop_from_page_cache(&dir)?;
        }
        let start = Instant::now();
        let end = log.committed_offset();
        let mut offset = log.first_offset();
        let mut read_records = 0u64;
        while offset < end {
            let read = log.read(offset, args.read_bytes, None)?;
            for item in BatchIter::new(&read.batches, usize::MAX) {
                let (h, _) =
                    item.map_err(|(pos, e)| anyhow::anyhow!("batch at byte {pos} of a read: {e}"))?;
                read_records += h.records_count as u64;
            }
            offset = read.next_offset;
        }
        let read_elapsed = start.elapsed();
        if read_records != batches * args.batch as u64 {
            bail!(
                "read back {read_records} records, appended {}",
                batches * args.batch as u64
            );
        }
        let secs = |d: Duration| d.as_secs_f64().max(1e-9);
        let records = batches * args.batch as u64;
        anyhow::Ok(LogReport {
            scenario: "log",
            fsync: fsync_name(args.fsync),
            writers: args.writers,
            inflight: args.inflight,
            records,
            record_bytes: args.size,
            batch_records: args.batch,
            compression: args.compression.name(),
            batches,
            log_bytes,
            segments,
            append_seconds: secs(append_elapsed),
            append_records_per_sec: records as f64 / secs(append_elapsed),
            append_bytes_per_sec: log_bytes as f64 / secs(append_elapsed),
            append_mib_per_sec: log_bytes as f64 / secs(append_elapsed) / 1048576.0,
            append_p50_us: hist.value_at_quantile(0.50),
            append_p99_us: hist.value_at_quantile(0.99),
            append_p999_us: hist.value_at_quantile(0.999),
            append_max_us: hist.max(),
            read_seconds: secs(read_elapsed),
            read_bytes_per_sec: log_bytes as f64 / secs(read_elapsed),
            read_mib_per_sec: log_bytes as f64 / secs(read_elapsed) / 1048576.0,
            read_records_per_sec: read_records as f64 / secs(read_elapsed),
            read_cold: !args.warm_read,
        })
    })?;
    if !args.keep {
        std::fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
    }
    crate::common::print_line(&report)
}
