//! Produce: a partition's record batches go, as sent, into the broker's publish path.
//!
//! Decides how Kafka's `acks` map onto Felix's acknowledgements: `acks=0` is a
//! fire-and-forget publish (and, as in Kafka, no response at all); `acks=1` and `acks=all`
//! are acknowledged publishes, answered once the stream's consistency is met (Leader: written
//! to this broker's log under the fsync policy; Quorum: held by a majority, once replication
//! exists). Idempotent producers' sequences are checked by the broker against the batch
//! headers; transactional batches are refused (no transactions yet). Each topic's
//! `stream.publish` is checked before anything else is done for it, and the publish carries
//! the connection's token, so a forwarded one is checked again at the shard's owner.
//!
//! A produce is charged to the tenant's publish quota here and never refused for it: as a
//! Kafka broker does (KIP-219), Felix stores it, answers with `throttle_time_ms` = how long
//! until the tenant's debt is paid back, and reads nothing more from the connection for that
//! long, so librdkafka slows down without an error reaching the application.

use std::time::Duration;

use bytes::Bytes;
use felix_wire::HeaderIter;
use felix_wire::protocol::{AckMode, ErrorBody};
use futures::future::join_all;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::Kafka;
use super::errors::{kafka_error, throttle_ms};
use super::scope::{On, Scope};
use super::topics::resolve;
use crate::publish::{Publisher, QuotaCharge};
use crate::quota::{self, PublishCost};
use crate::shard::shard_key;
use felix_meta::auth::Action;

/// The outcome for one partition.
struct Outcome {
    index: i32,
    result: Result<u64, (ResponseError, Option<String>)>,
    log_start: i64,
    throttle_ms: i32,
    /// How long the connection stays muted for the tenant's publish quota.
    mute: Duration,
}

impl Outcome {
    fn error(index: i32, error: ResponseError, message: impl Into<Option<String>>) -> Outcome {
        Outcome {
            index,
            result: Err((error, message.into())),
            log_start: -1,
            throttle_ms: 0,
            mute: Duration::ZERO,
        }
    }
}

/// Refuses what Felix cannot store as Kafka means it: transactional and control batches.
fn check_batches(records: &Bytes) -> Result<(), (ResponseError, Option<String>)> {
    // A malformed header ends the walk: the broker's validation says exactly what is wrong.
    for (h, _) in HeaderIter::new(records).map_while(Result::ok) {
        if h.is_transactional() || h.is_control() {
            return Err((
                ResponseError::InvalidTxnState,
                Some("transactions are not supported by Felix".to_owned()),
            ));
        }
    }
    Ok(())
}

