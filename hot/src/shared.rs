//! The state one shard's log shares between its face ([`crate::ShardLog`]), its writer
//! thread and its periodic flusher.
//!
//! Decides who may change what. The face assigns offsets and queues requests under the queue
//! lock (see `queue.rs`); only the writer writes segment files, rolls and cuts segments and
//! moves `committed_end`; the writer and the flusher move `durable_end`; retention removes
//! the oldest sealed segments. The marks only grow, except that a truncation pulls them back
//! to its cut, and the periodic flush, truncation and retention each hold `maintenance`, so
//! none sees the segment list or the marks half-changed by another.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::{Condvar, Mutex, RwLock};
use tokio::sync::{Notify, broadcast, watch};

use crate::config::LogConfig;
use crate::error::LogError;
use crate::queue::Queue;
use crate::segment::{SealedSegment, Segment};

/// Asked by the writer thread, just before it writes a group holding leader appends,
/// whether they may still be written; `false` refuses them (see
/// [`ShardLog::set_write_gate`](crate::ShardLog::set_write_gate)). It runs on the writer
/// thread and may block it.
pub type WriteGate = Arc<dyn Fn() -> bool + Send + Sync>;

pub(crate) struct Shared {
    /// This log instance's identity in a shared [`ReadCache`](crate::ReadCache).
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

    /// Refuses a request to a log that went offline after a failed write or flush, or that
    /// is closing.
    pub fn ensure_open(&self, queue: &Queue) -> Result<(), LogError> {
        if let Some((op, reason)) = &queue.failed {
            return Err(self.failed_error(op, reason));
        }
        if queue.closed {
            return Err(LogError::Closed {
                shard: self.shard.clone(),
            });
        }
        Ok(())
    }
}
