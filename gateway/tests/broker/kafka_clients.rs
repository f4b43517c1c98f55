//! The Kafka listener with the Kafka clients that are not librdkafka: kafkajs (JavaScript,
//! `kafka_js.js`), aiokafka (`kafka_aio.py`) and kafka-python (`kafka_py.py`), each a real
//! client run as a subprocess against one shared auth-off `felix` process. scripts/test.sh
//! installs them (kafkajs with npm under ~/.cache/felix/kafkajs, found through
//! FELIX_KAFKAJS_MODULES; the other two with pip).
//!
//! Promises held here (docs/kafka.md, "Tested clients"): each produces and consumes through
//! a consumer group with its offsets committed; kafkajs and aiokafka asking for transactions
//! are refused at once and not retriably (Felix has none); kafka-python grows a topic with
//! CreatePartitions, pages through its partitions with DescribeTopicPartitions and lists
//! its idempotent producer with DescribeProducers.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use super::common::{Broker, BrokerOptions};

/// How long one client subprocess may run (each takes a few seconds).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// Records each client produces and consumes.
const COUNT: usize = 10;
/// A refusal is "at once" well under the clients' own timeouts (30 s and more).
const AT_ONCE_SECS: f64 = 5.0;

/// Where kafkajs is installed: FELIX_KAFKAJS_MODULES, else scripts/test.sh's place for it.
fn kafkajs_modules() -> PathBuf {
    if let Some(dir) = std::env::var_os("FELIX_KAFKAJS_MODULES") {
        return dir.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME");
    cache.join("felix/kafkajs/node_modules")
}

/// Runs `program tests/broker/<script> bootstrap topic COUNT`; returns its JSON output.
async fn client(program: &str, script: &str, broker: &Broker, topic: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/broker")
        .join(script);
    let child = tokio::process::Command::new(program)
        .arg(&path)
        .args([&broker.kafka_addr.to_string(), topic, &COUNT.to_string()])
        .env("NODE_PATH", kafkajs_modules())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program} ({e}); scripts/test.sh installs it"));
    let out = tokio::time::timeout(CLIENT_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish within {CLIENT_TIMEOUT:?}"))
        .expect("client output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed (a missing client is installed by scripts/test.sh):\n{stderr}"
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{script} printed no JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Every produced record came back once, with its key and value, in offset order per
/// partition, and the group committed past all of them.
fn assert_round_trip(name: &str, out: &Value) {
    let records = out["records"].as_array().expect("records");
    let mut seen: Vec<(u64, u64, String, String)> = records
        .iter()
        .map(|r| {
            (
                r[0].as_u64().unwrap(),
                r[1].as_u64().unwrap(),
                r[2].as_str().unwrap().to_owned(),
                r[3].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        seen.len(),
        COUNT,
        "{name}: every record consumed once: {out}"
    );
    seen.sort();
    let mut keys: Vec<String> = seen.iter().map(|r| r.2.clone()).collect();
    keys.sort();
    let mut want: Vec<String> = (0..COUNT).map(|i| format!("key-{i}")).collect();
    want.sort();
    assert_eq!(keys, want, "{name}: {out}");
    for (partition, offset, key, value) in &seen {
        assert_eq!(value, &key.replace("key", "value"), "{name}: {out}");
        let before = seen
            .iter()
            .filter(|r| r.0 == *partition && r.1 < *offset)
            .count() as u64;
        assert_eq!(
            *offset, before,
            "{name}: offsets dense from 0 per partition: {out}"
        );
    }
    assert_eq!(
        out["committed"], COUNT,
        "{name}: the group's committed offsets cover every record: {out}"
    );
}

/// Asking for transactions fails at once, with an error the client does not retry.
fn assert_refused_at_once(name: &str, out: &Value) {
    let tx = &out["transactions"];
    assert!(
        !tx["error"].is_null(),
        "{name}: transactions refused: {out}"
    );
    assert_eq!(tx["retriable"], false, "{name}: not retriable: {out}");
    let secs = tx["seconds"].as_f64().expect("seconds");
    assert!(
        secs < AT_ONCE_SECS,
        "{name}: refused at once, not after a timeout: {out}"
    );
}

/// One broker, the three clients side by side (each on its own topic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafkajs_aiokafka_and_kafka_python_round_trip_and_transactions_are_refused_at_once() {
    let broker = Broker::start(BrokerOptions::new()).await;
    let (js, aio, py) = tokio::join!(
        client("node", "kafka_js.js", &broker, "js-topic"),
        client("python3", "kafka_aio.py", &broker, "aio-topic"),
        client("python3", "kafka_py.py", &broker, "py-topic"),
    );

    assert_round_trip("kafkajs", &js);
    assert_refused_at_once("kafkajs", &js);
    // kafkajs drops the coordinator lookup's error and reports its own (docs/kafka.md).
    assert_eq!(
        js["transactions"]["error"], "KafkaJSGroupCoordinatorNotFound",
        "{js}"
    );

    assert_round_trip("aiokafka", &aio);
    assert_refused_at_once("aiokafka", &aio);
    assert_eq!(
        aio["transactions"]["error"], "TransactionalIdAuthorizationFailed",
        "{aio}"
    );

    assert_round_trip("kafka-python", &py);
    assert_eq!(py["partitions"], 3, "CreatePartitions grew the topic: {py}");
    // DescribeProducers: the one idempotent producer, epoch 0, at the sequence of its last
    // record (one partition: records 0..COUNT took sequences 0..COUNT).
    let producers = py["producers"].as_array().expect("producers");
    assert_eq!(producers.len(), 1, "{py}");
    assert!(producers[0][0].as_i64().is_some_and(|id| id >= 0), "{py}");
    assert_eq!(producers[0][1], 0, "{py}");
    assert_eq!(producers[0][2], COUNT as i64 - 1, "{py}");
    // DescribeTopicPartitions pages by partition, in order, and says when it is done.
    assert_eq!(
        py["pages"],
        serde_json::json!([[["py-topic", 0, [0, 1]]], [["py-topic", 0, [2]]]]),
        "{py}"
    );
    // UNKNOWN_TOPIC_OR_PARTITION, and the topic is not created.
    assert_eq!(
        py["unknown"],
        serde_json::json!([["no-such-topic", 3]]),
        "{py}"
    );
}
