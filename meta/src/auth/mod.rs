//! Authorization: Felix's tokens, the actions they grant and the resources they cover.
//!
//! Decides who may do what, in pure logic that every listener shares (QUIC, admin HTTP,
//! forwarded publishes, and the Kafka listener and OIDC exchange built on it). Nothing here
//! does I/O or waits: a broker verifies a token against its own replica of the control
//! plane's [`AuthState`], so a request never costs a round trip, and a revocation applied to
//! that replica is effective at once. The invariant: a token grants only what its tenant
//! owns, and nothing in this module panics on input from the network.
//!
//! * `actions.rs` — [`Action`], the closed list of things a permission can grant.
//! * `pattern.rs` — [`Resource`] and [`ResourcePattern`] (`tenant/namespace/name` with `*`
//!   wildcards) and the matching rules.
//! * `claims.rs` — [`Claims`] (a token's payload) and [`Permission`] (`action:pattern`).
//! * `state.rs` — [`AuthState`]: signing keys, roles, bindings, revocations, the bootstrap
//!   token, as replicated.
//! * `token.rs` — [`mint`], [`verify`] (EdDSA only), [`check_live`] and [`TokenError`].
//! * `oidc.rs` — [`OidcIssuer`] (a trusted identity provider, as registered) and
//!   [`verify_oidc`]: an IdP's JWT checked against its issuer's JWKS and mapped to a tenant,
//!   a subject and roles, for the token exchange.
//! * `principal.rs` — [`Principal`]: a verified token with its roles expanded, and its check
//!   API ([`Principal::check`], [`Principal::sees`]).
//! * `sasl.rs` — [`SaslMechanism`]: the token inside a Kafka client's SASL PLAIN or
//!   OAUTHBEARER message.
//!
//! ```
//! use felix_meta::auth::{self, Action, AuthState, Claims, Principal, Resource, SigningKey};
//! let key = SigningKey::generate(0).unwrap();
//! let mut state = AuthState::default();
//! state.keys.insert(key.kid.clone(), key.clone());
//! let claims = Claims {
//!     tenant: "acme".into(), sub: "svc".into(), exp: 100, iat: 0, jti: "t1".into(),
//!     namespace: "default".into(), roles: vec!["tenant-admin".into()], allow: vec![],
//! };
//! let token = auth::mint(&key, &claims).unwrap();
//! let verified = auth::verify(&token, &state, 50).unwrap();
//! let who = Principal::new(verified, &state);
//! assert!(who.check(Action::StreamPublish, &Resource::stream("acme", "default", "orders")).is_ok());
//! assert!(who.check(Action::StreamPublish, &Resource::stream("other", "default", "orders")).is_err());
//! ```

mod actions;
mod claims;
mod oidc;
mod pattern;
mod principal;
mod sasl;
mod state;
mod token;

pub use actions::Action;
pub use claims::{
    ALL_TENANTS, Claims, DEFAULT_NAMESPACE, MAX_TOKEN_LEN, MAX_TOKEN_TTL_SECS, Permission,
    PermissionError,
};
pub use oidc::{
    DEFAULT_EXCHANGE_TTL_SECS, MAX_EXCHANGE_TTL_SECS, OidcError, OidcIdentity, OidcIssuer,
    claims_an_issuer, verify_oidc,
};
pub use pattern::{PatternError, Resource, ResourcePattern};
pub use principal::{CLUSTER_ADMIN, Denied, Principal, TENANT_ADMIN, is_builtin_role, role_grants};
pub use sasl::{MAX_SASL_MESSAGE, SaslError, SaslMechanism, oauthbearer_token, plain_token};
pub use state::{AuthState, BootstrapToken, SigningKey};
pub use token::{TokenError, check_live, mint, now_secs, random_id, verify, verify_signature};
