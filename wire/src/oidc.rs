//! The OIDC issuer registration as it travels: QUIC `PutOidcIssuer`/`OidcIssuers` and the
//! admin API's `/v1/oidc/issuers` body (docs/security.md, *OIDC exchange*).
//!
//! Decides only the shape; what makes a registration valid (a usable JWKS, one tenant
//! mapping, a lifetime within bounds) is the control plane's (`felix_meta::auth::OidcIssuer`).
//! Unknown fields are refused so a misspelt mapping is an error, not a silent default.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A trusted identity provider: whose tokens `ExchangeOidcToken` accepts and how their
/// claims map to a Felix tenant, subject and roles.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcIssuerSpec {
    /// The `iss` the provider's tokens carry (compared exactly).
    pub issuer: String,
    /// The `aud` a token must carry to be meant for Felix.
    pub audience: String,
    /// The provider's JSON Web Key Set, as a JSON document (public keys).
    pub jwks: String,
    /// Every token acts for this tenant (or give `tenant_claim`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The claim naming the tenant (or give `tenant`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_claim: Option<String>,
    /// The claim naming the subject (default `sub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_claim: Option<String>,
    /// The claim listing the provider's groups or roles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles_claim: Option<String>,
    /// Provider group → Felix role.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub role_map: BTreeMap<String, String>,
    /// Felix roles every exchanged token gets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub default_roles: Vec<String>,
    /// Lifetime of an exchanged Felix token in seconds (default 900, at most 43200; never
    /// past the provider token's own expiry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
}
