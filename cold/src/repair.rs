//! Rewriting a damaged local segment from the object store's copy of its records.
//!
//! A tiered read that meets a damaged local segment serves the range from the object
//! store instead (see [`TieredShard::read`]); this puts the local file right, so the next
//! reader of the hot tail reads it locally and the log verifies whole again. Only a segment
//! whose every record was uploaded can be rewritten this way; the copy is the objects'
//! rebuilt batches, checked twice before it replaces anything: against each row group's
//! content digest as it is decoded, and by the log as a whole segment (CRC of every batch,
//! dense offsets from the segment's base to its end).

use felix_hot::RepairOutcome;

use crate::error::ColdError;
use crate::tiered::TieredShard;

/// The most bytes asked of one cold read while a segment's copy is gathered.
const READ_BYTES: usize = 4 << 20;

impl TieredShard {
    /// Rewrites the sealed local segment starting at `base_offset` from the object store.
    /// `Ok(None)` when there is nothing this can repair: no sealed segment starts there, or
    /// part of it was never uploaded (then only a replica has its records).
    pub async fn repair_from_objects(
        &self,
        base_offset: u64,
    ) -> Result<Option<RepairOutcome>, ColdError> {
        let Some((base, next)) = self.log.sealed_segment_range(base_offset) else {
            return Ok(None);
        };
        if base != base_offset || self.manifest.uploaded_end() < next {
            return Ok(None);
        }
        let mut copy = Vec::new();
        let mut pos = base;
        while pos < next {
            let read = self.read_cold(pos, READ_BYTES, Some(next)).await?;
            if read.next_offset <= pos {
                return Err(ColdError::Inconsistent(format!(
                    "shard {}: the object store's copy of offsets [{base}, {next}) stops at {pos}",
                    self.key
                )));
            }
            copy.extend_from_slice(&read.batches);
            pos = read.next_offset;
        }
        // Writing and syncing a whole segment blocks: off the async workers.
        let log = self.log.clone();
        let outcome = tokio::task::spawn_blocking(move || log.replace_sealed_segment(base, &copy))
            .await
            .map_err(|e| ColdError::Inconsistent(format!("segment repair task failed: {e}")))??;
        Ok(Some(outcome))
    }
}
