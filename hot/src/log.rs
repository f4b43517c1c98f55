//! [`ShardLog`]: the public face of one shard's log — appends, reads, truncation, retention.
//!
//! Where offsets are assigned: in [`ShardLog::append`], under the queue lock, in the order
//! appends are accepted. The single writer thread (see `writer.rs`) then writes them in that
//! order, so the order of offsets, of bytes on disk and of commit notifications is one order.
//!
//! An append passes two points: *accepted* (offsets assigned, queued — the point an
//! enqueue-ack broker answers at) when `append` returns its [`Appended`] ticket, and
//! *committed* (written and covered by the fsync policy) when the ticket's
//! [`Appended::committed`] resolves. Readers see records only once they are committed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use felix_wire::batch::{BATCH_HEADER_LEN, LOG_OVERHEAD};
use felix_wire::batch::{stamp_base_offset, stamp_partition_leader_epoch};
use felix_wire::{BatchHeader, Compression, WireError};
use parking_lot::{Condvar, Mutex, RwLock};
use tokio::sync::{Notify, broadcast, oneshot, watch};

use crate::config::LogConfig;
use crate::error::LogError;
use crate::read_cache::{Block, READ_BLOCK_BYTES, ReadCache};
use crate::recovery::open_segments;
use crate::segment::{SealedSegment, Segment};
use crate::writer;

/// Chunk size for reads that scan forward from an index entry.
const READ_CHUNK: usize = 1024 * 1024;
/// The least a read prefetches beyond what it returns.
const PREFETCH_MIN: u64 = 1024 * 1024;
/// Identities of opened logs, for the keys of a shared [`ReadCache`].
static NEXT_LOG_ID: AtomicU64 = AtomicU64::new(1);

/// Asked by the writer thread, just before it writes a group holding leader appends,
/// whether they may still be written; `false` refuses them (see [`ShardLog::set_write_gate`]).
/// It runs on the writer thread and may block it.
pub type WriteGate = Arc<dyn Fn() -> bool + Send + Sync>;

pub(crate) enum Request {
    Append {
        batch: Vec<u8>,
        header: BatchHeader,
        /// A leader append (offsets assigned here), which the write gate applies to.
        leader: bool,
        reply: oneshot::Sender<Result<(), LogError>>,
    },
    Truncate {
        /// Records at and after this offset are cut.
        keep_end: u64,
        reply: oneshot::Sender<Result<u64, LogError>>,
    },
    Sync {
        reply: oneshot::Sender<Result<u64, LogError>>,
    },
}

