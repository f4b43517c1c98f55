//! Consumer groups in the control plane: which groups exist and their settings (applying
//! the commands that change them is in `apply_groups.rs`).
//!
//! Decides what a valid group is: a group belongs to one durable stream, its name is a valid
//! name, its dead-letter stream (if any) exists and is another stream, and its settings are
//! in range. A group's progress (claims, acknowledgements, attempts) is not here: it lives
//! beside each shard's log on the broker that leads the shard (gateway/src/groups), so an
//! acknowledgement never costs a Raft commit. The invariant: each created group gets an id
//! never given before, so a group deleted and created again under the same name never
//! inherits the progress its predecessor left on a broker's disk.

use serde::{Deserialize, Serialize};

use super::errors::CommandError;

/// Where a new group starts on each shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupStart {
    Earliest,
    /// Records stamped at or after the group's creation.
    Latest,
    Offset(u64),
    Timestamp(i64),
}

/// A group's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSettings {
    pub visibility_timeout_ms: u64,
    pub max_attempts: u32,
    /// `tenant/namespace/stream`.
    pub dead_letter: Option<String>,
    pub start: GroupStart,
}

/// Longest visibility timeout: 12 hours (SQS's ceiling).
pub const MAX_VISIBILITY_TIMEOUT_MS: u64 = 12 * 3600 * 1000;
/// Most deliveries of one record.
pub const MAX_ATTEMPTS: u32 = 1000;

impl GroupSettings {
    pub(super) fn validate(&self) -> Result<(), CommandError> {
        if self.visibility_timeout_ms == 0 || self.visibility_timeout_ms > MAX_VISIBILITY_TIMEOUT_MS
        {
            return Err(CommandError::Invalid(format!(
                "visibility_timeout_ms must be 1..={MAX_VISIBILITY_TIMEOUT_MS}"
            )));
        }
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS {
            return Err(CommandError::Invalid(format!(
                "max_attempts must be 1..={MAX_ATTEMPTS}"
            )));
        }
        Ok(())
    }
}

/// A consumer group of a stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub tenant: String,
    pub namespace: String,
    pub stream: String,
    pub name: String,
    /// Unique across every group ever created.
    pub id: u64,
    pub settings: GroupSettings,
    /// When it was created (the proposer's clock): where `Latest` starts.
    pub created_ms: i64,
}

/// The key of a group in [`MetaState::groups`](super::MetaState::groups):
/// `tenant/namespace/stream/group`.
pub fn group_key(tenant: &str, namespace: &str, stream: &str, group: &str) -> String {
    format!("{tenant}/{namespace}/{stream}/{group}")
}
