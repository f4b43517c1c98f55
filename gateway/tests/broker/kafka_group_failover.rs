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

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{
    ApiKey, DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest,
    SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tokio::net::TcpStream;

use super::cluster::Cluster;
use super::common::Broker;
use super::kafka::python_script;
use super::kafka_share::call;
use super::kafka_share_offsets::coordinator_and_another;

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
    classic_group_requests_elsewhere_get_not_coordinator(
        &cluster.brokers[(coordinator - 1) as usize],
        &cluster.brokers,
        topic,
        group,
        &committed,
    )
    .await;

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

/// The requests of a classic group (membership, offsets, describe, delete) sent to a broker
/// that does not coordinate it are answered `NOT_COORDINATOR`, so the client finds the
/// coordinator again, and change nothing: a group kept by two brokers at once would hand
/// the same partitions to two members. `committed` is what the group committed at
/// `coordinator`, which still answers it afterwards.
async fn classic_group_requests_elsewhere_get_not_coordinator(
    coordinator: &Broker,
    brokers: &[Broker],
    topic: &str,
    group: &str,
    committed: &BTreeMap<i64, i64>,
) {
    let not_coordinator = ResponseError::NotCoordinator.code();
    let name = |s: &str| StrBytes::from_string(s.to_owned());
    let (found, other) = coordinator_and_another(brokers, group).await;
    assert_eq!(
        found.kafka_addr, coordinator.kafka_addr,
        "FindCoordinator names the broker the client used"
    );
    let mut elsewhere = TcpStream::connect(other.kafka_addr).await.expect("connect");
    let group_id = || GroupId(name(group));

    let joined: JoinGroupResponse = call(
        &mut elsewhere,
        ApiKey::JoinGroup,
        5,
        &JoinGroupRequest::default()
            .with_group_id(group_id())
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_protocol_type(name("consumer"))
            .with_protocols(vec![
                JoinGroupRequestProtocol::default()
                    .with_name(name("range"))
                    .with_metadata(Bytes::new()),
            ]),
    )
    .await;
    assert_eq!(joined.error_code, not_coordinator, "JoinGroup: {joined:?}");
    assert_eq!(joined.generation_id, -1, "{joined:?}");
    let synced: SyncGroupResponse = call(
        &mut elsewhere,
        ApiKey::SyncGroup,
        3,
        &SyncGroupRequest::default()
            .with_group_id(group_id())
            .with_member_id(name("m"))
            .with_generation_id(1),
    )
    .await;
    assert_eq!(synced.error_code, not_coordinator, "SyncGroup: {synced:?}");
    let beat: HeartbeatResponse = call(
        &mut elsewhere,
        ApiKey::Heartbeat,
        3,
        &HeartbeatRequest::default()
            .with_group_id(group_id())
            .with_member_id(name("m"))
            .with_generation_id(1),
    )
    .await;
    assert_eq!(beat.error_code, not_coordinator, "Heartbeat: {beat:?}");
    let left: LeaveGroupResponse = call(
        &mut elsewhere,
        ApiKey::LeaveGroup,
        3,
        &LeaveGroupRequest::default()
            .with_group_id(group_id())
            .with_members(vec![MemberIdentity::default().with_member_id(name("m"))]),
    )
    .await;
    assert_eq!(left.error_code, not_coordinator, "LeaveGroup: {left:?}");

    // A commit of offset 0 everywhere (generation -1: no membership needed) is refused
    // partition by partition and moves nothing.
    let commit = OffsetCommitRequest::default()
        .with_group_id(group_id())
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(name(topic)))
                .with_partitions(
                    (0..3)
                        .map(|p| {
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(0)
                        })
                        .collect(),
                ),
        ]);
    let refused: OffsetCommitResponse =
        call(&mut elsewhere, ApiKey::OffsetCommit, 7, &commit).await;
    let codes: Vec<i16> = refused.topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect();
    assert_eq!(codes, vec![not_coordinator; 3], "OffsetCommit: {refused:?}");
    let fetch = OffsetFetchRequest::default()
        .with_group_id(group_id())
        .with_topics(Some(vec![
            OffsetFetchRequestTopic::default()
                .with_name(TopicName(name(topic)))
                .with_partition_indexes(vec![0, 1, 2]),
        ]));
    let fetched: OffsetFetchResponse = call(&mut elsewhere, ApiKey::OffsetFetch, 6, &fetch).await;
    assert_eq!(
        fetched.error_code, not_coordinator,
        "OffsetFetch: {fetched:?}"
    );
    let described: DescribeGroupsResponse = call(
        &mut elsewhere,
        ApiKey::DescribeGroups,
        4,
        &DescribeGroupsRequest::default().with_groups(vec![group_id()]),
    )
    .await;
    assert_eq!(
        described.groups[0].error_code, not_coordinator,
        "DescribeGroups: {described:?}"
    );
    let deleted: DeleteGroupsResponse = call(
        &mut elsewhere,
        ApiKey::DeleteGroups,
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![group_id()]),
    )
    .await;
    assert_eq!(
        deleted.results[0].error_code, not_coordinator,
        "DeleteGroups: {deleted:?}"
    );

    // The coordinator still answers exactly what the group committed.
    let mut at_coordinator = TcpStream::connect(coordinator.kafka_addr)
        .await
        .expect("connect");
    let fetched: OffsetFetchResponse =
        call(&mut at_coordinator, ApiKey::OffsetFetch, 6, &fetch).await;
    assert_eq!(fetched.error_code, 0, "{fetched:?}");
    let now: BTreeMap<i64, i64> = fetched.topics[0]
        .partitions
        .iter()
        .filter(|p| p.committed_offset >= 0)
        .map(|p| (i64::from(p.partition_index), p.committed_offset))
        .collect();
    let before: BTreeMap<i64, i64> = committed
        .iter()
        .filter(|(_, o)| **o >= 0)
        .map(|(p, o)| (*p, *o))
        .collect();
    assert_eq!(now, before, "refused requests changed nothing: {fetched:?}");
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
