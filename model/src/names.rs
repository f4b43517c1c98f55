//! How one shard of a stream is named: the key the control plane files its placement,
//! manifest and replication report under, and the tier its object keys under. Which names
//! are valid is the control plane's decision (`felix_meta::model::MAX_NAME_LEN`).

use serde::{Deserialize, Serialize};

/// Identifies one shard of a stream.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ShardKey {
    pub tenant: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u32,
}

impl std::fmt::Display for ShardKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.tenant, self.namespace, self.stream, self.shard
        )
    }
}
