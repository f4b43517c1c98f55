//! A shard's manifest: the objects that hold its history below the hot log, and its floor
//! (the earliest offset total retention left). Decides what this broker's copy
//! ([`Manifest`]) may do and what the tier asks of the one that keeps the manifest, the
//! control plane ([`ManifestKeeper`]). Invariant: the copy changes only after the keeper
//! has committed the change (the uploader pushes a recorded object, retention applies a
//! committed trim), or is replaced by what the keeper says; the keeper records an object
//! only where the manifest ends, so the objects tile the shard's cold range.

use std::collections::BTreeMap;

use async_trait::async_trait;
use felix_meta::MetaState;
use felix_meta::model::{SegmentEntry, ShardKey};
use parking_lot::{RwLock, RwLockReadGuard};

use crate::error::ColdError;

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

    /// The state, read-locked (for a look at several fields at once).
    pub(crate) fn state(&self) -> RwLockReadGuard<'_, ManifestState> {
        self.state.read()
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

/// What became of an object the uploader asked to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// It is in the manifest now.
    Done,
    /// The range is recorded already (an earlier attempt whose answer was lost, or another
    /// leader): reload the manifest and take its word.
    RangeTaken,
}

/// The control plane's side of a shard's manifest, as the tier needs it.
#[async_trait]
pub trait ManifestKeeper: Send + Sync {
    /// A shard's manifest as committed (a linearizable read).
    async fn load(&self, shard: &ShardKey) -> Result<ManifestState, ColdError>;
    /// Records an uploaded object at the end of a shard's manifest.
    async fn record_object(
        &self,
        shard: &ShardKey,
        entry: SegmentEntry,
    ) -> Result<Recorded, ColdError>;
    /// Forgets every object wholly below `below` and raises the shard's floor to it: the
    /// objects may be deleted once this returns. The entries removed, when the keeper's
    /// answer names them.
    async fn trim(
        &self,
        shard: &ShardKey,
        below: u64,
    ) -> Result<Option<Vec<SegmentEntry>>, ColdError>;
}
