//! A stream's settings as the control plane records them: how it keeps its records, how
//! many replicas acknowledge them, its shards, segments and retention. Which settings are
//! valid, and how an alter changes them, is the control plane's decision
//! (`felix_meta::model::StreamSettingsPatch`); the tier reads the retention ones.

use serde::{Deserialize, Serialize};

/// How a stream keeps its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// In memory only, at most once.
    #[default]
    Ephemeral,
    /// In the log on disk, at least once.
    Durable,
}

/// How many replicas must hold a record before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    #[default]
    Leader,
    Quorum,
}

/// The settings of a stream (ARCHITECTURE.md, "Data model"). Every one can be altered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSettings {
    pub durability: Durability,
    pub consistency: Consistency,
    pub replicas: u32,
    pub shards: u32,
    pub segment_bytes: u64,
    pub segment_ms: u64,
    /// Whole stream, both tiers; `None` keeps forever.
    pub retention_ms: Option<u64>,
    pub retention_bytes: Option<u64>,
    /// Local (hot) copy only.
    pub hot_retention_ms: Option<u64>,
    pub hot_retention_bytes: Option<u64>,
    /// Upload sealed segments to the object store.
    pub tiered: bool,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            durability: Durability::Durable,
            consistency: Consistency::Leader,
            replicas: 1,
            shards: 1,
            segment_bytes: 256 * 1024 * 1024,
            segment_ms: 3_600_000,
            retention_ms: None,
            retention_bytes: None,
            hot_retention_ms: None,
            hot_retention_bytes: None,
            tiered: true,
        }
    }
}
