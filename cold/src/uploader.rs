//! The uploader: moves a shard's committed history into Parquet objects and records each
//! in the manifest through the control plane.
//!
//! The range of the next object comes from the manifest, not from this broker's files: it
//! starts where the last recorded object ends and runs to the end of the local sealed
//! segment holding that offset. A new leader, whose segments roll at other offsets,
//! therefore continues exactly where the manifest ends, and an object's key
//! (`{base:020}-{last:020}.parquet`) names a range no other object can have. Only records
//! below the upload limit (the committed mark) are uploaded, so nothing in the object store
//! can later be cut by a failover.
//!
//! A failure anywhere (object store down, slow or lying, control plane unavailable) leaves
//! the segment local and is retried with backoff; the hot log deletes a segment only once
//! the manifest covers it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use felix_hot::{SealedSegment, ShardLog};
use felix_model::{SegmentEntry, ShardKey, TierState};
use felix_wire::BatchHeader;
use object_store::buffered::BufWriter;
use tokio::sync::{broadcast, watch};

use crate::error::ColdError;
use crate::manifest::{Manifest, ManifestKeeper, Recorded};
use crate::segment::{EncodeOptions, ObjectInfo, SegmentEncoder};
use crate::store::TierStore;
use crate::tiered::upload_backlog;

/// What the uploader reports, for metrics.
pub trait TierObserver: Send + Sync {
    /// An upload attempt failed; it will be retried.
    fn upload_failed(&self, shard: &ShardKey, error: &ColdError);
    /// An object was uploaded and recorded. `lag` runs from the seal of its last segment to
    /// the manifest record (`None` for segments sealed before this uploader started).
    fn uploaded(&self, shard: &ShardKey, entry: &SegmentEntry, lag: Option<Duration>);
    /// Sealed segments not yet covered by recorded objects.
    fn backlog(&self, shard: &ShardKey, segments: u64, bytes: u64);
}

/// An observer that reports nothing.
pub struct NoObserver;

impl TierObserver for NoObserver {
    fn upload_failed(&self, _: &ShardKey, _: &ColdError) {}
    fn uploaded(&self, _: &ShardKey, _: &SegmentEntry, _: Option<Duration>) {}
    fn backlog(&self, _: &ShardKey, _: u64, _: u64) {}
}

#[derive(Debug, Clone)]
pub struct UploaderConfig {
    pub encode: EncodeOptions,
    /// Bytes read from the log per step while encoding.
    pub read_chunk: usize,
    /// First retry delay after a failure; doubles up to `retry_max`.
    pub retry_initial: Duration,
    pub retry_max: Duration,
    /// How often to look for work without a seal notification.
    pub poll: Duration,
}

impl Default for UploaderConfig {
    fn default() -> Self {
        UploaderConfig {
            encode: EncodeOptions::default(),
            read_chunk: 4 << 20,
            retry_initial: Duration::from_millis(200),
            retry_max: Duration::from_secs(10),
            poll: Duration::from_secs(1),
        }
    }
}

/// The object key of a shard's range, relative to the store's prefix. Hive-style
/// directories let analytics engines filter by tenant, stream and shard.
pub fn object_key(shard: &ShardKey, base: u64, last: u64) -> String {
    format!(
        "tenant={}/namespace={}/stream={}/shard={}/{base:020}-{last:020}.parquet",
        shard.tenant, shard.namespace, shard.stream, shard.shard
    )
}

/// The exclusive end of what may be uploaded (the committed mark).
pub type UploadLimit = Arc<dyn Fn() -> u64 + Send + Sync>;

pub struct Uploader {
    shard: ShardKey,
    log: ShardLog,
    manifest: Arc<Manifest>,
    store: TierStore,
    meta: Arc<dyn ManifestKeeper>,
    broker_id: u64,
    config: UploaderConfig,
    observer: Arc<dyn TierObserver>,
    limit: UploadLimit,
    /// Whether the stream is tiered now (it can be turned on and off live).
    enabled: Arc<dyn Fn() -> bool + Send + Sync>,
    /// When each segment (by last offset) was seen sealed.
    sealed_at: BTreeMap<u64, Instant>,
}

