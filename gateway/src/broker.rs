//! The broker: the face the client protocol, the admin API and the Kafka listener call,
//! over the rooms that each own one decision.
//!
//! * [`crate::node`] — what this broker knows of the cluster (registry, lease, peers).
//! * [`crate::shards`] / [`crate::shard`] — the open shards, their logs and read bounds.
//! * [`crate::routing`] — which broker serves a shard, `not_leader`, routing tables.
//! * [`crate::quota`] — the tenants' publish rates, checked before a slot is taken.
//! * [`crate::admission`] — the tenants' publish slots and when a publish is acknowledged.
//! * [`crate::publish`] — the publish pipeline; [`crate::forward`] — forwarding to a leader.
//! * [`crate::fanout`] / [`crate::subscription`] — live delivery; catch-up then live.
//! * [`crate::pull`] — pull reads (the Kafka listener's fetch).
//! * [`crate::streams`] — creating, altering, describing and deleting streams.
//! * [`crate::retention`] — when retention runs and how far it may cut.
//! * [`crate::replication`] — leaders, followers, the quorum mark and the lease.
//! * [`crate::ephemeral`] — ephemeral shards.
//! * [`crate::groups`] — consumer groups: claims, acknowledgements, redelivery, dead letters.
//! * [`crate::cache`] — the cache: keys routed to one owner, TTL, counters, watches.
//!
//! Invariant: every operation is checked against the local registry (the control plane's
//! watch), so an unknown tenant, namespace, stream or shard is refused with a typed error
//! and the data path never waits on Raft; client operations on a shard are served only by
//! the broker that leads it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use felix_cold::cache::ColdCache;
use felix_cold::store::TierStore;
use felix_cold::uploader::TierObserver;
use felix_meta::MetaHandle;
use felix_meta::model::{ShardKey, StreamSettings};
use felix_wire::protocol::{BrokerRoute, ErrorBody, ShardRoute};
use tracing::{info, warn};

use crate::admission::TenantQueues;
use crate::config::BrokerConfig;
use crate::metrics::Metrics;
use crate::node::Node;
use crate::routing::{PartitionRoute, check_leading};
use crate::shard::Shard;
use crate::shards::{Shards, open_durable_shards, watch_deletes, watch_placements};

/// A stream as a pull reader (the Kafka listener) needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamShape {
    pub name: String,
    pub shards: u32,
    pub durable: bool,
    /// 1 at creation, +1 per alter.
    pub version: u64,
}

/// A durable shard's readable range: `[earliest, high_watermark)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardBounds {
    pub earliest: u64,
    pub high_watermark: u64,
}

/// What [`Broker::fetch`] read.
#[derive(Debug, Clone)]
pub struct ShardRead {
    /// Whole stored batches; the first holds the requested offset (and may start before it).
    pub batches: Bytes,
    /// The offset to read next.
    pub next_offset: u64,
    pub earliest: u64,
    pub high_watermark: u64,
}

/// The broker behind the internal routes, set once it has started.
pub type BrokerSlot = Arc<OnceLock<Weak<Broker>>>;

/// The broker's state.
pub struct Broker {
    pub(crate) node: Arc<Node>,
    pub(crate) shards: Arc<Shards>,
    pub(crate) queues: TenantQueues,
    /// Each tenant's publish rate on this broker (`quota`), checked before `queues`.
    pub(crate) quotas: crate::quota::TenantQuotas,
    pub(crate) next_sub_id: AtomicU64,
    /// The data volume's free space and the reserve durable publishes leave.
    pub(crate) disk: Arc<crate::disk::DiskSpace>,
    /// Who may do what (the `auth` setting; everything passes with auth off).
    pub(crate) access: crate::auth::AccessControl,
    /// The group journals of the shards this broker leads (`crate::groups`).
    pub(crate) groups: crate::groups::registry::Groups,
    /// The cache shards this broker owns (`crate::cache`).
    pub(crate) caches: crate::cache::registry::Caches,
}

