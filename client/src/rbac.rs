//! The token, role and key requests (docs/security.md), declared once for a
//! [`crate::Client`] and a [`crate::Connection`] like the other admin requests: none is
//! re-sent after an unknown outcome except listing roles.

use std::time::Duration;

/// What a minted token is to grant (see [`crate::Connection::mint_token`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenSpec {
    pub tenant: String,
    /// Who holds it; role bindings are per subject (the broker's default: `default`).
    pub subject: Option<String>,
    /// The namespace the Kafka mapping uses (default `default`).
    pub namespace: Option<String>,
    /// Role names; with neither roles nor `allow`, the tenant's `tenant-admin` role.
    pub roles: Vec<String>,
    /// `action:pattern` grants, instead of roles.
    pub allow: Vec<String>,
    /// Lifetime (the broker's default: one hour; at most 90 days).
    pub ttl: Option<Duration>,
}

/// A minted token: the token itself, its id (what a revocation names) and its expiry in
/// seconds since the Unix epoch.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedToken {
    pub token: String,
    pub jti: String,
    pub expires_at: u64,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("jti", &self.jti)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// The token, role and key methods of a type with `admin` and `admin_done` (see
/// `admin_requests!`).
macro_rules! rbac_requests {
    () => {
        /// Mints a token (needs `rbac.manage` on the tenant).
        pub async fn mint_token(
            &self,
            spec: $crate::TokenSpec,
        ) -> Result<$crate::IssuedToken, $crate::ClientError> {
            let request = $crate::Request::MintToken {
                tenant: spec.tenant,
                subject: spec.subject,
                namespace: spec.namespace,
                roles: spec.roles,
                allow: spec.allow,
                ttl_secs: spec.ttl.map(|d| d.as_secs().max(1)),
            };
            match self.admin(request, false).await? {
                $crate::Response::Token {
                    token,
                    jti,
                    expires_at,
                } => Ok($crate::IssuedToken {
                    token,
                    jti,
                    expires_at,
                }),
                other => Err($crate::unexpected("MintToken", &other)),
            }
        }

        /// Revokes a token by its id: refused on every broker once applied.
        pub async fn revoke_token(&self, jti: &str) -> Result<(), $crate::ClientError> {
            self.admin_done($crate::Request::RevokeToken {
                jti: jti.to_owned(),
            })
            .await
        }

        /// Creates or replaces a role granting `allow` (`action:pattern` each).
        pub async fn put_role(
            &self,
            name: &str,
            allow: &[String],
        ) -> Result<(), $crate::ClientError> {
            self.admin_done($crate::Request::PutRole {
                name: name.to_owned(),
                allow: allow.to_vec(),
            })
            .await
        }

        /// The roles this token may see.
        pub async fn list_roles(&self) -> Result<Vec<$crate::RoleInfo>, $crate::ClientError> {
            match self.admin($crate::Request::ListRoles {}, true).await? {
                $crate::Response::Roles { roles } => Ok(roles),
                other => Err($crate::unexpected("ListRoles", &other)),
            }
        }

        pub async fn delete_role(&self, name: &str) -> Result<(), $crate::ClientError> {
            self.admin_done($crate::Request::DeleteRole {
                name: name.to_owned(),
            })
            .await
        }

        /// Binds `subject` of `tenant` to `role`.
        pub async fn bind_role(
            &self,
            tenant: &str,
            subject: &str,
            role: &str,
        ) -> Result<(), $crate::ClientError> {
            self.admin_done($crate::Request::BindRole {
                tenant: tenant.to_owned(),
                subject: subject.to_owned(),
                role: role.to_owned(),
            })
            .await
        }

        /// Registers or replaces a trusted OIDC issuer (needs `rbac.manage` on `*`).
        pub async fn put_oidc_issuer(
            &self,
            issuer: $crate::OidcIssuerSpec,
        ) -> Result<(), $crate::ClientError> {
            self.admin_done($crate::Request::PutOidcIssuer { issuer })
                .await
        }

        /// The registered OIDC issuers.
        pub async fn list_oidc_issuers(
            &self,
        ) -> Result<Vec<$crate::OidcIssuerSpec>, $crate::ClientError> {
            match self
                .admin($crate::Request::ListOidcIssuers {}, true)
                .await?
            {
                $crate::Response::OidcIssuers { issuers } => Ok(issuers),
                other => Err($crate::unexpected("ListOidcIssuers", &other)),
            }
        }

        pub async fn delete_oidc_issuer(&self, issuer: &str) -> Result<(), $crate::ClientError> {
            self.admin_done($crate::Request::DeleteOidcIssuer {
                issuer: issuer.to_owned(),
            })
            .await
        }

        /// Trades an identity provider's JWT for a short-lived Felix token of `tenant`
        /// (needs no Felix token). Safe to re-send: a lost answer only leaves an unused token.
        pub async fn exchange_oidc_token(
            &self,
            tenant: &str,
            token: &str,
        ) -> Result<$crate::IssuedToken, $crate::ClientError> {
            let request = $crate::Request::ExchangeOidcToken {
                tenant: tenant.to_owned(),
                token: token.trim().to_owned(),
            };
            match self.admin(request, true).await? {
                $crate::Response::Token {
                    token,
                    jti,
                    expires_at,
                } => Ok($crate::IssuedToken {
                    token,
                    jti,
                    expires_at,
                }),
                other => Err($crate::unexpected("ExchangeOidcToken", &other)),
            }
        }

        /// Adds a new signing key; returns its id.
        pub async fn rotate_key(&self) -> Result<String, $crate::ClientError> {
            match self.admin($crate::Request::RotateKey {}, false).await? {
                $crate::Response::SigningKey { kid } => Ok(kid),
                other => Err($crate::unexpected("RotateKey", &other)),
            }
        }
    };
}
