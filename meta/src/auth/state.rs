//! The authorization state the control plane replicates: signing keys, roles, bindings,
//! revoked token ids, the bootstrap admin token and the trusted OIDC issuers.
//!
//! Decides what every broker needs to verify a token and expand its roles on its own, with
//! no round trip per request: this is plain data inside [`MetaState`](crate::MetaState),
//! changed only by commands applied in log order (`model/auth.rs`), so every broker's
//! replica answers the same way once it has applied the same log. The invariant: a key is
//! never removed while a token it signed could still be valid (a retired key verifies until
//! its `retire_at`, which is at least [`MAX_TOKEN_TTL_SECS`](super::claims::MAX_TOKEN_TTL_SECS)
//! after the rotation), and a revoked id is kept until the token it names has expired.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::claims::Permission;
use super::oidc::OidcIssuer;

/// One Ed25519 signing key. The private half lives in the replicated state (so any broker
/// can mint) and therefore in the meta data directory of every broker: protect it as a
/// secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigningKey {
    /// The key id, the `kid` of every token it signs.
    pub kid: String,
    /// The PKCS#8 document of the key pair, base64 (standard alphabet).
    pub private_pkcs8: String,
    /// The 32-byte public key, base64url without padding (a JWK's `x`).
    pub public: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    /// Once set (by a rotation), the key signs nothing new and verifies until this time.
    #[serde(default)]
    pub retire_at: Option<u64>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .field("private_pkcs8", &"[redacted]")
            .field("public", &self.public)
            .field("created_at", &self.created_at)
            .field("retire_at", &self.retire_at)
            .finish()
    }
}

/// The bootstrap admin token: minted once, at the cluster's first start with auth on.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapToken {
    pub jti: String,
    pub token: String,
}

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootstrapToken")
            .field("jti", &self.jti)
            .finish_non_exhaustive()
    }
}

/// Everything replicated about who may do what.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthState {
    /// Bumped by every change here, so a broker can tell that a principal it expanded
    /// earlier needs expanding again.
    #[serde(default)]
    pub version: u64,
    /// kid → key.
    #[serde(default)]
    pub keys: BTreeMap<String, SigningKey>,
    /// Role name → what it grants. The built-in roles are not stored here.
    #[serde(default)]
    pub roles: BTreeMap<String, BTreeSet<Permission>>,
    /// tenant → subject → role names.
    #[serde(default)]
    pub bindings: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// Revoked token id → that token's expiry (seconds since the epoch), for pruning.
    #[serde(default)]
    pub revoked: BTreeMap<String, u64>,
    #[serde(default)]
    pub bootstrap: Option<BootstrapToken>,
    /// Trusted identity providers, by their `iss`: whose tokens the exchange accepts.
    #[serde(default)]
    pub issuers: BTreeMap<String, OidcIssuer>,
}

impl AuthState {
    /// The key new tokens are signed with: the newest key not retired.
    pub fn active_key(&self) -> Option<&SigningKey> {
        self.keys
            .values()
            .filter(|k| k.retire_at.is_none())
            .max_by(|a, b| (a.created_at, &a.kid).cmp(&(b.created_at, &b.kid)))
    }

    /// The key `kid`, if it still verifies at `now`.
    pub fn verifying_key(&self, kid: &str, now: u64) -> Option<&SigningKey> {
        self.keys
            .get(kid)
            .filter(|k| k.retire_at.is_none_or(|at| now < at))
    }

    pub fn is_revoked(&self, jti: &str) -> bool {
        self.revoked.contains_key(jti)
    }

    /// The roles bound to `subject` in `tenant`.
    pub fn bound_roles(&self, tenant: &str, subject: &str) -> impl Iterator<Item = &str> {
        self.bindings
            .get(tenant)
            .and_then(|s| s.get(subject))
            .into_iter()
            .flatten()
            .map(String::as_str)
    }
}
