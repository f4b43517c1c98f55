//! Reads that readers share: history cut into blocks at fixed file positions.
//!
//! Decides what a shared read returns and when a block may be kept in a [`ReadCache`]. A
//! block starts with the batch that holds its first offset and takes the batches that start
//! before the next multiple of [`READ_BLOCK_BYTES`]; so readers that start anywhere fall into
//! step after their first read and ask for the same blocks. A block is kept only if it is
//! complete (any reader starting there would read exactly these bytes) and no truncation
//! began or ended while it was read; it is served only under the truncation epoch it was
//! read in, and never past the reader's visible end.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use felix_wire::{BatchHeader, WireError};

use crate::error::LogError;
use crate::log::ShardLog;
use crate::read::{LogRead, PREFETCH_MIN, ReadView, batch_position, continues, discontiguous};
use crate::read_cache::{Block, READ_BLOCK_BYTES, ReadCache};
use crate::segment::Segment;

/// What [`ShardLog::read_shared`] returned: as [`LogRead`], the batches as shared bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedRead {
    /// Whole batches, exactly as stored, in offset order. Empty if nothing is readable yet.
    pub batches: bytes::Bytes,
    /// The offset to read next (one past the last returned record, or the requested offset).
    pub next_offset: u64,
}

impl From<LogRead> for SharedRead {
    fn from(read: LogRead) -> SharedRead {
        SharedRead {
            batches: bytes::Bytes::from(read.batches),
            next_offset: read.next_offset,
        }
    }
}

/// Reads the batches of `seg` that start in `[position, mark)` (`mark` the next multiple of
/// [`READ_BLOCK_BYTES`] after `position`) into `out`, stopping early at `out.visible_end` or before a
/// batch that would take the read past `max_bytes`. Returns whether the block is complete:
/// it reached the mark or the end of a sealed segment, so any reader starting at `position`
/// would read exactly these bytes.
fn read_block_into(
    seg: &Segment,
    sealed: bool,
    position: u64,
    out: &mut LogRead,
    max_bytes: usize,
    max_batch: usize,
    shard: &str,
) -> Result<bool, LogError> {
    let end = seg.size();
    let mark = (position / READ_BLOCK_BYTES + 1) * READ_BLOCK_BYTES;
    let stop = mark.min(end);
    seg.read_append(
        position,
        (stop - position) as usize,
        &mut out.batches,
        shard,
    )?;
    seg.prefetch(stop, PREFETCH_MIN);
    let mut at = 0usize;
    while at < out.batches.len() {
        match BatchHeader::validate(&out.batches[at..], max_batch) {
            Ok((h, _)) if !continues(&h, at, out.next_offset) => {
                out.batches.truncate(at);
                return Err(discontiguous(seg, shard, position + at as u64));
            }
            Ok((h, blen)) => {
                let last = h.last_offset() as u64;
                if last >= out.visible_end {
                    out.batches.truncate(at);
                    return Ok(false);
                }
                out.next_offset = last + 1;
                at += blen;
            }
            // The last batch starts before the mark and ends after it: read its rest.
            Err(WireError::Truncated { needed, .. }) if position + (at + needed) as u64 <= end => {
                if at > 0 && at + needed > max_bytes {
                    out.batches.truncate(at);
                    return Ok(false);
                }
                let have = (out.batches.len() - at) as u64;
                let from = position + at as u64 + have;
                seg.read_append(from, needed - have as usize, &mut out.batches, shard)?;
            }
            Err(WireError::Truncated { .. }) => {
                // A batch the writer has not finished: nothing past here is committed.
                out.batches.truncate(at);
                return Ok(false);
            }
            Err(e) => {
                out.batches.truncate(at);
                return Err(seg.corrupt(shard, position + at as u64, e));
            }
        }
    }
    Ok(stop == mark || sealed)
}

