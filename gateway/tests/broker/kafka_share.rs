//! Kafka share groups (KIP-932) with confluent-kafka's `ShareConsumer` (librdkafka 2.16's
//! share consumer, driven by `kafka_share.py` beside this file) against one real `felix`
//! process, shared by the cases below.
//!
//! Promises held here (docs/kafka.md, "Share groups"; docs/semantics.md): two share
//! consumers split a topic's records with each record accepted exactly once; a released
//! record is redelivered; a rejected record, and one released past the delivery limit, land
//! once in the group's dead-letter stream; a share consumer killed without `close()` has
//! its records redelivered to another after the acquisition lock, not before; and the
//! share group is the Felix group (its progress is what `describe` shows); bad share
//! requests (raw, encoded with `kafka-protocol`) get Kafka's codes and change nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use bytes::BytesMut;
use felix_client::{Client, ClientConfig, Connection, GroupConfig, GroupStart, StreamConfig};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::share_acknowledge_request::{
    AcknowledgePartition, AcknowledgeTopic, AcknowledgementBatch as AckBatch,
};
use kafka_protocol::messages::share_fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::share_group_describe_response::DescribedGroup;
use kafka_protocol::messages::{
    ApiKey, DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, GroupId, RequestHeader, ResponseHeader,
    ShareAcknowledgeRequest, ShareAcknowledgeResponse, ShareFetchRequest, ShareFetchResponse,
    ShareGroupDescribeRequest, ShareGroupDescribeResponse, ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

use super::common::{Broker, BrokerOptions};
use super::kafka::python_script;

/// The Kafka listener's tenant and namespace.
pub(super) const TENANT: &str = "default";
pub(super) const NS: &str = "default";

pub(super) async fn topic(conn: &Connection, name: &str, partitions: u32) {
    conn.create_stream(
        TENANT,
        NS,
        name,
        StreamConfig {
            durable: Some(true),
            shards: Some(partitions),
            ..Default::default()
        },
    )
    .await
    .expect("create stream");
}

/// The Felix group a share group is, created beforehand with its lock, delivery limit and
/// dead-letter stream (what `felixctl group create` does).
pub(super) async fn share_group(
    client: &Client,
    topic: &str,
    group: &str,
    lock_ms: u64,
    limit: u32,
    dead_letter: Option<&str>,
    start: GroupStart,
) {
    client
        .create_group(
            TENANT,
            NS,
            topic,
            group,
            GroupConfig {
                visibility_timeout_ms: Some(lock_ms),
                max_attempts: Some(limit),
                dead_letter: dead_letter.map(|d| format!("{TENANT}/{NS}/{d}")),
                start: Some(start),
            },
        )
        .await
        .expect("create group");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_share_groups_on_one_broker() {
    let broker = Broker::start(BrokerOptions::new()).await;
    let conn = broker.client().await;
    let client = Client::connect([broker.quic_addr.to_string()], ClientConfig::default())
        .await
        .expect("connect");
    let both = (&conn, &client);
    two_share_consumers_accept_each_record_once_and_dead_letter_rejects_and_the_exhausted(
        &broker, both,
    )
    .await;
    a_killed_share_consumers_records_are_redelivered_after_the_lock_not_before(&broker, both).await;
    share_group_configs_set_through_the_admin_api_are_the_felix_groups_settings(&broker, both)
        .await;
    bad_share_requests_get_kafka_codes_and_change_nothing(&broker, both).await;
    a_batch_too_large_for_one_acknowledgement_is_acquired_up_to_max_records(&broker, both).await;
    max_records_bounds_a_share_fetch_over_all_its_partitions_but_for_one_batch(&broker, both).await;
    super::kafka_share_offsets::share_group_offsets_are_altered_and_deleted_only_while_the_group_is_empty(
        &broker, both,
    )
    .await;
}

/// Two `ShareConsumer`s in explicit mode, started before 1,000 records are sent, split
/// them; each record is accepted exactly once; a released record comes again with delivery
/// count 2; a rejected record and one released past the delivery limit (3) are each in the
/// dead-letter stream once, with their headers.
async fn two_share_consumers_accept_each_record_once_and_dead_letter_rejects_and_the_exhausted(
    broker: &Broker,
    (conn, client): (&Connection, &Client),
) {
    const COUNT: u64 = 1000;
    topic(conn, "share-orders", 2).await;
    topic(conn, "share-orders-dlq", 1).await;
    share_group(
        client,
        "share-orders",
        "billing",
        30_000,
        3,
        Some("share-orders-dlq"),
        GroupStart::Latest,
    )
    .await;
    let out = python_script(
        "kafka_share.py",
        &[
            "split",
            &broker.kafka_addr.to_string(),
            "share-orders",
            "billing",
            &COUNT.to_string(),
            "share-orders-dlq",
            "--limit",
            "3",
        ],
    )
    .await;
    let (want, rejected) = assert_split(&out, "share-orders", COUNT, true);
    // One state for both faces: the Felix group's progress is the share group's.
    let info = client
        .describe_group(TENANT, NS, "share-orders", "billing")
        .await
        .expect("describe");
    let acked: u64 = info.shards.iter().map(|s| s.acked).sum();
    let dead_lettered: u64 = info.shards.iter().map(|s| s.dead_lettered).sum();
    assert_eq!(acked, want.len() as u64, "{info:?}");
    assert_eq!(dead_lettered, rejected.len() as u64 + 1, "{info:?}");
    assert!(
        info.shards
            .iter()
            .all(|s| s.in_flight == 0 && s.waiting == 0 && s.acked_up_to == s.next_offset),
        "nothing left pending: {info:?}"
    );
    // The share consumers are the group's consumers, by member id.
    let consumers: BTreeSet<&String> = info.shards.iter().flat_map(|s| &s.consumers).collect();
    assert_eq!(consumers.len(), 2, "both share members shown: {info:?}");
}

/// A share consumer acquires records and is SIGKILLed without `close()`: another consumer
/// gets them only once their 6 s lock has lapsed, as delivery 2, and everything else at
/// once.
async fn a_killed_share_consumers_records_are_redelivered_after_the_lock_not_before(
    broker: &Broker,
    (conn, client): (&Connection, &Client),
) {
    const LOCK_MS: u64 = 6_000;
    const COUNT: u64 = 20;
    topic(conn, "share-kill", 1).await;
    share_group(
        client,
        "share-kill",
        "workers",
        LOCK_MS,
        5,
        None,
        GroupStart::Earliest,
    )
    .await;
    let messages = (0..COUNT)
        .map(|i| felix_client::Message::new(format!("v-{i}")))
        .collect();
    conn.publish_batch(
        TENANT,
        NS,
        "share-kill",
        messages,
        felix_client::AckMode::Batch,
    )
    .await
    .expect("publish");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broker/kafka_share.py");
    let bootstrap = broker.kafka_addr.to_string();
    let mut holder = tokio::process::Command::new("python3")
        .arg(&script)
        .args(["hold", &bootstrap, "share-kill", "workers"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("run python3 (scripts/test.sh installs confluent-kafka)");
    let mut lines = tokio::io::BufReader::new(holder.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the holder acquired records within 60 s")
        .expect("read")
        .expect("a line");
    holder.kill().await.expect("SIGKILL the holder");
    let held: Value = serde_json::from_str(&line).expect("holder JSON");
    let held_at = held["at"].as_f64().expect("at");
    let held: BTreeSet<u64> = held["held"]
        .as_array()
        .expect("held")
        .iter()
        .map(|h| h[1].as_u64().expect("offset"))
        .collect();
    assert!(!held.is_empty());
    let out = python_script(
        "kafka_share.py",
        &[
            "drain",
            &bootstrap,
            "share-kill",
            "workers",
            &COUNT.to_string(),
            "--timeout",
            "40",
        ],
    )
    .await;
    let records = out["records"].as_array().expect("records");
    let offsets: BTreeSet<u64> = records
        .iter()
        .map(|r| r[1].as_u64().expect("offset"))
        .collect();
    assert_eq!(
        offsets,
        (0..COUNT).collect::<BTreeSet<u64>>(),
        "every record reached the second consumer: {records:?}"
    );
    let lock_s = LOCK_MS as f64 / 1000.0;
    for r in records {
        let (offset, dc, at) = (
            r[1].as_u64().expect("offset"),
            r[2].as_u64().expect("delivery count"),
            r[3].as_f64().expect("time"),
        );
        if held.contains(&offset) {
            // The lock began before the holder saw the records: allow for that much.
            assert!(
                at - held_at >= lock_s - 1.0,
                "offset {offset} redelivered {:.2} s after it was acquired, before the {lock_s} s lock lapsed",
                at - held_at
            );
            assert!(
                at - held_at <= lock_s + 15.0,
                "offset {offset} redelivered only {:.2} s after it was acquired",
                at - held_at
            );
            assert_eq!(dc, 2, "offset {offset} came again as delivery 2");
        }
    }
}

/// IncrementalAlterConfigs on the group resource sets the Felix group's settings: with
/// `share.auto.offset.reset=earliest` a share consumer gets records sent before it
/// started. An unknown config, and a share group on no topic, are refused by name and
/// change nothing.
async fn share_group_configs_set_through_the_admin_api_are_the_felix_groups_settings(
    broker: &Broker,
    (conn, client): (&Connection, &Client),
) {
    topic(conn, "share-early", 1).await;
    let messages = (0..10)
        .map(|i| felix_client::Message::new(format!("v-{i}")))
        .collect();
    conn.publish_batch(
        TENANT,
        NS,
        "share-early",
        messages,
        felix_client::AckMode::Batch,
    )
    .await
    .expect("publish");
    share_group(
        client,
        "share-early",
        "early",
        30_000,
        5,
        None,
        GroupStart::Latest,
    )
    .await;
    let bootstrap = broker.kafka_addr.to_string();
    let configs = |args: Vec<&'static str>| {
        let bootstrap = bootstrap.clone();
        async move {
            let mut all = vec!["group-configs", bootstrap.as_str()];
            all.extend(args);
            python_script("kafka_share.py", &all).await
        }
    };
    let unknown = configs(vec!["early", "share.isolation.level=read_committed"]).await;
    assert_eq!(unknown["error"], "INVALID_CONFIG", "{unknown}");
    let nowhere = configs(vec!["nowhere", "share.auto.offset.reset=earliest"]).await;
    assert_eq!(nowhere["error"], "GROUP_ID_NOT_FOUND", "{nowhere}");
    let set = configs(vec![
        "early",
        "share.auto.offset.reset=earliest",
        "share.record.lock.duration.ms=15000",
        "share.delivery.count.limit=4",
        "errors.deadletterqueue.topic.name=share-orders-dlq",
    ])
    .await;
    assert_eq!(set["error"], Value::Null, "{set}");
    let info = client
        .describe_group(TENANT, NS, "share-early", "early")
        .await
        .expect("describe");
    assert_eq!(info.visibility_timeout_ms, 15_000, "{info:?}");
    assert_eq!(info.max_attempts, 4, "{info:?}");
    assert_eq!(
        info.dead_letter.as_deref(),
        Some("default/default/share-orders-dlq"),
        "{info:?}"
    );
    let out = python_script(
        "kafka_share.py",
        &[
            "drain",
            &bootstrap,
            "share-early",
            "early",
            "10",
            "--timeout",
            "30",
        ],
    )
    .await;
    let offsets: BTreeSet<u64> = out["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r[1].as_u64().expect("offset"))
        .collect();
    assert_eq!(
        offsets,
        (0..10).collect::<BTreeSet<u64>>(),
        "from the earliest: {out}"
    );
}

/// With auth on, a share consumer needs `group.consume` (on the group and the topic): a
/// token without it is refused with `GROUP_AUTHORIZATION_FAILED`, which the application
/// sees, and acquires nothing; one with it consumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_consumer_without_group_consume_is_refused_and_changes_nothing() {
    let broker = Broker::start(BrokerOptions::new().env("FELIX_AUTH", "on")).await;
    let admin = broker.client().await;
    admin.create_tenant("acme").await.expect("tenant");
    admin
        .create_namespace("acme", "default")
        .await
        .expect("namespace");
    admin
        .create_stream(
            "acme",
            "default",
            "jobs",
            StreamConfig {
                durable: Some(true),
                shards: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("stream");
    let messages = (0..3)
        .map(|i| felix_client::Message::new(format!("v-{i}")))
        .collect();
    admin
        .publish_batch(
            "acme",
            "default",
            "jobs",
            messages,
            felix_client::AckMode::Batch,
        )
        .await
        .expect("publish");
    let client = Client::connect(
        [broker.quic_addr.to_string()],
        ClientConfig {
            token: broker.admin_token(),
            ..ClientConfig::default()
        },
    )
    .await
    .expect("connect");
    client
        .create_group(
            "acme",
            "default",
            "jobs",
            "workers",
            GroupConfig {
                start: Some(GroupStart::Earliest),
                ..GroupConfig::default()
            },
        )
        .await
        .expect("group");
    let mint = |allow: &'static [&'static str]| {
        let admin = &admin;
        async move {
            admin
                .mint_token(felix_client::TokenSpec {
                    tenant: "acme".into(),
                    allow: allow.iter().map(|a| a.to_string()).collect(),
                    ..felix_client::TokenSpec::default()
                })
                .await
                .expect("mint")
                .token
        }
    };
    let reader = mint(&["stream.subscribe:acme/default/*"]).await;
    let worker = mint(&["group.consume:acme/default/*"]).await;
    let bootstrap = broker.kafka_addr.to_string();
    let drain = |token: String, stop_on_error: bool| {
        let bootstrap = bootstrap.clone();
        async move {
            let mut args = vec![
                "drain".to_owned(),
                bootstrap,
                "jobs".into(),
                "workers".into(),
                "3".into(),
                "--timeout".into(),
                "30".into(),
                "--token".into(),
                token,
            ];
            if stop_on_error {
                args.push("--stop-on-error".into());
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            python_script("kafka_share.py", &args).await
        }
    };
    let refused = drain(reader, true).await;
    let errors = refused["errors"].as_array().expect("errors");
    assert!(
        errors.iter().any(|e| e == "GROUP_AUTHORIZATION_FAILED"),
        "the application sees the refusal: {refused}"
    );
    assert_eq!(refused["records"], serde_json::json!([]), "{refused}");
    let info = client
        .describe_group("acme", "default", "jobs", "workers")
        .await
        .expect("describe");
    assert!(
        info.shards
            .iter()
            .all(|s| s.in_flight == 0 && s.acked == 0 && s.next_offset == 0),
        "the refused consumer acquired nothing: {info:?}"
    );
    let served = drain(worker, false).await;
    assert_eq!(
        served["records"].as_array().map(Vec::len),
        Some(3),
        "group.consume is enough: {served}"
    );
    let info = client
        .describe_group("acme", "default", "jobs", "workers")
        .await
        .expect("describe");
    assert_eq!(info.shards[0].acked, 3, "{info:?}");
}

/// DescribeShareGroupOffsets of the group `raw` (records 0 and 1 of `share-raw` accepted,
/// 2 still acquired): its start offset on the partition is the Felix group's position,
/// 2 (everything below accepted), not the read position 3; every topic the group is on
/// when none is named; an unknown topic or partition is `UNKNOWN_TOPIC_OR_PARTITION`; a
/// group that never started on a topic's partitions is -1 there.
async fn share_group_offsets_are_the_felix_groups_positions(
    s: &mut tokio::net::TcpStream,
    topic_id: uuid::Uuid,
) {
    use kafka_protocol::messages::describe_share_group_offsets_request::{
        DescribeShareGroupOffsetsRequestGroup as G, DescribeShareGroupOffsetsRequestTopic as T,
    };
    let ask = |topics: Option<Vec<T>>| {
        DescribeShareGroupOffsetsRequest::default().with_groups(vec![
            G::default()
                .with_group_id(GroupId(StrBytes::from_static_str("raw")))
                .with_topics(topics),
        ])
    };
    let topic = |name: &'static str, partitions: Vec<i32>| {
        T::default()
            .with_topic_name(TopicName(StrBytes::from_static_str(name)))
            .with_partitions(partitions)
    };
    let starts = |r: &DescribeShareGroupOffsetsResponse| -> Vec<(String, i32, i64, i16)> {
        r.groups[0]
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| {
                    (
                        t.topic_name.to_string(),
                        p.partition_index,
                        p.start_offset,
                        p.error_code,
                    )
                })
            })
            .collect()
    };
    let all: DescribeShareGroupOffsetsResponse =
        call(s, ApiKey::DescribeShareGroupOffsets, 0, &ask(None)).await;
    assert_eq!(all.groups[0].error_code, 0, "{all:?}");
    assert_eq!(all.groups[0].topics[0].topic_id, topic_id);
    assert_eq!(
        starts(&all),
        vec![("share-raw".to_owned(), 0, 2, 0)],
        "the group is on share-raw only, at 2: {all:?}"
    );
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    let named: DescribeShareGroupOffsetsResponse = call(
        s,
        ApiKey::DescribeShareGroupOffsets,
        0,
        &ask(Some(vec![
            topic("share-raw", vec![0, 7]),
            topic("no-such-topic", vec![0]),
            topic("share-orders-dlq", vec![0]),
        ])),
    )
    .await;
    assert_eq!(
        starts(&named),
        vec![
            ("share-raw".to_owned(), 0, 2, 0),
            ("share-raw".to_owned(), 7, -1, unknown),
            ("no-such-topic".to_owned(), 0, -1, unknown),
            ("share-orders-dlq".to_owned(), 0, -1, 0),
        ],
        "{named:?}"
    );
}

/// Whole stored batches stop where one acknowledgement could no longer name every record
/// acquired (10,000 per partition): a stored batch of 10,001 records is acquired up to
/// `MaxRecords` (500), and accepting all of them in one ShareAcknowledge is applied.
async fn a_batch_too_large_for_one_acknowledgement_is_acquired_up_to_max_records(
    broker: &Broker,
    (conn, client): (&Connection, &Client),
) {
    const STORED: usize = 10_001;
    topic(conn, "share-huge", 1).await;
    share_group(
        client,
        "share-huge",
        "huge",
        30_000,
        5,
        None,
        GroupStart::Earliest,
    )
    .await;
    let messages = (0..STORED)
        .map(|i| felix_client::Message::new(format!("{i}")))
        .collect();
    conn.publish_batch(
        TENANT,
        NS,
        "share-huge",
        messages,
        felix_client::AckMode::Batch,
    )
    .await
    .expect("publish one batch");
    let mut s = tokio::net::TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect");
    let group = || Some(GroupId(StrBytes::from_static_str("huge")));
    let member = || StrBytes::from_static_str("h1");
    let joined = join_raw(&mut s, "huge", "h1", "share-huge").await;
    let topic_id = joined.assignment.expect("an assignment").topic_partitions[0].topic_id;
    let fetched: ShareFetchResponse = call(
        &mut s,
        ApiKey::ShareFetch,
        1,
        &ShareFetchRequest::default()
            .with_group_id(group())
            .with_member_id(Some(member()))
            .with_share_session_epoch(0)
            .with_max_wait_ms(2000)
            .with_max_bytes(8 << 20)
            .with_max_records(500)
            .with_topics(vec![
                FetchTopic::default()
                    .with_topic_id(topic_id)
                    .with_partitions(vec![FetchPartition::default().with_partition_index(0)]),
            ]),
    )
    .await;
    let acquired: Vec<(i64, i64)> = fetched.responses[0].partitions[0]
        .acquired_records
        .iter()
        .map(|a| (a.first_offset, a.last_offset))
        .collect();
    assert_eq!(
        acquired,
        vec![(0, 499)],
        "up to MaxRecords, not the whole batch"
    );
    let r = ShareAcknowledgeRequest::default()
        .with_group_id(group())
        .with_member_id(Some(member()))
        .with_share_session_epoch(1)
        .with_topics(vec![
            AcknowledgeTopic::default()
                .with_topic_id(topic_id)
                .with_partitions(vec![
                    AcknowledgePartition::default()
                        .with_partition_index(0)
                        .with_acknowledgement_batches(vec![ack_batch(0, 499, 1)]),
                ]),
        ]);
    let answer: ShareAcknowledgeResponse = call(&mut s, ApiKey::ShareAcknowledge, 1, &r).await;
    assert_eq!(
        answer.responses[0].partitions[0].error_code, 0,
        "{answer:?}"
    );
    let info = client
        .describe_group(TENANT, NS, "share-huge", "huge")
        .await
        .expect("describe");
    assert_eq!(info.shards[0].acked, 500, "{info:?}");
}

/// `MaxRecords` is one budget for all the partitions of a ShareFetch, as on Kafka: four
/// partitions each holding stored batches of 300 records, fetched with `MaxRecords` 500,
/// give at most 500 records but for the one batch that crosses it (so at most 799, whole
/// batches only), and following fetches acquire the rest, each record once.
async fn max_records_bounds_a_share_fetch_over_all_its_partitions_but_for_one_batch(
    broker: &Broker,
    (conn, client): (&Connection, &Client),
) {
    const PARTITIONS: i32 = 4;
    const BATCH: i64 = 300;
    const MAX_RECORDS: i64 = 500;
    topic(conn, "share-budget", PARTITIONS as u32).await;
    share_group(
        client,
        "share-budget",
        "budget",
        30_000,
        5,
        None,
        GroupStart::Earliest,
    )
    .await;
    // Key-less messages of one call go to one shard, round-robin per call: one stored
    // batch of 300 each time.
    for b in 0..PARTITIONS as i64 {
        let messages = (0..BATCH)
            .map(|i| felix_client::Message::new(format!("{}", b * BATCH + i)))
            .collect();
        conn.publish_batch(
            TENANT,
            NS,
            "share-budget",
            messages,
            felix_client::AckMode::Batch,
        )
        .await
        .expect("publish one batch");
    }
    let mut s = tokio::net::TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect");
    let group = || Some(GroupId(StrBytes::from_static_str("budget")));
    let member = || StrBytes::from_static_str("b1");
    let joined = join_raw(&mut s, "budget", "b1", "share-budget").await;
    let topic_id = joined.assignment.expect("an assignment").topic_partitions[0].topic_id;
    let mut acquired: BTreeSet<(i32, i64)> = BTreeSet::new();
    for epoch in 0..8 {
        if acquired.len() as i64 == i64::from(PARTITIONS) * BATCH {
            break;
        }
        let partitions = (0..PARTITIONS)
            .map(|p| FetchPartition::default().with_partition_index(p))
            .collect();
        let fetched: ShareFetchResponse = call(
            &mut s,
            ApiKey::ShareFetch,
            1,
            &ShareFetchRequest::default()
                .with_group_id(group())
                .with_member_id(Some(member()))
                .with_share_session_epoch(epoch)
                .with_max_wait_ms(2000)
                .with_max_bytes(8 << 20)
                .with_max_records(MAX_RECORDS as i32)
                .with_batch_size(MAX_RECORDS as i32)
                // The session keeps the partitions named when it opened.
                .with_topics(if epoch == 0 {
                    vec![
                        FetchTopic::default()
                            .with_topic_id(topic_id)
                            .with_partitions(partitions),
                    ]
                } else {
                    Vec::new()
                }),
        )
        .await;
        assert_eq!(fetched.error_code, 0, "{fetched:?}");
        let mut this_fetch = 0i64;
        for p in fetched.responses.iter().flat_map(|t| t.partitions.iter()) {
            assert_eq!(p.error_code, 0, "{p:?}");
            let here: i64 = p
                .acquired_records
                .iter()
                .map(|a| a.last_offset - a.first_offset + 1)
                .sum();
            assert_eq!(
                here % BATCH,
                0,
                "partition {} acquired whole stored batches: {:?}",
                p.partition_index,
                p.acquired_records
            );
            for a in &p.acquired_records {
                for o in a.first_offset..=a.last_offset {
                    assert!(
                        acquired.insert((p.partition_index, o)),
                        "offset {o} of partition {} acquired twice",
                        p.partition_index
                    );
                }
            }
            this_fetch += here;
        }
        assert!(
            this_fetch < MAX_RECORDS + BATCH,
            "fetch {epoch} acquired {this_fetch} records with MaxRecords {MAX_RECORDS}: more \
             than one stored batch of {BATCH} past it"
        );
        if epoch == 0 {
            assert!(
                this_fetch >= MAX_RECORDS,
                "the first fetch fills MaxRecords: {this_fetch}"
            );
        }
    }
    assert_eq!(
        acquired.len() as i64,
        i64::from(PARTITIONS) * BATCH,
        "every record acquired once over the fetches"
    );
}

/// ShareGroupDescribe of the group `raw`.
async fn describe_raw(s: &mut tokio::net::TcpStream) -> DescribedGroup {
    let r = ShareGroupDescribeRequest::default()
        .with_group_ids(vec![GroupId(StrBytes::from_static_str("raw"))]);
    let d: ShareGroupDescribeResponse = call(s, ApiKey::ShareGroupDescribe, 1, &r).await;
    d.groups.into_iter().next().expect("one group")
}

/// Joins `member` to share group `group`, subscribed to `topic`, with a raw
/// ShareGroupHeartbeat at epoch 0, and checks that the join succeeded.
async fn join_raw(
    s: &mut tokio::net::TcpStream,
    group: &'static str,
    member: &'static str,
    topic: &'static str,
) -> ShareGroupHeartbeatResponse {
    let joined: ShareGroupHeartbeatResponse = call(
        s,
        ApiKey::ShareGroupHeartbeat,
        1,
        &ShareGroupHeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str(group)))
            .with_member_id(StrBytes::from_static_str(member))
            .with_member_epoch(0)
            .with_subscribed_topic_names(Some(vec![TopicName(StrBytes::from_static_str(topic))])),
    )
    .await;
    assert_eq!(joined.error_code, 0, "{joined:?}");
    joined
}

