//! The broker's Prometheus metrics. Names are `felix_<area>_<thing>_{total,seconds,bytes}`,
//! as the spec uses them (`felix_sub_queue_dropped_total`,
//! `felix_tenant_publish_queue_full_total`, `felix_broker_acked_publishes_dropped_total`).
//! Each is documented in docs/operations.md.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::corruption::TierLabel;

pub mod cold_read;
pub mod kafka;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    pub listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantReason {
    pub tenant: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// The reasons an authorization refusal can have (seeded at 0).
pub const AUTH_REFUSAL_REASONS: [&str; 5] = [
    "missing_token",
    "invalid_token",
    "token_expired",
    "token_revoked",
    "forbidden",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantAction {
    pub tenant: String,
    pub action: String,
}

/// Every metric the broker exports.
pub struct Metrics {
    registry: Registry,
    pub publish_requests: Family<TenantLabel, Counter>,
    pub publish_records: Family<TenantLabel, Counter>,
    pub publish_bytes: Family<TenantLabel, Counter>,
    pub publish_errors: Family<TenantReason, Counter>,
    pub publish_queue_full: Family<TenantAction, Counter>,
    /// Publishes held back by their tenant's publish quota, by action (`QUOTA_ACTIONS`).
    pub quota_throttled: Family<TenantAction, Counter>,
    pub sub_queue_dropped: Family<TenantLabel, Counter>,
    pub sub_delivered_records: Family<TenantLabel, Counter>,
    pub sub_lagged: Family<TenantLabel, Counter>,
    pub subscriptions_active: Gauge,
    pub connections_active: Gauge,
    pub acked_publishes_dropped: Counter,
    /// How long this broker's shard-leader lease still holds (cluster mode), at the scrape.
    pub lease_remaining: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub quorum_timeouts: Counter,
    pub publishes_forwarded: Counter,
    pub frames_rejected: Counter,
    /// Connections closed at accept because the listener held `max_connections`.
    pub connections_refused: Family<ListenerLabel, Counter>,
    /// Requests refused by authorization (auth on), by reason.
    pub auth_refusals: Family<ReasonLabel, Counter>,
    /// Kafka request bytes being received or handled now.
    pub kafka_inflight_request_bytes: Gauge,
    /// Kafka connections closed because a request's bytes did not arrive in time.
    pub kafka_slow_requests: Counter,
    /// The Kafka listener's requests, bytes, connections and group lag.
    pub kafka: kafka::KafkaMetrics,
    /// Free bytes of the data volume, sampled every 250 ms.
    pub disk_free_bytes: Gauge,
    /// Stored data that failed its checks, by tier ([`crate::corruption::DETECTED`]).
    pub corruption_detected: Family<TierLabel, Counter>,
    pub tier_store_up: Gauge,
    pub tier_upload_backlog_segments: Gauge,
    pub tier_upload_backlog_bytes: Gauge,
    pub tier_upload_errors: Counter,
    pub tier_uploaded_objects: Counter,
    pub tier_uploaded_bytes: Counter,
    pub tier_upload_lag: Histogram,
    pub cold_cache_hits: Counter,
    pub cold_cache_misses: Counter,
    pub hot_read_cache_hits: Counter,
    pub hot_read_cache_misses: Counter,
    pub tier_store_gets: Counter,
    pub tier_store_get_bytes: Counter,
    pub tier_store_puts: Counter,
    /// Consumer groups (`groups/metrics.rs`).
    pub groups: crate::groups::metrics::GroupMetrics,
    /// Shard moves (`moves/metrics.rs`).
    pub moves: crate::moves::metrics::MoveMetrics,
    /// Cold read-ahead (`metrics/cold_read.rs`).
    pub cold_read: cold_read::ColdReadMetrics,
    /// The cache (`cache/metrics.rs`).
    pub cache: crate::cache::metrics::CacheMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            publish_requests: Family::default(),
            publish_records: Family::default(),
            publish_bytes: Family::default(),
            publish_errors: Family::default(),
            publish_queue_full: Family::default(),
            quota_throttled: Family::default(),
            sub_queue_dropped: Family::default(),
            sub_delivered_records: Family::default(),
            sub_lagged: Family::default(),
            subscriptions_active: Gauge::default(),
            connections_active: Gauge::default(),
            acked_publishes_dropped: Counter::default(),
            lease_remaining: Gauge::default(),
            quorum_timeouts: Counter::default(),
            publishes_forwarded: Counter::default(),
            frames_rejected: Counter::default(),
            connections_refused: Family::default(),
            auth_refusals: Family::default(),
            kafka_inflight_request_bytes: Gauge::default(),
            kafka_slow_requests: Counter::default(),
            kafka: kafka::KafkaMetrics::new(),
            disk_free_bytes: Gauge::default(),
            corruption_detected: crate::corruption::DETECTED.clone(),
            tier_store_up: Gauge::default(),
            tier_upload_backlog_segments: Gauge::default(),
            tier_upload_backlog_bytes: Gauge::default(),
            tier_upload_errors: Counter::default(),
            tier_uploaded_objects: Counter::default(),
            tier_uploaded_bytes: Counter::default(),
            tier_upload_lag: Histogram::new([
                0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
            cold_cache_hits: Counter::default(),
            cold_cache_misses: Counter::default(),
            hot_read_cache_hits: Counter::default(),
            hot_read_cache_misses: Counter::default(),
            tier_store_gets: Counter::default(),
            tier_store_get_bytes: Counter::default(),
            tier_store_puts: Counter::default(),
            groups: Default::default(),
            moves: Default::default(),
            cold_read: Default::default(),
            cache: Default::default(),
            registry: Registry::default(),
        };
        // prometheus-client appends `_total` to counters.
        registry.register(
            "felix_publish_requests",
            "Publish requests received",
            m.publish_requests.clone(),
        );
        registry.register(
            "felix_publish_records",
            "Records accepted for publishing",
            m.publish_records.clone(),
        );
        registry.register(
            "felix_publish_bytes",
            "Record-batch bytes accepted for publishing",
            m.publish_bytes.clone(),
        );
        registry.register(
            "felix_publish_errors",
            "Publish requests refused, by reason",
            m.publish_errors.clone(),
        );
        registry.register(
            "felix_tenant_publish_queue_full",
            "Publishes that found the tenant's publish queue full, by action (rejected, waited, shed)",
            m.publish_queue_full.clone(),
        );
        registry.register(
            "felix_tenant_quota_throttled",
            "Publishes over their tenant's publish quota, by action (refused, shed, kafka_throttled)",
            m.quota_throttled.clone(),
        );
        registry.register(
            "felix_sub_queue_dropped",
            "Events dropped because a subscriber's queue was full",
            m.sub_queue_dropped.clone(),
        );
        registry.register(
            "felix_sub_delivered_records",
            "Records delivered to subscribers",
            m.sub_delivered_records.clone(),
        );
        registry.register(
            "felix_sub_lagged",
            "Durable subscriptions ended with subscription_lagged",
            m.sub_lagged.clone(),
        );
        registry.register(
            "felix_subscriptions_active",
            "Open subscriptions",
            m.subscriptions_active.clone(),
        );
        registry.register(
            "felix_connections_active",
            "Open client connections",
            m.connections_active.clone(),
        );
        registry.register(
            "felix_broker_acked_publishes_dropped",
            "Publishes acknowledged on enqueue whose write then failed",
            m.acked_publishes_dropped.clone(),
        );
        registry.register(
            "felix_broker_lease_remaining_seconds",
            "How long this broker's shard-leader lease still holds without a renewal",
            m.lease_remaining.clone(),
        );
        registry.register(
            "felix_publish_quorum_timeouts",
            "Quorum publishes answered quorum_timeout (no majority confirmed in time)",
            m.quorum_timeouts.clone(),
        );
        registry.register(
            "felix_publishes_forwarded",
            "Publishes forwarded to the broker that leads their shard",
            m.publishes_forwarded.clone(),
        );
        registry.register(
            "felix_frames_rejected",
            "Frames refused as malformed or oversized",
            m.frames_rejected.clone(),
        );
        registry.register(
            "felix_tier_store_up",
            "1 when the object store answered the last probe, else 0",
            m.tier_store_up.clone(),
        );
        registry.register(
            "felix_tier_upload_backlog_segments",
            "Sealed segments not yet covered by uploaded objects",
            m.tier_upload_backlog_segments.clone(),
        );
        registry.register(
            "felix_tier_upload_backlog_bytes",
            "Bytes of sealed segments not yet covered by uploaded objects",
            m.tier_upload_backlog_bytes.clone(),
        );
        registry.register(
            "felix_tier_upload_errors",
            "Failed upload attempts (each is retried)",
            m.tier_upload_errors.clone(),
        );
        registry.register(
            "felix_tier_uploaded_objects",
            "Objects uploaded and recorded in the manifest",
            m.tier_uploaded_objects.clone(),
        );
        registry.register(
            "felix_tier_uploaded_bytes",
            "Bytes of objects uploaded and recorded",
            m.tier_uploaded_bytes.clone(),
        );
        registry.register(
            "felix_tier_upload_lag_seconds",
            "Time from a segment's seal to its object's manifest record",
            m.tier_upload_lag.clone(),
        );
        registry.register(
            "felix_cold_cache_hits",
            "Cold footer and row-group lookups served from the cache",
            m.cold_cache_hits.clone(),
        );
        registry.register(
            "felix_cold_cache_misses",
            "Cold footer and row-group lookups that needed a GET",
            m.cold_cache_misses.clone(),
        );
        registry.register(
            "felix_hot_read_cache_hits",
            "History blocks served to a catching-up subscriber from the shared hot read cache",
            m.hot_read_cache_hits.clone(),
        );
        registry.register(
            "felix_hot_read_cache_misses",
            "History blocks a catching-up subscriber read from the log's files",
            m.hot_read_cache_misses.clone(),
        );
        registry.register(
            "felix_tier_store_get_requests",
            "GET requests made to the object store",
            m.tier_store_gets.clone(),
        );
        registry.register(
            "felix_tier_store_get_bytes",
            "Bytes fetched from the object store",
            m.tier_store_get_bytes.clone(),
        );
        registry.register(
            "felix_tier_store_put_requests",
            "PUT requests (and multipart parts) made to the object store",
            m.tier_store_puts.clone(),
        );
        registry.register(
            "felix_connections_refused",
            "Connections closed at accept because the listener held max_connections",
            m.connections_refused.clone(),
        );
        registry.register(
            "felix_auth_refusals",
            "Requests refused by authorization (auth on), by reason: missing_token, \
             invalid_token, token_expired, token_revoked, forbidden, and on the Kafka \
             listener invalid_sasl, sasl_state, principal_changed",
            m.auth_refusals.clone(),
        );
        registry.register(
            "felix_kafka_inflight_request_bytes",
            "Kafka request bytes being received or handled now (max_inflight_request_bytes)",
            m.kafka_inflight_request_bytes.clone(),
        );
        registry.register(
            "felix_kafka_slow_requests",
            "Kafka connections closed because a request's bytes did not arrive within 30 s",
            m.kafka_slow_requests.clone(),
        );
        m.kafka.register(&mut registry);
        registry.register(
            "felix_disk_free_bytes",
            "Free bytes of the data volume (publishes stop at disk_reserve_bytes)",
            m.disk_free_bytes.clone(),
        );
        registry.register(
            "felix_corruption_detected",
            "Reads and opens refused because stored data failed its checks, by tier (hot, cold)",
            m.corruption_detected.clone(),
        );
        // Series whose label values are known from the start exist from the start, at 0, so
        // the first event of each kind shows in `increase()` (a series that appears with its
        // first event at 1 is invisible to it).
        m.groups.register(&mut registry);
        m.moves.register(&mut registry);
        m.cold_read.register(&mut registry);
        m.cache.register(&mut registry);
        for listener in ["quic", "kafka"] {
            let _ = m.connections_refused.get_or_create(&ListenerLabel {
                listener: listener.to_owned(),
            });
        }
        // The OIDC exchange's reasons too (docs/security.md): a refused exchange counts here.
        let oidc = felix_meta::auth::OidcError::REASONS;
        for reason in AUTH_REFUSAL_REASONS.into_iter().chain(oidc) {
            let _ = m.auth_refusals.get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            });
        }
        for tier in ["hot", "cold"] {
            let _ = m.corruption_detected.get_or_create(&TierLabel {
                tier: tier.to_owned(),
            });
        }
        Metrics { registry, ..m }
    }

