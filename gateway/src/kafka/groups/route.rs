//! The route of an operation on a group's state at one topic's partitions: each partition
//! is served by its shard's leader (`kafka/groups/offset_home.rs` for committed offsets,
//! `upgrade.rs` for offsets moving in, `kafka/share/offsets.rs` for share groups' start
//! offsets).
//!
//! Decides where an operation runs: a partition this broker leads is served here; one led
//! by another broker is forwarded to that leader over the signed internal route, all of
//! one topic's partitions it leads in one call, and is never forwarded again (a leader that
//! lost the shard meanwhile refuses, and the client retries).

use std::collections::BTreeMap;
use std::time::Duration;

use felix_wire::protocol::{ErrorBody, codes};
use kafka_protocol::error::ResponseError;
use tracing::debug;

use crate::groups::kafka_offsets::{OffsetsCall, OffsetsOp, PATH, ShardOutcome};
use crate::kafka::Kafka;
use crate::kafka::scope::Scope;

/// The Kafka error for a refusal from a partition's home: a topic or partition that does
/// not exist (an ephemeral stream is no topic either) is the client's to fix; anything else
/// (no leader now, a quorum not reached, a leader unreachable) is retried by Kafka clients
/// after looking the coordinator up.
pub(super) fn kafka_error(e: &ErrorBody) -> ResponseError {
    match e.code {
        codes::UNKNOWN_STREAM | codes::UNKNOWN_SHARD | codes::UNKNOWN_NAMESPACE => {
            ResponseError::UnknownTopicOrPartition
        }
        _ if e.reason == "ephemeral_stream" => ResponseError::UnknownTopicOrPartition,
        _ => ResponseError::CoordinatorNotAvailable,
    }
}

/// The part of `op` about `shards`.
fn only(op: &OffsetsOp, shards: &[u32]) -> OffsetsOp {
    match op {
        OffsetsOp::Commit { offsets } => OffsetsOp::Commit {
            offsets: offsets
                .iter()
                .filter(|(s, _)| shards.contains(s))
                .cloned()
                .collect(),
        },
        OffsetsOp::Adopt { offsets } => OffsetsOp::Adopt {
            offsets: offsets
                .iter()
                .filter(|(s, _)| shards.contains(s))
                .cloned()
                .collect(),
        },
        OffsetsOp::Fetch { only_existing, .. } => OffsetsOp::Fetch {
            shards: shards.to_vec(),
            only_existing: *only_existing,
        },
        OffsetsOp::Delete { .. } => OffsetsOp::Delete {
            shards: shards.to_vec(),
        },
        OffsetsOp::Follow { .. } => OffsetsOp::Follow {
            shards: shards.to_vec(),
        },
        OffsetsOp::ShareStart { .. } => OffsetsOp::ShareStart {
            shards: shards.to_vec(),
        },
        OffsetsOp::ShareSeek { offsets } => OffsetsOp::ShareSeek {
            offsets: offsets
                .iter()
                .filter(|(s, _)| shards.contains(s))
                .cloned()
                .collect(),
        },
        OffsetsOp::ShareForget { .. } => OffsetsOp::ShareForget {
            shards: shards.to_vec(),
        },
    }
}

/// Runs `op` on one topic's partitions for `group`: here where this broker leads, at the
/// leader otherwise. One outcome per partition of `op`.
pub(crate) async fn on_topic(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    topic: &str,
    op: OffsetsOp,
) -> Vec<(u32, ShardOutcome)> {
    let broker = &kafka.broker;
    let call = OffsetsCall {
        tenant: scope.tenant.clone(),
        namespace: scope.namespace.clone(),
        stream: topic.to_owned(),
        group: group.to_owned(),
        op,
    };
    let mut outcomes: BTreeMap<u32, ShardOutcome> = broker
        .kafka_offsets_here(call.clone())
        .await
        .into_iter()
        .collect();
    let mut by_leader: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for (shard, outcome) in &outcomes {
        if let Err(e) = outcome
            && e.code == codes::NOT_LEADER
            && let Some(leader) = e.leader
        {
            by_leader.entry(leader).or_default().push(*shard);
        }
    }
    // Long enough for a Quorum commit at the leader.
    let timeout = Duration::from_millis(broker.node.config.publish_quorum_timeout_ms)
        + Duration::from_secs(5);
    let forwards = by_leader.into_iter().map(|(leader, shards)| {
        let call = OffsetsCall {
            op: only(&call.op, &shards),
            ..call.clone()
        };
        async move {
            let unreachable = |why: String| {
                ErrorBody::new(
                    codes::SHARD_UNAVAILABLE,
                    "leader_unreachable",
                    format!("forwarding Kafka offsets to broker {leader}: {why}"),
                )
                .retry_after(500)
            };
            let Some(addr) = broker.node.internal_addr_of(leader) else {
                let e = unreachable("no address known".into());
                return shards.into_iter().map(|s| (s, Err(e.clone()))).collect();
            };
            let answer = broker
                .node
                .peers
                .call(
                    &addr,
                    PATH,
                    &call,
                    timeout,
                    crate::replication::transport::FetchError::Failed,
                )
                .await;
            match answer.map(|a| serde_json::from_slice::<Vec<(u32, ShardOutcome)>>(&a.body)) {
                Ok(Ok(answers)) => answers,
                Ok(Err(e)) => {
                    let e = unreachable(format!("unreadable answer: {e}"));
                    shards.into_iter().map(|s| (s, Err(e.clone()))).collect()
                }
                Err(e) => {
                    debug!(leader, error = %e, "forwarding Kafka offsets failed");
                    let e = unreachable(e.to_string());
                    shards
                        .into_iter()
                        .map(|s| (s, Err(e.clone())))
                        .collect::<Vec<_>>()
                }
            }
        }
    });
    for answers in futures::future::join_all(forwards).await {
        outcomes.extend(answers);
    }
    call.op
        .shards()
        .into_iter()
        .map(|s| {
            let outcome = outcomes.remove(&s).unwrap_or_else(|| {
                Err(ErrorBody::new(
                    codes::INTERNAL,
                    "internal",
                    "no answer for a partition",
                ))
            });
            (s, outcome)
        })
        .collect()
}
