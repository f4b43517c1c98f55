//! DescribeShareGroupOffsets: where a share group stands on each partition.
//!
//! Decides what Kafka's share-partition start offset is on Felix: the position of the
//! Felix group on the shard, everything below it retired (accepted, dead-lettered, or
//! skipped as the start position or retention said); -1 where the group does not exist or
//! has not started on the partition. It is read at each partition's leader, where the
//! group's progress is kept, over the route committed offsets take
//! (`kafka/groups/offset_home.rs`). With no topics named, every topic the Felix group of
//! that name is on is described. Nothing here changes a group.
//! (Changing them is `reset.rs`'s.) As on Kafka it is the group's coordinator's to answer
//! (admin clients send it there): another broker answers `NOT_COORDINATOR`.

use felix_wire::protocol::codes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_share_group_offsets_response::{
    DescribeShareGroupOffsetsResponseGroup as GroupAnswer,
    DescribeShareGroupOffsetsResponsePartition as PartitionAnswer,
    DescribeShareGroupOffsetsResponseTopic as TopicAnswer,
};
use kafka_protocol::messages::{
    DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsResponse, TopicName,
};

use super::sb;
use crate::groups::kafka_offsets::OffsetsOp;
use crate::kafka::Kafka;
use crate::kafka::groups::{coordinates, not_coordinator};
use crate::kafka::scope::{On, Scope};
use crate::kafka::topics::{durable_topics, topic_id};

/// DescribeShareGroupOffsets.
pub async fn describe_share_group_offsets(
    kafka: &Kafka,
    scope: &Scope,
    request: DescribeShareGroupOffsetsRequest,
) -> DescribeShareGroupOffsetsResponse {
    let mut groups = Vec::with_capacity(request.groups.len());
    for g in request.groups {
        let base = GroupAnswer::default().with_group_id(g.group_id.clone());
        if let Err(e) = scope.allow_view(kafka, &g.group_id, On::Group) {
            groups.push(base.with_error_code(e.code()));
            continue;
        }
        if !coordinates(kafka, &g.group_id) {
            let (e, m) = not_coordinator(&g.group_id);
            groups.push(
                base.with_error_code(e.code())
                    .with_error_message(Some(sb(&m))),
            );
            continue;
        }
        let shapes = durable_topics(kafka, scope);
        let asked: Vec<(String, Option<Vec<i32>>)> = match g.topics {
            Some(topics) => topics
                .into_iter()
                .map(|t| (t.topic_name.to_string(), Some(t.partitions)))
                .collect(),
            None => shapes
                .iter()
                .filter(|(name, _)| {
                    kafka
                        .broker
                        .group(&scope.tenant, &scope.namespace, name, &g.group_id)
                        .is_ok()
                })
                .map(|(name, _)| (name.clone(), None))
                .collect(),
        };
        let mut topics = Vec::with_capacity(asked.len());
        for (name, partitions) in asked {
            let count = shapes.iter().find(|(n, _)| *n == name).map(|(_, c)| *c);
            topics.push(describe_topic(kafka, scope, &g.group_id, &name, count, partitions).await);
        }
        groups.push(base.with_topics(topics));
    }
    DescribeShareGroupOffsetsResponse::default().with_groups(groups)
}

/// One topic's partitions: `count` is the topic's partition count (`None`: no such topic),
/// `partitions` those asked for (`None`: all).
async fn describe_topic(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    name: &str,
    count: Option<u32>,
    partitions: Option<Vec<i32>>,
) -> TopicAnswer {
    let id = topic_id(&scope.tenant, &scope.namespace, name);
    let base = TopicAnswer::default()
        .with_topic_name(TopicName(sb(name)))
        .with_topic_id(id);
    let partitions =
        partitions.unwrap_or_else(|| (0..count.unwrap_or(0)).map(|p| p as i32).collect());
    let refused = |e: ResponseError, m: &str| {
        partitions
            .iter()
            .map(|p| {
                PartitionAnswer::default()
                    .with_partition_index(*p)
                    .with_start_offset(-1)
                    .with_leader_epoch(-1)
                    .with_error_code(e.code())
                    .with_error_message(Some(sb(m)))
            })
            .collect::<Vec<_>>()
    };
    let Some(count) = count else {
        let m = format!("no topic {name}");
        return base.with_partitions(refused(ResponseError::UnknownTopicOrPartition, &m));
    };
    if let Err(e) = scope.allow_view(kafka, name, On::Topic) {
        let m = format!("not allowed to see topic {name}");
        return base.with_partitions(refused(e, &m));
    }
    let shards: Vec<u32> = partitions
        .iter()
        .filter_map(|p| u32::try_from(*p).ok().filter(|p| *p < count))
        .collect();
    let op = OffsetsOp::ShareStart {
        shards: shards.clone(),
    };
    let answers = crate::kafka::groups::on_topic(kafka, scope, group, name, op).await;
    let mut out = Vec::with_capacity(partitions.len());
    for p in partitions {
        let answer = PartitionAnswer::default()
            .with_partition_index(p)
            .with_start_offset(-1)
            .with_leader_epoch(-1);
        let outcome = u32::try_from(p)
            .ok()
            .and_then(|s| answers.iter().find(|(shard, _)| *shard == s));
        out.push(match outcome {
            None => answer
                .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                .with_error_message(Some(sb(&format!("topic {name} has no partition {p}")))),
            Some((_, Ok(start))) => {
                answer.with_start_offset(start.as_ref().map_or(-1, |o| o.offset))
            }
            Some((_, Err(e))) => {
                let code = match e.code {
                    codes::UNKNOWN_STREAM | codes::UNKNOWN_SHARD => {
                        ResponseError::UnknownTopicOrPartition
                    }
                    // No leader now, or one not reachable: Kafka admin clients retry.
                    _ => ResponseError::CoordinatorNotAvailable,
                };
                answer
                    .with_error_code(code.code())
                    .with_error_message(Some(sb(&e.message)))
            }
        });
    }
    base.with_partitions(out)
}