impl Broker {
    /// Starts the broker's data path on top of a running control-plane node.
    pub async fn start(
        config: &BrokerConfig,
        meta: MetaHandle,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Arc<Broker>> {
        std::fs::create_dir_all(config.data_dir.join("streams"))?;
        // Opening the store does no I/O: a broker whose object store is down still starts
        // and serves every hot tail; the probe below says what is unavailable.
        let tier_store = TierStore::open(&config.store_config())
            .await
            .map_err(|e| anyhow::anyhow!("object store {}: {e}", config.object_store))?;
        // Off only in a benchmark (the setting is refused without fault injection).
        felix_cold::segment::skip_content_digests(config.cold_skip_content_digests);
        let cold_cache = ColdCache::open(tier_store.clone(), config.cache_config())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        tokio::spawn(crate::store_probe::run(tier_store.clone(), metrics.clone()));
        tokio::spawn(crate::metrics::seed_tenants(
            metrics.clone(),
            meta.registry(),
        ));
        let tier_observer: Arc<dyn TierObserver> =
            Arc::new(crate::metrics::TierMetrics::new(metrics.clone()));
        let disk = crate::disk::DiskSpace::new(
            &config.data_dir,
            config.disk_reserve_bytes,
            metrics.disk_free_bytes.clone(),
        )
        .map_err(|e| anyhow::anyhow!("free space of {}: {e}", config.data_dir.display()))?;
        info!(
            reserve_bytes = disk.reserve(),
            "data volume reserve for the control plane"
        );
        tokio::spawn(disk.clone().run());
        let access = crate::auth::AccessControl::new(config.auth, meta.clone());
        let node = Arc::new(Node::new(config, meta, metrics));
        let shards = Arc::new(Shards::new(
            node.clone(),
            tier_store.clone(),
            cold_cache,
            tier_observer,
        ));
        let broker = Arc::new(Broker {
            disk,
            queues: TenantQueues::new(config.pub_queue_depth),
            quotas: crate::quota::TenantQuotas::new(config.quota_limits()?),
            node: node.clone(),
            shards: shards.clone(),
            next_sub_id: AtomicU64::new(1),
            access,
            groups: Default::default(),
            caches: Default::default(),
        });
        // A single node renews too, so the control plane's view of it stays alive.
        let every = Duration::from_millis((config.lease_ms / 4).max(50));
        tokio::spawn(crate::replication::lease::keep_lease(
            node.meta.clone(),
            config.node_id,
            node.lease.clone(),
            every,
        ));
        if node.cluster {
            tokio::spawn(watch_placements(Arc::downgrade(&shards)));
        }
        tokio::spawn(open_durable_shards(Arc::downgrade(&shards)));
        tokio::spawn(watch_deletes(Arc::downgrade(&shards)));
        tokio::spawn(crate::object_deletes::finish_object_deletes(
            Arc::downgrade(&node),
            tier_store,
        ));
        Ok(broker)
    }

    /// The broker's access checks.
    pub fn access(&self) -> &crate::auth::AccessControl {
        &self.access
    }

    /// The object store this broker tiers to.
    pub fn tier_store(&self) -> &TierStore {
        &self.shards.tier_store
    }

    /// The cold-read cache.
    pub fn cold_cache(&self) -> &ColdCache {
        &self.shards.cold_cache
    }

    /// Copies counters kept as plain atomics (cache, object store) into the metrics.
    pub fn refresh_metrics(&self) {
        let m = &self.node.metrics;
        let cache = self.shards.cold_cache.stats();
        Metrics::sync_counter(&m.cold_cache_hits, cache.hits.load(Ordering::Relaxed));
        Metrics::sync_counter(&m.cold_cache_misses, cache.misses.load(Ordering::Relaxed));
        Metrics::sync_counter(&m.hot_read_cache_hits, self.shards.hot_reads.hits());
        Metrics::sync_counter(&m.hot_read_cache_misses, self.shards.hot_reads.misses());
        let store = self.shards.tier_store.stats();
        Metrics::sync_counter(&m.tier_store_gets, store.gets);
        Metrics::sync_counter(&m.tier_store_get_bytes, store.get_bytes);
        Metrics::sync_counter(&m.tier_store_puts, store.puts);
        m.cold_read.refresh(self.shards.cold_cache.read_ahead());
        m.lease_remaining
            .set(self.node.lease.remaining().as_secs_f64());
    }

    /// Ready to serve: the control plane has a leader and the registry is loaded.
    pub fn is_ready(&self) -> bool {
        !self.node.stopping.load(Ordering::Acquire) && self.node.meta.is_ready()
    }

    /// Connections each listener holds at once (`max_connections`).
    pub fn max_connections(&self) -> usize {
        self.node.config.max_connections
    }

    /// The metrics this broker reports into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.node.metrics
    }

