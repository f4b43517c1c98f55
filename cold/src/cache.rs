//! Cold reads through a cache: object footers (as fetched) and row groups (decoded into
//! record batches) in a foyer `HybridCache` (memory + local disk), the row groups being
//! read indexed in a small memory cache for sequential readers, and read-ahead so a
//! catching-up reader finds the next row groups already fetched.
//!
//! Identical concurrent fetches are coalesced (footers by the hybrid cache's
//! `get_or_fetch`, row groups by a single-flight map around fetch and decode): ten
//! subscribers replaying the same object cost one GET and one decode per row group. Every
//! fetch goes through the [`TierStore`], whose concurrency limit keeps cold reads from
//! crowding the uploads and, through them, the publish path.

use std::collections::HashSet;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use foyer::{
    BlockEngineConfig, DeviceBuilder, FsDeviceBuilder, HybridCache, HybridCacheBuilder,
    HybridCachePolicy, Source,
};
use parking_lot::Mutex;

use crate::decode_pool::DecodePool;
use crate::error::ColdError;
use crate::head::Heads;
use crate::lru::{InFlight, Lru};
use crate::ranged::{concat, split_get};
use crate::read_ahead::{ReadAhead, ReadAheadConfig};
use crate::segment::{DecodedRowGroup, ObjectFooter, decode_row_group};
use crate::store::TierStore;

/// How much the cache may hold. The defaults are fixed sizes, never a share of free disk:
/// a broker's disk belongs to its hot logs first.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Directory of the disk tier (created if missing).
    pub dir: PathBuf,
    /// Memory tier of the hybrid cache (footers, decoded row groups).
    pub memory_bytes: usize,
    /// Disk tier; 0 keeps the cache in memory only.
    pub disk_bytes: u64,
    /// Indexed row groups kept for sequential readers (they share their bytes with the
    /// memory tier while both hold them).
    pub decoded_bytes: usize,
    /// Row groups a sequential reader fetches ahead of the one it reads, at least (the
    /// store's measured latency may call for more, see [`crate::read_ahead`]).
    pub prefetch_row_groups: usize,
    /// Bytes fetched ahead of readers and not yet read, across all readers
    /// ([`crate::read_ahead`]). The indexed row groups kept for readers get this much room
    /// on top of `decoded_bytes`, so what is fetched ahead is still there when it is read.
    pub read_ahead_bytes: u64,
    /// Threads that decode fetched row groups, at a lower priority than the publish path
    /// ([`DecodePool`]); every cold reader of the broker shares them.
    pub decode_threads: usize,
    /// Bytes fetched from an object's start beside its footer when a reader starts at the
    /// object's beginning, so its first row group comes in the same round trip
    /// ([`crate::head`]); a little more than one row group. 0 fetches the footer first.
    pub head_bytes: u64,
}

impl CacheConfig {
    pub fn new(dir: impl Into<PathBuf>) -> CacheConfig {
        CacheConfig {
            dir: dir.into(),
            memory_bytes: 64 << 20,
            disk_bytes: 1 << 30,
            decoded_bytes: 64 << 20,
            prefetch_row_groups: 2,
            read_ahead_bytes: 64 << 20,
            decode_threads: 2,
            head_bytes: head_bytes_for(4 << 20),
        }
    }
}

/// [`CacheConfig::head_bytes`] for objects written with row groups of `row_group_bytes`
/// input bytes: a quarter more, since a row group ends at the first batch boundary past
/// that size and its Parquet form can be a little larger than its input.
pub fn head_bytes_for(row_group_bytes: usize) -> u64 {
    let rg = row_group_bytes as u64;
    rg.saturating_add(rg / 4)
}

/// How much may wait to be written to the disk tier. foyer drops an insertion, silently,
/// while more than this is queued; at its default (16 MiB, about two decoded row groups) a
/// cold replay that decodes faster than the disk writes loses row groups from the
/// disk tier, and the next replay of the same history fetched them again. What waits is
/// held anyway (the entries share their bytes with the memory tier and the readers), so the
/// queue may hold what read-ahead can have in flight, bounded by a quarter of the disk tier.
fn disk_queue_bytes(config: &CacheConfig) -> usize {
    let want = config.read_ahead_bytes.max(64 << 20);
    want.min(config.disk_bytes / 4).max(16 << 20) as usize
}

