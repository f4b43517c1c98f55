//! Who is asking and what they may do: a verified token's claims with its roles expanded.
//!
//! Decides whether a request is allowed. A [`Principal`] is built once per verified token
//! (`Principal::new`), expanding the token's roles, the roles bound to its subject and its
//! explicit grants into a flat list; each request then asks [`Principal::check`] (one
//! action on one resource) or [`Principal::sees`] (describe and list: any grant on the
//! resource or below it). The invariants: a token is confined to its own tenant — whatever
//! its grants say, a tenant's token allows nothing on another tenant's resources or on the
//! cluster — and a refusal ([`Denied`]) names the action only, never the resource, so it
//! tells a caller nothing about what another tenant holds.

use super::actions::Action;
use super::claims::{ALL_TENANTS, Claims, Permission};
use super::pattern::{Resource, ResourcePattern};
use super::state::AuthState;

/// Every action on the token's tenant (`T/*`); on everything for a cluster-wide token.
pub const TENANT_ADMIN: &str = "tenant-admin";
/// Every action on `*`: the bootstrap admin token's role.
pub const CLUSTER_ADMIN: &str = "cluster-admin";

/// The role names Felix defines itself: they cannot be created, changed or deleted.
pub fn is_builtin_role(name: &str) -> bool {
    name == TENANT_ADMIN || name == CLUSTER_ADMIN
}

/// A refusal: the principal lacks `action` on the resource it asked about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("this token does not grant {action} on the requested resource")]
pub struct Denied {
    pub action: Action,
}

/// A verified token and everything it grants.
#[derive(Debug, Clone)]
pub struct Principal {
    claims: Claims,
    grants: Vec<Permission>,
    /// The [`AuthState::version`] the grants were expanded at.
    expanded_at: u64,
}

impl Principal {
    /// Expands `claims` against the roles and bindings in `state`. Unknown role names (a
    /// role deleted since the token was minted) grant nothing.
    pub fn new(claims: Claims, state: &AuthState) -> Principal {
        let mut grants: Vec<Permission> = claims.allow.clone();
        let bound = state.bound_roles(&claims.tenant, &claims.sub);
        for role in claims.roles.iter().map(String::as_str).chain(bound) {
            grants.extend(role_grants(role, &claims.tenant, state));
        }
        grants.sort();
        grants.dedup();
        Principal {
            claims,
            grants,
            expanded_at: state.version,
        }
    }

    pub fn claims(&self) -> &Claims {
        &self.claims
    }

    /// The flat list of grants, after role expansion.
    pub fn grants(&self) -> &[Permission] {
        &self.grants
    }

    /// Whether roles or bindings changed since this principal was expanded (then build it
    /// again from its claims).
    pub fn is_stale(&self, state: &AuthState) -> bool {
        self.expanded_at != state.version
    }

    fn confined(&self, resource: &Resource) -> bool {
        match resource.tenant_name() {
            Some(t) => self.claims.covers_tenant(t),
            None => self.claims.tenant == ALL_TENANTS,
        }
    }

    /// Whether the principal may do `action` on `resource`.
    pub fn allows(&self, action: Action, resource: &Resource) -> bool {
        self.confined(resource) && self.grants.iter().any(|g| g.allows(action, resource))
    }

    /// [`allows`](Self::allows) as a `Result` whose error names only the action.
    pub fn check(&self, action: Action, resource: &Resource) -> Result<(), Denied> {
        if self.allows(action, resource) {
            Ok(())
        } else {
            Err(Denied { action })
        }
    }

    /// Whether the principal holds any grant on `resource` or below it: enough to describe
    /// it or to see it in a list.
    pub fn sees(&self, resource: &Resource) -> bool {
        self.confined(resource) && self.grants.iter().any(|g| g.pattern.touches(resource))
    }
}

