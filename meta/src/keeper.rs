//! The keepers of a shard's manifest: what answers the object tier's [`ManifestKeeper`]
//! calls (read a shard's manifest, record an uploaded object, trim the oldest objects).
//! Invariant: every keeper applies the control plane's own rules ([`MetaState::apply`]): an
//! object is recorded only where the manifest ends, so two uploaders racing for one range
//! cannot both succeed; a trim raises the floor and names what it removed.
//!
//! The broker's keeper is its [`MetaHandle`] (the Raft group). [`MemoryControlPlane`]
//! applies the same commands to a [`MetaState`] held in memory: one process, no Raft, for
//! tests of the tier that are not about consensus.

use std::sync::Arc;

use async_trait::async_trait;
use felix_model::{KeeperError, ManifestKeeper, ManifestState, Recorded, SegmentEntry};
use parking_lot::Mutex;

use crate::model::{ShardKey, StreamSettings};
use crate::{Applied, Command, CommandError, MetaError, MetaHandle, MetaState};

impl MetaState {
    /// A shard's manifest as this state records it.
    pub fn manifest(&self, shard: &ShardKey) -> ManifestState {
        ManifestState {
            objects: self.manifests.get(shard).cloned().unwrap_or_default(),
            floor: self.manifest_floors.get(shard).copied().unwrap_or(0),
        }
    }
}

/// The two calls a control plane answers (the Raft group's handle, or one in memory); the
/// manifest operations are built on them once, below.
#[async_trait]
trait ControlPlane: Send + Sync {
    async fn propose(&self, cmd: Command) -> Result<Applied, MetaError>;
    async fn manifest(&self, shard: &ShardKey) -> Result<ManifestState, MetaError>;
}

/// The manifest operations, once for both control planes (the orphan rule keeps a blanket
/// `impl ManifestKeeper` over [`ControlPlane`] out: the trait is felix-model's).
async fn load(cp: &impl ControlPlane, shard: &ShardKey) -> Result<ManifestState, KeeperError> {
    cp.manifest(shard)
        .await
        .map_err(|e| KeeperError(e.to_string()))
}

async fn record_object(
    cp: &impl ControlPlane,
    shard: &ShardKey,
    entry: SegmentEntry,
) -> Result<Recorded, KeeperError> {
    let cmd = Command::RecordObject {
        shard: shard.clone(),
        segment: entry,
    };
    match cp.propose(cmd).await {
        Ok(_) => Ok(Recorded::Done),
        Err(MetaError::Rejected(CommandError::AlreadyExists { .. })) => Ok(Recorded::RangeTaken),
        Err(e) => Err(KeeperError(e.to_string())),
    }
}

async fn trim(
    cp: &impl ControlPlane,
    shard: &ShardKey,
    below: u64,
) -> Result<Option<Vec<SegmentEntry>>, KeeperError> {
    let cmd = Command::TrimManifest {
        shard: shard.clone(),
        below,
    };
    match cp.propose(cmd).await {
        Ok(Applied::Trimmed { removed }) => Ok(Some(removed)),
        Ok(_) => Ok(None),
        Err(e) => Err(KeeperError(e.to_string())),
    }
}

/// [`ManifestKeeper`] for a [`ControlPlane`] type, through the functions above.
macro_rules! keeper {
    ($ty:ty) => {
        #[async_trait]
        impl ManifestKeeper for $ty {
            async fn load(&self, shard: &ShardKey) -> Result<ManifestState, KeeperError> {
                load(self, shard).await
            }

            async fn record_object(
                &self,
                shard: &ShardKey,
                entry: SegmentEntry,
            ) -> Result<Recorded, KeeperError> {
                record_object(self, shard, entry).await
            }

            async fn trim(
                &self,
                shard: &ShardKey,
                below: u64,
            ) -> Result<Option<Vec<SegmentEntry>>, KeeperError> {
                trim(self, shard, below).await
            }
        }
    };
}

keeper!(MetaHandle);
keeper!(MemoryControlPlane);

#[async_trait]
impl ControlPlane for MetaHandle {
    async fn propose(&self, cmd: Command) -> Result<Applied, MetaError> {
        MetaHandle::propose(self, cmd).await
    }

    async fn manifest(&self, shard: &ShardKey) -> Result<ManifestState, MetaError> {
        self.read(|s| s.manifest(shard)).await
    }
}

/// A control plane of one, in memory: commands are applied to a [`MetaState`] by the same
/// rules as the Raft group's state machine, at once. Cheap to clone (clones share the state).
#[derive(Debug, Clone, Default)]
pub struct MemoryControlPlane {
    state: Arc<Mutex<MetaState>>,
}