/// Counters since start.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Footer and row group lookups served without a GET.
    pub hits: AtomicU64,
    /// Lookups that had to fetch from the object store.
    pub misses: AtomicU64,
}

impl CacheStats {
    /// Hits over lookups, or `None` before the first lookup.
    pub fn hit_rate(&self) -> Option<f64> {
        let h = self.hits.load(Ordering::Relaxed);
        let m = self.misses.load(Ordering::Relaxed);
        (h + m > 0).then(|| h as f64 / (h + m) as f64)
    }
}

/// An object as the cache knows it: its key, its size (both from the manifest) and its
/// version, the checksum recorded with it. Cache entries are keyed by key *and* version, so
/// an object key reused with other content (a stream deleted and created again) can never
/// be served from entries of the old object, also not from a disk tier recovered after a
/// restart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    pub key: String,
    pub size: u64,
    pub version: String,
    /// The first offset the object holds (a reader from here wants its first row group).
    pub base_offset: u64,
}

impl ObjectRef {
    /// The reference of a manifest entry (`None` for an entry without an object).
    pub fn of(entry: &felix_model::SegmentEntry) -> Option<ObjectRef> {
        Some(ObjectRef {
            key: entry.object_key.clone()?,
            size: entry.size_bytes,
            version: entry.checksum.clone().unwrap_or_default(),
            base_offset: entry.base_offset,
        })
    }

    /// The cache's name for this object.
    fn id(&self) -> String {
        format!("{}@{}", self.key, self.version)
    }
}

/// What one cold read returned.
#[derive(Debug, Clone)]
pub struct ColdRead {
    /// Whole RecordBatch v2 batches; the first holds the requested offset.
    pub batches: Bytes,
    /// One past the last offset returned (the requested offset if nothing was).
    pub next_offset: u64,
    /// Row groups of the object after the one this read came from (0 when nothing was read).
    pub row_groups_after: usize,
}

struct Inner {
    store: TierStore,
    hybrid: HybridCache<String, Bytes>,
    /// By [`ObjectRef::id`].
    footers: Mutex<Lru<String, ObjectFooter>>,
    /// Footers being fetched and parsed now, by object id: everyone who asks meanwhile
    /// waits for that one parse.
    footers_loading: InFlight<String, ObjectFooter>,
    /// Objects with a read-ahead task waiting for their footer ([`ColdCache::prefetch_object`]).
    objects_prefetching: Mutex<HashSet<String>>,
    decoded: Mutex<Lru<(String, usize), DecodedRowGroup>>,
    /// Row groups being fetched and decoded now: a reader that arrives while read-ahead
    /// (or another reader) decodes the same row group waits for that decode instead of
    /// decoding it again.
    decoding: InFlight<(String, usize), DecodedRowGroup>,
    decoder: DecodePool,
    read_ahead: ReadAhead,
    heads: Heads,
    config: CacheConfig,
    stats: CacheStats,
}

/// The cold tier's read cache. Cheap to clone.
#[derive(Clone)]
pub struct ColdCache {
    inner: Arc<Inner>,
}

