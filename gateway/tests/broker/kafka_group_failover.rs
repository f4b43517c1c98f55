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

use std::collections::{BTreeMap, BTreeSet};

use felix_client::{ClusterClient, StreamConfig};
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
