//! Fetch: stored batches from either tier, long-polled.
//!
//! Decides what one Fetch answers and when: every requested partition is read through the
//! broker's pull path ([`crate::broker::Broker::fetch`], hot or cold, never past the high
//! watermark), whole stored batches only, at most `partition_max_bytes` per partition and
//! `max_bytes` in all, except that the first non-empty partition always gets at least one
//! batch (KIP-74) so a consumer cannot stall on a large batch. The answer goes out once
//! `min_bytes` are gathered, an error is met, or `max_wait_ms` has passed; until then the
//! request waits for any of its partitions' high watermarks to move. No fetch sessions: the
//! answer's session id 0 tells clients to send full requests. Each topic's
//! `stream.subscribe` is checked before it is resolved.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Kafka;
use super::errors::kafka_error;
use super::scope::{On, Scope};
use super::topics::resolve;
use crate::broker::StreamShape;
use crate::shard::shard_key;
use felix_meta::auth::Action;

/// The most one Fetch answers, whatever the client asks (Kafka's default
/// `fetch.max.bytes` is 50 MiB).
const MAX_RESPONSE_BYTES: usize = 64 << 20;
/// The longest a Fetch waits for `min_bytes`.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// One requested partition.
struct Wanted {
    topic: usize,
    partition: i32,
    offset: i64,
    max_bytes: usize,
}

/// Serves a Fetch request.
pub async fn fetch(
    kafka: &Kafka,
    scope: &Scope,
    request: FetchRequest,
    version: i16,
) -> FetchResponse {
    if version >= 7 && request.session_id != 0 {
        return FetchResponse::default()
            .with_error_code(ResponseError::FetchSessionIdNotFound.code())
            .with_session_id(0);
    }
    let deadline =
        Instant::now() + Duration::from_millis(request.max_wait_ms.max(0) as u64).min(MAX_WAIT);
    let min_bytes = request.min_bytes.max(0) as usize;
    let max_bytes = match request.max_bytes {
        n if n <= 0 => MAX_RESPONSE_BYTES,
        n => (n as usize).min(MAX_RESPONSE_BYTES),
    };
    // Topics are resolved once: a Fetch never creates one.
    let mut topics: Vec<(TopicName, Result<StreamShape, ResponseError>)> = Vec::new();
    let mut wanted = Vec::new();
    for t in request.topics {
        let shape = match scope.allow(kafka, Action::StreamSubscribe, &t.topic, On::Topic) {
            Ok(()) => resolve(kafka, scope, &t.topic, false).await,
            Err(e) => Err(e),
        };
        topics.push((t.topic, shape));
        for p in t.partitions {
            wanted.push(Wanted {
                topic: topics.len() - 1,
                partition: p.partition,
                offset: p.fetch_offset,
                max_bytes: p.partition_max_bytes.max(1) as usize,
            });
        }
    }
    loop {
        // Watch before reading, so a commit between the read and the wait still wakes us.
        let mut watches: Vec<watch::Receiver<u64>> = Vec::new();
        for w in &wanted {
            if let (_, Ok(shape)) = &topics[w.topic]
                && let Some(shard) = shard_of(shape, w.partition)
                && let Ok(rx) = kafka.broker.watch_high_watermark(&shard_key(
                    &scope.tenant,
                    &scope.namespace,
                    &shape.name,
                    shard,
                ))
            {
                watches.push(rx);
            }
        }
        let (partitions, total, failed) = read_all(kafka, scope, &topics, &wanted, max_bytes).await;
        if total >= min_bytes || failed || Instant::now() >= deadline || watches.is_empty() {
            return response(&topics, &wanted, partitions);
        }
        let changed =
            futures::future::select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
        match tokio::time::timeout_at(deadline, changed).await {
            Ok((Ok(()), _, _)) => continue,
            // A shard closed (stream deleted, broker stopping) or the time is up: answer.
            Ok((Err(_), _, _)) | Err(_) => {
                let (partitions, _, _) = read_all(kafka, scope, &topics, &wanted, max_bytes).await;
                return response(&topics, &wanted, partitions);
            }
        }
    }
}

fn shard_of(shape: &StreamShape, partition: i32) -> Option<u32> {
    u32::try_from(partition).ok().filter(|p| *p < shape.shards)
}

/// Reads every wanted partition once. Returns each partition's answer, the record bytes
/// gathered, and whether any partition failed.
async fn read_all(
    kafka: &Kafka,
    scope: &Scope,
    topics: &[(TopicName, Result<StreamShape, ResponseError>)],
    wanted: &[Wanted],
    max_bytes: usize,
) -> (Vec<PartitionData>, usize, bool) {
    let s = scope;
    let mut total = 0usize;
    let mut failed = false;
    let mut out = Vec::with_capacity(wanted.len());
    for w in wanted {
        let base = PartitionData::default().with_partition_index(w.partition);
        let shape = match &topics[w.topic].1 {
            Ok(shape) => shape,
            Err(error) => {
                failed = true;
                out.push(base.with_error_code(error.code()).with_high_watermark(-1));
                continue;
            }
        };
        let (Some(shard), Ok(offset)) = (shard_of(shape, w.partition), u64::try_from(w.offset))
        else {
            failed = true;
            let error = if shard_of(shape, w.partition).is_none() {
                ResponseError::UnknownTopicOrPartition
            } else {
                ResponseError::OffsetOutOfRange
            };
            out.push(base.with_error_code(error.code()).with_high_watermark(-1));
            continue;
        };
        let room = max_bytes.saturating_sub(total);
        let limit = w.max_bytes.min(room.max(1));
        let key = shard_key(&s.tenant, &s.namespace, &shape.name, shard);
        match kafka.broker.fetch(&key, offset, limit).await {
            Ok(read) => {
                // Past the first non-empty partition, a batch that does not fit waits for
                // the next fetch.
                let batches = if total > 0 && read.batches.len() > room {
                    Bytes::new()
                } else {
                    read.batches
                };
                total += batches.len();
                out.push(
                    base.with_high_watermark(read.high_watermark as i64)
                        .with_last_stable_offset(read.high_watermark as i64)
                        .with_log_start_offset(read.earliest as i64)
                        .with_records(Some(batches)),
                );
            }
            Err(e) => {
                failed = true;
                let bounds = kafka.broker.shard_bounds(&key).ok();
                out.push(
                    base.with_error_code(kafka_error(&e).code())
                        .with_high_watermark(bounds.map_or(-1, |b| b.high_watermark as i64))
                        .with_last_stable_offset(bounds.map_or(-1, |b| b.high_watermark as i64))
                        .with_log_start_offset(bounds.map_or(-1, |b| b.earliest as i64)),
                );
            }
        }
    }
    (out, total, failed)
}

/// The answer, grouped by topic in request order.
fn response(
    topics: &[(TopicName, Result<StreamShape, ResponseError>)],
    wanted: &[Wanted],
    partitions: Vec<PartitionData>,
) -> FetchResponse {
    let mut grouped: Vec<Vec<PartitionData>> = vec![Vec::new(); topics.len()];
    for (w, p) in wanted.iter().zip(partitions) {
        grouped[w.topic].push(p);
    }
    let responses = topics
        .iter()
        .zip(grouped)
        .map(|((name, _), partitions)| {
            FetchableTopicResponse::default()
                .with_topic(name.clone())
                .with_partitions(partitions)
        })
        .collect();
    FetchResponse::default()
        .with_session_id(0)
        .with_responses(responses)
}