impl ColdCache {
    /// Opens the cache. The disk tier recovers what an earlier run left in it (entries are
    /// versioned, see [`ObjectRef`]); a cache directory can also be wiped while the broker
    /// is stopped.
    pub async fn open(store: TierStore, config: CacheConfig) -> Result<ColdCache, ColdError> {
        let builder = HybridCacheBuilder::new()
            .with_name("felix-cold")
            .with_policy(HybridCachePolicy::WriteOnInsertion)
            .memory(config.memory_bytes.max(1 << 20))
            .with_weighter(|k: &String, v: &Bytes| k.len() + v.len())
            .storage();
        let hybrid = if config.disk_bytes > 0 {
            std::fs::create_dir_all(&config.dir).map_err(|e| {
                ColdError::Cache(format!("cannot create {}: {e}", config.dir.display()))
            })?;
            // Direct I/O keeps the disk tier out of the page cache: a long cold replay then
            // neither pays a kernel copy per byte written and read nor evicts the hot
            // logs' pages, which live reads depend on. The memory tier in front of it holds
            // what is read again soon.
            let direct = supports_direct_io(&config.dir);
            if !direct {
                tracing::info!(
                    dir = %config.dir.display(),
                    "the cold cache's file system refuses direct I/O; using buffered I/O"
                );
            }
            let device = FsDeviceBuilder::new(&config.dir)
                .with_capacity(config.disk_bytes as usize)
                .with_direct(direct)
                .build()
                .map_err(|e| ColdError::Cache(format!("disk tier: {e}")))?;
            // Blocks must hold a whole row group (a few MiB); smaller disks get smaller
            // blocks so there are still several to rotate through.
            let block = (config.disk_bytes / 8).clamp(1 << 20, 16 << 20) as usize;
            builder
                .with_engine_config(
                    BlockEngineConfig::new(device)
                        .with_block_size(block)
                        .with_buffer_pool_size(2 * block)
                        .with_submit_queue_size_threshold(disk_queue_bytes(&config)),
                )
                .build()
                .await
        } else {
            builder.build().await
        }
        .map_err(|e| ColdError::Cache(e.to_string()))?;
        let decoder = DecodePool::new(config.decode_threads)
            .map_err(|e| ColdError::Cache(format!("cannot start the decode threads: {e}")))?;
        let read_ahead = ReadAhead::new(ReadAheadConfig {
            min_depth: config.prefetch_row_groups,
            // A quarter of the store's permits stay free for uploads (and through them the
            // publish path's disk), however far readers want to read ahead.
            max_in_flight: (store.max_concurrency() * 3 / 4).max(1),
            budget_bytes: config.read_ahead_bytes,
            decode_threads: config.decode_threads,
        });
        Ok(ColdCache {
            inner: Arc::new(Inner {
                store,
                hybrid,
                footers: Mutex::new(Lru::new(16 << 20)),
                footers_loading: InFlight::new(),
                objects_prefetching: Mutex::new(HashSet::new()),
                decoded: Mutex::new(Lru::new(
                    config
                        .decoded_bytes
                        .max(1 << 20)
                        .saturating_add(config.read_ahead_bytes as usize),
                )),
                decoding: InFlight::new(),
                decoder,
                read_ahead,
                heads: Heads::new(config.head_bytes),
                config,
                stats: CacheStats::default(),
            }),
        })
    }

    pub fn stats(&self) -> &CacheStats {
        &self.inner.stats
    }

    pub fn store(&self) -> &TierStore {
        &self.inner.store
    }

    /// The read-ahead's state (depth, bytes held, fetches in flight), for metrics.
    pub fn read_ahead(&self) -> &ReadAhead {
        &self.inner.read_ahead
    }

    /// Flushes and closes the disk tier.
    pub async fn close(&self) {
        if let Err(e) = self.inner.hybrid.close().await {
            tracing::warn!(error = %e, "closing the cold cache failed");
        }
    }

    /// Forgets what is cached for an object (it was deleted by retention), to free space
    /// early; correctness does not depend on it (entries are versioned).
    pub fn forget(&self, object: &ObjectRef) {
        let i = &self.inner;
        let id = object.id();
        i.hybrid.remove(&footer_key(&id));
        if let Some(f) = i.footers.lock().get(&id) {
            for n in 0..f.row_groups.len() {
                i.hybrid.remove(&row_group_key(&id, n));
            }
        }
        i.footers.lock().remove_where(|k| *k == id);
        i.decoded.lock().remove_where(|(k, _)| *k == id);
    }

    /// The parsed footer of an object.
    pub async fn footer(&self, object: &ObjectRef) -> Result<Arc<ObjectFooter>, ColdError> {
        self.footer_for(object, false).await
    }

    /// The parsed footer of an object; with `head`, if the footer must be fetched, the
    /// object's first bytes are fetched beside it ([`crate::head`]): the caller is about to
    /// read the first row group.
    async fn footer_for(
        &self,
        object: &ObjectRef,
        head: bool,
    ) -> Result<Arc<ObjectFooter>, ColdError> {
        let i = &self.inner;
        let id = object.id();
        if let Some(f) = i.footers.lock().get(&id) {
            i.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(f);
        }
        // One fetch and one parse however many ask while the footer is on its way: against
        // a distant store a reader near an object's end asks for the next object's footer
        // on every read until it arrives, and each used to parse it again (3-5% of a
        // broker's CPU in a cold replay at 30 ms per GET, profiled).
        // `load_footer` keeps the footer in the LRU itself.
        i.footers_loading
            .run(&id, || self.load_footer(object, &id, head), |_| {})
            .await
    }

