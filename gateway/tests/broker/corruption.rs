//! Never silently wrong (spec: "Failures"; issue: verified reads): stored data that fails
//! its checks is refused with the typed `corrupt_data` error, over QUIC and over Kafka, and
//! counted in `felix_corruption_detected_total{tier}`; it is never served as records at the
//! wrong offsets. The damage is made the way an operator or a failing disk would: the broker
//! is stopped, a sealed segment file is changed, the broker starts again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use felix_client::{AckMode, ClientError, Message, StartAt, StreamConfig};
use felix_wire::BatchIter;
use felix_wire::batch::stamp_base_offset;
use felix_wire::protocol::codes;
use serde_json::Value;

use super::common::{Broker, BrokerOptions, PATIENCE, metric_lines, metric_value};

/// Kafka topics are the streams of `default/default`.
const T: &str = "default";
const NS: &str = "default";
const STREAM: &str = "damaged";
const RECORDS: u64 = 120;

/// The segment files of shard 0 of `STREAM`, oldest first.
fn segment_files(data_dir: &Path) -> Vec<PathBuf> {
    let dir = data_dir
        .join("streams")
        .join(T)
        .join(NS)
        .join(STREAM)
        .join("0");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort();
    files
}

/// Adds 1 to the base offset (outside the batch CRC) of a batch in the middle of `path`;
/// returns that batch's true base offset.
pub(super) fn bump_a_base_offset(path: &Path) -> u64 {
    let mut bytes = std::fs::read(path).unwrap();
    let batches: Vec<(usize, usize, i64)> = {
        let mut iter = BatchIter::new(&bytes, usize::MAX);
        let mut out = Vec::new();
        loop {
            let at = iter.position();
            match iter.next() {
                Some(Ok((h, b))) => out.push((at, b.len(), h.base_offset)),
                Some(Err((at, e))) => panic!("{} at {at}: {e}", path.display()),
                None => break,
            }
        }
        out
    };
    assert!(batches.len() >= 3, "the segment holds several batches");
    let (at, len, base) = batches[batches.len() / 2];
    stamp_base_offset(&mut bytes[at..at + len], base + 1);
    std::fs::write(path, bytes).unwrap();
    base as u64
}

/// `kafka_client.py consume-errors`: records read from offset 0 until the first error.
async fn kafka_read_until_error(broker: &Broker) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broker/kafka_client.py");
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new("python3")
            .arg(&script)
            .args([
                "consume-errors",
                &broker.kafka_addr.to_string(),
                STREAM,
                "--timeout",
                "45",
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("kafka_client.py finished")
    .expect("run python3 (scripts/test.sh installs confluent-kafka)");
    assert!(
        out.status.success(),
        "kafka_client.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from kafka_client.py")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_base_offset_in_a_sealed_segment_is_refused_as_corrupt_over_quic_and_kafka() {
    let mut broker = Broker::start(BrokerOptions::new().fsync("on_commit")).await;
    let client = broker.client().await;
    let _ = client.create_tenant(T).await;
    let _ = client.create_namespace(T, NS).await;
    client
        .create_stream(
            T,
            NS,
            STREAM,
            StreamConfig {
                durable: Some(true),
                shards: Some(1),
                segment_bytes: Some(4096),
                // Never uploaded: an uploaded range is served from the object store instead
                // (broker::tiering::a_damaged_local_segment_that_was_uploaded_is_...).
                tiered: Some(false),
                ..Default::default()
            },
        )
        .await
        .expect("create stream");
    for i in 0..RECORDS {
        client
            .publish(
                T,
                NS,
                STREAM,
                Message::new(format!("record-{i:04}-{}", "x".repeat(100))),
                AckMode::Batch,
            )
            .await
            .expect("publish");
    }
    drop(client);
    broker.kill();
    let files = segment_files(&broker.data_dir());
    assert!(files.len() >= 4, "several sealed segments: {files:?}");
    let victim = bump_a_base_offset(&files[1]);
    broker.restart().await;

    // QUIC: history up to the damaged batch, dense, then the typed error.
    let client = broker.client().await;
    let mut sub = client
        .subscribe(T, NS, STREAM, 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    let mut next = 0u64;
    let error = loop {
        match tokio::time::timeout(PATIENCE, sub.next_event())
            .await
            .expect("an event or an error")
        {
            Ok(Some(e)) => {
                assert_eq!(e.offset, next, "offsets are dense");
                assert_eq!(
                    e.payload,
                    format!("record-{next:04}-{}", "x".repeat(100)).as_bytes(),
                    "offset {next} carries its own record"
                );
                next += 1;
            }
            Ok(None) => panic!("the subscription ended at {next} without an error"),
            Err(e) => break e,
        }
    };
    assert!(
        next <= victim,
        "nothing at or after the damaged batch was served ({next})"
    );
    match error {
        ClientError::Broker(body) => {
            assert_eq!(body.code, codes::CORRUPT_DATA, "{body:?}");
            assert_eq!(body.reason, "corrupt_segment", "{body:?}");
            assert!(body.retry_after_ms.is_none(), "not retryable: {body:?}");
            let file = files[1].file_name().unwrap().to_string_lossy().to_string();
            assert!(body.message.contains(&file), "names the file: {body:?}");
        }
        other => panic!("expected corrupt_data, got {other:?}"),
    }

    // Kafka: a consumer is told (no silent retry for ever), and never gets a misplaced record.
    let read = kafka_read_until_error(&broker).await;
    let records = read["records"].as_array().expect("records");
    for (i, r) in records.iter().enumerate() {
        assert_eq!(
            r["o"].as_u64(),
            Some(i as u64),
            "Kafka offsets are dense: {r}"
        );
    }
    assert!(
        (records.len() as u64) <= victim,
        "Kafka served nothing at or after the damaged batch"
    );
    let errors = read["errors"].as_array().expect("errors");
    assert!(
        errors
            .iter()
            .any(|e| e.as_str().is_some_and(|e| e.starts_with("INVALID_MSG"))),
        // librdkafka's name for Kafka's CORRUPT_MESSAGE (code 2).
        "the Kafka consumer was handed CORRUPT_MESSAGE: {errors:?} after {} records",
        records.len()
    );

    let metrics = broker.metrics().await;
    let hot: f64 = metric_lines(&metrics, "felix_corruption_detected_total")
        .iter()
        .filter(|l| l.contains("tier=\"hot\""))
        .map(|l| metric_value(l))
        .sum();
    assert!(hot >= 2.0, "both detections counted: {metrics}");
    let log = std::fs::read_to_string(broker.log_path()).unwrap_or_default();
    assert_eq!(
        log.matches("stored data failed its checks").count(),
        1,
        "logged once for the damaged file"
    );
}
