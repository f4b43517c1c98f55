//! A stream's settings and how an alter changes them.
//!
//! Decides which settings a stream may have. The invariant: a stream's settings are always
//! valid (checked at creation and after every alter, before anything changes), and an alter
//! never lowers the shard count, which would move keys between shards.

use serde::{Deserialize, Serialize};

use super::errors::CommandError;

/// The settings themselves are in felix-model, which the object tier shares; which are
/// valid is decided here.
pub use felix_model::{Consistency, Durability, StreamSettings};

/// The check every stream's settings pass, at creation and after every alter.
pub(super) trait Validate {
    fn validate(&self) -> Result<(), CommandError>;
}

impl Validate for StreamSettings {
    fn validate(&self) -> Result<(), CommandError> {
        let bad = |m: &str| Err(CommandError::Invalid(m.to_owned()));
        if self.shards == 0 || self.shards > 4096 {
            return bad("shards must be between 1 and 4096");
        }
        if self.replicas == 0 || self.replicas > 7 {
            return bad("replicas must be between 1 and 7");
        }
        if self.segment_bytes < 4096 {
            return bad("segment_bytes must be at least 4096");
        }
        if self.segment_ms == 0 {
            return bad("segment_ms must be positive");
        }
        if self.durability == Durability::Ephemeral && self.consistency == Consistency::Quorum {
            return bad("an ephemeral stream cannot be quorum-acknowledged");
        }
        Ok(())
    }
}

/// A partial change of stream settings: `None` leaves a setting as it is. The retention
/// settings take `Some(None)` to mean "remove the limit".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSettingsPatch {
    pub consistency: Option<Consistency>,
    pub replicas: Option<u32>,
    pub shards: Option<u32>,
    pub segment_bytes: Option<u64>,
    pub segment_ms: Option<u64>,
    pub retention_ms: Option<Option<u64>>,
    pub retention_bytes: Option<Option<u64>>,
    pub hot_retention_ms: Option<Option<u64>>,
    pub hot_retention_bytes: Option<Option<u64>>,
    pub tiered: Option<bool>,
}

impl StreamSettingsPatch {
    pub(super) fn apply_to(&self, s: &StreamSettings) -> Result<StreamSettings, CommandError> {
        let mut n = s.clone();
        if let Some(v) = self.consistency {
            n.consistency = v;
        }
        if let Some(v) = self.replicas {
            n.replicas = v;
        }
        if let Some(v) = self.shards {
            if v < s.shards {
                return Err(CommandError::Invalid(
                    "shards can only grow: keys would move between shards".into(),
                ));
            }
            n.shards = v;
        }
        if let Some(v) = self.segment_bytes {
            n.segment_bytes = v;
        }
        if let Some(v) = self.segment_ms {
            n.segment_ms = v;
        }
        if let Some(v) = self.retention_ms {
            n.retention_ms = v;
        }
        if let Some(v) = self.retention_bytes {
            n.retention_bytes = v;
        }
        if let Some(v) = self.hot_retention_ms {
            n.hot_retention_ms = v;
        }
        if let Some(v) = self.hot_retention_bytes {
            n.hot_retention_bytes = v;
        }
        if let Some(v) = self.tiered {
            n.tiered = v;
        }
        n.validate()?;
        Ok(n)
    }
}
