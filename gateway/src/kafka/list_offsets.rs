//! ListOffsets: where a partition starts, where it ends, and which offset a time maps to.
//!
//! Decides the answers: `-2` (earliest) is the earliest offset either tier holds, `-1`
//! (latest) is the high watermark, and a timestamp is the first record stamped at or after
//! it, found by the tiers' time indexes (to the batch) and then within the batch (to the
//! record), as Kafka answers it. No record that new: offset and timestamp -1. `-3`
//! (max_timestamp, v7) is the first record stamped with the largest timestamp either tier
//! holds: the segments' and objects' largest timestamps name it, and the time lookup finds
//! it.

use felix_wire::DecodedBatch;
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{BatchHeader, BatchIter};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};

use super::Kafka;
use super::errors::kafka_error;
use super::scope::{On, Scope};
use super::topics::resolve;
use crate::shard::shard_key;
use felix_meta::auth::Action;

const EARLIEST: i64 = -2;
const LATEST: i64 = -1;
const MAX_TIMESTAMP: i64 = -3;

/// Serves a ListOffsets request.
///
/// Reading where a partition starts and ends is reading it: `stream.subscribe`, checked
/// per topic before it is resolved.
pub async fn list_offsets(
    kafka: &Kafka,
    scope: &Scope,
    request: ListOffsetsRequest,
) -> ListOffsetsResponse {
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let shape = match scope.allow(kafka, Action::StreamSubscribe, &topic.name, On::Topic) {
            Ok(()) => resolve(kafka, scope, &topic.name, false).await,
            Err(e) => Err(e),
        };
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in topic.partitions {
            let base = ListOffsetsPartitionResponse::default()
                .with_partition_index(p.partition_index)
                .with_leader_epoch(-1);
            let answer = match &shape {
                Ok(shape) => match u32::try_from(p.partition_index)
                    .ok()
                    .filter(|k| *k < shape.shards)
                {
                    Some(shard) => offset_for(kafka, scope, &shape.name, shard, p.timestamp).await,
                    None => Err(ResponseError::UnknownTopicOrPartition),
                },
                Err(e) => Err(*e),
            };
            partitions.push(match answer {
                Ok((offset, timestamp)) => base.with_offset(offset).with_timestamp(timestamp),
                Err(error) => base
                    .with_error_code(error.code())
                    .with_offset(-1)
                    .with_timestamp(-1),
            });
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

/// `(offset, timestamp)` for one partition and a ListOffsets timestamp.
async fn offset_for(
    kafka: &Kafka,
    scope: &Scope,
    stream: &str,
    shard: u32,
    timestamp: i64,
) -> Result<(i64, i64), ResponseError> {
    let key = shard_key(&scope.tenant, &scope.namespace, stream, shard);
    let broker = &kafka.broker;
    let bounds = broker.shard_bounds(&key).map_err(|e| kafka_error(&e))?;
    let timestamp = match timestamp {
        EARLIEST => return Ok((bounds.earliest as i64, -1)),
        LATEST => return Ok((bounds.high_watermark as i64, -1)),
        MAX_TIMESTAMP => match broker.max_timestamp(&key).map_err(|e| kafka_error(&e))? {
            t if t < 0 => return Ok((-1, -1)),
            t => t,
        },
        t if t < 0 => return Err(ResponseError::InvalidRequest),
        t => t,
    };
    let Some(batch_offset) = broker
        .offset_for_time(&key, timestamp)
        .await
        .map_err(|e| kafka_error(&e))?
    else {
        return Ok((-1, -1));
    };
    // The batch is known; find the record in it (and, if retention raced us, later ones).
    let mut offset = batch_offset.max(bounds.earliest);
    while offset < bounds.high_watermark {
        let read = broker
            .fetch(&key, offset, 1 << 20)
            .await
            .map_err(|e| kafka_error(&e))?;
        if read.batches.is_empty() {
            break;
        }
        for item in BatchIter::new(&read.batches, usize::MAX) {
            let Ok((h, bytes)) = item else { break };
            if let Some(found) = first_at_or_after(&h, bytes, offset, timestamp) {
                return Ok(found);
            }
        }
        offset = read.next_offset;
    }
    Ok((-1, -1))
}

/// The first user record of a batch at or after `from` stamped at or after `timestamp`.
fn first_at_or_after(
    h: &BatchHeader,
    bytes: &[u8],
    from: u64,
    timestamp: i64,
) -> Option<(i64, i64)> {
    if h.is_control() || h.max_timestamp < timestamp || (h.last_offset() as u64) < from {
        return None;
    }
    let batch = DecodedBatch::decode(bytes, DEFAULT_MAX_DECOMPRESSED).ok()?;
    batch
        .records
        .iter()
        .find(|r| r.offset as u64 >= from && r.timestamp >= timestamp)
        .map(|r| (r.offset, r.timestamp))
}
