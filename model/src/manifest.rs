//! A shard's manifest: the objects that hold its history below the hot log, and its floor
//! (the earliest offset total retention left), as plain values ([`ManifestState`],
//! [`SegmentEntry`]), and the calls the tier makes on whoever keeps the manifest
//! ([`ManifestKeeper`]: read it, record an uploaded object, trim the oldest). Invariant of
//! every keeper: an object is recorded only where the manifest ends, so two uploaders racing
//! for one range cannot both succeed, and the objects tile the shard's cold range. The
//! broker's keeper is the control plane's handle (`felix_meta::MetaHandle`); tests keep one
//! in memory (`felix_meta::MemoryControlPlane`).

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::names::ShardKey;

/// Where a segment's records are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TierState {
    Hot,
    Uploading,
    Cold,
    Deleted,
}

/// One entry of a shard's segment manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    pub base_offset: u64,
    pub last_offset: u64,
    pub min_timestamp: i64,
    pub max_timestamp: i64,
    pub size_bytes: u64,
    pub tier: TierState,
    pub object_key: Option<String>,
    pub checksum: Option<String>,
    /// Brokers that hold a local copy.
    pub local_copies: BTreeSet<u64>,
}

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
    async fn load(&self, shard: &ShardKey) -> Result<ManifestState, KeeperError>;
    /// Records an uploaded object at the end of a shard's manifest.
    async fn record_object(
        &self,
        shard: &ShardKey,
        entry: SegmentEntry,
    ) -> Result<Recorded, KeeperError>;
    /// Forgets every object wholly below `below` and raises the shard's floor to it: the
    /// objects may be deleted once this returns. The entries removed, when the keeper's
    /// answer names them.
    async fn trim(
        &self,
        shard: &ShardKey,
        below: u64,
    ) -> Result<Option<Vec<SegmentEntry>>, KeeperError>;
}

/// A keeper could not answer (the control plane unreachable, or a command it refused for
/// another reason than a taken range): its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeeperError(pub String);
