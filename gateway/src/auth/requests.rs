//! Which check each QUIC request needs, decided from the request alone, before any work.
//!
//! Decides the mapping from a request to an action and a resource: managing a tenant,
//! namespace or stream needs `*.manage` on it; publishing `stream.publish` and subscribing
//! `stream.subscribe` on the stream; describing, listing, a stream's topology and its
//! segments any grant on the resource (a publisher needs the topology to route); a producer
//! id only a live token. The token and rbac requests check themselves (`manage.rs`). The
//! invariant: every request kind is listed here — the `match` has no catch-all, so a new
//! request cannot be added without deciding its check.

use felix_meta::auth::{Action, Resource};
use felix_wire::cache::CacheRequest;
use felix_wire::groups::GroupRequest;
use felix_wire::protocol::{ErrorBody, Request};

use super::access::{AccessControl, Credential};

/// What a request must be allowed before it is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Checked elsewhere (hello and authenticate present tokens; the token and rbac
    /// requests check in `manage.rs`).
    Own,
    /// A live token, whatever it grants.
    Authenticated,
    /// The action on the resource.
    Action(Action, Resource),
    /// Any grant on the resource or below it (describe, list); the action names the
    /// refusal.
    View(Action, Resource),
}

impl Check {
    /// Runs the check for `credential` (`None`: no token presented).
    pub fn run(
        &self,
        access: &AccessControl,
        credential: Option<&Credential>,
    ) -> Result<(), ErrorBody> {
        match self {
            Check::Own => Ok(()),
            Check::Authenticated => access.authorize_any(credential),
            Check::Action(Action::StreamPublish, r) => {
                access.authorize_ingress_publish(credential, r)
            }
            Check::Action(a, r) => access.authorize(credential, *a, r),
            Check::View(a, r) => access.authorize_view(credential, *a, r),
        }
    }
}

/// The check `request` needs.
pub fn check_for(request: &Request) -> Check {
    use Request as R;
    let stream = Resource::stream;
    match request {
        R::Hello { .. }
        | R::Authenticate { .. }
        | R::MintToken { .. }
        | R::RevokeToken { .. }
        | R::PutRole { .. }
        | R::ListRoles {}
        | R::DeleteRole { .. }
        | R::BindRole { .. }
        | R::RotateKey {}
        | R::PutOidcIssuer { .. }
        | R::ListOidcIssuers {}
        | R::DeleteOidcIssuer { .. }
        | R::ExchangeOidcToken { .. } => Check::Own,
        R::CreateTenant { name } => Check::Action(Action::TenantManage, Resource::tenant(name)),
        R::CreateNamespace { tenant, name } => {
            Check::Action(Action::NamespaceManage, Resource::namespace(tenant, name))
        }
        R::CreateStream {
            tenant,
            namespace,
            name,
            ..
        }
        | R::AlterStream {
            tenant,
            namespace,
            name,
            ..
        }
        | R::DeleteStream {
            tenant,
            namespace,
            name,
        } => Check::Action(Action::StreamManage, stream(tenant, namespace, name)),
        R::DescribeStream {
            tenant,
            namespace,
            name,
        } => Check::View(Action::StreamManage, stream(tenant, namespace, name)),
        R::ListStreams { tenant, namespace } => {
            Check::View(Action::StreamManage, Resource::namespace(tenant, namespace))
        }
        R::Publish {
            tenant,
            namespace,
            stream: name,
            ..
        } => Check::Action(Action::StreamPublish, stream(tenant, namespace, name)),
        R::Subscribe {
            tenant,
            namespace,
            stream: name,
            ..
        } => Check::Action(Action::StreamSubscribe, stream(tenant, namespace, name)),
        // A cache's routing table (a client routes a key to its owner) needs a permission on
        // the cache, not on the stream that holds it.
        R::Topology {
            tenant,
            namespace,
            stream: name,
        } if crate::cache::names::is_cache_stream(name) => Check::View(
            Action::CacheRead,
            stream(
                tenant,
                namespace,
                crate::cache::names::cache_of_stream(name).unwrap_or_default(),
            ),
        ),
        R::ListSegments {
            tenant,
            namespace,
            stream: name,
        }
        | R::Topology {
            tenant,
            namespace,
            stream: name,
        } => Check::View(Action::StreamSubscribe, stream(tenant, namespace, name)),
        R::PublishIf {
            tenant,
            namespace,
            stream: name,
            ..
        } => Check::Action(Action::StreamPublish, stream(tenant, namespace, name)),
        R::ProducerInit {} => Check::Authenticated,
        R::Group(g) => group_check(g),
        R::Cluster(_) => Check::Action(Action::ClusterManage, Resource::Cluster),
        R::Cache(c) => cache_check(c),
    }
}