/// One request on a raw Kafka connection, encoded and decoded with `kafka-protocol` (what a
/// client that sends bad input would send; confluent-kafka never does).
pub(super) async fn call<Req, Resp>(
    s: &mut tokio::net::TcpStream,
    key: ApiKey,
    version: i16,
    r: &Req,
) -> Resp
where
    Req: Encodable,
    Resp: Decodable + HeaderVersion,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_static_str("raw")))
        .encode(&mut buf, key.request_header_version(version))
        .expect("header");
    r.encode(&mut buf, version).expect("body");
    let mut frame = (buf.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&buf);
    s.write_all(&frame).await.expect("write");
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.expect("response length");
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.expect("response body");
    let mut body = bytes::Bytes::from(body);
    ResponseHeader::decode(&mut body, Resp::header_version(version)).expect("response header");
    Resp::decode(&mut body, version).expect("response body")
}

fn ack_batch(first: i64, last: i64, kind: i8) -> AckBatch {
    AckBatch::default()
        .with_first_offset(first)
        .with_last_offset(last)
        .with_acknowledge_types(vec![kind])
}

/// ShareAcknowledge of `batches` on partition 0 of `topic_id`; the partition's error code.
async fn acknowledge(
    s: &mut tokio::net::TcpStream,
    topic_id: uuid::Uuid,
    epoch: i32,
    batches: Vec<AckBatch>,
) -> (i16, i16) {
    let r = ShareAcknowledgeRequest::default()
        .with_group_id(Some(GroupId(StrBytes::from_static_str("raw"))))
        .with_member_id(Some(StrBytes::from_static_str("m1")))
        .with_share_session_epoch(epoch)
        .with_topics(vec![
            AcknowledgeTopic::default()
                .with_topic_id(topic_id)
                .with_partitions(vec![
                    AcknowledgePartition::default()
                        .with_partition_index(0)
                        .with_acknowledgement_batches(batches),
                ]),
        ]);
    let answer: ShareAcknowledgeResponse = call(s, ApiKey::ShareAcknowledge, 1, &r).await;
    let partition = answer
        .responses
        .first()
        .and_then(|t| t.partitions.first())
        .map_or(0, |p| p.error_code);
    (answer.error_code, partition)
}