impl MemoryControlPlane {
    /// A control plane holding `shard`'s tenant, namespace and stream (with `settings`):
    /// where a test of one shard's tier starts.
    pub async fn with_stream(
        shard: &ShardKey,
        settings: StreamSettings,
    ) -> Result<MemoryControlPlane, MetaError> {
        let meta = MemoryControlPlane::default();
        for cmd in [
            Command::CreateTenant {
                name: shard.tenant.clone(),
            },
            Command::CreateNamespace {
                tenant: shard.tenant.clone(),
                name: shard.namespace.clone(),
            },
            Command::CreateStream {
                tenant: shard.tenant.clone(),
                namespace: shard.namespace.clone(),
                name: shard.stream.clone(),
                settings,
            },
        ] {
            meta.propose(cmd).await?;
        }
        Ok(meta)
    }

    /// Applies `cmd`, answering as [`MetaHandle::propose`] does.
    pub async fn propose(&self, cmd: Command) -> Result<Applied, MetaError> {
        self.state.lock().apply(&cmd).map_err(MetaError::Rejected)
    }

    /// Reads the state, as [`MetaHandle::read`] does.
    pub async fn read<T>(&self, f: impl FnOnce(&MetaState) -> T) -> Result<T, MetaError> {
        Ok(f(&self.state.lock()))
    }
}

#[async_trait]
impl ControlPlane for MemoryControlPlane {
    async fn propose(&self, cmd: Command) -> Result<Applied, MetaError> {
        MemoryControlPlane::propose(self, cmd).await
    }

    async fn manifest(&self, shard: &ShardKey) -> Result<ManifestState, MetaError> {
        self.read(|s| s.manifest(shard)).await
    }
}

#[cfg(test)]
mod tests {
    use felix_model::TierState;

    use super::*;

    fn shard() -> ShardKey {
        ShardKey {
            tenant: "acme".into(),
            namespace: "prod".into(),
            stream: "orders".into(),
            shard: 0,
        }
    }

    fn object(base: u64, last: u64) -> SegmentEntry {
        SegmentEntry {
            base_offset: base,
            last_offset: last,
            min_timestamp: 0,
            max_timestamp: 0,
            size_bytes: 10,
            tier: TierState::Cold,
            object_key: Some(format!("{base}-{last}")),
            checksum: None,
            local_copies: Default::default(),
        }
    }

    async fn control_plane_with_a_stream() -> MemoryControlPlane {
        MemoryControlPlane::with_stream(&shard(), StreamSettings::default())
            .await
            .expect("stream created")
    }

    #[tokio::test]
    async fn a_range_is_recorded_once_and_only_where_the_manifest_ends() {
        let meta = control_plane_with_a_stream().await;
        let keeper: &dyn ManifestKeeper = &meta;
        let key = shard();
        assert_eq!(
            keeper.record_object(&key, object(0, 9)).await.ok(),
            Some(Recorded::Done)
        );
        assert_eq!(
            keeper.record_object(&key, object(0, 9)).await.ok(),
            Some(Recorded::RangeTaken)
        );
        assert_eq!(
            keeper.record_object(&key, object(20, 29)).await.ok(),
            Some(Recorded::RangeTaken),
            "a gap is refused like an overlap"
        );
        assert_eq!(
            keeper.record_object(&key, object(10, 19)).await.ok(),
            Some(Recorded::Done)
        );
        let state = keeper.load(&key).await.expect("loads");
        assert_eq!(state.uploaded_end(), 20);
        assert_eq!(state.objects.len(), 2);
    }

    #[tokio::test]
    async fn a_trim_names_what_it_removed_and_raises_the_floor() {
        let meta = control_plane_with_a_stream().await;
        let keeper: &dyn ManifestKeeper = &meta;
        let key = shard();
        for (base, last) in [(0, 9), (10, 19), (20, 29)] {
            keeper
                .record_object(&key, object(base, last))
                .await
                .expect("records");
        }
        let removed = keeper.trim(&key, 15).await.expect("trims");
        assert_eq!(removed, Some(vec![object(0, 9)]));
        let state = keeper.load(&key).await.expect("loads");
        assert_eq!(state.floor, 15);
        assert_eq!(state.objects.keys().copied().collect::<Vec<_>>(), [10, 20]);
    }

    #[tokio::test]
    async fn an_unknown_shard_is_a_control_plane_error() {
        let meta = MemoryControlPlane::default();
        let keeper: &dyn ManifestKeeper = &meta;
        assert!(matches!(
            keeper.record_object(&shard(), object(0, 9)).await,
            Err(KeeperError(_))
        ));
    }
}
