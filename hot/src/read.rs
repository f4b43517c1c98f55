//! Reading a shard's log: what a reader may see, and how a read finds its place.
//!
//! Decides the read bound and the read's unit. A read returns whole batches, exactly as
//! stored, in offset order, starting with the batch that holds the requested offset; it never
//! returns a record at or past the committed end, nor past a caller's bound (a quorum mark).
//! Every batch returned has passed its CRC check, and offsets are dense across what a read
//! returns: a base offset changed on disk (it is outside the batch CRC) is caught against the
//! chain of offsets anchored at a checksummed index entry, and reported as corruption with
//! its place.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use felix_wire::batch::{BATCH_HEADER_LEN, LOG_OVERHEAD};
use felix_wire::{BatchHeader, WireError};

use crate::error::LogError;
use crate::log::ShardLog;
use crate::segment::Segment;

/// Chunk size for reads that scan forward from an index entry.
const READ_CHUNK: usize = 1024 * 1024;
/// The least a read prefetches beyond what it returns.
pub(crate) const PREFETCH_MIN: u64 = 1024 * 1024;

/// What a read returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogRead {
    /// Whole batches, exactly as stored, in offset order. Empty if nothing is readable yet.
    pub batches: Vec<u8>,
    /// The offset to read next (one past the last returned record, or the requested offset).
    pub next_offset: u64,
    /// One past the last offset the read was allowed to see (committed end or upper bound).
    pub visible_end: u64,
}

/// What [`ShardLog::read_view`] holds for a read.
pub(crate) struct ReadView<'a> {
    pub segs: parking_lot::RwLockReadGuard<'a, Vec<Arc<Segment>>>,
    pub visible_end: u64,
    pub max_batch: usize,
}

/// How reading one segment ended.
enum SegmentRead {
    /// Every readable batch of the segment was taken: continue with the next segment.
    Exhausted,
    /// The read is complete (byte budget reached, or the visible end).
    Full,
}

/// Appends to `out` the whole batches of `seg` from the one holding `out.next_offset`,
/// within `max_bytes` (at least one batch) and below `out.visible_end`. Bytes are read from
/// the file straight into the output buffer: a sequential reader costs one `pread` per
/// call and one copy (kernel to user), not a staging buffer per chunk.
fn read_segment_into(
    seg: &Segment,
    out: &mut LogRead,
    max_bytes: usize,
    max_batch: usize,
    shard: &str,
) -> Result<SegmentRead, LogError> {
    let end = seg.size();
    let Some(mut position) = batch_position(seg, out.next_offset, end, max_batch, shard)? else {
        return Ok(SegmentRead::Exhausted);
    };
    while position < end {
        let base = out.batches.len();
        let room = max_bytes.saturating_sub(base);
        if room == 0 {
            return Ok(SegmentRead::Full);
        }
        let len = (room.max(LOG_OVERHEAD) as u64).min(end - position) as usize;
        seg.read_append(position, len, &mut out.batches, shard)?;
        // A reader that asked for this much will likely ask for what follows next.
        seg.prefetch(position + len as u64, (len as u64).max(PREFETCH_MIN) * 2);
        let mut at = base;
        while at < out.batches.len() {
            match BatchHeader::validate(&out.batches[at..], max_batch) {
                Ok((h, _)) if !continues(&h, at, out.next_offset) => {
                    out.batches.truncate(at);
                    return Err(discontiguous(seg, shard, position + (at - base) as u64));
                }
                Ok((h, blen)) => {
                    let last = h.last_offset() as u64;
                    if last >= out.visible_end {
                        out.batches.truncate(at);
                        return Ok(SegmentRead::Full);
                    }
                    out.next_offset = last + 1;
                    at += blen;
                }
                Err(WireError::Truncated { needed, .. })
                    if position + (at - base) as u64 + needed as u64 <= end =>
                {
                    if at > 0 {
                        // The budget ends inside this batch: stop before it.
                        out.batches.truncate(at);
                        return Ok(SegmentRead::Full);
                    }
                    // The first batch alone exceeds the budget: it is returned whole.
                    let total = BatchHeader::peek_total_len(&out.batches[at..], max_batch)
                        .map_err(|e| seg.corrupt(shard, position, e))?;
                    out.batches.resize(total, 0);
                    seg.read_into(position, &mut out.batches[..], shard)?;
                }
                Err(e) => {
                    out.batches.truncate(at);
                    return Err(seg.corrupt(shard, position + (at - base) as u64, e));
                }
            }
        }
        position += (at - base) as u64;
    }
    Ok(SegmentRead::Exhausted)
}

