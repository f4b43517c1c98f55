//! Where a classic group's committed offsets are read and written: in the group journal of
//! each partition's shard, on the shard's leader (`crate::groups::kafka_offsets`).
//!
//! Decides what each offset operation asks of the partitions' leaders (reached through
//! `route.rs`) and how their answers become Kafka's: a commit answered per partition, a
//! fetch, a whole group's offsets, a delete. The coordinator checked the client's grants
//! before anything is routed.
//!
//! Offsets committed before offsets moved into the journals were in the coordinator's local
//! log (`<data_dir>/kafka/group-offsets`, [`crate::kafka::offsets`]); they are moved into
//! the journals (`upgrade.rs`), and until then a partition whose journal holds no offset
//! for the group has its old one moved before it is answered. DeleteGroups deletes from
//! both.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::error::ResponseError;
use tracing::warn;

use super::route::{kafka_error, on_topic};
use crate::groups::kafka_offsets::{KafkaOffset, OffsetsOp, ShardOutcome};
use crate::kafka::Kafka;
use crate::kafka::offsets::OffsetKey;
use crate::kafka::scope::Scope;
use crate::kafka::topics::durable_topics;

/// An operation's outcome on one partition.
type Outcome = (i32, Result<Option<KafkaOffset>, ResponseError>);

/// Splits partitions into shard numbers and refusals of negative indexes.
fn shard_numbers(partitions: &[i32]) -> (Vec<u32>, Vec<Outcome>) {
    let mut shards = Vec::new();
    let mut refused = Vec::new();
    for p in partitions {
        match u32::try_from(*p) {
            Ok(s) => shards.push(s),
            Err(_) => refused.push((*p, Err(ResponseError::UnknownTopicOrPartition))),
        }
    }
    (shards, refused)
}

fn outcomes(answers: Vec<(u32, ShardOutcome)>, what: &str, group: &str) -> Vec<Outcome> {
    answers
        .into_iter()
        .map(|(s, outcome)| {
            let outcome = outcome.map_err(|e| {
                warn!(group, partition = s, error = %e.message, "Kafka offsets: {what} refused");
                kafka_error(&e)
            });
            (s as i32, outcome)
        })
        .collect()
}

/// Commits `group`'s offsets on partitions of `topic`: each partition in its shard's
/// journal, answered once it is as durable as the stream's records.
pub(super) async fn commit(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    topic: &str,
    offsets: Vec<(i32, KafkaOffset)>,
) -> Vec<(i32, Option<ResponseError>)> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut by_shard = Vec::with_capacity(offsets.len());
    for (p, offset) in offsets {
        match u32::try_from(p) {
            Ok(s) => by_shard.push((s, offset)),
            Err(_) => out.push((p, Some(ResponseError::UnknownTopicOrPartition))),
        }
    }
    if by_shard.is_empty() {
        return out;
    }
    let op = OffsetsOp::Commit { offsets: by_shard };
    let answers = on_topic(kafka, scope, group, topic, op).await;
    out.extend(
        outcomes(answers, "commit", group)
            .into_iter()
            .map(|(p, r)| (p, r.err())),
    );
    out
}

/// `group`'s committed offsets on partitions of `topic`. A partition whose journal holds
/// none but whose offset from before the journals is still in the old local log has it
/// moved into the journal first (`upgrade.rs`).
pub(super) async fn fetch(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    topic: &str,
    partitions: &[i32],
    only_existing: bool,
) -> Vec<Outcome> {
    let (shards, mut out) = shard_numbers(partitions);
    if shards.is_empty() {
        return out;
    }
    let op = OffsetsOp::Fetch {
        shards,
        only_existing,
    };
    let answers = on_topic(kafka, scope, group, topic, op).await;
    let mut old = BTreeMap::new();
    for (p, r) in outcomes(answers, "fetch", group) {
        if matches!(r, Ok(None))
            && let Some(o) = kafka
                .groups
                .offsets
                .get(&OffsetKey {
                    tenant: scope.tenant.clone(),
                    namespace: scope.namespace.clone(),
                    group: group.to_owned(),
                    topic: topic.to_owned(),
                    partition: p,
                })
                .await
        {
            old.insert(p, o);
            continue;
        }
        out.push((p, r));
    }
    if !old.is_empty() {
        let mut now = super::upgrade::move_partitions(kafka, scope, group, topic, &old).await;
        // A partition left out was deleted meanwhile: it has no offset.
        out.extend(old.keys().map(|p| (*p, Ok(now.remove(p)))));
    }
    out
}

/// Every committed offset of `group` in the namespace, on the topics `visible` allows:
/// topic → partition → offset. Refused if a partition's home cannot answer now.
pub(super) async fn fetch_all(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    visible: impl Fn(&str) -> bool,
) -> Result<BTreeMap<String, BTreeMap<i32, KafkaOffset>>, ResponseError> {
    let mut out: BTreeMap<String, BTreeMap<i32, KafkaOffset>> = BTreeMap::new();
    for (topic, shards) in durable_topics(kafka, scope) {
        if !visible(&topic) {
            continue;
        }
        let partitions: Vec<i32> = (0..shards).filter_map(|s| i32::try_from(s).ok()).collect();
        for (p, r) in fetch(kafka, scope, group, &topic, &partitions, true).await {
            if let Some(offset) = r? {
                out.entry(topic.clone()).or_default().insert(p, offset);
            }
        }
    }
    // Offsets of the local log on topics no longer there are still the group's.
    for (key, offset) in kafka
        .groups
        .offsets
        .of_group(&scope.tenant, &scope.namespace, group)
        .await
    {
        if visible(&key.topic) {
            out.entry(key.topic)
                .or_default()
                .entry(key.partition)
                .or_insert(offset);
        }
    }
    Ok(out)
}

/// Deletes every committed offset of `group` in the namespace: how many there were. Runs
/// under the group's lock, so no move of an old offset (`upgrade.rs`) interleaves.
pub(super) async fn delete(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
) -> Result<usize, ResponseError> {
    let journals = || async {
        let mut deleted = 0;
        for (topic, shards) in durable_topics(kafka, scope) {
            let op = OffsetsOp::Delete {
                shards: (0..shards).collect(),
            };
            for (_, r) in outcomes(
                on_topic(kafka, scope, group, &topic, op).await,
                "delete",
                group,
            ) {
                deleted += usize::from(r?.is_some());
            }
        }
        Ok(deleted)
    };
    super::upgrade::delete_serialised(
        &kafka.groups.serial,
        &kafka.groups.offsets,
        (&scope.tenant, &scope.namespace, group),
        journals,
    )
    .await
}

/// The groups of a namespace known by committed offsets: in the local log, or in a journal
/// this broker leads.
pub(super) async fn known_groups(kafka: &Kafka, scope: &Scope) -> BTreeSet<String> {
    let mut groups = kafka
        .groups
        .offsets
        .groups(&scope.tenant, &scope.namespace)
        .await;
    for (key, table) in kafka.broker.kafka_offsets_led().await {
        if key.tenant == scope.tenant && key.namespace == scope.namespace {
            groups.extend(table.into_keys());
        }
    }
    groups
}
