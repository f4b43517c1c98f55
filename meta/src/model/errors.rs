//! Why a command is refused: the answer a proposer gets when the state machine says no.
//!
//! Decides the refusal kinds, each one a remedy the caller can act on (create it first, pick
//! another name, re-read and retry, wait). The invariant: a refusal is data, replicated in
//! the log entry's answer and relayed between brokers as JSON, so every node and every API
//! gives the same refusal for the same command against the same state.

use serde::{Deserialize, Serialize};

/// Why a command was refused. Stable and typed, so APIs can map each to a wire error.
///
/// Adjacently tagged (`{"error": "invalid", "detail": "..."}`): a refusal travels between
/// brokers as JSON (a non-leader forwards a command and relays the answer), and serde cannot
/// write a newtype variant such as `Invalid(String)` inside an internally tagged enum. That
/// failure used to turn the refusal into an HTTP 500, which the client saw as a retryable
/// `metadata_unavailable` for a request that can never succeed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case", tag = "error", content = "detail")]
pub enum CommandError {
    #[error("{kind} {name:?} already exists")]
    AlreadyExists { kind: String, name: String },
    #[error("unknown {kind} {name:?}")]
    NotFound { kind: String, name: String },
    #[error("version conflict: expected version {expected}, current is {actual}")]
    VersionConflict { expected: u64, actual: u64 },
    #[error("{kind} {name:?} is not empty")]
    NotEmpty { kind: String, name: String },
    #[error("invalid command: {0}")]
    Invalid(String),
    /// The name belongs to a deleted stream whose objects are still being removed.
    #[error(
        "stream {name:?} was deleted and its objects are still being removed from the object \
         store; retry once that is done"
    )]
    BeingDeleted { name: String },
    /// A shard leader spoke for a generation that is no longer (or not yet) the shard's:
    /// it has been replaced and must stop serving the shard.
    #[error("shard {shard}: generation {given} is stale, the current generation is {current}")]
    StaleGeneration {
        shard: String,
        given: u64,
        current: u64,
    },
    /// Another move of the shard is under way; it finishes or is cancelled first.
    #[error("shard {shard} is already moving from broker {from} to broker {to}")]
    MoveInProgress { shard: String, from: u64, to: u64 },
}

pub(super) fn exists(kind: &str, name: impl Into<String>) -> CommandError {
    CommandError::AlreadyExists {
        kind: kind.into(),
        name: name.into(),
    }
}
pub(super) fn missing(kind: &str, name: impl Into<String>) -> CommandError {
    CommandError::NotFound {
        kind: kind.into(),
        name: name.into(),
    }
}
