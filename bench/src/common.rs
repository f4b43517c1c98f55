//! What every scenario does the same way: its runtime and its one JSON line, the broker
//! clients it opens and the names it creates, and the figures it takes of itself.
//!
//! Decides the conventions that make scenarios comparable: every client is named
//! `felix-bench` (the catch-up scenario excepted, which names its own), every benchmark
//! stream lives in tenant [`TENANT`] under a name no earlier run used, payloads are
//! incompressible, latencies go into histograms of one shape (1 µs to 10 min, 3 significant
//! digits), and a scenario's result is exactly one line of JSON on stdout.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use felix_client::{AckMode, ClientConfig, ClientError, Connection, Message, codes};
use hdrhistogram::Histogram;
use serde::Serialize;

/// The tenant of every benchmark stream.
pub(crate) const TENANT: &str = "bench";

/// A multi-threaded tokio runtime with every driver enabled: the one scenarios run on.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start tokio runtime")
}

/// Prints a scenario's result: one line of JSON on stdout.
pub(crate) fn print_line(report: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(report)?);
    Ok(())
}

/// A connection to the broker at `addr`.
pub(crate) async fn connect(addr: &str, config: &ClientConfig) -> anyhow::Result<Connection> {
    Connection::connect(addr, config.clone())
        .await
        .with_context(|| format!("connect to the broker at {addr}"))
}

/// `Ok` for success and for `already_exists`.
pub(crate) fn exists_ok(r: Result<(), ClientError>) -> Result<(), ClientError> {
    match r {
        Err(e) if e.code() == Some(codes::ALREADY_EXISTS) => Ok(()),
        other => other,
    }
}

/// Publishes `payloads` as one batch to `stream` in tenant [`TENANT`], acknowledged per
/// batch, and checks that every record was acknowledged.
pub(crate) async fn publish_acknowledged(
    client: &Connection,
    namespace: &str,
    stream: &str,
    payloads: Vec<Bytes>,
) -> anyhow::Result<()> {
    let n = payloads.len() as u64;
    let messages = payloads.into_iter().map(Message::new).collect();
    let acks = client
        .publish_batch(TENANT, namespace, stream, messages, AckMode::Batch)
        .await?;
    let acked: u64 = acks.iter().map(|p| p.last_offset + 1 - p.base_offset).sum();
    if acked != n {
        bail!("published {n} records, {acked} acknowledged");
    }
    Ok(())
}

/// `PREFIX-<pid>-<ms since the epoch>`: unique across runs on one machine.
pub(crate) fn unique_name(prefix: &str) -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{prefix}-{}-{ms}", std::process::id())
}

/// CPU seconds (user + system) used by this process so far.
pub(crate) fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// A latency histogram in microseconds.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// One step of the xorshift generator the payloads are made of.
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A payload of pseudo-random bytes (incompressible, so no codec or disk gets it cheaper).
pub(crate) fn payload_template(size: usize) -> Bytes {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut v = vec![0u8; size];
    for chunk in v.chunks_mut(8) {
        chunk.copy_from_slice(&xorshift(&mut x).to_le_bytes()[..chunk.len()]);
    }
    v.into()
}

/// The payloads with every byte after the first 8 (the send time) replaced by fresh
/// pseudo-random bytes. The load generator sends copies of one template, which the tier's
/// Parquet encoding (zstd) would shrink a hundredfold; distinct random records keep the
/// objects as large as the log, as real data of high entropy would.
pub(crate) fn incompressible(payloads: &[Bytes]) -> Vec<Bytes> {
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
            let take = left.min(8);
            buf.extend_from_slice(&xorshift(&mut x).to_le_bytes()[..take]);
            left -= take;
        }
        out.push(buf.split().freeze());
    }
    out
}

/// p50, p99, p99.9 and the maximum of a latency histogram.
pub(crate) fn percentiles(h: &Histogram<u64>) -> [u64; 4] {
    [
        h.value_at_quantile(0.50),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max(),
    ]
}

/// A `Client` of the broker at `addr`, named `felix-bench` (a loopback broker needs no CA).
pub(crate) async fn client(addr: &str) -> anyhow::Result<felix_client::Client> {
    let config = ClientConfig {
        name: "felix-bench".into(),
        ..ClientConfig::default()
    };
    felix_client::Client::connect([addr.to_owned()], config)
        .await
        .with_context(|| format!("connect to {addr}"))
}
