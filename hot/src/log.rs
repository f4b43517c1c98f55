//! [`ShardLog`]: the public face of one shard's log — opening it, appends, truncation,
//! flushes, its generation and its offsets. Reads are in `read.rs` and `shared_read.rs`,
//! local retention in `retention.rs`.
//!
//! Decides what the face accepts into the append queue (see `queue.rs`, where offsets are
//! assigned): one whole, valid batch within `max_batch_bytes` and, from a leader, one that
//! decompresses within it too, so that nothing is acknowledged that a reader or the object
//! store could not take. The log is one writer thread's to write (see `writer.rs`); the face
//! only queues requests to it and reads the marks it publishes.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use felix_wire::{BatchHeader, CheckedBatch, Compression, WireError};
use parking_lot::{Condvar, Mutex, RwLock};
use tokio::sync::{Notify, broadcast, oneshot, watch};

use crate::config::LogConfig;
use crate::error::LogError;
use crate::inline::{Kick, may_defer};
use crate::queue::{Appended, Placement, Queue, Request};
use crate::recovery::open_segments;
use crate::segment::SealedSegment;
use crate::shared::{Shared, WriteGate};
use crate::writer::{self, WriterLock};

/// Identities of opened logs, for the keys of a shared [`ReadCache`](crate::ReadCache).
static NEXT_LOG_ID: AtomicU64 = AtomicU64::new(1);

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

struct Owner {
    shared: Arc<Shared>,
    /// The writer's state: its thread's, or an appender's writing its own group.
    writer: WriterLock,
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
        let (writer, threads) = writer::start(&shared).map_err(|source| LogError::Io {
            shard: shared.shard.clone(),
            op: "start writer thread",
            path: shared.dir.clone(),
            source,
        })?;
        Ok(ShardLog {
            owner: Arc::new(Owner {
                shared,
                writer,
                threads: Mutex::new(threads),
            }),
        })
    }

    pub(crate) fn shared(&self) -> &Shared {
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
        self.enqueue(batch, Placement::Leader, false).await
    }

    /// [`ShardLog::append`] whose write is left to the ticket's holder, as
    /// [`ShardLog::append_if_deferred`] does for an append at an expected offset: for
    /// callers that await [`Appended::committed`] as soon as they have let go of their own
    /// locks (a consumer group's journal changes).
    pub async fn append_deferred(&self, batch: Vec<u8>) -> Result<Appended, LogError> {
        self.enqueue(batch, Placement::Leader, true).await
    }

    /// [`ShardLog::append`] for a batch its caller already validated ([`CheckedBatch`]): the
    /// header is taken as checked, so the batch's CRC is computed once on the publish path,
    /// at ingress, not again here. The size limits still apply.
    pub async fn append_checked(&self, batch: CheckedBatch) -> Result<Appended, LogError> {
        let (header, bytes) = batch.into_parts();
        self.enqueue_valid(bytes.to_vec(), header, Placement::Leader, false)
            .await
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
        self.enqueue(batch, Placement::LeaderAt(expected_offset), false)
            .await
    }

    /// [`ShardLog::append_if`] whose write is left to the ticket's holder: nobody is woken
    /// at acceptance; [`Appended::committed`] writes the queue in the caller's task when the
    /// write is only a page-cache write (the periodic fsync policy, no write gate), so the
    /// appends accepted meanwhile ride one write with no thread hand-off. Otherwise, and
    /// for a ticket dropped unawaited, the writer thread writes it. For callers that await
    /// the ticket as soon as they have let go of their own locks; one that waits for the
    /// commit any other way (the committed watch) waits until the writer's idle tick.
    pub async fn append_if_deferred(
        &self,
        batch: Vec<u8>,
        expected_offset: u64,
    ) -> Result<Appended, LogError> {
        self.enqueue(batch, Placement::LeaderAt(expected_offset), true)
            .await
    }

    /// [`ShardLog::append_if`] for a batch its caller already validated ([`CheckedBatch`]),
    /// so `publish_if`, like a publish, computes the batch's CRC once, at ingress.
    pub async fn append_checked_if(
        &self,
        batch: CheckedBatch,
        expected_offset: u64,
    ) -> Result<Appended, LogError> {
        let (header, bytes) = batch.into_parts();
        self.enqueue_valid(
            bytes.to_vec(),
            header,
            Placement::LeaderAt(expected_offset),
            false,
        )
        .await
    }

    /// Follower append: the batch keeps its offsets and generation. Refused if it does not
    /// start exactly at the shard's next offset or carries an older generation than the
    /// shard has seen; a newer generation is adopted.
    pub async fn append_at(&self, batch: Vec<u8>) -> Result<Appended, LogError> {
        self.enqueue(batch, Placement::Follower, false).await
    }

    async fn enqueue(
        &self,
        batch: Vec<u8>,
        placement: Placement,
        defer: bool,
    ) -> Result<Appended, LogError> {
        let max_batch = self.shared().config.read().max_batch_bytes;
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
        self.enqueue_valid(batch, header, placement, defer).await
    }

    /// Queues a batch whose header was validated (here, or as a [`CheckedBatch`]): the
    /// limits on what it decompresses to and on queued bytes, then offsets. `defer`: leave
    /// the write to the ticket's holder where the log allows it (`inline.rs`).
    async fn enqueue_valid(
        &self,
        batch: Vec<u8>,
        header: BatchHeader,
        placement: Placement,
        defer: bool,
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
        let len = batch.len();
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
                shared.ensure_open(&q)?;
                if q.has_room(len, max_pending) {
                    let mut appended = q.accept(batch, header, len, placement)?;
                    drop(q);
                    if defer && may_defer(shared) {
                        appended.defer(Box::new(Kick {
                            writer: self.owner.writer.clone(),
                            shared: self.owner.shared.clone(),
                        }));
                    } else {
                        shared.work.notify_one();
                    }
                    return Ok(appended);
                }
            }
            // Room comes from the writer: deferred appends queued ahead may have nobody
            // writing them yet.
            shared.work.notify_one();
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
                shared.ensure_open(&q)?;
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
            shared.ensure_open(&q)?;
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

    /// The active (unsealed) segment's summary, if it holds a batch: its timestamps span
    /// what is written to it (committed or not), for listings that show segments' times.
    pub fn active_segment(&self) -> Option<SealedSegment> {
        self.shared()
            .segments
            .read()
            .iter()
            .rev()
            .find(|s| !s.sealed.load(Ordering::Acquire) && !s.is_empty())
            .map(|s| s.summary())
    }

    /// The largest record timestamp (ms) any segment holds, the active one included; -1
    /// when the log holds no record.
    pub fn max_timestamp(&self) -> i64 {
        self.shared()
            .segments
            .read()
            .iter()
            .map(|s| s.summary().max_timestamp)
            .max()
            .unwrap_or(-1)
    }

    /// Total bytes in the log's segment files.
    pub fn size_bytes(&self) -> u64 {
        self.shared().segments.read().iter().map(|s| s.size()).sum()
    }
}
