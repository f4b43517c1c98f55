//! AlterShareGroupOffsets and DeleteShareGroupOffsets: an admin moving or forgetting a
//! share group's start offsets.
//!
//! Decides when a share group's positions may be changed and what the change is on Felix.
//! As on Kafka, only a group without members (none its coordinator knows) is changed:
//! otherwise `NON_EMPTY_GROUP`; a group Felix does not know (no member here, and no Felix
//! group of that name on any topic of the namespace) is `GROUP_ID_NOT_FOUND`; both change
//! nothing. Altering sets the Felix group's position on each partition named (everything
//! below retired, everything from it handed out again as first deliveries; the group is
//! created on the topic's stream with the share-group defaults if it is not there yet,
//! as a joining member would); an offset below zero is `INVALID_REQUEST` and one past the
//! partition's end `OFFSET_OUT_OF_RANGE`, each refusing only its partition. Deleting
//! forgets the group's progress on every partition of each topic named, so its next fetch
//! starts where the group's start setting (`share.auto.offset.reset`) says; a topic the
//! group never started on is `UNKNOWN_TOPIC_OR_PARTITION` ("no offset information"). The
//! group's settings stay (they are the Felix group's, and Kafka keeps a group's configs).
//! The shard leaders do the work (`groups/share_positions.rs`), reached over the route of
//! committed offsets.
//!
//! Permissions: `group.consume` on the group (Kafka's READ on the group) and on each topic
//! (Kafka's READ on the topic), as a member needs.
//!
//! The emptiness check and the change are one step with respect to membership, as on
//! Kafka: a joining member waits until the change is made (and a change waits for joins
//! under way, then finds the group not empty), through the group's gate in
//! `membership.rs`. Both are the coordinator's: another broker answers `NOT_COORDINATOR`.

use felix_meta::auth::Action;
use felix_wire::protocol::{ErrorBody, codes};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_share_group_offsets_response::{
    AlterShareGroupOffsetsResponsePartition as AlterPartition,
    AlterShareGroupOffsetsResponseTopic as AlterTopic,
};
use kafka_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic as DeleteTopic;
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse, TopicName,
};

use super::membership::{JoinsHeld, ensure_group};
use super::sb;
use crate::groups::kafka_offsets::OffsetsOp;
use crate::kafka::Kafka;
use crate::kafka::errors::kafka_error;
use crate::kafka::groups::{coordinates, not_coordinator};
use crate::kafka::scope::{On, Scope};
use crate::kafka::topics::{durable_topics, topic_id};

/// Why a request, a topic or a partition is refused: its code and message.
type Refusal = (ResponseError, String);

/// A partition of an AlterShareGroupOffsets: its shard and new start offset, or why not.
type Checked = Result<(u32, u64), Refusal>;

/// The checks before a share group's positions change: a group id, the grant, this
/// broker coordinating the group, no members, and a group Felix knows. The guard returned
/// keeps members from joining until the change is made.
async fn may_change(kafka: &Kafka, scope: &Scope, group: &str) -> Result<JoinsHeld, Refusal> {
    if group.is_empty() {
        return Err((ResponseError::InvalidGroupId, "empty group id".into()));
    }
    scope
        .allow(kafka, Action::GroupConsume, group, On::Group)
        .map_err(|e| (e, format!("not allowed to change share group {group}")))?;
    if !coordinates(kafka, group) {
        return Err(not_coordinator(group));
    }
    let Some((held, members)) = kafka
        .share_members
        .hold_joins(&scope.group_key(group))
        .await
    else {
        return Err((
            ResponseError::CoordinatorLoadInProgress,
            format!("members are joining share group {group}: try again"),
        ));
    };
    if members > 0 {
        return Err((
            ResponseError::NonEmptyGroup,
            format!(
                "share group {group} has {members} member(s): its offsets change only when \
                 it has none"
            ),
        ));
    }
    let known = durable_topics(kafka, scope).iter().any(|(name, _)| {
        kafka
            .broker
            .group(&scope.tenant, &scope.namespace, name, group)
            .is_ok()
    });
    if !known {
        return Err((
            ResponseError::GroupIdNotFound,
            format!("no share group {group}: no topic of the namespace has a group of that name"),
        ));
    }
    Ok(held)
}

