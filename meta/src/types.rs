//! The openraft type configuration of the control plane.

use std::io::Cursor;

use crate::model::{Applied, Command, CommandError};

/// A node's id: the broker id given with `--node-id`.
pub type NodeId = u64;

/// What a log entry's command answers: its result, refusal included.
pub type CommandResult = Result<Applied, CommandError>;

openraft::declare_raft_types!(
    /// Felix's Raft types: commands are [`Command`]s; nodes are addressed by their internal
    /// HTTP address (`BasicNode { addr: "host:port" }`).
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
