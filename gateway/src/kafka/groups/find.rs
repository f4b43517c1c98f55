//! FindCoordinator: which broker coordinates a group.
//!
//! Decides where a group's members meet. The invariant: every broker names the same
//! coordinator for a group (a stable hash of the group over the live brokers with a Kafka
//! listener, or this broker on a single node), so all of a group's members reach one
//! coordinator; when that broker is lost another live one is named, and the group's
//! committed offsets, kept in its partitions' replicated group journals rather than on the
//! coordinator (`offset_home.rs`), are still there. A transaction coordinator lookup
//! is refused with an error clients treat as fatal (Felix has no transactions), and a
//! share-state coordinator lookup (key type 2, broker-internal in Kafka) with
//! `INVALID_REQUEST`; a share group's coordinator is found as any group's (key type 0).
//! Finding a group's coordinator needs any grant on the group.

use std::net::SocketAddr;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;

use super::coordinator::sb;
use crate::kafka::Kafka;
use crate::kafka::scope::{On, Scope};
use crate::kafka::topics::broker_id;

/// FindCoordinator: this broker coordinates every group; a transaction coordinator is
/// refused (Felix has no transactions).
pub fn find_coordinator(
    kafka: &Kafka,
    scope: &Scope,
    request: FindCoordinatorRequest,
    version: i16,
    advertised: SocketAddr,
) -> FindCoordinatorResponse {
    let me = broker_id(kafka);
    let host = sb(&advertised.ip().to_string());
    let port = i32::from(advertised.port());
    // In a cluster every broker names the same coordinator for a group, so all its members
    // meet on one broker (the offsets are the partitions' leaders', wherever it is).
    let coordinator_of = |key: &str| -> (BrokerId, StrBytes, i32) {
        cluster_coordinator(kafka, key).unwrap_or((me, host.clone(), port))
    };
    // A transaction coordinator lookup is refused with an error clients treat as fatal
    // (an authorization failure), so `init_transactions()` fails at once with the message
    // instead of retrying the lookup until its timeout (librdkafka) or reporting a missing
    // group coordinator (kafkajs).
    let refusal = |key_type: i8, key: &str| {
        if key_type == 0 {
            // A group: describing it needs any grant on it.
            return scope
                .allow_view(kafka, key, On::Group)
                .err()
                .map(|e| (e, "not allowed to use this group"));
        }
        if key_type == 2 {
            // KIP-932's share-state coordinator (`group:topicId:partition`), which only
            // Kafka brokers look up among themselves.
            return Some((
                ResponseError::InvalidRequest,
                "share-group state has no coordinator of its own in Felix: it is kept with \
                 the group on each partition's leader (find the group's coordinator with \
                 key type 0)",
            ));
        }
        Some((
            ResponseError::TransactionalIdAuthorizationFailed,
            "Felix has no transactions: use an idempotent producer (enable.idempotence) \
             without a transactional.id",
        ))
    };
    if version >= 4 {
        let coordinators = request
            .coordinator_keys
            .iter()
            .map(|key| {
                let c = Coordinator::default().with_key(key.clone());
                match refusal(request.key_type, key) {
                    Some((error, message)) => c
                        .with_node_id((-1).into())
                        .with_port(-1)
                        .with_error_code(error.code())
                        .with_error_message(Some(StrBytes::from_static_str(message))),
                    None => {
                        let (id, host, port) = coordinator_of(key);
                        c.with_node_id(id).with_host(host).with_port(port)
                    }
                }
            })
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    match refusal(request.key_type, &request.key) {
        Some((error, message)) => FindCoordinatorResponse::default()
            .with_error_code(error.code())
            .with_error_message(Some(StrBytes::from_static_str(message)))
            .with_node_id((-1).into())
            .with_port(-1),
        None => {
            let (id, host, port) = coordinator_of(&request.key);
            FindCoordinatorResponse::default()
                .with_node_id(id)
                .with_host(host)
                .with_port(port)
        }
    }
}

/// Whether this broker coordinates `group`: FindCoordinator names it (always on a single
/// node). A request that only a group's coordinator may serve (membership, a share group's
/// offsets) is answered `NOT_COORDINATOR` elsewhere, so the client finds the coordinator
/// again instead of splitting the group's state between brokers.
pub fn coordinates(kafka: &Kafka, group: &str) -> bool {
    cluster_coordinator(kafka, group).is_none_or(|(id, _, _)| id == broker_id(kafka))
}

/// `NOT_COORDINATOR` and what to do about it, for a request about `group` sent here.
pub fn not_coordinator(group: &str) -> (ResponseError, String) {
    (
        ResponseError::NotCoordinator,
        format!("this broker does not coordinate group {group}: find its coordinator again"),
    )
}

/// A cluster's coordinator for `key`: one of the live brokers with a Kafka listener, chosen
/// by a stable hash of the key (FNV-1a) so every broker answers the same. `None` on a
/// single node.
fn cluster_coordinator(kafka: &Kafka, key: &str) -> Option<(BrokerId, StrBytes, i32)> {
    let mut live: Vec<(u64, SocketAddr)> = kafka
        .broker
        .kafka_brokers()?
        .into_iter()
        .filter(|(_, _, alive)| *alive)
        .filter_map(|(id, addr, _)| Some((id, addr?.parse().ok()?)))
        .collect();
    if live.is_empty() {
        return None;
    }
    live.sort_by_key(|(id, _)| *id);
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let (id, addr) = live[(hash % live.len() as u64) as usize];
    Some((
        BrokerId(i32::try_from(id).ok()?),
        sb(&addr.ip().to_string()),
        i32::from(addr.port()),
    ))
}
