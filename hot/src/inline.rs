//! Appends written by the task that waits for them instead of by the writer thread.
//!
//! Decides who writes a group when writing it is only a `pwrite` into the page cache (the
//! periodic fsync policy, and no write gate, which may block its caller). Handing every
//! group to the writer thread and back costs two thread wake-ups, more than the write itself
//! on a busy machine. A deferred append ([`ShardLog::append_if_deferred`]) wakes nobody; when
//! its ticket's holder waits for the commit, it takes the writer's lock and writes
//! everything queued — its own append and those queued with it — as one group, exactly as
//! the thread would (`Writer::process`). Where it cannot — another writer keeps the lock
//! past a short wait, a segment must roll (a flush and a file creation), a truncation or a
//! flush is queued, or the group is large — it wakes the writer thread instead, so a
//! caller's thread never waits on the device. A ticket dropped unawaited wakes the thread:
//! every accepted append is written.
//!
//! The writer thread's invariants stay whole: one writer at a time (the lock), requests
//! written in queue order, a group committed only once its bytes are in the file.
//!
//! [`ShardLog::append_if_deferred`]: crate::ShardLog::append_if_deferred

use std::sync::Arc;
use std::time::Duration;

use crate::config::FsyncPolicy;
use crate::queue::{Deferred, Request};
use crate::shared::Shared;
use crate::writer::{Writer, WriterLock};

/// The largest group a waiter writes itself; a bigger one goes to the thread, so the
/// caller's thread never spends long in a write.
const INLINE_MAX_BYTES: usize = 256 * 1024;

/// How long a waiter waits for another writer to let go of the lock before it hands the
/// group to the writer thread: about one page-cache write of a group, so it never waits
/// out a roll's flush (milliseconds) on the caller's thread.
const LOCK_WAIT: Duration = Duration::from_micros(50);

/// What a deferred append's ticket owes: nobody was woken to write its append, so whoever
/// ends the ticket writes the queue or wakes the writer thread.
pub(crate) struct Kick {
    pub writer: WriterLock,
    pub shared: Arc<Shared>,
}

impl std::fmt::Debug for Kick {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kick")
            .field("shard", &self.shared.shard)
            .finish()
    }
}

/// Whether a log's appends may be left to their waiters: a write that is only a page-cache
/// write (an `on_commit` group is flushed, which takes the device's time) and no write gate
/// (it may hold its caller for as long as it likes).
pub(crate) fn may_defer(shared: &Shared) -> bool {
    matches!(shared.config.read().fsync, FsyncPolicy::Periodic { .. })
        && shared.write_gate.read().is_none()
}

impl Deferred for Kick {
    fn write_or_wake(self: Box<Self>) {
        if !self.write_here() {
            self.wake();
        }
    }

    fn wake(&self) {
        self.shared.work.notify_one();
    }
}

impl Kick {
    /// Whether the queue was written (here, or by whoever took it first).
    fn write_here(&self) -> bool {
        let Some(mut w) = self.writer.try_lock_for(LOCK_WAIT) else {
            return false;
        };
        if w.offline {
            // Going offline answered everything queued, and nothing is accepted since.
            return true;
        }
        let requests = {
            let mut q = self.shared.queue.lock();
            if q.requests.is_empty() {
                return true;
            }
            if !may_write_here(&w, &self.shared, &q.requests) {
                return false;
            }
            std::mem::take(&mut q.requests)
        };
        if let Err((op, reason)) = w.process(requests) {
            w.go_offline(op, reason);
            // The thread finds the log offline and stops.
            self.wake();
        }
        true
    }
}

/// Whether the queued `requests` are appends a waiter may write: a small group, under a
/// policy that does not flush it, that rolls no segment.
fn may_write_here(w: &Writer, shared: &Shared, requests: &[Request]) -> bool {
    if !may_defer(shared) {
        return false;
    }
    let mut bytes = 0usize;
    for r in requests {
        match r {
            Request::Append { batch, .. } => bytes += batch.len(),
            Request::Truncate { .. } | Request::Sync { .. } => return false,
        }
    }
    bytes <= INLINE_MAX_BYTES && !w.would_roll(bytes as u64)
}
