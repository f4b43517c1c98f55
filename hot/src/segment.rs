//! One segment file: Kafka RecordBatch v2 batches laid end to end, exactly as a producer sent
//! them with the offset and generation stamped (so Kafka's own tools can read the file).
//!
//! Invariants:
//! * `size` bytes from the start are whole, valid batches; readers never look past it.
//! * offsets only grow within a segment; gaps are allowed (control records, compaction).
//! * once sealed, the file never changes again, except that `truncate_after` may cut a sealed
//!   segment that was not uploaded (a follower or new leader dropping uncommitted records).
//!
//! The sparse offset and time indexes live in memory; a sealed segment also has them in a
//! checksummed `.index` file, so opening a log does not rescan sealed segments.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use felix_wire::batch::LOG_OVERHEAD;
use felix_wire::{BatchHeader, WireError};
use parking_lot::RwLock;

use crate::advice::Advised;
use crate::error::LogError;

/// Suffix of a repaired segment being written (`repair.rs`); recovery removes one left by
/// a crash.
pub(crate) const REPAIR_SUFFIX: &str = ".log.repair";

/// File name of the segment whose first offset is `base`.
pub(crate) fn log_file_name(base: u64) -> String {
    format!("{base:020}.log")
}
/// File name of the sealed index of the segment whose first offset is `base`.
pub(crate) fn index_file_name(base: u64) -> String {
    format!("{base:020}.index")
}

/// One entry of the sparse offset index: the batch starting at `offset` begins at `position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetEntry {
    pub offset: u64,
    pub position: u64,
}

/// One entry of the sparse time index: no batch before the one starting at `offset` has a
/// timestamp of `timestamp` or later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeEntry {
    pub timestamp: i64,
    pub offset: u64,
}

#[derive(Debug, Default)]
pub(crate) struct SparseIndex {
    pub offsets: Vec<OffsetEntry>,
    pub times: Vec<TimeEntry>,
    /// Bytes since the last offset entry / time entry.
    since_offset_entry: u64,
    since_time_entry: u64,
}

impl SparseIndex {
    /// Records a batch appended at `position`.
    pub fn note_batch(
        &mut self,
        h: &BatchHeader,
        position: u64,
        len: u64,
        max_ts_before: i64,
        interval: u64,
    ) {
        let offset = h.base_offset as u64;
        if self.offsets.is_empty() || self.since_offset_entry >= interval {
            self.offsets.push(OffsetEntry { offset, position });
            self.since_offset_entry = 0;
        }
        if h.max_timestamp > max_ts_before
            && (self.times.is_empty() || self.since_time_entry >= interval)
        {
            self.times.push(TimeEntry {
                timestamp: h.max_timestamp,
                offset,
            });
            self.since_time_entry = 0;
        }
        self.since_offset_entry += len;
        self.since_time_entry += len;
    }

    /// Position of the last indexed batch starting at or before `offset`.
    /// The indexed batch at or before `offset`: its position and base offset, or `None`
    /// when `offset` lies before the first entry (the scan then starts at position 0 with
    /// the segment's base offset).
    pub fn anchor_for(&self, offset: u64) -> Option<OffsetEntry> {
        let i = self.offsets.partition_point(|e| e.offset <= offset);
        (i > 0).then(|| self.offsets[i - 1])
    }

    pub fn position_for(&self, offset: u64) -> u64 {
        let i = self.offsets.partition_point(|e| e.offset <= offset);
        if i == 0 {
            0
        } else {
            self.offsets[i - 1].position
        }
    }

    /// Position to scan from to find the first batch with a timestamp at or after `ts`.
    pub fn position_for_time(&self, ts: i64) -> u64 {
        // Entries with timestamp < ts are all before the target; start at the last of them.
        let i = self.times.partition_point(|e| e.timestamp < ts);
        if i == 0 {
            0
        } else {
            self.position_for(self.times[i - 1].offset)
        }
    }
}

/// A summary of a sealed segment, as the tiering and replication code see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedSegment {
    /// First offset the segment may hold (its file name).
    pub base_offset: u64,
    /// Offset of its last record (inclusive).
    pub last_offset: u64,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Smallest and largest record timestamps (ms), from the batch headers.
    pub min_timestamp: i64,
    pub max_timestamp: i64,
    /// The segment file.
    pub path: PathBuf,
}

