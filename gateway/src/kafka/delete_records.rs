//! DeleteRecords: a partition's records below an offset are deleted by raising its shard's
//! retention floor on both tiers (`Broker::delete_records`, crate::delete_records).
//!
//! Decides the answers: the partition's low watermark afterwards (on a tiered stream it can
//! stop at the start of the batch holding the offset: see crate::delete_records), `-1` for
//! the high watermark, `OFFSET_OUT_OF_RANGE` past the high watermark or for any other
//! negative offset, `NOT_LEADER_OR_FOLLOWER` on a broker that does not lead the shard.
//! Deleting is `stream.manage` on the topic (Kafka asks DELETE on it), checked per topic
//! before anything else.

use felix_meta::auth::Action;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};

use super::Kafka;
use super::errors::kafka_error;
use super::scope::{On, Scope};
use super::topics::resolve;

/// Kafka's "up to the high watermark".
const HIGH_WATERMARK: i64 = -1;

/// Serves a DeleteRecords request.
pub async fn delete_records(
    kafka: &Kafka,
    scope: &Scope,
    request: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let shape = match scope.allow(kafka, Action::StreamManage, &topic.name, On::Topic) {
            Ok(()) => resolve(kafka, scope, &topic.name, false).await,
            Err(e) => Err(e),
        };
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in topic.partitions {
            let answer = match &shape {
                Ok(shape) => match u32::try_from(p.partition_index)
                    .ok()
                    .filter(|k| *k < shape.shards)
                {
                    Some(shard) => delete_below(kafka, scope, &shape.name, shard, p.offset).await,
                    None => Err(ResponseError::UnknownTopicOrPartition),
                },
                Err(e) => Err(*e),
            };
            let base =
                DeleteRecordsPartitionResult::default().with_partition_index(p.partition_index);
            partitions.push(match answer {
                Ok(low) => base.with_low_watermark(low),
                Err(e) => base.with_low_watermark(-1).with_error_code(e.code()),
            });
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(topic.name)
                .with_partitions(partitions),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

async fn delete_below(
    kafka: &Kafka,
    scope: &Scope,
    stream: &str,
    shard: u32,
    offset: i64,
) -> Result<i64, ResponseError> {
    let below = match offset {
        HIGH_WATERMARK => None,
        o if o < 0 => return Err(ResponseError::OffsetOutOfRange),
        o => Some(o as u64),
    };
    kafka
        .broker
        .delete_records(&scope.tenant, &scope.namespace, stream, shard, below)
        .await
        .map(|low| low as i64)
        .map_err(|e| kafka_error(&e))
}
