//! Pull reads of a durable shard, as the Kafka listener's fetch makes them: the readable
//! range, whole stored batches from whichever tier holds them, and the offset for a time.
//!
//! Invariant: a pull read never returns a record at or past the high watermark (the quorum
//! mark on a replicated shard); an offset below the earliest is `offset_too_old`, one past
//! the high watermark `offset_out_of_range`, one at it reads nothing.

use std::sync::Arc;

use bytes::Bytes;
use felix_cold::ColdError;
use felix_cold::tiered::{Tier, TieredShard};
use felix_meta::model::ShardKey;
use felix_wire::protocol::{ErrorBody, codes};
use tokio::sync::watch;

use crate::broker::{Broker, ShardBounds, ShardRead};
use crate::errors::{cold_error, err};
use crate::shard::Shard;

impl Broker {
    /// A durable shard's tiers; an ephemeral shard has no history to read.
    pub(crate) fn durable_tier(
        &self,
        key: &ShardKey,
    ) -> Result<(Arc<Shard>, Arc<TieredShard>), ErrorBody> {
        let (shard, _) = self.shard(key)?;
        let tier = shard.tier.clone().ok_or_else(|| {
            err(
                codes::INVALID_ARGUMENT,
                "ephemeral_stream",
                format!(
                    "stream {}/{}/{} is ephemeral: it keeps no log to read by offset",
                    key.tenant, key.namespace, key.stream
                ),
            )
        })?;
        Ok((shard, tier))
    }

    /// A durable shard's earliest readable offset (either tier) and its high watermark (the
    /// offset the next committed record will take; readers see everything below it).
    pub fn shard_bounds(&self, key: &ShardKey) -> Result<ShardBounds, ErrorBody> {
        let (shard, tier) = self.durable_tier(key)?;
        Ok(ShardBounds {
            earliest: tier.earliest_offset(),
            high_watermark: shard.visible_end(),
        })
    }

    /// Changes whenever a durable shard's high watermark may have moved: what a pull reader
    /// waiting for new records watches.
    pub fn watch_high_watermark(&self, key: &ShardKey) -> Result<watch::Receiver<u64>, ErrorBody> {
        let (shard, tier) = self.durable_tier(key)?;
        Ok(shard
            .watch_visible()
            .unwrap_or_else(|| tier.log.watch_committed()))
    }

    /// A pull read of one durable shard, as a Kafka fetch makes it: whole stored batches
    /// starting with the one holding `offset`, up to about `max_bytes` (at least one batch
    /// if any is readable), from whichever tier holds them, never past the high watermark.
    /// An offset below the earliest is `offset_too_old`; one past the high watermark is
    /// `offset_out_of_range`; one at it reads nothing.
    pub async fn fetch(
        &self,
        key: &ShardKey,
        offset: u64,
        max_bytes: usize,
    ) -> Result<ShardRead, ErrorBody> {
        let (shard, tier) = self.durable_tier(key)?;
        let high_watermark = shard.visible_end();
        let earliest = tier.earliest_offset();
        if offset < earliest {
            return Err(cold_error(&ColdError::TooOld {
                requested: offset,
                earliest,
            }));
        }
        if offset > high_watermark {
            return Err(err(
                codes::OFFSET_OUT_OF_RANGE,
                "offset_out_of_range",
                format!("offset {offset} is outside [{earliest}, {high_watermark}] on this shard"),
            ));
        }
        let mut pos = offset;
        while pos < high_watermark {
            match tier.read(pos, max_bytes.max(1), Some(high_watermark)).await {
                Ok(read) if !read.batches.is_empty() => {
                    if let Some(damage) = &read.hot_damage {
                        crate::segment_repair::served_around(&tier, damage);
                    }
                    return Ok(ShardRead {
                        batches: read.batches,
                        next_offset: read.next_offset,
                        earliest,
                        high_watermark,
                    });
                }
                // The rest of an object is empty below the bound: continue after it.
                Ok(read) if read.tier == Tier::Cold => {
                    pos = read.next_offset.max(pos + 1).min(high_watermark);
                }
                // No whole batch below the bound from here: a gap up to it.
                Ok(_) => pos = high_watermark,
                Err(e) => {
                    crate::segment_repair::refused(&self.node, &shard, &e);
                    return Err(cold_error(&e));
                }
            }
        }
        Ok(ShardRead {
            batches: Bytes::new(),
            next_offset: pos,
            earliest,
            high_watermark,
        })
    }

    /// The base offset of the first batch of a durable shard holding a record stamped at or
    /// after `timestamp_ms`, searching both tiers; `None` if no committed record is that new.
    pub async fn offset_for_time(
        &self,
        key: &ShardKey,
        timestamp_ms: i64,
    ) -> Result<Option<u64>, ErrorBody> {
        let (shard, tier) = self.durable_tier(key)?;
        let found = tier
            .offset_for_time(timestamp_ms)
            .await
            .map_err(|e| cold_error(&e))?;
        Ok(found.filter(|o| *o < shard.visible_end()))
    }

    /// The largest record timestamp a durable shard holds in either tier (-1: none), for
    /// Kafka's ListOffsets `max_timestamp`.
    pub fn max_timestamp(&self, key: &ShardKey) -> Result<i64, ErrorBody> {
        let (_, tier) = self.durable_tier(key)?;
        let cold = tier
            .manifest
            .snapshot()
            .objects
            .values()
            .map(|e| e.max_timestamp)
            .max()
            .unwrap_or(-1);
        Ok(cold.max(tier.log.max_timestamp()))
    }
}