impl Uploader {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shard: ShardKey,
        log: ShardLog,
        manifest: Arc<Manifest>,
        store: TierStore,
        meta: impl ManifestKeeper + 'static,
        broker_id: u64,
        config: UploaderConfig,
        observer: Arc<dyn TierObserver>,
    ) -> Uploader {
        let committed = log.clone();
        Uploader {
            shard,
            log,
            manifest,
            store,
            meta: Arc::new(meta),
            broker_id,
            config,
            observer,
            limit: Arc::new(move || committed.committed_offset()),
            enabled: Arc::new(|| true),
            sealed_at: BTreeMap::new(),
        }
    }

    /// Replaces the upload limit (a Quorum shard passes its quorum mark).
    pub fn with_limit(mut self, limit: UploadLimit) -> Uploader {
        self.limit = limit;
        self
    }

    /// Makes the uploader idle while `enabled` answers false.
    pub fn with_enabled(mut self, enabled: Arc<dyn Fn() -> bool + Send + Sync>) -> Uploader {
        self.enabled = enabled;
        self
    }

    /// Uploads until `stop` turns true: on every seal, on a timer, and after failures with
    /// backoff.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut sealed = self.log.subscribe_sealed();
        let mut delay = self.config.retry_initial;
        loop {
            if *stop.borrow() {
                return;
            }
            if !(self.enabled)() {
                self.observer.backlog(&self.shard, 0, 0);
                tokio::select! {
                    // A dropped sender (the shard is gone) stops the uploader too.
                    r = stop.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep(self.config.poll) => {}
                }
                continue;
            }
            // Note every segment sealed since the last look, also while uploads run back to
            // back, so the lag histogram sees the backlog too. A segment sealed during an
            // upload is noted when that upload ends: its lag is short by at most one
            // upload's duration.
            loop {
                match sealed.try_recv() {
                    Ok(seg) => self.note_sealed(&seg),
                    Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                    Err(broadcast::error::TryRecvError::Empty) => break,
                    Err(broadcast::error::TryRecvError::Closed) => return,
                }
            }
            self.report_backlog();
            let wait = match self.upload_next().await {
                Ok(true) => {
                    delay = self.config.retry_initial;
                    continue;
                }
                Ok(false) => self.config.poll,
                Err(e) => {
                    tracing::warn!(shard = %self.shard, error = %e, retry_in = ?delay, "upload failed; the segment stays local");
                    self.observer.upload_failed(&self.shard, &e);
                    let d = delay;
                    delay = (delay * 2).min(self.config.retry_max);
                    d
                }
            };
            tokio::select! {
                // A dropped sender (the shard is gone) stops the uploader too.
                r = stop.changed() => if r.is_err() { return },
                r = sealed.recv() => match r {
                    Ok(seg) => self.note_sealed(&seg),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Remembers when a segment was first seen sealed, for the upload-lag histogram.
    fn note_sealed(&mut self, seg: &SealedSegment) {
        self.sealed_at
            .entry(seg.last_offset)
            .or_insert_with(Instant::now);
    }

    fn report_backlog(&self) {
        let (n, bytes) = upload_backlog(&self.log, self.manifest.uploaded_end());
        self.observer.backlog(&self.shard, n, bytes);
    }

    /// The next range to upload: from the manifest's end to the end of the sealed segment
    /// holding it, if that segment is wholly below the upload limit.
    pub fn next_range(&self) -> Option<(u64, u64)> {
        let state = self.manifest.snapshot();
        let mut base = state.uploaded_end();
        if state.objects.is_empty() {
            // The first object starts at the log's first offset (tiering turned on for a
            // stream whose oldest segments were already deleted locally).
            base = base.max(self.log.first_offset());
        }
        let seg = self
            .log
            .sealed_segments()
            .into_iter()
            .find(|s| s.last_offset >= base)?;
        (seg.last_offset < (self.limit)()).then_some((base, seg.last_offset))
    }

    /// Uploads and records the next range, if there is one. `Ok(false)`: nothing to do.
    pub async fn upload_next(&mut self) -> Result<bool, ColdError> {
        let Some((base, last)) = self.next_range() else {
            return Ok(false);
        };
        let first_local = self.log.first_offset();
        if base < first_local {
            return Err(ColdError::Inconsistent(format!(
                "shard {}: offsets {base}..{first_local} are neither uploaded nor on local disk",
                self.shard
            )));
        }
        // A stale manifest (a new leader whose applied state lags) would upload a range that
        // is already recorded, overwriting the recorded object under the same key with bytes
        // whose size and row groups the manifest does not describe. Check first.
        let fresh = Manifest::load(self.meta.as_ref(), &self.shard).await?;
        if fresh.uploaded_end() != self.manifest.uploaded_end() {
            self.manifest.replace(fresh.snapshot());
            self.log.mark_uploaded_below(self.manifest.uploaded_end());
            return Ok(true);
        }
        let entry = self.upload(base, last).await?;
        match self.meta.record_object(&self.shard, entry.clone()).await? {
            Recorded::Done => {}
            // Someone recorded this range already: an earlier attempt whose answer was
            // lost, or another leader. Take the control plane's word for it.
            Recorded::RangeTaken => {
                let fresh = Manifest::load(self.meta.as_ref(), &self.shard).await?;
                self.manifest.replace(fresh.snapshot());
                self.log.mark_uploaded_below(self.manifest.uploaded_end());
                return Ok(true);
            }
        }
        self.manifest.push(entry.clone());
        self.log.mark_uploaded_below(last + 1);
        let lag = self.sealed_at.get(&last).map(|t| t.elapsed());
        self.sealed_at = self.sealed_at.split_off(&(last + 1));
        tracing::info!(shard = %self.shard, base, last, bytes = entry.size_bytes, "uploaded segment");
        self.observer.uploaded(&self.shard, &entry, lag);
        Ok(true)
    }

    /// Encodes `base..=last` from the log into one object and uploads it (multipart when
    /// large). Uploading the same range again writes the same key: a retry after a PUT
    /// whose answer was lost simply replaces the object.
    async fn upload(&self, base: u64, last: u64) -> Result<SegmentEntry, ColdError> {
        let key = object_key(&self.shard, base, last);
        let info = ObjectInfo {
            tenant: self.shard.tenant.clone(),
            namespace: self.shard.namespace.clone(),
            stream: self.shard.stream.clone(),
            shard: self.shard.shard,
        };
        let writer = BufWriter::new(self.store.object_store(), self.store.path(&key));
        let mut encoder = SegmentEncoder::new(writer, &info, &self.config.encode)
            .map_err(|source| segment_error(&key, source))?;
        let mut pos = base;
        // The object's version: a checksum of the batches it was made from (see
        // `cache::ObjectRef`: equal content, equal version).
        let mut crc = 0u32;
        while pos <= last {
            let log = self.log.clone();
            let chunk = self.config.read_chunk;
            // The log reads files synchronously: keep that off the async workers.
            let read = tokio::task::spawn_blocking(move || log.read(pos, chunk, Some(last + 1)))
                .await
                .map_err(|e| ColdError::Inconsistent(format!("log read task failed: {e}")))??;
            if read.batches.is_empty() || read.next_offset <= pos {
                return Err(ColdError::Inconsistent(format!(
                    "shard {}: no batch readable at {pos} below {}",
                    self.shard,
                    last + 1
                )));
            }
            if pos == base {
                let h = BatchHeader::parse(&read.batches)
                    .map_err(|e| ColdError::Inconsistent(format!("batch at {base}: {e}")))?;
                if h.base_offset as u64 != base {
                    return Err(ColdError::Inconsistent(format!(
                        "shard {}: the manifest ends at {base} but the local batch there starts at {}",
                        self.shard, h.base_offset
                    )));
                }
            }
            crc = crc32c::crc32c_append(crc, &read.batches);
            encoder
                .push(&read.batches)
                .await
                .map_err(|source| segment_error(&key, source))?;
            pos = read.next_offset;
        }
        let summary = encoder
            .finish()
            .await
            .map_err(|source| segment_error(&key, source))?;
        if summary.base_offset != base || summary.last_offset != last {
            return Err(ColdError::Inconsistent(format!(
                "object {key} holds {}..={}, expected {base}..={last}",
                summary.base_offset, summary.last_offset
            )));
        }
        let size = self.store.head(&key).await?;
        Ok(SegmentEntry {
            base_offset: base,
            last_offset: last,
            min_timestamp: summary.min_timestamp,
            max_timestamp: summary.max_timestamp,
            size_bytes: size,
            tier: TierState::Cold,
            object_key: Some(key),
            checksum: Some(format!("crc32c:{crc:08x}")),
            local_copies: [self.broker_id].into(),
        })
    }
}

fn segment_error(key: &str, source: crate::segment::SegmentError) -> ColdError {
    ColdError::Segment {
        key: key.to_owned(),
        source,
    }
}