pub(crate) struct Segment {
    pub base_offset: u64,
    pub path: PathBuf,
    pub file: File,
    /// Bytes of whole batches in the file; readers never look past it.
    pub size: AtomicU64,
    /// One past the last offset written to this segment.
    pub next_offset: AtomicU64,
    pub min_timestamp: AtomicI64,
    pub max_timestamp: AtomicI64,
    pub index: RwLock<SparseIndex>,
    pub sealed: AtomicBool,
    /// What `prefetch` advised last (see `advice.rs`).
    advised: Advised,
}

impl Segment {
    /// Creates a new, empty segment file (the caller fsyncs the directory).
    pub fn create(dir: &Path, base_offset: u64, shard: &str) -> Result<Segment, LogError> {
        let path = dir.join(log_file_name(base_offset));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|source| io_err(shard, "create segment", &path, source))?;
        Ok(Segment::new(base_offset, path, file))
    }

    pub fn new(base_offset: u64, path: PathBuf, file: File) -> Segment {
        Segment {
            base_offset,
            path,
            file,
            size: AtomicU64::new(0),
            next_offset: AtomicU64::new(base_offset),
            min_timestamp: AtomicI64::new(i64::MAX),
            max_timestamp: AtomicI64::new(i64::MIN),
            index: RwLock::new(SparseIndex::default()),
            sealed: AtomicBool::new(false),
            advised: Advised::default(),
        }
    }

    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
    pub fn next_offset(&self) -> u64 {
        self.next_offset.load(Ordering::Acquire)
    }
    pub fn is_empty(&self) -> bool {
        self.size() == 0
    }

    /// Updates the in-memory bookkeeping after a batch was written at `position`.
    /// The caller publishes `size` after the bytes are in the file.
    pub fn note_appended(&self, h: &BatchHeader, position: u64, len: u64, interval: u64) {
        let before = self.max_timestamp.load(Ordering::Relaxed);
        self.index
            .write()
            .note_batch(h, position, len, before, interval);
        self.min_timestamp
            .fetch_min(h.base_timestamp.min(h.max_timestamp), Ordering::Relaxed);
        self.max_timestamp
            .fetch_max(h.max_timestamp, Ordering::Relaxed);
        self.next_offset
            .store(h.last_offset() as u64 + 1, Ordering::Release);
    }

    pub fn summary(&self) -> SealedSegment {
        let min = self.min_timestamp.load(Ordering::Relaxed);
        let max = self.max_timestamp.load(Ordering::Relaxed);
        SealedSegment {
            base_offset: self.base_offset,
            last_offset: self.next_offset().saturating_sub(1),
            size_bytes: self.size(),
            min_timestamp: if min == i64::MAX { -1 } else { min },
            max_timestamp: if max == i64::MIN { -1 } else { max },
            path: self.path.clone(),
        }
    }

    /// Reads `len` bytes at `position`, into a buffer that is not zeroed first (see
    /// [`Segment::read_append`]): group polls and Kafka share fetches read their records
    /// through here, and the zeroing was about 2% of the broker's samples under one
    /// share consumer.
    pub fn read_exact_at(
        &self,
        position: u64,
        len: usize,
        shard: &str,
    ) -> Result<Vec<u8>, LogError> {
        let mut buf = Vec::with_capacity(len);
        self.read_append(position, len, &mut buf, shard)?;
        Ok(buf)
    }

    /// A failed read of `len` bytes at `position`. Every read stays below the segment's
    /// size as recorded (by appends, or by the index of a sealed segment), so a file that
    /// ends first was cut short behind the log's back: corruption, not an I/O outage.
    fn read_failed(&self, shard: &str, position: u64, len: usize, e: std::io::Error) -> LogError {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            let on_disk = self.file.metadata().map_or(0, |m| m.len());
            return self.corrupt(
                shard,
                position,
                WireError::Truncated {
                    needed: len,
                    available: on_disk.saturating_sub(position) as usize,
                },
            );
        }
        io_err(shard, "read segment", &self.path, e)
    }

    /// Fills `buf` from `position`.
    pub fn read_into(&self, position: u64, buf: &mut [u8], shard: &str) -> Result<(), LogError> {
        self.file
            .read_exact_at(buf, position)
            .map_err(|source| self.read_failed(shard, position, buf.len(), source))
    }

    /// Appends the `len` bytes at `position` to `out`. The bytes are read straight into
    /// `out`'s spare capacity: a history read is a large buffer that the read overwrites
    /// entirely, and zero-filling it first cost as much CPU as the CRC check of what was
    /// read (profiled at ~4% of the broker under 10-way fanout).
    pub fn read_append(
        &self,
        position: u64,
        len: usize,
        out: &mut Vec<u8>,
        shard: &str,
    ) -> Result<(), LogError> {
        use std::os::fd::AsRawFd;
        out.reserve(len);
        let start = out.len();
        let mut done = 0usize;
        while done < len {
            let spare = &mut out.spare_capacity_mut()[done..len];
            // SAFETY: `spare` is writable memory of at least `spare.len()` bytes owned by
            // `out`; pread writes at most that many bytes into it.
            let n = unsafe {
                libc::pread(
                    self.file.as_raw_fd(),
                    spare.as_mut_ptr().cast(),
                    spare.len(),
                    (position + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(io_err(shard, "read segment", &self.path, e));
            }
            if n == 0 {
                let e = std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("segment ended {} bytes short of the read", len - done),
                );
                return Err(self.read_failed(shard, position + done as u64, len - done, e));
            }
            done += n as usize;
        }
        // SAFETY: the loop above initialised exactly `len` bytes after `start`.
        unsafe { out.set_len(start + len) };
        Ok(())
    }

    /// Asks the kernel to start reading `[position, position + len)` into the page cache in
    /// the background, so a sequential reader finds its next chunk there instead of waiting
    /// for the device; what the last call already asked for is not asked again
    /// (`advice.rs`). Advisory: errors are ignored.
    pub fn prefetch(&self, position: u64, len: u64) {
        use std::os::fd::AsRawFd;
        let end = self.size();
        if position >= end || len == 0 {
            return;
        }
        let len = len.min(end - position);
        let Some(range) = self.advised.take(position..position + len) else {
            return;
        };
        // SAFETY: plain advisory syscall on an open descriptor.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                range.start as libc::off_t,
                (range.end - range.start) as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
    }

    pub fn corrupt(&self, shard: &str, position: u64, source: WireError) -> LogError {
        LogError::Corrupt {
            shard: shard.to_owned(),
            segment: self.path.clone(),
            position,
            source,
        }
    }

    /// Walks the whole batches from `position` up to `end`, reading in chunks of about
    /// `chunk` bytes, and calls `visit(header, position, bytes)` for each until it returns
    /// false. Every batch is CRC-checked; a bad one is reported as corruption at its position.
    pub fn walk(
        &self,
        mut position: u64,
        end: u64,
        chunk: usize,
        max_batch_bytes: usize,
        shard: &str,
        mut visit: impl FnMut(&BatchHeader, u64, &[u8]) -> bool,
    ) -> Result<u64, LogError> {
        while position < end {
            let want = chunk.max(LOG_OVERHEAD).min((end - position) as usize);
            let buf = self.read_exact_at(position, want, shard)?;
            let mut at = 0usize;
            let mut progressed = false;
            while at < buf.len() {
                match BatchHeader::validate(&buf[at..], max_batch_bytes) {
                    Ok((h, len)) => {
                        if !visit(&h, position + at as u64, &buf[at..at + len]) {
                            return Ok(position + at as u64);
                        }
                        at += len;
                        progressed = true;
                    }
                    Err(WireError::Truncated { needed, .. })
                        if position + at as u64 + needed as u64 <= end =>
                    {
                        if progressed {
                            break; // re-read from this batch with a fresh chunk
                        }
                        // The first batch is larger than the chunk: read it whole.
                        let total = BatchHeader::peek_total_len(&buf[at..], max_batch_bytes)
                            .unwrap_or(needed)
                            .max(needed);
                        let whole = self.read_exact_at(position, total, shard)?;
                        let (h, len) = BatchHeader::validate(&whole, max_batch_bytes)
                            .map_err(|e| self.corrupt(shard, position, e))?;
                        if !visit(&h, position, &whole[..len]) {
                            return Ok(position);
                        }
                        at = len;
                        break;
                    }
                    Err(e) => return Err(self.corrupt(shard, position + at as u64, e)),
                }
            }
            position += at as u64;
        }
        Ok(position)
    }
}

