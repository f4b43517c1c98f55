//! What the move and drain scenarios share: filling shards before the timed part, and a
//! steady publisher per shard whose acknowledgements are timed in three phases (before,
//! during and after the operation measured).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use felix_client::{ClusterClient, Message};
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::common::{TENANT, histogram, incompressible, percentiles};

/// Acknowledgement latency of one phase.
#[derive(Serialize, Default)]
pub(crate) struct PhaseFigures {
    pub acks: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl PhaseFigures {
    pub(crate) fn of(h: &Histogram<u64>) -> PhaseFigures {
        let [p50, p99, _, max] = percentiles(h);
        PhaseFigures {
            acks: h.len(),
            p50_us: p50,
            p99_us: p99,
            max_us: max,
        }
    }
}

/// Writes `fill_mib` MiB of incompressible copies of `template` to `shards` shards of the
/// stream, in batches of 256 round-robin; the bytes written.
pub(crate) async fn fill(
    client: &ClusterClient,
    (namespace, stream): (&str, &str),
    shards: u32,
    fill_mib: u64,
    template: &Bytes,
) -> anyhow::Result<u64> {
    let per_batch = 256usize;
    let batches = (fill_mib << 20) / (per_batch * template.len()) as u64;
    for b in 0..batches {
        let payloads = incompressible(&vec![template.clone(); per_batch]);
        let messages: Vec<Message> = payloads.into_iter().map(Message::new).collect();
        let shard = (b % u64::from(shards)) as u32;
        client
            .publish_to_shard(TENANT, namespace, stream, shard, &messages)
            .await
            .context("fill")?;
    }
    Ok(batches * (per_batch * template.len()) as u64)
}

/// What a steady publisher saw: acknowledgement latency per phase, failed publishes, and
/// the longest time between two acknowledgements.
pub(crate) struct Steady {
    pub hists: [Histogram<u64>; 3],
    pub errors: u64,
    pub max_gap: Duration,
}

/// Publishes one `template` record to `shard` every `interval` until `stop`, timing each
/// acknowledgement into the histogram of the current `phase` (0, 1 or 2).
pub(crate) fn spawn_publisher(
    client: ClusterClient,
    (namespace, stream, shard): (String, String, u32),
    template: Bytes,
    interval: Duration,
    (phase, stop): (Arc<AtomicU8>, Arc<AtomicBool>),
) -> JoinHandle<Steady> {
    tokio::spawn(async move {
        let mut hists = [histogram(), histogram(), histogram()];
        let (mut errors, mut last_ack, mut max_gap) = (0u64, Instant::now(), Duration::ZERO);
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.load(Ordering::Acquire) {
            tick.tick().await;
            let p = phase.load(Ordering::Acquire) as usize;
            let t0 = Instant::now();
            let message = [Message::new(template.clone())];
            match client
                .publish_to_shard(TENANT, &namespace, &stream, shard, &message)
                .await
            {
                Ok(_) => {
                    let now = Instant::now();
                    let _ = hists[p].record(now.duration_since(t0).as_micros().max(1) as u64);
                    max_gap = max_gap.max(now.duration_since(last_ack));
                    last_ack = now;
                }
                Err(e) => {
                    eprintln!("shard {shard}: publish failed: {e}");
                    errors += 1;
                }
            }
        }
        Steady {
            hists,
            errors,
            max_gap,
        }
    })
}
