//! Replacing a damaged sealed segment with a good copy of its records.
//!
//! Decides when a segment file may be rewritten and what the new file must prove first. A
//! sealed segment is immutable, so a damaged one stays damaged until someone rewrites it;
//! its records may still exist intact elsewhere (the object store, a replica). The caller
//! fetches them; this module only accepts them when they are exactly the segment's records:
//! every batch passes its CRC, the first starts at the segment's base offset, each one
//! continues the offsets before it, and the last ends where the segment ends. Anything else
//! is refused and the damaged file stays as it is, so a repair can never make a log worse.
//!
//! The new bytes are written to a temporary file, scanned like a segment found at recovery,
//! fsynced, and renamed over the damaged file with its index, all under the maintenance
//! lock (retention, truncation and the flusher wait). Readers holding the old segment keep
//! reading the old inode until they drop it; the truncation epoch moves so that no block
//! cached from the old file is handed out as if it came from the new one.

use std::fs::OpenOptions;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use felix_wire::WireError;

use crate::error::LogError;
use crate::log::ShardLog;
use crate::recovery::scan;
use crate::segment::{Segment, io_err, sync_dir, write_index_file};

/// Suffix of a replacement being written; recovery removes one left by a crash.
pub(crate) const REPAIR_SUFFIX: &str = ".log.repair";

/// What a repair replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairOutcome {
    pub base_offset: u64,
    /// One past the segment's last offset (unchanged by the repair).
    pub next_offset: u64,
    /// The damaged file's size and the new file's: a copy rebuilt from another tier may be
    /// encoded differently (e.g. uncompressed), so they need not match.
    pub old_bytes: u64,
    pub new_bytes: u64,
}

impl ShardLog {
    /// The sealed segment holding `offset`, as `(base_offset, next_offset)`; `None` when
    /// `offset` is in the active segment or outside the log.
    pub fn sealed_segment_range(&self, offset: u64) -> Option<(u64, u64)> {
        self.shared()
            .segments
            .read()
            .iter()
            .find(|s| {
                s.sealed.load(Ordering::Acquire)
                    && s.base_offset <= offset
                    && offset < s.next_offset()
            })
            .map(|s| (s.base_offset, s.next_offset()))
    }

    /// Replaces the sealed segment starting at `base_offset` with `batches`: RecordBatch v2
    /// batches end to end holding exactly the segment's offsets. Refused, changing nothing,
    /// when no sealed segment starts there or the batches are not exactly its records.
    pub fn replace_sealed_segment(
        &self,
        base_offset: u64,
        batches: &[u8],
    ) -> Result<RepairOutcome, LogError> {
        let shared = self.shared();
        let cfg = shared.config.read().clone();
        let shard = shared.shard.as_str();
        let _maintenance = shared.maintenance.lock();
        let old = shared
            .segments
            .read()
            .iter()
            .find(|s| s.base_offset == base_offset && s.sealed.load(Ordering::Acquire))
            .cloned()
            .ok_or(LogError::OffsetOutOfRange {
                requested: base_offset,
                first: self.first_offset(),
                next: self.next_offset(),
            })?;

        let tmp = shared.dir.join(format!(
            "{}{REPAIR_SUFFIX}",
            crate::segment::log_file_name(base_offset).trim_end_matches(".log")
        ));
        let candidate = (|| {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .map_err(|e| io_err(shard, "create repaired segment", &tmp, e))?;
            file.write_all(batches)
                .map_err(|e| io_err(shard, "write repaired segment", &tmp, e))?;
            file.sync_all()
                .map_err(|e| io_err(shard, "sync repaired segment", &tmp, e))?;
            let seg = Segment::new(base_offset, tmp.clone(), file);
            // The same checks a sealed segment without its index gets at recovery: CRC of
            // every batch and dense offsets from the base.
            scan(&seg, batches.len() as u64, &cfg).map_err(|e| match e {
                LogError::Corrupt { source, .. } => LogError::InvalidBatch(source),
                other => other,
            })?;
            if seg.size() != batches.len() as u64 {
                return Err(LogError::InvalidBatch(WireError::Inconsistent(
                    "the replacement has bytes after its last whole batch",
                )));
            }
            if seg.next_offset() != old.next_offset() {
                return Err(LogError::InvalidBatch(WireError::Inconsistent(
                    "the replacement does not end where the damaged segment ends",
                )));
            }
            Ok(seg)
        })();
        let mut seg = match candidate {
            Ok(seg) => seg,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };

        seg.sealed.store(true, Ordering::Release);
        // Odd while the segment list and the files change: blocks read meanwhile are not
        // cached under the epoch that follows.
        shared.truncations.fetch_add(1, Ordering::AcqRel);
        // The old index goes first: a crash before the new one is written leaves a sealed
        // segment without an index, which the next open scans in full (and so checks
        // whichever file it finds), never one described by the other file's index.
        let index = shared
            .dir
            .join(crate::segment::index_file_name(base_offset));
        let renamed = (|| {
            match std::fs::remove_file(&index) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(shard, "remove segment index", &index, e)),
            }
            sync_dir(&shared.dir)
                .map_err(|e| io_err(shard, "sync log directory", &shared.dir, e))?;
            std::fs::rename(&tmp, &old.path)
                .map_err(|e| io_err(shard, "rename repaired segment", &old.path, e))
        })();
        if let Err(e) = renamed {
            let _ = std::fs::remove_file(&tmp);
            shared.truncations.fetch_add(1, Ordering::AcqRel);
            return Err(e);
        }
        seg.path = old.path.clone();
        // The file on disk is the new one from here: the list follows it whatever happens
        // to the index (a missing index is rebuilt at the next open).
        let indexed = write_index_file(&shared.dir, &seg)
            .map_err(|e| io_err(shard, "write segment index", &seg.path, e))
            .and_then(|()| {
                sync_dir(&shared.dir)
                    .map_err(|e| io_err(shard, "sync log directory", &shared.dir, e))
            });
        let outcome = RepairOutcome {
            base_offset,
            next_offset: seg.next_offset(),
            old_bytes: old.size(),
            new_bytes: seg.size(),
        };
        {
            let mut segs = shared.segments.write();
            if let Some(slot) = segs.iter_mut().find(|s| s.base_offset == base_offset) {
                *slot = Arc::new(seg);
            }
        }
        shared.truncations.fetch_add(1, Ordering::AcqRel);
        indexed?;
        tracing::info!(
            shard,
            base = base_offset,
            next = outcome.next_offset,
            old_bytes = outcome.old_bytes,
            new_bytes = outcome.new_bytes,
            "replaced a damaged sealed segment with a verified copy"
        );
        Ok(outcome)
    }
}
