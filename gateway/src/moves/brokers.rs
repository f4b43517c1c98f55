//! The broker list as `felixctl broker list` shows it, and removing a broker for good.
//!
//! Decides what the list adds to the control plane's registry: each live broker's hot
//! bytes, asked of that broker over the internal network (`POST /repl/broker-stats`), with
//! a short deadline so one slow broker leaves a blank, not a hung list. And what removing a
//! broker takes: it must be stopped and hold no replica (the control plane checks both when
//! it applies `RemoveBroker`), then it leaves the registry and the control plane's members.
//!
//! Invariant: a refused removal changes nothing; a removal that left the registry but not
//! the membership (the control plane's leader changed meanwhile) is finished by asking
//! again.

use std::sync::Weak;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use felix_meta::model::{Command, MetaState};
use felix_wire::moves::BrokerInfo;
use felix_wire::protocol::{ErrorBody, codes};
use serde::{Deserialize, Serialize};

use crate::broker::{Broker, BrokerSlot};
use crate::errors::{err, meta_error};
use crate::replication::transport::FetchError;

/// The internal route another broker asks for this broker's figures.
pub const ROUTE: &str = "/repl/broker-stats";

/// How long the list waits for each broker's figures.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// What a broker reports of itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BrokerStats {
    /// Bytes of the local logs of the shards it holds open.
    pub hot_bytes: u64,
}

fn stats(broker: &Broker) -> BrokerStats {
    BrokerStats {
        hot_bytes: broker.shards.hot_bytes(),
    }
}

/// Serves [`ROUTE`].
pub(crate) async fn serve(
    State(slot): State<BrokerSlot>,
) -> Result<Json<BrokerStats>, (StatusCode, String)> {
    let broker = slot.get().and_then(Weak::upgrade).ok_or((
        StatusCode::SERVICE_UNAVAILABLE,
        "the broker is starting".to_owned(),
    ))?;
    Ok(Json(stats(&broker)))
}

/// Every registered broker with what it leads and holds, and the hot bytes of each that
/// answered, as the control plane's leader has them (a linearizable read; `admin.rs`).
pub(crate) async fn list(broker: &Broker) -> Result<Vec<BrokerInfo>, ErrorBody> {
    let node = &broker.node;
    let registered = node
        .meta
        .read(|s: &MetaState| {
            s.brokers
                .values()
                .map(|b| (b.clone(), s.broker_load(b.id)))
                .collect::<Vec<_>>()
        })
        .await
        .map_err(meta_error)?;
    let me = broker.broker_id();
    let asks = registered
        .into_iter()
        .map(|(b, (replicas, leaders))| async move {
            let hot_bytes = if b.id == me {
                Some(stats(broker).hot_bytes)
            } else if b.alive {
                node.peers
                    .call(
                        &b.internal_addr,
                        ROUTE,
                        &(),
                        ASK_TIMEOUT,
                        FetchError::Failed,
                    )
                    .await
                    .ok()
                    .and_then(|a| serde_json::from_slice::<BrokerStats>(&a.body).ok())
                    .map(|s| s.hot_bytes)
            } else {
                None
            };
            BrokerInfo {
                id: b.id,
                quic_addr: b.client_addr,
                kafka_addr: b.kafka_addr,
                zone: b.zone,
                alive: b.alive,
                draining: b.draining,
                leaders: leaders as u64,
                replicas: replicas as u64,
                hot_bytes,
            }
        });
    Ok(futures::future::join_all(asks).await)
}

/// Removes broker `id` from the registry and the control plane's members.
pub(crate) async fn remove(broker: &Broker, id: u64) -> Result<(), ErrorBody> {
    let node = &broker.node;
    if id == broker.broker_id() {
        return Err(err(
            codes::INVALID_ARGUMENT,
            "invalid_argument",
            format!("broker {id} is the one answering: ask another broker to remove it"),
        ));
    }
    let registered = node.meta.local(|s| s.brokers.contains_key(&id));
    let member = node.meta.is_member(id);
    if !registered && !member {
        return Err(err(
            codes::INVALID_ARGUMENT,
            "unknown_broker",
            format!("no broker {id} is registered"),
        ));
    }
    if registered {
        node.propose(Command::RemoveBroker { id }).await?;
    }
    node.meta.remove_member(id).await.map_err(meta_error)
}
