//! Tiering in process, end to end: a control plane, a shard's log with tiny segments, an
//! in-memory object store behind `FaultyStore` and `TierStore`, the cold cache, the
//! manifest, the tiered read path and the uploader, wired as the gateway wires them. Each
//! test is one promise of the tier, checked while the store fails in the way it names.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use felix_cold::ColdError;
use felix_cold::cache::{CacheConfig, ColdCache, ObjectRef};
use felix_cold::retention::{self, RetentionReport};
use felix_cold::segment::{EncodeOptions, ObjectInfo, encode_to_bytes};
use felix_cold::store::{StoreConfig, StoreError, TierStore};
use felix_cold::tiered::{Manifest, Tier, TieredRead, TieredShard};
use felix_cold::uploader::{NoObserver, Uploader, UploaderConfig, object_key};
use felix_hot::{LogConfig, SealedSegment, ShardLog};
use felix_meta::MemoryControlPlane;
use felix_meta::model::{SegmentEntry, ShardKey, StreamSettings, TierState};
use felix_meta::{Command, CommandError, MetaError};
use felix_testkit::faults::{Faults, FaultyStore};
use felix_wire::{BatchBuilder, BatchIter, Compression, DecodedBatch, Header, Record};
use object_store::memory::InMemory;

/// Timestamps of batch `i` lie in `[T0 + 1000 i, T0 + 1000 i + 100)`.
const T0: i64 = 1_700_000_000_000;

/// Deterministic bytes.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Batch `i` of a varied stream: 1 to 5 records; keys on some, tombstones (no value) on
/// some, zero to two headers (one without a value); timestamps not in record order.
fn varied_records(i: u64) -> Vec<Record> {
    (0..1 + i % 5)
        .map(|j| {
            let seed = i * 16 + j;
            Record {
                offset: 0,
                timestamp: T0 + 1000 * i as i64 + ((j * 37) % 100) as i64,
                key: (j % 3 != 0).then(|| Bytes::from(format!("key-{i}-{j}"))),
                value: (seed % 11 != 5)
                    .then(|| Bytes::from(pattern(40 + (seed as usize * 53) % 300, seed))),
                headers: (0..seed % 3)
                    .map(|h| Header {
                        key: format!("h{h}"),
                        value: (h != 1).then(|| Bytes::from(format!("v{i}.{j}.{h}"))),
                    })
                    .collect(),
            }
        })
        .collect()
}

/// One appended batch as the test remembers it: its offsets and its records (offsets
/// filled in as a reader decodes them).
#[derive(Debug, Clone)]
struct Sent {
    base: u64,
    last: u64,
    records: Vec<Record>,
}

/// How a test's rig is built.
#[derive(Debug, Clone)]
struct Options {
    segment_bytes: u64,
    row_group_bytes: usize,
    op_timeout: Duration,
    prefetch_row_groups: usize,
    /// `CacheConfig::head_bytes`: 0 (footer first) unless a test is about heads.
    head_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            segment_bytes: 4096,
            row_group_bytes: 4 << 20,
            op_timeout: Duration::from_millis(300),
            prefetch_row_groups: 2,
            head_bytes: 0,
        }
    }
}

/// One shard's tiering, wired as the gateway wires it.
struct Rig {
    _dir: tempfile::TempDir,
    /// The shard's manifest keeper: the control plane's rules, in memory (these tests are
    /// about the tier, not about Raft).
    meta: MemoryControlPlane,
    key: ShardKey,
    log: ShardLog,
    store: TierStore,
    faults: Faults,
    cache: ColdCache,
    manifest: Arc<Manifest>,
    shard: TieredShard,
    opts: Options,
    sent: Vec<Sent>,
}

impl Rig {
    async fn start(opts: Options) -> Rig {
        let dir = tempfile::tempdir().expect("temp dir");
        let key = ShardKey {
            tenant: "acme".into(),
            namespace: "prod".into(),
            stream: "orders".into(),
            shard: 0,
        };
        let meta = MemoryControlPlane::with_stream(&key, StreamSettings::default())
            .await
            .expect("control plane command");
        let log = ShardLog::open(
            dir.path().join("log"),
            LogConfig {
                shard: key.to_string(),
                segment_bytes: opts.segment_bytes,
                segment_age: None,
                ..LogConfig::default()
            },
        )
        .expect("log opens");
        let faulty = FaultyStore::new(Arc::new(InMemory::new()));
        let faults = faulty.faults();
        let store = TierStore::with_store(
            Arc::new(faulty),
            "tier",
            &StoreConfig {
                url: "memory://".into(),
                op_timeout: opts.op_timeout,
                max_retries: 1,
                retry_backoff: Duration::from_millis(10),
                ..StoreConfig::default()
            },
            "faulty memory".into(),
        );
        let cache = ColdCache::open(
            store.clone(),
            CacheConfig {
                dir: dir.path().join("cache"),
                memory_bytes: 4 << 20,
                disk_bytes: 16 << 20,
                decoded_bytes: 4 << 20,
                read_ahead_bytes: 16 << 20,
                prefetch_row_groups: opts.prefetch_row_groups,
                decode_threads: 2,
                head_bytes: opts.head_bytes,
            },
        )
        .await
        .expect("cache opens");
        let manifest = Arc::new(Manifest::load(&meta, &key).await.expect("manifest loads"));
        let shard = TieredShard::new(
            key.clone(),
            log.clone(),
            manifest.clone(),
            Some(cache.clone()),
        );
        Rig {
            _dir: dir,
            meta,
            key,
            log,
            store,
            faults,
            cache,
            manifest,
            shard,
            opts,
            sent: Vec::new(),
        }
    }

    fn encode_options(&self) -> EncodeOptions {
        EncodeOptions {
            row_group_bytes: self.opts.row_group_bytes,
            ..EncodeOptions::default()
        }
    }

