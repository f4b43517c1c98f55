//! How far a sequential cold reader fetches ahead, and how much memory read-ahead may hold.
//!
//! A cold replay is only as fast as local disk if the row groups it will read next are
//! already fetched when it gets there. How many that takes depends on the store: on
//! loopback a GET costs a millisecond and two row groups ahead are plenty; against S3 a GET
//! costs tens of milliseconds before its first byte and its bandwidth is capped, so a
//! reader needs as many GETs in flight as cover that latency while the decode threads work.
//! So the depth is measured, not fixed: from recent row-group GETs and decodes,
//!
//! ```text
//! depth = ceil(decode_threads × GET time / decode time) + 1
//! ```
//!
//! (enough fetches in flight that the decoders never wait for the store), never below the
//! configured `cold_prefetch_row_groups` and never above `max_in_flight` (a share of the
//! store's concurrency, so uploads keep permits of their own).
//!
//! Invariant: the bytes fetched ahead of readers and not yet read (counted as fetched, i.e.
//! compressed) never exceed the budget (`cold_read_ahead_bytes`). A read-ahead fetch that
//! would exceed it waits for room instead of growing; a reader reading a row group
//! releases what read-ahead held for it, and what no reader came for within
//! [`HOLD_TTL`] is released too (a reader that stopped or went away).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A row group: the cache's object id and its index.
pub type RowGroupKey = (String, usize);

/// Read-ahead held for a row group no reader read within this long is released.
pub const HOLD_TTL: Duration = Duration::from_secs(10);

/// Weight of a new sample in the moving averages: recent GETs say what the store does now.
const EWMA_WEIGHT: f64 = 0.2;

/// The read-ahead's bounds.
#[derive(Debug, Clone, Copy)]
pub struct ReadAheadConfig {
    /// Row groups ahead at least (`cold_prefetch_row_groups`); 0 turns read-ahead off.
    pub min_depth: usize,
    /// Row groups ahead at most, whatever the measurements say.
    pub max_in_flight: usize,
    /// Bytes fetched ahead and not yet read, across all readers.
    pub budget_bytes: u64,
    /// Decode threads: how many row groups are decoded at once.
    pub decode_threads: usize,
}

struct Held {
    _permit: OwnedSemaphorePermit,
    bytes: u64,
    since: Instant,
}

#[derive(Default, Clone, Copy)]
struct Averages {
    fetch_secs: Option<f64>,
    decode_secs: Option<f64>,
}

fn ewma(old: Option<f64>, sample: f64) -> Option<f64> {
    Some(match old {
        Some(o) => o + EWMA_WEIGHT * (sample - o),
        None => sample,
    })
}

/// The broker-wide read-ahead state (one per cold cache).
pub struct ReadAhead {
    config: ReadAheadConfig,
    budget: Arc<Semaphore>,
    /// Row groups read-ahead fetched (or is fetching) that no reader has read yet.
    held: Mutex<HashMap<RowGroupKey, Held>>,
    /// Row groups with a read-ahead task (waiting for room or fetching).
    scheduled: Mutex<HashSet<RowGroupKey>>,
    averages: Mutex<Averages>,
    held_bytes: AtomicU64,
    fetches_in_flight: AtomicU64,
}

/// Counts one row-group fetch in flight while alive.
pub struct FetchInFlight<'a>(&'a AtomicU64);

impl Drop for FetchInFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ReadAhead {
    pub fn new(config: ReadAheadConfig) -> ReadAhead {
        let permits = usize::try_from(config.budget_bytes.max(1)).unwrap_or(usize::MAX);
        ReadAhead {
            config,
            budget: Arc::new(Semaphore::new(permits.min(Semaphore::MAX_PERMITS))),
            held: Mutex::new(HashMap::new()),
            scheduled: Mutex::new(HashSet::new()),
            averages: Mutex::new(Averages::default()),
            held_bytes: AtomicU64::new(0),
            fetches_in_flight: AtomicU64::new(0),
        }
    }

    /// Row groups a sequential reader should have fetched ahead of the one it reads now.
    pub fn depth(&self) -> usize {
        let c = &self.config;
        if c.min_depth == 0 {
            return 0;
        }
        let a = *self.averages.lock();
        let measured = match (a.fetch_secs, a.decode_secs) {
            (Some(f), Some(d)) => {
                let per_decoder = f / d.max(1e-4);
                (c.decode_threads.max(1) as f64 * per_decoder).ceil() as usize + 1
            }
            _ => c.min_depth,
        };
        measured.clamp(c.min_depth, c.max_in_flight.max(c.min_depth))
    }

    /// Bytes fetched ahead of readers and not yet read.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// Row-group fetches from the store in flight now (reads and read-ahead).
    pub fn fetches_in_flight(&self) -> u64 {
        self.fetches_in_flight.load(Ordering::Relaxed)
    }

    /// The budget (`cold_read_ahead_bytes`).
    pub fn budget_bytes(&self) -> u64 {
        self.config.budget_bytes
    }

