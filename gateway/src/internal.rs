//! The routes a broker serves to other brokers on its internal address, next to the control
//! plane's: `POST /repl/fetch` (a follower's fetch, served by the shard's leader),
//! `POST /repl/publish` (a publish forwarded by a broker that does not lead the shard),
//! `POST /repl/segment` (a range of records for a replica rewriting a damaged segment),
//! `POST /repl/groups` (a copy of a shard's group journal, `crate::groups::copy`),
//! `POST /repl/cache` (a cache operation forwarded to the key's owner),
//! `POST /repl/kafka-offsets` (a Kafka group's offsets, forwarded by its coordinator to a
//! partition's leader, `crate::groups::kafka_offsets`),
//! `POST /repl/broker-stats` (this broker's figures for `felixctl broker list`) and
//! `POST /repl/shard-end` (where this broker's copy of a shard ends, before a forced move).
//!
//! Invariant: until the broker has started, every route refuses with a retryable error;
//! nothing here decides anything the client protocol does not decide the same way. Who may
//! call them is decided before these handlers run: with a cluster secret, the control
//! plane's server refuses unsigned requests (`felix_meta::network::require_signed`).

use std::sync::Weak;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use felix_wire::protocol::{ErrorBody, codes};

use crate::forward::{ForwardedAnswer, serve_forwarded_publish};
use crate::replication::leader::serve_fetch;
use crate::replication::segment_copy::{self, SegmentCopyRequest};
use crate::replication::transport::{FetchError, FetchRequest, Fetched};

pub use crate::broker::BrokerSlot;

/// Routes served on the internal address next to the control plane's.
pub fn router(slot: BrokerSlot) -> axum::Router {
    axum::Router::new()
        .route("/repl/fetch", post(fetch))
        .route("/repl/publish", post(forwarded_publish))
        .route("/repl/segment", post(segment))
        .route(crate::groups::copy::PATH, post(crate::groups::copy::serve))
        .route(crate::cache::forward::ROUTE, post(forwarded_cache))
        .route(
            crate::groups::kafka_offsets::PATH,
            post(crate::groups::kafka_offsets::serve),
        )
        .route(
            crate::moves::brokers::ROUTE,
            post(crate::moves::brokers::serve),
        )
        .route(crate::moves::force::ROUTE, post(crate::moves::force::serve))
        .with_state(slot)
}

async fn forwarded_publish(
    State(slot): State<BrokerSlot>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Json<ForwardedAnswer> {
    let Some(broker) = slot.get().and_then(Weak::upgrade) else {
        return Json(ForwardedAnswer::Error {
            error: ErrorBody::new(
                codes::SHARD_UNAVAILABLE,
                "starting",
                "the broker is starting",
            )
            .retry_after(500),
        });
    };
    Json(serve_forwarded_publish(&broker, &headers, body).await)
}

/// A cache operation forwarded by a broker that does not own the key (`cache::forward`).
async fn forwarded_cache(
    State(slot): State<BrokerSlot>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Bytes {
    match slot.get().and_then(Weak::upgrade) {
        Some(broker) => crate::cache::requests::serve_forwarded(&broker, &headers, body).await,
        None => crate::cache::requests::starting(),
    }
}

async fn fetch(
    State(slot): State<BrokerSlot>,
    Json(req): Json<FetchRequest>,
) -> Result<Fetched, FetchError> {
    let broker = slot
        .get()
        .and_then(Weak::upgrade)
        .ok_or_else(|| FetchError::Failed("the broker is starting".into()))?;
    let shard = broker
        .open_replica(&req.shard)
        .map_err(|e| FetchError::Failed(e.message))?;
    drop(broker);
    serve_fetch(shard, req).await
}

async fn segment(
    State(slot): State<BrokerSlot>,
    Json(req): Json<SegmentCopyRequest>,
) -> Result<Bytes, FetchError> {
    let broker = slot
        .get()
        .and_then(Weak::upgrade)
        .ok_or_else(|| FetchError::Failed("the broker is starting".into()))?;
    segment_copy::serve(&broker, req).await
}
