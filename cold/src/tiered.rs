//! One read path over both tiers of a shard: offsets below the first local offset come
//! from objects recorded in the manifest (through the [`ColdCache`]), the rest from the hot
//! log. A reader moving forward crosses from cold to hot without a gap or a repeat, because
//! the manifest is contiguous and the hot log only drops segments the manifest covers.

use std::sync::Arc;

use bytes::Bytes;
use felix_hot::{LogError, ReadCache, ShardLog, SharedRead};
use felix_model::ShardKey;
use felix_wire::BatchHeader;

use crate::cache::{ColdCache, ObjectRef};
use crate::error::ColdError;
pub use crate::manifest::{Manifest, ManifestState};

/// Sealed local segments not yet covered by objects ending at `uploaded_end`: how many,
/// and their bytes (the upload backlog).
pub fn upload_backlog(log: &ShardLog, uploaded_end: u64) -> (u64, u64) {
    log.sealed_segments()
        .iter()
        .filter(|s| s.last_offset >= uploaded_end)
        .fold((0, 0), |(n, b), s| (n + 1, b + s.size_bytes))
}

/// Which tier served a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Hot,
    Cold,
}

/// What a tiered read returned.
#[derive(Debug, Clone)]
pub struct TieredRead {
    /// Whole RecordBatch v2 batches; the first holds the requested offset.
    pub batches: Bytes,
    /// The offset to read next.
    pub next_offset: u64,
    pub tier: Tier,
    /// Set when the hot log's copy of this range failed its checks and the read came from
    /// the object store instead: the damage is the caller's to report (count and log), the
    /// reader gets the right records.
    pub hot_damage: Option<Arc<LogError>>,
}

/// A shard's two tiers behind one read path.
pub struct TieredShard {
    pub key: ShardKey,
    pub log: ShardLog,
    pub manifest: Arc<Manifest>,
    /// `None` when the broker has no object store configured for reads.
    cold: Option<ColdCache>,
    /// Hot history blocks shared between readers (the broker's, across its shards); `None`
    /// reads every block from the log's files.
    hot_reads: Option<Arc<ReadCache>>,
}

impl TieredShard {
    pub fn new(
        key: ShardKey,
        log: ShardLog,
        manifest: Arc<Manifest>,
        cold: Option<ColdCache>,
    ) -> TieredShard {
        TieredShard {
            key,
            log,
            manifest,
            cold,
            hot_reads: None,
        }
    }

    /// Shares hot history reads through `cache` (see [`ShardLog::read_shared`]).
    pub fn with_hot_read_cache(mut self, cache: Arc<ReadCache>) -> TieredShard {
        self.hot_reads = Some(cache);
        self
    }

    pub fn cache(&self) -> Option<&ColdCache> {
        self.cold.as_ref()
    }

    /// The first offset a reader can get: the oldest object's, or the hot log's when no
    /// object is older, never below the retention floor.
    pub fn earliest_offset(&self) -> u64 {
        let m = self.manifest.state();
        let hot_first = self.log.first_offset();
        let cold_first = m.objects.keys().next().copied();
        let first = match cold_first {
            Some(c) => c.min(hot_first),
            None => hot_first,
        };
        first.max(m.floor)
    }

    /// Reads whole batches starting with the one that holds `from`, up to about
    /// `max_bytes`, never past the committed end nor `upper_bound` (exclusive). Offsets
    /// below the hot log come from the object store; a read never spans both tiers, so the
    /// caller simply reads again from `next_offset`.
    pub async fn read(
        &self,
        from: u64,
        max_bytes: usize,
        upper_bound: Option<u64>,
    ) -> Result<TieredRead, ColdError> {
        let floor = self.manifest.floor();
        if from < floor {
            return Err(ColdError::TooOld {
                requested: from,
                earliest: self.earliest_offset(),
            });
        }
        let hot_first = self.log.first_offset();
        if from >= hot_first {
            let read = match &self.hot_reads {
                Some(cache) => self.log.read_shared(cache, from, max_bytes, upper_bound),
                None => self
                    .log
                    .read(from, max_bytes, upper_bound)
                    .map(SharedRead::from),
            };
            return match read {
                Ok(r) => Ok(TieredRead {
                    batches: r.batches,
                    next_offset: r.next_offset,
                    tier: Tier::Hot,
                    hot_damage: None,
                }),
                // Retention removed the segment between the check and the read: the
                // records are in the cold tier now (or gone), so look again.
                Err(LogError::OffsetOutOfRange { first, .. }) if from < first => {
                    Box::pin(self.read(from, max_bytes, upper_bound)).await
                }
                // A damaged local segment whose records were uploaded before the damage
                // (objects carry their own digests, checked on decode): serve the verified
                // copy instead of refusing. Ranges never uploaded stay refused.
                Err(e @ LogError::Corrupt { .. })
                    if self.cold.is_some() && self.manifest.object_for(from).is_some() =>
                {
                    let mut read = self.read_cold(from, max_bytes, upper_bound).await?;
                    read.hot_damage = Some(Arc::new(e));
                    Ok(read)
                }
                Err(e) => Err(e.into()),
            };
        }
        self.read_cold(from, max_bytes, upper_bound).await
    }

