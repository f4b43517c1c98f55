//! The `nats-kv` scenario (feature `nats`): the `cache` load against a NATS JetStream
//! key-value bucket, for bench/cache.sh.
//!
//! Setup: a fresh file-storage bucket (one replica, history 1), `--keys` keys each written
//! once (not timed), deleted afterwards.
//!
//! Runs: `--clients` clients, each on its own connection, doing `--ops` / `--clients` puts
//! of `--value-bytes` values on keys drawn at random, then as many gets. Figures as the
//! `cache` scenario's: ops/s per phase and per-operation latency in µs.

use std::time::Instant;

use anyhow::Context;
use async_nats::jetstream::{self, kv, stream, stream::StorageType};
use bytes::Bytes;
use clap::Args;
use serde::Serialize;

use crate::common::{histogram, payload_template, percentiles, print_line, runtime, unique_name};

#[derive(Args, Debug, Clone)]
pub struct NatsKvArgs {
    /// The NATS server (JetStream enabled).
    #[arg(long, default_value = "127.0.0.1:4222")]
    server: String,
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    #[arg(long, default_value_t = 16)]
    clients: usize,
    #[arg(long, default_value_t = 50_000)]
    ops: u64,
}

#[derive(Serialize)]
struct Phase {
    ops_per_sec: f64,
    seconds: f64,
    latency_us: [u64; 4],
}

#[derive(Serialize)]
struct Report {
    scenario: &'static str,
    system: &'static str,
    keys: u64,
    value_bytes: usize,
    clients: usize,
    put: Phase,
    get: Phase,
}

fn key(i: u64) -> String {
    format!("key-{i:08}")
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

async fn phase(stores: &[kv::Store], args: &NatsKvArgs, put: bool) -> anyhow::Result<Phase> {
    let value = payload_template(args.value_bytes);
    let per = args.ops / stores.len() as u64;
    let start = Instant::now();
    let tasks: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(c, store)| {
            let (store, value, keys) = (store.clone(), value.clone(), args.keys);
            tokio::spawn(async move {
                let mut h = histogram();
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (c as u64 + 1);
                for _ in 0..per {
                    let k = key(next(&mut x) % keys);
                    let t = Instant::now();
                    if put {
                        store.put(&k, value.clone()).await?;
                    } else {
                        store.get(&k).await?;
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
        ops_per_sec: (per * stores.len() as u64) as f64 / seconds,
        seconds,
        latency_us: percentiles(&all),
    })
}

pub fn run(args: NatsKvArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async move {
        let bucket = unique_name("kv").replace('-', "_");
        let admin = jetstream::new(
            async_nats::connect(&args.server)
                .await
                .context("connect to NATS")?,
        );
        // The bucket's stream as `create_key_value` would make it, made directly: that call
        // first asks for the account's limits, whose answer the Debian nats-server (2.9)
        // gives in a shape this client cannot read.
        admin
            .create_stream(stream::Config {
                name: format!("KV_{bucket}"),
                subjects: vec![format!("$KV.{bucket}.>")],
                max_messages_per_subject: 1,
                storage: StorageType::File,
                allow_rollup: true,
                deny_delete: true,
                allow_direct: true,
                num_replicas: 1,
                discard: stream::DiscardPolicy::New,
                ..Default::default()
            })
            .await?;
        let store = admin.get_key_value(&bucket).await?;
        let value = Bytes::from(vec![b'x'; args.value_bytes]);
        for i in 0..args.keys {
            store.put(key(i), value.clone()).await?;
        }
        let mut stores = Vec::with_capacity(args.clients);
        for _ in 0..args.clients {
            let js = jetstream::new(async_nats::connect(&args.server).await?);
            stores.push(js.get_key_value(&bucket).await?);
        }
        let put = phase(&stores, &args, true).await?;
        let get = phase(&stores, &args, false).await?;
        admin.delete_stream(format!("KV_{bucket}")).await.ok();
        print_line(&Report {
            scenario: "cache",
            system: "nats jetstream kv (file)",
            keys: args.keys,
            value_bytes: args.value_bytes,
            clients: args.clients,
            put,
            get,
        })
    })
}
