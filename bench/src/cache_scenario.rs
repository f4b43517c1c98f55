//! The `cache` scenario: puts and gets against a running broker or cluster through a
//! `Client` (any broker; it forwards each key's operation to the key's owner).
//!
//! Setup: tenant `bench`, namespace `cache` (kept if they exist), a fresh cache with
//! `--durable`, `--consistency`, `--shards` and `--replicas` as given; `--keys` keys each
//! written once (not timed).
//!
//! Runs: `--clients` clients (each its own `Client`, so its own QUIC connections), each
//! doing `--ops` / `--clients` operations back to back on keys drawn at random: first all
//! puts of `--value-bytes` values, then all gets. Figures per phase: ops/s over the phase,
//! and per-operation latency (send to answer) p50, p99, p99.9 and max in µs.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use felix_client::{CacheConfig, Client, ClientConfig};
use serde::Serialize;

use crate::common::{
    TENANT, exists_ok, histogram, payload_template, percentiles, print_line, runtime, unique_name,
};

const NAMESPACE: &str = "cache";

#[derive(Args, Debug, Clone)]
pub struct CacheArgs {
    /// Brokers' QUIC addresses, comma-separated (a loopback broker needs no CA).
    #[arg(long, default_value = "127.0.0.1:5000")]
    broker: String,
    /// Log-backed (else in memory).
    #[arg(long)]
    durable: bool,
    /// `leader` or `quorum`.
    #[arg(long, default_value = "leader")]
    consistency: String,
    #[arg(long, default_value_t = 1)]
    shards: u32,
    #[arg(long)]
    replicas: Option<u32>,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Operations per phase, over all clients.
    #[arg(long, default_value_t = 50_000)]
    ops: u64,
}

#[derive(Serialize)]
struct Phase {
    ops_per_sec: f64,
    seconds: f64,
    /// Per-operation latency, µs: p50, p99, p99.9, max.
    latency_us: [u64; 4],
}

#[derive(Serialize)]
struct Report {
    scenario: &'static str,
    brokers: usize,
    durable: bool,
    consistency: String,
    shards: u32,
    keys: u64,
    value_bytes: usize,
    clients: usize,
    put: Phase,
    get: Phase,
}

fn key(i: u64) -> String {
    format!("key-{i:08}")
}

/// A small xorshift per client: keys at random without a shared generator.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

async fn phase(
    clients: &[Client],
    cache: &str,
    args: &CacheArgs,
    put: bool,
) -> anyhow::Result<Phase> {
    let value = payload_template(args.value_bytes);
    let per = args.ops / clients.len() as u64;
    let start = Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(c, client)| {
            let (client, cache, value, keys) =
                (client.clone(), cache.to_owned(), value.clone(), args.keys);
            tokio::spawn(async move {
                let mut h = histogram();
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (c as u64 + 1);
                for _ in 0..per {
                    let k = key(next(&mut x) % keys);
                    let t = Instant::now();
                    if put {
                        client
                            .cache_put(TENANT, NAMESPACE, &cache, &k, value.clone(), None)
                            .await?;
                    } else {
                        client.cache_get(TENANT, NAMESPACE, &cache, &k).await?;
                    }
                    h.record(t.elapsed().as_micros().max(1) as u64).ok();
                }
                anyhow::Ok(h)
            })
        })
        .collect();
    let mut all = histogram();
    for t in tasks {
        all.add(t.await.context("client task")??).ok();
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(Phase {
        ops_per_sec: (per * clients.len() as u64) as f64 / seconds,
        seconds,
        latency_us: percentiles(&all),
    })
}

pub fn run(args: CacheArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        let seeds: Vec<String> = args.broker.split(',').map(str::to_owned).collect();
        let config = ClientConfig::default();
        let admin = Client::connect(&seeds, config.clone())
            .await
            .context("connect")?;
        exists_ok(admin.create_tenant(TENANT).await)?;
        exists_ok(admin.create_namespace(TENANT, NAMESPACE).await)?;
        let cache = unique_name("kv");
        let cache_config = CacheConfig {
            durable: Some(args.durable),
            consistency: Some(args.consistency.clone()),
            shards: Some(args.shards),
            replicas: args.replicas,
        };
        admin
            .create_cache(TENANT, NAMESPACE, &cache, cache_config)
            .await?;
        let value = Bytes::from(vec![b'x'; args.value_bytes]);
        for i in 0..args.keys {
            admin
                .cache_put(TENANT, NAMESPACE, &cache, key(i), value.clone(), None)
                .await?;
        }
        let mut clients = Vec::with_capacity(args.clients);
        for _ in 0..args.clients {
            clients.push(
                Client::connect(&seeds, config.clone())
                    .await
                    .context("connect")?,
            );
        }
        let clients = Arc::new(clients);
        let put = phase(&clients, &cache, &args, true).await?;
        let get = phase(&clients, &cache, &args, false).await?;
        print_line(&Report {
            scenario: "cache",
            brokers: seeds.len(),
            durable: args.durable,
            consistency: args.consistency.clone(),
            shards: args.shards,
            keys: args.keys,
            value_bytes: args.value_bytes,
            clients: args.clients,
            put,
            get,
        })
    })
}