pub(crate) struct Queue {
    pub requests: Vec<Request>,
    /// Bytes of queued appends not yet written.
    pub pending_bytes: usize,
    /// The next offset to assign.
    pub next_offset: u64,
    /// The shard's generation: stamped on leader appends, the floor for follower appends.
    pub generation: i32,
    /// A truncation is in flight: appends wait until it has set `next_offset`.
    pub truncating: bool,
    pub closed: bool,
    /// Set after a failed write or flush: (operation, reason).
    pub failed: Option<(&'static str, String)>,
}

pub(crate) struct Shared {
    /// This log instance's identity in a shared [`ReadCache`].
    pub id: u64,
    /// Truncation epoch, seqlock style: odd while a truncation runs, bumped again when it
    /// has finished. Cached blocks are keyed by an even epoch their whole read fell inside.
    pub truncations: AtomicU64,
    pub dir: PathBuf,
    pub shard: String,
    pub config: RwLock<LogConfig>,
    /// Oldest first; the last one is the active segment.
    pub segments: RwLock<Vec<Arc<Segment>>>,
    pub queue: Mutex<Queue>,
    /// Wakes the writer thread.
    pub work: Condvar,
    /// Wakes appenders waiting for queue room or for a truncation to finish.
    pub room: Notify,
    /// One past the last committed offset: the default bound for readers.
    pub committed_end: AtomicU64,
    /// One past the last offset known to be flushed to the device.
    pub durable_end: AtomicU64,
    /// Readers below this offset's records are uploaded: truncation may not cut them.
    pub immutable_below: AtomicU64,
    pub committed_tx: watch::Sender<u64>,
    pub sealed_tx: broadcast::Sender<SealedSegment>,
    /// Wakes the periodic syncer early (shutdown).
    pub syncer_stop: (Mutex<bool>, Condvar),
    /// Held by the periodic flusher (target + flush + durable mark), truncation and
    /// retention, so none of them sees the segment list or the marks half-changed by another.
    pub maintenance: Mutex<()>,
    pub write_gate: RwLock<Option<WriteGate>>,
}

impl Shared {
    pub fn failed_error(&self, op: &'static str, reason: &str) -> LogError {
        LogError::Failed {
            shard: self.shard.clone(),
            op,
            reason: reason.to_owned(),
        }
    }
}

/// The ticket of an accepted append: its offsets, and a way to wait for its commit.
#[derive(Debug)]
pub struct Appended {
    /// Offset of the batch's first record.
    pub base_offset: u64,
    /// Offset of the batch's last record.
    pub last_offset: u64,
    done: oneshot::Receiver<Result<(), LogError>>,
}

impl Appended {
    /// Resolves once the batch is written and covered by the fsync policy.
    pub async fn committed(self) -> Result<(u64, u64), LogError> {
        match self.done.await {
            Ok(Ok(())) => Ok((self.base_offset, self.last_offset)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(LogError::Closed {
                shard: String::new(),
            }),
        }
    }

    /// Like [`Appended::committed`], for callers outside an async runtime.
    pub fn wait_committed(self) -> Result<(u64, u64), LogError> {
        match self.done.blocking_recv() {
            Ok(Ok(())) => Ok((self.base_offset, self.last_offset)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(LogError::Closed {
                shard: String::new(),
            }),
        }
    }
}

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

/// What [`ShardLog::read_view`] holds for a read.
struct ReadView<'a> {
    segs: parking_lot::RwLockReadGuard<'a, Vec<Arc<Segment>>>,
    visible_end: u64,
    max_batch: usize,
}

/// The log's offsets at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogOffsets {
    /// The first offset the log holds (after retention).
    pub first: u64,
    /// The next offset an append will get (includes accepted, uncommitted appends).
    pub next: u64,
    /// One past the last committed offset: what readers can see.
    pub committed: u64,
    /// One past the last offset flushed to the device.
    pub durable: u64,
}

/// How many sealed segments retention removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub deleted_segments: usize,
    pub deleted_bytes: u64,
    /// The log's first offset afterwards.
    pub first_offset: u64,
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
fn continues(h: &BatchHeader, at: usize, next: u64) -> bool {
    h.base_offset >= 0
        && if at == 0 {
            h.base_offset as u64 <= next
        } else {
            h.base_offset as u64 == next
        }
}

fn discontiguous(seg: &Segment, shard: &str, position: u64) -> LogError {
    seg.corrupt(
        shard,
        position,
        WireError::Inconsistent(crate::recovery::DISCONTIGUOUS),
    )
}

/// The position in `seg` (below `end`) of the batch holding `offset`, or `None` if no batch
/// there reaches it. The sparse index lands at most one index interval (plus a batch) before
/// it, so this hops over headers only; callers fully check the batches they keep.
fn batch_position(
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

enum Placement {
    /// Leader append: the log stamps offsets and the generation.
    Leader,
    /// Leader append that must land exactly at this offset (`publish_if`).
    LeaderAt(u64),
    /// Follower append: offsets and generation as given.
    Follower,
}

struct Owner {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.shared.queue.lock().closed = true;
        self.shared.work.notify_all();
        *self.shared.syncer_stop.0.lock() = true;
        self.shared.syncer_stop.1.notify_all();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

/// One shard's durable log. Cheap to clone; the writer stops (after flushing) when the last
/// clone is dropped.
#[derive(Clone)]
pub struct ShardLog {
    owner: Arc<Owner>,
}

impl std::fmt::Debug for ShardLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardLog")
            .field("shard", &self.shared().shard)
            .field("dir", &self.shared().dir)
            .finish()
    }
}

impl ShardLog {
    /// Opens (or creates) the log in `dir`, recovering from a crash if needed, and starts
    /// its writer (and, under the periodic policy, its flusher) thread.
    pub fn open(dir: impl AsRef<Path>, config: LogConfig) -> Result<ShardLog, LogError> {
        let dir = dir.as_ref().to_path_buf();
        let recovered = open_segments(&dir, &config)?;
        let next = recovered.next_offset;
        let (committed_tx, _) = watch::channel(next);
        let (sealed_tx, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            id: NEXT_LOG_ID.fetch_add(1, Ordering::Relaxed),
            truncations: AtomicU64::new(0),
            shard: config.shard.clone(),
            dir,
            segments: RwLock::new(recovered.segments),
            queue: Mutex::new(Queue {
                requests: Vec::new(),
                pending_bytes: 0,
                next_offset: next,
                generation: recovered.last_generation,
                truncating: false,
                closed: false,
                failed: None,
            }),
            work: Condvar::new(),
            room: Notify::new(),
            committed_end: AtomicU64::new(next),
            durable_end: AtomicU64::new(next),
            immutable_below: AtomicU64::new(0),
            committed_tx,
            sealed_tx,
            syncer_stop: (Mutex::new(false), Condvar::new()),
            maintenance: Mutex::new(()),
            write_gate: RwLock::new(None),
            config: RwLock::new(config),
        });
        let threads = writer::start(&shared).map_err(|source| LogError::Io {
            shard: shared.shard.clone(),
            op: "start writer thread",
            path: shared.dir.clone(),
            source,
        })?;
        Ok(ShardLog {
            owner: Arc::new(Owner {
                shared,
                threads: Mutex::new(threads),
            }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.owner.shared
    }

    /// The shard name given in the config.
    pub fn shard(&self) -> &str {
        &self.shared().shard
    }

    /// The directory holding the segment files.
    pub fn dir(&self) -> &Path {
        &self.shared().dir
    }

    /// Leader append: the log stamps the next offsets and the current generation into the
    /// batch and queues it. Returns once the batch is accepted (waiting only if the queue
    /// is full); await [`Appended::committed`] for the commit.
    pub async fn append(&self, batch: Vec<u8>) -> Result<Appended, LogError> {
        self.enqueue(batch, Placement::Leader).await
    }

    /// Single-writer fencing (`publish_if`): like [`ShardLog::append`], but the batch is
    /// accepted only if the shard's next offset is `expected_offset`, checked atomically
    /// with the assignment. Otherwise nothing is written and `OffsetMismatch` says the
    /// actual next offset.
    pub async fn append_if(
        &self,
        batch: Vec<u8>,
        expected_offset: u64,
    ) -> Result<Appended, LogError> {
        self.enqueue(batch, Placement::LeaderAt(expected_offset))
            .await
    }

    /// Follower append: the batch keeps its offsets and generation. Refused if it does not
    /// start exactly at the shard's next offset or carries an older generation than the
    /// shard has seen; a newer generation is adopted.
    pub async fn append_at(&self, batch: Vec<u8>) -> Result<Appended, LogError> {
        self.enqueue(batch, Placement::Follower).await
    }

    async fn enqueue(
        &self,
        mut batch: Vec<u8>,
        placement: Placement,
    ) -> Result<Appended, LogError> {
        let shared = self.shared();
        let (max_batch, max_pending) = {
            let c = shared.config.read();
            (c.max_batch_bytes, c.max_pending_bytes)
        };
        if batch.len() > max_batch {
            return Err(LogError::BatchTooLarge {
                size: batch.len(),
                max: max_batch,
            });
        }
        let (header, len) =
            BatchHeader::validate(&batch, max_batch).map_err(LogError::InvalidBatch)?;
        if len != batch.len() {
            return Err(LogError::TrailingBytes {
                extra: batch.len() - len,
            });
        }
        // What a batch becomes, not what it costs on the wire: a few KiB of zstd can hold
        // hundreds of MiB of records, which could be acknowledged but never decoded by a
        // reader or written to the object store. Followers take the leader's batches as
        // they are (the leader checked them, and refusing one would stop replication).
        if !matches!(placement, Placement::Follower)
            && !matches!(header.compression(), Ok(Compression::None))
        {
            match felix_wire::record::decompressed_size(&batch, &header, max_batch) {
                Ok(_) => {}
                Err(WireError::DecompressedTooLarge { .. }) => {
                    return Err(LogError::DecompressesTooLarge {
                        size: batch.len(),
                        max: max_batch,
                    });
                }
                Err(e) => return Err(LogError::InvalidBatch(e)),
            }
        }
        loop {
            let notified = shared.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut q = shared.queue.lock();
                if let Some((op, reason)) = &q.failed {
                    return Err(shared.failed_error(op, reason));
                }
                if q.closed {
                    return Err(LogError::Closed {
                        shard: shared.shard.clone(),
                    });
                }
                let has_room = q.pending_bytes == 0 || q.pending_bytes + len <= max_pending;
                if !q.truncating && has_room {
                    let mut header = header;
                    match placement {
                        Placement::Leader | Placement::LeaderAt(_) => {
                            if let Placement::LeaderAt(expected) = placement
                                && expected != q.next_offset
                            {
                                return Err(LogError::OffsetMismatch {
                                    given: expected,
                                    next: q.next_offset,
                                });
                            }
                            stamp_base_offset(&mut batch, q.next_offset as i64);
                            stamp_partition_leader_epoch(&mut batch, q.generation);
                            header.base_offset = q.next_offset as i64;
                            header.partition_leader_epoch = q.generation;
                        }
                        Placement::Follower => {
                            if header.base_offset < 0 || header.base_offset as u64 != q.next_offset
                            {
                                return Err(LogError::OffsetMismatch {
                                    given: header.base_offset.max(0) as u64,
                                    next: q.next_offset,
                                });
                            }
                            if header.partition_leader_epoch < q.generation {
                                return Err(LogError::StaleGeneration {
                                    batch: header.partition_leader_epoch,
                                    current: q.generation,
                                });
                            }
                            q.generation = header.partition_leader_epoch;
                        }
                    }
                    let base = header.base_offset as u64;
                    let last = base + header.offset_count() - 1;
                    q.next_offset = last + 1;
                    q.pending_bytes += len;
                    let (reply, done) = oneshot::channel();
                    q.requests.push(Request::Append {
                        batch,
                        header,
                        leader: !matches!(placement, Placement::Follower),
                        reply,
                    });
                    drop(q);
                    shared.work.notify_one();
                    return Ok(Appended {
                        base_offset: base,
                        last_offset: last,
                        done,
                    });
                }
            }
            notified.await;
        }
    }

    /// Sets the gate leader appends pass when the writer is about to write them: an append is
    /// accepted (offsets assigned) long before it is written when the writer is slow or the
    /// process was paused, and the owner may have lost the right to write by then. A refused
    /// append, and every leader append queued behind it, fails with
    /// [`LogError::WriteRefused`] and gives its offsets back. Follower appends pass freely.
    pub fn set_write_gate(&self, gate: WriteGate) {
        *self.shared().write_gate.write() = Some(gate);
    }

    /// Cuts every record after `offset` (a follower or a new leader dropping uncommitted
    /// records), even inside a sealed segment that was not uploaded. Appends queued before
    /// the call are written first and cut too; appends made meanwhile wait and then
    /// continue at `offset + 1`. Returns the new next offset.
    pub async fn truncate_after(&self, offset: u64) -> Result<u64, LogError> {
        self.truncate_to(offset.saturating_add(1)).await
    }

    /// Cuts every record at or after `keep_end` (0 cuts everything not uploaded), as
    /// [`ShardLog::truncate_after`] does. A replica uses it to drop what an earlier
    /// leader wrote past the committed mark. Returns the new next offset.
    pub async fn truncate_to(&self, keep_end: u64) -> Result<u64, LogError> {
        let shared = self.shared();
        let rx = loop {
            let notified = shared.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut q = shared.queue.lock();
                if let Some((op, reason)) = &q.failed {
                    return Err(shared.failed_error(op, reason));
                }
                if q.closed {
                    return Err(LogError::Closed {
                        shard: shared.shard.clone(),
                    });
                }
                if !q.truncating {
                    q.truncating = true;
                    let (reply, rx) = oneshot::channel();
                    q.requests.push(Request::Truncate { keep_end, reply });
                    break rx;
                }
            }
            notified.await;
        };
        shared.work.notify_one();
        rx.await.unwrap_or_else(|_| {
            Err(LogError::Closed {
                shard: shared.shard.clone(),
            })
        })
    }

