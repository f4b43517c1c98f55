//! Opening a shard's log after a clean stop or a crash.
//!
//! Decides what on disk is trusted:
//! * a sealed segment (every segment but the last, and the last if its index file matches
//!   it) is trusted through its checksummed index file; a missing or damaged index is
//!   rebuilt by scanning the segment, and corruption found while scanning a sealed segment
//!   stops the open with an error naming the shard, file and byte position;
//! * the active segment is scanned batch by batch, and everything from the first torn or
//!   corrupt batch on is cut off: those bytes were never covered by a completed write (an
//!   acknowledged append under `on_commit` was flushed before its acknowledgement, so it is
//!   always before the cut).

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use felix_wire::WireError;
use felix_wire::batch::LOG_OVERHEAD;
use tracing::{info, warn};

use crate::config::LogConfig;
use crate::error::LogError;
use crate::segment::{Segment, SparseIndex, io_err, read_index_file, sync_dir, write_index_file};

/// What recovery found.
pub(crate) struct Recovered {
    pub segments: Vec<Arc<Segment>>,
    /// One past the last offset in the log.
    pub next_offset: u64,
    /// The highest partition leader epoch (generation) of the last batch, or -1.
    pub last_generation: i32,
}

/// Why a batch whose checksum holds is refused: its base offset is not one past the last
/// offset of the batch before it (offsets in a shard's log are dense).
pub(crate) const DISCONTIGUOUS: &str = "batch does not continue the offsets before it";

/// Chunk size for scanning segments.
const SCAN_CHUNK: usize = 1 << 20;

pub(crate) fn open_segments(dir: &Path, cfg: &LogConfig) -> Result<Recovered, LogError> {
    let shard = cfg.shard.as_str();
    std::fs::create_dir_all(dir).map_err(|e| io_err(shard, "create log directory", dir, e))?;
    let mut bases = Vec::new();
    let entries =
        std::fs::read_dir(dir).map_err(|e| io_err(shard, "list log directory", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_err(shard, "list log directory", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(stem) = name.strip_suffix(".log") {
            if stem.len() == 20
                && let Ok(base) = stem.parse::<u64>()
            {
                bases.push(base);
            }
        } else if name.ends_with(".index.tmp") || name.ends_with(crate::repair::REPAIR_SUFFIX) {
            // An index write or a segment repair interrupted by a crash; the segment's index
            // is rebuilt if needed, and a repair not renamed into place never happened.
            let _ = std::fs::remove_file(entry.path());
        }
    }
    bases.sort_unstable();

    let mut segments: Vec<Arc<Segment>> = Vec::with_capacity(bases.len() + 1);
    let count = bases.len();
    for (i, &base) in bases.iter().enumerate() {
        let is_last = i + 1 == count;
        let seg = open_one(dir, base, is_last, cfg)?;
        // Offsets are dense: each segment starts where the one before it ends. A gap means
        // records were lost from the end of the segment before (e.g. a file cut short whose
        // index was lost too), an overlap that two segments claim the same offsets.
        if let Some(prev) = segments.last()
            && seg.base_offset != prev.next_offset()
        {
            let why = if seg.base_offset < prev.next_offset() {
                "segment overlaps the offsets of the one before it"
            } else {
                "segment does not start where the one before it ends: records are missing"
            };
            return Err(LogError::Corrupt {
                shard: shard.to_owned(),
                segment: seg.path.clone(),
                position: 0,
                source: WireError::Inconsistent(why),
            });
        }
        segments.push(Arc::new(seg));
    }
    // Remove index files whose segment is gone (a crash between deleting the two files).
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".index")) else {
                continue;
            };
            if stem.parse::<u64>().is_ok_and(|b| !bases.contains(&b)) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    let mut next_offset = segments.last().map_or(0, |s| s.next_offset());
    if next_offset < cfg.start_offset {
        // Every local record lies below the start the caller gave (it holds them elsewhere):
        // drop the local copy and continue the shard's offsets from there.
        for seg in segments.drain(..) {
            std::fs::remove_file(&seg.path).map_err(|e| {
                io_err(shard, "delete segment below the start offset", &seg.path, e)
            })?;
            let _ =
                std::fs::remove_file(dir.join(crate::segment::index_file_name(seg.base_offset)));
        }
        tracing::info!(
            shard,
            local_end = next_offset,
            start = cfg.start_offset,
            "local log ends below the start offset; continuing from the start offset"
        );
        next_offset = cfg.start_offset;
    }
    let last_generation = match segments.iter().rev().find(|s| !s.is_empty()) {
        Some(s) => last_batch_generation(s, cfg)?,
        None => -1,
    };
    // The last segment stays open for appends unless it was sealed; then a new one starts.
    if segments
        .last()
        .is_none_or(|s| s.sealed.load(Ordering::Acquire))
    {
        let seg = Segment::create(dir, next_offset, shard)?;
        sync_dir(dir).map_err(|e| io_err(shard, "sync log directory", dir, e))?;
        segments.push(Arc::new(seg));
    }
    Ok(Recovered {
        segments,
        next_offset,
        last_generation,
    })
}

