//! Raft RPCs and forwarded control-plane requests, as HTTP/1.1 + JSON on each node's
//! internal address.
//!
//! Why HTTP and not QUIC (yet): HTTP/1.1 with axum and hyper is the simplest well-kept stack
//! we have; axum already serves the admin endpoints, so the control plane adds no new
//! dependency; and every route can be poked with `curl` while debugging a cluster. The Raft
//! traffic of the control plane is small (a few heartbeats a second and rare commands), so
//! JSON costs nothing that matters. QUIC arrives with the client protocol; replication may
//! move there then.
//!
//! # Client side
//!
//! * [`HttpNetworkFactory`] implements openraft's [`RaftNetworkFactory`]; each
//!   [`HttpConnection`] it makes POSTs the Raft RPCs to `http://{addr}/raft/append`,
//!   `/raft/snapshot` and `/raft/vote`, within the RPC's `hard_ttl`.
//! * [`PeerClient`] holds the pooled hyper client shared by all connections, and the helpers
//!   [`MetaHandle`](crate::MetaHandle) uses to forward to the leader:
//!   [`PeerClient::forward_propose`], [`PeerClient::read_index`], [`PeerClient::status`]
//!   (also available on the factory itself).
//!
//! How Raft RPC failures reach openraft:
//!
//! | what happened                                   | `RPCError`                        |
//! |-------------------------------------------------|-----------------------------------|
//! | connect / IO error, any non-2xx answer (5xx, the 503 of a node refusing votes, 4xx) | `Unreachable` |
//! | no answer within `hard_ttl`                      | `Timeout`                         |
//! | append larger than [`RAFT_BODY_LIMIT`], or a 413 | `PayloadTooLarge` (half the entries), `Unreachable` for one entry |
//! | 200 with `Err(RaftError)` in the body            | `RemoteError`                     |
//! | 200 with a body that does not parse             | `Unreachable`                     |
//!
//! # Server side
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
//! A [`ForwardError`] from the service is answered with [`ForwardError::http_status`] and a
//! JSON [`ErrorBody`], from which the client rebuilds the same `ForwardError`:
//! `NotLeader` → **421** Misdirected Request (the body names the leader if known),
//! `Unreachable` → **503**, `Timeout` → **504**, `Interrupted` → **502**,
//! `Remote { status, .. }` → `status`. On the client, failing to connect is `Unreachable`
//! (not delivered, safe to retry), a connection broken after sending is `Interrupted` and no
//! answer within the timeout is `Timeout` (both: a proposal may or may not be applied), and
//! an error answer without an [`ErrorBody`] is `Remote` (421 alone is `NotLeader`).
//! Malformed requests get axum's own 4xx (400/415/422) and oversized bodies 413. Bodies are
//! limited to [`RAFT_BODY_LIMIT`] on `/raft/append` and `/raft/snapshot`, and to
//! [`BODY_LIMIT`] elsewhere.

use std::error::Error as StdError;
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
use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use http_body_util::Full;
use http_body_util::Limited;
use hyper::Method;
use hyper::Request;
use hyper::header;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use openraft::BasicNode;
use openraft::RPCTypes;
use openraft::error::InstallSnapshotError;
use openraft::error::PayloadTooLarge;
use openraft::error::RPCError;
use openraft::error::RaftError;
use openraft::error::RemoteError;
use openraft::error::Timeout;
use openraft::error::Unreachable;
use openraft::network::RPCOption;
use openraft::network::RaftNetwork;
use openraft::network::RaftNetworkFactory;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::InstallSnapshotRequest;
use openraft::raft::InstallSnapshotResponse;
use openraft::raft::VoteRequest;
use openraft::raft::VoteResponse;
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::model::Command;
use crate::types::CommandResult;
use crate::types::NodeId;
use crate::types::Raft;
use crate::types::TypeConfig;

/// Request body limit of `/raft/append` and `/raft/snapshot`. openraft sends snapshots in
/// chunks of `Config::snapshot_max_chunk_size` (3 MiB by default), which JSON (bytes as
/// numbers) inflates up to about 4×; an append larger than this is split by the sender.
pub const RAFT_BODY_LIMIT: usize = 64 * 1024 * 1024;

/// Request body limit of every other route (votes, proposals).
pub const BODY_LIMIT: usize = 8 * 1024 * 1024;

/// Largest response body the client reads.
const RESPONSE_LIMIT: usize = 64 * 1024 * 1024;

/// How long idle pooled connections to a peer are kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Idle pooled connections kept per peer.
const POOL_MAX_IDLE_PER_HOST: usize = 8;

/// After the shutdown signal, how long [`serve`] waits for in-flight requests to finish.
/// Connections still busy after that are left to finish on their own.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------
// Shared types
// ---------------------------------------------------------------------------------------

/// What `GET /meta/status` answers: one node's view of the group.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NodeStatus {
    pub node_id: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub last_applied: Option<u64>,
    pub committed: Option<u64>,
    pub has_state: bool,
    pub accepting_votes: bool,
    pub members: Vec<(NodeId, String)>,
    /// Index of the last entry in this node's Raft log (committed or not).
    #[serde(default)]
    pub last_log_index: Option<u64>,
    /// Last log index covered by this node's current snapshot.
    #[serde(default)]
    pub snapshot: Option<u64>,
    /// Last log index this node has purged from its Raft log.
    #[serde(default)]
    pub purged: Option<u64>,
}

