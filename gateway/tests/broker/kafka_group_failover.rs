//! A Kafka classic consumer group of two confluent-kafka consumers (`kafka_group_failover.py`
//! beside this file) on a 3-broker cluster loses its coordinator's broker for good: the
//! group resumes on another broker from its committed offsets, with nothing reprocessed
//! before the last acknowledged commit and nothing after it missed (docs/kafka.md,
//! "Committed offsets"; docs/semantics.md).
//!
//! A step of the share-group cluster test (`kafka_share.rs`), whose cluster it ends with:
//! starting brokers is the expensive part. The topic is a Quorum stream of three replicas
//! and no Felix groups, so its group journals are followed only because they hold Kafka
//! offsets.
//!
//! Also the upgrade: offsets an older Felix committed in the coordinator's own log
//! (`<data_dir>/kafka/group-offsets`) move into the partitions' group journals at start-up,
//! so they are still answered after that log is lost, until the group commits again (a
//! step of the restart test in `kafka.rs`, which has a broker down at the right time).

use std::collections::{BTreeMap, BTreeSet};

use std::path::Path;

use bytes::Bytes;
use felix_client::{ClusterClient, StreamConfig};
use felix_hot::{FsyncPolicy, LogConfig, RetentionPolicy, ShardLog};
use felix_wire::{BatchBuilder, Compression, Record};
use serde_json::Value;

use super::cluster::Cluster;
use super::kafka::python_script;

const COUNT: u64 = 300;
const STOP_AT: u64 = 150;

fn positions(v: &Value) -> BTreeMap<i64, i64> {
    v.as_object()
        .expect("an object of partitions")
        .iter()
        .map(|(p, o)| {
            (
                p.parse().expect("a partition"),
                o.as_i64().expect("an offset"),
            )
        })
        .collect()
}

fn processed(v: &Value) -> Vec<(i64, i64)> {
    v.as_array()
        .expect("records")
        .iter()
        .map(|r| {
            (
                r[1].as_i64().expect("partition"),
                r[2].as_i64().expect("offset"),
            )
        })
        .collect()
}

/// The step: `tenant`/`namespace` is the Kafka listener's.
pub(super) async fn classic_group_resumes_from_its_commits_after_its_coordinator_is_killed(
    cluster: &mut Cluster,
    client: &ClusterClient,
    tenant: &str,
    namespace: &str,
) {
    let topic = "classic-failover";
    let group = "classic-billing";
    client
        .create_stream(
            tenant,
            namespace,
            topic,
            StreamConfig {
                durable: Some(true),
                shards: Some(3),
                replicas: Some(3),
                consistency: Some("quorum".into()),
                ..Default::default()
            },
        )
        .await
        .expect("create stream");
    let all: Vec<String> = cluster
        .brokers
        .iter()
        .map(|b| b.kafka_addr.to_string())
        .collect();
    let first = python_script(
        "kafka_group_failover.py",
        &[
            "first",
            &all.join(","),
            topic,
            group,
            &COUNT.to_string(),
            &STOP_AT.to_string(),
        ],
    )
    .await;
    let committed = positions(&first["positions"]);
    let before = processed(&first["processed"]);
    assert_eq!(before.len() as u64, STOP_AT, "{first}");
    assert!(
        committed.values().any(|o| *o > 0),
        "commits acknowledged before the kill: {first}"
    );
    let coordinator = first["coordinator"].as_u64().expect("coordinator id");
    assert!((1..=3).contains(&coordinator), "{first}");

    // The coordinator's broker goes for good (SIGKILL, never restarted).
    cluster.node(coordinator).kill();
    let survivors: Vec<String> = cluster
        .brokers
        .iter()
        .enumerate()
        .filter(|(i, _)| *i as u64 + 1 != coordinator)
        .map(|(_, b)| b.kafka_addr.to_string())
        .collect();
    let resumed = python_script(
        "kafka_group_failover.py",
        &[
            "resume",
            &survivors.join(","),
            topic,
            group,
            &COUNT.to_string(),
        ],
    )
    .await;
    let now = resumed["coordinator"].as_u64().expect("coordinator id");
    eprintln!(
        "classic group: coordinator {coordinator} killed after commits at {committed:?}; \
         resumed on broker {now}, per member before {} after {}, client failures {}",
        first["per_member"], resumed["per_member"], resumed["failures"]
    );
    assert_ne!(now, coordinator, "another broker coordinates: {resumed}");

    // The offsets the new coordinator answers are exactly the acknowledged commits.
    let found = positions(&resumed["committed"]);
    for (p, o) in &committed {
        assert_eq!(
            found.get(p),
            Some(o),
            "partition {p}'s commit survives: {resumed}"
        );
    }
    // Nothing before the last commit again, nothing after it missed, nothing twice.
    let ends = positions(&resumed["ends"]);
    let after = processed(&resumed["processed"]);
    let mut seen = BTreeSet::new();
    for (p, o) in &after {
        let from = committed.get(p).copied().unwrap_or(0);
        assert!(
            *o >= from,
            "partition {p} offset {o} reprocessed (committed {from}): {resumed}"
        );
        assert!(
            seen.insert((*p, *o)),
            "({p}, {o}) processed twice: {resumed}"
        );
    }
    let mut missed = Vec::new();
    for (p, end) in &ends {
        for o in committed.get(p).copied().unwrap_or(0)..*end {
            if !seen.contains(&(*p, o)) {
                missed.push((*p, o));
            }
        }
    }
    assert!(missed.is_empty(), "missed {missed:?}: {resumed}");
    assert_eq!(
        (before.len() + after.len()) as u64,
        COUNT,
        "every record processed once across the kill: {first} {resumed}"
    );
}