/// Bad share requests get Kafka's codes and change nothing: a wrong session epoch
/// (`INVALID_SHARE_SESSION_EPOCH`, its acknowledgements not applied), a malformed
/// acknowledgement batch (`INVALID_REQUEST`), an acknowledgement of a record never acquired
/// or already accepted (`INVALID_RECORD_STATE`); a good one is applied once.
/// ShareGroupDescribe shows the member until it leaves.
async fn bad_share_requests_get_kafka_codes_and_change_nothing(
    broker: &Broker,
    (conn, client): (&Connection, &Client),
) {
    topic(conn, "share-raw", 1).await;
    share_group(
        client,
        "share-raw",
        "raw",
        30_000,
        5,
        None,
        GroupStart::Earliest,
    )
    .await;
    let messages = (0..3)
        .map(|i| felix_client::Message::new(format!("v-{i}")))
        .collect();
    conn.publish_batch(
        TENANT,
        NS,
        "share-raw",
        messages,
        felix_client::AckMode::Batch,
    )
    .await
    .expect("publish");
    let acked = || async {
        client
            .describe_group(TENANT, NS, "share-raw", "raw")
            .await
            .expect("describe")
            .shards[0]
            .acked
    };
    let mut s = tokio::net::TcpStream::connect(broker.kafka_addr)
        .await
        .expect("connect");
    let joined = join_raw(&mut s, "raw", "m1", "share-raw").await;
    assert!(joined.member_epoch > 0, "{joined:?}");
    let assigned = joined.assignment.expect("an assignment");
    let topic_id = assigned.topic_partitions[0].topic_id;
    assert_eq!(assigned.topic_partitions[0].partitions, vec![0]);
    let fetched: ShareFetchResponse = call(
        &mut s,
        ApiKey::ShareFetch,
        1,
        &ShareFetchRequest::default()
            .with_group_id(Some(GroupId(StrBytes::from_static_str("raw"))))
            .with_member_id(Some(StrBytes::from_static_str("m1")))
            .with_share_session_epoch(0)
            .with_max_wait_ms(2000)
            .with_max_bytes(1 << 20)
            .with_max_records(2)
            .with_topics(vec![
                FetchTopic::default()
                    .with_topic_id(topic_id)
                    .with_partitions(vec![FetchPartition::default().with_partition_index(0)]),
            ]),
    )
    .await;
    assert_eq!(fetched.error_code, 0, "{fetched:?}");
    assert_eq!(fetched.acquisition_lock_timeout_ms, 30_000);
    let p = &fetched.responses[0].partitions[0];
    let acquired: Vec<(i64, i64, i16)> = p
        .acquired_records
        .iter()
        .map(|a| (a.first_offset, a.last_offset, a.delivery_count))
        .collect();
    // Whole stored batches, as Kafka acquires by default (`MaxRecords` a soft limit): the
    // three records were published as one batch, so all three, not two.
    assert_eq!(acquired, vec![(0, 2, 1)], "the whole batch, delivery 1");
    let batches = p.records.clone().expect("the stored batch");
    let mut decoded = 0;
    for (header, batch) in felix_wire::BatchIter::new(&batches, usize::MAX).flatten() {
        assert_eq!(
            header.base_offset, 0,
            "sent as stored, from its base offset"
        );
        decoded += felix_wire::DecodedBatch::decode(batch, 1 << 20)
            .expect("a valid batch")
            .records
            .len();
    }
    assert_eq!(decoded, 3, "one stored batch of three records");

    // A wrong epoch: refused whole, its acknowledgement not applied.
    let (top, _) = acknowledge(&mut s, topic_id, 5, vec![ack_batch(0, 1, 1)]).await;
    assert_eq!(top, ResponseError::InvalidShareSessionEpoch.code());
    assert_eq!(acked().await, 0, "nothing applied");
    // A batch whose offsets run backwards, and one with an unknown type.
    let (top, partition) = acknowledge(&mut s, topic_id, 1, vec![ack_batch(1, 0, 1)]).await;
    assert_eq!((top, partition), (0, ResponseError::InvalidRequest.code()));
    let (_, partition) = acknowledge(&mut s, topic_id, 2, vec![ack_batch(0, 1, 9)]).await;
    assert_eq!(partition, ResponseError::InvalidRequest.code());
    assert_eq!(acked().await, 0, "nothing applied");
    // Offset 5 was never acquired by this member.
    let (_, partition) = acknowledge(&mut s, topic_id, 3, vec![ack_batch(5, 5, 1)]).await;
    assert_eq!(partition, ResponseError::InvalidRecordState.code());
    assert_eq!(acked().await, 0, "nothing applied");
    // The good one, applied once; accepting again is not.
    let (_, partition) = acknowledge(&mut s, topic_id, 4, vec![ack_batch(0, 1, 1)]).await;
    assert_eq!(partition, 0);
    assert_eq!(acked().await, 2);
    let (_, partition) = acknowledge(&mut s, topic_id, 5, vec![ack_batch(0, 0, 1)]).await;
    assert_eq!(partition, ResponseError::InvalidRecordState.code());
    assert_eq!(acked().await, 2);
    share_group_offsets_are_the_felix_groups_positions(&mut s, topic_id).await;

    // ShareGroupDescribe: the member, its subscription and assignment; after it leaves
    // (epoch -1) the group has no member here.
    let g = describe_raw(&mut s).await;
    assert_eq!(g.error_code, 0, "{g:?}");
    assert_eq!(g.group_state.as_str(), "Stable");
    assert_eq!(g.members.len(), 1, "{g:?}");
    let m = &g.members[0];
    assert_eq!(m.member_id.as_str(), "m1");
    assert_eq!(m.member_epoch, joined.member_epoch);
    assert_eq!(m.client_id.as_str(), "raw");
    assert_eq!(m.subscribed_topic_names[0].as_str(), "share-raw");
    let assigned = &m.assignment.topic_partitions[0];
    assert_eq!(
        (
            assigned.topic_id,
            assigned.topic_name.as_str(),
            &assigned.partitions[..]
        ),
        (topic_id, "share-raw", &[0][..])
    );
    let left: ShareGroupHeartbeatResponse = call(
        &mut s,
        ApiKey::ShareGroupHeartbeat,
        1,
        &ShareGroupHeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("raw")))
            .with_member_id(StrBytes::from_static_str("m1"))
            .with_member_epoch(-1),
    )
    .await;
    assert_eq!((left.error_code, left.member_epoch), (0, -1));
    let g = describe_raw(&mut s).await;
    assert_eq!(g.error_code, ResponseError::GroupIdNotFound.code(), "{g:?}");

    // A share group's coordinator is found as any group's; KIP-932's share-state
    // coordinator (key type 2) is Kafka-broker-internal and refused.
    for (key_type, key, code) in [
        (0, "raw", 0),
        (2, "raw:topic:0", ResponseError::InvalidRequest.code()),
    ] {
        let found: FindCoordinatorResponse = call(
            &mut s,
            ApiKey::FindCoordinator,
            4,
            &FindCoordinatorRequest::default()
                .with_key_type(key_type)
                .with_coordinator_keys(vec![StrBytes::from_static_str(key)]),
        )
        .await;
        assert_eq!(found.coordinators[0].error_code, code, "{found:?}");
    }
}

