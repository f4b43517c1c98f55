//! Committed offsets through the group coordinator: OffsetCommit and OffsetFetch.
//!
//! Decides who may commit. The invariant: an offset is committed only by a current member of
//! the current generation, and not between join and sync (or, for a group without members,
//! by anyone, as Kafka allows for manual assignment); every partition of one OffsetCommit
//! is committed in one durable write, so a request is answered only once its offsets would
//! survive a restart (`kafka/offsets.rs` keeps them). Committing or reading a group's
//! offsets needs `group.consume` on the group and `stream.subscribe` on each topic (as Kafka
//! asks READ on both), checked before anything is written or read.

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, TopicName,
};
use tokio::time::Instant;
use tracing::warn;

use super::coordinator::{GroupCoordinator, GroupState, sb};
use crate::kafka::Kafka;
use crate::kafka::offsets::{Committed, OffsetKey};
use crate::kafka::scope::{On, Scope};
use felix_meta::auth::Action;

/// Longest offset metadata kept (Kafka's `offset.metadata.max.bytes`).
const MAX_METADATA_BYTES: usize = 4096;

/// Why a member may not commit, or `None` if it may.
fn commit_refusal(
    coordinator: &GroupCoordinator,
    group_id: &str,
    member_id: &str,
    generation: i32,
) -> Option<ResponseError> {
    let mut groups = coordinator.groups.lock();
    let Some(group) = groups.get_mut(group_id) else {
        // No live group: a manual-assignment consumer (or an admin) commits.
        return (!member_id.is_empty() && generation >= 0)
            .then_some(ResponseError::UnknownMemberId);
    };
    if generation < 0 && member_id.is_empty() {
        return (!group.members.is_empty()).then_some(ResponseError::IllegalGeneration);
    }
    let state = group.state;
    let current = group.generation;
    let Some(member) = group.member(member_id) else {
        return Some(ResponseError::UnknownMemberId);
    };
    member.last_seen = Instant::now();
    if generation != current {
        return Some(ResponseError::IllegalGeneration);
    }
    // A member may commit while the group prepares a rebalance (its revoke callback does)
    // but not between join and sync.
    (state == GroupState::CompletingRebalance).then_some(ResponseError::RebalanceInProgress)
}

/// A partition of an OffsetCommit and why it was refused, if it was.
type PartitionAnswer = (i32, Option<ResponseError>);

/// OffsetCommit: every partition of the request is committed in one durable write.
pub async fn offset_commit(
    kafka: &Kafka,
    scope: &Scope,
    request: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let s = scope;
    let group_id = request.group_id.to_string();
    let refusal = if group_id.is_empty() {
        Some(ResponseError::InvalidGroupId)
    } else if let Err(error) = scope.allow(kafka, Action::GroupConsume, &group_id, On::Group) {
        Some(error)
    } else {
        commit_refusal(
            &kafka.groups,
            &scope.group_key(&group_id),
            &request.member_id,
            request.generation_id_or_member_epoch,
        )
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut entries = Vec::new();
    let mut answers: Vec<(TopicName, Vec<PartitionAnswer>)> = Vec::new();
    for topic in &request.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        let topic_refusal = refusal.or_else(|| {
            scope
                .allow(kafka, Action::StreamSubscribe, &topic.name, On::Topic)
                .err()
        });
        for p in &topic.partitions {
            let error = topic_refusal.or_else(|| {
                let too_long = p
                    .committed_metadata
                    .as_ref()
                    .is_some_and(|m| m.len() > MAX_METADATA_BYTES);
                too_long.then_some(ResponseError::OffsetMetadataTooLarge)
            });
            if error.is_none() {
                entries.push((
                    OffsetKey {
                        tenant: s.tenant.clone(),
                        namespace: s.namespace.clone(),
                        group: group_id.clone(),
                        topic: topic.name.to_string(),
                        partition: p.partition_index,
                    },
                    Committed {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                        commit_ms: now,
                    },
                ));
            }
            partitions.push((p.partition_index, error));
        }
        answers.push((topic.name.clone(), partitions));
    }
    let written = kafka.groups.offsets.commit(entries).await;
    if let Err(e) = &written {
        warn!(group = group_id, error = %e, "could not commit Kafka offsets");
    }
    let topics = answers
        .into_iter()
        .map(|(name, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|(index, error)| {
                    let error = error.or_else(|| {
                        written
                            .is_err()
                            .then_some(ResponseError::CoordinatorNotAvailable)
                    });
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(index)
                        .with_error_code(error.map_or(0, |e| e.code()))
                })
                .collect();
            OffsetCommitResponseTopic::default()
                .with_name(name)
                .with_partitions(partitions)
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}

/// OffsetFetch (v1-7): a group's committed offsets, for the named partitions or all.
pub async fn offset_fetch(
    kafka: &Kafka,
    scope: &Scope,
    request: OffsetFetchRequest,
) -> OffsetFetchResponse {
    let s = scope;
    let group = request.group_id.to_string();
    if let Err(error) = scope.allow(kafka, Action::GroupConsume, &group, On::Group) {
        return OffsetFetchResponse::default().with_error_code(error.code());
    }
    let offsets = &kafka.groups.offsets;
    let entry = |partition: i32, committed: Option<Committed>| match committed {
        Some(c) => OffsetFetchResponsePartition::default()
            .with_partition_index(partition)
            .with_committed_offset(c.offset)
            .with_committed_leader_epoch(c.leader_epoch)
            .with_metadata(Some(sb(c.metadata.as_deref().unwrap_or("")))),
        None => OffsetFetchResponsePartition::default()
            .with_partition_index(partition)
            .with_committed_offset(-1)
            .with_committed_leader_epoch(-1)
            .with_metadata(Some(sb(""))),
    };
    let topics = match request.topics {
        Some(topics) => {
            let mut out = Vec::with_capacity(topics.len());
            for t in topics {
                let mut partitions = Vec::with_capacity(t.partition_indexes.len());
                let allowed = scope.allow(kafka, Action::StreamSubscribe, &t.name, On::Topic);
                for p in t.partition_indexes {
                    if let Err(error) = allowed {
                        partitions.push(entry(p, None).with_error_code(error.code()));
                        continue;
                    }
                    let key = OffsetKey {
                        tenant: s.tenant.clone(),
                        namespace: s.namespace.clone(),
                        group: group.clone(),
                        topic: t.name.to_string(),
                        partition: p,
                    };
                    partitions.push(entry(p, offsets.get(&key).await));
                }
                out.push(
                    OffsetFetchResponseTopic::default()
                        .with_name(t.name)
                        .with_partitions(partitions),
                );
            }
            out
        }
        None => {
            let mut by_topic: BTreeMap<String, Vec<OffsetFetchResponsePartition>> = BTreeMap::new();
            for (key, committed) in offsets.of_group(&s.tenant, &s.namespace, &group).await {
                if !scope.can_view(kafka, &key.topic) {
                    continue;
                }
                by_topic
                    .entry(key.topic.clone())
                    .or_default()
                    .push(entry(key.partition, Some(committed)));
            }
            by_topic
                .into_iter()
                .map(|(name, partitions)| {
                    OffsetFetchResponseTopic::default()
                        .with_name(TopicName(sb(&name)))
                        .with_partitions(partitions)
                })
                .collect()
        }
    };
    OffsetFetchResponse::default().with_topics(topics)
}
