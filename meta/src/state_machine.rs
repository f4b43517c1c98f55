//! The control plane's state machine: applies committed commands to [`MetaState`], builds
//! snapshots and installs them.
//!
//! Invariant: the state in memory is exactly the last snapshot plus every entry applied
//! since. A snapshot is written to `snapshot.json` atomically (temp file, fsync, rename,
//! directory fsync) before openraft is told about it, so after a restart the state machine
//! resumes from it and openraft replays only the log entries after it — which is what lets
//! the log be purged (compaction).
//!
//! Readers never wait on Raft: every apply that changes the registry (tenants, namespaces,
//! streams, brokers, placement) publishes a new [`Registry`] on a watch channel, and every
//! apply publishes the applied index.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, RaftSnapshotBuilder, StorageIOError};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::model::{Applied, Broker, MetaState, Placement, ShardKey, Stream};
use crate::types::{
    CommandResult, Entry, LogId, NodeId, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

/// What brokers keep locally so the data path never waits on Raft.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registry {
    /// The log index this registry reflects.
    pub applied_index: u64,
    pub tenants: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    pub streams: std::collections::BTreeMap<String, Stream>,
    pub brokers: std::collections::BTreeMap<u64, Broker>,
    #[serde(with = "crate::model::shard_map")]
    pub placements: std::collections::BTreeMap<ShardKey, Placement>,
}

impl Registry {
    fn of(state: &MetaState, applied_index: u64) -> Registry {
        Registry {
            applied_index,
            tenants: state.tenants.clone(),
            streams: state.streams.clone(),
            brokers: state.brokers.clone(),
            placements: state.placements.clone(),
        }
    }

    /// Whether the tenant exists.
    pub fn has_tenant(&self, tenant: &str) -> bool {
        self.tenants.contains_key(tenant)
    }
    /// Whether the namespace exists in the tenant.
    pub fn has_namespace(&self, tenant: &str, namespace: &str) -> bool {
        self.tenants
            .get(tenant)
            .is_some_and(|n| n.contains(namespace))
    }
    /// The stream, if it exists.
    ///
    /// Looked up on every publish and cache operation, so the key is built in a buffer the
    /// thread keeps rather than a new `String` each time (as `stream_key` spells it).
    pub fn stream(&self, tenant: &str, namespace: &str, name: &str) -> Option<&Stream> {
        thread_local! {
            static KEY: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        KEY.with_borrow_mut(|key| {
            key.clear();
            for (i, part) in [tenant, namespace, name].into_iter().enumerate() {
                if i > 0 {
                    key.push('/');
                }
                key.push_str(part);
            }
            debug_assert_eq!(*key, crate::model::stream_key(tenant, namespace, name));
            self.streams.get(key.as_str())
        })
    }
}

/// The applied state plus what openraft needs to know about it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AppliedState {
    pub last_applied: Option<LogId>,
    pub last_membership: StoredMembership,
    pub state: MetaState,
}

/// A snapshot as stored on disk and shipped to followers.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    /// The serialized [`AppliedState`].
    data: Vec<u8>,
}

const SNAPSHOT_FILE: &str = "snapshot.json";

/// The state machine. Clones share the same state (openraft takes one, the snapshot builder
/// another, the node a third for reads).
#[derive(Clone)]
pub struct StateMachineStore {
    dir: PathBuf,
    inner: Arc<RwLock<AppliedState>>,
    snapshot: Arc<RwLock<Option<StoredSnapshot>>>,
    registry_tx: Arc<watch::Sender<Arc<Registry>>>,
    applied_tx: Arc<watch::Sender<u64>>,
    snapshot_counter: Arc<std::sync::atomic::AtomicU64>,
}

fn io_err(
    e: impl std::error::Error + 'static,
    what: openraft::ErrorSubject<NodeId>,
    verb: openraft::ErrorVerb,
) -> StorageError {
    StorageIOError::new(what, verb, openraft::AnyError::new(&e)).into()
}