pub(crate) fn io_err(
    shard: &str,
    op: &'static str,
    path: &Path,
    source: std::io::Error,
) -> LogError {
    LogError::Io {
        shard: shard.to_owned(),
        op,
        path: path.to_owned(),
        source,
    }
}

/// Fsyncs a directory so that file creations, renames and deletions in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

// ---- the sealed index file ----------------------------------------------------------------
//
// Layout (little-endian): magic "FXIX", version u16, reserved u16, base_offset u64,
// next_offset u64, size u64, min_ts i64, max_ts i64, n_offsets u32, n_times u32,
// n_offsets × (offset u64, position u64), n_times × (timestamp i64, offset u64), crc32c u32
// of everything before it. Written once at seal, atomically (temp file + rename).

const INDEX_MAGIC: &[u8; 4] = b"FXIX";
const INDEX_VERSION: u16 = 1;
const INDEX_HEADER: usize = 4 + 2 + 2 + 8 * 5 + 4 + 4;

/// Writes the sealed index of `seg` durably: temp file, fsync, rename. The caller syncs the
/// directory.
pub(crate) fn write_index_file(dir: &Path, seg: &Segment) -> std::io::Result<()> {
    let idx = seg.index.read();
    let s = seg.summary();
    let mut out =
        Vec::with_capacity(INDEX_HEADER + idx.offsets.len() * 16 + idx.times.len() * 16 + 4);
    out.extend_from_slice(INDEX_MAGIC);
    out.extend_from_slice(&INDEX_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&seg.base_offset.to_le_bytes());
    out.extend_from_slice(&seg.next_offset().to_le_bytes());
    out.extend_from_slice(&s.size_bytes.to_le_bytes());
    out.extend_from_slice(&seg.min_timestamp.load(Ordering::Relaxed).to_le_bytes());
    out.extend_from_slice(&seg.max_timestamp.load(Ordering::Relaxed).to_le_bytes());
    out.extend_from_slice(&(idx.offsets.len() as u32).to_le_bytes());
    out.extend_from_slice(&(idx.times.len() as u32).to_le_bytes());
    for e in &idx.offsets {
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.position.to_le_bytes());
    }
    for e in &idx.times {
        out.extend_from_slice(&e.timestamp.to_le_bytes());
        out.extend_from_slice(&e.offset.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());

    let final_path = dir.join(index_file_name(seg.base_offset));
    let tmp = final_path.with_extension("index.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(&out)?;
    f.sync_data()?;
    std::fs::rename(&tmp, &final_path)
}

/// What a valid index file says about its segment.
pub(crate) struct LoadedIndex {
    pub next_offset: u64,
    pub size: u64,
    pub min_timestamp: i64,
    pub max_timestamp: i64,
    pub index: SparseIndex,
}

/// Loads the index file of the segment at `base_offset`; `None` if it is missing, damaged,
/// or describes a smaller size than `file_len` (it is then rebuilt by scanning the segment).
/// An intact index that records a *larger* size than the file has is kept, with its size:
/// the segment was sealed at that size and has since been cut short, so the caller must
/// treat the missing bytes as corruption (a rescan would silently drop their records).
pub(crate) fn read_index_file(dir: &Path, base_offset: u64, file_len: u64) -> Option<LoadedIndex> {
    let bytes = std::fs::read(dir.join(index_file_name(base_offset))).ok()?;
    if bytes.len() < INDEX_HEADER + 4 || &bytes[0..4] != INDEX_MAGIC {
        return None;
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?) {
        return None;
    }
    let u16_at = |at: usize| u16::from_le_bytes(body[at..at + 2].try_into().unwrap_or_default());
    let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().unwrap_or_default());
    let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().unwrap_or_default());
    if u16_at(4) != INDEX_VERSION || u64_at(8) != base_offset || u64_at(24) < file_len {
        return None;
    }
    let n_off = u32_at(48) as usize;
    let n_time = u32_at(52) as usize;
    if body.len() != INDEX_HEADER + (n_off + n_time) * 16 {
        return None;
    }
    let mut index = SparseIndex::default();
    let mut at = INDEX_HEADER;
    for _ in 0..n_off {
        index.offsets.push(OffsetEntry {
            offset: u64_at(at),
            position: u64_at(at + 8),
        });
        at += 16;
    }
    for _ in 0..n_time {
        index.times.push(TimeEntry {
            timestamp: u64_at(at) as i64,
            offset: u64_at(at + 8),
        });
        at += 16;
    }
    Some(LoadedIndex {
        next_offset: u64_at(16),
        size: u64_at(24),
        min_timestamp: u64_at(32) as i64,
        max_timestamp: u64_at(40) as i64,
        index,
    })
}
