//! CreatePartitions: a topic's partitions are its stream's shards, and they only grow (as
//! `felixctl stream alter --shards` grows them).
//!
//! Decides the refusals Kafka's admin tools expect: a count at or below the current one is
//! `INVALID_PARTITIONS` with a message (Felix cannot shrink a stream: keys would move
//! between shards), a manual replica assignment `INVALID_REPLICA_ASSIGNMENT` (Felix places
//! shards itself). Each topic is checked for `stream.manage` before anything else.

use felix_meta::auth::Action;
use felix_wire::protocol::StreamConfig;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::protocol::StrBytes;

use super::Kafka;
use super::errors::kafka_error;
use super::scope::{On, Scope};
use super::topics::resolve;

/// Serves a CreatePartitions request, topic by topic.
pub async fn create_partitions(
    kafka: &Kafka,
    scope: &Scope,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let outcome = grow(
            kafka,
            scope,
            &topic.name,
            topic.count,
            topic.assignments.is_some(),
            request.validate_only,
        )
        .await;
        let mut result = CreatePartitionsTopicResult::default().with_name(topic.name);
        if let Err((error, message)) = outcome {
            result = result
                .with_error_code(error.code())
                .with_error_message(Some(StrBytes::from_string(message)));
        }
        results.push(result);
    }
    CreatePartitionsResponse::default().with_results(results)
}

/// Grows one topic to `count` partitions, or says why not.
async fn grow(
    kafka: &Kafka,
    scope: &Scope,
    name: &str,
    count: i32,
    assigned: bool,
    validate_only: bool,
) -> Result<(), (ResponseError, String)> {
    scope
        .allow(kafka, Action::StreamManage, name, On::Topic)
        .map_err(|e| (e, format!("not allowed to alter topic {name:?}")))?;
    let shape = resolve(kafka, scope, name, false)
        .await
        .map_err(|e| (e, format!("topic {name:?}: {e}")))?;
    if assigned {
        return Err((
            ResponseError::InvalidReplicaAssignment,
            "Felix places partitions itself: leave the replica assignment out".to_owned(),
        ));
    }
    let current = i64::from(shape.shards);
    if i64::from(count) <= current {
        return Err((
            ResponseError::InvalidPartitions,
            format!(
                "topic {name:?} has {current} partitions and can only grow: asked for {count} \
                 (Felix cannot remove partitions, keys would move between them)"
            ),
        ));
    }
    if validate_only {
        return Ok(());
    }
    let patch = StreamConfig {
        shards: Some(count as u32),
        ..StreamConfig::default()
    };
    let s = scope;
    kafka
        .broker
        .alter_stream(&s.tenant, &s.namespace, name, patch)
        .await
        .map(|_| ())
        .map_err(|e| {
            let error = match e.code {
                felix_wire::protocol::codes::INVALID_ARGUMENT => ResponseError::InvalidPartitions,
                _ => kafka_error(&e),
            };
            (error, e.message)
        })
}
