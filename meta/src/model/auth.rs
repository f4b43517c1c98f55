//! Applying the authorization commands: keys, roles, bindings, revocations, bootstrap.
//!
//! Decides which changes to [`AuthState`](crate::auth::AuthState) are valid. The
//! invariants: built-in roles cannot be defined, changed or deleted; a binding names a role
//! that exists; a key id is never reused; revocations of tokens that have expired are pruned
//! (they can no longer be presented), the bootstrap token is set once, and an OIDC issuer
//! is complete (its JWKS holds a usable key) and gives only roles that exist. Every accepted
//! change bumps the state's version, which brokers use to re-expand cached principals.

use super::command::{Applied, Command};
use super::errors::{CommandError, exists, missing};
use super::names::check_name;
use super::state::MetaState;
use crate::auth::is_builtin_role;

impl MetaState {
    /// Applies one of the authorization commands (the others never reach here).
    pub(super) fn apply_auth(&mut self, cmd: &Command) -> Result<Applied, CommandError> {
        let auth = &mut self.auth;
        match cmd {
            Command::AddSigningKey {
                key,
                retire_others_at,
                initial,
            } => {
                if *initial && !auth.keys.is_empty() {
                    return Ok(Applied::Done);
                }
                if key.kid.is_empty() || key.public.is_empty() || key.private_pkcs8.is_empty() {
                    return Err(CommandError::Invalid(
                        "a signing key needs a kid and both halves".into(),
                    ));
                }
                if auth.keys.contains_key(&key.kid) {
                    return Err(exists("signing key", &key.kid));
                }
                for other in auth.keys.values_mut() {
                    if other.retire_at.is_none() {
                        other.retire_at = Some(*retire_others_at);
                    }
                }
                let mut key = key.clone();
                key.retire_at = None;
                auth.keys.insert(key.kid.clone(), key);
            }
            Command::PutRole { name, permissions } => {
                check_name("role", name)?;
                if is_builtin_role(name) {
                    return Err(CommandError::Invalid(format!(
                        "{name} is a built-in role and cannot be redefined"
                    )));
                }
                if permissions.is_empty() {
                    return Err(CommandError::Invalid(
                        "a role grants at least one permission".into(),
                    ));
                }
                auth.roles
                    .insert(name.clone(), permissions.iter().cloned().collect());
            }
            Command::DeleteRole { name } => {
                if is_builtin_role(name) {
                    return Err(CommandError::Invalid(format!(
                        "{name} is a built-in role and cannot be deleted"
                    )));
                }
                if auth.roles.remove(name).is_none() {
                    return Err(missing("role", name));
                }
                for subjects in auth.bindings.values_mut() {
                    for roles in subjects.values_mut() {
                        roles.remove(name);
                    }
                    subjects.retain(|_, r| !r.is_empty());
                }
                auth.bindings.retain(|_, s| !s.is_empty());
            }
            Command::BindRole {
                tenant,
                subject,
                role,
            } => {
                if subject.is_empty() {
                    return Err(CommandError::Invalid("a binding names a subject".into()));
                }
                if !self.tenants.contains_key(tenant) {
                    return Err(missing("tenant", tenant));
                }
                if !is_builtin_role(role) && !auth.roles.contains_key(role) {
                    return Err(missing("role", role));
                }
                let roles = auth
                    .bindings
                    .entry(tenant.clone())
                    .or_default()
                    .entry(subject.clone())
                    .or_default();
                if !roles.insert(role.clone()) {
                    return Err(exists("binding", format!("{tenant}/{subject} to {role}")));
                }
            }
            Command::UnbindRole {
                tenant,
                subject,
                role,
            } => {
                let removed = auth
                    .bindings
                    .get_mut(tenant)
                    .and_then(|s| s.get_mut(subject))
                    .is_some_and(|r| r.remove(role));
                if !removed {
                    return Err(missing("binding", format!("{tenant}/{subject} to {role}")));
                }
                if let Some(subjects) = auth.bindings.get_mut(tenant) {
                    subjects.retain(|_, r| !r.is_empty());
                }
                auth.bindings.retain(|_, s| !s.is_empty());
            }
            Command::RevokeToken {
                jti,
                expires_at,
                now,
            } => {
                if jti.is_empty() {
                    return Err(CommandError::Invalid(
                        "a revocation names a token id".into(),
                    ));
                }
                auth.revoked.retain(|_, exp| *exp > *now);
                // Revoking again (or an id already expired) is accepted: the caller's wish
                // holds either way.
                auth.revoked.insert(jti.clone(), *expires_at);
            }
            Command::SetBootstrapToken { jti, token } => {
                if auth.bootstrap.is_some() {
                    return Ok(Applied::Done);
                }
                auth.bootstrap = Some(crate::auth::BootstrapToken {
                    jti: jti.clone(),
                    token: token.clone(),
                });
            }
            Command::PutOidcIssuer { issuer } => {
                issuer.validate().map_err(CommandError::Invalid)?;
                if let Some(role) = issuer
                    .roles_named()
                    .find(|r| !is_builtin_role(r) && !auth.roles.contains_key(*r))
                {
                    return Err(missing("role", role));
                }
                auth.issuers.insert(issuer.issuer.clone(), issuer.clone());
            }
            Command::DeleteOidcIssuer { issuer } => {
                if auth.issuers.remove(issuer).is_none() {
                    return Err(missing("OIDC issuer", issuer));
                }
            }
            _ => {
                return Err(CommandError::Invalid("not an authorization command".into()));
            }
        }
        auth.version += 1;
        Ok(Applied::Done)
    }
}

#[cfg(test)]
mod tests {
    use crate::auth::{Permission, SigningKey};
    use crate::model::{Command, CommandError, MetaState};