    /// Flushes everything committed so far to the device now; returns the durable end.
    pub async fn sync(&self) -> Result<u64, LogError> {
        let shared = self.shared();
        let rx = {
            let mut q = shared.queue.lock();
            if let Some((op, reason)) = &q.failed {
                return Err(shared.failed_error(op, reason));
            }
            if q.closed {
                return Err(LogError::Closed {
                    shard: shared.shard.clone(),
                });
            }
            let (reply, rx) = oneshot::channel();
            q.requests.push(Request::Sync { reply });
            rx
        };
        shared.work.notify_one();
        rx.await.unwrap_or_else(|_| {
            Err(LogError::Closed {
                shard: shared.shard.clone(),
            })
        })
    }

    /// Sets the shard's generation (stamped on leader appends from now on). Generations
    /// only grow: an older one is refused.
    pub fn set_generation(&self, generation: i32) -> Result<(), LogError> {
        let mut q = self.shared().queue.lock();
        if generation < q.generation {
            return Err(LogError::StaleGeneration {
                batch: generation,
                current: q.generation,
            });
        }
        q.generation = generation;
        Ok(())
    }

    /// The shard's current generation (-1 before any was set).
    pub fn generation(&self) -> i32 {
        self.shared().queue.lock().generation
    }

    /// Declares that records below `offset` were uploaded: they are immutable from now on,
    /// so `truncate_after` will refuse to cut them.
    pub fn mark_uploaded_below(&self, offset: u64) {
        self.shared()
            .immutable_below
            .fetch_max(offset, Ordering::AcqRel);
    }