    /// Fetches (or takes from the hybrid cache) and parses an object's footer, and keeps it
    /// in the footer LRU.
    async fn load_footer(
        &self,
        object: &ObjectRef,
        id: &str,
        head: bool,
    ) -> Result<Arc<ObjectFooter>, ColdError> {
        let i = &self.inner;
        let (key, size) = (object.key.as_str(), object.size);
        let this = self.clone();
        let owned = key.to_owned();
        let head_id = id.to_owned();
        let entry = i
            .hybrid
            .get_or_fetch(&footer_key(id), move || async move {
                // Only on a miss of both cache tiers: a warm object's row groups are
                // cached too, and a head would fetch them again.
                let store = &this.inner.store;
                if head {
                    this.inner.heads.start(store, head_id, &owned, size);
                }
                fetch_footer_bytes(store, &owned, size).await
            })
            .await
            .map_err(|e| fetch_error(key, e))?;
        self.count(entry.source());
        let tail = entry.value().clone();
        let footer = match ObjectFooter::parse(&tail, size) {
            Ok(Ok(f)) => f,
            Ok(Err(_)) => {
                return Err(ColdError::Inconsistent(format!(
                    "object {key}: the cached footer bytes are incomplete"
                )));
            }
            Err(source) => {
                // Do not keep bytes that do not parse: the next read fetches them again.
                i.hybrid.remove(&footer_key(id));
                return Err(ColdError::Segment {
                    key: key.to_owned(),
                    source,
                });
            }
        };
        let footer = Arc::new(footer);
        i.footers
            .lock()
            .insert(id.to_owned(), footer.clone(), tail.len());
        Ok(footer)
    }

    /// Row group `n` of an object, decoded back into record batches.
    pub async fn row_group(
        &self,
        object: &ObjectRef,
        footer: &Arc<ObjectFooter>,
        n: usize,
    ) -> Result<Arc<DecodedRowGroup>, ColdError> {
        self.row_group_for(object, footer, n, Fetch::Demand).await
    }

    async fn row_group_for(
        &self,
        object: &ObjectRef,
        footer: &Arc<ObjectFooter>,
        n: usize,
        fetch: Fetch,
    ) -> Result<Arc<DecodedRowGroup>, ColdError> {
        let i = &self.inner;
        let dkey = (object.id(), n);
        if let Some(rg) = i.decoded.lock().get(&dkey) {
            i.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(rg);
        }
        // The first to finish moves the decode into the LRU; a failed one is retried by the
        // next reader.
        i.decoding
            .run(
                &dkey,
                || self.fetch_and_decode(object, footer, n, fetch),
                |rg| {
                    i.decoded
                        .lock()
                        .insert(dkey.clone(), rg.clone(), rg.batches.len())
                },
            )
            .await
    }

    /// Row group `n` as the hybrid cache holds it: decoded batches, so a warm read costs a
    /// cache lookup and no Parquet decode. On a miss it is fetched with one ranged GET,
    /// decoded off the async workers and inserted (memory, then the disk tier).
    async fn fetch_and_decode(
        &self,
        object: &ObjectRef,
        footer: &Arc<ObjectFooter>,
        n: usize,
        fetch: Fetch,
    ) -> Result<Arc<DecodedRowGroup>, ColdError> {
        let i = &self.inner;
        let id = object.id();
        let key = object.key.as_str();
        let Some(info) = footer.row_groups.get(n) else {
            return Err(ColdError::Inconsistent(format!(
                "object {key} has no row group {n}"
            )));
        };
        let ckey = row_group_key(&id, n);
        match i.hybrid.get(&ckey).await {
            Ok(Some(entry)) => match DecodedRowGroup::from_batches(entry.value().clone()) {
                Ok(rg) if rg.covers(info.first_offset, info.last_offset) => {
                    i.stats.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(Arc::new(rg));
                }
                // Damaged or foreign bytes under our key: drop them and fetch again.
                _ => {
                    tracing::warn!(
                        key,
                        row_group = n,
                        "cached row group unusable; fetching it again"
                    );
                    i.hybrid.remove(&ckey);
                }
            },
            Ok(None) => {}
            // A disk-tier read error is a miss, not a failed read: the object store has it.
            Err(e) => tracing::warn!(key, row_group = n, error = %e, "cold cache lookup failed"),
        }
        i.stats.misses.fetch_add(1, Ordering::Relaxed);
        let raw = {
            let _in_flight = i.read_ahead.fetch_started();
            let started = std::time::Instant::now();
            let range = info.byte_range.clone();
            let last = footer.row_groups.last().map_or(0, |rg| rg.byte_range.end);
            let raw = match i.heads.take(&id, range.clone(), last).await {
                Some(head) if head.len() as u64 == range.end - range.start => head,
                Some(head) => {
                    // The row group starts in the head: fetch only the rest.
                    let rest = (range.start + head.len() as u64)..range.end;
                    let rest = fetch.get(&i.store, key, rest).await?;
                    concat(&[head, rest], (range.end - range.start) as usize)
                }
                None => fetch.get(&i.store, key, range).await?,
            };
            i.read_ahead.record_fetch(started.elapsed());
            raw
        };
        let f = footer.clone();
        let this = self.clone();
        // Decoding (zstd + rebuilding batches) is CPU work: off the async workers, on the
        // bounded, lower-priority decode threads. Timed on the thread, without the queue.
        let decoded = i
            .decoder
            .run(move || {
                let started = std::time::Instant::now();
                let decoded = decode_row_group(&f, n, raw);
                this.inner.read_ahead.record_decode(started.elapsed());
                decoded
            })
            .await
            .map_err(|e| ColdError::Cache(e.to_string()))?
            .map_err(|source| ColdError::Segment {
                key: key.to_owned(),
                source,
            })?;
        i.hybrid.insert(ckey, decoded.batches.clone());
        Ok(Arc::new(decoded))
    }

