//! AlterShareGroupOffsets and DeleteShareGroupOffsets (raw requests encoded with
//! `kafka-protocol`: no Python admin client has share-group calls), with confluent-kafka's
//! `ShareConsumer` reading where they leave the group. A step of
//! `broker::kafka_share::kafka_share_groups_on_one_broker`, on its broker.
//!
//! Promises held here (docs/kafka.md, "Share groups"; docs/semantics.md): altering an
//! empty share group's start offset moves the Felix group's position there, backwards
//! too, and a share consumer then gets the records from it as first deliveries; deleting
//! a share group's offsets on a topic forgets its position, so the next consumer starts
//! where the group's start setting says; a group with a member is refused with
//! `NON_EMPTY_GROUP`, an unknown group with `GROUP_ID_NOT_FOUND`, a bad partition or
//! offset with Kafka's code for it, and none of them changes anything. On a cluster (a
//! step of `broker::kafka_share::share_consumers_on_a_cluster_fetch_from_each_partition_leader`),
//! the share-group requests only the group's coordinator serves get `NOT_COORDINATOR` on
//! another broker and change nothing.

use felix_client::{Client, Connection, GroupStart};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_share_group_offsets_request::{
    AlterShareGroupOffsetsRequestPartition as AlterPartition,
    AlterShareGroupOffsetsRequestTopic as AlterTopic,
};
use kafka_protocol::messages::delete_share_group_offsets_request::DeleteShareGroupOffsetsRequestTopic as DeleteTopic;
use kafka_protocol::messages::describe_share_group_offsets_request::{
    DescribeShareGroupOffsetsRequestGroup, DescribeShareGroupOffsetsRequestTopic,
};
use kafka_protocol::messages::{
    AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, ApiKey,
    DeleteShareGroupOffsetsRequest, DeleteShareGroupOffsetsResponse,
    DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, ShareGroupDescribeRequest, ShareGroupDescribeResponse,
    ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tokio::net::TcpStream;

use super::common::Broker;
use super::kafka::python_script;
use super::kafka_share::{NS, TENANT, call, share_group, topic};

const TOPIC: &str = "share-alter";
const GROUP: &str = "alter";
const RECORDS: u64 = 10;

fn name(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

/// AlterShareGroupOffsets of `group`: (topic, [(partition, start offset)]).
async fn alter(
    s: &mut TcpStream,
    group: &str,
    topics: &[(&str, &[(i32, i64)])],
) -> AlterShareGroupOffsetsResponse {
    let r = AlterShareGroupOffsetsRequest::default()
        .with_group_id(GroupId(name(group)))
        .with_topics(
            topics
                .iter()
                .map(|(t, ps)| {
                    AlterTopic::default()
                        .with_topic_name(TopicName(name(t)))
                        .with_partitions(
                            ps.iter()
                                .map(|(p, o)| {
                                    AlterPartition::default()
                                        .with_partition_index(*p)
                                        .with_start_offset(*o)
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
    call(s, ApiKey::AlterShareGroupOffsets, 0, &r).await
}

/// Each partition's (topic, partition, error code) of an answer.
fn alter_codes(r: &AlterShareGroupOffsetsResponse) -> Vec<(String, i32, i16)> {
    r.responses
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.topic_name.to_string(), p.partition_index, p.error_code))
        })
        .collect()
}

async fn delete(
    s: &mut TcpStream,
    group: &str,
    topics: &[&str],
) -> DeleteShareGroupOffsetsResponse {
    let r = DeleteShareGroupOffsetsRequest::default()
        .with_group_id(GroupId(name(group)))
        .with_topics(
            topics
                .iter()
                .map(|t| DeleteTopic::default().with_topic_name(TopicName(name(t))))
                .collect(),
        );
    call(s, ApiKey::DeleteShareGroupOffsets, 0, &r).await
}

/// The group's start offset on partition 0 of the topic, as DescribeShareGroupOffsets
/// answers it.
async fn start_offset(s: &mut TcpStream) -> i64 {
    let r = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
        DescribeShareGroupOffsetsRequestGroup::default()
            .with_group_id(GroupId(name(GROUP)))
            .with_topics(Some(vec![
                DescribeShareGroupOffsetsRequestTopic::default()
                    .with_topic_name(TopicName(name(TOPIC)))
                    .with_partitions(vec![0]),
            ])),
    ]);
    let d: DescribeShareGroupOffsetsResponse =
        call(s, ApiKey::DescribeShareGroupOffsets, 0, &r).await;
    let p = &d.groups[0].topics[0].partitions[0];
    assert_eq!(p.error_code, 0, "{d:?}");
    p.start_offset
}

/// A share consumer of the group accepting `count` records: each one's (offset, delivery
/// count), in the order they came.
async fn drain(broker: &Broker, count: u64) -> Vec<(u64, u64)> {
    let out = python_script(
        "kafka_share.py",
        &[
            "drain",
            &broker.kafka_addr.to_string(),
            TOPIC,
            GROUP,
            &count.to_string(),
            "--timeout",
            "30",
        ],
    )
    .await;
    assert_eq!(out["errors"].as_array().map(Vec::len), Some(0), "{out}");
    out["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| {
            (
                r[1].as_u64().expect("offset"),
                r[2].as_u64().expect("delivery count"),
            )
        })
        .collect()
}

/// Offsets `from..RECORDS`, each a first delivery.
fn first_deliveries(from: u64) -> Vec<(u64, u64)> {
    (from..RECORDS).map(|o| (o, 1)).collect()
}

/// Ten records in ten stored batches, all accepted by a share consumer (the group at 10).
/// Altering the start offset back to 4 gives a new share consumer 4..9 again as first
/// deliveries; a partition the topic lacks, an unknown topic, a negative offset and one
/// past the end are refused each on its own, changing nothing; while a member is in the
/// group, Alter and Delete are `NON_EMPTY_GROUP` and change nothing; a group no topic has
/// is `GROUP_ID_NOT_FOUND`. Deleting the offsets on the topic leaves no start offset (-1),
/// a second delete finds nothing to delete, and a share consumer starts again where the
/// group's start setting (earliest) says: at 0.
pub(super) async fn share_group_offsets_are_altered_and_deleted_only_while_the_group_is_empty(
    broker: &Broker,
    (conn, client): (&Connection, &Client),
) {
    topic(conn, TOPIC, 1).await;
    share_group(client, TOPIC, GROUP, 30_000, 5, None, GroupStart::Earliest).await;
    for i in 0..RECORDS {
        conn.publish(
            TENANT,
            NS,
            TOPIC,
            felix_client::Message::new(format!("v-{i}")),
            felix_client::AckMode::Batch,
        )
        .await
        .expect("publish");
    }
    assert_eq!(drain(broker, RECORDS).await, first_deliveries(0));
    let mut s = TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect");
    assert_eq!(start_offset(&mut s).await, RECORDS as i64);

    // Back to 4, with refusals beside it that change nothing.
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    let altered = alter(
        &mut s,
        GROUP,
        &[(TOPIC, &[(0, 4), (3, 0)]), ("no-such-topic", &[(0, 0)])],
    )
    .await;
    assert_eq!(altered.error_code, 0, "{altered:?}");
    assert_eq!(
        alter_codes(&altered),
        vec![
            (TOPIC.to_owned(), 0, 0),
            (TOPIC.to_owned(), 3, unknown),
            ("no-such-topic".to_owned(), 0, unknown),
        ],
        "{altered:?}"
    );
    assert_eq!(start_offset(&mut s).await, 4);
    let bad = alter(&mut s, GROUP, &[(TOPIC, &[(0, -3)])]).await;
    assert_eq!(
        alter_codes(&bad),
        vec![(TOPIC.to_owned(), 0, ResponseError::InvalidRequest.code())],
        "{bad:?}"
    );
    let past = alter(&mut s, GROUP, &[(TOPIC, &[(0, RECORDS as i64 + 1)])]).await;
    assert_eq!(
        alter_codes(&past),
        vec![(TOPIC.to_owned(), 0, ResponseError::OffsetOutOfRange.code())],
        "{past:?}"
    );
    assert_eq!(
        start_offset(&mut s).await,
        4,
        "the refusals changed nothing"
    );
    assert_eq!(drain(broker, RECORDS - 4).await, first_deliveries(4));
    assert_eq!(start_offset(&mut s).await, RECORDS as i64);

    // A member in the group: both refused, nothing changed.
    let mut m = TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect");
    let heartbeat = |epoch: i32| {
        ShareGroupHeartbeatRequest::default()
            .with_group_id(GroupId(name(GROUP)))
            .with_member_id(name("alter-m1"))
            .with_member_epoch(epoch)
            .with_subscribed_topic_names(Some(vec![TopicName(name(TOPIC))]))
    };
    let joined: ShareGroupHeartbeatResponse =
        call(&mut m, ApiKey::ShareGroupHeartbeat, 1, &heartbeat(0)).await;
    assert_eq!(joined.error_code, 0, "{joined:?}");
    let non_empty = ResponseError::NonEmptyGroup.code();
    let refused = alter(&mut s, GROUP, &[(TOPIC, &[(0, 0)])]).await;
    assert_eq!(refused.error_code, non_empty, "{refused:?}");
    let refused = delete(&mut s, GROUP, &[TOPIC]).await;
    assert_eq!(refused.error_code, non_empty, "{refused:?}");
    assert_eq!(
        start_offset(&mut s).await,
        RECORDS as i64,
        "nothing changed"
    );
    let left: ShareGroupHeartbeatResponse =
        call(&mut m, ApiKey::ShareGroupHeartbeat, 1, &heartbeat(-1)).await;
    assert_eq!(left.error_code, 0, "{left:?}");

    let not_found = ResponseError::GroupIdNotFound.code();
    let unknown_group = alter(&mut s, "never-seen", &[(TOPIC, &[(0, 0)])]).await;
    assert_eq!(unknown_group.error_code, not_found, "{unknown_group:?}");
    let unknown_group = delete(&mut s, "never-seen", &[TOPIC]).await;
    assert_eq!(unknown_group.error_code, not_found, "{unknown_group:?}");

    // Deleted: no start offset; the next consumer starts at the group's start setting.
    let deleted = delete(&mut s, GROUP, &[TOPIC, "no-such-topic"]).await;
    assert_eq!(deleted.error_code, 0, "{deleted:?}");
    let codes: Vec<(String, i16)> = deleted
        .responses
        .iter()
        .map(|t| (t.topic_name.to_string(), t.error_code))
        .collect();
    assert_eq!(
        codes,
        vec![(TOPIC.to_owned(), 0), ("no-such-topic".to_owned(), unknown)],
        "{deleted:?}"
    );
    assert_eq!(start_offset(&mut s).await, -1);
    let again = delete(&mut s, GROUP, &[TOPIC]).await;
    assert_eq!(
        again.responses[0].error_code, unknown,
        "nothing left to delete: {again:?}"
    );
    assert_eq!(drain(broker, RECORDS).await, first_deliveries(0));
    let info = client
        .describe_group(TENANT, NS, TOPIC, GROUP)
        .await
        .expect("the Felix group is still there, its settings kept");
    assert_eq!(info.visibility_timeout_ms, 30_000, "{info:?}");
}

/// Each partition's (index, start offset) of `group` on `topic`, as DescribeShareGroupOffsets
/// answers it on `s`: the group-level error code, and the partitions.
async fn start_offsets(s: &mut TcpStream, group: &str, topic: &str) -> (i16, Vec<(i32, i64)>) {
    let r = DescribeShareGroupOffsetsRequest::default().with_groups(vec![
        DescribeShareGroupOffsetsRequestGroup::default()
            .with_group_id(GroupId(name(group)))
            .with_topics(Some(vec![
                DescribeShareGroupOffsetsRequestTopic::default()
                    .with_topic_name(TopicName(name(topic)))
                    .with_partitions(vec![0, 1, 2]),
            ])),
    ]);
    let d: DescribeShareGroupOffsetsResponse =
        call(s, ApiKey::DescribeShareGroupOffsets, 0, &r).await;
    let g = &d.groups[0];
    let partitions = g
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| {
            assert_eq!(p.error_code, 0, "{d:?}");
            (p.partition_index, p.start_offset)
        })
        .collect();
    (g.error_code, partitions)
}