/// The Kafka code for a shard leader's refusal: the client's to fix where it is about the
/// offset, the topic or the group, otherwise retriable (no leader now, none reachable).
fn leader_refusal(e: &ErrorBody) -> ResponseError {
    match e.code {
        codes::OFFSET_OUT_OF_RANGE
        | codes::UNKNOWN_STREAM
        | codes::UNKNOWN_SHARD
        | codes::UNKNOWN_GROUP => kafka_error(e),
        _ => ResponseError::CoordinatorNotAvailable,
    }
}

/// AlterShareGroupOffsets.
pub async fn alter_share_group_offsets(
    kafka: &Kafka,
    scope: &Scope,
    request: AlterShareGroupOffsetsRequest,
) -> AlterShareGroupOffsetsResponse {
    let group = request.group_id.to_string();
    // Held until the change is made: no member joins between the check and the change.
    let _joins_held = match may_change(kafka, scope, &group).await {
        Ok(held) => held,
        Err((error, message)) => {
            return AlterShareGroupOffsetsResponse::default()
                .with_error_code(error.code())
                .with_error_message(Some(sb(&message)));
        }
    };
    let topics = durable_topics(kafka, scope);
    let mut responses = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let name = t.topic_name.to_string();
        let asked: Vec<(i32, i64)> = t
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.start_offset))
            .collect();
        let count = topics.iter().find(|(n, _)| *n == name).map(|(_, c)| *c);
        responses.push(alter_topic(kafka, scope, &group, &name, count, asked).await);
    }
    AlterShareGroupOffsetsResponse::default().with_responses(responses)
}

/// One topic of an AlterShareGroupOffsets: `count` is its partition count (`None`: no such
/// topic), `asked` each partition and its new start offset.
async fn alter_topic(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    name: &str,
    count: Option<u32>,
    asked: Vec<(i32, i64)>,
) -> AlterTopic {
    let answer = |p: i32, refused: Option<(ResponseError, String)>| {
        let a = AlterPartition::default().with_partition_index(p);
        match refused {
            None => a,
            Some((e, m)) => a.with_error_code(e.code()).with_error_message(Some(sb(&m))),
        }
    };
    let base = AlterTopic::default().with_topic_name(TopicName(sb(name)));
    let all_refused = |e: ResponseError, m: &str| {
        asked
            .iter()
            .map(|(p, _)| answer(*p, Some((e, m.to_owned()))))
            .collect::<Vec<_>>()
    };
    let Some(count) = count else {
        let m = format!("no topic {name}");
        return base.with_partitions(all_refused(ResponseError::UnknownTopicOrPartition, &m));
    };
    let base = base.with_topic_id(topic_id(&scope.tenant, &scope.namespace, name));
    if let Err(e) = scope.allow(kafka, Action::GroupConsume, name, On::Topic) {
        let m = format!("not allowed to consume topic {name} as a group");
        return base.with_partitions(all_refused(e, &m));
    }
    // Each partition's refusal, or the shard and offset to move to.
    let checked: Vec<(i32, Checked)> = asked
        .iter()
        .map(|&(p, offset)| {
            let shard = u32::try_from(p).ok().filter(|s| *s < count).ok_or((
                ResponseError::UnknownTopicOrPartition,
                format!("topic {name} has no partition {p}"),
            ));
            let to = u64::try_from(offset).map_err(|_| {
                (
                    ResponseError::InvalidRequest,
                    format!("start offset {offset}: a start offset is 0 or more"),
                )
            });
            (p, shard.and_then(|s| Ok((s, to?))))
        })
        .collect();
    let seeks: Vec<(u32, u64)> = checked
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok().copied())
        .collect();
    let mut outcomes = Vec::new();
    if !seeks.is_empty() {
        // Only a request with something to apply creates the group on the topic.
        if let Err((e, m)) = ensure_group(kafka, scope, name, group).await {
            return base.with_partitions(all_refused(e, &m));
        }
        let op = OffsetsOp::ShareSeek { offsets: seeks };
        outcomes = crate::kafka::groups::on_topic(kafka, scope, group, name, op).await;
    }
    let partitions = checked
        .into_iter()
        .map(|(p, r)| match r {
            Err(refused) => answer(p, Some(refused)),
            Ok((shard, _)) => match outcomes.iter().find(|(s, _)| *s == shard) {
                Some((_, Ok(_))) => answer(p, None),
                Some((_, Err(e))) => answer(p, Some((leader_refusal(e), e.message.clone()))),
                None => answer(
                    p,
                    Some((
                        ResponseError::CoordinatorNotAvailable,
                        format!("partition {p} of {name} did not answer"),
                    )),
                ),
            },
        })
        .collect();
    base.with_partitions(partitions)
}

