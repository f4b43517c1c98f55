//! Where a classic group's committed offsets are read and written: in the group journal of
//! each partition's shard, on the shard's leader (`crate::groups::kafka_offsets`).
//!
//! Decides the route of an offset operation: a partition this broker leads is served here;
//! one led by another broker is forwarded to that leader over the signed internal route,
//! all of one topic's partitions it leads in one call, and is never forwarded again (a
//! leader that lost the shard meanwhile refuses, and the client retries). The coordinator
//! checked the client's grants before anything is routed.
//!
//! Offsets committed before offsets moved into the journals are in the coordinator's local
//! log (`<data_dir>/kafka/group-offsets`, [`crate::kafka::offsets`]), kept read-only: a
//! partition whose journal holds no offset for the group is answered from it, and the first
//! commit in the journal supersedes it. DeleteGroups deletes from both.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use felix_wire::protocol::{ErrorBody, codes};
use kafka_protocol::error::ResponseError;
use tracing::{debug, warn};

use crate::groups::kafka_offsets::{KafkaOffset, OffsetsCall, OffsetsOp, PATH, ShardOutcome};
use crate::kafka::Kafka;
use crate::kafka::offsets::OffsetKey;
use crate::kafka::scope::Scope;

/// An operation's outcome on one partition.
type Outcome = (i32, Result<Option<KafkaOffset>, ResponseError>);

/// The Kafka error for a refusal from a partition's home: a topic or partition that does
/// not exist (an ephemeral stream is no topic either) is the client's to fix; anything else
/// (no leader now, a quorum not reached, a leader unreachable) is retried by Kafka clients
/// after looking the coordinator up.
fn kafka_error(e: &ErrorBody) -> ResponseError {
    match e.code {
        codes::UNKNOWN_STREAM | codes::UNKNOWN_SHARD | codes::UNKNOWN_NAMESPACE => {
            ResponseError::UnknownTopicOrPartition
        }
        _ if e.reason == "ephemeral_stream" => ResponseError::UnknownTopicOrPartition,
        _ => ResponseError::CoordinatorNotAvailable,
    }
}

fn shards_of(op: &OffsetsOp) -> Vec<u32> {
    match op {
        OffsetsOp::Commit { offsets } => offsets.iter().map(|(s, _)| *s).collect(),
        OffsetsOp::Fetch { shards, .. }
        | OffsetsOp::Delete { shards }
        | OffsetsOp::Follow { shards } => shards.clone(),
    }
}

/// The part of `op` about `shards`.
fn only(op: &OffsetsOp, shards: &[u32]) -> OffsetsOp {
    match op {
        OffsetsOp::Commit { offsets } => OffsetsOp::Commit {
            offsets: offsets
                .iter()
                .filter(|(s, _)| shards.contains(s))
                .cloned()
                .collect(),
        },
        OffsetsOp::Fetch { only_existing, .. } => OffsetsOp::Fetch {
            shards: shards.to_vec(),
            only_existing: *only_existing,
        },
        OffsetsOp::Delete { .. } => OffsetsOp::Delete {
            shards: shards.to_vec(),
        },
        OffsetsOp::Follow { .. } => OffsetsOp::Follow {
            shards: shards.to_vec(),
        },
    }
}

