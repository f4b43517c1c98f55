//! One read path over both tiers of a shard: offsets below the first local offset come
//! from objects recorded in the manifest (through the [`ColdCache`]), the rest from the hot
//! log. A reader moving forward crosses from cold to hot without a gap or a repeat, because
//! the manifest is contiguous and the hot log only drops segments the manifest covers.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use felix_hot::{LogError, ReadCache, ShardLog, SharedRead};
use felix_meta::MetaState;
use felix_meta::model::{SegmentEntry, ShardKey};
use felix_wire::BatchHeader;
use parking_lot::RwLock;

use crate::cache::{ColdCache, ObjectRef};
use crate::error::ColdError;
use crate::keeper::ManifestKeeper;

/// The objects of one shard as this broker knows them, and the shard's floor (its earliest
/// offset after total retention). The uploader and retention keep it in step with the
/// control plane: they change it only after their command is committed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManifestState {
    /// base offset → object
    pub objects: BTreeMap<u64, SegmentEntry>,
    pub floor: u64,
}

impl ManifestState {
    /// A shard's manifest as the control-plane state `state` records it.
    pub fn of(state: &MetaState, shard: &ShardKey) -> ManifestState {
        ManifestState {
            objects: state.manifests.get(shard).cloned().unwrap_or_default(),
            floor: state.manifest_floors.get(shard).copied().unwrap_or(0),
        }
    }

    /// One past the last offset covered by objects, or the floor when there are none: where
    /// the next object must start.
    pub fn uploaded_end(&self) -> u64 {
        self.objects
            .values()
            .next_back()
            .map_or(self.floor, |e| e.last_offset + 1)
    }

    /// The object holding `offset`.
    pub fn object_for(&self, offset: u64) -> Option<&SegmentEntry> {
        self.objects
            .range(..=offset)
            .next_back()
            .map(|(_, e)| e)
            .filter(|e| e.last_offset >= offset)
    }

    /// Bytes held in objects.
    pub fn cold_bytes(&self) -> u64 {
        self.objects.values().map(|e| e.size_bytes).sum()
    }
}

/// Sealed local segments not yet covered by objects ending at `uploaded_end`: how many,
/// and their bytes (the upload backlog).
pub fn upload_backlog(log: &ShardLog, uploaded_end: u64) -> (u64, u64) {
    log.sealed_segments()
        .iter()
        .filter(|s| s.last_offset >= uploaded_end)
        .fold((0, 0), |(n, b), s| (n + 1, b + s.size_bytes))
}

#[derive(Debug, Default)]
pub struct Manifest {
    state: RwLock<ManifestState>,
}

impl Manifest {
    pub fn new(state: ManifestState) -> Manifest {
        Manifest {
            state: RwLock::new(state),
        }
    }

    /// Loads a shard's manifest from its keeper, the control plane (a linearizable read).
    pub async fn load(meta: &dyn ManifestKeeper, shard: &ShardKey) -> Result<Manifest, ColdError> {
        Ok(Manifest::new(meta.load(shard).await?))
    }

    pub fn snapshot(&self) -> ManifestState {
        self.state.read().clone()
    }

    pub fn uploaded_end(&self) -> u64 {
        self.state.read().uploaded_end()
    }

    pub fn floor(&self) -> u64 {
        self.state.read().floor
    }

    pub fn object_for(&self, offset: u64) -> Option<SegmentEntry> {
        self.state.read().object_for(offset).cloned()
    }

    /// Records a committed object.
    pub fn push(&self, entry: SegmentEntry) {
        self.state.write().objects.insert(entry.base_offset, entry);
    }

    /// Applies a committed trim.
    pub fn trim(&self, below: u64) {
        let mut s = self.state.write();
        s.floor = s.floor.max(below);
        s.objects.retain(|_, e| e.last_offset >= below);
    }

    pub fn replace(&self, state: ManifestState) {
        *self.state.write() = state;
    }
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
        let m = self.manifest.state.read();
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
                }),
                // Retention removed the segment between the check and the read: the
                // records are in the cold tier now (or gone), so look again.
                Err(LogError::OffsetOutOfRange { first, .. }) if from < first => {
                    Box::pin(self.read(from, max_bytes, upper_bound)).await
                }
                Err(e) => Err(e.into()),
            };
        }
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
        })
    }

    /// The base offset of the first batch holding a record at or after `timestamp_ms`
    /// (batch granularity, like the hot log), searching objects first; `None` if no
    /// committed record is that new.
    pub async fn offset_for_time(&self, timestamp_ms: i64) -> Result<Option<u64>, ColdError> {
        let hot_first = self.log.first_offset();
        let candidate = {
            let m = self.manifest.state.read();
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
