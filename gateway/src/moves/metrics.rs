//! The shard-move metrics (docs/operations.md, charted in deploy/grafana/felix.json): moves
//! this broker leads that are under way, the records their new replicas still lack, the
//! hand-overs it made and how long publishes were held at a fence.

use std::collections::HashMap;

use felix_meta::model::{Placement, ShardKey};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The move metrics.
pub struct MoveMetrics {
    pub in_progress: Gauge,
    pub catch_up_records: Gauge,
    pub handovers: Counter,
    pub hold_seconds: Histogram,
    /// Records each moving shard's new replica lacks, as its leader here last saw it.
    behind: Mutex<HashMap<ShardKey, u64>>,
}

impl Default for MoveMetrics {
    fn default() -> Self {
        MoveMetrics {
            in_progress: Gauge::default(),
            catch_up_records: Gauge::default(),
            handovers: Counter::default(),
            hold_seconds: Histogram::new([0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0]),
            behind: Mutex::new(HashMap::new()),
        }
    }
}

impl MoveMetrics {
    /// The leader of a moving shard saw its new replica `behind` records short.
    pub(crate) fn saw(&self, shard: &ShardKey, behind: u64) {
        let mut map = self.behind.lock();
        map.insert(shard.clone(), behind);
        self.catch_up_records.set(map.values().sum::<u64>() as i64);
        self.in_progress.set(map.len() as i64);
    }

    /// Keeps only the moves still under way on shards broker `me` leads (called on every
    /// placement change).
    pub(crate) fn prune<'a>(
        &self,
        me: u64,
        placements: impl Iterator<Item = (&'a ShardKey, &'a Placement)>,
    ) {
        let led: Vec<&ShardKey> = placements
            .filter(|(_, p)| p.moving.is_some() && p.leader == Some(me))
            .map(|(k, _)| k)
            .collect();
        let mut map = self.behind.lock();
        map.retain(|k, _| led.contains(&k));
        self.catch_up_records.set(map.values().sum::<u64>() as i64);
        self.in_progress.set(map.len() as i64);
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "felix_shard_moves_in_progress",
            "Shard moves under way on the shards this broker leads",
            self.in_progress.clone(),
        );
        registry.register(
            "felix_shard_move_catch_up_records",
            "Records the new replicas of moves this broker leads still lack",
            self.catch_up_records.clone(),
        );
        registry.register(
            "felix_shard_move_handovers",
            "Leaderships this broker handed over at a fence",
            self.handovers.clone(),
        );
        registry.register(
            "felix_shard_move_hold_seconds",
            "How long a publish was held at a shard's hand-over before it was served",
            self.hold_seconds.clone(),
        );
    }
}