    /// Counts one authorization refusal.
    pub fn auth_refused(&self, reason: &str) {
        self.auth_refusals
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Creates a tenant's series at 0 in every per-tenant family, with the label values it
    /// can take that are known in advance (queue-full actions, the common publish refusals).
    pub fn seed_tenant(&self, tenant: &str) {
        let t = Self::tenant(tenant);
        for family in [
            &self.publish_requests,
            &self.publish_records,
            &self.publish_bytes,
            &self.sub_queue_dropped,
            &self.sub_delivered_records,
            &self.sub_lagged,
        ] {
            let _ = family.get_or_create(&t);
        }
        for action in QUEUE_FULL_ACTIONS {
            let _ = self.publish_queue_full.get_or_create(&TenantAction {
                tenant: tenant.to_owned(),
                action: (*action).to_owned(),
            });
        }
        for action in QUOTA_ACTIONS {
            let _ = self.quota_throttled.get_or_create(&TenantAction {
                tenant: tenant.to_owned(),
                action: (*action).to_owned(),
            });
        }
        for reason in SEEDED_PUBLISH_ERRORS {
            let _ = self.publish_errors.get_or_create(&TenantReason {
                tenant: tenant.to_owned(),
                reason: (*reason).to_owned(),
            });
        }
    }

    /// Sets a counter to `value` (counters kept elsewhere as plain atomics).
    pub fn sync_counter(counter: &Counter, value: u64) {
        let now = counter.get();
        if value > now {
            counter.inc_by(value - now);
        }
    }

    /// The text exposition for `/metrics`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn tenant(t: &str) -> TenantLabel {
        TenantLabel {
            tenant: t.to_owned(),
        }
    }
}

