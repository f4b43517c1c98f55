//! The control plane's internal HTTP server: the routes, their body limits, and draining
//! on shutdown.
//!
//! Decides what each route does with a request and how the server stops. The invariants: a
//! node that does not accept votes (its volume was wiped and it has not caught up) never
//! grants one; a command the state machine refuses is a 200 carrying the refusal, so only
//! transport and leadership failures are HTTP errors; and after the shutdown signal the
//! server stops accepting at once and waits at most [`SHUTDOWN_DRAIN`] for requests in
//! flight.
//!
//! [`raft_router`] serves a [`MetaService`] (implemented by the node):
//!
//! | route                  | body in               | 200 body                                   |
//! |------------------------|-----------------------|--------------------------------------------|
//! | `POST /raft/append`    | `AppendEntriesRequest`| `Result<AppendEntriesResponse, RaftError>` |
//! | `POST /raft/snapshot`  | `InstallSnapshotRequest` | `Result<InstallSnapshotResponse, RaftError<_, InstallSnapshotError>>` |
//! | `POST /raft/vote`      | `VoteRequest`         | `Result<VoteResponse, RaftError>`; **503** (text) while the node does not accept votes |
//! | `POST /meta/propose`   | [`Command`]           | [`CommandResult`] (a refused command is a 200 with `Err`) |
//! | `POST /meta/read_index`| none                  | `{"index": u64}`                           |
//! | `POST /meta/lease`     | `{"broker": u64}`     | `{"lease_ms": u64}` (the meta leader only; elsewhere 421 naming the leader) |
//! | `GET /meta/status`     | none                  | [`NodeStatus`]                             |
//! | `GET /meta/dump`       | none                  | the local applied state (JSON)             |
//! | `GET /healthz`         | none                  | `ok`; **503** `not ready`                  |
//!
//! With a cluster secret the node wraps these routes (and the broker's) in
//! [`require_signed`](super::require_signed): every route but `/healthz` answers **401**
//! to a request not signed with the secret, before its handler runs.
//!
//! A [`ForwardError`] from the service is answered with [`ForwardError::http_status`] and a
//! JSON [`ErrorBody`](super::ErrorBody) (see `errors.rs`). Malformed requests get axum's own
//! 4xx (400/415/422) and oversized bodies 413. Bodies are limited to [`RAFT_BODY_LIMIT`] on
//! `/raft/append` and `/raft/snapshot`, and to [`BODY_LIMIT`] elsewhere.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::get;
use axum::routing::post;
use futures::future::BoxFuture;
use openraft::error::InstallSnapshotError;
use openraft::error::RaftError;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::InstallSnapshotRequest;
use openraft::raft::InstallSnapshotResponse;
use openraft::raft::VoteRequest;

use super::errors::ForwardError;
use super::messages::{
    BODY_LIMIT, LeaseGrant, LeaseRequest, MembershipChange, NodeStatus, RAFT_BODY_LIMIT,
    ReadIndexBody,
};
use crate::model::Command;
use crate::types::{CommandResult, NodeId, Raft, TypeConfig};

/// After the shutdown signal, how long [`serve`] waits for in-flight requests to finish.
/// Connections still busy after that are left to finish on their own.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// What the node provides to the routes of [`raft_router`].
pub trait MetaService: Send + Sync + 'static {
    /// The local Raft instance, which the `/raft/*` routes call.
    fn raft(&self) -> &Raft;

    /// Whether this node may vote. A node whose volume was wiped must not vote until it has
    /// caught up, or it could elect a leader that lacks committed entries: while this is
    /// `false`, `/raft/vote` answers 503 and the candidate does not get this node's vote.
    fn accepting_votes(&self) -> bool;

    /// Proposes a command (if this node is the leader); `Err(NotLeader)` otherwise.
    fn propose(&self, cmd: Command) -> BoxFuture<'_, Result<CommandResult, ForwardError>>;

    /// The read index: the log index this leader has applied after confirming it still
    /// leads. `Err(NotLeader)` on a follower.
    fn read_index(&self) -> BoxFuture<'_, Result<u64, ForwardError>>;

    /// This node's view of the group.
    fn status(&self) -> BoxFuture<'_, NodeStatus>;

    /// The local applied state, for tests and debugging.
    fn dump(&self) -> BoxFuture<'_, serde_json::Value>;

    /// Whether the node is ready (`/healthz` answers 200 `ok`, else 503 `not ready`).
    fn healthz(&self) -> BoxFuture<'_, bool>;

    /// Renews a broker's shard-leader lease and returns the duration granted (the meta
    /// leader only; `Err(NotLeader)` elsewhere, so a renewal is never forwarded in a loop).
    fn renew_lease(&self, broker: NodeId) -> BoxFuture<'_, Result<Duration, ForwardError>> {
        let _ = broker;
        Box::pin(async {
            Err(ForwardError::Remote {
                status: 501,
                message: "leases are not served here".into(),
            })
        })
    }

    /// Applies a membership change (leader only; `Err(NotLeader)` elsewhere).
    fn change_membership(
        &self,
        change: MembershipChange,
    ) -> BoxFuture<'_, Result<(), ForwardError>> {
        let _ = change;
        Box::pin(async {
            Err(ForwardError::Remote {
                status: 501,
                message: "membership changes are not served here".into(),
            })
        })
    }
}

