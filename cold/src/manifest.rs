//! A shard's manifest: the objects that hold its history below the hot log, and its floor
//! (the earliest offset total retention left). Decides what this broker's copy
//! ([`Manifest`]) may do; what the tier asks of the one that keeps the manifest, the
//! control plane, is felix-model's [`ManifestKeeper`]. Invariant: the copy changes only
//! after the keeper has committed the change (the uploader pushes a recorded object,
//! retention applies a committed trim), or is replaced by what the keeper says; the keeper
//! records an object only where the manifest ends, so the objects tile the shard's cold
//! range.

pub use felix_model::{ManifestKeeper, ManifestState, Recorded};
use felix_model::{SegmentEntry, ShardKey};
use parking_lot::{RwLock, RwLockReadGuard};

use crate::error::ColdError;

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
