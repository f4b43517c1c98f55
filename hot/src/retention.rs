//! Local retention: which sealed segments of a shard's log are deleted.
//!
//! Decides by the log's [`RetentionPolicy`](crate::RetentionPolicy) (size, age) and the
//! caller's floors. Invariants: the active segment is never deleted; segments go oldest
//! first and only whole; a segment holding a record at or after the caller's
//! `deletable_below` (not yet uploaded or acknowledged) stays, unless it lies wholly below
//! the stream's total-retention floor.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::error::LogError;
use crate::log::ShardLog;
use crate::segment::Segment;

/// How many sealed segments retention removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub deleted_segments: usize,
    pub deleted_bytes: u64,
    /// The log's first offset afterwards.
    pub first_offset: u64,
}

impl ShardLog {
    /// Deletes the oldest sealed segments that the retention policy no longer wants, but
    /// only those whose every record is below `deletable_below` (the caller's floor: what is
    /// uploaded and acknowledged). The active segment is never deleted.
    pub fn enforce_retention(&self, deletable_below: u64) -> Result<RetentionOutcome, LogError> {
        self.enforce_retention_with_floor(deletable_below, 0)
    }

    /// Like [`ShardLog::enforce_retention`], and also deletes every sealed segment wholly
    /// below `floor` whatever the policy says: the stream's total retention has already
    /// removed those records from both tiers (the tiering layer's floor).
    pub fn enforce_retention_with_floor(
        &self,
        deletable_below: u64,
        floor: u64,
    ) -> Result<RetentionOutcome, LogError> {
        let shared = self.shared();
        let policy = shared.config.read().retention;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let _maintenance = shared.maintenance.lock();
        let removed: Vec<Arc<Segment>> = {
            let mut segs = shared.segments.write();
            let mut total: u64 = segs.iter().map(|s| s.size()).sum();
            let mut n = 0;
            while n + 1 < segs.len() {
                let s = &segs[n];
                let below_floor = s.next_offset() <= floor;
                if !s.sealed.load(Ordering::Acquire)
                    || (s.next_offset() > deletable_below && !below_floor)
                {
                    break;
                }
                let over_size = policy
                    .max_bytes
                    .is_some_and(|max| total.saturating_sub(s.size()) >= max);
                let too_old = policy.max_age.is_some_and(|age| {
                    s.max_timestamp.load(Ordering::Relaxed) < now_ms - age.as_millis() as i64
                });
                if !(over_size || too_old || below_floor) {
                    break;
                }
                total -= s.size();
                n += 1;
            }
            segs.drain(..n).collect()
        };
        let mut outcome = RetentionOutcome {
            deleted_segments: removed.len(),
            deleted_bytes: removed.iter().map(|s| s.size()).sum(),
            first_offset: self.first_offset(),
        };
        for seg in &removed {
            let index = shared
                .dir
                .join(crate::segment::index_file_name(seg.base_offset));
            std::fs::remove_file(&seg.path).map_err(|e| {
                crate::segment::io_err(&shared.shard, "delete segment", &seg.path, e)
            })?;
            let _ = std::fs::remove_file(index);
        }
        if !removed.is_empty() {
            crate::segment::sync_dir(&shared.dir).map_err(|e| {
                crate::segment::io_err(&shared.shard, "sync log directory", &shared.dir, e)
            })?;
            tracing::info!(shard = %shared.shard, segments = outcome.deleted_segments, bytes = outcome.deleted_bytes, "retention deleted sealed segments");
        }
        outcome.first_offset = self.first_offset();
        Ok(outcome)
    }
}
