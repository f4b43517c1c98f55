//! Cluster-operation messages of the QUIC protocol (docs/shard-moves.md): a
//! `Request::Cluster` carries one [`ClusterRequest`], answered by a `Response::Cluster`
//! carrying one [`ClusterResponse`] (or `Response::Error`). Every one needs
//! `cluster.manage` on `*` when auth is on.
//!
//! A move or a drain is answered once the control plane recorded it, not when it is done:
//! the caller follows its progress with [`ClusterRequest::ListMoves`] and
//! [`ClusterRequest::ListBrokers`] (`felixctl` does).

use serde::{Deserialize, Serialize};

/// A cluster operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ClusterRequest {
    /// Every registered broker and what it holds.
    ListBrokers {},
    /// Moves every replica and leadership off broker `id`, a few at a time; nothing new is
    /// placed on it until it is undrained.
    DrainBroker { id: u64 },
    /// Lets broker `id` take shards again (moves already made stay).
    UndrainBroker { id: u64 },
    /// Forgets broker `id`: takes it out of the registry and the control plane's members.
    /// Refused while it is alive or holds a replica (drain it, stop it, then remove it).
    RemoveBroker { id: u64 },
    /// Moves one shard's replica onto broker `to`: the replica of `replace` if given, else
    /// the leader's (so leadership moves to `to`).
    MoveShard {
        tenant: String,
        namespace: String,
        stream: String,
        shard: u32,
        to: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replace: Option<u64>,
        /// A Leader stream's shard whose leader is dead: make `to` (a follower) lead from
        /// the end of its own copy, accepting the loss of what the old leader acknowledged
        /// past it. Answered [`ClusterResponse::Forced`].
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    /// The moves under way.
    ListMoves {},
    /// The moves that would even out leaders, then replicas, over the live brokers
    /// (answered `Moves`, each `planned`); nothing is moved.
    PlanRebalance {},
}

/// The answer to a [`ClusterRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ClusterResponse {
    Brokers {
        brokers: Vec<BrokerInfo>,
    },
    Moves {
        moves: Vec<MoveInfo>,
    },
    /// A move was recorded: it runs on its own from here.
    MoveStarted {
        generation: u64,
    },
    Done {},
    /// A shard was forced onto a follower's copy: it leads `generation` from `start`; what
    /// `old_leader` acknowledged at or past `start` is lost.
    Forced {
        generation: u64,
        start: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        old_leader: Option<u64>,
    },
}

/// A broker as `felixctl broker list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerInfo {
    pub id: u64,
    pub quic_addr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    pub alive: bool,
    pub draining: bool,
    /// Shards it leads.
    pub leaders: u64,
    /// Shards it holds a replica of (led ones included).
    pub replicas: u64,
    /// Bytes of its shards' local (hot) logs, as the broker itself reports them; `None`
    /// when it did not answer (dead, or too slow).
    #[serde(default)]
    pub hot_bytes: Option<u64>,
}

/// One move under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveInfo {
    pub tenant: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u32,
    pub from: u64,
    pub to: u64,
    /// `catching_up` (the destination copies the log), `handed_over` (the destination
    /// leads; the source leaves next), or `planned` (a rebalance plan's move, not started).
    pub phase: String,
}
