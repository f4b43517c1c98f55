//! The Raft RPC client: openraft's network, as HTTP POSTs of JSON to each peer.
//!
//! Decides how a failed RPC reaches openraft, which decides what to do about it (retry,
//! step down, send fewer entries). The invariant: every RPC ends within its `hard_ttl`, and
//! an append too large to send becomes `PayloadTooLarge` with a hint of half the entries, so
//! openraft splits it rather than retrying it forever.
//!
//! * [`HttpNetworkFactory`] implements openraft's [`RaftNetworkFactory`]; each
//!   [`HttpConnection`] it makes POSTs the Raft RPCs to `http://{addr}/raft/append`,
//!   `/raft/snapshot` and `/raft/vote`, within the RPC's `hard_ttl`.
//! * [`PeerClient`] holds the pooled hyper client shared by all connections, and the helpers
//!   [`MetaHandle`](crate::MetaHandle) uses to forward to the leader (`forward.rs`):
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

use std::error::Error as StdError;
use std::time::Duration;

use hyper::Method;
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
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::client::{CallError, PeerClient};
use super::errors::{ForwardError, body_snippet};
use super::messages::{NodeStatus, RAFT_BODY_LIMIT};
use crate::model::Command;
use crate::types::{CommandResult, NodeId, TypeConfig};

/// A message carried as an error (for openraft's `Unreachable::new(&e)` and friends).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct NetError(String);

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
