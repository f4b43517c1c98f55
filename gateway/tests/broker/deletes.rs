//! Deletes that stay deleted (issue: never silently wrong): a stream created again under a
//! deleted one's name never serves the old records, whatever a crash left on disk. The
//! crash is made deterministic: the deleted stream's directory is put back as a kill -9
//! between the control plane's record of the delete and the file removal would leave it.

use std::path::PathBuf;
use std::time::Duration;

use felix_client::{AckMode, Message, StartAt, StreamConfig};

use super::common::{Broker, BrokerOptions, PATIENCE, copy_dir};

const T: &str = "del";
const NS: &str = "ns";
const S: &str = "again";

fn stream_dir(broker: &Broker) -> PathBuf {
    broker.data_dir().join("streams").join(T).join(NS).join(S)
}

async fn create(client: &felix_client::Connection) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let r = client
            .create_stream(
                T,
                NS,
                S,
                StreamConfig {
                    durable: Some(true),
                    shards: Some(1),
                    segment_bytes: Some(4096),
                    ..Default::default()
                },
            )
            .await;
        match r {
            Ok(_) => return,
            // The name stays reserved while the old objects are deleted.
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("create: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("create {T}/{NS}/{S}: {e}"),
        }
    }
}

async fn publish(client: &felix_client::Connection, prefix: &str, n: usize) {
    for i in 0..n {
        client
            .publish(
                T,
                NS,
                S,
                Message::new(format!("{prefix}-{i}-{}", "y".repeat(200))),
                AckMode::Batch,
            )
            .await
            .unwrap_or_else(|e| panic!("publish {prefix}-{i}: {e}"));
    }
}

/// Every record of shard 0 up to its end, by subscribing from the earliest offset.
async fn read_all(client: &felix_client::Connection, end: u64) -> Vec<String> {
    let mut sub = client
        .subscribe(T, NS, S, 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    let mut out = Vec::new();
    while (out.len() as u64) < end {
        let e = tokio::time::timeout(PATIENCE, sub.next_event())
            .await
            .expect("an event")
            .expect("no error")
            .expect("not ended");
        assert_eq!(e.offset, out.len() as u64, "dense offsets");
        out.push(String::from_utf8_lossy(&e.payload).into_owned());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_created_again_never_serves_the_deleted_ones_records() {
    let mut broker = Broker::start(BrokerOptions::new().fsync("on_commit")).await;
    let client = broker.client().await;
    client.create_tenant(T).await.expect("tenant");
    client.create_namespace(T, NS).await.expect("namespace");
    create(&client).await;
    publish(&client, "old", 60).await;
    drop(client);
    broker.kill();
    let saved = tempfile::tempdir().unwrap();
    copy_dir(&stream_dir(&broker), saved.path());

    // Delete, then "crash" before the files went: put them back and restart. The broker
    // finishes the delete at start-up.
    broker.restart().await;
    let client = broker.client().await;
    client.delete_stream(T, NS, S).await.expect("delete");
    drop(client);
    broker.kill();
    copy_dir(saved.path(), &stream_dir(&broker));
    broker.restart().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while stream_dir(&broker).exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the deleted stream's files were not removed at start-up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The files come back once more while the broker runs (a copy the start-up sweep did
    // not see): creating the stream again must still not adopt them.
    copy_dir(saved.path(), &stream_dir(&broker));
    let client = broker.client().await;
    create(&client).await;
    let info = client.describe_stream(T, NS, S).await.expect("describe");
    assert_eq!(
        info.shards.iter().map(|s| s.next_offset).sum::<u64>(),
        0,
        "the new stream is empty"
    );
    publish(&client, "new", 3).await;
    let records = read_all(&client, 3).await;
    assert!(
        records.iter().all(|r| r.starts_with("new-")),
        "only the new stream's records: {records:?}"
    );
    // And across a restart.
    drop(client);
    broker.restart().await;
    let client = broker.client().await;
    let records = read_all(&client, 3).await;
    assert!(records.iter().all(|r| r.starts_with("new-")), "{records:?}");
    let info = client.describe_stream(T, NS, S).await.expect("describe");
    assert_eq!(info.shards[0].next_offset, 3);
}