/// Checks that a batch read at `at` (bytes into the read's output) continues the read:
/// the first batch of a read holds `next` (its base is at or below it), every later one
/// starts exactly at `next`. Offsets are dense, and the base offset is not covered by the
/// batch CRC, so this is the only check that catches a changed one.
pub(crate) fn continues(h: &BatchHeader, at: usize, next: u64) -> bool {
    h.base_offset >= 0
        && if at == 0 {
            h.base_offset as u64 <= next
        } else {
            h.base_offset as u64 == next
        }
}

pub(crate) fn discontiguous(seg: &Segment, shard: &str, position: u64) -> LogError {
    seg.corrupt(
        shard,
        position,
        WireError::Inconsistent(crate::recovery::DISCONTIGUOUS),
    )
}

/// The position in `seg` (below `end`) of the batch holding `offset`, or `None` if no batch
/// there reaches it. The sparse index lands at most one index interval (plus a batch) before
/// it, so this hops over headers only; callers fully check the batches they keep.
pub(crate) fn batch_position(
    seg: &Segment,
    offset: u64,
    end: u64,
    max_batch: usize,
    shard: &str,
) -> Result<Option<u64>, LogError> {
    // The index entry is checksummed: it anchors the chain of base offsets hopped over, so
    // a header whose base offset was changed on disk (it is outside the batch CRC) is
    // caught here instead of misplacing the read.
    let (mut position, mut expect) = seg
        .index
        .read()
        .anchor_for(offset)
        .map_or((0, seg.base_offset), |e| (e.position, e.offset));
    let mut header = [0u8; BATCH_HEADER_LEN];
    loop {
        if position >= end {
            return Ok(None);
        }
        if end - position < BATCH_HEADER_LEN as u64 {
            return Err(seg.corrupt(
                shard,
                position,
                WireError::Truncated {
                    needed: BATCH_HEADER_LEN,
                    available: (end - position) as usize,
                },
            ));
        }
        seg.read_into(position, &mut header, shard)?;
        let h = BatchHeader::parse(&header).map_err(|e| seg.corrupt(shard, position, e))?;
        let total = BatchHeader::peek_total_len(&header, max_batch)
            .map_err(|e| seg.corrupt(shard, position, e))?;
        if h.base_offset < 0 || h.base_offset as u64 != expect {
            return Err(discontiguous(seg, shard, position));
        }
        if h.last_offset() as u64 >= offset {
            return Ok(Some(position));
        }
        expect = h.last_offset() as u64 + 1;
        position += total as u64;
    }
}