type Svc = Arc<dyn MetaService>;

/// The routes of the control plane's internal HTTP server (see the module docs).
pub fn raft_router(service: Arc<dyn MetaService>) -> Router {
    let raft_limit = || DefaultBodyLimit::max(RAFT_BODY_LIMIT);
    let limit = || DefaultBodyLimit::max(BODY_LIMIT);
    Router::new()
        .route("/raft/append", post(raft_append).layer(raft_limit()))
        .route("/raft/snapshot", post(raft_snapshot).layer(raft_limit()))
        .route("/raft/vote", post(raft_vote).layer(limit()))
        .route("/meta/propose", post(meta_propose).layer(limit()))
        .route("/meta/read_index", post(meta_read_index).layer(limit()))
        .route("/meta/membership", post(meta_membership).layer(limit()))
        .route("/meta/lease", post(meta_lease).layer(limit()))
        .route("/meta/status", get(meta_status))
        .route("/meta/dump", get(meta_dump))
        .route("/healthz", get(healthz))
        .with_state(service)
}

async fn raft_append(
    State(svc): State<Svc>,
    Json(rpc): Json<AppendEntriesRequest<TypeConfig>>,
) -> Json<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>> {
    Json(svc.raft().append_entries(rpc).await)
}

async fn raft_snapshot(
    State(svc): State<Svc>,
    Json(rpc): Json<InstallSnapshotRequest<TypeConfig>>,
) -> Json<Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>> {
    Json(svc.raft().install_snapshot(rpc).await)
}

async fn raft_vote(State(svc): State<Svc>, Json(rpc): Json<VoteRequest<NodeId>>) -> Response {
    if !svc.accepting_votes() {
        tracing::info!(vote = %rpc.vote, "refusing to vote: not accepting votes yet");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not accepting votes: this node is catching up after losing its state",
        )
            .into_response();
    }
    Json(svc.raft().vote(rpc).await).into_response()
}

fn error_response(e: &ForwardError) -> Response {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(e.to_body())).into_response()
}

async fn meta_propose(State(svc): State<Svc>, Json(cmd): Json<Command>) -> Response {
    match svc.propose(cmd).await {
        Ok(result) => Json(result).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn meta_read_index(State(svc): State<Svc>) -> Response {
    match svc.read_index().await {
        Ok(index) => Json(ReadIndexBody { index }).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn meta_lease(State(svc): State<Svc>, Json(req): Json<LeaseRequest>) -> Response {
    match svc.renew_lease(req.broker).await {
        Ok(d) => Json(LeaseGrant {
            lease_ms: d.as_millis().try_into().unwrap_or(u64::MAX),
        })
        .into_response(),
        Err(e) => error_response(&e),
    }
}

async fn meta_membership(State(svc): State<Svc>, Json(change): Json<MembershipChange>) -> Response {
    match svc.change_membership(change).await {
        Ok(()) => Json(serde_json::json!({"ok": true})).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn meta_status(State(svc): State<Svc>) -> Json<NodeStatus> {
    Json(svc.status().await)
}

async fn meta_dump(State(svc): State<Svc>) -> Json<serde_json::Value> {
    Json(svc.dump().await)
}

async fn healthz(State(svc): State<Svc>) -> (StatusCode, &'static str) {
    if svc.healthz().await {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting (the
/// listener is closed at once), lets in-flight requests finish for at most
/// [`SHUTDOWN_DRAIN`] and returns. Connections still busy after that finish on their own in
/// their tasks. (axum's server does not fail: accept errors are retried inside it.)
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let (signalled_tx, signalled_rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, router).with_graceful_shutdown(async move {
        shutdown.await;
        let _ = signalled_tx.send(());
    });
    let server = std::future::IntoFuture::into_future(server);
    tokio::pin!(server);
    let res = tokio::select! {
        res = &mut server => res,
        signalled = signalled_rx => match signalled {
            Ok(()) => match tokio::time::timeout(SHUTDOWN_DRAIN, &mut server).await {
                Ok(res) => res,
                Err(_) => {
                    tracing::warn!(
                        "internal HTTP server: requests still in flight {SHUTDOWN_DRAIN:?} \
                         after shutdown; not waiting for them"
                    );
                    Ok(())
                }
            },
            // The server ended before the signal (it cannot).
            Err(_) => server.await,
        },
    };
    if let Err(e) = res {
        tracing::error!(error = %e, "internal HTTP server failed");
    }
}
