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
//! * `messages.rs` — the bodies of the `/meta/*` routes and every route's size limit.
//! * `client.rs` — [`PeerClient`]: the pooled HTTP client and one exchange within a timeout.
//! * `forward.rs` — forwarding proposals, read indexes, leases and membership changes to
//!   the leader ([`PeerClient::forward_propose`] and friends).
//! * `raft_client.rs` — [`HttpNetworkFactory`]: openraft's network, and how a failed RPC
//!   reaches openraft.
//! * `server.rs` — [`raft_router`] and [`serve`]: the routes a [`MetaService`] answers, body
//!   limits, draining on shutdown.
//! * `peer_auth.rs` — [`ClusterKey`], [`PeerSigner`] and [`require_signed`]: every internal
//!   request signed with the cluster secret, and refused (401) unless it verifies.
//! * `errors.rs` — [`ForwardError`] and how it crosses the wire.

mod client;
mod errors;
mod forward;
mod messages;
mod peer_auth;
mod raft_client;
mod server;

pub use client::PeerClient;
pub use errors::{ErrorBody, ForwardError};
pub use messages::{
    BODY_LIMIT, LeaseGrant, LeaseRequest, MembershipChange, NodeStatus, RAFT_BODY_LIMIT,
};
pub use peer_auth::{
    AUTH_HEADER, AuthError, ClusterKey, MIN_SECRET_BYTES, NODE_HEADER, PeerSigner, REPLAY_WINDOW,
    SecretError, TIME_HEADER, generate_secret, require_signed, unix_now, verify,
};
pub use raft_client::{HttpConnection, HttpNetworkFactory};
pub use server::{MetaService, SHUTDOWN_DRAIN, raft_router, serve};

#[cfg(test)]
mod tests;
