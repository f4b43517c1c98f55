//! The cold read-ahead's metrics (docs/tiering.md, charted in deploy/grafana/felix.json):
//! how many row groups a sequential cold reader fetches ahead now, the bytes read-ahead
//! holds against its budget, and the row-group fetches in flight. Gauges copied from the
//! cold cache's atomics when `/metrics` is scraped.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The read-ahead gauges.
#[derive(Default)]
pub struct ColdReadMetrics {
    pub read_ahead_depth: Gauge,
    pub read_ahead_bytes: Gauge,
    pub read_ahead_budget_bytes: Gauge,
    pub fetches_in_flight: Gauge,
}

impl ColdReadMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "felix_cold_read_ahead_depth",
            "Row groups a sequential cold reader fetches ahead now (measured from recent GETs \
             and decodes)",
            self.read_ahead_depth.clone(),
        );
        registry.register(
            "felix_cold_read_ahead_bytes",
            "Bytes fetched ahead of cold readers and not yet read",
            self.read_ahead_bytes.clone(),
        );
        registry.register(
            "felix_cold_read_ahead_budget_bytes",
            "The most bytes cold read-ahead may hold (cold_read_ahead_bytes)",
            self.read_ahead_budget_bytes.clone(),
        );
        registry.register(
            "felix_cold_fetches_in_flight",
            "Row-group GETs in flight for cold reads and read-ahead",
            self.fetches_in_flight.clone(),
        );
    }

    /// Copies the read-ahead's state into the gauges.
    pub fn refresh(&self, read_ahead: &felix_cold::read_ahead::ReadAhead) {
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.read_ahead_depth.set(gauge(read_ahead.depth() as u64));
        self.read_ahead_bytes.set(gauge(read_ahead.held_bytes()));
        self.read_ahead_budget_bytes
            .set(gauge(read_ahead.budget_bytes()));
        self.fetches_in_flight
            .set(gauge(read_ahead.fetches_in_flight()));
    }
}