/// A cache's operations need `cache.read` or `cache.write` on the cache; creating and
/// dropping it `cache.manage`, and describing or listing any cache permission there.
fn cache_check(c: &CacheRequest) -> Check {
    let (tenant, namespace, name) = c.cache();
    match c {
        CacheRequest::List { .. } => {
            Check::View(Action::CacheManage, Resource::namespace(tenant, namespace))
        }
        CacheRequest::Describe { .. } => Check::View(
            Action::CacheManage,
            Resource::stream(tenant, namespace, name),
        ),
        _ => Check::Action(
            crate::cache::permissions::action_of(c),
            Resource::stream(tenant, namespace, name),
        ),
    }
}

/// Consuming (poll, ack, nack, extend, commit) needs `group.consume` on the group's stream;
/// creating, altering and deleting a group `stream.manage`; describing and listing any grant on the stream.
fn group_check(g: &GroupRequest) -> Check {
    let (tenant, namespace, name) = g.stream();
    let on = Resource::stream(tenant, namespace, name);
    match g {
        GroupRequest::Create { .. } | GroupRequest::Alter { .. } | GroupRequest::Delete { .. } => {
            Check::Action(Action::StreamManage, on)
        }
        GroupRequest::Describe { .. } | GroupRequest::List { .. } => {
            Check::View(Action::GroupConsume, on)
        }
        GroupRequest::Poll { .. }
        | GroupRequest::Ack { .. }
        | GroupRequest::Nack { .. }
        | GroupRequest::Extend { .. }
        | GroupRequest::Commit { .. } => Check::Action(Action::GroupConsume, on),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_subscribe_and_manage_map_to_their_actions_on_the_stream() {
        let publish = Request::Publish {
            tenant: "a".into(),
            namespace: "n".into(),
            stream: "s".into(),
            shard: 0,
            ack: Default::default(),
        };
        assert_eq!(
            check_for(&publish),
            Check::Action(Action::StreamPublish, Resource::stream("a", "n", "s"))
        );
        let delete = Request::DeleteStream {
            tenant: "a".into(),
            namespace: "n".into(),
            name: "s".into(),
        };
        assert_eq!(
            check_for(&delete),
            Check::Action(Action::StreamManage, Resource::stream("a", "n", "s"))
        );
        let list = Request::ListStreams {
            tenant: "a".into(),
            namespace: "n".into(),
        };
        assert!(matches!(check_for(&list), Check::View(_, _)));
    }

    #[test]
    fn cache_operations_need_cache_read_write_or_manage_on_the_cache() {
        use felix_wire::cache::CacheRequest as C;
        let on = Resource::stream("a", "n", "c");
        let (t, n, c, k) = (
            || "a".to_owned(),
            || "n".to_owned(),
            || "c".to_owned(),
            || "k".to_owned(),
        );
        let cases = [
            (
                C::Get {
                    tenant: t(),
                    namespace: n(),
                    cache: c(),
                    key: k(),
                },
                Action::CacheRead,
            ),
            (
                C::CounterGet {
                    tenant: t(),
                    namespace: n(),
                    cache: c(),
                    key: k(),
                },
                Action::CacheRead,
            ),
            (
                C::Watch {
                    tenant: t(),
                    namespace: n(),
                    cache: c(),
                    key: Some(k()),
                    prefix: None,
                    shard: None,
                    resume: None,
                },
                Action::CacheRead,
            ),
            (
                C::Put {
                    tenant: t(),
                    namespace: n(),
                    cache: c(),
                    key: k(),
                    ttl_ms: None,
                    condition: None,
                },
                Action::CacheWrite,
            ),
            (
                C::Delete {
                    tenant: t(),
                    namespace: n(),
                    cache: c(),
                    key: k(),
                    condition: None,
                },
                Action::CacheWrite,
            ),
            (
                C::CounterAdd {
                    tenant: t(),
                    namespace: n(),
                    cache: c(),
                    key: k(),
                    delta: 1,
                },
                Action::CacheWrite,
            ),
            (
                C::Create {
                    tenant: t(),
                    namespace: n(),
                    name: c(),
                    config: Default::default(),
                },
                Action::CacheManage,
            ),
            (
                C::Drop {
                    tenant: t(),
                    namespace: n(),
                    name: c(),
                },
                Action::CacheManage,
            ),
        ];
        for (request, action) in cases {
            assert_eq!(
                check_for(&Request::Cache(request.clone())),
                Check::Action(action, on.clone()),
                "{request:?}"
            );
        }
    }
}