fn open_one(dir: &Path, base: u64, is_last: bool, cfg: &LogConfig) -> Result<Segment, LogError> {
    let shard = cfg.shard.as_str();
    let path = dir.join(crate::segment::log_file_name(base));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| io_err(shard, "open segment", &path, e))?;
    let len = file
        .metadata()
        .map_err(|e| io_err(shard, "stat segment", &path, e))?
        .len();
    let seg = Segment::new(base, path, file);

    if let Some(loaded) = read_index_file(dir, base, len) {
        if loaded.size > len {
            // Sealed at `loaded.size`, cut short since: the records past the cut are lost,
            // which is corruption, never a shorter segment. The scan names the torn batch
            // when the cut is inside one; a cut on a batch boundary is named by its place.
            scan(&seg, len, cfg)?;
            return Err(seg.corrupt(
                shard,
                len,
                WireError::Truncated {
                    needed: loaded.size as usize,
                    available: len as usize,
                },
            ));
        }
        seg.size.store(loaded.size, Ordering::Release);
        seg.next_offset.store(loaded.next_offset, Ordering::Release);
        seg.min_timestamp
            .store(loaded.min_timestamp, Ordering::Relaxed);
        seg.max_timestamp
            .store(loaded.max_timestamp, Ordering::Relaxed);
        *seg.index.write() = loaded.index;
        seg.sealed.store(true, Ordering::Release);
        return Ok(seg);
    }

    if !is_last {
        // Sealed but its index is missing or stale: the data was flushed before the index
        // was written, so a full scan must succeed; anything else is corruption.
        scan(&seg, len, cfg)?;
        seg.sealed.store(true, Ordering::Release);
        write_index_file(dir, &seg)
            .map_err(|e| io_err(shard, "write segment index", &seg.path, e))?;
        sync_dir(dir).map_err(|e| io_err(shard, "sync log directory", dir, e))?;
        info!(shard, segment = %seg.path.display(), "rebuilt missing segment index");
        return Ok(seg);
    }

    // The active segment: keep the longest valid prefix.
    let _ = std::fs::remove_file(dir.join(crate::segment::index_file_name(base)));
    let valid = scan_prefix(&seg, len, cfg)?;
    if valid < len {
        warn!(
            shard,
            segment = %seg.path.display(),
            valid_bytes = valid,
            cut_bytes = len - valid,
            "cutting a torn or corrupt tail off the active segment"
        );
        seg.file
            .set_len(valid)
            .map_err(|e| io_err(shard, "truncate torn tail", &seg.path, e))?;
        seg.file
            .sync_all()
            .map_err(|e| io_err(shard, "sync segment", &seg.path, e))?;
    }
    Ok(seg)
}