impl StateMachineStore {
    /// Opens the state machine in `dir`, resuming from the stored snapshot if there is one.
    pub fn open(dir: &Path) -> std::io::Result<StateMachineStore> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(SNAPSHOT_FILE);
        let (applied, snapshot) = match std::fs::read(&path) {
            Ok(bytes) => {
                let snap: StoredSnapshot = serde_json::from_slice(&bytes).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: {e}", path.display()),
                    )
                })?;
                let applied: AppliedState = serde_json::from_slice(&snap.data).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: {e}", path.display()),
                    )
                })?;
                (applied, Some(snap))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (AppliedState::default(), None),
            Err(e) => return Err(e),
        };
        let index = applied.last_applied.map_or(0, |l| l.index);
        let (registry_tx, _) = watch::channel(Arc::new(Registry::of(&applied.state, index)));
        let (applied_tx, _) = watch::channel(index);
        Ok(StateMachineStore {
            dir: dir.to_path_buf(),
            inner: Arc::new(RwLock::new(applied)),
            snapshot: Arc::new(RwLock::new(snapshot)),
            registry_tx: Arc::new(registry_tx),
            applied_tx: Arc::new(applied_tx),
            snapshot_counter: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        })
    }

    /// Reads the applied state.
    pub fn read<T>(&self, f: impl FnOnce(&MetaState) -> T) -> T {
        f(&self.inner.read().state)
    }

    /// The index of the last applied entry (0 before any).
    pub fn applied_index(&self) -> u64 {
        self.inner.read().last_applied.map_or(0, |l| l.index)
    }

    /// A watch of the registry, updated after every apply that changes it.
    pub fn watch_registry(&self) -> watch::Receiver<Arc<Registry>> {
        self.registry_tx.subscribe()
    }

    /// A watch of the applied index.
    pub fn watch_applied(&self) -> watch::Receiver<u64> {
        self.applied_tx.subscribe()
    }

    fn persist(&self, snap: &StoredSnapshot) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(snap).map_err(std::io::Error::other)?;
        let tmp = self.dir.join("snapshot.json.tmp");
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, self.dir.join(SNAPSHOT_FILE))?;
        std::fs::File::open(&self.dir)?.sync_all()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let (data, last_applied, last_membership) = {
            let inner = self.inner.read();
            let data = serde_json::to_vec(&*inner).map_err(|e| {
                io_err(
                    e,
                    openraft::ErrorSubject::StateMachine,
                    openraft::ErrorVerb::Read,
                )
            })?;
            (data, inner.last_applied, inner.last_membership.clone())
        };
        let n = self
            .snapshot_counter
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let snapshot_id = match last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, n),
            None => format!("none-{n}"),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership,
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        self.persist(&stored).map_err(|e| {
            io_err(
                e,
                openraft::ErrorSubject::Snapshot(Some(meta.signature())),
                openraft::ErrorVerb::Write,
            )
        })?;
        *self.snapshot.write() = Some(stored);
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let inner = self.inner.read();
        Ok((inner.last_applied, inner.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut results = Vec::new();
        let mut registry_changed = false;
        let index = {
            let mut inner = self.inner.write();
            for entry in entries {
                inner.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => results.push(Ok(Applied::Done)),
                    EntryPayload::Normal(cmd) => {
                        registry_changed |= MetaState::touches_registry(&cmd);
                        results.push(inner.state.apply(&cmd));
                    }
                    EntryPayload::Membership(m) => {
                        inner.last_membership = StoredMembership::new(Some(entry.log_id), m);
                        results.push(Ok(Applied::Done));
                    }
                }
            }
            let index = inner.last_applied.map_or(0, |l| l.index);
            if registry_changed {
                self.registry_tx
                    .send_replace(Arc::new(Registry::of(&inner.state, index)));
            }
            index
        };
        self.applied_tx.send_replace(index);
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let applied: AppliedState = serde_json::from_slice(&data).map_err(|e| {
            io_err(
                e,
                openraft::ErrorSubject::Snapshot(Some(meta.signature())),
                openraft::ErrorVerb::Read,
            )
        })?;
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        self.persist(&stored).map_err(|e| {
            io_err(
                e,
                openraft::ErrorSubject::Snapshot(Some(meta.signature())),
                openraft::ErrorVerb::Write,
            )
        })?;
        let index = applied.last_applied.map_or(0, |l| l.index);
        {
            let mut inner = self.inner.write();
            *inner = applied;
            self.registry_tx
                .send_replace(Arc::new(Registry::of(&inner.state, index)));
        }
        *self.snapshot.write() = Some(stored);
        self.applied_tx.send_replace(index);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self.snapshot.read().as_ref().map(|s| Snapshot {
            meta: s.meta.clone(),
            snapshot: Box::new(Cursor::new(s.data.clone())),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Command, StreamSettings};

    #[test]
    fn a_stream_is_found_by_its_three_names_and_only_by_them() {
        let mut state = MetaState::default();
        let mut create = |tenant: &str, namespace: &str, name: &str| {
            for cmd in [
                Command::CreateTenant {
                    name: tenant.into(),
                },
                Command::CreateNamespace {
                    tenant: tenant.into(),
                    name: namespace.into(),
                },
                Command::CreateStream {
                    tenant: tenant.into(),
                    namespace: namespace.into(),
                    name: name.into(),
                    settings: StreamSettings::default(),
                },
            ] {
                let _ = state.apply(&cmd);
            }
        };
        create("acme", "prod", "orders-long-name");
        create("acme", "dev", "o");
        let reg = Registry::of(&state, 1);
        // Looked up in turn on one thread: each look-up spells its own key, whatever the
        // one before it spelled.
        for _ in 0..2 {
            let long = reg
                .stream("acme", "prod", "orders-long-name")
                .expect("found");
            assert_eq!(
                (&long.namespace[..], &long.name[..]),
                ("prod", "orders-long-name")
            );
            let short = reg.stream("acme", "dev", "o").expect("found");
            assert_eq!((&short.namespace[..], &short.name[..]), ("dev", "o"));
            assert!(reg.stream("acme", "prod", "o").is_none());
            assert!(reg.stream("acme", "dev", "orders-long-name").is_none());
            assert!(reg.stream("acm", "e/dev", "o").is_none());
        }
    }
}
