//! The Kafka listener with real Kafka clients that no one here wrote, against a real `felix`
//! process: Debian's `kcat` (librdkafka 2.0), the same `kcat` run on the librdkafka 2.16
//! that confluent-kafka's wheel bundles (through `LD_LIBRARY_PATH`), and confluent-kafka
//! itself (Python, driven by `kafka_client.py` beside this file). They run as
//! subprocesses; a missing one fails the test saying how to install it (scripts/test.sh
//! installs both).
//!
//! Promises held here (docs/kafka.md): keyed round trips with both librdkafka versions,
//! idempotent produce and a consumer group with durable committed offsets across a SIGKILL,
//! records readable through both protocols alike, and consumers from offset 0 reading a
//! topic whose early segments live only in the object store.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use felix_client::{AckMode, Message, StartAt, StreamConfig};
use felix_wire::murmur2::shard_for_key;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::common::{Broker, BrokerOptions, PATIENCE, read_until};

/// The Kafka listener's tenant and namespace.
const TENANT: &str = "default";
const NS: &str = "default";
/// Record timestamps start here (as `kafka_client.py` stamps them).
const BASE_TS: i64 = 1_700_000_000_000;
/// How long one client subprocess may run.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(180);

const INSTALL: &str = "scripts/test.sh installs it: apt-get install -y kcat; \
                       python3 -m pip install confluent-kafka";

/// Which librdkafka a `kcat` runs on.
#[derive(Clone, Copy, Debug)]
pub(super) enum Librdkafka {
    /// Debian's, which `kcat` links (2.0).
    Debian,
    /// confluent-kafka's wheel's (2.16), through `LD_LIBRARY_PATH`.
    Wheel,
}

/// A runnable `kcat` on one librdkafka.
pub(super) struct Kcat {
    /// `LD_LIBRARY_PATH` for the wheel's librdkafka; kept alive with the symlink in it.
    lib_dir: Option<tempfile::TempDir>,
}

impl Kcat {
    /// Finds kcat (and for [`Librdkafka::Wheel`] the wheel's librdkafka) and checks that it
    /// runs on the librdkafka version the test claims.
    pub(super) async fn new(which: Librdkafka) -> Kcat {
        let lib_dir = match which {
            Librdkafka::Debian => None,
            Librdkafka::Wheel => {
                let libs = wheel_librdkafka().await;
                let dir = tempfile::tempdir().expect("tempdir");
                std::os::unix::fs::symlink(&libs, dir.path().join("librdkafka.so.1"))
                    .expect("symlink the wheel's librdkafka");
                Some(dir)
            }
        };
        let kcat = Kcat { lib_dir };
        let (ok, out, err) = kcat.run(&["-V"], None).await;
        assert!(
            ok,
            "`kcat -V` failed (is kcat installed? {INSTALL}): {out}{err}"
        );
        let expected = match which {
            Librdkafka::Debian => "librdkafka 2.0",
            Librdkafka::Wheel => "librdkafka 2.16",
        };
        assert!(
            out.contains(expected),
            "kcat should run on {expected}, but says: {out}"
        );
        kcat
    }

