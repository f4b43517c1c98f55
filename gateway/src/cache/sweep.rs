//! The once-a-second pass over the cache shards this broker owns: writes a delete for
//! each expired entry of a log-backed shard (at most [`EXPIRE_PER_PASS`] per shard per
//! pass; every watch of the key receives it), compacts logs grown well past their live
//! data, lets go of closed shards, and sets the gauges.
//!
//! Why a pass: a reader already treats an expired entry as absent, but a watch must hear of
//! the expiry and the log must not keep dead entries forever. After a restart every
//! log-backed cache this broker leads is opened here, so expiry resumes without a client.
//!
//! Compaction decides what stays on disk: when a shard's log exceeds
//! [`COMPACT_FACTOR`] times its live data (and two segments), the owner appends every live
//! entry (after a version floor record) under the shard's lock, waits until the replicas
//! hold that snapshot, and raises the shard's floor to the snapshot's first offset through
//! the control plane (`delete_records`), so every replica drops the segments before it.
//! Replaying from the floor gives the same state, since the snapshot stands for everything
//! before it.

use std::sync::Weak;
use std::time::Duration;

use felix_hot::ShardLog;
use felix_meta::model::Durability;
use felix_wire::protocol::ErrorBody;
use tracing::{info, warn};

use super::metrics::CacheShardLabel;
use super::record::LogOp;
use super::state::ENTRY_OVERHEAD;
use super::{CacheShard, is_cache_stream, now_ms};
use crate::broker::Broker;
use crate::shard::shard_key;

const EVERY: Duration = Duration::from_secs(1);
/// Expiry deletes per shard per pass (the spec's 1,024).
pub const EXPIRE_PER_PASS: usize = 1024;
/// A log over this many times its live data is compacted.
pub const COMPACT_FACTOR: u64 = 4;
/// Segments of a cache's log: small, so compaction can drop them soon. The owner grows a
/// busy shard's segments with its live data ([`fit_segment`]).
pub const CACHE_SEGMENT_BYTES: u64 = 256 * 1024;
/// The largest segment [`fit_segment`] gives a cache shard's log.
pub const MAX_CACHE_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// Bytes of entries per snapshot batch.
const SNAPSHOT_BATCH_BYTES: u64 = 512 * 1024;

/// Runs the pass every second until the broker is gone.
pub async fn run(broker: Weak<Broker>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(b) = broker.upgrade() else { return };
        b.sweep_caches().await;
    }
}

impl Broker {
    async fn sweep_caches(&self) {
        self.caches.open.lock().retain(|_, c| {
            let keep = !c.shard.is_closed();
            if !keep {
                // A closed shard's gauges go with it, so a dropped cache leaves no series.
                let label = CacheShardLabel::of(&c.key, &c.cache);
                let m = &self.node.metrics.cache;
                m.cache_entries.remove(&label);
                m.cache_bytes.remove(&label);
                m.cache_log_bytes.remove(&label);
            }
            keep
        });
        // Every log-backed cache shard this broker leads, from the registry.
        let keys: Vec<_> = {
            let reg = self.node.registry.borrow();
            reg.streams
                .values()
                .filter(|s| {
                    is_cache_stream(&s.name) && s.settings.durability == Durability::Durable
                })
                .flat_map(|s| {
                    (0..s.settings.shards).map(|k| shard_key(&s.tenant, &s.namespace, &s.name, k))
                })
                .collect()
        };
        for key in keys {
            // Only a replica can lead the shard; asking elsewhere would open it here.
            if !self.node.holds_replica(&key) {
                continue;
            }
            let Ok(cs) = self.cache_shard(&key) else {
                continue;
            };
            if let Err(e) = self.sweep_shard(&cs).await {
                warn!(shard = %key, error = %e, "cache sweep");
            }
        }
        let open: Vec<_> = self.caches.open.lock().values().cloned().collect();
        for cs in open {
            let label = CacheShardLabel::of(&cs.key, &cs.cache);
            let m = &self.node.metrics.cache;
            if let Ok(st) = cs.state.try_lock() {
                m.cache_entries.get_or_create(&label).set(st.len() as i64);
                m.cache_bytes.get_or_create(&label).set(st.bytes() as i64);
            }
            if let Some(log) = &cs.shard.log {
                m.cache_log_bytes
                    .get_or_create(&label)
                    .set(log.size_bytes() as i64);
            }
        }
    }

