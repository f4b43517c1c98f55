//! The settings of one shard's log. Defaults follow the spec's names and values
//! (`FELIX_DURABLE_FSYNC_MODE`, periodic at 250 ms) and the stream settings of the data model
//! (`segment_bytes`, `segment_ms`, `hot_retention_*`).

use std::str::FromStr;
use std::time::Duration;

/// When appended bytes are flushed to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// A background flush every `interval` (default 250 ms). An append is committed once
    /// its bytes are in the log file: it survives a process crash; a machine crash or power
    /// loss can lose what was written since the last completed flush.
    Periodic { interval: Duration },
    /// Every group of appends is flushed (fdatasync) before any of them is committed: an
    /// acknowledged append survives a machine crash. Concurrent appends share one flush.
    OnCommit,
}

impl Default for FsyncPolicy {
    fn default() -> Self {
        FsyncPolicy::Periodic {
            interval: Duration::from_millis(250),
        }
    }
}

impl FromStr for FsyncPolicy {
    type Err = String;
    /// Parses `periodic`, `periodic:MS` or `on_commit` (the values of `FELIX_DURABLE_FSYNC_MODE`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "on_commit" => Ok(FsyncPolicy::OnCommit),
            "periodic" => Ok(FsyncPolicy::default()),
            other => match other.strip_prefix("periodic:") {
                Some(ms) => ms
                    .parse::<u64>()
                    .ok()
                    .filter(|&ms| ms > 0)
                    .map(|ms| FsyncPolicy::Periodic {
                        interval: Duration::from_millis(ms),
                    })
                    .ok_or_else(|| {
                        format!("invalid periodic fsync interval {ms:?} (milliseconds > 0)")
                    }),
                None => Err(format!(
                    "unknown fsync policy {other:?} (expected periodic, periodic:MS or on_commit)"
                )),
            },
        }
    }
}

/// Local retention of sealed segments: by total size and by age. `None` keeps everything.
/// Retention never deletes the active segment nor anything at or above the caller's floor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Delete the oldest sealed segment while the segments left after deleting it still hold
    /// at least this many bytes (Kafka's rule: the log never shrinks below the limit).
    pub max_bytes: Option<u64>,
    /// Delete sealed segments whose newest record is older than this.
    pub max_age: Option<Duration>,
}

/// How one shard's log behaves.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// A human-readable name of the shard (e.g. `acme/prod/orders/0`), used in errors and logs.
    pub shard: String,
    /// Roll the active segment once it would grow past this many bytes. A batch is never
    /// split, so a batch larger than this gets a segment of its own.
    pub segment_bytes: u64,
    /// Roll the active segment once its first append is this old (checked on append and
    /// while idle), so a quiet stream still seals segments for tiering.
    pub segment_age: Option<Duration>,
    /// The fsync policy.
    pub fsync: FsyncPolicy,
    /// Bytes between entries of the sparse offset and time indexes.
    pub index_interval_bytes: u64,
    /// The largest batch the log accepts.
    pub max_batch_bytes: usize,
    /// Bytes accepted but not yet written that the log holds before appenders wait.
    pub max_pending_bytes: usize,
    /// Local retention (applied by [`crate::ShardLog::enforce_retention`]).
    pub retention: RetentionPolicy,
    /// The offset an empty log starts at. A log whose local records all end below it is
    /// emptied and restarted there: the caller guarantees those records are held elsewhere
    /// (the tiering layer passes the end of the uploaded objects, so a broker whose local
    /// volume was wiped continues the shard's offsets instead of reusing them).
    pub start_offset: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            shard: "shard".to_owned(),
            segment_bytes: 256 * 1024 * 1024,
            segment_age: Some(Duration::from_secs(3600)),
            fsync: FsyncPolicy::default(),
            index_interval_bytes: 4096,
            max_batch_bytes: 16 * 1024 * 1024,
            max_pending_bytes: 64 * 1024 * 1024,
            retention: RetentionPolicy::default(),
            start_offset: 0,
        }
    }
}
