//! Topics: which streams a Kafka client sees and how it creates and deletes them.
//!
//! Decides the mapping: a topic is a *durable* stream of the connection's tenant and namespace
//! ([`Scope`]),
//! its partitions are the stream's shards, and this broker leads them all. An ephemeral
//! stream keeps no log a consumer could read by offset, so it is not a topic: it is left out
//! of a full listing and named explicitly it is `INVALID_TOPIC_EXCEPTION`. Unknown topics
//! are created (durable, `kafka_default_partitions` partitions) on Metadata and Produce when
//! auto-creation is on and the caller may create it (`stream.manage`), as Kafka's
//! `auto.create.topics.enable` does. Describing a topic needs any grant on it, a listing
//! shows only the topics the caller may see, and creating or deleting one needs
//! `stream.manage` on it, each checked before any work.

use std::net::SocketAddr;

use felix_wire::protocol::{ErrorBody, StreamConfig, codes};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::Kafka;
use super::errors::kafka_error;
use super::scope::{On, Scope};
use crate::broker::StreamShape;
use felix_meta::auth::Action;

/// Reported as the cluster id.
const CLUSTER_ID: &str = "felix";

/// A hot-retention setting meaning "no limit" (docs/protocol.md).
const HOT_UNLIMITED: u64 = u64::MAX;

/// This broker's id as Kafka's 32-bit broker id.
pub fn broker_id(kafka: &Kafka) -> BrokerId {
    BrokerId(i32::try_from(kafka.broker.broker_id()).unwrap_or(i32::MAX))
}

/// A stable, non-nil topic id derived from the stream's place and name (FNV-1a, two seeds).
/// Felix keeps no per-stream id; a stream deleted and created again keeps its topic id.
pub fn topic_id(tenant: &str, namespace: &str, name: &str) -> Uuid {
    let hash = |seed: u64| {
        let mut h = seed;
        for b in tenant
            .bytes()
            .chain([0])
            .chain(namespace.bytes())
            .chain([0])
            .chain(name.bytes())
        {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    };
    let id =
        (u128::from(hash(0xcbf2_9ce4_8422_2325)) << 64) | u128::from(hash(0x6c62_272e_07bb_0142));
    Uuid::from_u128(id.max(1))
}

/// The durable streams of the scope's namespace (its Kafka topics) and their partition
/// counts; none when the namespace cannot be read.
pub fn durable_topics(kafka: &Kafka, scope: &Scope) -> Vec<(String, u32)> {
    kafka
        .broker
        .stream_shapes(&scope.tenant, &scope.namespace)
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.durable)
        .map(|s| (s.name, s.shards))
        .collect()
}

/// Kafka's topic-name rule intersected with Felix's stream-name rule.
pub fn valid_topic_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= felix_meta::model::MAX_NAME_LEN
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The stream behind a topic in `scope`. With `create`, an unknown topic is created first if
/// the listener auto-creates topics and the caller may create it.
pub async fn resolve(
    kafka: &Kafka,
    scope: &Scope,
    name: &str,
    create: bool,
) -> Result<StreamShape, ResponseError> {
    if !valid_topic_name(name) {
        return Err(ResponseError::InvalidTopicException);
    }
    let s = &kafka.settings;
    let (tenant, namespace) = (&scope.tenant, &scope.namespace);
    let shape = match kafka.broker.stream_shape(tenant, namespace, name) {
        Ok(shape) => shape,
        Err(e)
            if e.code == codes::UNKNOWN_STREAM
                && create
                && s.auto_create_topics
                && scope.may(kafka, Action::StreamManage, name) =>
        {
            let config = StreamConfig {
                durable: Some(true),
                shards: Some(s.default_partitions),
                ..StreamConfig::default()
            };
            match kafka
                .broker
                .create_stream(tenant, namespace, name, config)
                .await
            {
                // Created by someone else meanwhile: use theirs.
                Ok(_) => {}
                Err(e) if e.code == codes::ALREADY_EXISTS && e.reason == "already_exists" => {}
                Err(e) => return Err(create_error(&e)),
            }
            kafka
                .broker
                .stream_shape(tenant, namespace, name)
                .map_err(|e| kafka_error(&e))?
        }
        Err(e) => return Err(kafka_error(&e)),
    };
    if !shape.durable {
        return Err(ResponseError::InvalidTopicException);
    }
    Ok(shape)
}

