//! Managing tokens, roles, bindings and signing keys: the operations behind `felixctl
//! token|role|key` (QUIC) and the admin API's `/v1/tokens`, `/v1/roles`, `/v1/keys` routes,
//! declared once here so both doors answer alike.
//!
//! Decides who may change who may do what. Minting a tenant's token needs `rbac.manage` on
//! that tenant (a cluster-wide token, tenant `*`, needs `cluster.manage`); defining roles
//! needs `rbac.manage` on `*`; binding needs `rbac.manage` on the tenant; rotating keys needs
//! `cluster.manage`. Because a token is confined to its tenant, a tenant's admin can grant
//! nothing outside that tenant whatever it writes in `--allow`. The invariant: every change
//! goes through the control plane's log (keys are generated here, at the proposer, because
//! commands carry no randomness), and a refusal changes nothing.

use felix_meta::auth::{
    self, ALL_TENANTS, Action, CLUSTER_ADMIN, Claims, DEFAULT_NAMESPACE, MAX_TOKEN_TTL_SECS,
    Permission, Resource, SigningKey, TENANT_ADMIN, is_builtin_role,
};
use felix_meta::model::Command;
use felix_wire::protocol::{ErrorBody, RoleInfo, codes};

use super::access::{AccessControl, Credential};
use crate::errors::meta_error;

/// Lifetime of a minted token when none is asked for.
pub const DEFAULT_TOKEN_TTL_SECS: u64 = 3600;

/// What minting a token takes (QUIC `MintToken`, `POST /v1/tenants/{tenant}/tokens`).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MintRequest {
    #[serde(default)]
    pub tenant: String,
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub roles: Vec<String>,
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub ttl_secs: Option<u64>,
}

/// A minted token.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MintedToken {
    pub token: String,
    pub jti: String,
    pub expires_at: u64,
}

fn invalid(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(codes::INVALID_ARGUMENT, "invalid_argument", message)
}

/// Parses `action:pattern` grants, refusing the first bad one with its reason.
pub fn parse_grants(allow: &[String]) -> Result<Vec<Permission>, ErrorBody> {
    allow
        .iter()
        .map(|a| Permission::parse(a).map_err(|e| invalid(format!("{a:?}: {e}"))))
        .collect()
}

/// The resource rbac operations of the caller's own scope are checked against.
fn own_scope(credential: Option<&Credential>) -> Resource {
    match credential.map(|c| c.claims().tenant.as_str()) {
        Some(t) if t != ALL_TENANTS => Resource::tenant(t),
        _ => Resource::Cluster,
    }
}

impl AccessControl {
    /// Adds the cluster's first signing key if it has none (idempotent across brokers).
    pub async fn ensure_signing_key(&self) -> Result<(), ErrorBody> {
        if self.meta().local(|s| s.auth.active_key().is_some()) {
            return Ok(());
        }
        let key = SigningKey::generate(auth::now_secs()).map_err(|e| invalid(e.to_string()))?;
        self.meta()
            .propose(Command::AddSigningKey {
                key,
                retire_others_at: 0,
                initial: true,
            })
            .await
            .map_err(meta_error)?;
        Ok(())
    }

    /// Signs `claims` with the cluster's active key (making the first key if need be).
    pub async fn sign(&self, claims: &Claims) -> Result<String, ErrorBody> {
        self.ensure_signing_key().await?;
        let key = self
            .meta()
            .local(|s| s.auth.active_key().cloned())
            .ok_or_else(|| {
                ErrorBody::new(
                    codes::METADATA_UNAVAILABLE,
                    "metadata_unavailable",
                    "no signing key yet",
                )
                .retry_after(500)
            })?;
        auth::mint(&key, claims)
            .map_err(|e| ErrorBody::new(codes::INTERNAL, "internal", e.to_string()))
    }

    /// Mints a token (see the module's rules).
    pub async fn mint_token(
        &self,
        credential: Option<&Credential>,
        req: MintRequest,
    ) -> Result<MintedToken, ErrorBody> {
        let resource = if req.tenant == ALL_TENANTS {
            self.authorize(credential, Action::ClusterManage, &Resource::Cluster)?;
            Resource::Cluster
        } else {
            let r = Resource::tenant(&req.tenant);
            self.authorize(credential, Action::RbacManage, &r)?;
            r
        };
        if req.tenant.is_empty() {
            return Err(invalid("a token is minted for a tenant"));
        }
        if resource != Resource::Cluster && !self.meta().registry().borrow().has_tenant(&req.tenant)
        {
            return Err(ErrorBody::new(
                codes::UNKNOWN_TENANT,
                "unknown_tenant",
                format!("unknown tenant {:?}", req.tenant),
            ));
        }
        if !req.roles.is_empty() && !req.allow.is_empty() {
            return Err(invalid(
                "a token carries either roles or explicit grants (allow), not both",
            ));
        }
        let allow = parse_grants(&req.allow)?;
        let roles = if req.roles.is_empty() && allow.is_empty() {
            vec![TENANT_ADMIN.to_owned()]
        } else {
            req.roles
        };
        let unknown = self.meta().local(|s| {
            roles
                .iter()
                .find(|r| !is_builtin_role(r) && !s.auth.roles.contains_key(*r))
                .cloned()
        });
        if let Some(r) = unknown {
            return Err(invalid(format!("unknown role {r:?}")));
        }
        let ttl = req.ttl_secs.unwrap_or(DEFAULT_TOKEN_TTL_SECS);
        if ttl == 0 || ttl > MAX_TOKEN_TTL_SECS {
            return Err(invalid(format!(
                "a token lives between 1 s and {MAX_TOKEN_TTL_SECS} s (90 days)"
            )));
        }
        let now = auth::now_secs();
        let claims = Claims {
            tenant: req.tenant,
            sub: req.subject.unwrap_or_else(|| "default".to_owned()),
            exp: now + ttl,
            iat: now,
            jti: auth::random_id(16),
            namespace: req
                .namespace
                .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
            roles,
            allow,
        };
        let token = self.sign(&claims).await?;
        Ok(MintedToken {
            token,
            jti: claims.jti,
            expires_at: claims.exp,
        })
    }

