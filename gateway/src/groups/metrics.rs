//! The consumer-group metrics, per group (docs/operations.md, charted in
//! deploy/grafana/felix.json): records handed out, acknowledged, redelivered and
//! dead-lettered, and the records in flight and not yet handed out.

use felix_meta::model::ShardKey;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Which group.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    pub tenant: String,
    pub namespace: String,
    pub stream: String,
    pub group: String,
}

impl GroupLabel {
    pub(crate) fn of(key: &ShardKey, group: &str) -> GroupLabel {
        GroupLabel {
            tenant: key.tenant.clone(),
            namespace: key.namespace.clone(),
            stream: key.stream.clone(),
            group: group.to_owned(),
        }
    }
}

/// The group metrics.
#[derive(Default)]
pub struct GroupMetrics {
    pub delivered: Family<GroupLabel, Counter>,
    pub acked: Family<GroupLabel, Counter>,
    pub redelivered: Family<GroupLabel, Counter>,
    pub dead_lettered: Family<GroupLabel, Counter>,
    pub in_flight: Family<GroupLabel, Gauge>,
    pub backlog: Family<GroupLabel, Gauge>,
}

impl GroupMetrics {
    /// Creates a group's counter series at 0 if they are not there yet, so the first
    /// redelivery or dead letter of a group shows in Prometheus' `increase()` (a series
    /// born at 1 reads as no increase).
    pub(crate) fn seed(&self, l: &GroupLabel) {
        for family in [
            &self.delivered,
            &self.acked,
            &self.redelivered,
            &self.dead_lettered,
        ] {
            // The guard is dropped at once: only the series's creation matters.
            drop(family.get_or_create(l));
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "felix_group_records_delivered",
            "Records a consumer group handed out, first deliveries and redeliveries",
            self.delivered.clone(),
        );
        registry.register(
            "felix_group_records_acked",
            "Records a consumer group's consumers acknowledged",
            self.acked.clone(),
        );
        registry.register(
            "felix_group_records_redelivered",
            "Records a consumer group handed out again after a nack or a lapsed claim",
            self.redelivered.clone(),
        );
        registry.register(
            "felix_group_records_dead_lettered",
            "Records a consumer group dead-lettered (or retired without a dead-letter stream) \
             after max_attempts deliveries",
            self.dead_lettered.clone(),
        );
        registry.register(
            "felix_group_in_flight",
            "Records claimed by a consumer group's consumers and within their deadline, on the \
             shards this broker leads",
            self.in_flight.clone(),
        );
        registry.register(
            "felix_group_backlog_records",
            "Committed records a consumer group has not handed out yet, on the shards this \
             broker leads",
            self.backlog.clone(),
        );
    }
}
