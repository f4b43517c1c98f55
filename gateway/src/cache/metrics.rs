//! The cache metrics (docs/cache.md, charted in deploy/grafana/felix.json): operations by
//! kind and result, entries and bytes per cache shard this broker owns, expiries,
//! evictions and compaction runs.
//!
//! Decides what `result` says: `ok` when the operation was answered with success (a get of
//! an absent key included), otherwise the error's reason (`version_conflict`,
//! `value_too_large`, `not_leader`, ...), so a dashboard tells refusals from failures.

use felix_meta::model::ShardKey;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpResult {
    pub op: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabel {
    pub tenant: String,
    pub namespace: String,
    pub cache: String,
}

impl CacheLabel {
    fn of(key: &ShardKey, cache: &str) -> CacheLabel {
        CacheLabel {
            tenant: key.tenant.clone(),
            namespace: key.namespace.clone(),
            cache: cache.to_owned(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheShardLabel {
    pub tenant: String,
    pub namespace: String,
    pub cache: String,
    pub shard: String,
}

impl CacheShardLabel {
    pub(crate) fn of(key: &ShardKey, cache: &str) -> CacheShardLabel {
        CacheShardLabel {
            tenant: key.tenant.clone(),
            namespace: key.namespace.clone(),
            cache: cache.to_owned(),
            shard: key.shard.to_string(),
        }
    }
}

/// The cache metrics.
#[derive(Default)]
pub struct CacheMetrics {
    pub cache_operations: Family<OpResult, Counter>,
    pub cache_entries: Family<CacheShardLabel, Gauge>,
    pub cache_bytes: Family<CacheShardLabel, Gauge>,
    pub cache_log_bytes: Family<CacheShardLabel, Gauge>,
    pub cache_expired: Family<CacheLabel, Counter>,
    pub cache_evicted: Family<CacheLabel, Counter>,
    pub cache_compactions: Family<CacheLabel, Counter>,
    pub cache_forwarded: Counter,
    /// The `ok` series of each of [`OPERATIONS`], in its order, taken from the family once
    /// at registration: every cache request counts one, and the family's look-up builds two
    /// label strings and hashes them each time.
    ok: std::sync::OnceLock<Vec<Counter>>,
}

/// Every operation a client can ask of a cache, as [`felix_wire::cache::CacheRequest::kind`]
/// names it: each has an `ok` series from start-up, so its first one shows in `increase()`.
const OPERATIONS: [&str; 12] = [
    "create",
    "describe",
    "list",
    "drop",
    "put",
    "put_if",
    "get",
    "delete",
    "delete_if",
    "counter_add",
    "counter_get",
    "watch",
];

impl CacheMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        let ok = OPERATIONS.map(|op| {
            self.cache_operations
                .get_or_create(&OpResult {
                    op: op.to_owned(),
                    result: "ok".to_owned(),
                })
                .clone()
        });
        let _ = self.ok.set(ok.to_vec());
        registry.register(
            "felix_cache_operations",
            "Cache operations this broker answered to a client, by kind and result (ok, or the \
             error's reason)",
            self.cache_operations.clone(),
        );
        registry.register(
            "felix_cache_entries",
            "Entries held by the cache shards this broker owns (expired ones until removed)",
            self.cache_entries.clone(),
        );
        registry.register(
            "felix_cache_bytes",
            "Bytes of keys and values held by the cache shards this broker owns",
            self.cache_bytes.clone(),
        );
        registry.register(
            "felix_cache_log_bytes",
            "On-disk bytes of the logs of the log-backed cache shards this broker owns",
            self.cache_log_bytes.clone(),
        );
        registry.register(
            "felix_cache_expired",
            "Cache entries deleted because their TTL passed",
            self.cache_expired.clone(),
        );
        registry.register(
            "felix_cache_evicted",
            "In-memory cache entries evicted under kv_memory_bytes",
            self.cache_evicted.clone(),
        );
        registry.register(
            "felix_cache_compactions",
            "Compaction runs of log-backed cache shards",
            self.cache_compactions.clone(),
        );
        registry.register(
            "felix_cache_forwarded",
            "Cache operations forwarded to the key's owner",
            self.cache_forwarded.clone(),
        );
    }

    pub(crate) fn operation(&self, op: &str, result: &str) {
        if result == "ok"
            && let Some(ok) = self.ok.get()
            && let Some(i) = OPERATIONS.iter().position(|o| *o == op)
        {
            // The same counter as the family's series (a clone shares its value).
            ok[i].inc();
            return;
        }
        self.cache_operations
            .get_or_create(&OpResult {
                op: op.to_owned(),
                result: result.to_owned(),
            })
            .inc();
    }

    /// The per-cache counters of a shard opened here, at 0 until their first event.
    pub(crate) fn seed_cache(&self, key: &ShardKey, cache: &str) {
        let label = CacheLabel::of(key, cache);
        let _ = self.cache_expired.get_or_create(&label);
        let _ = self.cache_evicted.get_or_create(&label);
        let _ = self.cache_compactions.get_or_create(&label);
    }

    pub(crate) fn expired(&self, key: &ShardKey, cache: &str, n: u64) {
        self.cache_expired
            .get_or_create(&CacheLabel::of(key, cache))
            .inc_by(n);
    }

    pub(crate) fn evicted(&self, key: &ShardKey, cache: &str, n: u64) {
        self.cache_evicted
            .get_or_create(&CacheLabel::of(key, cache))
            .inc_by(n);
    }

    pub(crate) fn compacted(&self, key: &ShardKey, cache: &str) {
        self.cache_compactions
            .get_or_create(&CacheLabel::of(key, cache))
            .inc();
    }
}
