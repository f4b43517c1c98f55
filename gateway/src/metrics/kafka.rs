//! The Kafka listener's metrics: requests by API and outcome, their latency, bytes on the
//! wire, open connections, and each classic consumer group's lag.
//!
//! Decides what a request's `result` means: `ok` when it was answered (an answer may still
//! carry per-partition error codes, as Kafka's own request metrics count it), `error` when it
//! closed the connection instead (malformed, unsupported, refused before SASL, failed). The
//! lag is what operators page on: committed offset against the partition's log end, per
//! group and partition, refreshed by the listener every few seconds (`kafka::lag`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiResult {
    pub api: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabel {
    pub api: String,
}

/// One group's position in one partition: the group's tenant and namespace, as its key in
/// the coordinator.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupPartition {
    pub tenant: String,
    pub namespace: String,
    pub group: String,
    pub topic: String,
    pub partition: String,
}

/// What `felix_kafka_requests_total{result}` can say.
pub const RESULTS: [&str; 2] = ["ok", "error"];

/// The `api` label of a request whose key no Kafka API has.
pub const UNKNOWN_API: &str = "unknown";

/// Request latencies from a fetch answered at once to a long-poll of `fetch.max.wait.ms`
/// (500 ms by default) and a produce waiting on a quorum.
fn latency_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

pub struct KafkaMetrics {
    pub requests: Family<ApiResult, Counter>,
    pub request_duration: Family<ApiLabel, Histogram, fn() -> Histogram>,
    pub received_bytes: Counter,
    pub sent_bytes: Counter,
    pub connections: Gauge,
    pub group_lag: Family<GroupPartition, Gauge>,
}

impl KafkaMetrics {
    /// The families, with every served API's series at 0 (the API list is known at build
    /// time, so the first refusal of a kind shows in `increase()`).
    pub fn new() -> KafkaMetrics {
        let m = KafkaMetrics {
            requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_histogram),
            received_bytes: Counter::default(),
            sent_bytes: Counter::default(),
            connections: Gauge::default(),
            group_lag: Family::default(),
        };
        for (key, _, _) in crate::kafka::SUPPORTED_APIS {
            let api = format!("{key:?}");
            for result in RESULTS {
                let _ = m.requests.get_or_create(&ApiResult {
                    api: api.clone(),
                    result: result.to_owned(),
                });
            }
            let _ = m.request_duration.get_or_create(&ApiLabel { api });
        }
        m
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "felix_kafka_requests",
            "Kafka requests by API and result (ok: answered; error: the connection was closed)",
            self.requests.clone(),
        );
        registry.register(
            "felix_kafka_request_duration_seconds",
            "Time from a Kafka request's arrival to its answer, by API",
            self.request_duration.clone(),
        );
        registry.register(
            "felix_kafka_received_bytes",
            "Bytes of Kafka requests received, length prefixes included",
            self.received_bytes.clone(),
        );
        registry.register(
            "felix_kafka_sent_bytes",
            "Bytes of Kafka answers written",
            self.sent_bytes.clone(),
        );
        registry.register(
            "felix_kafka_connections",
            "Open Kafka connections",
            self.connections.clone(),
        );
        registry.register(
            "felix_kafka_group_lag",
            "Records between a Kafka group's committed offset and its partition's log end",
            self.group_lag.clone(),
        );
    }

    /// Counts one request and its latency.
    pub fn request(&self, api: &str, ok: bool, seconds: f64) {
        self.requests
            .get_or_create(&ApiResult {
                api: api.to_owned(),
                result: RESULTS[usize::from(!ok)].to_owned(),
            })
            .inc();
        self.request_duration
            .get_or_create(&ApiLabel {
                api: api.to_owned(),
            })
            .observe(seconds);
    }
}

impl Default for KafkaMetrics {
    fn default() -> Self {
        KafkaMetrics::new()
    }
}