/// Runs `op` on one topic's partitions for `group`: here where this broker leads, at the
/// leader otherwise. One outcome per partition of `op`.
async fn on_topic(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    topic: &str,
    op: OffsetsOp,
) -> Vec<(u32, ShardOutcome)> {
    let broker = &kafka.broker;
    let call = OffsetsCall {
        tenant: scope.tenant.clone(),
        namespace: scope.namespace.clone(),
        stream: topic.to_owned(),
        group: group.to_owned(),
        op,
    };
    let mut outcomes: BTreeMap<u32, ShardOutcome> = broker
        .kafka_offsets_here(call.clone())
        .await
        .into_iter()
        .collect();
    let mut by_leader: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for (shard, outcome) in &outcomes {
        if let Err(e) = outcome
            && e.code == codes::NOT_LEADER
            && let Some(leader) = e.leader
        {
            by_leader.entry(leader).or_default().push(*shard);
        }
    }
    // Long enough for a Quorum commit at the leader.
    let timeout = Duration::from_millis(broker.node.config.publish_quorum_timeout_ms)
        + Duration::from_secs(5);
    let forwards = by_leader.into_iter().map(|(leader, shards)| {
        let call = OffsetsCall {
            op: only(&call.op, &shards),
            ..call.clone()
        };
        async move {
            let unreachable = |why: String| {
                ErrorBody::new(
                    codes::SHARD_UNAVAILABLE,
                    "leader_unreachable",
                    format!("forwarding Kafka offsets to broker {leader}: {why}"),
                )
                .retry_after(500)
            };
            let Some(addr) = broker.node.internal_addr_of(leader) else {
                let e = unreachable("no address known".into());
                return shards.into_iter().map(|s| (s, Err(e.clone()))).collect();
            };
            let answer = broker
                .node
                .peers
                .call(
                    &addr,
                    PATH,
                    &call,
                    timeout,
                    crate::replication::transport::FetchError::Failed,
                )
                .await;
            match answer.map(|a| serde_json::from_slice::<Vec<(u32, ShardOutcome)>>(&a.body)) {
                Ok(Ok(answers)) => answers,
                Ok(Err(e)) => {
                    let e = unreachable(format!("unreadable answer: {e}"));
                    shards.into_iter().map(|s| (s, Err(e.clone()))).collect()
                }
                Err(e) => {
                    debug!(leader, error = %e, "forwarding Kafka offsets failed");
                    let e = unreachable(e.to_string());
                    shards
                        .into_iter()
                        .map(|s| (s, Err(e.clone())))
                        .collect::<Vec<_>>()
                }
            }
        }
    });
    for answers in futures::future::join_all(forwards).await {
        outcomes.extend(answers);
    }
    shards_of(&call.op)
        .into_iter()
        .map(|s| {
            let outcome = outcomes.remove(&s).unwrap_or_else(|| {
                Err(ErrorBody::new(
                    codes::INTERNAL,
                    "internal",
                    "no answer for a partition",
                ))
            });
            (s, outcome)
        })
        .collect()
}

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

/// `group`'s committed offsets on partitions of `topic` (from the local log of offsets
/// committed before the journals, where a journal has none).
pub(super) async fn fetch(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    topic: &str,
    partitions: &[i32],
    only_existing: bool,
) -> Vec<Outcome> {
    let (shards, mut out) = shard_numbers(partitions);
    if !shards.is_empty() {
        let op = OffsetsOp::Fetch {
            shards,
            only_existing,
        };
        let answers = on_topic(kafka, scope, group, topic, op).await;
        for (p, r) in outcomes(answers, "fetch", group) {
            let r = match r {
                Ok(None) => Ok(legacy(kafka, scope, group, topic, p).await),
                other => other,
            };
            out.push((p, r));
        }
    }
    out
}

async fn legacy(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    topic: &str,
    partition: i32,
) -> Option<KafkaOffset> {
    let key = OffsetKey {
        tenant: scope.tenant.clone(),
        namespace: scope.namespace.clone(),
        group: group.to_owned(),
        topic: topic.to_owned(),
        partition,
    };
    kafka.groups.offsets.get(&key).await
}

/// The durable topics of the scope's namespace and their partition counts.
fn topics(kafka: &Kafka, scope: &Scope) -> Vec<(String, u32)> {
    kafka
        .broker
        .stream_shapes(&scope.tenant, &scope.namespace)
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.durable)
        .map(|s| (s.name, s.shards))
        .collect()
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
    for (topic, shards) in topics(kafka, scope) {
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

/// Deletes every committed offset of `group` in the namespace: how many there were.
pub(super) async fn delete(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
) -> Result<usize, ResponseError> {
    let mut deleted = 0;
    for (topic, shards) in topics(kafka, scope) {
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
    deleted += kafka
        .groups
        .offsets
        .delete_group(&scope.tenant, &scope.namespace, group)
        .await
        .map_err(|e| {
            warn!(group, error = %e, "could not delete a Kafka group's offsets");
            ResponseError::KafkaStorageError
        })?;
    Ok(deleted)
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
