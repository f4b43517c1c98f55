//! Analytics straight from the object store (docs/analytics.md): the DuckDB, pyarrow and
//! polars examples of that page, read from the page and run as printed there by
//! `analytics.py` beside this file against the Parquet
//! objects a real broker uploaded, compute what was published: a JSON field of the payload
//! per user, a timestamp filter, one stream read by its path with Hive partitioning.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use felix_client::{AckMode, Connection, Message, StreamConfig};
use serde_json::{Value, json};

use super::common::{Broker, BrokerOptions, PATIENCE};

const T: &str = "acme";
const NS: &str = "shop";
const S: &str = "orders";
const USERS: u64 = 8;
const RECORDS: u64 = 400;
const T0: i64 = 1_700_000_000_000;

/// Record `i`: user `u{i % 8}` (its key, so a user stays on one shard), amount `i`, one
/// second after the one before.
fn order(i: u64) -> Message {
    let user = format!("u{}", i % USERS);
    Message::new(json!({"user": user, "amount": i, "kind": "order"}).to_string())
        .with_key(user)
        .with_timestamp(T0 + i as i64 * 1000)
}

/// Waits until every shard's records are all in objects.
async fn wait_uploaded(client: &Connection) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let info = client.describe_stream(T, NS, S).await.expect("describe");
        let total: u64 = info.shards.iter().map(|s| s.uploaded_end).sum();
        if total == RECORDS {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every record was uploaded: {:?}",
            info.shards
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duckdb_pyarrow_and_polars_read_what_was_published_from_the_objects() {
    let broker = Broker::start(BrokerOptions::new()).await;
    let client = broker.client().await;
    client.create_tenant(T).await.expect("tenant");
    client.create_namespace(T, NS).await.expect("namespace");
    let config = StreamConfig {
        durable: Some(true),
        shards: Some(2),
        segment_bytes: Some(4096),
        // The last segment of each shard rolls (and is uploaded) after a second of quiet.
        segment_ms: Some(1000),
        tiered: Some(true),
        ..StreamConfig::default()
    };
    client
        .create_stream(T, NS, S, config)
        .await
        .expect("stream");
    for chunk in (0..RECORDS).collect::<Vec<_>>().chunks(20) {
        let messages = chunk.iter().map(|&i| order(i)).collect();
        client
            .publish_batch(T, NS, S, messages, AckMode::Batch)
            .await
            .expect("publish");
    }
    wait_uploaded(&client).await;
    // The shards that hold records (the users' keys decide which).
    let used: Vec<u32> = client
        .describe_stream(T, NS, S)
        .await
        .expect("describe")
        .shards
        .iter()
        .filter(|s| s.next_offset > 0)
        .map(|s| s.shard)
        .collect();

    let mut per_user: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for i in 0..RECORDS {
        let e = per_user.entry(format!("u{}", i % USERS)).or_default();
        e.0 += 1;
        e.1 += i;
    }
    let since = RECORDS / 4;
    let recent = RECORDS - since;

    let root = broker.data_dir().join("objects");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broker/analytics.py");
    let out = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(&root)
        .args([T, NS, S, &(T0 + since as i64 * 1000).to_string()])
        .output()
        .await
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named"),
        "duckdb, pyarrow and polars must be installed (scripts/test.sh installs them): {stderr}"
    );
    assert!(out.status.success(), "analytics.py failed: {stderr}");
    let got: Value = serde_json::from_slice(&out.stdout).expect("JSON");

    for (user, (records, amount)) in &per_user {
        assert_eq!(
            got["duckdb"]["per_user"][user],
            json!([records, amount]),
            "{got}"
        );
        assert_eq!(got["polars"]["per_user"][user], json!(records), "{got}");
    }
    assert_eq!(
        got["duckdb"]["per_user"].as_object().map(|m| m.len()),
        Some(per_user.len()),
        "{got}"
    );
    assert_eq!(got["duckdb"]["recent"], json!(recent), "{got}");
    assert_eq!(got["pyarrow"]["recent"], json!(recent), "{got}");
    assert_eq!(got["pyarrow"]["shards"], json!(used), "{got}");
}