    /// Expiry deletes and, if due, a compaction of one log-backed shard.
    async fn sweep_shard(&self, cs: &CacheShard) -> Result<(), ErrorBody> {
        let Some(log) = cs.shard.log.clone() else {
            return Ok(());
        };
        let (last, expired) = {
            let mut st = cs.state.lock().await;
            self.catch_up(cs, &mut st).await?;
            let keys = st.expired(now_ms(), EXPIRE_PER_PASS);
            if keys.is_empty() {
                (None, 0)
            } else {
                let first = st.next_version();
                let n = keys.len();
                let ops = keys
                    .into_iter()
                    .enumerate()
                    .map(|(i, key)| LogOp::Delete {
                        key,
                        version: first + i as u64,
                        expired: true,
                    })
                    .collect();
                (self.commit_changes(cs, &mut st, ops).await?, n)
            }
        };
        if expired > 0 {
            self.node
                .metrics
                .cache
                .expired(&cs.key, &cs.cache, expired as u64);
        }
        let _ = last;
        let live = {
            let st = cs.state.lock().await;
            st.bytes() + st.len() as u64 * ENTRY_OVERHEAD
        };
        let segment = fit_segment(&log, live);
        if log.size_bytes() > (COMPACT_FACTOR * live).max(2 * segment) + segment {
            self.compact(cs).await?;
        }
        Ok(())
    }

    /// Appends a snapshot of every live entry and raises the floor to its start.
    pub(crate) async fn compact(&self, cs: &CacheShard) -> Result<(), ErrorBody> {
        let (floor, last) = {
            let mut st = cs.state.lock().await;
            self.catch_up(cs, &mut st).await?;
            let floor = st.applied_end;
            let mut batch = vec![LogOp::Floor {
                next_version: st.next_version(),
            }];
            let mut batch_bytes = 0u64;
            let mut last = None;
            for op in st.snapshot(now_ms()) {
                if let LogOp::Put { key, value, .. } = &op {
                    batch_bytes += (key.len() + value.len()) as u64 + ENTRY_OVERHEAD;
                }
                batch.push(op);
                if batch_bytes >= SNAPSHOT_BATCH_BYTES {
                    last = self
                        .commit_snapshot(cs, &mut st, std::mem::take(&mut batch))
                        .await?;
                    batch_bytes = 0;
                }
            }
            if !batch.is_empty() {
                last = self.commit_snapshot(cs, &mut st, batch).await?;
            }
            (floor, last)
        };
        let Some(last) = last else { return Ok(()) };
        // Every replica must hold the snapshot before anything before it may go.
        if let Some(repl) = &cs.shard.repl
            && !repl.mark.wait_past(last, Duration::from_secs(10)).await
        {
            warn!(shard = %cs.key, "cache compaction: the replicas did not confirm the snapshot; the floor stays");
            return Ok(());
        }
        let k = &cs.key;
        self.delete_records(&k.tenant, &k.namespace, &k.stream, k.shard, Some(floor))
            .await?;
        self.node.metrics.cache.compacted(&cs.key, &cs.cache);
        info!(shard = %cs.key, floor, bytes = cs.shard.log.as_ref().map(|l| l.size_bytes()), "cache shard compacted");
        Ok(())
    }
}

/// Sets the segment size of an owned shard's log to a quarter of its live data, between
/// [`CACHE_SEGMENT_BYTES`] and [`MAX_CACHE_SEGMENT_BYTES`]; returns it. Every roll costs
/// the log a flush, new files (segment, index, producer snapshot) and an upload, which a
/// busy cache with 256 KiB segments paid dozens of times a second on every put's path. A
/// quarter of the live data keeps what compaction lets the log grow to within a small
/// multiple of it (`COMPACT_FACTOR` times, plus a segment), and a small cache keeps small
/// segments, so compaction can drop them soon. Followers' logs keep the stream's setting.
fn fit_segment(log: &ShardLog, live: u64) -> u64 {
    let want = (live / 4).clamp(CACHE_SEGMENT_BYTES, MAX_CACHE_SEGMENT_BYTES);
    if log.config().segment_bytes != want {
        log.alter(|c| c.segment_bytes = want);
    }
    want
}

#[cfg(test)]
mod tests {
    use felix_hot::LogConfig;

    use super::*;

    #[test]
    fn a_shards_segments_are_a_quarter_of_its_live_data_within_bounds() {
        let dir = tempfile::tempdir().expect("dir");
        let config = LogConfig {
            segment_bytes: CACHE_SEGMENT_BYTES,
            ..LogConfig::default()
        };
        let log = ShardLog::open(dir.path(), config).expect("log");
        assert_eq!(fit_segment(&log, 100 * 1024), CACHE_SEGMENT_BYTES);
        assert_eq!(fit_segment(&log, 40 << 20), 10 << 20);
        assert_eq!(log.config().segment_bytes, 10 << 20, "the log rolls at it");
        assert_eq!(fit_segment(&log, 1 << 40), MAX_CACHE_SEGMENT_BYTES);
        // Back down when the live data shrinks, so compaction can drop segments soon.
        assert_eq!(fit_segment(&log, 0), CACHE_SEGMENT_BYTES);
        assert_eq!(log.config().segment_bytes, CACHE_SEGMENT_BYTES);
    }
}