    /// Runs kcat with `args`, feeding `input` on stdin: (success, stdout, stderr).
    pub(super) async fn run(&self, args: &[&str], input: Option<&str>) -> (bool, String, String) {
        let mut cmd = tokio::process::Command::new("kcat");
        cmd.args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(dir) = &self.lib_dir {
            cmd.env("LD_LIBRARY_PATH", dir.path());
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run kcat ({e}); {INSTALL}"));
        if let Some(input) = input {
            let mut stdin = child.stdin.take().expect("kcat stdin");
            stdin
                .write_all(input.as_bytes())
                .await
                .expect("write kcat's input");
            drop(stdin);
        }
        let out = tokio::time::timeout(CLIENT_TIMEOUT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("kcat {args:?} did not finish within {CLIENT_TIMEOUT:?}"))
            .expect("kcat output");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// The librdkafka shared object inside confluent-kafka's wheel.
async fn wheel_librdkafka() -> PathBuf {
    let script = "import confluent_kafka, glob, os\n\
                  d = os.path.join(os.path.dirname(os.path.dirname(confluent_kafka.__file__)), 'confluent_kafka.libs')\n\
                  print(sorted(glob.glob(os.path.join(d, 'librdkafka*.so*')))[0])";
    let out = tokio::process::Command::new("python3")
        .args(["-c", script])
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}); {INSTALL}"));
    assert!(
        out.status.success(),
        "confluent-kafka's bundled librdkafka not found ({INSTALL}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Runs a `kafka_client.py` subcommand; returns its JSON output.
pub(super) async fn python(args: &[&str]) -> Value {
    python_script("kafka_client.py", args).await
}

/// Runs `tests/broker/<script>` with `args`; returns its JSON output.
pub(super) async fn python_script(script: &str, args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/broker")
        .join(script);
    let child = tokio::process::Command::new("python3")
        .arg(&script)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}); {INSTALL}"));
    let out = tokio::time::timeout(CLIENT_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{script:?} {args:?} did not finish within {CLIENT_TIMEOUT:?}"))
        .expect("python output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'confluent_kafka'"),
        "confluent-kafka is not installed; {INSTALL}"
    );
    assert!(
        out.status.success(),
        "{script:?} {args:?} failed:\n{stderr}"
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{script:?} {args:?} printed no JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn options() -> BrokerOptions {
    BrokerOptions::new()
}

/// Produces `n` keyed records with kcat (Java's murmur2 partitioner) and reads the topic
/// back from the beginning: every key, value, partition and offset must be as produced.
async fn kcat_round_trip(which: Librdkafka) {
    const N: usize = 10_000;
    const PARTITIONS: u32 = 3;
    let broker = Broker::start(options().env("FELIX_KAFKA_DEFAULT_PARTITIONS", PARTITIONS)).await;
    let kcat = Kcat::new(which).await;
    let bootstrap = broker.kafka_addr.to_string();
    let topic = format!("kcat-{which:?}").to_lowercase();
    let input: String = (0..N).map(|i| format!("key-{i}\tvalue-{i}\n")).collect();
    let (ok, out, err) = kcat
        .run(
            &[
                "-b",
                &bootstrap,
                "-P",
                "-t",
                &topic,
                "-K",
                "\t",
                "-X",
                "partitioner=murmur2_random",
                "-X",
                "batch.num.messages=1000",
            ],
            Some(&input),
        )
        .await;
    assert!(ok, "kcat -P failed: {out}{err}");
    assert!(!err.contains("Delivery failed"), "kcat -P: {err}");

    let (ok, out, err) = kcat
        .run(
            &[
                "-b",
                &bootstrap,
                "-C",
                "-t",
                &topic,
                "-o",
                "beginning",
                "-e",
                "-q",
                "-f",
                "%p\t%o\t%k\t%s\n",
            ],
            None,
        )
        .await;
    assert!(ok, "kcat -C failed: {err}");
    let mut next_offset: HashMap<u32, u64> = HashMap::new();
    let mut last_index: HashMap<u32, i64> = HashMap::new();
    let mut seen = HashSet::new();
    for line in out.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 4, "kcat -C line {line:?}");
        let partition: u32 = fields[0].parse().expect("partition");
        let offset: u64 = fields[1].parse().expect("offset");
        let key = fields[2];
        let i: i64 = key
            .strip_prefix("key-")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected key {key:?}"));
        assert_eq!(fields[3], format!("value-{i}"), "value of {key}");
        assert_eq!(
            partition,
            shard_for_key(key.as_bytes(), PARTITIONS),
            "{key} is in the partition Java's partitioner (and Felix's client) picks"
        );
        let expected = next_offset.entry(partition).or_insert(0);
        assert_eq!(
            offset, *expected,
            "partition {partition}: offsets run without gaps"
        );
        *expected += 1;
        let last = last_index.entry(partition).or_insert(-1);
        assert!(
            i > *last,
            "partition {partition} keeps production order ({i} after {last})"
        );
        *last = i;
        assert!(seen.insert(i), "{key} read twice");
    }
    assert_eq!(seen.len(), N, "every record read back once");
    assert_eq!(
        next_offset.len(),
        PARTITIONS as usize,
        "every partition used"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_on_librdkafka_2_0_round_trips_10000_keyed_messages() {
    kcat_round_trip(Librdkafka::Debian).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_on_librdkafka_2_16_round_trips_10000_keyed_messages() {
    kcat_round_trip(Librdkafka::Wheel).await;
}

/// `[member, partition, offset, key, value]` rows of a `group` run.
fn group_records(v: &Value) -> Vec<(u64, u32, u64, String, String)> {
    v["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| {
            (
                r[0].as_u64().expect("member"),
                r[1].as_u64().expect("partition") as u32,
                r[2].as_u64().expect("offset"),
                r[3].as_str().expect("key").to_owned(),
                r[4].as_str().expect("value").to_owned(),
            )
        })
        .collect()
}

/// confluent-kafka with `enable.idempotence=true` and `acks=all` produces 10,000 records;
/// a group of two consumers processes half of them (committing each before counting it);
/// the broker is SIGKILLed and restarted; the group resumes from its committed offsets and
/// processes the other half. Between them, every record is processed exactly once. While
/// the broker is down, offsets are written as a Felix before the group journals kept them
/// (in the broker's own log): after the restart they are moved into the partitions' group
/// journals, so they are still answered once that old log is lost, until the group commits
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_group_of_two_reads_every_message_once_and_resumes_after_a_restart() {
    const N: usize = 10_000;
    const HALF: usize = N / 2;
    let mut broker = Broker::start(options()).await;
    let bootstrap = broker.kafka_addr.to_string();
    let produced = python(&[
        "produce",
        &bootstrap,
        "orders",
        &N.to_string(),
        "--partitions",
        "4",
    ])
    .await;
    assert_eq!(produced["errors"], Value::Array(vec![]), "{produced}");
    let delivered = produced["delivered"].as_array().expect("delivered");
    assert_eq!(delivered.len(), N, "every record acknowledged");
    // Offsets per partition are dense, in production order.
    let mut per_partition: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for d in delivered {
        let (p, o, i) = (
            d[0].as_u64().expect("p"),
            d[1].as_u64().expect("o"),
            d[2].as_u64().expect("i"),
        );
        per_partition.entry(p).or_default().push((o, i));
    }
    assert_eq!(per_partition.len(), 4, "keys spread over the 4 partitions");
    for (p, rows) in &mut per_partition {
        rows.sort();
        for (n, (o, _)) in rows.iter().enumerate() {
            assert_eq!(*o, n as u64, "partition {p}: dense offsets");
        }
        assert!(
            rows.windows(2).all(|w| w[0].1 < w[1].1),
            "partition {p}: production order"
        );
    }

    let first = python(&["group", &bootstrap, "orders", "g1", &HALF.to_string()]).await;
    let first_records = group_records(&first);
    assert_eq!(first_records.len(), HALF, "{}", first["failures"]);
    let per_member = first["per_member"].as_array().expect("per_member");
    assert!(
        per_member.iter().all(|c| c.as_u64().unwrap_or(0) > 0),
        "both members of the group processed records: {per_member:?}"
    );

    // While it is down, offsets as a Felix before the group journals committed them, in the
    // broker's own log: one group read after the restart, one never read.
    broker.kill();
    let old = [(1, 17), (3, 40)];
    let unread = [(0, 11), (2, 23)];
    let as_before = |offsets: &[(i32, i64)]| -> Vec<(&str, i32, i64)> {
        offsets.iter().map(|(p, o)| ("orders", *p, *o)).collect()
    };
    use super::kafka_group_failover as upgrade;
    upgrade::write_offsets_as_before_the_upgrade(
        &broker.data_dir(),
        "g-upgraded",
        &as_before(&old),
    )
    .await;
    upgrade::write_offsets_as_before_the_upgrade(
        &broker.data_dir(),
        "g-unread",
        &as_before(&unread),
    )
    .await;
    broker.restart().await;
    let bootstrap = broker.kafka_addr.to_string();
    // The start-up move into the partitions' journals, then a first OffsetFetch.
    upgrade::old_offsets_moved_at_start_up(&broker.log_path(), 2).await;
    upgrade::offsets_read(&bootstrap, "orders", "g-upgraded", &old).await;
    // Moved: losing the old log loses nothing.
    broker.kill();
    std::fs::remove_dir_all(broker.data_dir().join("kafka").join("group-offsets"))
        .expect("remove the old offsets log");
    broker.restart().await;
    let bootstrap = broker.kafka_addr.to_string();
    upgrade::offsets_read(&bootstrap, "orders", "g-unread", &unread).await;
    upgrade::offsets_committed_before_the_upgrade_are_answered_until_the_group_commits(
        &bootstrap,
        "orders",
        "g-upgraded",
        &old,
    )
    .await;
    let second = python(&["group", &bootstrap, "orders", "g1", &HALF.to_string()]).await;
    let second_records = group_records(&second);
    assert_eq!(second_records.len(), HALF, "{}", second["failures"]);

    let mut seen: HashMap<(u32, u64), String> = HashMap::new();
    for (member, p, o, k, v) in first_records.iter().chain(&second_records) {
        let i = k.strip_prefix("key-").expect("key");
        assert_eq!(v, &format!("value-{i}"), "member {member}: value of {k}");
        if let Some(earlier) = seen.insert((*p, *o), k.clone()) {
            panic!("partition {p} offset {o} ({earlier}) was processed twice");
        }
    }
    assert_eq!(
        seen.len(),
        N,
        "every record processed exactly once across the restart"
    );
    // The second run started where the first committed, not at the beginning.
    let resumed_at: HashMap<u32, u64> = second_records.iter().fold(HashMap::new(), |mut m, r| {
        let e = m.entry(r.1).or_insert(u64::MAX);
        *e = (*e).min(r.2);
        m
    });
    let first_end: HashMap<u32, u64> = first_records.iter().fold(HashMap::new(), |mut m, r| {
        let e = m.entry(r.1).or_insert(0);
        *e = (*e).max(r.2 + 1);
        m
    });
    for (p, start) in resumed_at {
        assert_eq!(
            start,
            first_end.get(&p).copied().unwrap_or(0),
            "partition {p} resumed at its committed offset"
        );
    }
}

/// Records published over QUIC read the same through Kafka: offsets, keys, values,
/// timestamps and headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_published_over_quic_read_the_same_through_kafka() {
    const N: usize = 300;
    const SHARDS: u32 = 2;
    let broker = Broker::start(options()).await;
    let client = broker.client().await;
    client
        .create_stream(
            TENANT,
            NS,
            "from-quic",
            StreamConfig {
                durable: Some(true),
                shards: Some(SHARDS),
                ..Default::default()
            },
        )
        .await
        .expect("create stream");
    let messages: Vec<Message> = (0..N)
        .map(|i| {
            Message::new(format!("value-{i}"))
                .with_key(format!("key-{i}"))
                .with_header("n", i.to_string())
                .with_timestamp(BASE_TS + i as i64)
        })
        .collect();
    for chunk in messages.chunks(50) {
        client
            .publish_batch(TENANT, NS, "from-quic", chunk.to_vec(), AckMode::Batch)
            .await
            .expect("publish");
    }
    // Within a shard, offsets follow publish order.
    let mut expected: HashMap<String, (u32, u64)> = HashMap::new();
    let mut next = [0u64; SHARDS as usize];
    for i in 0..N {
        let key = format!("key-{i}");
        let shard = shard_for_key(key.as_bytes(), SHARDS);
        expected.insert(key, (shard, next[shard as usize]));
        next[shard as usize] += 1;
    }
    let read = python(&[
        "consume",
        &broker.kafka_addr.to_string(),
        "from-quic",
        &N.to_string(),
    ])
    .await;
    let read = read.as_array().expect("records");
    assert_eq!(read.len(), N);
    for r in read {
        let key = r["k"].as_str().expect("key");
        let i: i64 = key
            .strip_prefix("key-")
            .and_then(|n| n.parse().ok())
            .expect("index");
        let (shard, offset) = expected[key];
        assert_eq!(
            r["p"].as_u64(),
            Some(u64::from(shard)),
            "partition of {key}"
        );
        assert_eq!(r["o"].as_u64(), Some(offset), "offset of {key}");
        assert_eq!(r["v"].as_str(), Some(format!("value-{i}").as_str()));
        assert_eq!(r["ts"].as_i64(), Some(BASE_TS + i), "timestamp of {key}");
        assert_eq!(
            r["h"],
            serde_json::json!([["n", i.to_string()]]),
            "headers of {key}"
        );
    }
}

/// Records produced through Kafka read the same over QUIC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_produced_through_kafka_read_the_same_over_quic() {
    const N: usize = 300;
    let broker = Broker::start(options()).await;
    let produced = python(&[
        "produce",
        &broker.kafka_addr.to_string(),
        "from-kafka",
        &N.to_string(),
        "--partitions",
        "2",
        "--batch",
        "40",
    ])
    .await;
    assert_eq!(produced["errors"], Value::Array(vec![]), "{produced}");
    let mut where_: HashMap<(u64, u64), i64> = HashMap::new();
    let mut ends = [0u64; 2];
    for d in produced["delivered"].as_array().expect("delivered") {
        let (p, o, i) = (
            d[0].as_u64().expect("p"),
            d[1].as_u64().expect("o"),
            d[2].as_i64().expect("i"),
        );
        where_.insert((p, o), i);
        ends[p as usize] = ends[p as usize].max(o + 1);
    }
    assert_eq!(where_.len(), N);
    let client = broker.client().await;
    for shard in 0..2u32 {
        let mut sub = client
            .subscribe(TENANT, NS, "from-kafka", shard, StartAt::Earliest)
            .await
            .expect("subscribe");
        let events = read_until(&mut sub, ends[shard as usize], "QUIC subscriber").await;
        assert_eq!(events.len() as u64, ends[shard as usize]);
        for e in events {
            let i = where_[&(u64::from(shard), e.offset)];
            assert_eq!(
                e.key,
                Some(Bytes::from(format!("key-{i}"))),
                "key at {shard}/{}",
                e.offset
            );
            assert_eq!(e.payload, Bytes::from(format!("value-{i}")));
            assert_eq!(e.timestamp, BASE_TS + i);
            assert_eq!(
                e.headers,
                vec![("n".to_owned(), Bytes::from(i.to_string()))]
            );
        }
    }
}

/// The `.log` files of a stream's shard 0 on local disk.
fn local_segment_files(broker: &Broker, stream: &str) -> Vec<String> {
    let dir = broker
        .data_dir()
        .join("streams")
        .join(TENANT)
        .join(NS)
        .join(stream)
        .join("0");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".log"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Once a topic's early segments have moved to the object store and left local disk,
/// consumers from offset 0 (kcat on librdkafka 2.0, and confluent-kafka with small
/// fetches) receive every record in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_from_offset_0_reads_every_record_after_early_segments_left_local_disk() {
    const N: usize = 3_000;
    let broker = Broker::start(options().env("FELIX_RETENTION_CHECK_MS", 200)).await;
    let bootstrap = broker.kafka_addr.to_string();
    // Tiny segments (the smallest the control plane takes), created through CreateTopics.
    let created = python(&[
        "create",
        &bootstrap,
        "tiered",
        "1",
        "segment.bytes=4096",
        "remote.storage.enable=true",
    ])
    .await;
    assert_eq!(created["partitions"], 1);
    let produced = python(&[
        "produce",
        &bootstrap,
        "tiered",
        &N.to_string(),
        "--batch",
        "25",
    ])
    .await;
    assert_eq!(produced["errors"], Value::Array(vec![]), "{produced}");
    assert_eq!(produced["delivered"].as_array().map(Vec::len), Some(N));

    let client = broker.client().await;
    client
        .alter_stream(
            TENANT,
            NS,
            "tiered",
            StreamConfig {
                hot_retention_bytes: Some(0),
                ..Default::default()
            },
        )
        .await
        .expect("alter stream: keep no uploaded segment locally");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let shard = loop {
        let info = client
            .describe_stream(TENANT, NS, "tiered")
            .await
            .expect("describe");
        let shard = info.shards[0].clone();
        if shard.hot_first_offset > (N as u64) / 2 && shard.cold_bytes > 0 {
            break shard;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "early segments did not leave local disk within {PATIENCE:?}: {shard:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let files = local_segment_files(&broker, "tiered");
    assert!(
        !files.contains(&format!("{:020}.log", 0)),
        "the first segment is gone from local disk: {files:?} ({shard:?})"
    );

    let kcat = Kcat::new(Librdkafka::Debian).await;
    let (ok, out, err) = kcat
        .run(
            &[
                "-b",
                &bootstrap,
                "-C",
                "-t",
                "tiered",
                "-p",
                "0",
                "-o",
                "beginning",
                "-e",
                "-q",
                "-f",
                "%o\t%k\t%s\t%T\n",
            ],
            None,
        )
        .await;
    assert!(ok, "kcat -C failed: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), N, "kcat read every record (stderr: {err})");
    for (n, line) in lines.iter().enumerate() {
        assert_eq!(
            *line,
            format!("{n}\tkey-{n}\tvalue-{n}\t{}", BASE_TS + n as i64),
            "record {n}, in order, from the object store first"
        );
    }

    // ListOffsets by timestamp finds the exact record, here in the object store.
    let at = format!("s@{}", BASE_TS + 1234);
    let (ok, out, err) = kcat
        .run(
            &[
                "-b", &bootstrap, "-C", "-t", "tiered", "-p", "0", "-o", &at, "-c", "1", "-q",
                "-f", "%o\t%k\n",
            ],
            None,
        )
        .await;
    assert!(ok, "kcat -o {at} failed: {err}");
    assert_eq!(
        out, "1234\tkey-1234\n",
        "the first record stamped at or after {at}"
    );

    let read = python(&["consume", &bootstrap, "tiered", &N.to_string()]).await;
    let read = read.as_array().expect("records");
    assert_eq!(read.len(), N);
    for (n, r) in read.iter().enumerate() {
        assert_eq!(r["o"].as_u64(), Some(n as u64), "in order");
        assert_eq!(r["k"].as_str(), Some(format!("key-{n}").as_str()));
        assert_eq!(r["ts"].as_i64(), Some(BASE_TS + n as i64));
        assert_eq!(r["h"], serde_json::json!([["n", n.to_string()]]));
    }
}

/// A request frame: length, then key, version, correlation id, client id (null) and body.
fn raw_request(key: i16, version: i16, correlation: i32, body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    frame.extend_from_slice(&key.to_be_bytes());
    frame.extend_from_slice(&version.to_be_bytes());
    frame.extend_from_slice(&correlation.to_be_bytes());
    frame.extend_from_slice(&(-1i16).to_be_bytes());
    frame.extend_from_slice(body);
    let mut out = (frame.len() as u32).to_be_bytes().to_vec();
    out.extend(frame);
    out
}

async fn read_response(stream: &mut TcpStream) -> Vec<u8> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await.expect("response length");
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut body).await.expect("response body");
    body
}

/// An ApiVersions request newer than the broker's is answered in the v0 shape with
/// UNSUPPORTED_VERSION (how old and new clients negotiate down); a malformed or unknown
/// request closes only its own connection; the broker keeps serving. Then the advertised
/// set is held to the answered set (`kafka_advertised`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_new_api_versions_gets_the_v0_answer_and_bad_requests_close_only_their_connection() {
    let broker = Broker::start(options()).await;
    let mut s = TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect");
    s.write_all(&raw_request(18, 99, 42, &[]))
        .await
        .expect("write");
    let r = read_response(&mut s).await;
    assert_eq!(&r[0..4], &42i32.to_be_bytes(), "correlation id");
    assert_eq!(&r[4..6], &35i16.to_be_bytes(), "UNSUPPORTED_VERSION");
    let count = i32::from_be_bytes([r[6], r[7], r[8], r[9]]) as usize;
    assert_eq!(
        r.len(),
        10 + 6 * count,
        "the v0 shape: (key, min, max) per API"
    );
    let apis: Vec<(i16, i16, i16)> = r[10..]
        .chunks(6)
        .map(|c| {
            (
                i16::from_be_bytes([c[0], c[1]]),
                i16::from_be_bytes([c[2], c[3]]),
                i16::from_be_bytes([c[4], c[5]]),
            )
        })
        .collect();
    assert!(apis.contains(&(18, 0, 3)), "ApiVersions v0-3: {apis:?}");
    assert!(
        apis.iter().any(|a| a.0 == 0),
        "Produce is offered: {apis:?}"
    );

    // A Metadata v0 claiming 50 million topics in 4 bytes: refused, connection closed.
    let mut bad = TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect");
    bad.write_all(&raw_request(3, 0, 1, &0x02fa_f080i32.to_be_bytes()))
        .await
        .expect("write");
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(PATIENCE, bad.read(&mut buf))
        .await
        .expect("closed in time");
    assert_eq!(
        n.unwrap_or(0),
        0,
        "the connection is closed without an answer"
    );
    // An unknown API and a frame of garbage: the same.
    for frame in [raw_request(9999, 0, 1, &[]), vec![0, 0, 0, 3, 1, 2, 3]] {
        let mut bad = TcpStream::connect(broker.kafka_addr)
            .await
            .expect("connect");
        bad.write_all(&frame).await.expect("write");
        let n = tokio::time::timeout(PATIENCE, bad.read(&mut buf))
            .await
            .expect("closed in time");
        assert_eq!(n.unwrap_or(0), 0);
    }
    // The first connection still works: a valid ApiVersions v0.
    s.write_all(&raw_request(18, 0, 43, &[]))
        .await
        .expect("write");
    let r = read_response(&mut s).await;
    assert_eq!(&r[0..4], &43i32.to_be_bytes());
    assert_eq!(&r[4..6], &0i16.to_be_bytes(), "no error");

    super::kafka_advertised::every_advertised_api_is_answered_and_nothing_else(broker.kafka_addr)
        .await;
}

/// What Felix's Kafka listener does not serve, a client must learn at once, as an error its
/// application sees, not as a silent stall:
/// * transactions: the transaction-coordinator lookup is refused with an error librdkafka
///   treats as fatal and not retriable, carrying Felix's reason (it used to be refused with
///   one librdkafka retried until `init_transactions()` timed out with `_TIMED_OUT`);
/// * the KIP-848 consumer protocol: its heartbeat is advertised and refused, so the
///   consumer gets a fatal error (it used to poll nothing for ever). (Share groups are
///   served: `kafka_share`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_kafka_features_fail_at_once_with_an_error_the_application_sees() {
    let broker = Broker::start(options()).await;
    for kind in ["consumer-protocol"] {
        let refused = python(&[
            "unsupported-group",
            kind,
            &broker.kafka_addr.to_string(),
            "unsupported",
        ])
        .await;
        let message = refused["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("API version not supported"),
            "{kind}: the application sees the refusal: {refused}"
        );
    }
    let refused = python(&["transactions", &broker.kafka_addr.to_string()]).await;
    assert_eq!(
        refused["error"], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "{refused}"
    );
    assert_eq!(refused["fatal"], true, "{refused}");
    assert_eq!(refused["retriable"], false, "{refused}");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(message.contains("Felix has no transactions"), "{refused}");
    // At once: the script gives init_transactions() 30 s, which a retried refusal would use.
    let seconds = refused["seconds"].as_f64().expect("seconds");
    assert!(
        seconds < 5.0,
        "refused at once, not after a timeout: {refused}"
    );
}