    fn uploader(&self) -> Uploader {
        Uploader::new(
            self.key.clone(),
            self.log.clone(),
            self.manifest.clone(),
            self.store.clone(),
            self.meta.clone(),
            1,
            UploaderConfig {
                encode: self.encode_options(),
                read_chunk: 64 << 10,
                retry_initial: Duration::from_millis(10),
                retry_max: Duration::from_millis(50),
                poll: Duration::from_millis(50),
            },
            Arc::new(NoObserver),
        )
    }

    /// Appends one batch of `records` and waits for its commit.
    async fn append(&mut self, mut records: Vec<Record>) -> Sent {
        let mut builder = BatchBuilder::new(Compression::None);
        for r in &records {
            builder.push(r.clone());
        }
        let bytes = builder.build().expect("batch encodes");
        let (base, last) = self
            .log
            .append(bytes)
            .await
            .expect("append accepted")
            .committed()
            .await
            .expect("append committed");
        assert_eq!(last - base + 1, records.len() as u64);
        for (n, r) in records.iter_mut().enumerate() {
            r.offset = (base + n as u64) as i64;
        }
        let sent = Sent {
            base,
            last,
            records,
        };
        self.sent.push(sent.clone());
        sent
    }

    /// Appends varied batches until at least `n` segments are sealed, then a few more so
    /// the active segment (the hot tail) holds records too.
    async fn append_until_sealed(&mut self, n: usize) {
        while self.log.sealed_segments().len() < n {
            let i = self.sent.len() as u64;
            self.append(varied_records(i)).await;
        }
        for _ in 0..3 {
            let i = self.sent.len() as u64;
            self.append(varied_records(i)).await;
        }
    }

    fn sealed(&self) -> Vec<SealedSegment> {
        self.log.sealed_segments()
    }

    /// Calls `upload_next` until it has nothing to do; returns how many objects it did.
    async fn upload_all(&self, uploader: &mut Uploader) -> usize {
        let mut n = 0;
        while uploader.upload_next().await.expect("upload") {
            n += 1;
        }
        n
    }

    /// Appends until `n` segments are sealed, uploads them all and drops the local copies
    /// (hot retention zero); returns the recorded objects.
    async fn all_cold(&mut self, n: usize) -> Vec<SegmentEntry> {
        self.append_until_sealed(n).await;
        let mut uploader = self.uploader();
        self.upload_all(&mut uploader).await;
        self.enforce(&hot_retention_zero(), self.log.committed_offset())
            .await;
        self.recorded().await
    }

    /// The shard's manifest as the control plane has it (a linearizable read).
    async fn recorded(&self) -> Vec<SegmentEntry> {
        let key = self.key.clone();
        self.meta
            .read(move |s| {
                s.manifests
                    .get(&key)
                    .map(|m| m.values().cloned().collect())
                    .unwrap_or_default()
            })
            .await
            .expect("control plane read")
    }

    /// The recorded ranges, checked to tile `0..` without a gap or an overlap, and checked
    /// to agree with the broker's copy of the manifest.
    async fn recorded_ranges(&self) -> Vec<(u64, u64)> {
        let entries = self.recorded().await;
        let local: Vec<SegmentEntry> = self.manifest.snapshot().objects.into_values().collect();
        assert_eq!(
            local, entries,
            "the broker's manifest is the control plane's"
        );
        let ranges: Vec<(u64, u64)> = entries
            .iter()
            .map(|e| (e.base_offset, e.last_offset))
            .collect();
        let floor = self.manifest.floor();
        for (n, w) in ranges.iter().enumerate() {
            let expected = if n == 0 { floor } else { ranges[n - 1].1 + 1 };
            assert_eq!(w.0, expected, "object {n} of {ranges:?} does not follow");
        }
        ranges
    }

    /// Applies `settings` once, as the gateway's retention task does.
    async fn enforce(&self, settings: &StreamSettings, acked_end: u64) -> RetentionReport {
        retention::enforce(&self.shard, &self.meta, settings, acked_end, now_ms())
            .await
            .expect("retention pass")
    }

