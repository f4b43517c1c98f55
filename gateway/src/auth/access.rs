//! Whether a request may proceed: the broker's side of authorization, shared by every door.
//!
//! Decides, with auth on, that nothing is done for a caller without a live token that
//! grants the action on the resource. A token's signature is verified once, when it is
//! presented ([`AccessControl::authenticate`] gives a [`Credential`] the caller keeps per
//! connection); every later request re-checks only what can change — expiry, revocation and,
//! when the control plane's roles or bindings changed, the expanded grants — against this
//! broker's own replica of the control plane's state ([`felix_meta::auth`]), so no request
//! waits on another node and a revocation applied here is effective here at once. With auth
//! off every check passes and nothing is asked for.
//!
//! Invariant: a refusal names the action only (code `forbidden`) or the token's problem
//! (code `unauthorized`), never a resource of another tenant, and it is given before any
//! work is done, so a refused request changes nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use felix_meta::MetaHandle;
use felix_meta::auth::{self, Action, Claims, Denied, Principal, Resource, TokenError};
use felix_wire::protocol::{ErrorBody, codes};
use parking_lot::RwLock;

/// Fault injection (`FELIX_FAULT_INJECTION=1` only, set through the admin API): the broker a
/// client reached skips its own `stream.publish` check, so a test can see that the shard's
/// owner checks a forwarded publish again.
static SKIP_INGRESS_PUBLISH_CHECK: AtomicBool = AtomicBool::new(false);

/// Sets the [`SKIP_INGRESS_PUBLISH_CHECK`] fault.
pub fn set_skip_ingress_publish_check(on: bool) {
    SKIP_INGRESS_PUBLISH_CHECK.store(on, Ordering::Release);
}

fn skip_ingress_publish_check() -> bool {
    SKIP_INGRESS_PUBLISH_CHECK.load(Ordering::Acquire)
        && std::env::var("FELIX_FAULT_INJECTION").is_ok_and(|v| v == "1")
}

/// A verified token, as a connection (or one HTTP request) holds it.
pub struct Credential {
    /// The token as presented: a forwarded publish carries it to the shard's owner.
    token: Arc<str>,
    claims: Claims,
    /// Re-expanded when the control plane's roles or bindings change.
    principal: RwLock<Principal>,
}

impl Credential {
    pub fn token(&self) -> &str {
        &self.token
    }
    pub fn claims(&self) -> &Claims {
        &self.claims
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("tenant", &self.claims.tenant)
            .field("sub", &self.claims.sub)
            .field("jti", &self.claims.jti)
            .finish_non_exhaustive()
    }
}

/// The refusal for a token problem: code `unauthorized`, the token error's reason.
pub fn unauthorized(e: &TokenError) -> ErrorBody {
    ErrorBody::new(codes::UNAUTHORIZED, e.reason(), e.to_string())
}

/// The refusal for a missing grant: code `forbidden`; the message names the action only.
pub fn forbidden(d: &Denied) -> ErrorBody {
    ErrorBody::new(codes::FORBIDDEN, "forbidden", d.to_string())
}

/// Verified tokens kept for callers that present one per request (admin HTTP, forwarded
/// publishes): beyond this many the cache starts again (a token verifies again, nothing
/// else changes).
const VERIFIED_CACHE_MAX: usize = 4096;

type VerifiedCache = Arc<parking_lot::Mutex<HashMap<Arc<str>, Arc<Credential>>>>;

/// The broker's access checks.
#[derive(Clone)]
pub struct AccessControl {
    enabled: bool,
    meta: MetaHandle,
    verified: VerifiedCache,
}

impl AccessControl {
    pub fn new(enabled: bool, meta: MetaHandle) -> AccessControl {
        AccessControl {
            enabled,
            meta,
            verified: VerifiedCache::default(),
        }
    }