/// How a refused CreateStream reads to a Kafka client.
fn create_error(e: &ErrorBody) -> ResponseError {
    match (e.code, e.reason.as_str()) {
        (codes::ALREADY_EXISTS, _) => ResponseError::TopicAlreadyExists,
        (codes::INVALID_ARGUMENT, _) => ResponseError::InvalidConfig,
        (codes::METADATA_UNAVAILABLE, _) => ResponseError::RequestTimedOut,
        _ => kafka_error(e),
    }
}

fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

fn topic_name(s: &str) -> TopicName {
    TopicName(str_bytes(s))
}

/// A topic's metadata entry: one partition per shard, led by this broker on a single node
/// and by each shard's leader in a cluster.
fn topic_entry(kafka: &Kafka, scope: &Scope, shape: &StreamShape) -> MetadataResponseTopic {
    let me = broker_id(kafka);
    let s = scope;
    let routes = kafka
        .broker
        .partition_routes(&s.tenant, &s.namespace, &shape.name, shape.shards);
    let id = |b: u64| BrokerId(i32::try_from(b).unwrap_or(i32::MAX));
    let partitions = (0..shape.shards)
        .map(|p| {
            let partition = MetadataResponsePartition::default().with_partition_index(p as i32);
            match routes.as_ref().and_then(|r| r.get(p as usize)) {
                None => partition
                    .with_leader_id(me)
                    // Unknown: clients then skip leader-epoch fencing, which a single
                    // leader does not need.
                    .with_leader_epoch(-1)
                    .with_replica_nodes(vec![me])
                    .with_isr_nodes(vec![me]),
                Some(route) => {
                    let partition = partition
                        .with_leader_epoch(i32::try_from(route.generation).unwrap_or(-1))
                        .with_replica_nodes(route.replicas.iter().map(|b| id(*b)).collect())
                        .with_isr_nodes(route.in_sync.iter().map(|b| id(*b)).collect());
                    match route.leader {
                        Some(leader) => partition.with_leader_id(id(leader)),
                        // No live leader (a Leader stream waiting for its broker, or a
                        // failover under way): the client retries after a refresh.
                        None => partition
                            .with_leader_id(BrokerId(-1))
                            .with_error_code(ResponseError::LeaderNotAvailable.code()),
                    }
                }
            }
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(topic_name(&shape.name)))
        .with_topic_id(topic_id(&s.tenant, &s.namespace, &shape.name))
        .with_partitions(partitions)
}

fn topic_error(name: Option<&str>, error: ResponseError) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(name.map(topic_name))
        .with_error_code(error.code())
}

/// Metadata: this broker, and the requested topics (all of them when none are named).
/// `advertised` is the address the client reached this listener on.
pub async fn metadata(
    kafka: &Kafka,
    scope: &Scope,
    request: MetadataRequest,
    version: i16,
    advertised: SocketAddr,
) -> MetadataResponse {
    let s = scope;
    let me = broker_id(kafka);
    let brokers = match kafka.broker.kafka_brokers() {
        // A cluster: every broker with a Kafka listener, at the address it registered.
        Some(all) => all
            .into_iter()
            .filter_map(|(id, addr, _)| {
                let addr: SocketAddr = addr?.parse().ok()?;
                Some(
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(i32::try_from(id).ok()?))
                        .with_host(str_bytes(&addr.ip().to_string()))
                        .with_port(i32::from(addr.port())),
                )
            })
            .collect(),
        None => vec![
            MetadataResponseBroker::default()
                .with_node_id(me)
                .with_host(str_bytes(&advertised.ip().to_string()))
                .with_port(i32::from(advertised.port())),
        ],
    };
    // Kafka's rule: before v4 a Metadata request may always create topics.
    let create = version < 4 || request.allow_auto_topic_creation;
    let requested = match request.topics {
        None => None,
        // v0 has no null: an empty list means every topic.
        Some(t) if t.is_empty() && version == 0 => None,
        Some(t) => Some(t),
    };
    let topics = match requested {
        None => match kafka.broker.stream_shapes(&s.tenant, &s.namespace) {
            Ok(shapes) => shapes
                .iter()
                .filter(|shape| shape.durable && scope.can_view(kafka, &shape.name))
                .map(|shape| topic_entry(kafka, scope, shape))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e.message, "Kafka metadata: cannot list the namespace's streams");
                Vec::new()
            }
        },
        Some(requested) => {
            let mut out = Vec::with_capacity(requested.len());
            for t in requested {
                let Some(name) = t.name else {
                    // A topic named by id only (v10+): look it up among ours.
                    out.push(by_id(kafka, scope, t.topic_id));
                    continue;
                };
                let described = match scope.allow_view(kafka, &name, On::Topic) {
                    Ok(()) => resolve(kafka, scope, &name, create).await,
                    Err(e) => Err(e),
                };
                out.push(match described {
                    Ok(shape) => topic_entry(kafka, scope, &shape),
                    Err(error) => topic_error(Some(&name), error),
                });
            }
            out
        }
    };
    let mut response = MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(str_bytes(CLUSTER_ID)))
        .with_controller_id(me)
        .with_topics(topics);
    if (8..=10).contains(&version) && request.include_cluster_authorized_operations {
        // No ACLs yet: every operation is allowed (bits 2..=12, as Kafka encodes them).
        response = response.with_cluster_authorized_operations(0x1ffc);
    }
    response
}

