//! `felixctl shard move --force`: a Leader stream's shard whose leader is dead, handed to a
//! follower's copy, the loss accepted (the control plane's side: `felix_meta` `force.rs`).
//!
//! Decides where the forced generation starts: the broker answering asks the chosen
//! follower for the end of its copy (`POST /repl/shard-end`; its own copy if it is that
//! follower) and proposes `ForceLeader` there. The answer names the offset from which the
//! old leader's acknowledged records are lost, so the operator's tooling can say so.
//!
//! Invariant: nothing is forced on a guess: a follower that does not answer is a refusal,
//! and the control plane refuses again if the leader is alive, the stream is Quorum, the
//! follower holds no copy, or the generation moved on meanwhile.

use std::sync::Weak;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use felix_meta::Applied;
use felix_meta::model::{Command, ShardKey};
use felix_wire::moves::ClusterResponse;
use felix_wire::protocol::{ErrorBody, codes};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::broker::{Broker, BrokerSlot};
use crate::errors::err;
use crate::replication::transport::FetchError;

/// The internal route a broker asks a replica for the end of its copy.
pub const ROUTE: &str = "/repl/shard-end";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardEndRequest {
    pub shard: ShardKey,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardEnd {
    /// One past the last record of the replica's local copy.
    pub end: u64,
}

fn local_end(broker: &Broker, shard: &ShardKey) -> Result<u64, String> {
    let s = broker.open_replica(shard).map_err(|e| e.message)?;
    s.log
        .as_ref()
        .map(|l| l.committed_offset())
        .ok_or_else(|| format!("{shard} keeps no log here"))
}

/// Serves [`ROUTE`].
pub(crate) async fn serve(
    State(slot): State<BrokerSlot>,
    Json(req): Json<ShardEndRequest>,
) -> Result<Json<ShardEnd>, (StatusCode, String)> {
    let broker = slot.get().and_then(Weak::upgrade).ok_or((
        StatusCode::SERVICE_UNAVAILABLE,
        "the broker is starting".to_owned(),
    ))?;
    local_end(&broker, &req.shard)
        .map(|end| Json(ShardEnd { end }))
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e))
}

/// Forces `shard` onto broker `to`'s copy.
pub(crate) async fn force(
    broker: &Broker,
    shard: ShardKey,
    to: u64,
) -> Result<ClusterResponse, ErrorBody> {
    let node = &broker.node;
    let p = node.meta.placement(&shard).ok_or_else(|| {
        err(
            codes::INVALID_ARGUMENT,
            "invalid_argument",
            format!("{shard} is not placed"),
        )
    })?;
    let refused = |m: String| err(codes::INVALID_ARGUMENT, "invalid_argument", m);
    if !p.replicas.contains(&to) {
        return Err(refused(format!(
            "broker {to} holds no copy of {shard} (replicas: {:?}): --force promotes a follower",
            p.replicas
        )));
    }
    let end = if to == broker.broker_id() {
        local_end(broker, &shard).map_err(refused)?
    } else {
        let addr = node.internal_addr_of(to).ok_or_else(|| {
            refused(format!(
                "broker {to} is not registered with an internal address"
            ))
        })?;
        let answer = node
            .peers
            .call(
                &addr,
                ROUTE,
                &ShardEndRequest {
                    shard: shard.clone(),
                },
                Duration::from_secs(5),
                FetchError::Failed,
            )
            .await
            .map_err(|e| {
                err(
                    codes::SHARD_UNAVAILABLE,
                    "replica_unreachable",
                    format!("broker {to} did not say where its copy of {shard} ends: {e}"),
                )
                .retry_after(1000)
            })?;
        serde_json::from_slice::<ShardEnd>(&answer.body)
            .map_err(|e| refused(format!("broker {to} answered unreadably: {e}")))?
            .end
    };
    let applied = node
        .propose(Command::ForceLeader {
            shard: shard.clone(),
            generation: p.generation,
            to,
            end,
        })
        .await?;
    let Applied::Generation { generation } = applied else {
        return Ok(ClusterResponse::Done {});
    };
    warn!(shard = %shard, to, start = end, old_leader = ?p.leader, generation,
        "shard forced onto a follower's copy: what the old leader acknowledged from here on is lost");
    Ok(ClusterResponse::Forced {
        generation,
        start: end,
        old_leader: p.leader,
    })
}
