//! DescribeProducers (v0): the idempotent producers a partition's leader knows, from the
//! shard's producer table (`crate::producers`), the same table that decides duplicates.
//!
//! Decides the answers: per partition, each producer's id, epoch and last sequence landed;
//! `last_timestamp` is -1 (the table keeps offsets and sequences, not times) and the
//! transaction fields are -1 (Felix has no transactions). A broker that does not lead the
//! shard answers `NOT_LEADER_OR_FOLLOWER`, an unknown topic or partition
//! `UNKNOWN_TOPIC_OR_PARTITION`. Reading producer state is `stream.subscribe` on the topic
//! (Kafka asks READ on it), checked per topic before anything else.

use felix_meta::auth::Action;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse, ProducerId};

use super::Kafka;
use super::errors::kafka_error;
use super::scope::{On, Scope};
use super::topics::resolve;
use crate::shard::shard_key;

/// What Kafka answers for a field nobody set.
const UNKNOWN: i64 = -1;

/// Serves a DescribeProducers request.
pub async fn describe_producers(
    kafka: &Kafka,
    scope: &Scope,
    request: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let shape = match scope.allow(kafka, Action::StreamSubscribe, &topic.name, On::Topic) {
            Ok(()) => resolve(kafka, scope, &topic.name, false).await,
            Err(e) => Err(e),
        };
        let mut partitions = Vec::with_capacity(topic.partition_indexes.len());
        for index in topic.partition_indexes {
            let answer = match &shape {
                Ok(shape) => match u32::try_from(index).ok().filter(|k| *k < shape.shards) {
                    Some(shard) => producers_of(kafka, scope, &shape.name, shard).await,
                    None => Err(ResponseError::UnknownTopicOrPartition),
                },
                Err(e) => Err(*e),
            };
            let base = PartitionResponse::default().with_partition_index(index);
            partitions.push(match answer {
                Ok(active) => base.with_active_producers(active),
                Err(e) => base.with_error_code(e.code()),
            });
        }
        topics.push(
            TopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions),
        );
    }
    DescribeProducersResponse::default().with_topics(topics)
}

/// The producers of one shard this broker leads.
async fn producers_of(
    kafka: &Kafka,
    scope: &Scope,
    stream: &str,
    shard: u32,
) -> Result<Vec<ProducerState>, ResponseError> {
    let key = shard_key(&scope.tenant, &scope.namespace, stream, shard);
    let (shard, _) = kafka.broker.shard(&key).map_err(|e| kafka_error(&e))?;
    let active = shard.producers.lock().await.active();
    Ok(active
        .into_iter()
        .map(|p| {
            ProducerState::default()
                .with_producer_id(ProducerId(p.producer_id))
                .with_producer_epoch(i32::from(p.epoch))
                .with_last_sequence(p.last_sequence)
                .with_last_timestamp(UNKNOWN)
                .with_coordinator_epoch(UNKNOWN as i32)
                .with_current_txn_start_offset(UNKNOWN)
        })
        .collect())
}
