//! The `nats-groups` scenario (feature `nats`): the `groups` load against NATS JetStream
//! work-queue pull consumers with explicit acks, for bench/groups.sh.
//!
//! Setup, per consumer count: a fresh file-storage stream (one replica, work-queue
//! retention: a record is removed once acknowledged) on subject `bench.groups.<name>`,
//! preloaded with `--records` records of `--size` bytes (publishes of 100, each PubAck
//! awaited; not timed), and one durable pull consumer with explicit acks (ack wait 60 s,
//! no limit on pending acks). Deleted afterwards.
//!
//! Load: that many consumers, each with its own connection, fetching up to `--batch`
//! records at a time from the shared durable consumer (JetStream's work-queue pattern: each
//! record goes to one of them), acknowledging each record, then flushing the connection so
//! the acks have reached the server before the next fetch — JetStream's ack is a publish the
//! server does not answer (Felix's ack is answered once it is in the group's journal).
//!
//! Figures, as `groups`: records/s from the start of consumption to the last ack; claim-to-ack
//! per record (from a fetch's last record to its batch's flush) at full load.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::{self, consumer, stream};
use clap::Args;
use futures::StreamExt;
use serde::Serialize;

use crate::common::{
    histogram, incompressible, payload_template, percentiles, print_line, runtime, unique_name,
};

#[derive(Args, Debug, Clone)]
pub struct NatsGroupsArgs {
    /// The NATS server (JetStream enabled).
    #[arg(long, default_value = "127.0.0.1:4222")]
    server: String,
    /// Records preloaded and consumed in each run.
    #[arg(long, default_value_t = 100_000)]
    records: u64,
    /// Payload bytes per record.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Consumer counts to run, one fresh stream each.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    consumers: Vec<usize>,
    /// Records per fetch.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Fetch one batch at a time: the next fetch goes out only after the last batch's acks
    /// (default: the next fetch goes out before the acks, as `felix-bench groups` claims
    /// its next poll's records while the consumer acks).
    #[arg(long)]
    no_prefetch: bool,
}

#[derive(Serialize)]
struct Run {
    consumers: usize,
    records_per_sec: f64,
    seconds: f64,
    /// Claim-to-ack latency per record, µs: p50, p99, p99.9, max.
    claim_to_ack_us: [u64; 4],
}

#[derive(Serialize)]
struct Report {
    scenario: &'static str,
    system: &'static str,
    records: u64,
    size: usize,
    batch: usize,
    groups: Vec<Run>,
}

pub fn run(args: NatsGroupsArgs) -> anyhow::Result<()> {
    let report = runtime()?.block_on(async {
        let mut groups = Vec::new();
        for &n in &args.consumers {
            groups.push(one_run(&args, n).await?);
        }
        anyhow::Ok(Report {
            scenario: "nats-groups",
            system: "nats",
            records: args.records,
            size: args.size,
            batch: args.batch,
            groups,
        })
    })?;
    print_line(&report)
}

async fn connect(server: &str) -> anyhow::Result<(async_nats::Client, jetstream::Context)> {
    let client = async_nats::ConnectOptions::new()
        .name("felix-bench")
        .connect(server)
        .await
        .with_context(|| format!("connect to NATS at {server}"))?;
    let js = jetstream::new(client.clone());
    Ok((client, js))
}

async fn one_run(args: &NatsGroupsArgs, n: usize) -> anyhow::Result<Run> {
    let (admin_client, admin) = connect(&args.server).await?;
    let name = unique_name(&format!("groups{n}"));
    let subject = format!("bench.groups.{name}");
    let stream = admin
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::WorkQueue,
            num_replicas: 1,
            ..Default::default()
        })
        .await
        .with_context(|| format!("create JetStream stream {name}"))?;
    // Preload (not timed): publishes of 100, every PubAck awaited.
    let template = payload_template(args.size);
    let mut left = args.records;
    while left > 0 {
        let k = left.min(100);
        let payloads = incompressible(&vec![template.clone(); k as usize]);
        let mut acks = Vec::with_capacity(payloads.len());
        for p in payloads {
            acks.push(admin.publish(subject.clone(), p).await?);
        }
        for a in acks {
            a.await.context("preload")?;
        }
        left -= k;
    }
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(name.clone()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(60),
            max_ack_pending: -1,
            ..Default::default()
        })
        .await
        .context("create a durable pull consumer")?;
    let acked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (client, js) = connect(&args.server).await?;
        let c: consumer::PullConsumer = js
            .get_stream(&name)
            .await?
            .get_consumer(&name)
            .await
            .map_err(|e| anyhow::anyhow!("the durable consumer: {e}"))?;
        let (acked, total, batch) = (acked.clone(), args.records, args.batch);
        let prefetch = !args.no_prefetch;
        tasks.push(tokio::spawn(async move {
            let mut h = histogram();
            // A fetch's pull request goes to the server when `messages()` is awaited.
            let fetch = || async {
                c.fetch()
                    .max_messages(batch)
                    .expires(Duration::from_millis(200))
                    .messages()
                    .await
                    .map_err(|e| anyhow::anyhow!("fetch: {e}"))
            };
            let mut next = None;
            while acked.load(Ordering::Relaxed) < total {
                let mut fetched = match next.take() {
                    Some(f) => f,
                    None => fetch().await?,
                };
                let mut got = Vec::with_capacity(batch);
                while let Some(m) = fetched.next().await {
                    got.push(m.map_err(|e| anyhow::anyhow!("fetch: {e}"))?);
                }
                if got.is_empty() {
                    continue;
                }
                let claimed = Instant::now();
                if prefetch && acked.load(Ordering::Relaxed) + (got.len() as u64) < total {
                    next = Some(fetch().await?);
                }
                for m in &got {
                    m.ack().await.map_err(|e| anyhow::anyhow!("ack: {e}"))?;
                }
                client.flush().await?;
                let us = claimed.elapsed().as_micros() as u64;
                for _ in 0..got.len() {
                    let _ = h.record(us.max(1));
                }
                acked.fetch_add(got.len() as u64, Ordering::Relaxed);
            }
            anyhow::Ok(h)
        }));
    }
    let mut all = histogram();
    for t in tasks {
        all.add(t.await??)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let _ = admin.delete_stream(&name).await;
    let _ = admin_client.drain().await;
    Ok(Run {
        consumers: n,
        records_per_sec: args.records as f64 / seconds,
        seconds,
        claim_to_ack_us: percentiles(&all),
    })
}