    fn key(kid: &str, at: u64) -> SigningKey {
        SigningKey {
            kid: kid.into(),
            private_pkcs8: "cHJpdg".into(),
            public: "cHVi".into(),
            created_at: at,
            retire_at: None,
        }
    }

    #[test]
    fn a_rotation_retires_the_previous_keys_and_the_newest_signs() {
        let mut s = MetaState::default();
        s.apply(&Command::AddSigningKey {
            key: key("k1", 1),
            retire_others_at: 0,
            initial: true,
        })
        .unwrap();
        s.apply(&Command::AddSigningKey {
            key: key("k2", 5),
            retire_others_at: 100,
            initial: false,
        })
        .unwrap();
        s.apply(&Command::AddSigningKey {
            key: key("k3", 6),
            retire_others_at: 300,
            initial: true,
        })
        .unwrap();
        assert_eq!(
            s.auth.active_key().unwrap().kid,
            "k2",
            "an initial key only comes first"
        );
        assert!(!s.auth.keys.contains_key("k3"));
        assert_eq!(s.auth.keys["k1"].retire_at, Some(100));
        assert!(s.auth.verifying_key("k1", 99).is_some());
        assert!(s.auth.verifying_key("k1", 100).is_none());
        let before = s.clone();
        assert!(matches!(
            s.apply(&Command::AddSigningKey {
                key: key("k2", 9),
                retire_others_at: 200,
                initial: false,
            }),
            Err(CommandError::AlreadyExists { .. })
        ));
        assert_eq!(s, before, "a refused command changes nothing");
    }

    #[test]
    fn roles_bindings_and_builtins_are_validated() {
        let mut s = MetaState::default();
        s.apply(&Command::CreateTenant { name: "a".into() })
            .unwrap();
        let perms = vec![Permission::parse("stream.subscribe:a/*").unwrap()];
        assert!(
            s.apply(&Command::PutRole {
                name: "tenant-admin".into(),
                permissions: perms.clone()
            })
            .is_err()
        );
        assert!(
            s.apply(&Command::BindRole {
                tenant: "a".into(),
                subject: "svc".into(),
                role: "reader".into()
            })
            .is_err(),
            "unknown role"
        );
        s.apply(&Command::PutRole {
            name: "reader".into(),
            permissions: perms,
        })
        .unwrap();
        s.apply(&Command::BindRole {
            tenant: "a".into(),
            subject: "svc".into(),
            role: "reader".into(),
        })
        .unwrap();
        assert_eq!(
            s.auth.bound_roles("a", "svc").collect::<Vec<_>>(),
            ["reader"]
        );
        s.apply(&Command::DeleteRole {
            name: "reader".into(),
        })
        .unwrap();
        assert!(s.auth.bindings.is_empty(), "deleting a role unbinds it");
    }

    #[test]
    fn an_oidc_issuer_is_registered_only_complete_and_with_roles_that_exist() {
        use crate::auth::OidcIssuer;
        let key = SigningKey::generate(1).unwrap();
        let issuer = OidcIssuer {
            issuer: "https://idp".into(),
            audience: "felix".into(),
            jwks: format!(
                r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","kid":"k","x":"{}"}}]}}"#,
                key.public
            ),
            tenant: Some("a".into()),
            tenant_claim: None,
            subject_claim: "sub".into(),
            roles_claim: None,
            role_map: Default::default(),
            default_roles: vec!["reader".into()],
            ttl_secs: 900,
        };
        let mut s = MetaState::default();
        let put = |i: &OidcIssuer| Command::PutOidcIssuer { issuer: i.clone() };
        let before = s.clone();
        assert!(
            matches!(s.apply(&put(&issuer)), Err(CommandError::NotFound { .. })),
            "an unknown role"
        );
        let no_keys = OidcIssuer {
            jwks: r#"{"keys":[]}"#.into(),
            default_roles: vec![],
            ..issuer.clone()
        };
        assert!(matches!(
            s.apply(&put(&no_keys)),
            Err(CommandError::Invalid(_))
        ));
        assert_eq!(s, before, "a refused registration changes nothing");
        s.apply(&Command::PutRole {
            name: "reader".into(),
            permissions: vec![Permission::parse("stream.subscribe:a/*").unwrap()],
        })
        .unwrap();
        s.apply(&put(&issuer)).unwrap();
        assert_eq!(s.auth.issuers["https://idp"], issuer);
        let remove = Command::DeleteOidcIssuer {
            issuer: "https://idp".into(),
        };
        s.apply(&remove).unwrap();
        assert!(s.auth.issuers.is_empty());
        assert!(matches!(
            s.apply(&remove),
            Err(CommandError::NotFound { .. })
        ));
    }

    #[test]
    fn revocations_are_pruned_once_their_tokens_expired_and_bootstrap_is_set_once() {
        let mut s = MetaState::default();
        let revoke = |jti: &str, exp, now| Command::RevokeToken {
            jti: jti.into(),
            expires_at: exp,
            now,
        };
        s.apply(&revoke("a", 10, 0)).unwrap();
        s.apply(&revoke("b", 50, 5)).unwrap();
        assert!(s.auth.is_revoked("a") && s.auth.is_revoked("b"));
        s.apply(&revoke("c", 90, 20)).unwrap();
        assert!(!s.auth.is_revoked("a") && s.auth.is_revoked("b"));
        for token in ["first", "second"] {
            s.apply(&Command::SetBootstrapToken {
                jti: token.into(),
                token: token.into(),
            })
            .unwrap();
        }
        assert_eq!(s.auth.bootstrap.as_ref().unwrap().token, "first");
    }
}
