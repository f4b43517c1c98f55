//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics: Kafka topic configs
//! read and set as stream settings (the mapping is [`super::topics::stream_config`]).
//!
//! Decides one difference from Kafka plainly: AlterConfigs sets the configs it names and
//! leaves the others as they are (Kafka resets unnamed ones to their defaults), because a
//! Felix alter is a patch. Broker configs are described as an empty set and cannot be
//! altered. A group's configs are a share group's (see `share/configs.rs`). Describing a topic's configs needs any grant on it, altering them
//! `stream.manage`, checked before any work.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::Kafka;
use super::errors::kafka_error;
use super::scope::{On, Scope};
use super::topics::{resolve, stream_config, topic_configs};
use felix_meta::auth::Action;

/// Kafka's ConfigResource types.
const TOPIC: i8 = 2;
const BROKER: i8 = 4;
/// Kafka's ConfigSource: set on the topic.
const DYNAMIC_TOPIC_CONFIG: i8 = 1;
/// Kafka's ConfigType codes.
const BOOLEAN: i8 = 1;
const LONG: i8 = 5;
const LIST: i8 = 7;

/// IncrementalAlterConfigs operations.
const SET: i8 = 0;
const DELETE: i8 = 1;

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

/// DescribeConfigs: a topic's settings (all, or the named keys).
pub async fn describe_configs(
    kafka: &Kafka,
    scope: &Scope,
    request: DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let s = scope;
    let mut results = Vec::with_capacity(request.resources.len());
    for resource in request.resources {
        let base = DescribeConfigsResult::default()
            .with_resource_type(resource.resource_type)
            .with_resource_name(resource.resource_name.clone());
        let name = resource.resource_name.to_string();
        let result = match resource.resource_type {
            BROKER => base,
            TOPIC => match match scope.allow_view(kafka, &name, On::Topic) {
                Ok(()) => resolve(kafka, scope, &name, false).await,
                Err(e) => Err(e),
            } {
                Err(error) => base.with_error_code(error.code()),
                Ok(_) => match kafka
                    .broker
                    .describe_stream(&s.tenant, &s.namespace, &name)
                    .await
                {
                    Err(e) => base
                        .with_error_code(kafka_error(&e).code())
                        .with_error_message(Some(sb(&e.message))),
                    Ok(info) => {
                        let wanted: Option<Vec<String>> = resource
                            .configuration_keys
                            .as_ref()
                            .map(|keys| keys.iter().map(|k| k.to_string()).collect());
                        let configs = topic_configs(&info.config)
                            .into_iter()
                            .filter(|(k, _)| {
                                wanted.as_ref().is_none_or(|w| w.iter().any(|x| x == k))
                            })
                            .map(|(k, v)| {
                                let mut c = DescribeConfigsResourceResult::default()
                                    .with_name(StrBytes::from_static_str(k))
                                    .with_value(Some(sb(&v)))
                                    .with_config_source(DYNAMIC_TOPIC_CONFIG);
                                if version >= 3 {
                                    c = c.with_config_type(match k {
                                        "remote.storage.enable" => BOOLEAN,
                                        "cleanup.policy" => LIST,
                                        _ => LONG,
                                    });
                                }
                                c
                            })
                            .collect();
                        base.with_configs(configs)
                    }
                },
            },
            other => base
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(Some(sb(&format!(
                    "config resource type {other} is not supported (topics: 2, brokers: 4)"
                )))),
        };
        results.push(result);
    }
    DescribeConfigsResponse::default().with_results(results)
}

