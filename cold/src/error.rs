//! The tier's errors. Every failure a caller can act on has its own variant.

use crate::segment::SegmentError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ColdError {
    /// The object store failed (after retries) or timed out.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An object is not a readable Felix segment.
    #[error("object {key}: {source}")]
    Segment {
        key: String,
        #[source]
        source: SegmentError,
    },
    /// Fetching through the cache failed; the message says why (the cache keeps errors as
    /// text because concurrent readers share one fetch).
    #[error("cold read of {key} failed: {message}")]
    Fetch { key: String, message: String },
    /// The cache could not be opened.
    #[error("cold cache: {0}")]
    Cache(String),
    /// The requested offset was removed by retention.
    #[error("offset {requested} is older than the shard's earliest offset {earliest}")]
    TooOld { requested: u64, earliest: u64 },
    /// The local log failed.
    #[error(transparent)]
    Log(#[from] felix_hot::LogError),
    /// The control plane refused or could not be reached.
    #[error("control plane: {0}")]
    Meta(String),
    /// The manifest and the log disagree (e.g. records below the manifest's end that are
    /// neither in an object nor on local disk).
    #[error("{0}")]
    Inconsistent(String),
}

/// A keeper's failure is the control plane's, as before the keepers left this crate.
impl From<felix_model::KeeperError> for ColdError {
    fn from(e: felix_model::KeeperError) -> ColdError {
        ColdError::Meta(e.0)
    }
}