/// What `kafka_share.py split` of `count` records (delivery limit 3) must show: no
/// acknowledgement failed, both consumers accepted records, each record accepted exactly
/// once, each released one again as delivery 2, each rejected one and the poison record
/// dead-lettered once with their headers naming `topic`. Returns the accepted and the rejected records.
///
/// `both_consumers`: whether each consumer must have accepted some. Nothing promises a
/// consumer a share (every consumer may receive from every shard, first come), so this holds
/// only where the records outlast one consumer's first polls (1,000 on one broker); on a
/// loaded cluster one consumer can take 300 records before the other's first fetch answers.
fn assert_split(
    out: &Value,
    topic: &str,
    count: u64,
    both_consumers: bool,
) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let errors = out["errors"].as_array().expect("errors");
    assert!(errors.is_empty(), "no acknowledgement failed: {errors:?}");
    let entries = |v: &Value| -> Vec<(u64, u64, u64, u64)> {
        v.as_array()
            .expect("entries")
            .iter()
            .map(|e| {
                let n = |i: usize| e[i].as_u64().expect("number");
                (n(0), n(1), n(2), n(3))
            })
            .collect()
    };
    let by_consumer: Vec<Vec<(u64, u64, u64, u64)>> =
        (0..2).map(|c| entries(&out["accepted"][c])).collect();
    for (c, accepted) in by_consumer.iter().enumerate() {
        assert!(
            !both_consumers || !accepted.is_empty(),
            "consumer {c} accepted none: the records were not split"
        );
    }
    // Each record accepted exactly once, across both consumers.
    let mut accepted: BTreeMap<u64, u32> = BTreeMap::new();
    for (_, _, i, _) in by_consumer.iter().flatten() {
        *accepted.entry(*i).or_default() += 1;
    }
    let twice: Vec<_> = accepted.iter().filter(|(_, n)| **n > 1).collect();
    // Where each was accepted (consumer, partition, offset, delivery count): the same
    // offset twice is the share group's fault; two offsets, a record stored twice.
    let places: Vec<_> = by_consumer
        .iter()
        .enumerate()
        .flat_map(|(c, a)| a.iter().map(move |e| (c, e)))
        .filter(|(_, (_, _, i, _))| accepted.get(i).is_some_and(|n| *n > 1))
        .map(|(c, (p, o, i, d))| (*i, c, *p, *o, *d))
        .collect();
    assert!(
        twice.is_empty(),
        "records accepted more than once: {twice:?}; where (index, consumer, partition, \
         offset, delivery count): {places:?}; errors: {}",
        out["errors"]
    );
    let rejected: BTreeSet<u64> = (0..count).filter(|i| i % 100 == 13).collect();
    let poison = count - 1;
    let want: BTreeSet<u64> = (0..count)
        .filter(|i| !rejected.contains(i) && *i != poison)
        .collect();
    let got: BTreeSet<u64> = accepted.keys().copied().collect();
    assert_eq!(
        got.len(),
        want.len(),
        "missing: {:?}",
        want.difference(&got).collect::<Vec<_>>()
    );
    assert_eq!(got, want);
    // Released on the first delivery, accepted on the second (by either consumer).
    let released = entries(&out["released"]);
    assert_eq!(released.len() as u64, count / 100, "{released:?}");
    for (_, _, i, dc) in &released {
        assert_eq!(*dc, 1, "record {i} released on its first delivery");
        let again = by_consumer
            .iter()
            .flatten()
            .find(|e| e.2 == *i)
            .expect("a released record is redelivered");
        assert_eq!(again.3, 2, "record {i} came again as delivery 2");
    }
    let seen_rejected: BTreeSet<u64> = entries(&out["rejected"]).iter().map(|e| e.2).collect();
    assert_eq!(seen_rejected, rejected, "each rejected record seen once");
    let poisoned: Vec<u64> = out["poisoned"]
        .as_array()
        .expect("poisoned")
        .iter()
        .map(|v| v.as_u64().expect("delivery count"))
        .collect();
    assert_eq!(poisoned, vec![1, 2, 3], "the poison record: 3 deliveries");
    // The dead letters: each rejected record and the exhausted one, once.
    let dead = out["dead_letters"].as_array().expect("dead letters");
    let mut keys: Vec<String> = dead
        .iter()
        .map(|d| d["key"].as_str().expect("key").to_owned())
        .collect();
    keys.sort();
    let mut want_keys: Vec<String> = rejected
        .iter()
        .chain([&poison])
        .map(|i| format!("k-{i}"))
        .collect();
    want_keys.sort();
    assert_eq!(keys, want_keys, "dead letters, once each");
    for d in dead {
        let h = &d["headers"];
        assert_eq!(h["felix-dlq-group"], "billing", "{d}");
        assert_eq!(
            h["felix-dlq-stream"],
            format!("{TENANT}/{NS}/{topic}"),
            "{d}"
        );
        if d["key"] == format!("k-{poison}") {
            assert_eq!(h["felix-dlq-attempts"], "3", "{d}");
            assert!(h.get("felix-dlq-reason").is_none(), "{d}");
        } else {
            assert_eq!(
                h["felix-dlq-reason"], "rejected by a Kafka share consumer",
                "{d}"
            );
        }
    }
    (want, rejected)
}