/// Sets a topic's configs (or only checks them): `Ok` or the Kafka error and message.
async fn alter_topic(
    kafka: &Kafka,
    scope: &Scope,
    resource_type: i8,
    name: &str,
    configs: Vec<(String, Option<String>)>,
    validate_only: bool,
) -> Result<(), (ResponseError, String)> {
    if super::share::GROUP_RESOURCES.contains(&resource_type) {
        return super::share::alter_share_group(kafka, scope, name, &configs, validate_only).await;
    }
    if resource_type != TOPIC {
        return Err((
            ResponseError::InvalidRequest,
            format!("only topic configs can be altered, not resource type {resource_type}"),
        ));
    }
    scope
        .allow(kafka, Action::StreamManage, name, On::Topic)
        .map_err(|e| (e, format!("not allowed to alter topic {name:?}")))?;
    resolve(kafka, scope, name, false)
        .await
        .map_err(|e| (e, format!("topic {name:?}: {e}")))?;
    let patch = stream_config(&configs)?;
    if validate_only {
        return Ok(());
    }
    let s = scope;
    kafka
        .broker
        .alter_stream(&s.tenant, &s.namespace, name, patch)
        .await
        .map(|_| ())
        .map_err(|e| {
            let error = match e.code {
                felix_wire::protocol::codes::INVALID_ARGUMENT => ResponseError::InvalidConfig,
                _ => kafka_error(&e),
            };
            (error, e.message)
        })
}

/// AlterConfigs: sets the named configs of each topic.
pub async fn alter_configs(
    kafka: &Kafka,
    scope: &Scope,
    request: AlterConfigsRequest,
) -> AlterConfigsResponse {
    use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
    let mut responses = Vec::with_capacity(request.resources.len());
    for r in request.resources {
        let configs = r
            .configs
            .iter()
            .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string())))
            .collect();
        let outcome = alter_topic(
            kafka,
            scope,
            r.resource_type,
            &r.resource_name,
            configs,
            request.validate_only,
        )
        .await;
        let mut response = AlterConfigsResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name);
        if let Err((error, message)) = outcome {
            response = response
                .with_error_code(error.code())
                .with_error_message(Some(sb(&message)));
        }
        responses.push(response);
    }
    AlterConfigsResponse::default().with_responses(responses)
}

/// IncrementalAlterConfigs: SET sets a topic config, DELETE resets it to the value a topic
/// created without it has ([`default_value`]); APPEND and SUBTRACT are refused (no topic
/// config Felix supports is a list).
pub async fn incremental_alter_configs(
    kafka: &Kafka,
    scope: &Scope,
    request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
    let mut responses = Vec::with_capacity(request.resources.len());
    for r in request.resources {
        let refused = r
            .configs
            .iter()
            .find(|c| c.config_operation != SET && c.config_operation != DELETE);
        let outcome = if let Some(c) = refused {
            Err((
                ResponseError::InvalidRequest,
                format!(
                    "config {}: only SET and DELETE are supported (operation {})",
                    c.name.as_str(),
                    c.config_operation
                ),
            ))
        } else {
            let configs = r
                .configs
                .iter()
                .map(|c| {
                    let value = if c.config_operation == DELETE {
                        default_value(kafka, c.name.as_str())
                    } else {
                        c.value.as_ref().map(|v| v.to_string())
                    };
                    (c.name.to_string(), value)
                })
                .collect();
            alter_topic(
                kafka,
                scope,
                r.resource_type,
                &r.resource_name,
                configs,
                request.validate_only,
            )
            .await
        };
        let mut response = AlterConfigsResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name);
        if let Err((error, message)) = outcome {
            response = response
                .with_error_code(error.code())
                .with_error_message(Some(sb(&message)));
        }
        responses.push(response);
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

/// The value (as a Kafka config value) a topic created without `name` has: what a DELETE
/// resets it to. `None` for a config Felix does not support, which the alter then refuses
/// by name.
fn default_value(kafka: &Kafka, name: &str) -> Option<String> {
    let config = &kafka.broker.node.config;
    Some(match name {
        // No limit, as CreateTopics without them.
        "retention.ms" | "retention.bytes" | "local.retention.ms" | "local.retention.bytes" => {
            "-1".to_owned()
        }
        "segment.bytes" => config.segment_bytes.to_string(),
        "segment.ms" => config.segment_ms.to_string(),
        "remote.storage.enable" => felix_meta::model::StreamSettings::default()
            .tiered
            .to_string(),
        "cleanup.policy" => "delete".to_owned(),
        _ => return None,
    })
}