/// The broker FindCoordinator (asked of the first broker) names for `group` (key type 0, as
/// for classic and share groups), and another broker.
pub(super) async fn coordinator_and_another<'a>(
    brokers: &'a [Broker],
    group: &str,
) -> (&'a Broker, &'a Broker) {
    let mut s = TcpStream::connect(brokers[0].kafka_addr)
        .await
        .expect("connect");
    let found: FindCoordinatorResponse = call(
        &mut s,
        ApiKey::FindCoordinator,
        3,
        &FindCoordinatorRequest::default()
            .with_key_type(0)
            .with_key(name(group)),
    )
    .await;
    assert_eq!(found.error_code, 0, "{found:?}");
    let port = |b: &&Broker| i32::from(b.kafka_addr.port()) == found.port;
    let coordinator = brokers.iter().find(port).expect("a broker coordinates");
    let other = brokers.iter().find(|b| !port(b)).expect("another broker");
    (coordinator, other)
}

/// On a cluster, the share-group requests only a group's coordinator serves (membership:
/// ShareGroupHeartbeat, ShareGroupDescribe; the group's offsets: Describe, Alter and
/// DeleteShareGroupOffsets) sent to a broker FindCoordinator does not name are answered
/// `NOT_COORDINATOR`, so the client finds the coordinator again, and change nothing: an
/// Alter to 0 and a Delete there leave the group's start offsets where they were. The
/// coordinator serves the same requests. `group` is an empty share group that has consumed
/// the 3-partition `topic`.
pub(super) async fn share_group_requests_to_a_broker_not_coordinating_the_group_get_not_coordinator(
    brokers: &[Broker],
    topic: &str,
    group: &str,
) {
    let not_coordinator = ResponseError::NotCoordinator.code();
    let (coordinator, other) = coordinator_and_another(brokers, group).await;
    let mut at_coordinator = TcpStream::connect(coordinator.kafka_addr)
        .await
        .expect("connect");
    let mut elsewhere = TcpStream::connect(other.kafka_addr).await.expect("connect");

    let (code, before) = start_offsets(&mut at_coordinator, group, topic).await;
    assert_eq!(code, 0, "the coordinator describes the group's offsets");
    assert_eq!(before.len(), 3, "{before:?}");
    assert!(
        before.iter().all(|(_, o)| *o > 0),
        "the group consumed every partition: {before:?}"
    );
    let (code, _) = start_offsets(&mut elsewhere, group, topic).await;
    assert_eq!(code, not_coordinator, "DescribeShareGroupOffsets elsewhere");

    let join = ShareGroupHeartbeatRequest::default()
        .with_group_id(GroupId(name(group)))
        .with_member_id(name("elsewhere"))
        .with_member_epoch(0)
        .with_subscribed_topic_names(Some(vec![TopicName(name(topic))]));
    let joined: ShareGroupHeartbeatResponse =
        call(&mut elsewhere, ApiKey::ShareGroupHeartbeat, 1, &join).await;
    assert_eq!(joined.error_code, not_coordinator, "{joined:?}");
    assert!(joined.assignment.is_none(), "{joined:?}");

    let describe = ShareGroupDescribeRequest::default().with_group_ids(vec![GroupId(name(group))]);
    let described: ShareGroupDescribeResponse =
        call(&mut elsewhere, ApiKey::ShareGroupDescribe, 1, &describe).await;
    assert_eq!(
        described.groups[0].error_code, not_coordinator,
        "{described:?}"
    );

    let moved = alter(&mut elsewhere, group, &[(topic, &[(0, 0), (1, 0), (2, 0)])]).await;
    assert_eq!(moved.error_code, not_coordinator, "{moved:?}");
    assert!(moved.responses.is_empty(), "{moved:?}");
    let deleted = delete(&mut elsewhere, group, &[topic]).await;
    assert_eq!(deleted.error_code, not_coordinator, "{deleted:?}");
    assert!(deleted.responses.is_empty(), "{deleted:?}");
    let (_, after) = start_offsets(&mut at_coordinator, group, topic).await;
    assert_eq!(after, before, "refused requests changed nothing");

    // The coordinator serves them: an Alter to where the group stands changes nothing
    // either, and the group (no members) is described as not found.
    let same: Vec<(i32, i64)> = before.clone();
    let moved = alter(&mut at_coordinator, group, &[(topic, &same)]).await;
    assert_eq!(moved.error_code, 0, "{moved:?}");
    assert_eq!(
        alter_codes(&moved),
        (0..3).map(|p| (topic.to_owned(), p, 0)).collect::<Vec<_>>()
    );
    let described: ShareGroupDescribeResponse = call(
        &mut at_coordinator,
        ApiKey::ShareGroupDescribe,
        1,
        &describe,
    )
    .await;
    assert_eq!(
        described.groups[0].error_code,
        ResponseError::GroupIdNotFound.code(),
        "{described:?}"
    );
    let (_, after) = start_offsets(&mut at_coordinator, group, topic).await;
    assert_eq!(after, before);
}