    /// Writes an object for `base..=last` from the log, as another uploader would (with
    /// its own encode options), and returns its manifest entry (not yet recorded).
    async fn put_object(&self, base: u64, last: u64, opts: &EncodeOptions) -> SegmentEntry {
        let mut batches = Vec::new();
        let mut pos = base;
        while pos <= last {
            let read = self
                .log
                .read(pos, 1 << 20, Some(last + 1))
                .expect("log read");
            assert!(read.next_offset > pos, "log read at {pos} makes progress");
            batches.extend_from_slice(&read.batches);
            pos = read.next_offset;
        }
        let info = ObjectInfo {
            tenant: self.key.tenant.clone(),
            namespace: self.key.namespace.clone(),
            stream: self.key.stream.clone(),
            shard: self.key.shard,
        };
        let (bytes, summary) = encode_to_bytes(&batches, &info, opts)
            .await
            .expect("object encodes");
        let key = object_key(&self.key, base, last);
        let size = bytes.len() as u64;
        self.store.put(&key, bytes).await.expect("object stored");
        SegmentEntry {
            base_offset: base,
            last_offset: last,
            min_timestamp: summary.min_timestamp,
            max_timestamp: summary.max_timestamp,
            size_bytes: size,
            tier: TierState::Cold,
            object_key: Some(key),
            checksum: None,
            local_copies: [2].into(),
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A tiered stream whose local copy keeps nothing the manifest covers.
fn hot_retention_zero() -> StreamSettings {
    StreamSettings {
        tiered: true,
        hot_retention_bytes: Some(0),
        ..StreamSettings::default()
    }
}

/// Reads from `from` to the committed end through the tiered read path, `max_bytes` at a
/// time. Checks that every read returns whole batches starting with the one that holds the
/// requested offset, that `next_offset` follows the last batch, and that the batches are
/// contiguous.
async fn read_all(shard: &TieredShard, from: u64, max_bytes: usize) -> Vec<(Tier, DecodedBatch)> {
    let end = shard.log.committed_offset();
    let mut out: Vec<(Tier, DecodedBatch)> = Vec::new();
    let mut next = from;
    while next < end {
        let read = shard
            .read(next, max_bytes, None)
            .await
            .unwrap_or_else(|e| panic!("tiered read at {next}: {e}"));
        let batches = decode_all(&read.batches);
        let (first, last) = match (batches.first(), batches.last()) {
            (Some(f), Some(l)) => (&f.header, &l.header),
            _ => panic!("tiered read at {next} below the committed end {end} returned nothing"),
        };
        assert!(
            first.base_offset as u64 <= next && next <= first.last_offset() as u64,
            "the read at {next} starts with the batch holding it, not {}..={}",
            first.base_offset,
            first.last_offset()
        );
        assert_eq!(read.next_offset, last.last_offset() as u64 + 1);
        for b in batches {
            if let Some((_, prev)) = out.last() {
                assert_eq!(
                    b.header.base_offset,
                    prev.header.last_offset() + 1,
                    "gap or repeat after offset {}",
                    prev.header.last_offset()
                );
            }
            out.push((read.tier, b));
        }
        next = read.next_offset;
    }
    out
}

/// The cache's reference to a recorded object.
/// Reads one cold object from its first offset to its last, read after read (a read
/// stays inside one row group), as one `TieredRead`.
async fn read_whole_object(shard: &TieredShard, o: SegmentEntry) -> Result<TieredRead, ColdError> {
    let mut at = o.base_offset;
    let mut bytes = Vec::new();
    let mut tier = Tier::Cold;
    while at <= o.last_offset {
        let read = shard.read(at, 1 << 20, Some(o.last_offset + 1)).await?;
        assert!(read.next_offset > at, "a read at {at} made progress");
        bytes.extend_from_slice(&read.batches);
        tier = read.tier;
        at = read.next_offset;
    }
    Ok(TieredRead {
        batches: bytes.into(),
        next_offset: at,
        tier,
        hot_damage: None,
    })
}

fn object_ref(entry: &SegmentEntry) -> ObjectRef {
    ObjectRef::of(entry).expect("a recorded object has a key")
}

fn decode_all(buf: &[u8]) -> Vec<DecodedBatch> {
    BatchIter::new(buf, usize::MAX)
        .map(|b| {
            let (_, bytes) = b.expect("a read returns whole, valid batches");
            DecodedBatch::decode(bytes, usize::MAX).expect("a returned batch decodes")
        })
        .collect()
}

/// Every batch read back is the batch sent: offsets, keys, values, headers, timestamps.
fn assert_same_batches(got: &[(Tier, DecodedBatch)], sent: &[Sent]) {
    assert_eq!(got.len(), sent.len(), "batches read back");
    for ((_, g), s) in got.iter().zip(sent) {
        assert_eq!(
            (g.header.base_offset as u64, g.header.last_offset() as u64),
            (s.base, s.last)
        );
        assert_eq!(g.records, s.records, "records of the batch at {}", s.base);
    }
}

/// The messages of an error and its sources.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(" <- ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploaded_history_reads_back_identical_from_cold_into_the_hot_tail() {
    let mut rig = Rig::start(Options::default()).await;
    rig.append_until_sealed(6).await;
    let sealed = rig.sealed();
    let mut uploader = rig.uploader();
    assert_eq!(rig.upload_all(&mut uploader).await, sealed.len());
    assert_eq!(
        rig.recorded_ranges().await,
        sealed
            .iter()
            .map(|s| (s.base_offset, s.last_offset))
            .collect::<Vec<_>>(),
        "one object per sealed segment"
    );
    let objects = rig.store.list("").await.expect("list");
    assert_eq!(objects.len(), sealed.len(), "{objects:?}");

    let report = rig
        .enforce(&hot_retention_zero(), rig.log.committed_offset())
        .await;
    assert_eq!(report.segments_deleted, sealed.len());
    assert!(
        rig.sealed().is_empty(),
        "every uploaded segment was deleted locally"
    );
    let hot_first = rig.log.first_offset();
    assert_eq!(hot_first, sealed.last().expect("sealed").last_offset + 1);
    assert_eq!(rig.shard.earliest_offset(), 0);
    assert_eq!(report.earliest_offset, 0);

    let got = read_all(&rig.shard, 0, 3000).await;
    assert_same_batches(&got, &rig.sent);
    for (tier, b) in &got {
        let expected = if (b.header.base_offset as u64) < hot_first {
            Tier::Cold
        } else {
            Tier::Hot
        };
        assert_eq!(
            *tier, expected,
            "tier of the batch at {}",
            b.header.base_offset
        );
    }
    assert!(
        got.iter().any(|(t, _)| *t == Tier::Hot),
        "the hot tail is read"
    );

    // A read from inside a batch returns the batch that holds the offset, in both tiers.
    for s in rig.sent.iter().filter(|s| s.last > s.base) {
        let read = rig.shard.read(s.base + 1, 1, None).await.expect("read");
        let batches = decode_all(&read.batches);
        assert_eq!(batches.len(), 1, "one batch within a 1-byte budget");
        assert_eq!(batches[0].header.base_offset as u64, s.base);
        assert_eq!(batches[0].records, s.records);
        assert_eq!(read.next_offset, s.last + 1);
        assert_eq!(
            read.tier,
            if s.base < hot_first {
                Tier::Cold
            } else {
                Tier::Hot
            }
        );
    }

    // Time lookups find cold batches (and hot ones) at batch granularity.
    for (i, s) in rig.sent.iter().enumerate() {
        let found = rig
            .shard
            .offset_for_time(T0 + 1000 * i as i64)
            .await
            .expect("offset for time");
        assert_eq!(found, Some(s.base), "batch {i}");
    }
    assert_eq!(
        rig.shard
            .offset_for_time(T0 + 1000 * rig.sent.len() as i64)
            .await
            .expect("offset for time"),
        None,
        "nothing that new"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_put_acknowledgement_is_retried_and_each_range_is_recorded_once() {
    let mut rig = Rig::start(Options::default()).await;
    rig.append_until_sealed(4).await;
    let sealed = rig.sealed();
    let mut uploader = rig.uploader();

    // One lost answer: the store's own retry writes the same object again and succeeds.
    rig.faults.ack_lost_next_puts(1);
    assert!(uploader.upload_next().await.expect("the retry succeeds"));
    assert_eq!(rig.faults.injected_failures(), 1);
    assert!(rig.store.stats().retries >= 1, "{:?}", rig.store.stats());

    // As many lost answers as attempts: the upload fails, the object exists but is not
    // recorded, and the segment stays local.
    rig.faults.ack_lost_next_puts(2);
    let err = uploader
        .upload_next()
        .await
        .expect_err("every PUT answer was lost");
    assert_eq!(rig.faults.injected_failures(), 3, "{}", error_chain(&err));
    let (base, last) = (sealed[1].base_offset, sealed[1].last_offset);
    let key = object_key(&rig.key, base, last);
    assert!(rig.store.head(&key).await.is_ok(), "the PUT itself landed");
    assert_eq!(rig.recorded_ranges().await.len(), 1, "not recorded");
    assert_eq!(uploader.next_range(), Some((base, last)), "retried next");
    assert_eq!(rig.sealed().len(), sealed.len());

    // The retry replaces the object and records the range once.
    rig.upload_all(&mut uploader).await;
    let expected: Vec<(u64, u64)> = sealed
        .iter()
        .map(|s| (s.base_offset, s.last_offset))
        .collect();
    assert_eq!(rig.recorded_ranges().await, expected);
    assert_eq!(rig.store.list("").await.expect("list").len(), sealed.len());

    rig.enforce(&hot_retention_zero(), rig.log.committed_offset())
        .await;
    assert!(rig.sealed().is_empty());
    let got = read_all(&rig.shard, 0, 1 << 20).await;
    assert_same_batches(&got, &rig.sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_multipart_completion_fails_the_upload_and_the_retry_records_it_once() {
    // A segment larger than BufWriter's 10 MiB buffer goes up as a multipart upload, whose
    // completion the store does not retry.
    let mut rig = Rig::start(Options {
        segment_bytes: 12 << 20,
        row_group_bytes: 2 << 20,
        op_timeout: Duration::from_secs(5),
        ..Options::default()
    })
    .await;
    let mut i = 0u64;
    while rig.sealed().is_empty() {
        // Incompressible values, so the object is as large as the segment.
        let records = (0..4)
            .map(|j| Record::value(T0 + i as i64, pattern(256 << 10, i * 4 + j)))
            .collect();
        rig.append(records).await;
        i += 1;
    }
    let sealed = rig.sealed();
    assert_eq!(sealed.len(), 1);
    let mut uploader = rig.uploader();

    rig.faults.ack_lost_next_puts(1);
    let parts = rig.faults.parts();
    let err = uploader
        .upload_next()
        .await
        .expect_err("the completion's answer was lost");
    assert!(
        rig.faults.parts() > parts,
        "a multipart upload: {}",
        error_chain(&err)
    );
    assert!(rig.recorded().await.is_empty(), "not recorded");
    let key = object_key(&rig.key, 0, sealed[0].last_offset);
    assert!(
        rig.store.head(&key).await.is_ok(),
        "the object was completed"
    );

    assert!(uploader.upload_next().await.expect("the retry succeeds"));
    assert!(!uploader.upload_next().await.expect("nothing left"));
    assert_eq!(
        rig.recorded_ranges().await,
        vec![(0, sealed[0].last_offset)]
    );
    let recorded = rig.recorded().await;
    assert_eq!(
        Some(recorded[0].size_bytes),
        rig.store.head(&key).await.ok(),
        "the manifest has the stored object's size"
    );

    rig.enforce(&hot_retention_zero(), rig.log.committed_offset())
        .await;
    assert!(rig.sealed().is_empty());
    let got = read_all(&rig.shard, 0, 4 << 20).await;
    assert_same_batches(&got, &rig.sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_or_hanging_keeps_every_local_segment_until_uploads_catch_up() {
    let mut rig = Rig::start(Options::default()).await;
    rig.append_until_sealed(3).await;
    let mut uploader = rig.uploader();
    let hot = hot_retention_zero();

    // Down: every call is refused at once.
    rig.faults.set_down(true);
    let err = uploader.upload_next().await.expect_err("store down");
    assert!(
        error_chain(&err).contains("object store down"),
        "{}",
        error_chain(&err)
    );
    assert!(rig.recorded().await.is_empty(), "nothing recorded");
    let sealed = rig.sealed();
    let report = rig.enforce(&hot, rig.log.committed_offset()).await;
    assert_eq!(
        report.segments_deleted, 0,
        "nothing uploaded, nothing deleted"
    );
    assert_eq!(rig.sealed(), sealed);
    assert_eq!(rig.log.first_offset(), 0);

    rig.faults.heal();
    assert_eq!(rig.upload_all(&mut uploader).await, sealed.len());
    let report = rig.enforce(&hot, rig.log.committed_offset()).await;
    assert_eq!(report.segments_deleted, sealed.len());
    assert_eq!(rig.shard.earliest_offset(), 0);

    // Hanging: each attempt times out after op_timeout; the upload fails within a bound.
    let uploaded_end = rig.manifest.uploaded_end();
    let recorded = rig.recorded_ranges().await;
    while rig.sealed().len() < 2 {
        let i = rig.sent.len() as u64;
        rig.append(varied_records(i)).await;
    }
    let sealed = rig.sealed();
    rig.faults.set_hang(true);
    let started = Instant::now();
    let err = uploader.upload_next().await.expect_err("store hangs");
    let elapsed = started.elapsed();
    assert!(
        error_chain(&err).contains("did not complete within"),
        "a timeout: {}",
        error_chain(&err)
    );
    assert!(
        elapsed >= 2 * rig.opts.op_timeout && elapsed < Duration::from_secs(3),
        "two attempts of {:?} each: {elapsed:?}",
        rig.opts.op_timeout
    );
    assert_eq!(rig.manifest.uploaded_end(), uploaded_end);
    assert_eq!(rig.recorded_ranges().await, recorded, "nothing recorded");
    let report = rig.enforce(&hot, rig.log.committed_offset()).await;
    assert_eq!(report.segments_deleted, 0);
    assert_eq!(rig.sealed(), sealed);

    rig.faults.heal();
    assert_eq!(rig.upload_all(&mut uploader).await, sealed.len());
    let report = rig.enforce(&hot, rig.log.committed_offset()).await;
    assert_eq!(report.segments_deleted, sealed.len());
    assert!(rig.sealed().is_empty());
    let got = read_all(&rig.shard, 0, 3000).await;
    assert_same_batches(&got, &rig.sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploader_continues_after_ranges_recorded_by_someone_else() {
    let mut rig = Rig::start(Options {
        row_group_bytes: 1024,
        ..Options::default()
    })
    .await;
    rig.append_until_sealed(5).await;
    let s = rig.sealed();
    let mut uploader = rig.uploader();
    assert_eq!(uploader.next_range(), Some((0, s[0].last_offset)));

    // An earlier attempt whose answer was lost, or another leader with other encode options,
    // recorded exactly the range this uploader is about to upload.
    let other = EncodeOptions {
        row_group_bytes: 4 << 20,
        ..EncodeOptions::default()
    };
    let first = rig.put_object(0, s[0].last_offset, &other).await;
    rig.meta
        .propose(Command::RecordObject {
            shard: rig.key.clone(),
            segment: first.clone(),
        })
        .await
        .expect("recorded");
    assert!(
        uploader
            .upload_next()
            .await
            .expect("adopts the recorded range")
    );
    assert_eq!(rig.recorded_ranges().await, vec![(0, s[0].last_offset)]);
    assert_eq!(
        rig.store
            .head(first.object_key.as_deref().expect("key"))
            .await
            .ok(),
        Some(first.size_bytes),
        "the recorded object is never overwritten: it is the one the manifest describes"
    );
    assert_eq!(
        uploader.next_range(),
        Some((s[1].base_offset, s[1].last_offset))
    );

    // Another leader, whose segments rolled elsewhere, recorded a range that covers the
    // next two local segments.
    let wide = rig
        .put_object(s[1].base_offset, s[2].last_offset, &other)
        .await;
    rig.meta
        .propose(Command::RecordObject {
            shard: rig.key.clone(),
            segment: wide,
        })
        .await
        .expect("recorded");
    assert!(
        uploader
            .upload_next()
            .await
            .expect("adopts the recorded range")
    );
    assert_eq!(
        uploader.next_range(),
        Some((s[3].base_offset, s[3].last_offset)),
        "continues after the other range"
    );

    // The same range recorded while this uploader's PUT is in flight (by a writer that
    // encodes alike, so the bytes match): the record is refused and the uploader moves on.
    let theirs = rig
        .put_object(s[3].base_offset, s[3].last_offset, &rig.encode_options())
        .await;
    rig.faults.set_hang(true);
    let puts = rig.faults.puts();
    let faults = rig.faults.clone();
    let meta = rig.meta.clone();
    let key = rig.key.clone();
    let racer = tokio::spawn(async move {
        while faults.puts() == puts {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let answer = meta
            .propose(Command::RecordObject {
                shard: key,
                segment: theirs,
            })
            .await;
        faults.set_hang(false);
        answer
    });
    let mine = uploader.upload_next().await;
    assert!(rig.faults.puts() > puts, "this uploader did upload");
    racer
        .await
        .expect("racer")
        .expect("the other record won the race");
    assert!(mine.expect("refused, then reloaded"));

    rig.upload_all(&mut uploader).await;
    assert_eq!(
        rig.recorded_ranges().await,
        vec![
            (0, s[0].last_offset),
            (s[1].base_offset, s[2].last_offset),
            (s[3].base_offset, s[3].last_offset),
            (s[4].base_offset, s[4].last_offset),
        ],
        "no duplicate, no gap"
    );
    let retry = Command::RecordObject {
        shard: rig.key.clone(),
        segment: first,
    };
    assert!(
        matches!(
            rig.meta.propose(retry).await,
            Err(MetaError::Rejected(CommandError::AlreadyExists { .. }))
        ),
        "a range is recorded once"
    );

    rig.enforce(&hot_retention_zero(), rig.log.committed_offset())
        .await;
    assert!(rig.sealed().is_empty());
    let got = read_all(&rig.shard, 0, 3000).await;
    assert_same_batches(&got, &rig.sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_reads_are_cached_survive_failed_gets_and_coalesce_concurrent_fetches() {
    let mut rig = Rig::start(Options {
        row_group_bytes: 1024,
        prefetch_row_groups: 0,
        ..Options::default()
    })
    .await;
    let objects = rig.all_cold(5).await;
    assert!(objects.len() >= 5);
    let sent_in = |o: &SegmentEntry| -> Vec<Sent> {
        rig.sent
            .iter()
            .filter(|s| s.base >= o.base_offset && s.last <= o.last_offset)
            .cloned()
            .collect()
    };
    let read_object = |o: &SegmentEntry| read_whole_object(&rig.shard, o.clone());

    // Cold cache: the footer and every row group cost one GET each.
    let o = &objects[1];
    let gets = rig.faults.gets();
    let read = read_object(o).await.expect("cold read");
    assert_eq!(read.tier, Tier::Cold);
    assert_eq!(read.next_offset, o.last_offset + 1, "the whole object");
    let footer = rig.cache.footer(&object_ref(o)).await.expect("footer");
    let row_groups = footer.row_groups.len() as u64;
    assert!(row_groups >= 2, "several row groups: {row_groups}");
    assert_eq!(rig.faults.gets() - gets, 1 + row_groups);
    let batches = decode_all(&read.batches);
    assert_eq!(batches.len(), sent_in(o).len());

    // Warm: no GET at all.
    let gets = rig.faults.gets();
    let hits = rig.cache.stats().hits.load(Ordering::Relaxed);
    let again = read_object(o).await.expect("warm read");
    assert_eq!(again.batches, read.batches);
    assert_eq!(rig.faults.gets(), gets, "served from the cache");
    assert!(rig.cache.stats().hits.load(Ordering::Relaxed) > hits);

    // GETs failing beyond the retries: a typed error, then a later read succeeds.
    for (o, warm_footer) in [(&objects[2], false), (&objects[3], true)] {
        if warm_footer {
            rig.cache.footer(&object_ref(o)).await.expect("footer");
        }
        let injected = rig.faults.injected_failures();
        rig.faults.fail_next_gets(2);
        let err = read_object(o)
            .await
            .expect_err("GETs fail beyond the retries");
        assert!(
            matches!(err, ColdError::Fetch { .. } | ColdError::Store(_)),
            "{err:?}"
        );
        assert_eq!(
            rig.faults.injected_failures() - injected,
            2,
            "the first attempt and its retry failed"
        );
        let read = read_object(o).await.expect("a later read succeeds");
        let got: Vec<(Tier, DecodedBatch)> = decode_all(&read.batches)
            .into_iter()
            .map(|b| (read.tier, b))
            .collect();
        assert_same_batches(&got, &sent_in(o));
    }

    // Identical concurrent reads of a cold object share its fetches. The store answers
    // slowly, so every reader asks while the first fetch is still in flight.
    let o = objects[4].clone();
    let gets = rig.faults.gets();
    rig.faults.set_latency(Duration::from_millis(30));
    let shard = Arc::new(rig.shard);
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let shard = shard.clone();
            let o = o.clone();
            tokio::spawn(async move { read_whole_object(&shard, o).await })
        })
        .collect();
    let mut results = Vec::new();
    for r in readers {
        results.push(r.await.expect("reader task").expect("concurrent read"));
    }
    for r in &results {
        assert_eq!(
            r.batches, results[0].batches,
            "every reader gets the same bytes"
        );
    }
    let footer = rig.cache.footer(&object_ref(&o)).await.expect("footer");
    let row_groups = footer.row_groups.len() as u64;
    let spent = rig.faults.gets() - gets;
    assert!(
        spent > row_groups && spent <= row_groups + 2,
        "8 readers of {row_groups} row groups cost {spent} GETs"
    );

    // A footer asked for by many while its GET is in flight is fetched once and parsed
    // once: everyone gets the same parsed footer.
    let o = object_ref(&objects[0]);
    let gets = rig.faults.gets();
    let askers: Vec<_> = (0..8)
        .map(|_| {
            let (cache, o) = (rig.cache.clone(), o.clone());
            tokio::spawn(async move { cache.footer(&o).await })
        })
        .collect();
    let mut footers = Vec::new();
    for a in askers {
        footers.push(a.await.expect("asker task").expect("footer"));
    }
    assert_eq!(rig.faults.gets() - gets, 1, "one footer GET");
    for f in &footers {
        assert!(Arc::ptr_eq(f, &footers[0]), "one parse, shared by all");
    }
}

/// A reader starting at an object's first offset with nothing cached gets its first row
/// group after one round trip: the object's head is fetched beside its footer, not after
/// it. A head that reaches past the first row groups serves them without a GET of their
/// own; one shorter than the first row group is completed by a GET of the rest. Every
/// record comes back once, in order, either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_from_an_objects_start_fetches_its_footer_and_head_in_one_round_trip() {
    for (head_bytes, whole) in [(1u64 << 20, true), (300, false)] {
        let mut rig = Rig::start(Options {
            row_group_bytes: 1024,
            prefetch_row_groups: 0,
            head_bytes,
            op_timeout: Duration::from_secs(3),
            ..Options::default()
        })
        .await;
        let objects = rig.all_cold(2).await;
        let o = objects[1].clone();
        let sent: Vec<Sent> = rig
            .sent
            .iter()
            .filter(|s| s.base >= o.base_offset && s.last <= o.last_offset)
            .cloned()
            .collect();
        let latency = Duration::from_millis(250);
        rig.faults.set_latency(latency);
        let gets = rig.faults.gets();
        rig.faults.reset_max_in_flight();
        let first = rig
            .shard
            .read(o.base_offset, 1, None)
            .await
            .expect("cold read");
        assert_eq!(first.tier, Tier::Cold);
        assert!(first.next_offset > o.base_offset);
        if whole {
            // Footer and head, each one GET, waiting out their latency side by side: one
            // round trip, not two in turn.
            assert_eq!(rig.faults.gets() - gets, 2, "footer and head only");
            assert!(
                rig.faults.max_in_flight() >= 2,
                "the footer and the head are fetched together, not in turn"
            );
        }
        rig.faults.set_latency(Duration::ZERO);
        let read = read_whole_object(&rig.shard, o.clone())
            .await
            .expect("the whole object");
        let got: Vec<(Tier, DecodedBatch)> = decode_all(&read.batches)
            .into_iter()
            .map(|b| (read.tier, b))
            .collect();
        assert_same_batches(&got, &sent);
        let footer = rig.cache.footer(&object_ref(&o)).await.expect("footer");
        if whole {
            assert_eq!(
                rig.faults.gets() - gets,
                2,
                "{} row groups, all from the head",
                footer.row_groups.len()
            );
        } else {
            // The head covers part of the first row group only: every row group still
            // costs one GET (the first one its rest), plus the footer and the head.
            assert_eq!(rig.faults.gets() - gets, 2 + footer.row_groups.len() as u64);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_ahead_runs_on_into_the_next_object_before_the_reader_gets_there() {
    let mut rig = Rig::start(Options {
        row_group_bytes: 1024,
        prefetch_row_groups: 2,
        ..Options::default()
    })
    .await;
    let objects = rig.all_cold(3).await;
    let (a, b) = (&objects[0], &objects[1]);
    let footer = rig.cache.footer(&object_ref(a)).await.expect("footer");
    let n = footer.row_groups.len();
    assert!(n >= 3, "several row groups per object: {n}");

    // A reader arrives in object a's second-to-last row group: from there it is fewer
    // row groups than the read-ahead depth from object b.
    let near_end = footer.row_groups[n - 2].first_offset;
    let read = rig
        .shard
        .read(near_end, 1 << 20, None)
        .await
        .expect("cold read");
    assert_eq!(read.tier, Tier::Cold);
    assert!(read.next_offset <= a.last_offset, "still inside object a");

    // Read-ahead settles (the GET count stops moving for a while)...
    let mut settled = rig.faults.gets();
    let mut still = 0;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let now = rig.faults.gets();
        still = if now == settled { still + 1 } else { 0 };
        settled = now;
        if still == 8 {
            break;
        }
    }
    // ...and object b's footer and first row group were among what it fetched: with every
    // GET failing from here on, b's first batch is still served (from the cache). The read
    // starts read-ahead of b's later row groups, whose GETs fail; that is only logged.
    rig.faults.fail_next_gets(1_000);
    let first_of_b = rig
        .shard
        .read(b.base_offset, 1, None)
        .await
        .expect("object b's footer and first row group were fetched ahead");
    assert_eq!(first_of_b.tier, Tier::Cold);
    assert!(!first_of_b.batches.is_empty());
    assert!(first_of_b.next_offset > b.base_offset);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn total_retention_trims_the_oldest_objects_but_never_at_or_above_acked_end() {
    let mut rig = Rig::start(Options::default()).await;
    rig.append_until_sealed(6).await;
    let mut uploader = rig.uploader();
    rig.upload_all(&mut uploader).await;
    let objects = rig.recorded().await;
    assert!(objects.len() >= 6);

    // Keep exactly what follows the first two objects (Kafka's size rule: delete while
    // what is left still holds at least `retention_bytes`).
    let uploaded_end = rig.manifest.uploaded_end();
    let covered: u64 = rig
        .sealed()
        .iter()
        .filter(|s| s.last_offset < uploaded_end)
        .map(|s| s.size_bytes)
        .sum();
    let local_above = rig.log.size_bytes() - covered;
    let keep: u64 = objects[2..].iter().map(|e| e.size_bytes).sum::<u64>() + local_above;
    let settings = StreamSettings {
        retention_bytes: Some(keep),
        ..hot_retention_zero()
    };
    let report = rig.enforce(&settings, rig.log.committed_offset()).await;
    assert_eq!(report.objects_deleted, 2);
    assert_eq!(
        report.object_bytes_deleted,
        objects[0].size_bytes + objects[1].size_bytes
    );
    let earliest = objects[2].base_offset;
    assert_eq!(report.earliest_offset, earliest);
    assert_eq!(rig.shard.earliest_offset(), earliest);
    assert_eq!(rig.manifest.floor(), earliest);
    let left = rig.recorded_ranges().await;
    assert_eq!(left.first().map(|r| r.0), Some(earliest));
    assert_eq!(left.len(), objects.len() - 2);
    for (n, o) in objects.iter().enumerate() {
        let head = rig.store.head(o.object_key.as_deref().expect("key")).await;
        if n < 2 {
            assert!(
                matches!(head, Err(StoreError::NotFound { .. })),
                "object {n} deleted: {head:?}"
            );
        } else {
            assert_eq!(head.ok(), Some(o.size_bytes), "object {n} kept");
        }
    }
    for from in [0, objects[1].last_offset, earliest - 1] {
        let err = rig.shard.read(from, 3000, None).await.expect_err("too old");
        assert!(
            matches!(err, ColdError::TooOld { requested, earliest: e } if requested == from && e == earliest),
            "{err:?}"
        );
    }
    let kept: Vec<Sent> = rig
        .sent
        .iter()
        .filter(|s| s.base >= earliest)
        .cloned()
        .collect();
    let got = read_all(&rig.shard, earliest, 3000).await;
    assert_eq!(got.first().map(|(t, _)| *t), Some(Tier::Cold));
    assert_same_batches(&got, &kept);

    // Retention that wants everything gone stops at acked_end, here inside object 4.
    let everything = StreamSettings {
        retention_bytes: Some(1),
        ..hot_retention_zero()
    };
    let acked_end = objects[4].base_offset + 1;
    assert!(acked_end <= objects[4].last_offset);
    let report = rig.enforce(&everything, acked_end).await;
    assert_eq!(report.objects_deleted, 2, "objects 2 and 3");
    assert_eq!(rig.shard.earliest_offset(), objects[4].base_offset);
    let left = rig.recorded_ranges().await;
    assert_eq!(left.len(), objects.len() - 4);
    assert_eq!(left[0].0, objects[4].base_offset);
    for o in &objects[4..] {
        assert!(
            rig.store
                .head(o.object_key.as_deref().expect("key"))
                .await
                .is_ok()
        );
    }
    let kept: Vec<Sent> = rig
        .sent
        .iter()
        .filter(|s| s.base >= objects[4].base_offset)
        .cloned()
        .collect();
    assert_same_batches(
        &read_all(&rig.shard, objects[4].base_offset, 3000).await,
        &kept,
    );

    // Neither tier deletes at or above acked_end: new segments, uploaded, with acked_end
    // inside the first of them, stay both in the manifest and on local disk.
    let before = rig.sealed().len();
    while rig.sealed().len() < before + 2 {
        let i = rig.sent.len() as u64;
        rig.append(varied_records(i)).await;
    }
    let fresh = rig.sealed();
    rig.upload_all(&mut uploader).await;
    let acked_end = fresh[0].base_offset + 1;
    assert!(acked_end <= fresh[0].last_offset);
    rig.enforce(&everything, acked_end).await;
    assert_eq!(rig.log.first_offset(), fresh[0].base_offset, "kept locally");
    assert_eq!(rig.sealed(), fresh);
    let left = rig.recorded_ranges().await;
    assert_eq!(left[0].0, fresh[0].base_offset, "kept in the manifest");
    assert_eq!(rig.shard.earliest_offset(), fresh[0].base_offset);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_at_or_above_the_upload_limit_is_uploaded() {
    let mut rig = Rig::start(Options::default()).await;
    rig.append_until_sealed(3).await;
    let s = rig.sealed();
    assert!(s[1].last_offset > s[1].base_offset);
    let limit = Arc::new(AtomicU64::new(s[1].base_offset + 1));
    let mut uploader = rig.uploader().with_limit({
        let limit = limit.clone();
        Arc::new(move || limit.load(Ordering::SeqCst))
    });

    assert_eq!(
        rig.upload_all(&mut uploader).await,
        1,
        "only the first segment"
    );
    assert_eq!(rig.recorded_ranges().await, vec![(0, s[0].last_offset)]);
    assert_eq!(rig.store.list("").await.expect("list").len(), 1);

    // The limit is exclusive: a segment whose last offset is at the limit waits.
    limit.store(s[1].last_offset, Ordering::SeqCst);
    assert_eq!(uploader.next_range(), None);
    assert!(!uploader.upload_next().await.expect("nothing to do"));
    assert_eq!(rig.store.list("").await.expect("list").len(), 1);

    limit.store(s[1].last_offset + 1, Ordering::SeqCst);
    assert_eq!(rig.upload_all(&mut uploader).await, 1);
    assert_eq!(
        rig.recorded_ranges().await,
        vec![(0, s[0].last_offset), (s[1].base_offset, s[1].last_offset)]
    );

    // Hot retention follows the manifest: the segment above it stays local.
    rig.enforce(&hot_retention_zero(), rig.log.committed_offset())
        .await;
    assert_eq!(rig.log.first_offset(), s[2].base_offset);

    limit.store(u64::MAX, Ordering::SeqCst);
    assert_eq!(rig.upload_all(&mut uploader).await, s.len() - 2);
    assert_eq!(
        rig.manifest.uploaded_end(),
        s.last().expect("sealed").last_offset + 1,
        "the active segment is never uploaded"
    );
}

/// An uploader stops when its stop signal's sender is dropped (the shard was closed, e.g.
/// its stream deleted), whether the stream is tiered or not, instead of looping on a
/// closed channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uploader_stops_when_its_shard_goes_away() {
    let rig = Rig::start(Options::default()).await;
    for enabled in [true, false] {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let uploader = rig.uploader().with_enabled(Arc::new(move || enabled));
        let task = tokio::spawn(uploader.run(stop_rx));
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(stop_tx);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap_or_else(|_| {
                panic!("uploader (tiering {enabled}) still running after its stop sender went away")
            })
            .expect("uploader task");
    }
}

/// What a reader starting at an object's first offset waits for its first batch, with
/// nothing cached, from a store answering every GET after 30 ms at 100 MB/s per GET
/// (issue 27's case): with the object's head fetched beside its footer, and with the footer
/// fetched first (`head_bytes` 0). A 16 MiB object of 1 KiB incompressible records in 4 MiB
/// row groups; each trial opens an empty cache; interleaved, best and median of 7 each. Run
/// in release:
/// `cargo test --release -p felix-cold --test cold first_record_cost -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand in release"]
async fn first_record_cost_with_and_without_the_head() {
    use felix_cold::store::SimulatedLatency;
    use felix_wire::batch::stamp_base_offset;

    felix_cold::malloc::keep_decode_buffers();
    let mut log = Vec::new();
    let mut next = 0i64;
    for b in 0..(16u64 << 10) / 64 {
        let mut builder = BatchBuilder::new(Compression::None);
        for r in 0..64u64 {
            builder.push(Record {
                offset: 0,
                timestamp: T0 + next + r as i64,
                key: None,
                value: Some(Bytes::from(pattern(1024, b * 64 + r))),
                headers: Vec::new(),
            });
        }
        let mut batch = builder.build().expect("batch");
        stamp_base_offset(&mut batch, next);
        next += 64;
        log.extend_from_slice(&batch);
    }
    let row_group_bytes = 4 << 20;
    let info = ObjectInfo {
        tenant: "acme".into(),
        namespace: "prod".into(),
        stream: "orders".into(),
        shard: 0,
    };
    let opts = EncodeOptions {
        row_group_bytes,
        ..EncodeOptions::default()
    };
    let (object, summary) = encode_to_bytes(&log, &info, &opts).await.expect("encodes");
    let store = TierStore::open(&StoreConfig {
        url: "memory://".into(),
        simulated: SimulatedLatency {
            first_byte: Duration::from_millis(30),
            bytes_per_sec: 100_000_000,
            ..SimulatedLatency::default()
        },
        ..StoreConfig::default()
    })
    .await
    .expect("store");
    let size = object.len() as u64;
    store.put("o", object).await.expect("put");
    let objref = ObjectRef {
        key: "o".into(),
        size,
        version: "1".into(),
        base_offset: 0,
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let trial = |head_bytes: u64| {
        let (store, objref, dir) = (store.clone(), objref.clone(), dir.path().join("c"));
        async move {
            let cache = ColdCache::open(
                store,
                CacheConfig {
                    disk_bytes: 0,
                    prefetch_row_groups: 0,
                    head_bytes,
                    ..CacheConfig::new(dir)
                },
            )
            .await
            .expect("cache");
            let started = Instant::now();
            let read = cache
                .read(&objref, 0, 1, summary.last_offset + 1)
                .await
                .expect("read");
            let elapsed = started.elapsed();
            assert!(read.next_offset > 0);
            cache.close().await;
            elapsed
        }
    };
    let head_bytes = felix_cold::cache::head_bytes_for(row_group_bytes);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        with.push(trial(head_bytes).await);
        without.push(trial(0).await);
    }
    with.sort();
    without.sort();
    eprintln!(
        "object {} MiB in {} row groups; first batch with the head: best {:?}, median {:?}; \
         footer first: best {:?}, median {:?}",
        size >> 20,
        summary.row_groups,
        with[0],
        with[3],
        without[0],
        without[3]
    );
}
