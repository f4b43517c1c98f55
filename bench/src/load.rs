//! The publish/subscribe load generator, shared by the Felix scenarios and the NATS
//! JetStream one (`nats_scenario`), so that every system is driven by the same code and
//! differs only in the client calls behind [`BatchSender`] and [`RecordReceiver`].
//!
//! Decides what the load is and how it is timed. Publishers split the batches evenly, each
//! keeping `--inflight` calls outstanding, paced (`--rate`) with their batches staggered
//! against each other's; every payload carries its send time in its first 8 bytes, on this
//! process's monotonic clock. Throughput runs from the first publish to the last record
//! received by the slowest subscriber (to the last acknowledgement with no subscribers);
//! publish-ack latency is per call, delivery latency per record.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::common::{cpu_seconds, histogram, payload_template, percentiles};

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
        let [ack_p50_us, ack_p99_us, ack_p999_us, ack_max_us] = percentiles(&m.ack);
        let [e2e_p50_us, e2e_p99_us, e2e_p999_us, e2e_max_us] = percentiles(&m.e2e);
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
            ack_p50_us,
            ack_p99_us,
            ack_p999_us,
            ack_max_us,
            e2e_p50_us,
            e2e_p99_us,
            e2e_p999_us,
            e2e_max_us,
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