/// Serves a Produce request: the response (`None`: none is sent, `acks=0`) and how long the
/// connection stays muted after it for the tenant's publish quota.
pub async fn produce(
    kafka: &Kafka,
    scope: &Scope,
    request: ProduceRequest,
    version: i16,
) -> (Option<ProduceResponse>, Duration) {
    let ack = match request.acks {
        0 => Some(AckMode::None),
        1 | -1 => Some(AckMode::Batch),
        _ => None,
    };
    let transactional = request
        .transactional_id
        .as_ref()
        .is_some_and(|t| !t.is_empty());
    let s = scope;
    let mut topics = Vec::with_capacity(request.topic_data.len());
    let mut mute = Duration::ZERO;
    for topic in request.topic_data {
        let name = topic.name.to_string();
        let shape = match ack {
            Some(_) if !transactional => Some(
                match scope.allow(kafka, Action::StreamPublish, &name, On::Topic) {
                    Ok(()) => resolve(kafka, scope, &name, true).await,
                    Err(e) => Err(e),
                },
            ),
            _ => None,
        };
        let partitions = topic.partition_data.into_iter().map(|p| {
            let shape = shape.clone();
            let name = name.clone();
            async move {
                let index = p.index;
                let Some(ack) = ack else {
                    return Outcome::error(index, ResponseError::InvalidRequiredAcks, None);
                };
                if transactional {
                    return Outcome::error(
                        index,
                        ResponseError::TransactionalIdAuthorizationFailed,
                        "transactions are not supported by Felix".to_owned(),
                    );
                }
                let shape = match shape {
                    Some(Ok(shape)) => shape,
                    Some(Err(error)) => return Outcome::error(index, error, None),
                    None => return Outcome::error(index, ResponseError::UnknownServerError, None),
                };
                if index < 0 || index as u32 >= shape.shards {
                    return Outcome::error(index, ResponseError::UnknownTopicOrPartition, None);
                }
                let Some(records) = p.records.filter(|r| !r.is_empty()) else {
                    return Outcome::error(
                        index,
                        ResponseError::CorruptMessage,
                        "a produce needs at least one record batch".to_owned(),
                    );
                };
                if let Err((error, message)) = check_batches(&records) {
                    return Outcome::error(index, error, message);
                }
                let shard = index as u32;
                let quota_throttle = kafka
                    .broker
                    .quotas
                    .take_throttled(&s.tenant, PublishCost::of(&records));
                if !quota_throttle.is_zero() {
                    quota::count(&kafka.broker.node.metrics, &s.tenant, "kafka_throttled");
                }
                let quota_ms = i32::try_from(quota_throttle.as_millis()).unwrap_or(i32::MAX);
                let published = kafka
                    .broker
                    .publish_by(
                        Publisher {
                            token: scope.token(),
                            quota: QuotaCharge::Charged,
                        },
                        &s.tenant,
                        &s.namespace,
                        &name,
                        shard,
                        ack,
                        records,
                    )
                    .await;
                let mut outcome = match published {
                    Ok(published) => {
                        let log_start = kafka
                            .broker
                            .shard_bounds(&shard_key(&s.tenant, &s.namespace, &name, shard))
                            .map_or(-1, |b| b.earliest as i64);
                        Outcome {
                            index,
                            result: Ok(published.map_or(0, |(base, _)| base)),
                            log_start,
                            throttle_ms: 0,
                            mute: Duration::ZERO,
                        }
                    }
                    Err(e) => refused(index, &e),
                };
                outcome.throttle_ms = outcome.throttle_ms.max(quota_ms);
                outcome.mute = quota_throttle;
                outcome
            }
        });
        let outcomes = join_all(partitions).await;
        mute = outcomes.iter().map(|o| o.mute).fold(mute, Duration::max);
        topics.push((topic.name, outcomes));
    }
    if ack == Some(AckMode::None) {
        return (None, mute);
    }
    let mut throttle = 0;
    let responses = topics
        .into_iter()
        .map(|(name, outcomes)| {
            let partitions = outcomes
                .into_iter()
                .map(|o| {
                    throttle = throttle.max(o.throttle_ms);
                    let r = PartitionProduceResponse::default()
                        .with_index(o.index)
                        .with_log_start_offset(o.log_start);
                    match o.result {
                        Ok(base) => r.with_base_offset(base as i64),
                        Err((error, message)) => {
                            let r = r.with_error_code(error.code()).with_base_offset(-1);
                            match message {
                                Some(m) if version >= 8 => {
                                    r.with_error_message(Some(StrBytes::from_string(m)))
                                }
                                _ => r,
                            }
                        }
                    }
                })
                .collect();
            TopicProduceResponse::default()
                .with_name(name)
                .with_partition_responses(partitions)
        })
        .collect();
    let response = ProduceResponse::default()
        .with_responses(responses)
        .with_throttle_time_ms(throttle);
    (Some(response), mute)
}

/// A refused publish: its Kafka code and, when Felix said when to retry, a throttle.
fn refused(index: i32, e: &ErrorBody) -> Outcome {
    Outcome {
        index,
        result: Err((kafka_error(e), Some(e.message.clone()))),
        log_start: -1,
        throttle_ms: throttle_ms(e),
        mute: Duration::ZERO,
    }
}

/// InitProducerId: an idempotent producer's id from the control plane (Felix's own
/// idempotent producers, `Broker::producer_init`), or, for a producer that names its id and
/// epoch (v3+, after a sequence error), the same id at the next epoch, which restarts its
/// sequences. Transactional ids are refused: Felix has no transactions.
pub async fn init_producer_id(
    kafka: &Kafka,
    scope: &Scope,
    request: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let fail = |error: ResponseError| {
        InitProducerIdResponse::default()
            .with_error_code(error.code())
            .with_producer_id((-1).into())
            .with_producer_epoch(-1)
    };
    if request
        .transactional_id
        .as_ref()
        .is_some_and(|t| !t.is_empty())
    {
        return fail(ResponseError::TransactionalIdAuthorizationFailed);
    }
    // A producer id is tied to no topic: a live token is enough (as over QUIC).
    if let Err(error) = scope.allow_any(kafka) {
        return fail(error);
    }
    let (id, epoch) = (request.producer_id.0, request.producer_epoch);
    if id >= 0 && (0..i16::MAX).contains(&epoch) {
        return InitProducerIdResponse::default()
            .with_producer_id(id.into())
            .with_producer_epoch(epoch + 1);
    }
    match kafka.broker.producer_init().await {
        Ok((id, epoch)) => InitProducerIdResponse::default()
            .with_producer_id(id.into())
            .with_producer_epoch(epoch),
        Err(e) if e.code == felix_wire::protocol::codes::METADATA_UNAVAILABLE => {
            fail(ResponseError::CoordinatorNotAvailable)
        }
        Err(e) => fail(kafka_error(&e)),
    }
}