/// DeleteShareGroupOffsets.
pub async fn delete_share_group_offsets(
    kafka: &Kafka,
    scope: &Scope,
    request: DeleteShareGroupOffsetsRequest,
) -> DeleteShareGroupOffsetsResponse {
    let group = request.group_id.to_string();
    // Held until the change is made: no member joins between the check and the change.
    let _joins_held = match may_change(kafka, scope, &group).await {
        Ok(held) => held,
        Err((error, message)) => {
            return DeleteShareGroupOffsetsResponse::default()
                .with_error_code(error.code())
                .with_error_message(Some(sb(&message)));
        }
    };
    let topics = durable_topics(kafka, scope);
    let mut responses = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let name = t.topic_name.to_string();
        let count = topics.iter().find(|(n, _)| *n == name).map(|(_, c)| *c);
        let base = DeleteTopic::default().with_topic_name(TopicName(sb(&name)));
        let outcome = delete_topic(kafka, scope, &group, &name, count).await;
        responses.push(match outcome {
            Ok(()) => base.with_topic_id(topic_id(&scope.tenant, &scope.namespace, &name)),
            Err((e, m)) => base
                .with_error_code(e.code())
                .with_error_message(Some(sb(&m))),
        });
    }
    DeleteShareGroupOffsetsResponse::default().with_responses(responses)
}

/// Forgets the group's progress on every partition of one topic.
async fn delete_topic(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    name: &str,
    count: Option<u32>,
) -> Result<(), Refusal> {
    let Some(count) = count else {
        return Err((
            ResponseError::UnknownTopicOrPartition,
            format!("no topic {name}"),
        ));
    };
    scope
        .allow(kafka, Action::GroupConsume, name, On::Topic)
        .map_err(|e| (e, format!("not allowed to consume topic {name} as a group")))?;
    let nothing = || {
        (
            ResponseError::UnknownTopicOrPartition,
            format!("share group {group} has no offset information on topic {name} to delete"),
        )
    };
    if kafka
        .broker
        .group(&scope.tenant, &scope.namespace, name, group)
        .is_err()
    {
        return Err(nothing());
    }
    let op = OffsetsOp::ShareForget {
        shards: (0..count).collect(),
    };
    let outcomes = crate::kafka::groups::on_topic(kafka, scope, group, name, op).await;
    let mut had = false;
    for (shard, outcome) in outcomes {
        match outcome {
            Ok(before) => had |= before.is_some(),
            Err(e) => {
                return Err((
                    leader_refusal(&e),
                    format!("partition {shard} of {name}: {}", e.message),
                ));
            }
        }
    }
    if !had {
        return Err(nothing());
    }
    Ok(())
}