impl ShardLog {
    /// [`ShardLog::read`] for readers that may share what they read (subscribers catching
    /// up): history is read in blocks at fixed file positions
    /// ([`READ_BLOCK_BYTES`]), and a block another reader read recently is served from
    /// `cache` without touching the file. Same guarantees as `read`: whole batches that
    /// passed their CRC check (when they were read from the file), never past the committed
    /// end nor `upper_bound`, `OffsetOutOfRange` below the first offset. A read takes whole
    /// blocks while `max_bytes` leaves room for another (one block is returned without a
    /// copy); `max_bytes` below two blocks, or a cache of capacity 0, reads as `read` does.
    pub fn read_shared(
        &self,
        cache: &ReadCache,
        from_offset: u64,
        max_bytes: usize,
        upper_bound: Option<u64>,
    ) -> Result<SharedRead, LogError> {
        let plain = || {
            self.read(from_offset, max_bytes, upper_bound)
                .map(SharedRead::from)
        };
        if cache.capacity() == 0 || (max_bytes as u64) < 2 * READ_BLOCK_BYTES {
            return plain();
        }
        let shared = self.shared();
        let epoch = shared.truncations.load(Ordering::Acquire);
        if epoch % 2 == 1 {
            return plain(); // a truncation is under way
        }
        let ReadView {
            segs,
            visible_end,
            max_batch,
        } = self.read_view(from_offset, upper_bound)?;
        if from_offset >= visible_end {
            return Ok(SharedRead {
                batches: bytes::Bytes::new(),
                next_offset: from_offset,
            });
        }
        // Block after block while the budget has room for another: a subscriber's share
        // (256 KiB) takes one, and hands it on without a copy; a Kafka fetch of 1 MiB takes
        // several, joined into one buffer.
        let mut parts: Vec<bytes::Bytes> = Vec::new();
        let mut taken = 0usize;
        let mut next = from_offset;
        loop {
            let budget = max_bytes - taken;
            let Some((block, complete)) = self.block_at(
                cache,
                &segs,
                epoch,
                next,
                visible_end,
                budget,
                parts.is_empty(),
                max_batch,
            )?
            else {
                break;
            };
            taken += block.batches.len();
            next = block.next_offset;
            parts.push(block.batches);
            if !complete
                || next >= visible_end
                || max_bytes.saturating_sub(taken) < 2 * READ_BLOCK_BYTES as usize
            {
                break;
            }
        }
        drop(segs);
        if parts.is_empty() {
            return plain(); // the offset lies past its segment's batches (a gap)
        }
        let batches = if parts.len() == 1 {
            parts.pop().unwrap_or_default()
        } else {
            let mut joined = bytes::BytesMut::with_capacity(taken);
            for part in &parts {
                joined.extend_from_slice(part);
            }
            joined.freeze()
        };
        Ok(SharedRead {
            batches,
            next_offset: next,
        })
    }

    /// The block of history starting with the batch that holds `from`: from `cache` if a
    /// reader has read it since the last truncation, else from the file (and kept in `cache`
    /// if it is complete). `None` if `from` lies past its segment's batches or, unless
    /// `first`, if the block's first batch alone exceeds `budget`. With the block comes
    /// whether it is complete (a reader may continue with the next one).
    #[allow(clippy::too_many_arguments)]
    fn block_at(
        &self,
        cache: &ReadCache,
        segs: &[Arc<Segment>],
        epoch: u64,
        from: u64,
        visible_end: u64,
        budget: usize,
        first: bool,
        max_batch: usize,
    ) -> Result<Option<(Block, bool)>, LogError> {
        let shared = self.shared();
        let key = (shared.id, epoch, from);
        if let Some(block) = cache.get(&key)
            && block.next_offset <= visible_end
            && (first || block.batches.len() <= budget)
        {
            return Ok(Some((block, true)));
        }
        let idx = segs
            .partition_point(|s| s.base_offset <= from)
            .saturating_sub(1);
        let seg = &segs[idx];
        let sealed = idx + 1 < segs.len();
        let Some(position) = batch_position(seg, from, seg.size(), max_batch, &shared.shard)?
        else {
            return Ok(None);
        };
        let mut out = LogRead {
            batches: Vec::new(),
            next_offset: from,
            visible_end,
        };
        let complete = read_block_into(
            seg,
            sealed,
            position,
            &mut out,
            budget,
            max_batch,
            &shared.shard,
        )?;
        if out.batches.is_empty() || (!first && out.batches.len() > budget) {
            return Ok(None);
        }
        let block = Block {
            batches: bytes::Bytes::from(out.batches),
            next_offset: out.next_offset,
        };
        // Kept only if no truncation began or ended while it was read.
        if complete && shared.truncations.load(Ordering::Acquire) == epoch {
            cache.insert(key, block.clone());
        }
        Ok(Some((block, complete)))
    }
}
