//! The append queue between a log's face ([`crate::ShardLog`]) and its writer thread.
//!
//! Decides where offsets are assigned: in [`Queue::accept`], under the queue lock, in the
//! order appends are accepted. The single writer thread (see `writer.rs`) takes the queued
//! requests in that same order, so the order of offsets, of bytes on disk and of commit
//! notifications is one order. The queue is bounded by the bytes it holds: an appender waits
//! for room (an empty queue takes any one batch), and for a truncation in flight to set the
//! next offset.
//!
//! An append passes two points: *accepted* (offsets assigned, queued — the point an
//! enqueue-ack broker answers at) when it is given its [`Appended`] ticket, and *committed*
//! (written and covered by the fsync policy) when the ticket's [`Appended::committed`]
//! resolves. Readers see records only once they are committed.

use felix_wire::BatchHeader;
use felix_wire::batch::{stamp_base_offset, stamp_partition_leader_epoch};
use tokio::sync::oneshot;

use crate::error::LogError;

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

/// Where an append's offsets come from.
pub(crate) enum Placement {
    /// Leader append: the log stamps offsets and the generation.
    Leader,
    /// Leader append that must land exactly at this offset (`publish_if`).
    LeaderAt(u64),
    /// Follower append: offsets and generation as given.
    Follower,
}

impl Queue {
    /// Whether an append of `len` bytes may be accepted now: no truncation is in flight and
    /// the queue has room for it (an empty queue takes any one batch).
    pub fn has_room(&self, len: usize, max_pending: usize) -> bool {
        !self.truncating && (self.pending_bytes == 0 || self.pending_bytes + len <= max_pending)
    }

    /// Gives `batch` (`len` bytes, checked, with `header` parsed from it) its offsets as
    /// `placement` says and queues it for the writer; the caller wakes the writer. Refused,
    /// with nothing queued, if the batch does not land where it must or carries an older
    /// generation than the shard has seen.
    pub fn accept(
        &mut self,
        mut batch: Vec<u8>,
        mut header: BatchHeader,
        len: usize,
        placement: Placement,
    ) -> Result<Appended, LogError> {
        match placement {
            Placement::Leader | Placement::LeaderAt(_) => {
                if let Placement::LeaderAt(expected) = placement
                    && expected != self.next_offset
                {
                    return Err(LogError::OffsetMismatch {
                        given: expected,
                        next: self.next_offset,
                    });
                }
                stamp_base_offset(&mut batch, self.next_offset as i64);
                stamp_partition_leader_epoch(&mut batch, self.generation);
                header.base_offset = self.next_offset as i64;
                header.partition_leader_epoch = self.generation;
            }
            Placement::Follower => {
                if header.base_offset < 0 || header.base_offset as u64 != self.next_offset {
                    return Err(LogError::OffsetMismatch {
                        given: header.base_offset.max(0) as u64,
                        next: self.next_offset,
                    });
                }
                if header.partition_leader_epoch < self.generation {
                    return Err(LogError::StaleGeneration {
                        batch: header.partition_leader_epoch,
                        current: self.generation,
                    });
                }
                self.generation = header.partition_leader_epoch;
            }
        }
        let leader = !matches!(placement, Placement::Follower);
        let base = header.base_offset as u64;
        let last = base + header.offset_count() - 1;
        self.next_offset = last + 1;
        self.pending_bytes += len;
        let (reply, done) = oneshot::channel();
        self.requests.push(Request::Append {
            batch,
            header,
            leader,
            reply,
        });
        Ok(Appended {
            base_offset: base,
            last_offset: last,
            done,
            kick: None,
        })
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
    /// A deferred append (`inline.rs`): nobody was woken to write it yet.
    kick: Option<Box<dyn Deferred>>,
}

/// What a deferred append's ticket owes (implemented in `inline.rs`, which this module
/// must not import: inline writes this queue's requests): whoever ends the ticket writes
/// the queue or wakes the writer thread.
pub(crate) trait Deferred: Send + Sync + std::fmt::Debug {
    /// Writes the queue in the caller's thread if it may, else wakes the writer thread.
    fn write_or_wake(self: Box<Self>);
    /// Leaves the queue to the writer thread.
    fn wake(&self);
}

impl Appended {
    /// Makes this ticket's holder responsible for having its append written.
    pub(crate) fn defer(&mut self, kick: Box<dyn Deferred>) {
        self.kick = Some(kick);
    }

    /// Resolves once the batch is written and covered by the fsync policy. A deferred
    /// append is written here, by the caller, when it may be (`inline.rs`).
    pub async fn committed(mut self) -> Result<(u64, u64), LogError> {
        if let Some(kick) = self.kick.take() {
            kick.write_or_wake();
        }
        match (&mut self.done).await {
            Ok(Ok(())) => Ok((self.base_offset, self.last_offset)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(LogError::Closed {
                shard: String::new(),
            }),
        }
    }

    /// Like [`Appended::committed`], for callers outside an async runtime.
    pub fn wait_committed(mut self) -> Result<(u64, u64), LogError> {
        if let Some(kick) = self.kick.take() {
            kick.write_or_wake();
        }
        // `blocking_recv` takes the receiver, which a ticket (it has a `Drop`) cannot give.
        let done = std::mem::replace(&mut self.done, oneshot::channel().1);
        match done.blocking_recv() {
            Ok(Ok(())) => Ok((self.base_offset, self.last_offset)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(LogError::Closed {
                shard: String::new(),
            }),
        }
    }
}

impl Drop for Appended {
    /// A deferred append nobody waits for is still written: by the writer thread.
    fn drop(&mut self) {
        if let Some(kick) = self.kick.take() {
            kick.wake();
        }
    }
}
