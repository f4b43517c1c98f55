//! Felix's errors as Kafka error codes. Decides which Kafka code a refusal becomes, so that
//! a Kafka client takes the action Felix means: retry (a retriable code, with
//! `throttle_time_ms` when Felix said when), refresh metadata, reset its offset, or give up.

use felix_wire::protocol::{ErrorBody, codes};
use kafka_protocol::error::ResponseError;

/// The Kafka code for a Felix error.
pub fn kafka_error(e: &ErrorBody) -> ResponseError {
    match e.code {
        codes::UNKNOWN_TENANT
        | codes::UNKNOWN_NAMESPACE
        | codes::UNKNOWN_STREAM
        | codes::UNKNOWN_SHARD => ResponseError::UnknownTopicOrPartition,
        codes::RECORD_TOO_LARGE | codes::FRAME_TOO_LARGE => ResponseError::MessageTooLarge,
        codes::BAD_REQUEST if e.reason == "invalid_batch" => ResponseError::CorruptMessage,
        // Stored data failed its checks. librdkafka hands a fetch's CORRUPT_MESSAGE to the
        // application as a consumer error (where KAFKA_STORAGE_ERROR would be retried
        // silently, for ever).
        codes::CORRUPT_DATA => ResponseError::CorruptMessage,
        codes::BAD_REQUEST => ResponseError::InvalidRequest,
        // Not applied; retry after `retry_after_ms` (sent as throttle_time_ms). librdkafka
        // and the Java client retry REQUEST_TIMED_OUT on produce, and an idempotent producer
        // keeps its sequence.
        // The broker's disk is down to its reserve: retriable, and a storage problem.
        codes::OVERLOADED if e.reason == "disk_full" => ResponseError::KafkaStorageError,
        codes::OVERLOADED => ResponseError::RequestTimedOut,
        codes::OFFSET_OUT_OF_RANGE | codes::OFFSET_TOO_OLD => ResponseError::OffsetOutOfRange,
        codes::SHARD_UNAVAILABLE if e.reason == "cold_tier_unavailable" => {
            ResponseError::KafkaStorageError
        }
        // Stopping, closed, fenced or led elsewhere: the client refreshes metadata and
        // retries.
        codes::SHARD_UNAVAILABLE | codes::NOT_LEADER => ResponseError::NotLeaderOrFollower,
        // Written here, not confirmed by a quorum or past a lapsed lease: the outcome is
        // unknown.
        codes::QUORUM_TIMEOUT | codes::LEADERSHIP_LOST => {
            ResponseError::NotEnoughReplicasAfterAppend
        }
        codes::METADATA_UNAVAILABLE => ResponseError::LeaderNotAvailable,
        codes::OUT_OF_ORDER_SEQUENCE if e.reason == "invalid_producer_epoch" => {
            ResponseError::InvalidProducerEpoch
        }
        codes::OUT_OF_ORDER_SEQUENCE => ResponseError::OutOfOrderSequenceNumber,
        codes::ALREADY_EXISTS => ResponseError::TopicAlreadyExists,
        // A token problem is an authentication failure to a Kafka client: it should log in
        // again, not conclude that the topic is off limits.
        codes::UNAUTHORIZED => ResponseError::SaslAuthenticationFailed,
        codes::FORBIDDEN => ResponseError::TopicAuthorizationFailed,
        codes::INVALID_ARGUMENT if e.reason == "ephemeral_stream" => {
            ResponseError::InvalidTopicException
        }
        codes::INVALID_ARGUMENT => ResponseError::InvalidRequest,
        // A share group's Felix group was deleted under it; an answer to a claim the
        // member no longer holds.
        codes::UNKNOWN_GROUP => ResponseError::GroupIdNotFound,
        codes::CLAIM_NOT_HELD => ResponseError::InvalidRecordState,
        _ => ResponseError::UnknownServerError,
    }
}

/// `retry_after_ms` as Kafka's `throttle_time_ms`.
pub fn throttle_ms(e: &ErrorBody) -> i32 {
    e.retry_after_ms
        .map_or(0, |ms| i32::try_from(ms).unwrap_or(i32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_become_the_codes_kafka_clients_act_on() {
        let e = |code, reason: &str| ErrorBody::new(code, reason, "m");
        assert_eq!(
            kafka_error(&e(codes::UNKNOWN_STREAM, "unknown_stream")),
            ResponseError::UnknownTopicOrPartition
        );
        assert_eq!(
            kafka_error(&e(codes::OFFSET_TOO_OLD, "offset_too_old")),
            ResponseError::OffsetOutOfRange
        );
        assert_eq!(
            kafka_error(&e(codes::SHARD_UNAVAILABLE, "cold_tier_unavailable")),
            ResponseError::KafkaStorageError
        );
        assert_eq!(
            kafka_error(&e(codes::CORRUPT_DATA, "corrupt_segment")),
            ResponseError::CorruptMessage
        );
        assert_eq!(
            kafka_error(&e(codes::OUT_OF_ORDER_SEQUENCE, "invalid_producer_epoch")),
            ResponseError::InvalidProducerEpoch
        );
        assert_eq!(
            kafka_error(&e(codes::FORBIDDEN, "forbidden")),
            ResponseError::TopicAuthorizationFailed
        );
        assert_eq!(
            kafka_error(&e(codes::UNAUTHORIZED, "token_expired")),
            ResponseError::SaslAuthenticationFailed
        );
        assert_eq!(
            kafka_error(&e(codes::CLAIM_NOT_HELD, "claim_expired")),
            ResponseError::InvalidRecordState
        );
        assert_eq!(
            kafka_error(&e(codes::UNKNOWN_GROUP, "unknown_group")),
            ResponseError::GroupIdNotFound
        );
        let overloaded = e(codes::OVERLOADED, "publish_queue_full").retry_after(50);
        assert!(kafka_error(&overloaded).is_retriable());
        assert_eq!(throttle_ms(&overloaded), 50);
    }
}
