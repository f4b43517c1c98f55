//! The actions a permission can grant, and which resource each one is checked against.
//!
//! Decides the vocabulary of authorization: every check in Felix names one [`Action`], and
//! its text form (`stream.publish`, ...) is what tokens, roles and `felixctl` spell. The
//! invariant: the list is closed and its spellings are stable, because they are stored in
//! signed tokens and in the control plane's roles; an unknown spelling is refused, never
//! ignored, so a typo cannot silently grant or withhold something.

use serde::{Deserialize, Serialize};

/// One thing a principal may be allowed to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Action {
    /// Append records to a stream (`tenant/namespace/stream`).
    #[serde(rename = "stream.publish")]
    StreamPublish,
    /// Read a stream's records, list its segments, ask its topology.
    #[serde(rename = "stream.subscribe")]
    StreamSubscribe,
    /// Consume as a member of a group (the Kafka listener's groups).
    #[serde(rename = "group.consume")]
    GroupConsume,
    #[serde(rename = "cache.read")]
    CacheRead,
    #[serde(rename = "cache.write")]
    CacheWrite,
    /// Create or delete a tenant (`tenant`).
    #[serde(rename = "tenant.manage")]
    TenantManage,
    /// Create or delete a namespace (`tenant/namespace`).
    #[serde(rename = "namespace.manage")]
    NamespaceManage,
    /// Create, alter or delete a stream (`tenant/namespace/stream`).
    #[serde(rename = "stream.manage")]
    StreamManage,
    #[serde(rename = "cache.manage")]
    CacheManage,
    /// Mint and revoke a tenant's tokens and bind its subjects to roles (`tenant`); define
    /// roles (`*`).
    #[serde(rename = "rbac.manage")]
    RbacManage,
    /// Rotate signing keys and other cluster-wide operations (`*` only).
    #[serde(rename = "cluster.manage")]
    ClusterManage,
}

impl Action {
    /// Every action, in a stable order.
    pub const ALL: [Action; 11] = [
        Action::StreamPublish,
        Action::StreamSubscribe,
        Action::GroupConsume,
        Action::CacheRead,
        Action::CacheWrite,
        Action::TenantManage,
        Action::NamespaceManage,
        Action::StreamManage,
        Action::CacheManage,
        Action::RbacManage,
        Action::ClusterManage,
    ];

    /// The spelling tokens and roles use.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::StreamPublish => "stream.publish",
            Action::StreamSubscribe => "stream.subscribe",
            Action::GroupConsume => "group.consume",
            Action::CacheRead => "cache.read",
            Action::CacheWrite => "cache.write",
            Action::TenantManage => "tenant.manage",
            Action::NamespaceManage => "namespace.manage",
            Action::StreamManage => "stream.manage",
            Action::CacheManage => "cache.manage",
            Action::RbacManage => "rbac.manage",
            Action::ClusterManage => "cluster.manage",
        }
    }

    /// Parses a spelling; `None` for anything not in [`Action::ALL`].
    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_parses_back_from_its_spelling_and_serde_agrees() {
        for a in Action::ALL {
            assert_eq!(Action::parse(a.as_str()), Some(a));
            assert_eq!(
                serde_json::to_string(&a).unwrap(),
                format!("\"{}\"", a.as_str())
            );
        }
        assert_eq!(Action::parse("stream.Publish"), None);
        assert_eq!(Action::parse(""), None);
    }
}
