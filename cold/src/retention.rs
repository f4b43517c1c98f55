//! Retention of one shard across both tiers.
//!
//! * Total retention (`retention_ms`, `retention_bytes`) applies to the whole stream. On a
//!   tiered stream it deletes the oldest objects: first the manifest entries, through the
//!   control plane, which also raises the shard's floor (its earliest offset); then, once
//!   that is committed, the objects themselves. On a stream without tiering it is the hot
//!   log's own retention.
//! * Hot retention (`hot_retention_ms`, `hot_retention_bytes`) applies to the local copy of
//!   a tiered stream and deletes only segments the manifest covers.
//!
//! Neither ever deletes at or above `acked_end`, the end of what is acknowledged (a Quorum
//! shard's quorum mark), nor a segment that is not sealed.

use std::time::Duration;

use felix_hot::RetentionPolicy;
use felix_model::{SegmentEntry, StreamSettings};

use crate::error::ColdError;
use crate::manifest::ManifestKeeper;
use crate::tiered::TieredShard;

/// What one pass removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    pub objects_deleted: usize,
    pub object_bytes_deleted: u64,
    pub segments_deleted: usize,
    pub segment_bytes_deleted: u64,
    /// The shard's earliest offset afterwards.
    pub earliest_offset: u64,
}

/// Applies the stream's retention settings to one shard once.
pub async fn enforce(
    shard: &TieredShard,
    meta: &dyn ManifestKeeper,
    settings: &StreamSettings,
    acked_end: u64,
    now_ms: i64,
) -> Result<RetentionReport, ColdError> {
    let mut report = RetentionReport::default();
    if !settings.tiered {
        return enforce_local(shard, settings, acked_end, report);
    }

    let expired = expired_objects(shard, settings, acked_end, now_ms);
    if let Some(last) = expired.last() {
        let below = last.last_offset + 1;
        let trimmed = meta.trim(&shard.key, below).await?;
        shard.manifest.trim(below);
        let removed = trimmed.unwrap_or(expired);
        // The manifest no longer names these objects, so no reader will look for them;
        // deleting them now only frees space. A failure leaves an orphan, logged.
        for entry in &removed {
            let Some(objref) = crate::cache::ObjectRef::of(entry) else {
                continue;
            };
            let key = &objref.key;
            if let Some(cache) = shard.cache() {
                cache.forget(&objref);
                if let Err(e) = cache.store().delete(key).await {
                    tracing::warn!(shard = %shard.key, key, error = %e, "could not delete an expired object; it is orphaned");
                    continue;
                }
            }
            report.objects_deleted += 1;
            report.object_bytes_deleted += entry.size_bytes;
        }
        tracing::info!(shard = %shard.key, below, objects = report.objects_deleted, "total retention trimmed the cold tier");
    }

    enforce_local(shard, settings, acked_end, report)
}

/// The local part of [`enforce`], which needs no control-plane command: on a tiered stream
/// the hot policy for segments the manifest covers (and anything below its floor), on
/// another the stream's retention, never at or above `acked_end`. A replica that does not
/// lead its shard runs only this part, with its refreshed copy of the manifest.
pub fn enforce_local(
    shard: &TieredShard,
    settings: &StreamSettings,
    acked_end: u64,
    mut report: RetentionReport,
) -> Result<RetentionReport, ColdError> {
    let log = &shard.log;
    let out = if settings.tiered {
        log.alter(|c| {
            c.retention = policy(settings.hot_retention_bytes, settings.hot_retention_ms)
        });
        log.enforce_retention_with_floor(
            shard.manifest.uploaded_end().min(acked_end),
            shard.manifest.floor().min(acked_end),
        )?
    } else {
        log.alter(|c| c.retention = policy(settings.retention_bytes, settings.retention_ms));
        log.enforce_retention(acked_end)?
    };
    report.segments_deleted = out.deleted_segments;
    report.segment_bytes_deleted = out.deleted_bytes;
    report.earliest_offset = shard.earliest_offset();
    Ok(report)
}

fn policy(bytes: Option<u64>, ms: Option<u64>) -> RetentionPolicy {
    RetentionPolicy {
        max_bytes: bytes,
        max_age: ms.map(Duration::from_millis),
    }
}

/// The oldest objects total retention removes: by age (newest record older than
/// `retention_ms`) and by size (while the stream, both tiers, would still hold at least
/// `retention_bytes` without the object — Kafka's rule). Never an object at or above
/// `acked_end`.
fn expired_objects(
    shard: &TieredShard,
    settings: &StreamSettings,
    acked_end: u64,
    now_ms: i64,
) -> Vec<SegmentEntry> {
    if settings.retention_ms.is_none() && settings.retention_bytes.is_none() {
        return Vec::new();
    }
    let state = shard.manifest.snapshot();
    let uploaded_end = state.uploaded_end();
    // Local bytes not covered by objects count towards the stream's size too.
    let local_above: u64 = shard.log.size_bytes().saturating_sub(
        shard
            .log
            .sealed_segments()
            .iter()
            .filter(|s| s.last_offset < uploaded_end)
            .map(|s| s.size_bytes)
            .sum(),
    );
    let mut total = state.cold_bytes() + local_above;
    let mut out = Vec::new();
    for entry in state.objects.values() {
        if entry.last_offset >= acked_end {
            break;
        }
        let too_old = settings
            .retention_ms
            .is_some_and(|ms| entry.max_timestamp < now_ms - ms as i64);
        let over = settings
            .retention_bytes
            .is_some_and(|max| total.saturating_sub(entry.size_bytes) >= max);
        if !(too_old || over) {
            break;
        }
        total -= entry.size_bytes.min(total);
        out.push(entry.clone());
    }
    out
}
