//! What a Felix token says: its claims, and the `action:pattern` permissions it may carry.
//!
//! Decides the token's content, not its signature (that is `token.rs`). The invariant: a
//! claim set that parses is complete — a tenant, a subject, an id and both timestamps are
//! required, and every permission it lists names a known action and a valid pattern — so
//! code past the parser never meets a half-formed token.

use serde::{Deserialize, Serialize};

use super::actions::Action;
use super::pattern::{PatternError, Resource, ResourcePattern};

/// Longest token accepted, in bytes (a Felix token or an identity provider's): far above any
/// token Felix mints, and it bounds the work an unauthenticated caller can cause.
pub const MAX_TOKEN_LEN: usize = 16 * 1024;

/// The namespace a token names when it names none (the Kafka listener maps topics into it).
pub const DEFAULT_NAMESPACE: &str = "default";

/// The tenant claim of a cluster-wide token (the bootstrap admin token): such a token is not
/// confined to one tenant's resources.
pub const ALL_TENANTS: &str = "*";

/// Longest lifetime a minted token may have: also how long a retired signing key keeps
/// verifying, so no token outlives the key that signed it.
pub const MAX_TOKEN_TTL_SECS: u64 = 90 * 24 * 3600;

/// One grant: an action on the resources a pattern covers. Written `action:pattern`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Permission {
    pub action: Action,
    pub pattern: ResourcePattern,
}

/// Why an `action:pattern` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PermissionError {
    #[error("a permission is written ACTION:PATTERN (for example stream.publish:acme/default/*)")]
    Shape,
    #[error("unknown action {0:?}; the actions are {all}", all = Action::ALL.map(Action::as_str).join(", "))]
    UnknownAction(String),
    #[error("bad resource pattern: {0}")]
    Pattern(#[from] PatternError),
}

impl Permission {
    pub fn new(action: Action, pattern: ResourcePattern) -> Permission {
        Permission { action, pattern }
    }

    /// Parses `action:pattern`.
    pub fn parse(s: &str) -> Result<Permission, PermissionError> {
        let (action, pattern) = s.split_once(':').ok_or(PermissionError::Shape)?;
        let action =
            Action::parse(action).ok_or_else(|| PermissionError::UnknownAction(action.into()))?;
        Ok(Permission {
            action,
            pattern: ResourcePattern::parse(pattern)?,
        })
    }

    /// Whether this grant allows `action` on `resource`.
    pub fn allows(&self, action: Action, resource: &Resource) -> bool {
        self.action == action && self.pattern.matches(resource)
    }
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.action, self.pattern)
    }
}

impl Serialize for Permission {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Permission {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Permission::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The claims of a Felix token (the JWT's payload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The tenant the token acts for; [`ALL_TENANTS`] for a cluster-wide token.
    pub tenant: String,
    /// Who holds it (a user, a service): role bindings are per subject.
    pub sub: String,
    /// Expiry and issue time, seconds since the Unix epoch.
    pub exp: u64,
    pub iat: u64,
    /// The token's id: what a revocation names.
    pub jti: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Role names, expanded against the control plane's roles when the token is checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// Explicit grants, instead of roles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<Permission>,
}

fn default_namespace() -> String {
    DEFAULT_NAMESPACE.to_owned()
}

impl Claims {
    /// Whether the token may act on resources of `tenant`: its own tenant's, or every
    /// tenant's for a cluster-wide token.
    pub fn covers_tenant(&self, tenant: &str) -> bool {
        self.tenant == ALL_TENANTS || self.tenant == tenant
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_parse_and_print_as_action_colon_pattern() {
        let p = Permission::parse("stream.publish:acme/default/*").unwrap();
        assert_eq!(p.action, Action::StreamPublish);
        assert_eq!(p.to_string(), "stream.publish:acme/default/*");
        assert!(p.allows(
            Action::StreamPublish,
            &Resource::stream("acme", "default", "x")
        ));
        assert!(!p.allows(
            Action::StreamSubscribe,
            &Resource::stream("acme", "default", "x")
        ));
        assert_eq!(
            Permission::parse("stream.publish"),
            Err(PermissionError::Shape)
        );
        assert!(matches!(
            Permission::parse("stream.pub:a"),
            Err(PermissionError::UnknownAction(_))
        ));
        assert!(matches!(
            Permission::parse("stream.publish:a//b"),
            Err(PermissionError::Pattern(_))
        ));
    }

    #[test]
    fn claims_default_their_namespace_and_refuse_unknown_actions() {
        let c: Claims = serde_json::from_str(
            r#"{"tenant":"a","sub":"s","exp":2,"iat":1,"jti":"j","allow":["stream.publish:a/*"]}"#,
        )
        .unwrap();
        assert_eq!(c.namespace, "default");
        assert!(
            serde_json::from_str::<Claims>(
                r#"{"tenant":"a","sub":"s","exp":2,"iat":1,"jti":"j","allow":["nope:a/*"]}"#
            )
            .is_err()
        );
        assert!(
            serde_json::from_str::<Claims>(r#"{"tenant":"a","sub":"s","iat":1,"jti":"j"}"#)
                .is_err(),
            "exp is required"
        );
    }
}
