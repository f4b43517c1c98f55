//! Forwarding to the leader: proposals, read indexes, lease renewals and membership
//! changes sent to the node that leads, and the status of any node.
//!
//! Decides how a node that is not the leader reaches the one that is. The invariant: each
//! forwarded request is one HTTP exchange within the client's timeout, and its failure is
//! a [`ForwardError`] that says whether a proposal may have been applied; a command over
//! [`BODY_LIMIT`] is refused here, before anything is sent.

use std::time::Duration;

use hyper::Method;
use serde::de::DeserializeOwned;

use super::client::{CallError, PeerClient};
use super::errors::ForwardError;
use super::messages::{
    BODY_LIMIT, LeaseGrant, LeaseRequest, MembershipChange, NodeStatus, ReadIndexBody,
};
use crate::model::Command;
use crate::types::{CommandResult, NodeId};

impl PeerClient {
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
        let slow = self.with_timeout(self.timeout().max(Duration::from_secs(60)));
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
            .call(Method::GET, addr, "/healthz", None, self.timeout())
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
        let (status, bytes) = self.call(method, addr, path, body, self.timeout()).await?;
        if !(200..=299).contains(&status) {
            return Err(ForwardError::from_response(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| ForwardError::Remote {
            status,
            message: format!("bad answer from {addr}{path}: {e}"),
        })
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