/// Scans a sealed segment completely; any invalid batch is corruption.
pub(crate) fn scan(seg: &Segment, len: u64, cfg: &LogConfig) -> Result<(), LogError> {
    let mut expect = seg.base_offset;
    let mut err = None;
    let end = seg.walk(
        0,
        len,
        SCAN_CHUNK,
        cfg.max_batch_bytes,
        &cfg.shard,
        |h, pos, bytes| {
            if h.base_offset < 0 || h.base_offset as u64 != expect {
                err = Some(pos);
                return false;
            }
            seg.note_appended(h, pos, bytes.len() as u64, cfg.index_interval_bytes);
            expect = h.last_offset() as u64 + 1;
            true
        },
    )?;
    if let Some(position) = err {
        return Err(LogError::Corrupt {
            shard: cfg.shard.clone(),
            segment: seg.path.clone(),
            position,
            source: WireError::Inconsistent(DISCONTIGUOUS),
        });
    }
    seg.size.store(end, Ordering::Release);
    Ok(())
}

/// Scans the active segment and returns the length of its longest valid prefix, noting
/// every valid batch in the segment's bookkeeping.
fn scan_prefix(seg: &Segment, len: u64, cfg: &LogConfig) -> Result<u64, LogError> {
    let shard = cfg.shard.as_str();
    let mut index = SparseIndex::default();
    let mut position = 0u64;
    let mut expect = seg.base_offset;
    let mut max_ts = i64::MIN;
    while position < len {
        let want = SCAN_CHUNK.min((len - position) as usize);
        let buf = seg.read_exact_at(position, want, shard)?;
        let mut at = 0usize;
        // Set at the first torn or invalid batch: the valid prefix ends at `position + at`.
        let mut torn = false;
        while at < buf.len() {
            let rest = &buf[at..];
            let total = match felix_wire::BatchHeader::peek_total_len(rest, cfg.max_batch_bytes) {
                Ok(t) => t,
                Err(WireError::Truncated { .. })
                    if position + (at as u64) + (LOG_OVERHEAD as u64) <= len =>
                {
                    break; // header straddles the chunk: re-read
                }
                Err(_) => {
                    torn = true;
                    break;
                }
            };
            let batch: std::borrow::Cow<[u8]> = if rest.len() >= total {
                std::borrow::Cow::Borrowed(&rest[..total])
            } else if position + at as u64 + total as u64 <= len {
                if at > 0 {
                    break; // re-read from this batch
                }
                std::borrow::Cow::Owned(seg.read_exact_at(position, total, shard)?)
            } else {
                torn = true; // the batch runs past the end of the file
                break;
            };
            let Ok((h, blen)) = felix_wire::BatchHeader::validate(&batch, cfg.max_batch_bytes)
            else {
                torn = true;
                break;
            };
            if h.base_offset < 0 || h.base_offset as u64 != expect {
                // Whole but misplaced (a stale batch left behind, or a base offset changed
                // on disk: it is outside the CRC). Nothing after it can be placed either;
                // it is cut with the rest of the tail, and the warning below names the cut.
                torn = true;
                break;
            }
            let pos = position + at as u64;
            index.note_batch(&h, pos, blen as u64, max_ts, cfg.index_interval_bytes);
            max_ts = max_ts.max(h.max_timestamp);
            seg.min_timestamp
                .fetch_min(h.base_timestamp.min(h.max_timestamp), Ordering::Relaxed);
            seg.max_timestamp
                .fetch_max(h.max_timestamp, Ordering::Relaxed);
            expect = h.last_offset() as u64 + 1;
            at += blen;
        }
        // Keep the whole batches of this chunk even when the tail after them is cut.
        position += at as u64;
        if torn || at == 0 {
            break;
        }
    }
    *seg.index.write() = index;
    seg.size.store(position, Ordering::Release);
    seg.next_offset.store(expect, Ordering::Release);
    Ok(position)
}

/// The generation (partition leader epoch) of the last batch in a non-empty segment.
fn last_batch_generation(seg: &Segment, cfg: &LogConfig) -> Result<i32, LogError> {
    let start = seg.index.read().offsets.last().map_or(0, |e| e.position);
    let mut generation = -1;
    seg.walk(
        start,
        seg.size(),
        SCAN_CHUNK,
        cfg.max_batch_bytes,
        &cfg.shard,
        |h, _, _| {
            generation = h.partition_leader_epoch;
            true
        },
    )?;
    Ok(generation)
}