    /// Reads from the object holding `from`, as [`TieredShard::read`] does below the hot log.
    pub(crate) async fn read_cold(
        &self,
        from: u64,
        max_bytes: usize,
        upper_bound: Option<u64>,
    ) -> Result<TieredRead, ColdError> {
        let hot_first = self.log.first_offset();
        let Some(object) = self.manifest.object_for(from) else {
            let earliest = self.earliest_offset();
            if from < earliest {
                return Err(ColdError::TooOld {
                    requested: from,
                    earliest,
                });
            }
            return Err(ColdError::Inconsistent(format!(
                "shard {}: offset {from} is below the local log (which starts at {hot_first}) \
                 but in no recorded object",
                self.key
            )));
        };
        let Some(cache) = &self.cold else {
            return Err(ColdError::Inconsistent(format!(
                "shard {}: offset {from} is in the object store, which this broker is not \
                 configured to read",
                self.key
            )));
        };
        let Some(objref) = ObjectRef::of(&object) else {
            return Err(ColdError::Inconsistent(format!(
                "shard {}: manifest entry at {} has no object key",
                self.key, object.base_offset
            )));
        };
        let end = upper_bound.map_or(object.last_offset + 1, |b| b.min(object.last_offset + 1));
        let read = cache.read(&objref, from, max_bytes, end).await?;
        // Read-ahead continues into the next object once this one has fewer row groups
        // left than the read-ahead depth, so a reader crossing objects finds the next
        // footer and first row groups fetched instead of waiting for a footer GET and a
        // row group GET plus decode at every object boundary.
        let near_end = read.next_offset > object.last_offset
            || (!read.batches.is_empty() && read.row_groups_after < cache.prefetch_depth());
        if near_end
            && let Some(next) = self.manifest.object_for(object.last_offset + 1)
            && let Some(next_ref) = ObjectRef::of(&next)
        {
            cache.prefetch_object(&next_ref);
        }
        Ok(TieredRead {
            batches: read.batches,
            next_offset: read.next_offset,
            tier: Tier::Cold,
            hot_damage: None,
        })
    }

    /// The base offset of the first batch holding a record at or after `timestamp_ms`
    /// (batch granularity, like the hot log), searching objects first; `None` if no
    /// committed record is that new.
    pub async fn offset_for_time(&self, timestamp_ms: i64) -> Result<Option<u64>, ColdError> {
        let hot_first = self.log.first_offset();
        let candidate = {
            let m = self.manifest.state();
            m.objects
                .values()
                .find(|e| e.max_timestamp >= timestamp_ms && e.base_offset < hot_first)
                .cloned()
        };
        if let (Some(object), Some(cache)) = (candidate, &self.cold)
            && let Some(objref) = ObjectRef::of(&object)
        {
            let key = objref.key.clone();
            let footer = cache.footer(&objref).await?;
            if let Some(n) = footer.row_group_for_time(timestamp_ms) {
                let rg = cache.row_group(&objref, &footer, n).await?;
                for (first, _, range) in &rg.index {
                    let h = BatchHeader::parse(&rg.batches[range.clone()]).map_err(|e| {
                        ColdError::Inconsistent(format!("object {key}: rebuilt batch: {e}"))
                    })?;
                    if h.max_timestamp >= timestamp_ms {
                        return Ok(Some((*first).max(self.earliest_offset())));
                    }
                }
            }
        }
        Ok(self.log.offset_for_time(timestamp_ms)?)
    }
}