    /// Reads whole batches from one object, starting with the batch that holds `from`, up
    /// to about `max_bytes` (at least one batch if any is left in the object) and never
    /// reaching `end` (exclusive). Starts read-ahead of the following row groups.
    ///
    /// A read stays inside one row group, so what it returns is a slice of the cached
    /// batches, never a copy; a reader at a row group's end gets the rest of it and
    /// continues in the next row group with its next read.
    pub async fn read(
        &self,
        object: &ObjectRef,
        from: u64,
        max_bytes: usize,
        end: u64,
    ) -> Result<ColdRead, ColdError> {
        let footer = self.footer_for(object, from <= object.base_offset).await?;
        let mut out = ColdRead {
            batches: Bytes::new(),
            next_offset: from,
            row_groups_after: 0,
        };
        let Some(mut n) = footer.row_group_for(from) else {
            return Ok(out);
        };
        self.prefetch(object, &footer, n + 1);
        while n < footer.row_groups.len() {
            let rg = self.row_group(object, &footer, n).await?;
            self.inner.read_ahead.consumed(&(object.id(), n));
            let mut span: Option<std::ops::Range<usize>> = None;
            let mut at_end = false;
            for (first, next, range) in &rg.index {
                if *next <= out.next_offset {
                    continue;
                }
                if *first >= end {
                    at_end = true;
                    break;
                }
                let taken = span.as_ref().map_or(0, |s| s.len());
                if taken > 0 && taken + range.len() > max_bytes {
                    break;
                }
                span = Some(span.map_or(range.clone(), |s| s.start..range.end));
                out.next_offset = *next;
            }
            if let Some(span) = span {
                out.batches = rg.batches.slice(span);
                out.row_groups_after = footer.row_groups.len() - 1 - n;
                return Ok(out);
            }
            if at_end {
                break;
            }
            // Every batch of this row group lies before `from`: look in the next one.
            n += 1;
        }
        Ok(out)
    }

    /// Row groups a sequential reader fetches ahead now (measured, see
    /// [`crate::read_ahead`]).
    pub fn prefetch_depth(&self) -> usize {
        self.inner.read_ahead.depth()
    }