    /// Revokes token `jti`. Needs `rbac.manage` on the caller's own tenant, or the token to
    /// be the caller's own. (A token id is 128 random bits: knowing one means having held
    /// the token.) Kept until the longest a token can live has passed.
    pub async fn revoke_token(
        &self,
        credential: Option<&Credential>,
        jti: &str,
    ) -> Result<(), ErrorBody> {
        let own = credential.is_some_and(|c| c.claims().jti == jti);
        if own {
            self.authorize_any(credential)?;
        } else {
            self.authorize(credential, Action::RbacManage, &own_scope(credential))?;
        }
        if jti.is_empty() {
            return Err(invalid("name the token id (jti) to revoke"));
        }
        let now = auth::now_secs();
        self.meta()
            .propose(Command::RevokeToken {
                jti: jti.to_owned(),
                expires_at: now + MAX_TOKEN_TTL_SECS,
                now,
            })
            .await
            .map_err(meta_error)?;
        Ok(())
    }

    /// Creates or replaces a role.
    pub async fn put_role(
        &self,
        credential: Option<&Credential>,
        name: &str,
        allow: &[String],
    ) -> Result<(), ErrorBody> {
        self.authorize(credential, Action::RbacManage, &Resource::Cluster)?;
        let permissions = parse_grants(allow)?;
        self.meta()
            .propose(Command::PutRole {
                name: name.to_owned(),
                permissions,
            })
            .await
            .map_err(meta_error)?;
        Ok(())
    }

    pub async fn delete_role(
        &self,
        credential: Option<&Credential>,
        name: &str,
    ) -> Result<(), ErrorBody> {
        self.authorize(credential, Action::RbacManage, &Resource::Cluster)?;
        self.meta()
            .propose(Command::DeleteRole {
                name: name.to_owned(),
            })
            .await
            .map_err(meta_error)?;
        Ok(())
    }

    /// The roles the caller may see: the built-in ones; every stored one for a holder of
    /// `rbac.manage` on `*`, else those bound to subjects of the caller's tenant.
    pub fn list_roles(&self, credential: Option<&Credential>) -> Result<Vec<RoleInfo>, ErrorBody> {
        self.authorize_any(credential)?;
        let all = self
            .authorize(credential, Action::RbacManage, &Resource::Cluster)
            .is_ok();
        let tenant = credential.map(|c| c.claims().tenant.clone());
        let scope = tenant.as_deref().unwrap_or(ALL_TENANTS);
        let mut roles: Vec<RoleInfo> = [TENANT_ADMIN, CLUSTER_ADMIN]
            .into_iter()
            .map(|name| RoleInfo {
                name: name.to_owned(),
                allow: vec![format!(
                    "*:{}",
                    if name == TENANT_ADMIN {
                        "{tenant}/*"
                    } else {
                        "*"
                    }
                )],
                builtin: true,
            })
            .collect();
        self.meta().local(|s| {
            let bound: std::collections::BTreeSet<&String> = s
                .auth
                .bindings
                .get(scope)
                .into_iter()
                .flat_map(|subjects| subjects.values().flatten())
                .collect();
            for (name, grants) in &s.auth.roles {
                if all || bound.contains(name) {
                    roles.push(RoleInfo {
                        name: name.clone(),
                        allow: grants.iter().map(ToString::to_string).collect(),
                        builtin: false,
                    });
                }
            }
        });
        Ok(roles)
    }

    pub async fn bind_role(
        &self,
        credential: Option<&Credential>,
        tenant: &str,
        subject: &str,
        role: &str,
    ) -> Result<(), ErrorBody> {
        self.authorize(credential, Action::RbacManage, &Resource::tenant(tenant))?;
        self.meta()
            .propose(Command::BindRole {
                tenant: tenant.to_owned(),
                subject: subject.to_owned(),
                role: role.to_owned(),
            })
            .await
            .map_err(meta_error)?;
        Ok(())
    }

    /// Adds a new signing key; the earlier ones verify until every token they signed has
    /// expired. Returns the new key's id.
    pub async fn rotate_key(&self, credential: Option<&Credential>) -> Result<String, ErrorBody> {
        self.authorize(credential, Action::ClusterManage, &Resource::Cluster)?;
        let now = auth::now_secs();
        let key = SigningKey::generate(now).map_err(|e| invalid(e.to_string()))?;
        let kid = key.kid.clone();
        self.meta()
            .propose(Command::AddSigningKey {
                key,
                retire_others_at: now + MAX_TOKEN_TTL_SECS,
                initial: false,
            })
            .await
            .map_err(meta_error)?;
        Ok(kid)
    }

    /// The public halves of the keys that still verify, as a JSON Web Key Set.
    pub fn jwks(&self) -> serde_json::Value {
        let now = auth::now_secs();
        let keys: Vec<serde_json::Value> = self.meta().local(|s| {
            s.auth
                .keys
                .values()
                .filter(|k| s.auth.verifying_key(&k.kid, now).is_some())
                .map(|k| {
                    serde_json::json!({
                        "kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig",
                        "kid": k.kid, "x": k.public,
                    })
                })
                .collect()
        });
        serde_json::json!({ "keys": keys })
    }
}
