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
//! [`COMPACT_FACTOR`] times its live data (and two segments), the owner appends a copy of
//! every live entry (after a version floor record) while puts and gets go on, waits until
//! the replicas hold that snapshot, and raises the shard's floor to the floor record's
//! offset through the control plane (`delete_records`), so every replica drops the segments
//! before it. Replaying from the floor gives the same state: the copies stand for
//! everything before it, except where a later change of their key came first
//! (`state::Replayer`).

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use felix_meta::model::Durability;
use felix_wire::protocol::{ErrorBody, codes};
use tracing::{info, warn};

use super::commit::encode_ops;
use super::metrics::CacheShardLabel;
use super::record::LogOp;
use super::segments::fit_segment;
use super::state::ENTRY_OVERHEAD;
use super::{CacheShard, is_cache_stream, now_ms};
use crate::broker::Broker;
use crate::errors::err;
use crate::shard::shard_key;

const EVERY: Duration = Duration::from_secs(1);
/// Expiry deletes per shard per pass (the spec's 1,024).
pub const EXPIRE_PER_PASS: usize = 1024;
/// A log over this many times its live data is compacted.
pub const COMPACT_FACTOR: u64 = 4;
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
    ///
    /// The shard's lock is held only to take the entries (shared values, no copies) and to
    /// have the log accept each record batch at the state's end: the floor record, then the
    /// copies, each batch encoded before the lock and written after it, so puts and gets
    /// go on throughout. Changes made meanwhile land between the copies in the log, which
    /// is why a copy stands for its key only when no change to the key follows the floor
    /// record before it (`state::Replayer`). A write lost meanwhile (a failure gives the
    /// log's offsets back, so the floor record may be gone) stops the compaction before
    /// the floor is raised.
    pub(crate) async fn compact(&self, cs: &CacheShard) -> Result<(), ErrorBody> {
        let (floor, floor_record, entries, lost) = {
            let mut st = cs.state.lock().await;
            self.catch_up(cs, &mut st).await?;
            let floor = st.applied_end;
            let entries = st.snapshot(now_ms());
            let ops = vec![LogOp::Floor {
                next_version: st.next_version(),
            }];
            let staged = self.stage_changes(cs, &mut st, ops).await?;
            (floor, staged, entries, cs.lost.load(Ordering::Acquire))
        };
        let mut last = floor_record.written(cs).await?;
        if felix_meta::faults::compactions_held() {
            warn!(shard = %cs.key, floor, "cache compaction held by fault injection");
            felix_meta::faults::wait_while_compactions_held().await;
        }
        for batch in snapshot_batches(entries) {
            let batch = encode_ops(&batch)?;
            let staged = {
                let mut st = cs.state.lock().await;
                self.catch_up(cs, &mut st).await?;
                if cs.lost.load(Ordering::Acquire) != lost {
                    return Err(lost_during_compaction(cs));
                }
                self.stage_batch(cs, &mut st, batch, Vec::new()).await?
            };
            last = staged.written(cs).await?;
        }
        if cs.lost.load(Ordering::Acquire) != lost {
            return Err(lost_during_compaction(cs));
        }
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

/// A compaction's copies in batches of about [`SNAPSHOT_BATCH_BYTES`].
fn snapshot_batches(entries: Vec<LogOp>) -> Vec<Vec<LogOp>> {
    let mut batches = Vec::new();
    let (mut batch, mut bytes) = (Vec::new(), 0u64);
    for op in entries {
        if let LogOp::Snapshot { key, value, .. } = &op {
            bytes += (key.len() + value.len()) as u64 + ENTRY_OVERHEAD;
        }
        batch.push(op);
        if bytes >= SNAPSHOT_BATCH_BYTES {
            batches.push(std::mem::take(&mut batch));
            bytes = 0;
        }
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

/// A write of the shard failed while a compaction ran: its floor record may have gone with
/// it, so the floor stays where it is (the next pass compacts again).
fn lost_during_compaction(cs: &CacheShard) -> ErrorBody {
    err(
        codes::SHARD_UNAVAILABLE,
        "shard_unavailable",
        format!(
            "cache shard {}: a write failed during compaction; the floor stays, the next \
             pass compacts again",
            cs.key
        ),
    )
}
