//! Where a client is sent: whether this broker serves a shard now, the `not_leader` answer
//! that names the shard's leader, and the routing tables clients and the Kafka listener ask
//! for (who leads each shard, which replicas are in sync, which brokers are alive).
//!
//! Invariant: client operations are served only by the shard's leader while it holds its
//! lease; any other broker refuses with the leader it knows (`not_leader`) or, while the
//! shard has no live leader, with a retryable `shard_unavailable`. A single node leads every
//! shard.

use felix_meta::model::ShardKey;
use felix_wire::protocol::{BrokerRoute, ErrorBody, ShardRoute, codes};

use crate::errors::err;
use crate::node::Node;
use crate::replication::role::Role;
use crate::shard::{Shard, shard_key};

/// One shard's placement as the Kafka listener describes a partition.
#[derive(Debug, Clone, Default)]
pub struct PartitionRoute {
    /// The leader, if it is alive.
    pub leader: Option<u64>,
    pub generation: u64,
    pub replicas: Vec<u64>,
    pub in_sync: Vec<u64>,
}

/// Refuses client operations on a shard this broker does not lead now.
pub(crate) fn check_leading(node: &Node, shard: &Shard) -> Result<(), ErrorBody> {
    let Some(repl) = &shard.repl else {
        return Ok(());
    };
    let role = repl.role.borrow().clone();
    match role {
            Role::Leader { .. } => Ok(()),
            Role::Fenced { .. } => Err(err(
                codes::SHARD_UNAVAILABLE,
                "fenced",
                format!(
                    "shard {}: this broker's lease lapsed, so another broker may lead the shard                      by now; it serves nothing until it knows",
                    shard.key
                ),
            )
            .retry_after(500)),
            Role::Unavailable { why, .. } => Err(err(
                codes::SHARD_UNAVAILABLE,
                "leader_unavailable",
                format!("shard {}: {why}", shard.key),
            )
            .retry_after(1000)),
            Role::Follower { leader, .. } => Err(not_leader(node, &shard.key, Some(leader))),
            Role::Unplaced => {
                let leader = node
                    .registry
                    .borrow()
                    .placements
                    .get(&shard.key)
                    .and_then(|p| p.leader);
                Err(not_leader(node, &shard.key, leader.filter(|l| *l != node.config.node_id)))
            }
        }
}

/// `not_leader` naming the shard's leader, or `shard_unavailable` while it has none that
/// is alive.
pub(crate) fn not_leader(node: &Node, key: &ShardKey, leader: Option<u64>) -> ErrorBody {
    let reg = node.registry.borrow();
    match leader.and_then(|l| reg.brokers.get(&l)) {
        Some(b) if b.alive => {
            let mut e = err(
                codes::NOT_LEADER,
                "not_leader",
                format!("broker {} leads shard {key}, not this one", b.id),
            );
            e.leader = Some(b.id);
            e.leader_addr = Some(b.client_addr.clone());
            e
        }
        Some(b) => err(
            codes::SHARD_UNAVAILABLE,
            "leader_unavailable",
            format!(
                "shard {key}: its leader, broker {}, is down; the shard waits for it (a \
                     Leader stream), for a replica to be promoted (a Quorum stream) or for \
                     another broker to take it over (an ephemeral stream)",
                b.id
            ),
        )
        .retry_after(500),
        None => err(
            codes::SHARD_UNAVAILABLE,
            "no_leader",
            format!("shard {key} has no leader yet"),
        )
        .retry_after(200),
    }
}

/// Who leads each shard of a stream, and the cluster's brokers: a cluster client's
/// routing table. On a single node, this node leads every shard.
pub fn topology(
    node: &Node,
    tenant: &str,
    namespace: &str,
    name: &str,
) -> Result<(Vec<ShardRoute>, Vec<BrokerRoute>), ErrorBody> {
    let (_, settings) = node.stream_settings(tenant, namespace, name)?;
    let reg = node.registry.borrow();
    let me = node.config.node_id;
    let my_addr = reg
        .brokers
        .get(&me)
        .map(|b| b.client_addr.clone())
        .unwrap_or_else(|| node.config.quic_addr.to_string());
    let shards = (0..settings.shards)
        .map(|k| {
            let key = shard_key(tenant, namespace, name, k);
            match reg.placements.get(&key) {
                Some(p) if node.cluster => ShardRoute {
                    shard: k,
                    leader: p.leader,
                    leader_addr: p
                        .leader
                        .and_then(|l| reg.brokers.get(&l))
                        .map(|b| b.client_addr.clone()),
                    generation: p.generation,
                    replicas: p.replicas.clone(),
                },
                // Every stream of a single node is served by the broker a client talks to.
                _ if !node.cluster => ShardRoute {
                    shard: k,
                    leader: Some(me),
                    leader_addr: Some(my_addr.clone()),
                    generation: 0,
                    replicas: vec![me],
                },
                _ => ShardRoute {
                    shard: k,
                    leader: None,
                    leader_addr: None,
                    generation: 0,
                    replicas: Vec::new(),
                },
            }
        })
        .collect();
    let mut brokers: Vec<BrokerRoute> = reg
        .brokers
        .values()
        .map(|b| BrokerRoute {
            id: b.id,
            client_addr: b.client_addr.clone(),
            alive: b.alive,
        })
        .collect();
    if brokers.is_empty() {
        brokers.push(BrokerRoute {
            id: me,
            client_addr: my_addr,
            alive: true,
        });
    }
    Ok((shards, brokers))
}

/// In a cluster, each shard's leader, generation, replicas and the replicas known to
/// hold everything committed (Kafka's ISR); `None` on a single node.
pub fn partition_routes(
    node: &Node,
    tenant: &str,
    namespace: &str,
    name: &str,
    shards: u32,
) -> Option<Vec<PartitionRoute>> {
    if !node.cluster {
        return None;
    }
    let reg = node.registry.borrow();
    let routes = (0..shards)
        .map(|k| {
            let key = shard_key(tenant, namespace, name, k);
            let Some(p) = reg.placements.get(&key) else {
                return PartitionRoute::default();
            };
            let in_sync = node
                .meta
                .replication(&key)
                .filter(|r| r.generation == p.generation)
                .map(|r| r.in_sync.into_iter().collect())
                .unwrap_or_else(|| p.replicas.clone());
            PartitionRoute {
                leader: p
                    .leader
                    .filter(|l| reg.brokers.get(l).is_some_and(|b| b.alive)),
                generation: p.generation,
                replicas: p.replicas.clone(),
                in_sync,
            }
        })
        .collect();
    Some(routes)
}

/// In a cluster, every registered broker's id, Kafka address and liveness; `None` on a
/// single node.
pub fn kafka_brokers(node: &Node) -> Option<Vec<(u64, Option<String>, bool)>> {
    if !node.cluster {
        return None;
    }
    Some(
        node.registry
            .borrow()
            .brokers
            .values()
            .map(|b| (b.id, b.kafka_addr.clone(), b.alive))
            .collect(),
    )
}