/// The durable topic whose id is `id`, or `UNKNOWN_TOPIC_ID`.
fn by_id(kafka: &Kafka, scope: &Scope, id: Uuid) -> MetadataResponseTopic {
    let s = scope;
    let found = kafka
        .broker
        .stream_shapes(&s.tenant, &s.namespace)
        .unwrap_or_default()
        .into_iter()
        .find(|shape| {
            shape.durable
                && topic_id(&s.tenant, &s.namespace, &shape.name) == id
                && scope.can_view(kafka, &shape.name)
        });
    match found {
        Some(shape) => topic_entry(kafka, scope, &shape),
        None => topic_error(None, ResponseError::UnknownTopicId).with_topic_id(id),
    }
}

/// Topic configs (Kafka names) as stream settings. Unknown or unsupported configs are an
/// error naming the config, never silently dropped.
pub fn stream_config(
    configs: &[(String, Option<String>)],
) -> Result<StreamConfig, (ResponseError, String)> {
    let mut c = StreamConfig::default();
    let invalid = |name: &str, value: &str, why: &str| {
        (
            ResponseError::InvalidConfig,
            format!("topic config {name}={value:?}: {why}"),
        )
    };
    for (name, value) in configs {
        let value = value.as_deref().unwrap_or("");
        let number = || -> Result<i64, (ResponseError, String)> {
            value
                .trim()
                .parse::<i64>()
                .map_err(|_| invalid(name, value, "not a number"))
        };
        match name.as_str() {
            // Kafka: -1 keeps forever; Felix: 0 is no limit.
            "retention.ms" | "retention.bytes" => {
                let v = match number()? {
                    -1 => 0,
                    n if n > 0 => n as u64,
                    _ => return Err(invalid(name, value, "must be -1 or positive")),
                };
                if name == "retention.ms" {
                    c.retention_ms = Some(v);
                } else {
                    c.retention_bytes = Some(v);
                }
            }
            // Kafka's tiered storage: the local copy. -2 follows retention.*, -1 keeps
            // forever, 0 keeps nothing already uploaded.
            "local.retention.ms" | "local.retention.bytes" => {
                let v = match number()? {
                    -2 => None,
                    -1 => Some(HOT_UNLIMITED),
                    n if n >= 0 => Some(n as u64),
                    _ => return Err(invalid(name, value, "must be -2, -1 or at least 0")),
                };
                if name == "local.retention.ms" {
                    c.hot_retention_ms = v;
                } else {
                    c.hot_retention_bytes = v;
                }
            }
            "segment.bytes" | "segment.ms" => {
                let n = number()?;
                if n <= 0 {
                    return Err(invalid(name, value, "must be positive"));
                }
                if name == "segment.bytes" {
                    c.segment_bytes = Some(n as u64);
                } else {
                    c.segment_ms = Some(n as u64);
                }
            }
            "remote.storage.enable" => {
                c.tiered = Some(match value.trim() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(invalid(name, value, "must be true or false")),
                });
            }
            "cleanup.policy" if value.trim() == "delete" => {}
            "cleanup.policy" => {
                return Err(invalid(
                    name,
                    value,
                    "only delete is supported (Felix does not compact topics)",
                ));
            }
            _ => return Err(invalid(name, value, "not supported by Felix")),
        }
    }
    Ok(c)
}