/// Why a forwarded request (propose, read index, status) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    /// The request was not delivered: the peer could not be connected to. Safe to retry,
    /// here or elsewhere: a proposed command was not applied. A [`MetaService`] returns this
    /// only when that holds.
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    /// No complete answer in time. A proposed command may or may not be applied.
    #[error("request timed out")]
    Timeout,
    /// The connection broke after the request may have been sent (reset, closed, body cut
    /// short). Like `Timeout`, a proposed command may or may not be applied.
    #[error("exchange interrupted: {0}")]
    Interrupted(String),
    /// The peer answered with an error status that is none of the other variants.
    #[error("peer answered HTTP {status}: {message}")]
    Remote { status: u16, message: String },
    /// The peer is not the leader; `leader` is the leader it knows of (id, internal address).
    #[error("not the leader (leader: {})", fmt_leader(.leader))]
    NotLeader { leader: Option<(NodeId, String)> },
}

fn fmt_leader(leader: &Option<(NodeId, String)>) -> String {
    match leader {
        Some((id, addr)) => format!("{id} at {addr}"),
        None => "unknown".to_owned(),
    }
}

impl ForwardError {
    /// The HTTP status the server answers this error with.
    pub fn http_status(&self) -> u16 {
        match self {
            ForwardError::NotLeader { .. } => 421,
            ForwardError::Unreachable(_) => 503,
            ForwardError::Timeout => 504,
            ForwardError::Interrupted(_) => 502,
            ForwardError::Remote { status, .. } if (400..=599).contains(status) => *status,
            ForwardError::Remote { .. } => 500,
        }
    }

    fn to_body(&self) -> ErrorBody {
        let (error, leader) = match self {
            ForwardError::NotLeader { leader } => ("not_leader", leader.clone()),
            ForwardError::Unreachable(_) => ("unreachable", None),
            ForwardError::Timeout => ("timeout", None),
            ForwardError::Interrupted(_) => ("interrupted", None),
            ForwardError::Remote { .. } => ("remote", None),
        };
        let message = match self {
            ForwardError::Unreachable(m)
            | ForwardError::Interrupted(m)
            | ForwardError::Remote { message: m, .. } => m.clone(),
            other => other.to_string(),
        };
        ErrorBody {
            error: error.to_owned(),
            message,
            leader,
        }
    }

    /// Rebuilds the error from a non-2xx answer.
    fn from_response(status: u16, body: &[u8]) -> ForwardError {
        if let Ok(b) = serde_json::from_slice::<ErrorBody>(body) {
            return match b.error.as_str() {
                "not_leader" => ForwardError::NotLeader { leader: b.leader },
                "unreachable" => ForwardError::Unreachable(b.message),
                "timeout" => ForwardError::Timeout,
                "interrupted" => ForwardError::Interrupted(b.message),
                _ => ForwardError::Remote {
                    status,
                    message: b.message,
                },
            };
        }
        let text = body_snippet(body);
        match status {
            421 => ForwardError::NotLeader { leader: None },
            _ => ForwardError::Remote {
                status,
                message: text,
            },
        }
    }
}

/// The JSON body of an error answer on the `/meta/*` routes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ErrorBody {
    /// `not_leader`, `unreachable`, `timeout`, `interrupted` or `remote`.
    pub error: String,
    pub message: String,
    /// With `not_leader`: the leader's id and internal address, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<(NodeId, String)>,
}

/// The body of `POST /meta/lease`: the broker whose shard-leader lease to renew.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRequest {
    pub broker: NodeId,
}

/// The 200 body of `POST /meta/lease`: the duration granted, in milliseconds.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGrant {
    pub lease_ms: u64,
}

/// The 200 body of `POST /meta/read_index`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
struct ReadIndexBody {
    index: u64,
}

/// A message carried as an error (for openraft's `Unreachable::new(&e)` and friends).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct NetError(String);

fn body_snippet(body: &[u8]) -> String {
    const MAX: usize = 512;
    let s = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    let s = s.trim();
    if body.len() > MAX {
        format!("{s}…")
    } else {
        s.to_owned()
    }
}

// ---------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------

/// Why a single HTTP exchange failed, before looking at the status.
#[derive(Debug)]
enum CallError {
    /// Not delivered: the request could not be built or the connection not made.
    Connect(String),
    /// Sending or reading the answer failed: the request may have been delivered.
    Broken(String),
    /// No complete answer within the timeout.
    Timeout,
}

/// The HTTP client of the control plane: a pooled hyper client (cheap to clone, clones share
/// the pool) and the default timeout of forwarded requests.
#[derive(Clone, Debug)]
pub struct PeerClient {
    http: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl PeerClient {
    /// A client whose forwarded requests time out after `timeout` (Raft RPCs use their own
    /// `hard_ttl`).
    pub fn new(timeout: Duration) -> PeerClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
            .build(connector);
        PeerClient { http, timeout }
    }

    /// The default timeout of forwarded requests.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The same client (same connection pool) with another default timeout.
    pub fn with_timeout(&self, timeout: Duration) -> PeerClient {
        PeerClient {
            http: self.http.clone(),
            timeout,
        }
    }