    /// `subscriber_egress_max_bytes`: what one connection's subscriptions may hold between
    /// their queues and QUIC, split equally among them.
    pub fn subscriber_egress_max_bytes(&self) -> usize {
        self.node.config.subscriber_egress_max_bytes
    }

    /// The largest frame a client may send.
    pub fn max_frame_bytes(&self) -> usize {
        self.node.config.max_frame_bytes
    }

    /// The broker's id.
    pub fn broker_id(&self) -> u64 {
        self.node.config.node_id
    }

    /// Tenants and their namespaces, from the local registry.
    pub fn tenants(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.node.registry.borrow().tenants.clone()
    }

    /// A shard this broker serves clients for: opened on first use; in a cluster, only a
    /// shard it leads.
    pub(crate) fn shard(&self, key: &ShardKey) -> Result<(Arc<Shard>, StreamSettings), ErrorBody> {
        // A shard placed only on other brokers is not opened here for a client on a stale
        // route: that would bring back the files of a replica moved away (`Shards`).
        if self.node.cluster && self.shards.get(key).is_none() {
            let placed = self.node.registry.borrow().placements.get(key).cloned();
            if let Some(p) = placed
                && !crate::shards::names(&p, self.node.config.node_id)
            {
                return Err(crate::routing::not_leader(&self.node, key, p.leader));
            }
        }
        let (s, settings) = self.shards.open(key)?;
        check_leading(&self.node, &s)?;
        Ok((s, settings))
    }

    /// A shard's local state by key, whatever this broker's role for it (the replication
    /// endpoint).
    pub(crate) fn open_replica(&self, key: &ShardKey) -> Result<Arc<Shard>, ErrorBody> {
        self.shards.open(key).map(|(s, _)| s)
    }

    /// Whether this node is one broker of a cluster.
    pub fn is_cluster(&self) -> bool {
        self.node.cluster
    }

    /// Who leads each shard of a stream, and the cluster's brokers: a cluster client's
    /// routing table. On a single node, this node leads every shard.
    pub fn topology(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(Vec<ShardRoute>, Vec<BrokerRoute>), ErrorBody> {
        crate::routing::topology(&self.node, tenant, namespace, name)
    }

    /// In a cluster, each shard's leader, generation, replicas and the replicas known to
    /// hold everything committed (Kafka's ISR); `None` on a single node.
    pub fn partition_routes(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        shards: u32,
    ) -> Option<Vec<PartitionRoute>> {
        crate::routing::partition_routes(&self.node, tenant, namespace, name, shards)
    }

    /// In a cluster, every registered broker's id, Kafka address and liveness; `None` on a
    /// single node.
    pub fn kafka_brokers(&self) -> Option<Vec<(u64, Option<String>, bool)>> {
        crate::routing::kafka_brokers(&self.node)
    }

    /// Stops accepting publishes, ends subscriptions and flushes every durable shard.
    pub async fn shutdown(&self) {
        self.node.stopping.store(true, Ordering::Release);
        let shards = self.shards.drain();
        for s in &shards {
            s.close();
            if let Some(log) = &s.log
                && let Err(e) = log.sync().await
            {
                warn!(shard = %s.key, error = %e, "final flush failed");
            }
        }
        self.close_groups().await;
    }
}
