//! Authorization at the broker's doors: QUIC requests, admin HTTP, forwarded publishes.
//!
//! Decides where each request is checked and against what; the rules themselves (tokens,
//! actions, patterns, roles) are `felix_meta::auth`, shared with every listener. With auth
//! off nothing here asks for anything. docs/security.md describes the whole.
//!
//! * `access.rs` — [`AccessControl`]: verify a token once ([`Credential`]), check it per
//!   request; the `unauthorized` and `forbidden` refusals.
//! * `requests.rs` — which check each QUIC request needs, before any work.
//! * `manage.rs` — minting and revoking tokens, roles, bindings, key rotation, the JWKS.
//! * `oidc.rs` — trusted OIDC issuers and the exchange of an IdP token for a Felix token
//!   ([`AccessControl::exchange_oidc`]).
//! * `bootstrap.rs` — the bootstrap admin token and `<data_dir>/admin.token`.

mod access;
mod bootstrap;
mod manage;
mod oidc;
mod requests;

pub use access::{
    AccessControl, Credential, forbidden, set_skip_ingress_publish_check, unauthorized,
};
pub use bootstrap::{ADMIN_TOKEN_FILE, ensure_bootstrap_token};
pub use manage::{DEFAULT_TOKEN_TTL_SECS, MintRequest, MintedToken, parse_grants};
pub use oidc::oidc_refusal;
pub use requests::{Check, check_for};