    /// Proposes `cmd` on the node at `addr` (the leader, normally): `POST /meta/propose`.
    /// `Ok(Err(CommandError))` is a command the state machine refused.
    pub async fn forward_propose(
        &self,
        addr: &str,
        cmd: &Command,
    ) -> Result<CommandResult, ForwardError> {
        let body = serde_json::to_vec(cmd).map_err(|e| ForwardError::Remote {
            status: 400,
            message: format!("cannot encode command: {e}"),
        })?;
        // Refused here rather than by the server, which would close the connection while
        // the body is still being written (the client may see a broken pipe, not the 413).
        if body.len() > BODY_LIMIT {
            return Err(ForwardError::Remote {
                status: 413,
                message: format!(
                    "command of {} bytes is over the {BODY_LIMIT}-byte limit",
                    body.len()
                ),
            });
        }
        self.forward(Method::POST, addr, "/meta/propose", Some(body))
            .await
    }

    /// Asks the node at `addr` (the leader) for a read index: `POST /meta/read_index`. The
    /// answer is the log index the leader has applied after confirming its leadership; a
    /// read is linearizable once the local state machine has applied at least that index.
    pub async fn read_index(&self, addr: &str) -> Result<u64, ForwardError> {
        let b: ReadIndexBody = self
            .forward(Method::POST, addr, "/meta/read_index", Some(Vec::new()))
            .await?;
        Ok(b.index)
    }

    /// Renews `broker`'s shard-leader lease on the node at `addr` (the meta leader):
    /// `POST /meta/lease`. Returns the duration granted; the caller counts it from before
    /// it sent the request. Only the leader grants: another node answers `NotLeader`
    /// naming the leader it knows.
    pub async fn renew_lease(&self, addr: &str, broker: NodeId) -> Result<Duration, ForwardError> {
        let body =
            serde_json::to_vec(&LeaseRequest { broker }).map_err(|e| ForwardError::Remote {
                status: 400,
                message: format!("cannot encode lease request: {e}"),
            })?;
        let g: LeaseGrant = self
            .forward(Method::POST, addr, "/meta/lease", Some(body))
            .await?;
        Ok(Duration::from_millis(g.lease_ms))
    }

    /// Changes the group's membership through the node at `addr` (the leader):
    /// `POST /meta/membership`. Waits until the change is committed (adding a learner also
    /// waits until it has caught up), so it uses a long timeout.
    pub async fn change_membership(
        &self,
        addr: &str,
        change: &MembershipChange,
    ) -> Result<(), ForwardError> {
        let body = serde_json::to_vec(change).map_err(|e| ForwardError::Remote {
            status: 400,
            message: format!("cannot encode membership change: {e}"),
        })?;
        let slow = self.with_timeout(self.timeout.max(Duration::from_secs(60)));
        let _: serde_json::Value = slow
            .forward(Method::POST, addr, "/meta/membership", Some(body))
            .await?;
        Ok(())
    }

    /// The status of the node at `addr`: `GET /meta/status`.
    pub async fn status(&self, addr: &str) -> Result<NodeStatus, ForwardError> {
        self.forward(Method::GET, addr, "/meta/status", None).await
    }

    /// The applied state of the node at `addr`: `GET /meta/dump` (for tests and debugging).
    pub async fn dump(&self, addr: &str) -> Result<serde_json::Value, ForwardError> {
        self.forward(Method::GET, addr, "/meta/dump", None).await
    }

    /// Whether the node at `addr` reports ready on `GET /healthz` (200 → `true`, 503 →
    /// `false`).
    pub async fn healthz(&self, addr: &str) -> Result<bool, ForwardError> {
        match self
            .call(Method::GET, addr, "/healthz", None, self.timeout)
            .await
        {
            Ok((200..=299, _)) => Ok(true),
            Ok((503, _)) => Ok(false),
            Ok((status, body)) => Err(ForwardError::from_response(status, &body)),
            Err(e) => Err(e.into()),
        }
    }

