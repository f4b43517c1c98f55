//! The Kafka listener's metrics and admin APIs with confluent-kafka (librdkafka 2.16), the
//! Kafka client installed here, against a real `felix` process: `kafka_admin.py` beside
//! this file makes the calls (AdminClient, a manual-assignment consumer) and `kafka.rs`'s
//! `kafka_client.py` produces.
//!
//! Promises held here (docs/kafka.md, docs/operations.md): every Kafka request is counted
//! by API and result and timed, bytes and connections are counted, and a group's lag per
//! partition follows its commits and the log's end.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::common::{Broker, BrokerOptions, PATIENCE, metric_lines, metric_value};
use super::kafka::{python, python_script};

/// Runs a `kafka_admin.py` subcommand; returns its JSON output.
pub(super) async fn admin(args: &[&str]) -> serde_json::Value {
    python_script("kafka_admin.py", args).await
}

/// The value of the series `name{labels}` (labels exactly as the broker writes them), if
/// the broker exports it.
fn series(text: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels}}} ");
    metric_lines(text, name)
        .into_iter()
        .find(|l| l.starts_with(&prefix))
        .map(metric_value)
}

/// Waits (up to PATIENCE) until `name{labels}` reads `want`; panics with the last value.
async fn wait_for_series(broker: &Broker, name: &str, labels: &str, want: f64) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let got = series(&broker.metrics().await, name, labels);
        if got == Some(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}{{{labels}}} is {got:?}, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Kafka families exist from start-up (every served API at 0); a confluent-kafka