    /// Updates the retention policy and segment rolling on a live log.
    pub fn alter(&self, f: impl FnOnce(&mut LogConfig)) {
        f(&mut self.shared().config.write());
    }

    /// A copy of the current configuration.
    pub fn config(&self) -> LogConfig {
        self.shared().config.read().clone()
    }

    /// The first offset the log holds.
    pub fn first_offset(&self) -> u64 {
        self.shared()
            .segments
            .read()
            .first()
            .map_or(0, |s| s.base_offset)
    }

    /// The next offset an append will be given.
    pub fn next_offset(&self) -> u64 {
        self.shared().queue.lock().next_offset
    }

    /// One past the last committed offset.
    pub fn committed_offset(&self) -> u64 {
        self.shared().committed_end.load(Ordering::Acquire)
    }

    /// All the log's offsets at once.
    pub fn offsets(&self) -> LogOffsets {
        let shared = self.shared();
        LogOffsets {
            first: self.first_offset(),
            next: self.next_offset(),
            committed: shared.committed_end.load(Ordering::Acquire),
            durable: shared.durable_end.load(Ordering::Acquire),
        }
    }

    /// A watch of the committed end, for readers that tail the log.
    pub fn watch_committed(&self) -> watch::Receiver<u64> {
        self.shared().committed_tx.subscribe()
    }

    /// Notifications of segments as they are sealed (the tiering hook). A receiver that
    /// falls behind gets `Lagged` and can resynchronise with [`ShardLog::sealed_segments`].
    pub fn subscribe_sealed(&self) -> broadcast::Receiver<SealedSegment> {
        self.shared().sealed_tx.subscribe()
    }

    /// The sealed segments, oldest first.
    pub fn sealed_segments(&self) -> Vec<SealedSegment> {
        self.shared()
            .segments
            .read()
            .iter()
            .filter(|s| s.sealed.load(Ordering::Acquire))
            .map(|s| s.summary())
            .collect()
    }

    /// Total bytes in the log's segment files.
    pub fn size_bytes(&self) -> u64 {
        self.shared().segments.read().iter().map(|s| s.size()).sum()
    }

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
    fn read_view(
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
