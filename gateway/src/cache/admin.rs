//! Creating, describing, listing and dropping caches: through the control plane, as the
//! stream that holds each cache (see the module doc of `cache`).
//!
//! Decides a cache's settings from the request and the broker's defaults: in memory unless
//! `durable`; Leader unless `quorum` (which needs `durable`: an in-memory cache has no
//! replicas to hold a majority); one shard; three replicas in a cluster (fewer if it is
//! smaller), one on a single node. The stream is never tiered and keeps no retention:
//! compaction alone decides what leaves a log-backed cache's disk.

use felix_meta::model::{Command, Consistency, Durability, StreamSettings};
use felix_wire::cache::{CacheConfig, CacheInfo};
use felix_wire::protocol::{ErrorBody, codes};

use super::segments::CACHE_SEGMENT_BYTES;
use super::{CACHE_STREAM_PREFIX, backing_stream, is_cache_stream, unknown_cache};
use crate::broker::Broker;
use crate::errors::err;
use crate::node::require_namespace;

/// Longest cache name: the stream that holds it is a name of at most 128 characters.
pub const MAX_CACHE_NAME: usize = felix_meta::model::MAX_NAME_LEN - CACHE_STREAM_PREFIX.len();

fn invalid(message: String) -> ErrorBody {
    err(codes::INVALID_ARGUMENT, "invalid_argument", message)
}

/// Says "cache" where the control plane said "stream `__cache.<name>`".
fn as_cache_error(e: ErrorBody, tenant: &str, namespace: &str, name: &str) -> ErrorBody {
    if e.code == codes::UNKNOWN_STREAM {
        return unknown_cache(tenant, namespace, name);
    }
    let mut e = e;
    e.message = e
        .message
        .replace(
            &format!("stream {}", backing_stream(name)),
            &format!("cache {name}"),
        )
        .replace(&backing_stream(name), name);
    e
}

fn info(tenant: &str, namespace: &str, name: &str, s: &StreamSettings) -> CacheInfo {
    CacheInfo {
        tenant: tenant.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        durable: s.durability == Durability::Durable,
        consistency: match s.consistency {
            Consistency::Leader => "leader",
            Consistency::Quorum => "quorum",
        }
        .to_owned(),
        shards: s.shards,
        replicas: s.replicas,
    }
}

impl Broker {
    pub(crate) async fn create_cache(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        config: &CacheConfig,
    ) -> Result<CacheInfo, ErrorBody> {
        if name.len() > MAX_CACHE_NAME {
            return Err(invalid(format!(
                "cache name {name:?} is longer than {MAX_CACHE_NAME} characters"
            )));
        }
        let durable = config.durable.unwrap_or(false);
        let consistency = match config.consistency.as_deref() {
            None | Some("leader") => Consistency::Leader,
            Some("quorum") => Consistency::Quorum,
            Some(other) => {
                return Err(invalid(format!(
                    "consistency {other:?} is not leader or quorum"
                )));
            }
        };
        if consistency == Consistency::Quorum && !durable {
            return Err(invalid(
                "a Quorum cache must be log-backed (durable): an in-memory cache has no replicas \
                 to hold a majority"
                    .into(),
            ));
        }
        let shards = config.shards.unwrap_or(1);
        let replicas = config
            .replicas
            .unwrap_or(self.node.config.cluster.len().clamp(1, 3) as u32);
        if shards == 0 || replicas == 0 {
            return Err(invalid(
                "a cache needs at least one shard and one replica".into(),
            ));
        }
        let settings = StreamSettings {
            durability: if durable {
                Durability::Durable
            } else {
                Durability::Ephemeral
            },
            consistency,
            replicas,
            shards,
            segment_bytes: CACHE_SEGMENT_BYTES,
            segment_ms: StreamSettings::default().segment_ms,
            retention_ms: None,
            retention_bytes: None,
            hot_retention_ms: None,
            hot_retention_bytes: None,
            tiered: false,
        };
        self.node
            .propose(Command::CreateStream {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                name: backing_stream(name),
                settings,
            })
            .await
            .map_err(|e| as_cache_error(e, tenant, namespace, name))?;
        self.describe_cache(tenant, namespace, name)
    }

    pub(crate) fn describe_cache(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<CacheInfo, ErrorBody> {
        let (_, settings) = self
            .node
            .stream_settings(tenant, namespace, &backing_stream(name))
            .map_err(|e| as_cache_error(e, tenant, namespace, name))?;
        Ok(info(tenant, namespace, name, &settings))
    }

    pub(crate) fn list_caches(
        &self,
        tenant: &str,
        namespace: &str,
    ) -> Result<Vec<CacheInfo>, ErrorBody> {
        let reg = self.node.registry.borrow();
        require_namespace(&reg, tenant, namespace)?;
        let mut caches: Vec<CacheInfo> = reg
            .streams
            .values()
            .filter(|s| s.tenant == tenant && s.namespace == namespace && is_cache_stream(&s.name))
            .map(|s| {
                info(
                    tenant,
                    namespace,
                    &s.name[CACHE_STREAM_PREFIX.len()..],
                    &s.settings,
                )
            })
            .collect();
        caches.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(caches)
    }

    /// Drops a cache and every entry in it (a log-backed cache's files too).
    pub(crate) async fn drop_cache(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), ErrorBody> {
        self.describe_cache(tenant, namespace, name)?;
        self.delete_stream(tenant, namespace, &backing_stream(name))
            .await
            .map_err(|e| as_cache_error(e, tenant, namespace, name))?;
        let stream = backing_stream(name);
        let dropped: Vec<_> = {
            let mut open = self.caches.open.lock();
            let keys: Vec<_> = open
                .keys()
                .filter(|k| k.tenant == tenant && k.namespace == namespace && k.stream == stream)
                .cloned()
                .collect();
            keys.iter().filter_map(|k| open.remove(k)).collect()
        };
        // An in-memory cache's bytes go back to the broker's budget.
        for c in &dropped {
            self.forget_memory(c);
        }
        Ok(())
    }
}