impl ShardLog {
    /// Reads whole batches starting with the one that holds `from_offset`, as stored, up to
    /// about `max_bytes` (at least one batch if any is readable), never past the committed
    /// end nor past `upper_bound` (exclusive; e.g. a quorum mark). Crosses segment
    /// boundaries. Every batch returned has passed its CRC check; a read that meets a damaged
    /// batch returns the batches before it, and one that starts at it fails with `Corrupt`.
    pub fn read(
        &self,
        from_offset: u64,
        max_bytes: usize,
        upper_bound: Option<u64>,
    ) -> Result<LogRead, LogError> {
        let ReadView {
            segs,
            visible_end,
            max_batch,
        } = self.read_view(from_offset, upper_bound)?;
        let shared = self.shared();
        let mut out = LogRead {
            batches: Vec::new(),
            next_offset: from_offset,
            visible_end,
        };
        if from_offset >= visible_end {
            return Ok(out);
        }
        let start = segs
            .partition_point(|s| s.base_offset <= from_offset)
            .saturating_sub(1);
        out.batches.reserve(max_bytes.min(READ_CHUNK * 16));
        for seg in &segs[start..] {
            match read_segment_into(seg, &mut out, max_bytes, max_batch, &shared.shard) {
                Ok(SegmentRead::Exhausted) => continue,
                Ok(SegmentRead::Full) => break,
                // Damage after the batches gathered so far: return those; the next read
                // starts at the damaged batch and reports it with its place.
                Err(LogError::Corrupt { .. }) if !out.batches.is_empty() => break,
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The segments a read works on (held for it) and its bounds, once `from_offset` is
    /// known to lie within the log: `OffsetOutOfRange` below the first offset or past the
    /// committed end.
    pub(crate) fn read_view(
        &self,
        from_offset: u64,
        upper_bound: Option<u64>,
    ) -> Result<ReadView<'_>, LogError> {
        let shared = self.shared();
        let committed = shared.committed_end.load(Ordering::Acquire);
        let max_batch = shared.config.read().max_batch_bytes;
        let segs = shared.segments.read();
        let first = segs.first().map_or(0, |s| s.base_offset);
        if from_offset < first || from_offset > committed {
            return Err(LogError::OffsetOutOfRange {
                requested: from_offset,
                first,
                next: committed,
            });
        }
        Ok(ReadView {
            segs,
            visible_end: upper_bound.map_or(committed, |b| b.min(committed)),
            max_batch,
        })
    }

    /// The base offset of the first batch holding a record with a timestamp at or after
    /// `timestamp_ms` (by the batch's max timestamp), among committed records; `None` if
    /// there is none yet.
    pub fn offset_for_time(&self, timestamp_ms: i64) -> Result<Option<u64>, LogError> {
        let shared = self.shared();
        let committed = shared.committed_end.load(Ordering::Acquire);
        let max_batch = shared.config.read().max_batch_bytes;
        let segs = shared.segments.read();
        for seg in segs.iter() {
            if seg.max_timestamp.load(Ordering::Relaxed) < timestamp_ms {
                continue;
            }
            let position = seg.index.read().position_for_time(timestamp_ms);
            let mut found = None;
            seg.walk(
                position,
                seg.size(),
                READ_CHUNK,
                max_batch,
                &shared.shard,
                |h, _, _| {
                    if h.max_timestamp >= timestamp_ms {
                        found = Some(h.base_offset as u64);
                        return false;
                    }
                    true
                },
            )?;
            if let Some(off) = found {
                return Ok((off < committed).then_some(off));
            }
        }
        Ok(None)
    }

    /// Reads like [`ShardLog::read`], starting at the first batch with a record at or after
    /// `timestamp_ms`. Returns an empty read positioned at the committed end if none is.
    pub fn read_from_time(
        &self,
        timestamp_ms: i64,
        max_bytes: usize,
        upper_bound: Option<u64>,
    ) -> Result<LogRead, LogError> {
        match self.offset_for_time(timestamp_ms)? {
            Some(offset) => self.read(offset, max_bytes, upper_bound),
            None => {
                let end = self.committed_offset();
                Ok(LogRead {
                    batches: Vec::new(),
                    next_offset: end,
                    visible_end: upper_bound.map_or(end, |b| b.min(end)),
                })
            }
        }
    }

    /// Checks every stored batch of every segment (CRC, framing, offset order) and returns
    /// the number of batches checked, or the first corruption with its place.
    pub fn verify(&self) -> Result<u64, LogError> {
        let shared = self.shared();
        let max_batch = shared.config.read().max_batch_bytes;
        let segs: Vec<Arc<Segment>> = shared.segments.read().clone();
        let mut count = 0u64;
        let mut expect = segs.first().map_or(0, |s| s.base_offset);
        for seg in segs {
            let mut bad = None;
            seg.walk(
                0,
                seg.size(),
                1 << 20,
                max_batch,
                &shared.shard,
                |h, pos, _| {
                    if h.base_offset < 0 || h.base_offset as u64 != expect {
                        bad = Some(pos);
                        return false;
                    }
                    expect = h.last_offset() as u64 + 1;
                    count += 1;
                    true
                },
            )?;
            if let Some(position) = bad {
                return Err(LogError::Corrupt {
                    shard: shared.shard.clone(),
                    segment: seg.path.clone(),
                    position,
                    source: felix_wire::WireError::Inconsistent(crate::recovery::DISCONTIGUOUS),
                });
            }
        }
        Ok(count)
    }
}