/// producer and a committing consumer move the request counters, latencies and byte
/// counters; a request for an API Felix does not serve counts as an `error`; and the
/// group's lag is the log end minus its committed offset, growing as records arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_requests_bytes_connections_and_group_lag_are_metrics() {
    let broker = Broker::start(BrokerOptions::new()).await;
    let bootstrap = broker.kafka_addr.to_string();
    let start = broker.metrics().await;
    for (name, labels) in [
        ("felix_kafka_requests_total", r#"api="Produce",result="ok""#),
        (
            "felix_kafka_requests_total",
            r#"api="Produce",result="error""#,
        ),
        (
            "felix_kafka_requests_total",
            r#"api="OffsetCommit",result="ok""#,
        ),
        (
            "felix_kafka_request_duration_seconds_count",
            r#"api="Fetch""#,
        ),
    ] {
        assert_eq!(
            series(&start, name, labels),
            Some(0.0),
            "{name}{{{labels}}}"
        );
    }
    for name in [
        "felix_kafka_received_bytes_total",
        "felix_kafka_sent_bytes_total",
        "felix_kafka_connections",
    ] {
        assert_eq!(series_plain(&start, name), Some(0.0), "{name}");
    }

    let produced = python(&["produce", &bootstrap, "lagged", "100", "--partitions", "1"]).await;
    assert_eq!(produced["delivered"].as_array().map(Vec::len), Some(100));
    let committed = admin(&["commit", &bootstrap, "lagged", "watchers", "0", "40"]).await;
    assert_eq!(
        committed["committed"],
        serde_json::json!([[0, 40]]),
        "{committed}"
    );
    let lag =
        r#"tenant="default",namespace="default",group="watchers",topic="lagged",partition="0""#;
    wait_for_series(&broker, "felix_kafka_group_lag", lag, 60.0).await;
    let more = python(&["produce", &bootstrap, "lagged", "50", "--first", "100"]).await;
    assert_eq!(more["delivered"].as_array().map(Vec::len), Some(50));
    wait_for_series(&broker, "felix_kafka_group_lag", lag, 110.0).await;
    let last = admin(&["commit", &bootstrap, "lagged", "watchers", "0", "150"]).await;
    assert_eq!(last["committed"], serde_json::json!([[0, 150]]), "{last}");
    wait_for_series(&broker, "felix_kafka_group_lag", lag, 0.0).await;

    // An open connection is counted: every client above has closed its own, so after an
    // answered ApiVersions on this one the gauge reads 1.
    let mut open = TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect");
    open.write_all(&[0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 9, 0xff, 0xff])
        .await
        .expect("write");
    let mut len = [0u8; 4];
    open.read_exact(&mut len)
        .await
        .expect("ApiVersions answered");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let open_now = series_plain(&broker.metrics().await, "felix_kafka_connections");
        if open_now == Some(1.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "felix_kafka_connections is {open_now:?} with one connection open"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(open);

    // AddPartitionsToTxn (24) is a Kafka API Felix does not serve: the connection is
    // closed, and the request counted as an error under its API's name.
    let mut raw = TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect");
    let frame = [0, 0, 0, 10, 0, 24, 0, 0, 0, 0, 0, 1, 0xff, 0xff];
    raw.write_all(&frame).await.expect("write");
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(PATIENCE, raw.read(&mut buf))
        .await
        .expect("the broker closes the connection")
        .unwrap_or(0);
    assert_eq!(n, 0, "no answer to an unserved API");

    let end = broker.metrics().await;
    let count = |name: &str, labels: &str| series(&end, name, labels).unwrap_or(0.0);
    assert!(count("felix_kafka_requests_total", r#"api="Produce",result="ok""#) >= 2.0);
    assert_eq!(
        count(
            "felix_kafka_requests_total",
            r#"api="OffsetCommit",result="ok""#
        ),
        2.0
    );
    assert_eq!(
        count(
            "felix_kafka_requests_total",
            r#"api="AddPartitionsToTxn",result="error""#
        ),
        1.0
    );
    assert_eq!(
        count(
            "felix_kafka_requests_total",
            r#"api="Produce",result="error""#
        ),
        0.0
    );
    assert!(
        count(
            "felix_kafka_request_duration_seconds_count",
            r#"api="Produce""#
        ) >= 2.0
    );
    assert!(
        count(
            "felix_kafka_request_duration_seconds_count",
            r#"api="ApiVersions""#
        ) >= 3.0
    );
    // 150 records of at least "key-i"/"value-i" and their headers went in.
    let received = series_plain(&end, "felix_kafka_received_bytes_total").unwrap_or(0.0);
    let sent = series_plain(&end, "felix_kafka_sent_bytes_total").unwrap_or(0.0);
    assert!(received > 150.0 * 20.0, "received {received}");
    assert!(sent > 0.0, "sent {sent}");
    // Every client above has closed its connections.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while series_plain(&broker.metrics().await, "felix_kafka_connections") != Some(0.0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "Kafka connections left open"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The value of an unlabelled series.
fn series_plain(text: &str, name: &str) -> Option<f64> {
    metric_lines(text, name)
        .into_iter()
        .find(|l| l.starts_with(&format!("{name} ")))
        .map(metric_value)
}

/// confluent-kafka's AdminClient against one broker: CreatePartitions grows a topic and
/// refuses to shrink it; ListOffsets' max_timestamp finds the newest-stamped record, not the
/// last; DeleteRecords raises the earliest offset (and refuses an offset past the end);
/// DeleteGroups removes a group's offsets, refuses a group with a member and says when a
/// group is unknown; IncrementalAlterConfigs DELETE resets configs to a new topic's; and
/// DeleteRecords reaches the uploaded objects (the cold tier) too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_admin_apis_grow_topics_delete_records_and_groups_and_reset_configs() {
    let broker = Broker::start(BrokerOptions::new()).await;
    let b = broker.kafka_addr.to_string();
    let b = b.as_str();
    // Not tiered: the floor DeleteRecords sets is exactly the offset asked for.
    let created = python(&[
        "create",
        b,
        "timed",
        "1",
        "remote.storage.enable=false",
        "retention.ms=3600000",
        "segment.bytes=1048576",
    ])
    .await;
    assert_eq!(created["partitions"], 1, "{created}");
    // Offsets 0..100 stamped BASE+1000.., then 100..150 stamped BASE+0..: the largest
    // timestamp is at offset 99.
    for (count, first) in [("100", "1000"), ("50", "0")] {
        let p = python(&["produce", b, "timed", count, "--first", first]).await;
        assert_eq!(p["errors"], serde_json::json!([]), "{p}");
    }
    let max = admin(&["list-offsets", b, "timed", "0", "max"]).await;
    assert_eq!(max["offset"], 99, "{max}");
    assert_eq!(max["timestamp"], 1_700_000_000_000i64 + 1099, "{max}");

    let deleted = admin(&["delete-records", b, "timed", "0", "30"]).await;
    assert_eq!(deleted["low_watermark"], 30, "{deleted}");
    let earliest = admin(&["list-offsets", b, "timed", "0", "earliest"]).await;
    assert_eq!(earliest["offset"], 30, "{earliest}");
    let client = broker.client().await;
    let info = client
        .describe_stream("default", "default", "timed")
        .await
        .expect("describe");
    assert_eq!(info.shards[0].first_offset, 30, "{:?}", info.shards[0]);
    let past = admin(&["delete-records", b, "timed", "0", "1000"]).await;
    assert_eq!(past["error"], "OFFSET_OUT_OF_RANGE", "{past}");
    let latest = admin(&["list-offsets", b, "timed", "0", "latest"]).await;
    assert_eq!(latest["offset"], 150, "nothing else changed: {latest}");

    let grown = admin(&["create-partitions", b, "timed", "3"]).await;
    assert_eq!(grown["partitions"], 3, "{grown}");
    let info = client
        .describe_stream("default", "default", "timed")
        .await
        .expect("describe");
    assert_eq!(info.config.shards, Some(3));
    let shrink = admin(&["create-partitions", b, "timed", "2"]).await;
    assert_eq!(shrink["error"], "INVALID_PARTITIONS", "{shrink}");
    assert!(
        shrink["message"]
            .as_str()
            .is_some_and(|m| m.contains("can only grow")),
        "{shrink}"
    );

    let committed = admin(&["commit", b, "timed", "old", "0", "40"]).await;
    assert_eq!(
        committed["committed"],
        serde_json::json!([[0, 40]]),
        "{committed}"
    );
    let gone = admin(&["delete-groups", b, "old"]).await;
    assert_eq!(gone["old"], serde_json::Value::Null, "{gone}");
    // Its offsets went with it: nothing is left to know the group by.
    let again = admin(&["delete-groups", b, "old"]).await;
    assert_eq!(again["old"], "GROUP_ID_NOT_FOUND", "{again}");
    let busy = admin(&["delete-groups", b, "busy", "--member", "timed"]).await;
    assert_eq!(busy["member_assigned"], true, "{busy}");
    assert_eq!(busy["busy"], "NON_EMPTY_GROUP", "{busy}");
    let left = admin(&["delete-groups", b, "busy"]).await;
    assert_eq!(left["busy"], serde_json::Value::Null, "{left}");

    // A new topic's configs are the defaults DELETE resets to.
    python(&["create", b, "plain", "1"]).await;
    let defaults = python(&["configs", b, "plain"]).await;
    let reset = admin(&["reset-configs", b, "timed", "retention.ms", "segment.bytes"]).await;
    assert_eq!(reset["retention.ms"], "-1", "{reset}");
    assert_eq!(reset["segment.bytes"], defaults["segment.bytes"], "{reset}");
    assert_eq!(
        reset["remote.storage.enable"], "false",
        "untouched: {reset}"
    );
    let unknown = admin(&["reset-configs", b, "timed", "nonsense.config"]).await;
    assert_eq!(unknown["error"], "INVALID_CONFIG", "{unknown}");

    // On a tiered stream a floor past the uploaded objects stops at a batch boundary; the
    // high watermark is one.
    let p = python(&["produce", b, "tiered", "20", "--partitions", "1"]).await;
    assert_eq!(p["errors"], serde_json::json!([]), "{p}");
    let all = admin(&["delete-records", b, "tiered", "0", "-1"]).await;
    assert_eq!(all["low_watermark"], 20, "{all}");
    let earliest = admin(&["list-offsets", b, "tiered", "0", "earliest"]).await;
    assert_eq!(earliest["offset"], 20, "{earliest}");

    delete_records_reaches_the_uploaded_objects(&broker).await;
}

/// The uploaded objects of partition 0 of `stream` in the broker's local object store, as
/// (first offset, last offset), from their names (`{base:020}-{last:020}.parquet`).
fn objects(broker: &Broker, stream: &str) -> Vec<(u64, u64)> {
    let dir = broker.data_dir().join(format!(
        "objects/tenant=default/namespace=default/stream={stream}/shard=0"
    ));
    let mut out: Vec<(u64, u64)> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let (base, last) = name.strip_suffix(".parquet")?.split_once('-')?;
                Some((base.parse().ok()?, last.parse().ok()?))
            })
            .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// DeleteRecords on the cold tier: with a partition's records in several uploaded objects,
/// a floor inside the third object answers that offset as the low watermark, removes the
/// objects wholly below it from the store and keeps the one holding it; confluent-kafka
/// reading below the floor gets an out-of-range error, and reading at it gets the record.
async fn delete_records_reaches_the_uploaded_objects(broker: &Broker) {
    let b = broker.kafka_addr.to_string();
    let b = b.as_str();
    let client = broker.client().await;
    let config = felix_client::StreamConfig {
        durable: Some(true),
        shards: Some(1),
        segment_bytes: Some(4096),
        // The last segment rolls (and is uploaded) after a second of quiet.
        segment_ms: Some(1000),
        tiered: Some(true),
        ..felix_client::StreamConfig::default()
    };
    client
        .create_stream("default", "default", "coldfloor", config)
        .await
        .expect("stream");
    let p = python(&[
        "produce",
        b,
        "coldfloor",
        "200",
        "--value-bytes",
        "200",
        "--batch",
        "10",
    ])
    .await;
    assert_eq!(p["errors"], serde_json::json!([]), "{p}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let info = client
            .describe_stream("default", "default", "coldfloor")
            .await
            .expect("describe");
        if info.shards[0].uploaded_end == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all uploaded: {:?}",
            info.shards[0]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = objects(broker, "coldfloor");
    assert!(before.len() >= 4, "several objects: {before:?}");
    let (third_base, third_last) = before[2];
    assert!(third_last > third_base, "{before:?}");
    let floor = third_base + 1;

    let deleted = admin(&["delete-records", b, "coldfloor", "0", &floor.to_string()]).await;
    assert_eq!(deleted["low_watermark"], floor, "{deleted}");
    let earliest = admin(&["list-offsets", b, "coldfloor", "0", "earliest"]).await;
    assert_eq!(earliest["offset"], floor, "{earliest}");
    let after = objects(broker, "coldfloor");
    assert_eq!(
        after,
        before[2..].to_vec(),
        "objects wholly below the floor deleted, the rest kept"
    );
    let below = admin(&["read-from", b, "coldfloor", "0", "0"]).await;
    assert!(
        below["first"].is_null()
            && below["error"]
                .as_str()
                .is_some_and(|e| e.contains("out of range")),
        "below the floor: {below}"
    );
    let at = admin(&["read-from", b, "coldfloor", "0", &floor.to_string()]).await;
    assert_eq!(at["first"], floor, "{at}");
}
