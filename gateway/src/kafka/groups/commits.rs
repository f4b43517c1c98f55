//! Committed offsets through the group coordinator: OffsetCommit and OffsetFetch.
//!
//! Decides who may commit. The invariant: an offset is committed only by a current member of
//! the current generation, and not between join and sync (or, for a group without members,
//! by anyone, as Kafka allows for manual assignment); each partition's offset is committed
//! in its shard's group journal (`offset_home.rs` routes it to the shard's leader), and the
//! request is answered only once every partition's offset is as durable as the stream's
//! records (on a Quorum stream: held by a majority of its replicas), or that partition is
//! answered with an error. Committing or reading a group's
//! offsets needs `group.consume` on the group and `stream.subscribe` on each topic (as Kafka
//! asks READ on both), checked before anything is written or read.

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

use super::coordinator::{GroupCoordinator, GroupState, sb};
use super::find::coordinates;
use super::offset_home;
use crate::kafka::Kafka;
use crate::kafka::offsets::Committed;
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

/// OffsetCommit: each partition's offset in its shard's group journal, all at once.
pub async fn offset_commit(
    kafka: &Kafka,
    scope: &Scope,
    request: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let group_id = request.group_id.to_string();
    let refusal = if group_id.is_empty() {
        Some(ResponseError::InvalidGroupId)
    } else if let Err(error) = scope.allow(kafka, Action::GroupConsume, &group_id, On::Group) {
        Some(error)
    } else if !coordinates(kafka, &group_id) {
        Some(ResponseError::NotCoordinator)
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
    // Each topic's partitions go to their shards' leaders together, every topic at once.
    let topics = request.topics.iter().map(|topic| {
        let group_id = group_id.as_str();
        async move {
            let topic_refusal = refusal.or_else(|| {
                scope
                    .allow(kafka, Action::StreamSubscribe, &topic.name, On::Topic)
                    .err()
            });
            let mut answers: Vec<PartitionAnswer> = Vec::with_capacity(topic.partitions.len());
            let mut offsets = Vec::new();
            for p in &topic.partitions {
                let too_long = p
                    .committed_metadata
                    .as_ref()
                    .is_some_and(|m| m.len() > MAX_METADATA_BYTES);
                let error = topic_refusal
                    .or_else(|| too_long.then_some(ResponseError::OffsetMetadataTooLarge));
                match error {
                    Some(e) => answers.push((p.partition_index, Some(e))),
                    None => offsets.push((
                        p.partition_index,
                        Committed {
                            offset: p.committed_offset,
                            leader_epoch: p.committed_leader_epoch,
                            metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                            commit_ms: now,
                        },
                    )),
                }
            }
            if !offsets.is_empty() {
                answers.extend(
                    offset_home::commit(kafka, scope, group_id, &topic.name, offsets).await,
                );
            }
            // In the request's order, as Kafka answers.
            let order: Vec<i32> = topic.partitions.iter().map(|p| p.partition_index).collect();
            answers.sort_by_key(|(p, _)| order.iter().position(|q| q == p));
            (topic.name.clone(), answers)
        }
    });
    let answers = futures::future::join_all(topics).await;
    let topics = answers
        .into_iter()
        .map(|(name, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|(index, error)| {
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

/// OffsetFetch (v1-7): a group's committed offsets, for the named partitions or all. While
/// a partition's home cannot answer (its leader is changing), the whole answer is
/// `COORDINATOR_LOAD_IN_PROGRESS`, which Kafka clients retry, rather than an offset they
/// would take for "none committed".
pub async fn offset_fetch(
    kafka: &Kafka,
    scope: &Scope,
    request: OffsetFetchRequest,
) -> OffsetFetchResponse {
    let group = request.group_id.to_string();
    if let Err(error) = scope.allow(kafka, Action::GroupConsume, &group, On::Group) {
        return OffsetFetchResponse::default().with_error_code(error.code());
    }
    if !coordinates(kafka, &group) {
        return OffsetFetchResponse::default()
            .with_error_code(ResponseError::NotCoordinator.code());
    }
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
    let loading = |topics: Vec<OffsetFetchResponseTopic>| {
        OffsetFetchResponse::default()
            .with_error_code(ResponseError::CoordinatorLoadInProgress.code())
            .with_topics(topics)
    };
    let topics = match request.topics {
        Some(topics) => {
            let group = group.as_str();
            let fetches = topics.into_iter().map(|t| async move {
                let allowed = scope.allow(kafka, Action::StreamSubscribe, &t.name, On::Topic);
                let mut unavailable = false;
                let partitions = match allowed {
                    Err(error) => t
                        .partition_indexes
                        .iter()
                        .map(|p| entry(*p, None).with_error_code(error.code()))
                        .collect(),
                    Ok(()) => {
                        let answers = offset_home::fetch(
                            kafka,
                            scope,
                            group,
                            &t.name,
                            &t.partition_indexes,
                            false,
                        )
                        .await;
                        t.partition_indexes
                            .iter()
                            .map(|p| match answers.iter().find(|(q, _)| q == p) {
                                Some((_, Ok(c))) => entry(*p, c.clone()),
                                // As Kafka answers a partition it does not know: nothing
                                // committed.
                                Some((_, Err(ResponseError::UnknownTopicOrPartition))) => {
                                    entry(*p, None)
                                }
                                Some((_, Err(e))) => {
                                    unavailable = true;
                                    entry(*p, None).with_error_code(e.code())
                                }
                                None => entry(*p, None),
                            })
                            .collect()
                    }
                };
                let topic = OffsetFetchResponseTopic::default()
                    .with_name(t.name)
                    .with_partitions(partitions);
                (topic, unavailable)
            });
            let answered = futures::future::join_all(fetches).await;
            let unavailable = answered.iter().any(|(_, u)| *u);
            let topics: Vec<OffsetFetchResponseTopic> =
                answered.into_iter().map(|(t, _)| t).collect();
            if unavailable {
                return loading(topics);
            }
            topics
        }
        None => {
            let visible = |topic: &str| scope.can_view(kafka, topic);
            match offset_home::fetch_all(kafka, scope, &group, visible).await {
                Ok(all) => all
                    .into_iter()
                    .map(|(name, partitions)| {
                        OffsetFetchResponseTopic::default()
                            .with_name(TopicName(sb(&name)))
                            .with_partitions(
                                partitions
                                    .into_iter()
                                    .map(|(p, c)| entry(p, Some(c)))
                                    .collect(),
                            )
                    })
                    .collect(),
                Err(_) => return loading(Vec::new()),
            }
        }
    };
    OffsetFetchResponse::default().with_topics(topics)
}