/// What `felix_tenant_publish_queue_full_total{action}` can say (admission.rs).
const QUEUE_FULL_ACTIONS: &[&str] = &["rejected", "waited", "shed"];
/// What `felix_tenant_quota_throttled_total{action}` can say (quota/mod.rs): an acked
/// publish refused, a fire-and-forget one shed, a Kafka produce answered with a throttle.
pub const QUOTA_ACTIONS: &[&str] = &["refused", "shed", "kafka_throttled"];
/// Publish refusals seeded per tenant: the ones load, limits and failover produce. Any
/// other reason appears with its first occurrence.
const SEEDED_PUBLISH_ERRORS: &[&str] = &[
    "publish_queue_full",
    "tenant_quota",
    "disk_full",
    "record_too_large",
    "invalid_batch",
    "quorum_timeout",
    "fenced",
    "not_leader",
    "shard_unavailable",
];

/// Runs for the broker's life: seeds every tenant's series as the registry names it.
pub async fn seed_tenants(
    metrics: std::sync::Arc<Metrics>,
    mut registry: tokio::sync::watch::Receiver<std::sync::Arc<felix_meta::state_machine::Registry>>,
) {
    loop {
        let tenants: Vec<String> = registry
            .borrow_and_update()
            .tenants
            .keys()
            .cloned()
            .collect();
        for tenant in &tenants {
            metrics.seed_tenant(tenant);
        }
        if registry.changed().await.is_err() {
            return;
        }
    }
}

