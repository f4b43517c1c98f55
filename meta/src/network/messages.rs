//! What crosses the wire between nodes besides the Raft RPCs themselves: the bodies of the
//! `/meta/*` routes and the size limits of every route.
//!
//! Decides the shape and the size bound of each request and answer. The invariant: client
//! and server read and write these same types, so they cannot disagree on a route's body;
//! fields added later are `#[serde(default)]`, so nodes of different versions still read
//! each other during a rolling upgrade.

use serde::Deserialize;
use serde::Serialize;

use crate::types::NodeId;

/// Request body limit of `/raft/append` and `/raft/snapshot`. openraft sends snapshots in
/// chunks of `Config::snapshot_max_chunk_size` (3 MiB by default), which JSON (bytes as
/// numbers) inflates up to about 4×; an append larger than this is split by the sender.
pub const RAFT_BODY_LIMIT: usize = 64 * 1024 * 1024;

/// Request body limit of every other route (votes, proposals).
pub const BODY_LIMIT: usize = 8 * 1024 * 1024;

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
    /// The members that vote (the others are learners).
    #[serde(default)]
    pub voters: Vec<NodeId>,
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
pub(super) struct ReadIndexBody {
    pub(super) index: u64,
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
    /// A new broker asks to join (meta/src/join.rs): added as a learner and waited for until
    /// it caught up; nothing to do if it is a member at `addr` already. Refused (409) if
    /// `id` is a member at another address, or `addr` is another member's.
    Join { id: NodeId, addr: String },
    /// Makes member `id` a voter too (nothing to do if it votes already); the other voters
    /// stay. Refused (409) if `id` is not a member.
    Promote { id: NodeId },
}
