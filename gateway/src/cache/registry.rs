//! The cache shards open on this broker: each one's entries, its watchers, and the memory
//! the in-memory ones hold together.
//!
//! The invariant: one [`CacheShard`] per open shard of a cache's stream; a re-created
//! cache's shard is another [`Shard`], so its state starts afresh (see
//! `Broker::cache_shard`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use felix_meta::model::ShardKey;
use felix_wire::cache::CacheChange;
use tokio::sync::broadcast;

use super::state::KvState;
use crate::shard::Shard;

/// Changes a watch may fall behind by before it is ended (`watch_lagged`).
pub(crate) const WATCH_BUFFER: usize = 4096;

/// One change as the owner broadcasts it to the watches of the shard.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub change: CacheChange,
    pub value: Bytes,
}

/// Watch changes staged but not yet written, each batch with its last log offset
/// (`commit.rs` sends them on once written).
pub(crate) type Unwritten = parking_lot::Mutex<VecDeque<(u64, Vec<Change>)>>;

/// One cache shard this broker owns (or owned): its entries and its watchers.
pub(crate) struct CacheShard {
    pub key: ShardKey,
    /// The cache's name (the stream's without the prefix), for metrics and messages.
    pub cache: String,
    pub shard: Arc<Shard>,
    pub durable: bool,
    pub quorum: bool,
    pub state: tokio::sync::Mutex<KvState>,
    pub changes: broadcast::Sender<Change>,
    /// Watch changes staged but not yet written (log-backed; `commit.rs`).
    pub unwritten: Unwritten,
    /// Staged writes found lost (failed, or dropped by a rebuild): a read that saw state
    /// from before a change of this count does not answer from it.
    pub lost: AtomicU64,
}

/// The cache shards open on this broker, and the memory the in-memory ones hold.
#[derive(Default)]
pub(crate) struct Caches {
    pub open: parking_lot::Mutex<HashMap<ShardKey, Arc<CacheShard>>>,
    /// Bytes held by in-memory caches (for `kv_memory_bytes`).
    pub memory: AtomicU64,
}
