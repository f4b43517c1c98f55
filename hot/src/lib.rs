//! felix-hot: one shard's durable log on local disk.
//!
//! A shard's log is a directory of segment files holding Kafka RecordBatch v2 batches end to
//! end, each with a sparse offset and time index. One writer thread per shard appends in
//! groups (group commit) under an fsync policy; readers read concurrently with `pread`.
//! Nothing here knows about the network, tiers or replication: those call the API of
//! [`ShardLog`] — leader appends, follower appends, conditional appends, truncation, reads
//! bounded by a caller's mark, seal notifications and retention below a caller's floor.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use felix_hot::{LogConfig, ShardLog};
//! use felix_wire::{BatchBuilder, Compression, Record};
//!
//! let log = ShardLog::open("/tmp/felix-demo", LogConfig::default())?;
//! let batch = BatchBuilder::new(Compression::None)
//!     .with(Record::value(1_700_000_000_000, "hello"))
//!     .build()?;
//! let (first, last) = log.append(batch).await?.committed().await?;
//! let read = log.read(first, 1 << 20, None)?;
//! assert!(!read.batches.is_empty() && read.next_offset == last + 1);
//! # Ok(()) }
//! ```

mod advice;
mod config;
mod error;
mod inline;
mod log;
mod queue;
mod read;
mod read_cache;
mod recovery;
mod repair;
mod retention;
mod segment;
mod shared;
mod shared_read;
mod writer;

pub use config::{FsyncPolicy, LogConfig, RetentionPolicy};
pub use error::LogError;
pub use log::{LogOffsets, ShardLog};
pub use queue::Appended;
pub use read::LogRead;
pub use read_cache::{READ_BLOCK_BYTES, ReadCache};
pub use repair::RepairOutcome;
pub use retention::RetentionOutcome;
pub use segment::SealedSegment;
pub use shared::WriteGate;
pub use shared_read::SharedRead;