    /// Whether auth is on (the `auth` setting).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub(crate) fn meta(&self) -> &MetaHandle {
        &self.meta
    }

    /// Verifies `token` (signature, form, expiry, revocation) against this broker's replica
    /// of the keys, and expands its roles. The one expensive step: callers keep the result.
    pub fn authenticate(&self, token: &str) -> Result<Arc<Credential>, ErrorBody> {
        let now = auth::now_secs();
        self.meta.local(|s| {
            let claims = auth::verify(token, &s.auth, now).map_err(|e| unauthorized(&e))?;
            let principal = Principal::new(claims.clone(), &s.auth);
            Ok(Arc::new(Credential {
                token: Arc::from(token.trim()),
                claims,
                principal: RwLock::new(principal),
            }))
        })
    }

    /// A bearer credential (SASL OAUTHBEARER on the Kafka listener): a Felix token, or an
    /// identity provider's token from a registered issuer, exchanged as
    /// `POST /v1/tenants/{tenant}/token/exchange` would (for the tenant the issuer maps it
    /// to). Which refusal a bad token gets follows its shape: one that claims an issuer
    /// (`iss`) gets the exchange's (`unknown_issuer`, `expired`, ...), any other the Felix
    /// verifier's (so a stale Felix token is told `token_expired`).
    pub async fn authenticate_bearer(&self, token: &str) -> Result<Arc<Credential>, ErrorBody> {
        let felix = match self.authenticate(token) {
            Ok(credential) => return Ok(credential),
            Err(e) => e,
        };
        if auth::claims_an_issuer(token) {
            self.exchange_oidc_credential(token, None).await
        } else {
            Err(felix)
        }
    }

    /// [`authenticate`](Self::authenticate) for callers that present the token with every
    /// request: a token verified before is taken from a cache (its expiry and revocation are
    /// still checked by every later check, as for a connection's token).
    pub fn authenticate_cached(&self, token: &str) -> Result<Arc<Credential>, ErrorBody> {
        let token = token.trim();
        if let Some(c) = self.verified.lock().get(token).cloned() {
            return Ok(c);
        }
        let c = self.authenticate(token)?;
        let mut cache = self.verified.lock();
        if cache.len() >= VERIFIED_CACHE_MAX {
            cache.clear();
        }
        cache.insert(c.token.clone(), c.clone());
        Ok(c)
    }

    /// The per-request check: `credential` is live and grants `action` on `resource`. With
    /// auth off, always `Ok`. `None` is a caller who presented no token.
    pub fn authorize(
        &self,
        credential: Option<&Credential>,
        action: Action,
        resource: &Resource,
    ) -> Result<(), ErrorBody> {
        self.check(credential, |p| {
            p.check(action, resource).map_err(|d| forbidden(&d))
        })
    }

    /// Like [`authorize`](Self::authorize) for describing or listing: any grant on the
    /// resource or below it will do.
    pub fn authorize_view(
        &self,
        credential: Option<&Credential>,
        action_named: Action,
        resource: &Resource,
    ) -> Result<(), ErrorBody> {
        self.check(credential, |p| {
            if p.sees(resource) {
                Ok(())
            } else {
                Err(forbidden(&Denied {
                    action: action_named,
                }))
            }
        })
    }

    /// Whether `credential` may see `resource` (to filter a list). With auth off, `true`.
    pub fn can_view(&self, credential: Option<&Credential>, resource: &Resource) -> bool {
        self.check(credential, |p| {
            if p.sees(resource) {
                Ok(())
            } else {
                Err(forbidden(&Denied {
                    action: Action::StreamSubscribe,
                }))
            }
        })
        .is_ok()
    }

    /// Only that the caller holds a live token (requests tied to no resource).
    pub fn authorize_any(&self, credential: Option<&Credential>) -> Result<(), ErrorBody> {
        self.check(credential, |_| Ok(()))
    }

    /// The ingress check of a publish: [`authorize`](Self::authorize) for `stream.publish`,
    /// unless the fault-injection switch says to leave it to the shard's owner.
    pub fn authorize_ingress_publish(
        &self,
        credential: Option<&Credential>,
        resource: &Resource,
    ) -> Result<(), ErrorBody> {
        if skip_ingress_publish_check() {
            return Ok(());
        }
        self.authorize(credential, Action::StreamPublish, resource)
    }

    /// Whether `credential` is still live (not expired, not revoked). With auth off, `Ok`.
    pub fn still_live(&self, credential: Option<&Credential>) -> Result<(), ErrorBody> {
        self.authorize_any(credential)
    }

    fn check(
        &self,
        credential: Option<&Credential>,
        decide: impl FnOnce(&Principal) -> Result<(), ErrorBody>,
    ) -> Result<(), ErrorBody> {
        if !self.enabled {
            return Ok(());
        }
        let Some(cred) = credential else {
            return Err(unauthorized(&TokenError::Missing));
        };
        let now = auth::now_secs();
        self.meta.local(|s| {
            auth::check_live(&cred.claims, &s.auth, now).map_err(|e| unauthorized(&e))?;
            if cred.principal.read().is_stale(&s.auth) {
                *cred.principal.write() = Principal::new(cred.claims.clone(), &s.auth);
            }
            decide(&cred.principal.read())
        })
    }
}
