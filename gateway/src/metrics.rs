//! The broker's Prometheus metrics. Names are `felix_<area>_<thing>_{total,seconds,bytes}`,
//! as the spec uses them (`felix_sub_queue_dropped_total`,
//! `felix_tenant_publish_queue_full_total`, `felix_broker_acked_publishes_dropped_total`).
//! Each is documented in docs/operations.md.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantReason {
    pub tenant: String,
    pub reason: String,
}

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
    pub sub_queue_dropped: Family<TenantLabel, Counter>,
    pub sub_delivered_records: Family<TenantLabel, Counter>,
    pub sub_lagged: Family<TenantLabel, Counter>,
    pub subscriptions_active: Gauge,
    pub connections_active: Gauge,
    pub acked_publishes_dropped: Counter,
    pub frames_rejected: Counter,
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
            sub_queue_dropped: Family::default(),
            sub_delivered_records: Family::default(),
            sub_lagged: Family::default(),
            subscriptions_active: Gauge::default(),
            connections_active: Gauge::default(),
            acked_publishes_dropped: Counter::default(),
            frames_rejected: Counter::default(),
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
            "felix_frames_rejected",
            "Frames refused as malformed or oversized",
            m.frames_rejected.clone(),
        );
        Metrics { registry, ..m }
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