    /// Counts a row-group fetch as in flight until the returned guard drops.
    pub fn fetch_started(&self) -> FetchInFlight<'_> {
        self.fetches_in_flight.fetch_add(1, Ordering::Relaxed);
        FetchInFlight(&self.fetches_in_flight)
    }

    /// A row-group GET took `elapsed`.
    pub fn record_fetch(&self, elapsed: Duration) {
        let mut a = self.averages.lock();
        a.fetch_secs = ewma(a.fetch_secs, elapsed.as_secs_f64());
    }

    /// A row-group decode took `elapsed`.
    pub fn record_decode(&self, elapsed: Duration) {
        let mut a = self.averages.lock();
        a.decode_secs = ewma(a.decode_secs, elapsed.as_secs_f64());
    }

    /// Claims `key` for a read-ahead task: false if one is already scheduled or read-ahead
    /// already holds it.
    pub fn schedule(&self, key: &RowGroupKey) -> bool {
        self.release_stale();
        if self.held.lock().contains_key(key) {
            return false;
        }
        self.scheduled.lock().insert(key.clone())
    }

    /// Waits for room for `bytes` of read-ahead for `key`, then holds it until a reader
    /// reads `key` ([`ReadAhead::consumed`]) or [`HOLD_TTL`] passes. Returns false (holding
    /// nothing) when a reader got to `key` while this waited: the fetch is not needed.
    pub async fn reserve(&self, key: &RowGroupKey, bytes: u64) -> bool {
        // A row group larger than the whole budget may still be read ahead, alone.
        let want = bytes.clamp(1, self.config.budget_bytes.max(1));
        let want = u32::try_from(want).unwrap_or(u32::MAX);
        let Ok(permit) = self.budget.clone().acquire_many_owned(want).await else {
            return false;
        };
        if !self.scheduled.lock().contains(key) {
            return false;
        }
        self.held_bytes
            .fetch_add(u64::from(want), Ordering::Relaxed);
        let old = self.held.lock().insert(
            key.clone(),
            Held {
                _permit: permit,
                bytes: u64::from(want),
                since: Instant::now(),
            },
        );
        if let Some(old) = old {
            self.held_bytes.fetch_sub(old.bytes, Ordering::Relaxed);
        }
        true
    }

    /// The read-ahead task for `key` ended (fetched, failed or not needed).
    pub fn finished(&self, key: &RowGroupKey) {
        self.scheduled.lock().remove(key);
    }

    /// A reader read `key`: what read-ahead held for it is free again, and a task still
    /// waiting for room for it will not fetch it.
    pub fn consumed(&self, key: &RowGroupKey) {
        self.scheduled.lock().remove(key);
        self.release(key);
    }

    /// Releases what read-ahead held for `key` (a failed fetch, or a consumed one).
    pub fn release(&self, key: &RowGroupKey) {
        if let Some(h) = self.held.lock().remove(key) {
            self.held_bytes.fetch_sub(h.bytes, Ordering::Relaxed);
        }
    }

    fn release_stale(&self) {
        let mut held = self.held.lock();
        let now = Instant::now();
        held.retain(|_, h| {
            let keep = now.duration_since(h.since) < HOLD_TTL;
            if !keep {
                self.held_bytes.fetch_sub(h.bytes, Ordering::Relaxed);
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_ahead(budget_bytes: u64) -> ReadAhead {
        ReadAhead::new(ReadAheadConfig {
            min_depth: 2,
            max_in_flight: 12,
            budget_bytes,
            decode_threads: 2,
        })
    }

    fn key(n: usize) -> RowGroupKey {
        ("object@v".to_owned(), n)
    }

    #[test]
    fn depth_covers_the_measured_get_time_within_its_bounds() {
        let ra = read_ahead(1 << 20);
        assert_eq!(ra.depth(), 2, "no measurement yet: the configured floor");
        // A GET five times as slow as a decode, two decoders: 11 in flight.
        ra.record_fetch(Duration::from_millis(50));
        ra.record_decode(Duration::from_millis(10));
        assert_eq!(ra.depth(), 11);
        // Far slower: capped.
        let ra = read_ahead(1 << 20);
        ra.record_fetch(Duration::from_secs(1));
        ra.record_decode(Duration::from_millis(1));
        assert_eq!(ra.depth(), 12);
        // A fast local store: the floor.
        let ra = read_ahead(1 << 20);
        ra.record_fetch(Duration::from_micros(100));
        ra.record_decode(Duration::from_millis(10));
        assert_eq!(ra.depth(), 2);
    }

    #[tokio::test]
    async fn read_ahead_past_the_budget_waits_until_a_reader_frees_room() {
        let ra = Arc::new(read_ahead(100));
        assert!(ra.schedule(&key(0)));
        assert!(ra.reserve(&key(0), 60).await);
        assert!(!ra.schedule(&key(0)), "held: not scheduled twice");
        assert!(ra.schedule(&key(1)));
        let waiting = {
            let ra = ra.clone();
            tokio::spawn(async move { ra.reserve(&key(1), 60).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "60 + 60 bytes exceed the budget of 100"
        );
        assert_eq!(ra.held_bytes(), 60);
        ra.consumed(&key(0));
        assert!(waiting.await.expect("task"), "room freed by the reader");
        assert_eq!(ra.held_bytes(), 60);
        // A reader that reads a row group before its read-ahead got room cancels it.
        assert!(ra.schedule(&key(2)));
        let waiting = {
            let ra = ra.clone();
            tokio::spawn(async move { ra.reserve(&key(2), 60).await })
        };
        ra.consumed(&key(2));
        ra.consumed(&key(1));
        assert!(!waiting.await.expect("task"), "no longer wanted");
        assert_eq!(ra.held_bytes(), 0);
    }
}
