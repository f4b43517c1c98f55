//! `Request::Cluster`: the broker list, drains and shard moves `felixctl` asks for.
//!
//! Decides what an operator may ask and checks it before anything is proposed: a move names
//! a placed shard of a durable or ephemeral stream, a live destination outside the replica
//! set and a source inside it (the control plane checks again when it applies). A move or a
//! drain is answered once recorded; the shard's leader and the controller carry it out.
//!
//! Invariant: a refused request changes nothing, and a single node (no cluster) refuses
//! every move, since there is nowhere to move to. The broker list, the moves under way and
//! a rebalance plan are read after a linearizable read barrier, not from this broker's copy
//! of the control plane alone, which may lag the leader's: a plan is made from the
//! placements as they are (a failover or a move the controller or another broker started a
//! moment ago included), so its moves are not refused for a stale view.

use felix_meta::model::{Command, MetaState, ShardKey};
use felix_wire::moves::{ClusterRequest, ClusterResponse, MoveInfo};
use felix_wire::protocol::{ErrorBody, codes};

use crate::broker::Broker;
use crate::errors::{err, meta_error};
use felix_meta::Applied;

/// Answers one cluster operation.
pub(crate) async fn serve(
    broker: &Broker,
    request: ClusterRequest,
) -> Result<ClusterResponse, ErrorBody> {
    let node = &broker.node;
    match request {
        ClusterRequest::ListBrokers {} => Ok(ClusterResponse::Brokers {
            brokers: super::brokers::list(broker).await?,
        }),
        ClusterRequest::RemoveBroker { id } => {
            if !node.cluster {
                return Err(single_node());
            }
            super::brokers::remove(broker, id).await?;
            Ok(ClusterResponse::Done {})
        }
        ClusterRequest::ListMoves {} => Ok(ClusterResponse::Moves {
            moves: node.meta.read(moves).await.map_err(meta_error)?,
        }),
        ClusterRequest::PlanRebalance {} => Ok(ClusterResponse::Moves {
            moves: node
                .meta
                .read(felix_meta::rebalance::plan_rebalance)
                .await
                .map_err(meta_error)?
                .into_iter()
                .map(|m| MoveInfo {
                    tenant: m.shard.tenant,
                    namespace: m.shard.namespace,
                    stream: m.shard.stream,
                    shard: m.shard.shard,
                    from: m.from,
                    to: m.to,
                    phase: "planned".to_owned(),
                })
                .collect(),
        }),
        ClusterRequest::DrainBroker { id } | ClusterRequest::UndrainBroker { id } => {
            let draining = matches!(request, ClusterRequest::DrainBroker { .. });
            if draining && !node.cluster {
                return Err(single_node());
            }
            node.propose(Command::SetBrokerDraining { id, draining })
                .await?;
            Ok(ClusterResponse::Done {})
        }
        ClusterRequest::MoveShard {
            tenant,
            namespace,
            stream,
            shard,
            to,
            replace,
            force,
        } => {
            if !node.cluster {
                return Err(single_node());
            }
            let key = ShardKey {
                tenant,
                namespace,
                stream,
                shard,
            };
            if force {
                return super::force::force(broker, key, to).await;
            }
            // The leader's replica unless told which: moving a shard means moving who serves it.
            let from = match replace {
                Some(from) => from,
                None => node
                    .meta
                    .placement(&key)
                    .and_then(|p| p.leader)
                    .ok_or_else(|| {
                        err(
                            codes::SHARD_UNAVAILABLE,
                            "no_leader",
                            format!(
                                "shard {key} has no leader to move; name the replica with --replace"
                            ),
                        )
                        .retry_after(500)
                    })?,
            };
            match node
                .propose(Command::StartMove {
                    shard: key,
                    from,
                    to,
                })
                .await?
            {
                Applied::Generation { generation } => {
                    Ok(ClusterResponse::MoveStarted { generation })
                }
                _ => Ok(ClusterResponse::Done {}),
            }
        }
    }
}

fn single_node() -> ErrorBody {
    err(
        codes::INVALID_ARGUMENT,
        "not_a_cluster",
        "this broker runs alone (no --cluster): there is no other broker to move shards to",
    )
}

/// The moves under way.
fn moves(s: &MetaState) -> Vec<MoveInfo> {
    s.placements
        .iter()
        .filter_map(|(k, p)| {
            let m = p.moving?;
            Some(MoveInfo {
                tenant: k.tenant.clone(),
                namespace: k.namespace.clone(),
                stream: k.stream.clone(),
                shard: k.shard,
                from: m.from,
                to: m.to,
                phase: if m.adds() {
                    "adding"
                } else if p.leader == Some(m.to) {
                    "handed_over"
                } else {
                    "catching_up"
                }
                .to_owned(),
            })
        })
        .collect()
}
