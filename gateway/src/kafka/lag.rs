//! `felix_kafka_group_lag`: how far each classic consumer group's committed offset is
//! behind its partition's log end, refreshed every [`INTERVAL`].
//!
//! Decides which partitions are reported: every one a group committed an offset for in the
//! group journal of a shard this broker leads (its high watermark is known here without a
//! network round), and offsets of the local log kept from before the journals on shards it
//! holds, where no journal here supersedes them; a
//! group's series go when its offsets do (DeleteGroups, a deleted topic), at the next
//! refresh. Series are replaced in place, never cleared first, so a scrape never sees a
//! group missing.

use std::collections::{HashMap, HashSet};
use std::sync::Weak;
use std::time::Duration;

use crate::metrics::kafka::GroupPartition;

use super::Kafka;
use super::offsets::OffsetKey;
use crate::shard::shard_key;

/// How often the lag is recomputed: well under a usual 15 s scrape interval.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// Runs for the listener's life.
pub async fn report(kafka: Weak<Kafka>) {
    let mut shown: HashSet<GroupPartition> = HashSet::new();
    loop {
        tokio::time::sleep(INTERVAL).await;
        let Some(kafka) = kafka.upgrade() else { return };
        let family = &kafka.broker.metrics().kafka.group_lag;
        let mut now = HashSet::with_capacity(shown.len());
        let mut offsets: HashMap<OffsetKey, i64> =
            kafka.groups.offsets().all().await.into_iter().collect();
        for (shard, table) in kafka.broker.kafka_offsets_led().await {
            for (group, committed) in table {
                let key = OffsetKey {
                    tenant: shard.tenant.clone(),
                    namespace: shard.namespace.clone(),
                    group,
                    topic: shard.stream.clone(),
                    partition: shard.shard as i32,
                };
                offsets.insert(key, committed.offset);
            }
        }
        for (key, committed) in offsets {
            let Ok(partition) = u32::try_from(key.partition) else {
                continue;
            };
            let Ok(bounds) = kafka.broker.shard_bounds(&shard_key(
                &key.tenant,
                &key.namespace,
                &key.topic,
                partition,
            )) else {
                continue;
            };
            let label = GroupPartition {
                tenant: key.tenant,
                namespace: key.namespace,
                group: key.group,
                topic: key.topic,
                partition: partition.to_string(),
            };
            // A committed offset past the end (a topic deleted and created again) is no lag.
            let lag = (bounds.high_watermark as i64)
                .saturating_sub(committed)
                .max(0);
            family.get_or_create(&label).set(lag);
            now.insert(label);
        }
        for gone in shown.difference(&now) {
            family.remove(gone);
        }
        shown = now;
    }
}