/// Kafka's admin API reads and sets a topic's retention as the stream's settings, and a
/// config Felix cannot honour is refused by name rather than ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_configs_are_stream_settings_through_the_admin_api() {
    let broker = Broker::start(options()).await;
    let bootstrap = broker.kafka_addr.to_string();
    let created = python(&[
        "create",
        &bootstrap,
        "configured",
        "2",
        "retention.ms=3600000",
    ])
    .await;
    assert_eq!(created["partitions"], 2);
    let described = python(&[
        "configs",
        &bootstrap,
        "configured",
        "retention.bytes=1048576",
    ])
    .await;
    assert_eq!(described["retention.ms"], "3600000", "{described}");
    assert_eq!(described["retention.bytes"], "1048576", "{described}");
    assert_eq!(described["cleanup.policy"], "delete", "{described}");
    let client = broker.client().await;
    let info = client
        .describe_stream(TENANT, NS, "configured")
        .await
        .expect("describe");
    assert_eq!(info.config.retention_ms, Some(3_600_000));
    assert_eq!(info.config.retention_bytes, Some(1_048_576));
    assert_eq!(info.config.shards, Some(2));
    assert_eq!(info.config.durable, Some(true));

    let refused = python(&[
        "create",
        &bootstrap,
        "compacted",
        "1",
        "cleanup.policy=compact",
        "--allow-error",
    ])
    .await;
    assert_eq!(refused["error"], "INVALID_CONFIG", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("compact")),
        "{refused}"
    );
}

