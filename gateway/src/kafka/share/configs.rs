//! A share group's configs through (Incremental)AlterConfigs on the group resource, as
//! settings of the Felix groups it is.
//!
//! Decides the mapping: `share.auto.offset.reset` (`earliest` or `latest`) is the group's
//! start position, `share.record.lock.duration.ms` its visibility timeout,
//! `share.delivery.count.limit` its `max_attempts`, `errors.deadletterqueue.topic.name`
//! (KIP-1191) its dead-letter stream, a topic of the same tenant and namespace (empty:
//! none). A DELETE resets a config to what a share group Felix creates has. The configs
//! apply to the Felix group of that name on every topic of the connection's namespace that
//! has one; a share group no topic has yet (no consumer ever subscribed, and none created
//! with `felixctl group create`) is refused with `GROUP_ID_NOT_FOUND`, and an unknown
//! config or a bad value with `INVALID_CONFIG`, changing nothing. As with Kafka, a start
//! position changes only where the group has not started yet. Altering needs
//! `stream.manage` on each of those topics (a Felix group's settings are the stream
//! owner's).

use felix_meta::auth::Action;
use felix_wire::groups::{GroupConfig, GroupStart};
use felix_wire::protocol::codes;
use kafka_protocol::error::ResponseError;

use super::{DEFAULT_DELIVERY_COUNT_LIMIT, DEFAULT_LOCK_DURATION_MS};
use crate::kafka::Kafka;
use crate::kafka::errors::kafka_error;
use crate::kafka::scope::{On, Scope};

/// Kafka's ConfigResource type of a group (KIP-848), and the ACL resource type of a group
/// that librdkafka's `ResourceType.GROUP` carries.
pub(crate) const GROUP_RESOURCES: [i8; 2] = [32, 3];

fn invalid(m: String) -> (ResponseError, String) {
    (ResponseError::InvalidConfig, m)
}

/// The Felix group settings `configs` set (`None` value: reset to the default).
fn patch(
    scope: &Scope,
    configs: &[(String, Option<String>)],
) -> Result<GroupConfig, (ResponseError, String)> {
    let mut out = GroupConfig::default();
    for (name, value) in configs {
        let number = |default: u64| -> Result<u64, (ResponseError, String)> {
            match value {
                None => Ok(default),
                Some(v) => v
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| invalid(format!("{name}={v}: a positive whole number"))),
            }
        };
        match name.as_str() {
            "share.auto.offset.reset" => {
                out.start = Some(match value.as_deref() {
                    None | Some("latest") => GroupStart::Latest,
                    Some("earliest") => GroupStart::Earliest,
                    Some(v) => {
                        return Err(invalid(format!(
                            "{name}={v}: earliest or latest (by_duration is not supported)"
                        )));
                    }
                })
            }
            "share.record.lock.duration.ms" => {
                out.visibility_timeout_ms = Some(number(DEFAULT_LOCK_DURATION_MS)?)
            }
            "share.delivery.count.limit" => {
                let n = number(u64::from(DEFAULT_DELIVERY_COUNT_LIMIT))?;
                out.max_attempts =
                    Some(u32::try_from(n).map_err(|_| invalid(format!("{name}={n}: too large")))?);
            }
            "errors.deadletterqueue.topic.name" => {
                out.dead_letter = Some(match value.as_deref() {
                    None | Some("") => String::new(),
                    Some(topic) => format!("{}/{}/{topic}", scope.tenant, scope.namespace),
                })
            }
            other => {
                return Err(invalid(format!(
                    "{other} is not a share-group config Felix supports (share.auto.offset.reset, \
                     share.record.lock.duration.ms, share.delivery.count.limit, \
                     errors.deadletterqueue.topic.name)"
                )));
            }
        }
    }
    Ok(out)
}

/// Sets the configs of share group `group` (or only checks them).
pub(crate) async fn alter_share_group(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    configs: &[(String, Option<String>)],
    validate_only: bool,
) -> Result<(), (ResponseError, String)> {
    let config = patch(scope, configs)?;
    let (t, n) = (&scope.tenant, &scope.namespace);
    let topics: Vec<String> = kafka
        .broker
        .stream_shapes(t, n)
        .map_err(|e| (kafka_error(&e), e.message))?
        .into_iter()
        .filter(|s| s.durable && kafka.broker.group(t, n, &s.name, group).is_ok())
        .map(|s| s.name)
        .collect();
    if topics.is_empty() {
        return Err((
            ResponseError::GroupIdNotFound,
            format!(
                "share group {group} is on no topic yet: start a share consumer, or create it \
                 with `felixctl group create` (its configs are kept per topic)"
            ),
        ));
    }
    for topic in &topics {
        scope
            .allow(kafka, Action::StreamManage, topic, On::Group)
            .map_err(|e| {
                (
                    e,
                    format!("not allowed to alter share group {group} on topic {topic}"),
                )
            })?;
    }
    if validate_only {
        return Ok(());
    }
    for topic in &topics {
        kafka
            .broker
            .alter_group(t, n, topic, group, config.clone())
            .await
            .map_err(|e| match e.code {
                codes::INVALID_ARGUMENT => invalid(e.message),
                _ => (kafka_error(&e), e.message),
            })?;
    }
    Ok(())
}