    /// Fetches and decodes row groups `from..from + depth` in the background, each once
    /// the read-ahead budget has room for it.
    pub fn prefetch(&self, object: &ObjectRef, footer: &Arc<ObjectFooter>, from: usize) {
        let depth = self.prefetch_depth();
        for n in from..(from + depth).min(footer.row_groups.len()) {
            let dkey = (object.id(), n);
            if self.inner.decoded.lock().get(&dkey).is_some()
                || !self.inner.read_ahead.schedule(&dkey)
            {
                continue;
            }
            let bytes = footer.row_groups[n].byte_range.end - footer.row_groups[n].byte_range.start;
            let this = self.clone();
            let object = object.clone();
            let footer = footer.clone();
            tokio::spawn(async move {
                let ra = &this.inner.read_ahead;
                if ra.reserve(&dkey, bytes).await {
                    // Someone may have fetched it while this waited for room.
                    if this.inner.decoded.lock().get(&dkey).is_some() {
                        ra.release(&dkey);
                    } else if let Err(e) =
                        this.row_group_for(&object, &footer, n, Fetch::Ahead).await
                    {
                        ra.release(&dkey);
                        tracing::debug!(key = object.key, row_group = n, error = %e, "read-ahead failed");
                    }
                }
                ra.finished(&dkey);
            });
        }
    }

    /// Fetches an object's footer and first row groups in the background (a sequential
    /// reader is about to cross into it). A reader near an object's end calls this on every
    /// read: with the footer known it only tops up the read-ahead, and while the footer is
    /// being fetched one task waits for it, not one per read.
    pub fn prefetch_object(&self, object: &ObjectRef) {
        if self.inner.config.prefetch_row_groups == 0 {
            return;
        }
        let id = object.id();
        let known = self.inner.footers.lock().get(&id);
        if let Some(footer) = known {
            self.prefetch(object, &footer, 0);
            return;
        }
        if !self.inner.objects_prefetching.lock().insert(id.clone()) {
            return;
        }
        let this = self.clone();
        let object = object.clone();
        tokio::spawn(async move {
            match this.footer_for(&object, true).await {
                Ok(footer) => this.prefetch(&object, &footer, 0),
                Err(e) => {
                    tracing::debug!(key = object.key, error = %e, "read-ahead of next object failed")
                }
            }
            this.inner.objects_prefetching.lock().remove(&id);
        });
    }

    fn count(&self, source: Source) {
        let c = match source {
            Source::Outer => &self.inner.stats.misses,
            _ => &self.inner.stats.hits,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether files in `dir` can be opened for direct I/O (tmpfs and some network file
/// systems refuse `O_DIRECT`).
fn supports_direct_io(dir: &std::path::Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join(".direct-io-probe");
    let ok = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// Who is waiting for a row group fetch.
#[derive(Debug, Clone, Copy)]
enum Fetch {
    /// A reader, now: its latency counts, so a large row group is fetched as several
    /// parallel ranged GETs (a bandwidth-capped store delivers each at its own rate).
    Demand,
    /// Read-ahead: throughput counts, so one GET per row group keeps the store's permits
    /// for more row groups in flight.
    Ahead,
}

impl Fetch {
    async fn get(
        self,
        store: &TierStore,
        key: &str,
        range: Range<u64>,
    ) -> Result<Bytes, ColdError> {
        match self {
            Fetch::Demand => split_get(store, key, range).await,
            Fetch::Ahead => Ok(store.get_range(key, range).await?),
        }
    }
}

fn footer_key(id: &str) -> String {
    format!("f|{id}")
}

/// Row groups are cached decoded ("d|"); "r|" entries (raw Parquet, written by earlier
/// versions) are never looked up again and age out of a recovered disk tier.
fn row_group_key(id: &str, n: usize) -> String {
    format!("d|{id}|{n}")
}

/// The tail of an object that holds its whole footer: one GET normally, two when the
/// footer is larger than the first guess.
async fn fetch_footer_bytes(store: &TierStore, key: &str, size: u64) -> Result<Bytes, ColdError> {
    let mut want = ObjectFooter::SUFFIX_HINT.min(size);
    loop {
        let tail = store.get_tail(key, size, want).await?;
        match ObjectFooter::parse(&tail, size) {
            Ok(Ok(_)) => return Ok(tail),
            Ok(Err(needed)) if needed > want && needed <= size => want = needed,
            Ok(Err(needed)) => {
                return Err(ColdError::Inconsistent(format!(
                    "object {key}: footer needs {needed} bytes of a {size}-byte object"
                )));
            }
            Err(source) => {
                return Err(ColdError::Segment {
                    key: key.to_owned(),
                    source,
                });
            }
        }
    }
}

fn fetch_error(key: &str, e: foyer::Error) -> ColdError {
    let message = match e.source() {
        Some(source) => format!("{source:#}"),
        None => e.to_string(),
    };
    ColdError::Fetch {
        key: key.to_owned(),
        message,
    }
}