/// Writes `offsets` (topic, partition, offset) of `group` in default/default into the log
/// of committed offsets in `data_dir` as a Felix before the group journals did (its record
/// format: key and value JSON). The broker must be down.
pub(super) async fn write_offsets_as_before_the_upgrade(
    data_dir: &Path,
    group: &str,
    offsets: &[(&str, i32, i64)],
) {
    let log = ShardLog::open(
        data_dir.join("kafka").join("group-offsets"),
        LogConfig {
            shard: "kafka/group-offsets".to_owned(),
            segment_bytes: 4 << 20,
            segment_age: None,
            fsync: FsyncPolicy::OnCommit,
            retention: RetentionPolicy {
                max_bytes: Some(0),
                max_age: None,
            },
            ..LogConfig::default()
        },
    )
    .expect("open the old offsets log");
    let mut b = BatchBuilder::new(Compression::None);
    for (topic, partition, offset) in offsets {
        let key = serde_json::json!({"tenant": "default", "namespace": "default",
            "group": group, "topic": topic, "partition": partition});
        let value = serde_json::json!({"offset": offset, "leader_epoch": -1,
            "metadata": "", "commit_ms": 1});
        b.push(Record {
            offset: 0,
            timestamp: 1,
            key: Some(Bytes::from(key.to_string())),
            value: Some(Bytes::from(value.to_string())),
            headers: Vec::new(),
        });
    }
    let ticket = log.append(b.build().expect("batch")).await.expect("append");
    ticket.committed().await.expect("written");
    log.sync().await.expect("sync");
}

/// After the upgrade (`write_offsets_as_before_the_upgrade` while the broker was down): the
/// broker's log (`log`) says, after its last start, that the old log's offsets (`groups`
/// groups' worth) moved into the partitions' group journals.
pub(super) async fn old_offsets_moved_at_start_up(log: &Path, groups: usize) {
    let deadline = tokio::time::Instant::now() + super::common::PATIENCE;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let last_start = text
            .rsplit("===== test harness: start #")
            .next()
            .unwrap_or("");
        if last_start.contains("moved into them") {
            assert!(
                last_start.contains(&format!("offsets={}", 2 * groups)),
                "every old offset moved: {last_start}"
            );
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old offsets did not move into the group journals: {last_start}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// OffsetFetch (confluent-kafka's `committed()`) answers `offsets` for `group` on `topic`.
pub(super) async fn offsets_read(
    bootstrap: &str,
    topic: &str,
    group: &str,
    offsets: &[(i32, i64)],
) {
    let out = python_script(
        "kafka_group_failover.py",
        &["offsets", bootstrap, topic, group],
    )
    .await;
    for (p, o) in offsets {
        assert_eq!(
            out["before"][p.to_string()].as_i64(),
            Some(*o),
            "{group}: partition {p}'s offset from before the upgrade: {out}"
        );
    }
}

/// After the upgrade: OffsetFetch answers the offsets of `group` on `topic` from before
/// it, and a commit moves them.
pub(super) async fn offsets_committed_before_the_upgrade_are_answered_until_the_group_commits(
    bootstrap: &str,
    topic: &str,
    group: &str,
    old: &[(i32, i64)],
) {
    let moved: Vec<String> = old.iter().map(|(p, o)| format!("{p}={}", o + 5)).collect();
    let mut args = vec!["offsets", bootstrap, topic, group];
    args.extend(moved.iter().map(String::as_str));
    let out = python_script("kafka_group_failover.py", &args).await;
    for (p, o) in old {
        assert_eq!(
            out["before"][p.to_string()].as_i64(),
            Some(*o),
            "partition {p}'s offset from before the upgrade: {out}"
        );
        assert_eq!(
            out["after"][p.to_string()].as_i64(),
            Some(o + 5),
            "partition {p}'s commit after the upgrade supersedes it: {out}"
        );
    }
}