/// The uploader's reports, as metrics.
pub struct TierMetrics {
    metrics: std::sync::Arc<Metrics>,
    backlog: parking_lot::Mutex<std::collections::HashMap<felix_meta::model::ShardKey, (u64, u64)>>,
}

impl TierMetrics {
    pub fn new(metrics: std::sync::Arc<Metrics>) -> TierMetrics {
        TierMetrics {
            metrics,
            backlog: parking_lot::Mutex::new(std::collections::HashMap::new()),
        }
    }
}

impl felix_cold::uploader::TierObserver for TierMetrics {
    fn upload_failed(&self, _: &felix_meta::model::ShardKey, _: &felix_cold::ColdError) {
        self.metrics.tier_upload_errors.inc();
    }

    fn uploaded(
        &self,
        _: &felix_meta::model::ShardKey,
        entry: &felix_meta::model::SegmentEntry,
        lag: Option<std::time::Duration>,
    ) {
        self.metrics.tier_uploaded_objects.inc();
        self.metrics.tier_uploaded_bytes.inc_by(entry.size_bytes);
        if let Some(lag) = lag {
            self.metrics.tier_upload_lag.observe(lag.as_secs_f64());
        }
    }

    fn backlog(&self, shard: &felix_meta::model::ShardKey, segments: u64, bytes: u64) {
        let mut b = self.backlog.lock();
        b.insert(shard.clone(), (segments, bytes));
        let (n, total) = b.values().fold((0, 0), |(n, t), (s, by)| (n + s, t + by));
        self.metrics.tier_upload_backlog_segments.set(n as i64);
        self.metrics.tier_upload_backlog_bytes.set(total as i64);
    }
}
