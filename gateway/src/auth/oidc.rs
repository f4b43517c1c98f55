//! The OIDC exchange: an identity provider's JWT traded for a short-lived Felix token, and
//! the registry of trusted issuers it checks against.
//!
//! Decides who may register issuers (`rbac.manage` on `*`, like defining roles: an issuer
//! can map tokens into any tenant) and what an exchanged token carries: the tenant, subject
//! and roles the issuer's mapping gives ([`felix_meta::auth::verify_oidc`]), a fresh token
//! id, and a lifetime of the issuer's `ttl_secs` (15 minutes by default) but never past the
//! IdP token's own expiry. Issuers live in the control plane, so every broker verifies the
//! same way and an exchange needs no round trip beyond signing. The invariant: a refused
//! exchange mints nothing and says only why (`unauthorized` with the [`OidcError`] reason),
//! never which issuers, tenants or keys are registered. [`AccessControl::exchange_oidc`] is
//! the one function every door that takes an IdP token goes through (the admin route, QUIC
//! `ExchangeOidcToken`, and the Kafka listener's OAUTHBEARER through
//! [`AccessControl::exchange_oidc_credential`]).

use std::sync::Arc;

use felix_meta::auth::{
    self, Action, Claims, DEFAULT_EXCHANGE_TTL_SECS, DEFAULT_NAMESPACE, OidcError, OidcIssuer,
    Resource,
};
use felix_meta::model::Command;
use felix_wire::protocol::{ErrorBody, OidcIssuerSpec, codes};

use super::access::{AccessControl, Credential};
use super::manage::MintedToken;
use crate::errors::meta_error;

/// The refusal of an IdP token: code `unauthorized`, the reason why.
pub fn oidc_refusal(e: &OidcError) -> ErrorBody {
    ErrorBody::new(codes::UNAUTHORIZED, e.reason(), e.to_string())
}

fn from_spec(s: OidcIssuerSpec) -> OidcIssuer {
    OidcIssuer {
        issuer: s.issuer,
        audience: s.audience,
        jwks: s.jwks,
        tenant: s.tenant,
        tenant_claim: s.tenant_claim,
        subject_claim: s.subject_claim.unwrap_or_else(|| "sub".to_owned()),
        roles_claim: s.roles_claim,
        role_map: s.role_map,
        default_roles: s.default_roles,
        ttl_secs: s.ttl_secs.unwrap_or(DEFAULT_EXCHANGE_TTL_SECS),
    }
}

fn to_spec(i: &OidcIssuer) -> OidcIssuerSpec {
    OidcIssuerSpec {
        issuer: i.issuer.clone(),
        audience: i.audience.clone(),
        jwks: i.jwks.clone(),
        tenant: i.tenant.clone(),
        tenant_claim: i.tenant_claim.clone(),
        subject_claim: Some(i.subject_claim.clone()),
        roles_claim: i.roles_claim.clone(),
        role_map: i.role_map.clone(),
        default_roles: i.default_roles.clone(),
        ttl_secs: Some(i.ttl_secs),
    }
}

impl AccessControl {
    /// Registers or replaces a trusted issuer.
    pub async fn put_oidc_issuer(
        &self,
        credential: Option<&Credential>,
        spec: OidcIssuerSpec,
    ) -> Result<(), ErrorBody> {
        self.authorize(credential, Action::RbacManage, &Resource::Cluster)?;
        let issuer = from_spec(spec);
        // Checked here for a clear answer before proposing; the control plane checks again.
        issuer.validate().map_err(|e| {
            ErrorBody::new(codes::INVALID_ARGUMENT, "invalid_argument", e.to_string())
        })?;
        self.meta()
            .propose(Command::PutOidcIssuer { issuer })
            .await
            .map_err(meta_error)?;
        Ok(())
    }

    /// The registered issuers.
    pub fn list_oidc_issuers(
        &self,
        credential: Option<&Credential>,
    ) -> Result<Vec<OidcIssuerSpec>, ErrorBody> {
        self.authorize(credential, Action::RbacManage, &Resource::Cluster)?;
        Ok(self
            .meta()
            .local(|s| s.auth.issuers.values().map(to_spec).collect()))
    }

    pub async fn delete_oidc_issuer(
        &self,
        credential: Option<&Credential>,
        issuer: &str,
    ) -> Result<(), ErrorBody> {
        self.authorize(credential, Action::RbacManage, &Resource::Cluster)?;
        self.meta()
            .propose(Command::DeleteOidcIssuer {
                issuer: issuer.to_owned(),
            })
            .await
            .map_err(meta_error)?;
        Ok(())
    }

    /// Verifies an IdP token against the registered issuers and mints the Felix token it
    /// maps to. With `tenant`, the token must map to that tenant. Needs no Felix token: the
    /// IdP token is the credential.
    pub async fn exchange_oidc(
        &self,
        jwt: &str,
        tenant: Option<&str>,
    ) -> Result<MintedToken, ErrorBody> {
        let now = auth::now_secs();
        let identity = self
            .meta()
            .local(|s| auth::verify_oidc(jwt, &s.auth.issuers, tenant, now))
            .map_err(|e| {
                // Debug only: anyone can send JWTs here; the metric counts them.
                tracing::debug!(reason = e.reason(), "OIDC token exchange refused: {e}");
                oidc_refusal(&e)
            })?;
        // Asked only once the token proved it acts for this tenant, so a stranger learns
        // nothing about which tenants exist.
        if !self.meta().registry().borrow().has_tenant(&identity.tenant) {
            return Err(ErrorBody::new(
                codes::UNKNOWN_TENANT,
                "unknown_tenant",
                format!("unknown tenant {:?}", identity.tenant),
            ));
        }
        let claims = Claims {
            tenant: identity.tenant.clone(),
            sub: identity.sub.clone(),
            exp: identity.felix_expiry(now),
            iat: now,
            jti: auth::random_id(16),
            namespace: DEFAULT_NAMESPACE.to_owned(),
            // No roles means none: unlike `token create`, an exchange never defaults to
            // tenant-admin. Bindings of the subject still apply.
            roles: identity.roles.clone(),
            allow: Vec::new(),
        };
        let token = self.sign(&claims).await?;
        tracing::info!(
            issuer = %identity.issuer,
            tenant = %claims.tenant,
            sub = %claims.sub,
            jti = %claims.jti,
            roles = ?claims.roles,
            "OIDC token exchanged for a Felix token"
        );
        Ok(MintedToken {
            token,
            jti: claims.jti,
            expires_at: claims.exp,
        })
    }

    /// [`exchange_oidc`](Self::exchange_oidc), then the minted token verified as a
    /// connection holds it: for a listener that takes an IdP token where it takes a Felix
    /// token (the Kafka listener's OAUTHBEARER).
    pub async fn exchange_oidc_credential(
        &self,
        jwt: &str,
        tenant: Option<&str>,
    ) -> Result<Arc<Credential>, ErrorBody> {
        let minted = self.exchange_oidc(jwt, tenant).await?;
        self.authenticate(&minted.token)
    }
}