/// Share consumers on a 3-broker cluster, on a 3-replica Quorum stream (the group's
/// progress replicated with each shard): the group's coordinator is one broker, the
/// partitions are led by several, and each ShareFetch goes to a partition's leader, whose
/// Felix group state serves it. Two consumers still accept each record exactly once, and
/// dead letters (published across brokers) land once. The group's coordinator-only
/// requests sent to another broker get `NOT_COORDINATOR`. Then, on the same cluster, a classic
/// group outlives its coordinator's broker (`kafka_group_failover.rs`, the last step: it
/// kills a broker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_consumers_on_a_cluster_fetch_from_each_partition_leader() {
    const COUNT: u64 = 300;
    let mut cluster = super::cluster::Cluster::start(3).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    // default/default may exist already (docs/kafka.md): either way is fine.
    for r in [
        client.create_tenant(TENANT).await,
        client.create_namespace(TENANT, NS).await,
    ] {
        if let Err(e) = r {
            assert_eq!(e.code(), Some(felix_client::codes::ALREADY_EXISTS), "{e}");
        }
    }
    for (name, shards) in [("spread", 3), ("spread-dlq", 1)] {
        client
            .create_stream(
                TENANT,
                NS,
                name,
                StreamConfig {
                    durable: Some(true),
                    shards: Some(shards),
                    replicas: Some(3),
                    consistency: Some("quorum".into()),
                    ..Default::default()
                },
            )
            .await
            .expect("create stream");
    }
    let topology = client
        .topology(TENANT, NS, "spread")
        .await
        .expect("topology");
    let leaders: BTreeSet<u64> = topology.shards.iter().filter_map(|s| s.leader).collect();
    assert!(
        leaders.len() > 1,
        "partitions led by several brokers: {topology:?}"
    );
    share_group(
        &client,
        "spread",
        "billing",
        30_000,
        3,
        Some("spread-dlq"),
        GroupStart::Latest,
    )
    .await;
    let out = python_script(
        "kafka_share.py",
        &[
            "split",
            &cluster.brokers[0].kafka_addr.to_string(),
            "spread",
            "billing",
            &COUNT.to_string(),
            "spread-dlq",
            "--limit",
            "3",
        ],
    )
    .await;
    assert_split(&out, "spread", COUNT, false);
    super::kafka_share_offsets::share_group_requests_to_a_broker_not_coordinating_the_group_get_not_coordinator(
        &cluster.brokers,
        "spread",
        "billing",
    )
    .await;
    super::kafka_group_failover::classic_group_resumes_from_its_commits_after_its_coordinator_is_killed(
        &mut cluster,
        &client,
        TENANT,
        NS,
    )
    .await;
}