/// A stream's settings as Kafka topic configs.
pub fn topic_configs(c: &StreamConfig) -> Vec<(&'static str, String)> {
    let total = |v: Option<u64>| match v {
        None | Some(0) => "-1".to_owned(),
        Some(n) => n.to_string(),
    };
    let hot = |v: Option<u64>| match v {
        None | Some(HOT_UNLIMITED) => "-1".to_owned(),
        Some(n) => n.to_string(),
    };
    vec![
        ("cleanup.policy", "delete".to_owned()),
        ("retention.ms", total(c.retention_ms)),
        ("retention.bytes", total(c.retention_bytes)),
        ("local.retention.ms", hot(c.hot_retention_ms)),
        ("local.retention.bytes", hot(c.hot_retention_bytes)),
        (
            "segment.bytes",
            c.segment_bytes.map_or("-1".into(), |v| v.to_string()),
        ),
        (
            "segment.ms",
            c.segment_ms.map_or("-1".into(), |v| v.to_string()),
        ),
        (
            "remote.storage.enable",
            c.tiered.unwrap_or(false).to_string(),
        ),
    ]
}

/// CreateTopics: each topic becomes a durable stream.
pub async fn create_topics(
    kafka: &Kafka,
    scope: &Scope,
    request: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let settings = &kafka.settings;
    let s = scope;
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.to_string();
        let fail = |error: ResponseError, message: String| {
            CreatableTopicResult::default()
                .with_name(topic.name.clone())
                .with_error_code(error.code())
                .with_error_message(Some(StrBytes::from_string(message)))
        };
        if !valid_topic_name(&name) {
            results.push(fail(
                ResponseError::InvalidTopicException,
                format!(
                    "topic name {name:?} must be 1-{} characters of [A-Za-z0-9._-]",
                    felix_meta::model::MAX_NAME_LEN
                ),
            ));
            continue;
        }
        if let Err(error) = scope.allow(kafka, Action::StreamManage, &name, On::Topic) {
            results.push(fail(error, format!("not allowed to create topic {name:?}")));
            continue;
        }
        let partitions = match topic.num_partitions {
            -1 => settings.default_partitions,
            n if n > 0 => n as u32,
            n => {
                results.push(fail(
                    ResponseError::InvalidPartitions,
                    format!("{n} partitions: a topic needs at least one"),
                ));
                continue;
            }
        };
        if !topic.assignments.is_empty() {
            results.push(fail(
                ResponseError::InvalidReplicaAssignment,
                "manual replica assignment is not supported: this broker leads every partition"
                    .to_owned(),
            ));
            continue;
        }
        let configs: Vec<(String, Option<String>)> = topic
            .configs
            .iter()
            .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string())))
            .collect();
        let mut config = match stream_config(&configs) {
            Ok(c) => c,
            Err((error, message)) => {
                results.push(fail(error, message));
                continue;
            }
        };
        config.durable = Some(true);
        config.shards = Some(partitions);
        if topic.replication_factor > 0 {
            config.replicas = Some(topic.replication_factor as u32);
        }
        if request.validate_only {
            let exists = kafka
                .broker
                .stream_shape(&s.tenant, &s.namespace, &name)
                .is_ok();
            results.push(if exists {
                fail(
                    ResponseError::TopicAlreadyExists,
                    format!("topic {name:?} already exists"),
                )
            } else {
                CreatableTopicResult::default()
                    .with_name(topic.name.clone())
                    .with_num_partitions(partitions as i32)
                    .with_replication_factor(topic.replication_factor.max(1))
            });
            continue;
        }
        match kafka
            .broker
            .create_stream(&s.tenant, &s.namespace, &name, config)
            .await
        {
            Ok(info) => {
                let mut result = CreatableTopicResult::default()
                    .with_name(topic.name.clone())
                    .with_num_partitions(info.config.shards.unwrap_or(partitions) as i32)
                    .with_replication_factor(info.config.replicas.unwrap_or(1) as i16);
                if version >= 7 {
                    result = result.with_topic_id(topic_id(&s.tenant, &s.namespace, &name));
                }
                if version >= 5 {
                    let configs = topic_configs(&info.config)
                        .into_iter()
                        .map(|(k, v)| {
                            CreatableTopicConfigs::default()
                                .with_name(StrBytes::from_static_str(k))
                                .with_value(Some(StrBytes::from_string(v)))
                                // DYNAMIC_TOPIC_CONFIG: set on the topic.
                                .with_config_source(1)
                        })
                        .collect();
                    result = result.with_configs(Some(configs));
                }
                results.push(result);
            }
            Err(e) => {
                let error = match e.code {
                    codes::INVALID_ARGUMENT if e.message.contains("replica") => {
                        ResponseError::InvalidReplicationFactor
                    }
                    _ => create_error(&e),
                };
                results.push(fail(error, e.message));
            }
        }
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// DeleteTopics: by name (v1-5) or by name or id (v6).
pub async fn delete_topics(
    kafka: &Kafka,
    scope: &Scope,
    request: DeleteTopicsRequest,
    version: i16,
) -> DeleteTopicsResponse {
    let s = scope;
    let targets: Vec<(Option<String>, Uuid)> = if version >= 6 {
        request
            .topics
            .into_iter()
            .map(|t| (t.name.map(|n| n.to_string()), t.topic_id))
            .collect()
    } else {
        request
            .topic_names
            .into_iter()
            .map(|n| (Some(n.to_string()), Uuid::nil()))
            .collect()
    };
    let mut results = Vec::with_capacity(targets.len());
    for (name, id) in targets {
        let name = match name {
            Some(n) => Some(n),
            None => kafka
                .broker
                .stream_shapes(&s.tenant, &s.namespace)
                .unwrap_or_default()
                .into_iter()
                .find(|shape| {
                    topic_id(&s.tenant, &s.namespace, &shape.name) == id
                        && scope.can_view(kafka, &shape.name)
                })
                .map(|shape| shape.name),
        };
        let mut result = DeletableTopicResult::default().with_name(name.as_deref().map(topic_name));
        if version >= 6 {
            result = result.with_topic_id(id);
        }
        let Some(name) = name else {
            results.push(result.with_error_code(ResponseError::UnknownTopicId.code()));
            continue;
        };
        let outcome = match scope
            .allow(kafka, Action::StreamManage, &name, On::Topic)
            .map(|()| kafka.broker.stream_shape(&s.tenant, &s.namespace, &name))
        {
            Err(error) => Err(error),
            Ok(Ok(shape)) if !shape.durable => Err(ResponseError::UnknownTopicOrPartition),
            Ok(Ok(_)) => kafka
                .broker
                .delete_stream(&s.tenant, &s.namespace, &name)
                .await
                .map_err(|e| kafka_error(&e)),
            Ok(Err(e)) => Err(kafka_error(&e)),
        };
        if let Err(error) = outcome {
            result = result.with_error_code(error.code());
            if version >= 5 {
                result = result.with_error_message(Some(StrBytes::from_string(format!(
                    "cannot delete topic {name:?}: {error}"
                ))));
            }
        }
        results.push(result);
    }
    DeleteTopicsResponse::default().with_responses(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_ids_are_stable_and_distinct() {
        let a = topic_id("default", "default", "orders");
        assert_eq!(a, topic_id("default", "default", "orders"));
        assert_ne!(a, topic_id("default", "default", "orders2"));
        assert_ne!(a, topic_id("default", "defaul", "torders"));
        assert!(!a.is_nil());
    }

    #[test]
    fn kafka_topic_configs_map_to_stream_settings() {
        let cfg = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Some(v.to_string())))
                .collect::<Vec<_>>()
        };
        let c = stream_config(&cfg(&[
            ("retention.ms", "-1"),
            ("retention.bytes", "1000"),
            ("local.retention.bytes", "0"),
            ("local.retention.ms", "-1"),
            ("segment.bytes", "4096"),
            ("remote.storage.enable", "true"),
            ("cleanup.policy", "delete"),
        ]))
        .expect("valid");
        assert_eq!(c.retention_ms, Some(0));
        assert_eq!(c.retention_bytes, Some(1000));
        assert_eq!(c.hot_retention_bytes, Some(0));
        assert_eq!(c.hot_retention_ms, Some(HOT_UNLIMITED));
        assert_eq!(c.segment_bytes, Some(4096));
        assert_eq!(c.tiered, Some(true));
        let (e, msg) = stream_config(&cfg(&[("cleanup.policy", "compact")])).expect_err("compact");
        assert_eq!(e, ResponseError::InvalidConfig);
        assert!(msg.contains("compact"), "{msg}");
        let (_, msg) = stream_config(&cfg(&[("flush.ms", "1")])).expect_err("unknown");
        assert!(msg.contains("flush.ms"), "{msg}");
        let back = topic_configs(&c);
        assert!(back.contains(&("retention.ms", "-1".to_owned())));
        assert!(back.contains(&("local.retention.bytes", "0".to_owned())));
    }

    #[test]
    fn topic_names_follow_both_rules() {
        assert!(valid_topic_name("orders.v1_eu-west"));
        assert!(!valid_topic_name(""));
        assert!(!valid_topic_name(".."));
        assert!(!valid_topic_name("a/b"));
        assert!(!valid_topic_name(&"x".repeat(200)));
    }
}