    async fn forward<T: DeserializeOwned>(
        &self,
        method: Method,
        addr: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ForwardError> {
        let (status, bytes) = self.call(method, addr, path, body, self.timeout).await?;
        if !(200..=299).contains(&status) {
            return Err(ForwardError::from_response(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| ForwardError::Remote {
            status,
            message: format!("bad answer from {addr}{path}: {e}"),
        })
    }

    /// One HTTP exchange: sends, reads the whole answer, all within `timeout`.
    async fn call(
        &self,
        method: Method,
        addr: &str,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<(u16, Bytes), CallError> {
        if crate::faults::isolated() {
            return Err(CallError::Connect(format!(
                "{addr}{path}: this node is cut off the network (fault injection)"
            )));
        }
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"));
        let body = match body {
            Some(b) => {
                req = req.header(header::CONTENT_TYPE, "application/json");
                Full::new(Bytes::from(b))
            }
            None => Full::new(Bytes::new()),
        };
        let req = req
            .body(body)
            .map_err(|e| CallError::Connect(format!("bad request to {addr}{path}: {e}")))?;
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| {
                let m = format!("{addr}{path}: {}", error_chain(&e));
                if e.is_connect() {
                    CallError::Connect(m)
                } else {
                    CallError::Broken(m)
                }
            })?;
            let status = resp.status().as_u16();
            let bytes = Limited::new(resp.into_body(), RESPONSE_LIMIT)
                .collect()
                .await
                .map_err(|e| CallError::Broken(format!("{addr}{path}: reading answer: {e}")))?
                .to_bytes();
            Ok((status, bytes))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(CallError::Timeout))
    }
}

impl From<CallError> for ForwardError {
    fn from(e: CallError) -> ForwardError {
        match e {
            CallError::Connect(m) => ForwardError::Unreachable(m),
            CallError::Broken(m) => ForwardError::Interrupted(m),
            CallError::Timeout => ForwardError::Timeout,
        }
    }
}

/// `e` and its sources, `: `-separated (hyper's top-level errors say little by themselves).
fn error_chain(e: &(dyn StdError + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

/// openraft's network factory: makes an [`HttpConnection`] per target node. Clones share
/// the connection pool. It also forwards requests, like the [`PeerClient`] it holds.
#[derive(Clone, Debug)]
pub struct HttpNetworkFactory {
    local_id: Option<NodeId>,
    client: PeerClient,
}

impl HttpNetworkFactory {
    /// A factory with a fresh client whose forwarded requests time out after
    /// `default_timeout` (Raft RPCs use their `hard_ttl`).
    pub fn new(default_timeout: Duration) -> HttpNetworkFactory {
        HttpNetworkFactory::with_client(PeerClient::new(default_timeout))
    }

    /// A factory sharing `client` (and its connection pool).
    pub fn with_client(client: PeerClient) -> HttpNetworkFactory {
        HttpNetworkFactory {
            local_id: None,
            client,
        }
    }

    /// Names the local node in `RPCError::Timeout` errors (which otherwise name the target
    /// as the sender too).
    pub fn with_local_id(mut self, id: NodeId) -> HttpNetworkFactory {
        self.local_id = Some(id);
        self
    }

    /// The client, for forwarding requests.
    pub fn client(&self) -> &PeerClient {
        &self.client
    }

    /// [`PeerClient::forward_propose`].
    pub async fn forward_propose(
        &self,
        addr: &str,
        cmd: &Command,
    ) -> Result<CommandResult, ForwardError> {
        self.client.forward_propose(addr, cmd).await
    }

    /// [`PeerClient::read_index`].
    pub async fn read_index(&self, addr: &str) -> Result<u64, ForwardError> {
        self.client.read_index(addr).await
    }

    /// [`PeerClient::renew_lease`].
    pub async fn renew_lease(&self, addr: &str, broker: NodeId) -> Result<Duration, ForwardError> {
        self.client.renew_lease(addr, broker).await
    }

    /// [`PeerClient::status`].
    pub async fn status(&self, addr: &str) -> Result<NodeStatus, ForwardError> {
        self.client.status(addr).await
    }

    /// [`PeerClient::dump`].
    pub async fn dump(&self, addr: &str) -> Result<serde_json::Value, ForwardError> {
        self.client.dump(addr).await
    }

    /// [`PeerClient::healthz`].
    pub async fn healthz(&self, addr: &str) -> Result<bool, ForwardError> {
        self.client.healthz(addr).await
    }
}

impl RaftNetworkFactory<TypeConfig> for HttpNetworkFactory {
    type Network = HttpConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> HttpConnection {
        HttpConnection {
            local_id: self.local_id.unwrap_or(target),
            target,
            node: node.clone(),
            client: self.client.clone(),
        }
    }
}

/// Sends Raft RPCs to one node.
#[derive(Clone, Debug)]
pub struct HttpConnection {
    local_id: NodeId,
    target: NodeId,
    node: BasicNode,
    client: PeerClient,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, E>>;

impl HttpConnection {
    /// POSTs `rpc` to `path` within `ttl` and decodes the `Result<Resp, E>` answer.
    /// `entries` is the entry count of an append, for `PayloadTooLarge` hints.
    async fn send<Req, Resp, E>(
        &self,
        action: RPCTypes,
        path: &str,
        rpc: &Req,
        ttl: Duration,
        entries: Option<usize>,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: StdError + DeserializeOwned,
    {
        let addr = self.node.addr.as_str();
        let body =
            serde_json::to_vec(rpc).map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        let too_large = |why: String| -> RPCError<NodeId, BasicNode, E> {
            match entries {
                Some(n) if n > 1 => RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint((n / 2) as u64)
                        .with_source_error(&NetError(why)),
                ),
                _ => RPCError::Unreachable(Unreachable::new(&NetError(why))),
            }
        };
        if entries.is_some() && body.len() > RAFT_BODY_LIMIT {
            return Err(too_large(format!(
                "append of {} bytes to {addr} is over the {RAFT_BODY_LIMIT}-byte limit",
                body.len()
            )));
        }

        let (status, bytes) = match self
            .client
            .call(Method::POST, addr, path, Some(body), ttl)
            .await
        {
            Ok(answer) => answer,
            Err(CallError::Timeout) => {
                return Err(RPCError::Timeout(Timeout {
                    action,
                    id: self.local_id,
                    target: self.target,
                    timeout: ttl,
                }));
            }
            Err(CallError::Connect(m) | CallError::Broken(m)) => {
                return Err(RPCError::Unreachable(Unreachable::new(&NetError(m))));
            }
        };

        if status == 413 {
            return Err(too_large(format!(
                "{addr}{path} answered 413: {}",
                body_snippet(&bytes)
            )));
        }
        if !(200..=299).contains(&status) {
            let m = format!(
                "{addr}{path} answered HTTP {status}: {}",
                body_snippet(&bytes)
            );
            tracing::debug!(target = self.target, "raft rpc refused: {m}");
            return Err(RPCError::Unreachable(Unreachable::new(&NetError(m))));
        }
        match serde_json::from_slice::<Result<Resp, E>>(&bytes) {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                e,
            ))),
            Err(e) => Err(RPCError::Unreachable(Unreachable::new(&NetError(format!(
                "bad answer from {addr}{path}: {e}"
            ))))),
        }
    }
}

impl RaftNetwork<TypeConfig> for HttpConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        let entries = Some(rpc.entries.len());
        self.send(
            RPCTypes::AppendEntries,
            "/raft/append",
            &rpc,
            option.hard_ttl(),
            entries,
        )
        .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.send(
            RPCTypes::InstallSnapshot,
            "/raft/snapshot",
            &rpc,
            option.hard_ttl(),
            None,
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, RaftError<NodeId>> {
        self.send(RPCTypes::Vote, "/raft/vote", &rpc, option.hard_ttl(), None)
            .await
    }
}

// ---------------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------------

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

/// A change of the group's membership, as `POST /meta/membership` takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MembershipChange {
    /// Add a node as a non-voting learner and wait until it has caught up.
    AddLearner { id: NodeId, addr: String },
    /// Make exactly these nodes the voters (learners listed are promoted; voters not listed
    /// are demoted to learners).
    SetVoters {
        voters: std::collections::BTreeSet<NodeId>,
    },
    /// Remove a node from the group entirely (it must not be a voter: demote it first, or
    /// use `SetVoters` without it).
    Remove { id: NodeId },
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

#[cfg(test)]
mod tests {
    //! The network against real openraft nodes, with an in-memory log and state machine
    //! (the real stores are tested on their own).

    use std::collections::BTreeMap;
    use std::fmt::Debug;
    use std::io::Cursor;
    use std::ops::RangeBounds;
    use std::sync::atomic::AtomicBool;
    use std::sync::atomic::Ordering;

    use openraft::Config;
    use openraft::EntryPayload;
    use openraft::LogState;
    use openraft::OptionalSend;
    use openraft::RaftLogReader;
    use openraft::RaftSnapshotBuilder;
    use openraft::Snapshot;
    use openraft::error::CheckIsLeaderError;
    use openraft::error::ClientWriteError;
    use openraft::storage::LogFlushed;
    use openraft::storage::RaftLogStorage;
    use openraft::storage::RaftStateMachine;
    use tokio::sync::Mutex;

    use super::*;
    use crate::model::Applied;
    use crate::model::MetaState;
    use crate::types::Entry;
    use crate::types::LogId;
    use crate::types::SnapshotMeta;
    use crate::types::StorageError;
    use crate::types::StoredMembership;
    use crate::types::Vote;

    // --- in-memory stores -------------------------------------------------------------

    #[derive(Default)]
    struct LogInner {
        vote: Option<Vote>,
        committed: Option<LogId>,
        purged: Option<LogId>,
        log: BTreeMap<u64, Entry>,
    }

    #[derive(Clone, Default)]
    struct MemLog(Arc<Mutex<LogInner>>);

    impl RaftLogReader<TypeConfig> for MemLog {
        async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
            &mut self,
            range: RB,
        ) -> Result<Vec<Entry>, StorageError> {
            Ok(self
                .0
                .lock()
                .await
                .log
                .range(range)
                .map(|(_, e)| e.clone())
                .collect())
        }
    }

    impl RaftLogStorage<TypeConfig> for MemLog {
        type LogReader = MemLog;

        async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
            let g = self.0.lock().await;
            let last = g.log.values().next_back().map(|e| e.log_id).or(g.purged);
            Ok(LogState {
                last_purged_log_id: g.purged,
                last_log_id: last,
            })
        }
        async fn get_log_reader(&mut self) -> MemLog {
            self.clone()
        }
        async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
            self.0.lock().await.vote = Some(*vote);
            Ok(())
        }
        async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
            Ok(self.0.lock().await.vote)
        }
        async fn save_committed(&mut self, c: Option<LogId>) -> Result<(), StorageError> {
            self.0.lock().await.committed = c;
            Ok(())
        }
        async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
            Ok(self.0.lock().await.committed)
        }
        async fn append<I>(
            &mut self,
            entries: I,
            callback: LogFlushed<TypeConfig>,
        ) -> Result<(), StorageError>
        where
            I: IntoIterator<Item = Entry> + OptionalSend,
            I::IntoIter: OptionalSend,
        {
            let mut g = self.0.lock().await;
            for e in entries {
                g.log.insert(e.log_id.index, e);
            }
            callback.log_io_completed(Ok(()));
            Ok(())
        }
        async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
            self.0.lock().await.log.split_off(&log_id.index);
            Ok(())
        }
        async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
            let mut g = self.0.lock().await;
            g.purged = Some(log_id);
            g.log = g.log.split_off(&(log_id.index + 1));
            Ok(())
        }
    }

    #[derive(Default)]
    struct SmInner {
        applied: Option<LogId>,
        membership: StoredMembership,
        state: MetaState,
        snapshot: Option<(SnapshotMeta, Vec<u8>)>,
        installed_snapshots: u64,
    }

    #[derive(Clone, Default)]
    struct MemSm(Arc<Mutex<SmInner>>);

    impl RaftSnapshotBuilder<TypeConfig> for MemSm {
        async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
            let mut g = self.0.lock().await;
            let data = serde_json::to_vec(&g.state).unwrap();
            let meta = SnapshotMeta {
                last_log_id: g.applied,
                last_membership: g.membership.clone(),
                snapshot_id: format!("{:?}", g.applied),
            };
            g.snapshot = Some((meta.clone(), data.clone()));
            Ok(Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(data)),
            })
        }
    }

    impl RaftStateMachine<TypeConfig> for MemSm {
        type SnapshotBuilder = MemSm;

        async fn applied_state(
            &mut self,
        ) -> Result<(Option<LogId>, StoredMembership), StorageError> {
            let g = self.0.lock().await;
            Ok((g.applied, g.membership.clone()))
        }
        async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, StorageError>
        where
            I: IntoIterator<Item = Entry> + OptionalSend,
            I::IntoIter: OptionalSend,
        {
            let mut g = self.0.lock().await;
            let mut out = Vec::new();
            for e in entries {
                g.applied = Some(e.log_id);
                out.push(match e.payload {
                    EntryPayload::Blank => Ok(Applied::Done),
                    EntryPayload::Normal(cmd) => g.state.apply(&cmd),
                    EntryPayload::Membership(m) => {
                        g.membership = StoredMembership::new(Some(e.log_id), m);
                        Ok(Applied::Done)
                    }
                });
            }
            Ok(out)
        }
        async fn get_snapshot_builder(&mut self) -> MemSm {
            self.clone()
        }
        async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
            Ok(Box::new(Cursor::new(Vec::new())))
        }
        async fn install_snapshot(
            &mut self,
            meta: &SnapshotMeta,
            snapshot: Box<Cursor<Vec<u8>>>,
        ) -> Result<(), StorageError> {
            let data = snapshot.into_inner();
            let mut g = self.0.lock().await;
            g.state = serde_json::from_slice(&data).unwrap();
            g.applied = meta.last_log_id;
            g.membership = meta.last_membership.clone();
            g.snapshot = Some((meta.clone(), data));
            g.installed_snapshots += 1;
            Ok(())
        }
        async fn get_current_snapshot(
            &mut self,
        ) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
            let g = self.0.lock().await;
            Ok(g.snapshot.clone().map(|(meta, data)| Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(data)),
            }))
        }
    }

    // --- a test service and node ------------------------------------------------------

    struct TestService {
        raft: Raft,
        sm: MemSm,
        votes: Arc<AtomicBool>,
        /// When set, propose and read_index answer this.
        forced: Option<ForwardError>,
        healthy: bool,
    }

    fn leader_hint(leader_id: Option<NodeId>, node: Option<BasicNode>) -> ForwardError {
        ForwardError::NotLeader {
            leader: leader_id.zip(node.map(|n| n.addr)),
        }
    }

    impl MetaService for TestService {
        fn raft(&self) -> &Raft {
            &self.raft
        }
        fn accepting_votes(&self) -> bool {
            self.votes.load(Ordering::SeqCst)
        }
        fn propose(&self, cmd: Command) -> BoxFuture<'_, Result<CommandResult, ForwardError>> {
            Box::pin(async move {
                if let Some(e) = &self.forced {
                    return Err(e.clone());
                }
                match self.raft.client_write(cmd).await {
                    Ok(resp) => Ok(resp.data),
                    Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                        Err(leader_hint(f.leader_id, f.leader_node))
                    }
                    Err(e) => Err(ForwardError::Unreachable(e.to_string())),
                }
            })
        }
        fn read_index(&self) -> BoxFuture<'_, Result<u64, ForwardError>> {
            Box::pin(async move {
                if let Some(e) = &self.forced {
                    return Err(e.clone());
                }
                match self.raft.ensure_linearizable().await {
                    Ok(id) => Ok(id.map_or(0, |id| id.index)),
                    Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                        Err(leader_hint(f.leader_id, f.leader_node))
                    }
                    Err(e) => Err(ForwardError::Unreachable(e.to_string())),
                }
            })
        }
        fn status(&self) -> BoxFuture<'_, NodeStatus> {
            Box::pin(async move {
                let m = self.raft.metrics().borrow().clone();
                NodeStatus {
                    node_id: m.id,
                    leader: m.current_leader,
                    term: m.current_term,
                    last_applied: m.last_applied.map(|l| l.index),
                    committed: None,
                    has_state: m.last_applied.is_some(),
                    accepting_votes: self.accepting_votes(),
                    members: m
                        .membership_config
                        .nodes()
                        .map(|(id, n)| (*id, n.addr.clone()))
                        .collect(),
                    last_log_index: m.last_log_index,
                    snapshot: m.snapshot.map(|l| l.index),
                    purged: m.purged.map(|l| l.index),
                }
            })
        }
        fn dump(&self) -> BoxFuture<'_, serde_json::Value> {
            Box::pin(async move { serde_json::to_value(&self.sm.0.lock().await.state).unwrap() })
        }
        fn healthz(&self) -> BoxFuture<'_, bool> {
            Box::pin(async move { self.healthy })
        }
    }

    struct TestNode {
        addr: String,
        raft: Raft,
        sm: MemSm,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        server: tokio::task::JoinHandle<()>,
    }

    impl TestNode {
        async fn stop(mut self) {
            self.raft.shutdown().await.unwrap();
            let _ = self.stop.take().unwrap().send(());
            tokio::time::timeout(Duration::from_secs(10), self.server)
                .await
                .expect("serve returns after shutdown")
                .unwrap();
        }
    }

    fn config() -> Arc<Config> {
        let c = Config {
            cluster_name: "felix-meta-test".into(),
            heartbeat_interval: 50,
            election_timeout_min: 200,
            election_timeout_max: 400,
            // Small chunks, so a snapshot crosses the wire in several requests.
            snapshot_max_chunk_size: 64,
            max_in_snapshot_log_to_keep: 0,
            purge_batch_size: 1,
            ..Default::default()
        };
        Arc::new(c.validate().unwrap())
    }

    async fn start_node(
        id: NodeId,
        votes: bool,
        forced: Option<ForwardError>,
        healthy: bool,
    ) -> TestNode {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let sm = MemSm::default();
        let net = HttpNetworkFactory::new(Duration::from_secs(5)).with_local_id(id);
        let raft = Raft::new(id, config(), net, MemLog::default(), sm.clone())
            .await
            .unwrap();
        let service = Arc::new(TestService {
            raft: raft.clone(),
            sm: sm.clone(),
            votes: Arc::new(AtomicBool::new(votes)),
            forced,
            healthy,
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, raft_router(service), async move {
            let _ = stopped.await;
        }));
        TestNode {
            addr,
            raft,
            sm,
            stop: Some(stop),
            server,
        }
    }

    fn node(addr: &str) -> BasicNode {
        BasicNode {
            addr: addr.to_owned(),
        }
    }

    fn tenant(name: &str) -> Command {
        Command::CreateTenant {
            name: name.to_owned(),
        }
    }

    async fn wait_applied(n: &TestNode, index: u64) {
        n.raft
            .wait(Some(Duration::from_secs(10)))
            .applied_index_at_least(Some(index), "applied")
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_replicates_forwards_and_installs_snapshots_over_http() {
        let mut nodes = Vec::new();
        for id in 1..=3 {
            nodes.push(start_node(id, true, None, true).await);
        }
        let members: BTreeMap<NodeId, BasicNode> = nodes
            .iter()
            .zip(1..)
            .map(|(n, id)| (id, node(&n.addr)))
            .collect();
        nodes[0].raft.initialize(members.clone()).await.unwrap();

        let m = nodes[0]
            .raft
            .wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.current_leader.is_some(), "a leader")
            .await
            .unwrap();
        let leader = m.current_leader.unwrap();
        let li = (leader - 1) as usize;
        let fi = (li + 1) % 3;
        let client = PeerClient::new(Duration::from_secs(5));

        // A follower points at the leader; the leader commits.
        let err = client
            .forward_propose(&nodes[fi].addr, &tenant("t0"))
            .await
            .unwrap_err();
        let leader_addr = nodes[li].addr.clone();
        // The follower may not know the leader yet; then it names none.
        match &err {
            ForwardError::NotLeader { leader: Some(l) } => assert_eq!(l, &(leader, leader_addr)),
            ForwardError::NotLeader { leader: None } => {}
            other => panic!("expected NotLeader, got {other:?}"),
        }
        for i in 0..5 {
            let r = client
                .forward_propose(&nodes[li].addr, &tenant(&format!("t{i}")))
                .await;
            assert_eq!(r, Ok(Ok(Applied::Done)));
        }
        // A refused command is a 200 with the refusal.
        let r = client
            .forward_propose(&nodes[li].addr, &tenant("t0"))
            .await
            .unwrap();
        assert!(
            matches!(r, Err(crate::model::CommandError::AlreadyExists { .. })),
            "{r:?}"
        );

        let index = client.read_index(&nodes[li].addr).await.unwrap();
        assert!(index >= 7, "blank + membership + 6 commands, got {index}");
        assert!(matches!(
            client.read_index(&nodes[fi].addr).await,
            Err(ForwardError::NotLeader { .. })
        ));
        for n in &nodes {
            wait_applied(n, index).await;
        }
        let want = client.dump(&nodes[li].addr).await.unwrap();
        assert_eq!(want["tenants"].as_object().unwrap().len(), 5);
        for n in &nodes {
            assert_eq!(client.dump(&n.addr).await.unwrap(), want);
            let s = client.status(&n.addr).await.unwrap();
            assert_eq!(s.leader, Some(leader));
            assert_eq!(s.members.len(), 3);
            assert!(client.healthz(&n.addr).await.unwrap());
        }

        // Snapshot and purge the leader's log: a new member can only catch up from the
        // snapshot, sent over /raft/snapshot in 64-byte chunks.
        nodes[li].raft.trigger().snapshot().await.unwrap();
        nodes[li]
            .raft
            .wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.snapshot.map(|s| s.index) >= Some(index), "snapshot")
            .await
            .unwrap();
        nodes[li].raft.trigger().purge_log(index).await.unwrap();
        nodes[li]
            .raft
            .wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.purged.map(|p| p.index) >= Some(index), "purged")
            .await
            .unwrap();

        let n4 = start_node(4, true, None, true).await;
        nodes[li]
            .raft
            .add_learner(4, node(&n4.addr), true)
            .await
            .unwrap();
        wait_applied(&n4, index).await;
        assert_eq!(n4.sm.0.lock().await.installed_snapshots, 1);
        assert_eq!(client.dump(&n4.addr).await.unwrap(), want);

        n4.stop().await;
        for n in nodes {
            n.stop().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refused_votes_and_transport_failures_map_to_rpc_errors() {
        let n = start_node(1, false, None, false).await;
        let mut factory = HttpNetworkFactory::new(Duration::from_secs(5)).with_local_id(9);
        let opt = || RPCOption::new(Duration::from_millis(500));
        let vote = || VoteRequest {
            vote: Vote::new(7, 9),
            last_log_id: None,
        };

        // A node that does not accept votes answers 503: the candidate sees Unreachable.
        let mut conn = factory.new_client(1, &node(&n.addr)).await;
        let err = conn.vote(vote(), opt()).await.unwrap_err();
        assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
        assert!(!factory.client().healthz(&n.addr).await.unwrap());

        // Nothing listening: Unreachable.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let mut conn = factory.new_client(2, &node(&closed)).await;
        let err = conn.vote(vote(), opt()).await.unwrap_err();
        assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
        assert!(matches!(
            factory.client().status(&closed).await,
            Err(ForwardError::Unreachable(_))
        ));

        // A peer that accepts but never answers: Timeout within hard_ttl.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_addr = silent.local_addr().unwrap().to_string();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        let mut conn = factory.new_client(3, &node(&silent_addr)).await;
        let started = std::time::Instant::now();
        let err = conn.vote(vote(), opt()).await.unwrap_err();
        assert!(
            matches!(
                err,
                RPCError::Timeout(Timeout {
                    target: 3,
                    id: 9,
                    ..
                })
            ),
            "{err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
        let quick = factory.client().with_timeout(Duration::from_millis(300));
        assert_eq!(
            quick.read_index(&silent_addr).await,
            Err(ForwardError::Timeout)
        );
        hold.abort();

        // A vote accepted by a node that does accept votes.
        let m = start_node(2, true, None, true).await;
        let mut conn = factory.new_client(2, &node(&m.addr)).await;
        let resp = conn.vote(vote(), opt()).await.unwrap();
        assert!(resp.vote_granted);

        m.stop().await;
        n.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forward_errors_round_trip() {
        let client = PeerClient::new(Duration::from_secs(5));
        let cases = [
            (
                ForwardError::NotLeader {
                    leader: Some((3, "10.0.0.3:9000".into())),
                },
                421,
            ),
            (ForwardError::NotLeader { leader: None }, 421),
            (ForwardError::Unreachable("leader gone".into()), 503),
            (ForwardError::Timeout, 504),
            (ForwardError::Interrupted("reset".into()), 502),
            (
                ForwardError::Remote {
                    status: 409,
                    message: "busy".into(),
                },
                409,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(e.http_status(), status);
            let n = start_node(1, true, Some(e.clone()), true).await;
            assert_eq!(
                client.forward_propose(&n.addr, &tenant("x")).await,
                Err(e.clone())
            );
            assert_eq!(client.read_index(&n.addr).await, Err(e));
            n.stop().await;
        }
        // Errors not produced by the service: unparsable bodies keep their status.
        assert_eq!(
            ForwardError::from_response(421, b"nope"),
            ForwardError::NotLeader { leader: None }
        );
        assert_eq!(
            ForwardError::from_response(502, b"bad gateway"),
            ForwardError::Remote {
                status: 502,
                message: "bad gateway".into()
            }
        );
        assert_eq!(
            ForwardError::from_response(422, b"bad json"),
            ForwardError::Remote {
                status: 422,
                message: "bad json".into()
            }
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn body_limits() {
        let forced = ForwardError::Remote {
            status: 409,
            message: "parsed".into(),
        };
        let n = start_node(1, true, Some(forced.clone()), true).await;
        let client = PeerClient::new(Duration::from_secs(10));
        let batch = |count: usize| Command::Batch {
            commands: (0..count)
                .map(|i| tenant(&format!("tenant-{i:08}")))
                .collect(),
        };
        // About 3 MiB: over axum's default 2 MiB, under BODY_LIMIT, so the service sees it.
        let body = serde_json::to_vec(&batch(65_536)).unwrap();
        assert!(
            body.len() > 2 * 1024 * 1024 && body.len() < BODY_LIMIT,
            "{}",
            body.len()
        );
        assert_eq!(
            client.forward_propose(&n.addr, &batch(65_536)).await,
            Err(forced)
        );
        // Over BODY_LIMIT: refused before sending.
        match client
            .forward_propose(&n.addr, &batch(BODY_LIMIT / 32))
            .await
        {
            Err(ForwardError::Remote { status: 413, .. }) => {}
            other => panic!("expected 413, got {other:?}"),
        }
        // And by the server, if sent anyway (413, or the connection closed mid-upload).
        let body = serde_json::to_vec(&batch(BODY_LIMIT / 32)).unwrap();
        match client
            .call(
                Method::POST,
                &n.addr,
                "/meta/propose",
                Some(body),
                client.timeout(),
            )
            .await
        {
            Ok((413, _)) | Err(CallError::Broken(_)) => {}
            other => panic!("expected 413, got {other:?}"),
        }
        n.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serve_drains_then_returns() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let router = Router::new()
            .route("/quick", get(|| async { "quick" }))
            .route(
                "/hang",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    "late"
                }),
            );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router, async move {
            let _ = stopped.await;
        }));
        let client = PeerClient::new(Duration::from_secs(30));
        assert_eq!(
            client
                .call(Method::GET, &addr, "/quick", None, client.timeout())
                .await
                .unwrap(),
            (200, Bytes::from_static(b"quick"))
        );
        let hanging = {
            let (client, addr) = (client.clone(), addr.clone());
            tokio::spawn(async move {
                client
                    .call(Method::GET, &addr, "/hang", None, client.timeout())
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        stop.send(()).unwrap();
        tokio::time::timeout(SHUTDOWN_DRAIN + Duration::from_secs(2), server)
            .await
            .expect("serve returns within the drain time")
            .unwrap();
        assert!(started.elapsed() >= SHUTDOWN_DRAIN - Duration::from_millis(100));
        // The listener is closed.
        assert!(matches!(
            client
                .call(Method::GET, &addr, "/quick", None, client.timeout())
                .await,
            Err(CallError::Connect(_))
        ));
        hanging.abort();
    }
}
