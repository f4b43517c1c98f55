//! [`ReadCache`]: recent history reads, shared by the readers of every log of a broker.
//!
//! Several subscribers catching up on one shard read the same bytes a little apart in
//! time. Each history read costs a `pread` copy and a CRC pass over what it returns; with
//! ten subscribers catching up that is ten copies and ten CRC passes per byte delivered,
//! where live delivery (one read by the fanout, shared) costs one. The cache lets the
//! readers share: [`crate::ShardLog::read_shared`] cuts history into blocks at fixed file
//! positions, so readers that start anywhere fall into step after their first read and ask
//! for the same blocks, and a block read and checked once is handed to the next reader as
//! the same `Bytes`.
//!
//! Entries are keyed by the log instance, its truncation epoch and the block's first
//! offset, so a log cut and rewritten can never be served from blocks of its old content.
//! Eviction is first in, first out: readers move forward through history, so the oldest
//! block is the one least likely to be asked for again.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

/// The file-position grid history is cut at. Small enough that a block and the frame built
/// from it stay in the CPU's cache while they are checked and sent; large enough that a
/// block is few syscalls and few frames.
pub const READ_BLOCK_BYTES: u64 = 128 * 1024;

/// (log instance, truncation epoch, first offset of the block).
pub(crate) type BlockKey = (u64, u64, u64);

/// A block as cached: its batches and the offset after its last record.
#[derive(Clone)]
pub(crate) struct Block {
    pub batches: Bytes,
    pub next_offset: u64,
}

/// Recently read history blocks, at most `capacity` bytes of them. Cheap to share behind an
/// `Arc`; a capacity of 0 turns sharing off (every read goes to the file).
pub struct ReadCache {
    capacity: usize,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Default)]
struct Inner {
    blocks: HashMap<BlockKey, Block>,
    order: VecDeque<BlockKey>,
    bytes: usize,
}

impl ReadCache {
    pub fn new(capacity: usize) -> ReadCache {
        ReadCache {
            capacity,
            inner: Mutex::new(Inner::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The most bytes of blocks kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Reads served from the cache since start.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Block reads that went to the file since start.
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }

    pub(crate) fn get(&self, key: &BlockKey) -> Option<Block> {
        let found = self.inner.lock().blocks.get(key).cloned();
        match found {
            Some(_) => self.hits.fetch_add(1, Ordering::Relaxed),
            None => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        found
    }

    pub(crate) fn insert(&self, key: BlockKey, block: Block) {
        let len = block.batches.len();
        if len > self.capacity {
            return;
        }
        let mut inner = self.inner.lock();
        if let Some(old) = inner.blocks.insert(key, block) {
            // Two readers read the same block at once: keep one copy of its size.
            inner.bytes -= old.batches.len();
        } else {
            inner.order.push_back(key);
        }
        inner.bytes += len;
        while inner.bytes > self.capacity {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            if let Some(gone) = inner.blocks.remove(&oldest) {
                inner.bytes -= gone.batches.len();
            }
        }
    }
}

impl std::fmt::Debug for ReadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadCache")
            .field("capacity", &self.capacity)
            .field("bytes", &self.bytes())
            .field("hits", &self.hits())
            .field("misses", &self.misses())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(len: usize, next: u64) -> Block {
        Block {
            batches: Bytes::from(vec![7u8; len]),
            next_offset: next,
        }
    }

    #[test]
    fn evicts_the_oldest_blocks_beyond_capacity() {
        let cache = ReadCache::new(250);
        cache.insert((1, 0, 0), block(100, 10));
        cache.insert((1, 0, 10), block(100, 20));
        cache.insert((1, 0, 20), block(100, 30));
        assert!(cache.get(&(1, 0, 0)).is_none(), "oldest evicted");
        assert_eq!(cache.get(&(1, 0, 10)).map(|b| b.next_offset), Some(20));
        assert_eq!(cache.get(&(1, 0, 20)).map(|b| b.next_offset), Some(30));
        assert_eq!(cache.bytes(), 200);
        assert_eq!((cache.hits(), cache.misses()), (2, 1));
    }

    #[test]
    fn a_block_inserted_twice_is_counted_once() {
        let cache = ReadCache::new(1000);
        cache.insert((1, 0, 0), block(100, 10));
        cache.insert((1, 0, 0), block(100, 10));
        assert_eq!(cache.bytes(), 100);
    }

    #[test]
    fn a_block_larger_than_the_cache_is_not_kept() {
        let cache = ReadCache::new(50);
        cache.insert((1, 0, 0), block(100, 10));
        assert_eq!(cache.bytes(), 0);
        assert!(cache.get(&(1, 0, 0)).is_none());
    }
}