/// A Kafka client bootstrapped on one broker of a cluster finds each partition's leader
/// through Metadata, produces to it, and reads every record back through another broker;
/// after the leader of one partition is killed it keeps producing to the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_produces_to_each_partition_leader_of_a_cluster() {
    const N: usize = 3_000;
    const PARTITIONS: u32 = 3;
    let mut cluster = super::cluster::Cluster::start(3).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    client
        .create_stream(
            "default",
            "default",
            "orders",
            felix_client::StreamConfig {
                durable: Some(true),
                shards: Some(PARTITIONS),
                consistency: Some("quorum".into()),
                ..Default::default()
            },
        )
        .await
        .expect("create stream");
    let topology = client
        .topology("default", "default", "orders")
        .await
        .expect("topology");
    let kcat = Kcat::new(Librdkafka::Wheel).await;
    let produce = |from: usize, to: usize, bootstrap: String| {
        let input: String = (from..to)
            .map(|i| format!("key-{i}\tvalue-{i}\n"))
            .collect();
        let kcat = &kcat;
        async move {
            let (ok, out, err) = kcat
                .run(
                    &[
                        "-b",
                        &bootstrap,
                        "-P",
                        "-t",
                        "orders",
                        "-K",
                        "\t",
                        "-X",
                        "partitioner=murmur2_random",
                        "-X",
                        "enable.idempotence=true",
                        "-X",
                        "message.timeout.ms=60000",
                    ],
                    Some(&input),
                )
                .await;
            assert!(ok, "kcat -P failed: {out}{err}");
            assert!(!err.contains("Delivery failed"), "kcat -P: {err}");
        }
    };
    // Bootstrapped on broker 1, which does not lead every partition.
    produce(0, N / 2, cluster.node(1).kafka_addr.to_string()).await;
    // The leader of partition 0 dies; a Kafka producer follows the metadata to its successor.
    let victim = topology.leader(0).map(|(id, _)| id).expect("a leader");
    cluster.node(victim).kill();
    let survivor = (1..=3).find(|b| *b != victim).expect("a survivor");
    produce(N / 2, N, cluster.node(survivor).kafka_addr.to_string()).await;

    let (ok, out, err) = kcat
        .run(
            &[
                "-b",
                &cluster.node(survivor).kafka_addr.to_string(),
                "-C",
                "-t",
                "orders",
                "-o",
                "beginning",
                "-e",
                "-q",
                "-f",
                "%p\t%o\t%k\t%s\n",
            ],
            None,
        )
        .await;
    assert!(ok, "kcat -C failed: {err}");
    let mut next_offset: HashMap<u32, u64> = HashMap::new();
    let mut seen = HashSet::new();
    for line in out.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 4, "kcat -C line {line:?}");
        let partition: u32 = fields[0].parse().expect("partition");
        let offset: u64 = fields[1].parse().expect("offset");
        let i: usize = fields[2]
            .strip_prefix("key-")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected key {:?}", fields[2]));
        assert_eq!(fields[3], format!("value-{i}"));
        assert_eq!(partition, shard_for_key(fields[2].as_bytes(), PARTITIONS));
        let expected = next_offset.entry(partition).or_insert(0);
        assert_eq!(
            offset, *expected,
            "partition {partition}: offsets run without gaps"
        );
        *expected += 1;
        assert!(seen.insert(i), "key-{i} read twice");
    }
    assert_eq!(seen.len(), N, "every record read back once ({err})");
}