/// What role `name` grants to a token of `tenant`.
pub fn role_grants(name: &str, tenant: &str, state: &AuthState) -> Vec<Permission> {
    let everything = |pattern: ResourcePattern| {
        Action::ALL
            .into_iter()
            .map(|a| Permission::new(a, pattern.clone()))
            .collect()
    };
    match name {
        CLUSTER_ADMIN => everything(ResourcePattern::everything()),
        TENANT_ADMIN if tenant == ALL_TENANTS => everything(ResourcePattern::everything()),
        TENANT_ADMIN => everything(ResourcePattern::tenant_wide(tenant)),
        _ => state
            .roles
            .get(name)
            .map(|p| p.iter().cloned().collect())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(tenant: &str, roles: &[&str], allow: &[&str]) -> Claims {
        Claims {
            tenant: tenant.into(),
            sub: "svc".into(),
            exp: 10,
            iat: 1,
            jti: "j".into(),
            namespace: "default".into(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            allow: allow
                .iter()
                .map(|a| Permission::parse(a).unwrap())
                .collect(),
        }
    }

    #[test]
    fn tenant_admin_covers_its_tenant_and_nothing_else() {
        let p = Principal::new(claims("a", &[TENANT_ADMIN], &[]), &AuthState::default());
        let ours = Resource::stream("a", "default", "s");
        let theirs = Resource::stream("b", "default", "s");
        for action in Action::ALL {
            assert!(p.allows(action, &ours));
            assert!(!p.allows(action, &theirs));
        }
        assert!(!p.allows(Action::ClusterManage, &Resource::Cluster));
        assert!(!p.sees(&Resource::tenant("b")));
    }

    #[test]
    fn a_tenant_token_is_confined_to_its_tenant_whatever_it_lists() {
        let p = Principal::new(
            claims("a", &[CLUSTER_ADMIN], &["stream.publish:*"]),
            &AuthState::default(),
        );
        assert!(p.allows(Action::StreamPublish, &Resource::stream("a", "n", "s")));
        assert!(!p.allows(Action::StreamPublish, &Resource::stream("b", "n", "s")));
        assert!(!p.allows(Action::ClusterManage, &Resource::Cluster));
        let admin = Principal::new(
            claims(ALL_TENANTS, &[CLUSTER_ADMIN], &[]),
            &AuthState::default(),
        );
        assert!(admin.allows(Action::ClusterManage, &Resource::Cluster));
        assert!(admin.allows(Action::StreamPublish, &Resource::stream("b", "n", "s")));
    }

    #[test]
    fn a_publish_only_token_cannot_subscribe_and_sees_only_what_it_touches() {
        let p = Principal::new(
            claims("a", &[], &["stream.publish:a/default/orders"]),
            &AuthState::default(),
        );
        let orders = Resource::stream("a", "default", "orders");
        assert!(p.check(Action::StreamPublish, &orders).is_ok());
        assert_eq!(
            p.check(Action::StreamSubscribe, &orders),
            Err(Denied {
                action: Action::StreamSubscribe
            })
        );
        assert!(p.sees(&Resource::namespace("a", "default")));
        assert!(!p.sees(&Resource::stream("a", "default", "payments")));
    }

    #[test]
    fn bound_and_stored_roles_expand_and_a_change_makes_the_principal_stale() {
        let mut state = AuthState::default();
        state.roles.insert(
            "reader".into(),
            [Permission::parse("stream.subscribe:a/*").unwrap()].into(),
        );
        state
            .bindings
            .entry("a".into())
            .or_default()
            .entry("svc".into())
            .or_default()
            .insert("reader".into());
        let p = Principal::new(claims("a", &["deleted-role"], &[]), &state);
        assert!(p.allows(Action::StreamSubscribe, &Resource::stream("a", "n", "s")));
        assert!(!p.allows(Action::StreamPublish, &Resource::stream("a", "n", "s")));
        assert!(!p.is_stale(&state));
        state.version += 1;
        assert!(p.is_stale(&state));
    }
}
