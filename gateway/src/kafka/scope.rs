//! Whose topics a connection sees, and what each of its requests may do.
//!
//! Decides the principal → streams mapping (docs/kafka.md, "Authentication"): with auth off,
//! a topic name means a stream of the listener's tenant and namespace (`default`/`default`);
//! with auth on, of the authenticated token's tenant and its `namespace` claim, so one
//! listener serves every tenant. A cluster-wide token (the bootstrap admin, tenant `*`) maps
//! to the listener's own tenant and namespace. Groups live beside the topics:
//! `tenant/namespace/group`.
//!
//! The invariant: every check is made before any work, through the broker's
//! [`AccessControl`](crate::auth::AccessControl) (so the refusals are the same as over QUIC
//! and counted in `felix_auth_refusals_total`), and answers the Kafka code a client acts on:
//! `TOPIC_AUTHORIZATION_FAILED`, `GROUP_AUTHORIZATION_FAILED` or
//! `CLUSTER_AUTHORIZATION_FAILED` for a missing grant, `SASL_AUTHENTICATION_FAILED` for a
//! token that is no longer live (which the connection's gate normally catches first, closing
//! it: see `connection.rs`).

use std::sync::Arc;

use felix_meta::auth::{ALL_TENANTS, Action, Resource};
use felix_wire::protocol::{ErrorBody, codes};
use kafka_protocol::error::ResponseError;

use super::Kafka;
use crate::auth::Credential;

/// The tenant and namespace a connection's topic and group names live in, and the
/// credential its requests are checked against (`None` with auth off).
#[derive(Debug, Clone)]
pub struct Scope {
    pub tenant: String,
    pub namespace: String,
    pub credential: Option<Arc<Credential>>,
}

/// What a refused check is about: it decides the Kafka code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    Topic,
    Group,
    Cluster,
}

impl Scope {
    /// The listener's own tenant and namespace, no credential: auth off, or before SASL.
    pub fn listener(kafka: &Kafka) -> Scope {
        Scope {
            tenant: kafka.settings.tenant.clone(),
            namespace: kafka.settings.namespace.clone(),
            credential: None,
        }
    }

    /// The scope of an authenticated principal.
    pub fn of(kafka: &Kafka, credential: Arc<Credential>) -> Scope {
        let claims = credential.claims();
        let (tenant, namespace) = if claims.tenant == ALL_TENANTS {
            (
                kafka.settings.tenant.clone(),
                kafka.settings.namespace.clone(),
            )
        } else {
            (claims.tenant.clone(), claims.namespace.clone())
        };
        Scope {
            tenant,
            namespace,
            credential: Some(credential),
        }
    }

    /// The stream (or group) `name` means on this connection.
    pub fn resource(&self, name: &str) -> Resource {
        Resource::stream(&self.tenant, &self.namespace, name)
    }

    /// The key a group is kept under in the coordinator: groups of different tenants and
    /// namespaces never meet, whatever their names.
    pub fn group_key(&self, group: &str) -> String {
        format!("{}/{}/{}", self.tenant, self.namespace, group)
    }

    /// The group name of a key made by [`group_key`](Self::group_key) in this scope.
    pub fn group_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.tenant.as_str())?
            .strip_prefix('/')?
            .strip_prefix(self.namespace.as_str())?
            .strip_prefix('/')
    }

    fn credential(&self) -> Option<&Credential> {
        self.credential.as_deref()
    }

    /// `action` on `name` (a topic or a group), before any work.
    pub fn allow(
        &self,
        kafka: &Kafka,
        action: Action,
        name: &str,
        on: On,
    ) -> Result<(), ResponseError> {
        let access = kafka.broker.access();
        let r = self.resource(name);
        let checked = match action {
            Action::StreamPublish => access.authorize_ingress_publish(self.credential(), &r),
            _ => access.authorize(self.credential(), action, &r),
        };
        checked.map_err(|e| refused(kafka, &e, on))
    }

    /// Whether `action` on `name` is allowed, without counting a refusal: for what is done
    /// only if allowed (auto-creating a topic), never for a request's own check.
    pub fn may(&self, kafka: &Kafka, action: Action, name: &str) -> bool {
        kafka
            .broker
            .access()
            .authorize(self.credential(), action, &self.resource(name))
            .is_ok()
    }

    /// Any grant on `name` (describe), before any work.
    pub fn allow_view(&self, kafka: &Kafka, name: &str, on: On) -> Result<(), ResponseError> {
        let action = match on {
            On::Group => Action::GroupConsume,
            _ => Action::StreamSubscribe,
        };
        kafka
            .broker
            .access()
            .authorize_view(self.credential(), action, &self.resource(name))
            .map_err(|e| refused(kafka, &e, on))
    }

    /// Whether a list shows `name`.
    pub fn can_view(&self, kafka: &Kafka, name: &str) -> bool {
        kafka
            .broker
            .access()
            .can_view(self.credential(), &self.resource(name))
    }

    /// Only a live token (requests tied to no topic or group).
    pub fn allow_any(&self, kafka: &Kafka) -> Result<(), ResponseError> {
        kafka
            .broker
            .access()
            .authorize_any(self.credential())
            .map_err(|e| refused(kafka, &e, On::Cluster))
    }

    /// The token this connection presented, for a publish the shard's owner checks again.
    pub fn token(&self) -> Option<&str> {
        self.credential().map(Credential::token)
    }
}

/// A refusal as the Kafka code for what it is about; counted by its reason.
fn refused(kafka: &Kafka, e: &ErrorBody, on: On) -> ResponseError {
    kafka.broker.metrics().auth_refused(&e.reason);
    if e.code == codes::UNAUTHORIZED {
        return ResponseError::SaslAuthenticationFailed;
    }
    match on {
        On::Topic => ResponseError::TopicAuthorizationFailed,
        On::Group => ResponseError::GroupAuthorizationFailed,
        On::Cluster => ResponseError::ClusterAuthorizationFailed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_keys_round_trip_only_in_their_own_scope() {
        let a = Scope {
            tenant: "a".into(),
            namespace: "n".into(),
            credential: None,
        };
        let ab = Scope {
            tenant: "a".into(),
            namespace: "n2".into(),
            credential: None,
        };
        let key = a.group_key("g/1");
        assert_eq!(a.group_of(&key), Some("g/1"));
        assert_eq!(ab.group_of(&key), None);
        assert_eq!(a.group_of("ab/n/g"), None);
    }
}
