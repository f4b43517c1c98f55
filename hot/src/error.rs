//! Errors of the log, split by what the caller should do: fix the input (`InvalidBatch`,
//! `BatchTooLarge`, `DecompressesTooLarge`), re-check its view of the log (`OffsetMismatch`, `StaleGeneration`,
//! `OffsetOutOfRange`, `Truncate*`), or treat the shard as failed and alert an operator
//! (`Corrupt`, `Failed`, `Io`). Bad input never changes the log.

use std::path::PathBuf;

use felix_wire::WireError;
use thiserror::Error;

/// An error from a shard's log.
#[derive(Debug, Error)]
pub enum LogError {
    /// The bytes given to append are not one valid RecordBatch v2. Nothing was written.
    #[error("invalid batch: {0}")]
    InvalidBatch(WireError),
    /// The buffer holds a valid batch followed by other bytes; the log appends one batch at a time.
    #[error("append takes exactly one batch: {extra} bytes follow the batch")]
    TrailingBytes { extra: usize },
    /// The batch is larger than the log's `max_batch_bytes`. Nothing was written.
    #[error("batch of {size} bytes exceeds the limit of {max} bytes")]
    BatchTooLarge { size: usize, max: usize },
    /// The batch is compressed and its records decompress to more than `max_batch_bytes`
    /// (everything accepted must be readable and tierable uncompressed). Nothing was written.
    #[error("a batch of {size} bytes decompresses to more than the limit of {max} bytes")]
    DecompressesTooLarge { size: usize, max: usize },
    /// A conditional or follower append named an offset that is not the shard's next one.
    #[error("offset mismatch: the batch starts at {given}, the shard's next offset is {next}")]
    OffsetMismatch { given: u64, next: u64 },
    /// A follower append carried a generation older than one the shard has already seen.
    #[error("stale generation {batch}: the shard is at generation {current}")]
    StaleGeneration { batch: i32, current: i32 },
    /// A read asked for an offset outside what the log holds.
    #[error("offset {requested} is out of range: the log holds [{first}, {next})")]
    OffsetOutOfRange {
        requested: u64,
        first: u64,
        next: u64,
    },
    /// `truncate_after` named an offset inside a batch; batches are cut whole only.
    #[error("cannot truncate after {offset}: it is inside the batch [{batch_base}, {batch_last}]")]
    TruncateInsideBatch {
        offset: u64,
        batch_base: u64,
        batch_last: u64,
    },
    /// `truncate_after` would cut records that were uploaded (immutable) or already deleted.
    #[error("cannot truncate after {offset}: records below {floor} are immutable or gone")]
    TruncateBelowFloor { offset: u64, floor: u64 },
    /// Stored bytes fail their checks: the shard, the file and the byte position say where.
    #[error("shard {shard}: corrupt segment {} at byte {position}: {source}", segment.display())]
    Corrupt {
        shard: String,
        segment: PathBuf,
        position: u64,
        source: WireError,
    },
    /// A previous write or flush failed; the log refuses further appends until it is
    /// reopened (recovery then cuts any partial write). Acknowledged data is not affected.
    #[error("shard {shard}: log is offline after a failed {op}: {reason}")]
    Failed {
        shard: String,
        op: &'static str,
        reason: String,
    },
    /// An I/O error while opening or reading.
    #[error("shard {shard}: {op} {}: {source}", path.display())]
    Io {
        shard: String,
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The log was closed.
    #[error("shard {shard}: log is closed")]
    Closed { shard: String },
    /// The log's write gate refused a leader append when its turn to be written came (the
    /// owner may no longer lead the shard). Nothing of it was written, nor of any leader
    /// append queued behind it; the next append takes the first of their offsets again.
    #[error("shard {shard}: the write was refused by the log's write gate")]
    WriteRefused { shard: String },
}

impl LogError {
    /// Whether the error leaves the log unusable until it is reopened.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            LogError::Corrupt { .. }
                | LogError::Failed { .. }
                | LogError::Io { .. }
                | LogError::Closed { .. }
        )
    }
}
