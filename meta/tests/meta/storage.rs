//! The control plane's storage: the Raft log store (openraft's conformance suite, reopen,
//! torn tails, truncate and purge) and the state machine's snapshots.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use felix_meta::log_store::LogStore;
use felix_meta::model::{Command, StreamSettings};
use felix_meta::state_machine::StateMachineStore;
use felix_meta::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    BasicNode, CommittedLeaderId, EntryPayload, Membership, RaftSnapshotBuilder, StorageIOError,
};
use tempfile::TempDir;

fn storage_error(e: std::io::Error) -> StorageError {
    StorageIOError::write(openraft::AnyError::new(&e)).into()
}

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().map_err(storage_error)?;
        let log = LogStore::open(dir.path()).map_err(storage_error)?;
        let sm = StateMachineStore::open(dir.path()).map_err(storage_error)?;
        Ok((dir, log, sm))
    }
}

#[test]
fn log_store_passes_openraft_conformance_suite() {
    Suite::<TypeConfig, LogStore, StateMachineStore, Builder, TempDir>::test_all(Builder).unwrap();
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn tenant_entry(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Command::CreateTenant {
            name: format!("tenant-{index}"),
        }),
    }
}

fn tenant_entries(term: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<Entry> {
    indexes.map(|i| tenant_entry(term, i)).collect()
}

async fn all_entries(store: &mut LogStore) -> Vec<Entry> {
    store.try_get_log_entries(..).await.unwrap()
}

async fn indexes(store: &mut LogStore) -> Vec<u64> {
    all_entries(store)
        .await
        .iter()
        .map(|e| e.log_id.index)
        .collect()
}

fn log_file_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("raft-log")).unwrap().len()
}

fn append_bytes(dir: &Path, bytes: &[u8]) {
    let mut f = OpenOptions::new()
        .append(true)
        .open(dir.join("raft-log"))
        .unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

#[tokio::test]
async fn a_fresh_store_is_empty_and_reports_no_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path()).unwrap();
    assert_eq!(store.dir(), dir.path());
    assert!(!store.has_state());
    assert_eq!(store.read_vote().await.unwrap(), None);
    assert_eq!(store.read_committed().await.unwrap(), None);
    let state = store.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (None, None));
    assert!(all_entries(&mut store).await.is_empty());
}

#[tokio::test]
async fn saving_a_vote_alone_counts_as_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path()).unwrap();
    store.save_vote(&Vote::new(3, 1)).await.unwrap();
    assert!(store.has_state());
    assert!(LogStore::open(dir.path()).unwrap().has_state());
}

#[tokio::test]
async fn entries_vote_committed_and_purge_marker_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let written = tenant_entries(1, 1..=6);
    {
        let mut store = LogStore::open(dir.path()).unwrap();
        store.blocking_append(written[..3].to_vec()).await.unwrap();
        store.blocking_append(written[3..].to_vec()).await.unwrap();
        store.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
        store.save_committed(Some(log_id(1, 5))).await.unwrap();
        store.purge(log_id(1, 2)).await.unwrap();
    }
    let mut store = LogStore::open(dir.path()).unwrap();
    assert!(store.has_state());
    assert_eq!(all_entries(&mut store).await, written[2..].to_vec());
    assert_eq!(
        store.read_vote().await.unwrap(),
        Some(Vote::new_committed(2, 1))
    );
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 5)));
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 2)));
    assert_eq!(state.last_log_id, Some(log_id(1, 6)));
}

#[tokio::test]
async fn empty_and_inverted_ranges_read_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = LogStore::open(dir.path()).unwrap();
    store
        .blocking_append(tenant_entries(1, 1..=5))
        .await
        .unwrap();
    assert!(store.try_get_log_entries(3..3).await.unwrap().is_empty());
    #[allow(clippy::reversed_empty_ranges)]
    let inverted = store.try_get_log_entries(4..2).await.unwrap();
    assert!(inverted.is_empty());
    assert!(store.try_get_log_entries(6..).await.unwrap().is_empty());
    assert_eq!(
        store.try_get_log_entries(2..=3).await.unwrap(),
        tenant_entries(1, 2..=3)
    );
}

#[tokio::test]
async fn a_log_cut_in_the_middle_of_a_record_is_cut_back_to_the_last_whole_record_and_appends_continue()
 {
    let dir = tempfile::tempdir().unwrap();
    let whole = {
        let mut store = LogStore::open(dir.path()).unwrap();
        store
            .blocking_append(tenant_entries(1, 1..=3))
            .await
            .unwrap();
        let whole = log_file_len(dir.path());
        store
            .blocking_append(vec![tenant_entry(1, 4)])
            .await
            .unwrap();
        whole
    };
    // A crash in the middle of the fourth record's write: keep only part of it.
    let full = log_file_len(dir.path());
    for cut in [whole + 3, whole + 8, full - 1] {
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join("raft-log"))
            .unwrap();
        f.set_len(cut).unwrap();
        drop(f);

        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&mut store).await, vec![1, 2, 3], "cut at {cut}");
        assert_eq!(
            log_file_len(dir.path()),
            whole,
            "the torn tail is cut off on disk"
        );
        assert_eq!(
            store.get_log_state().await.unwrap().last_log_id,
            Some(log_id(1, 3))
        );

        store
            .blocking_append(vec![tenant_entry(1, 4)])
            .await
            .unwrap();
        drop(store);
        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(all_entries(&mut store).await, tenant_entries(1, 1..=4));
        assert_eq!(log_file_len(dir.path()), full);
    }
}

#[tokio::test]
async fn garbage_appended_to_the_log_is_cut_off_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path()).unwrap();
        store
            .blocking_append(tenant_entries(1, 1..=3))
            .await
            .unwrap();
    }
    let whole = log_file_len(dir.path());
    for garbage in [
        // A plausible length and a wrong checksum.
        &[
            17, 0, 0, 0, 1, 2, 3, 4, b'{', b'"', b'x', b'"', b':', b'1', b'}', 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0,
        ][..],
        // A length running past the end of the file.
        &[0xff, 0xff, 0xff, 0x7f, 9, 9, 9, 9, 1, 2][..],
        // A zero-filled tail (what a file extended by a crash looks like); crc32c("") is 0.
        &[0u8; 64][..],
        // Less than a header.
        &[7, 7, 7][..],
    ] {
        append_bytes(dir.path(), garbage);
        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&mut store).await, vec![1, 2, 3]);
        assert_eq!(log_file_len(dir.path()), whole);
    }

    append_bytes(dir.path(), b"garbage garbage garbage");
    let mut store = LogStore::open(dir.path()).unwrap();
    store
        .blocking_append(tenant_entries(1, 4..=5))
        .await
        .unwrap();
    drop(store);
    let mut store = LogStore::open(dir.path()).unwrap();
    assert_eq!(all_entries(&mut store).await, tenant_entries(1, 1..=5));
}

#[tokio::test]
async fn a_record_with_a_valid_checksum_that_does_not_decode_fails_the_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path()).unwrap();
        store
            .blocking_append(tenant_entries(1, 1..=2))
            .await
            .unwrap();
    }
    let payload = b"{\"not\":\"an entry\"}";
    let mut record = Vec::new();
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    record.extend_from_slice(payload);
    append_bytes(dir.path(), &record);

    let err = LogStore::open(dir.path()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
}

#[tokio::test]
async fn truncate_and_purge_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path()).unwrap();
        store
            .blocking_append(tenant_entries(1, 1..=10))
            .await
            .unwrap();
        store.truncate(log_id(1, 8)).await.unwrap();
        assert_eq!(indexes(&mut store).await, (1..=7).collect::<Vec<_>>());
        store.purge(log_id(1, 3)).await.unwrap();
        assert_eq!(indexes(&mut store).await, (4..=7).collect::<Vec<_>>());
        // A new leader's entries after the truncation point.
        store
            .blocking_append(tenant_entries(2, 8..=9))
            .await
            .unwrap();
    }
    let mut store = LogStore::open(dir.path()).unwrap();
    let mut want = tenant_entries(1, 4..=7);
    want.extend(tenant_entries(2, 8..=9));
    assert_eq!(all_entries(&mut store).await, want);
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 3)));
    assert_eq!(state.last_log_id, Some(log_id(2, 9)));
    assert!(!dir.path().join("raft-log.tmp").exists());

    // Purging everything leaves only the marker, which is also the last log id.
    store.purge(log_id(2, 9)).await.unwrap();
    drop(store);
    let mut store = LogStore::open(dir.path()).unwrap();
    assert!(all_entries(&mut store).await.is_empty());
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(2, 9)));
    assert_eq!(state.last_log_id, Some(log_id(2, 9)));
    assert!(store.has_state());
    store
        .blocking_append(tenant_entries(2, 10..=11))
        .await
        .unwrap();
    drop(store);
    let mut store = LogStore::open(dir.path()).unwrap();
    assert_eq!(all_entries(&mut store).await, tenant_entries(2, 10..=11));
}

#[tokio::test]
async fn a_crash_between_the_purge_marker_and_the_log_rewrite_does_not_bring_purged_entries_back() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path()).unwrap();
        store
            .blocking_append(tenant_entries(1, 1..=6))
            .await
            .unwrap();
    }
    let old_log = std::fs::read(dir.path().join("raft-log")).unwrap();
    {
        let mut store = LogStore::open(dir.path()).unwrap();
        store.purge(log_id(1, 4)).await.unwrap();
    }
    // Put back the log as it was before the rewrite, with the marker already saved, plus a
    // leftover temp file.
    std::fs::write(dir.path().join("raft-log"), &old_log).unwrap();
    std::fs::write(dir.path().join("raft-log.tmp"), b"half a rewrite").unwrap();

    let mut store = LogStore::open(dir.path()).unwrap();
    assert_eq!(indexes(&mut store).await, vec![5, 6]);
    assert_eq!(
        store.get_log_state().await.unwrap().last_purged_log_id,
        Some(log_id(1, 4))
    );
    assert!(!dir.path().join("raft-log.tmp").exists());
}

fn entry(index: u64, payload: EntryPayload<TypeConfig>) -> Entry {
    Entry {
        log_id: log_id(1, index),
        payload,
    }
}

fn sample_entries() -> Vec<Entry> {
    let membership = Membership::new(
        vec![BTreeSet::from([1])],
        BTreeMap::from([(1, BasicNode::new("127.0.0.1:7001"))]),
    );
    vec![
        entry(1, EntryPayload::Blank),
        entry(2, EntryPayload::Membership(membership)),
        entry(
            3,
            EntryPayload::Normal(Command::CreateTenant {
                name: "acme".into(),
            }),
        ),
        entry(
            4,
            EntryPayload::Normal(Command::CreateNamespace {
                tenant: "acme".into(),
                name: "orders".into(),
            }),
        ),
        entry(
            5,
            EntryPayload::Normal(Command::CreateStream {
                tenant: "acme".into(),
                namespace: "orders".into(),
                name: "created".into(),
                settings: StreamSettings::default(),
            }),
        ),
        entry(
            6,
            EntryPayload::Normal(Command::AllocateProducerIds { count: 10 }),
        ),
    ]
}

#[tokio::test]
async fn a_state_machine_snapshot_round_trips_through_reopen_and_install() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = StateMachineStore::open(dir.path()).unwrap();
    let results = sm.apply(sample_entries()).await.unwrap();
    assert_eq!(results.len(), 6);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let state = sm.read(|s| s.clone());
    let applied = sm.applied_state().await.unwrap();
    assert_eq!(applied.0, Some(log_id(1, 6)));
    assert_eq!(applied.1.log_id(), &Some(log_id(1, 2)));
    assert!(state.tenants.contains_key("acme"));

    let snapshot = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 6)));

    // Reopen from the same directory: the state comes back from the snapshot.
    let mut reopened = StateMachineStore::open(dir.path()).unwrap();
    assert_eq!(reopened.read(|s| s.clone()), state);
    assert_eq!(reopened.applied_state().await.unwrap(), applied);
    assert_eq!(reopened.applied_index(), 6);
    assert!(
        reopened
            .watch_registry()
            .borrow()
            .has_namespace("acme", "orders")
    );
    let current = reopened
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("a snapshot");
    assert_eq!(current.meta, snapshot.meta);

    // Install into a fresh store elsewhere: same state.
    let other_dir = tempfile::tempdir().unwrap();
    let mut fresh = StateMachineStore::open(other_dir.path()).unwrap();
    let mut receiving = fresh.begin_receiving_snapshot().await.unwrap();
    *receiving = *snapshot.snapshot;
    fresh
        .install_snapshot(&snapshot.meta, receiving)
        .await
        .unwrap();
    assert_eq!(fresh.read(|s| s.clone()), state);
    assert_eq!(fresh.applied_state().await.unwrap(), applied);
    assert!(
        fresh
            .watch_registry()
            .borrow()
            .stream("acme", "orders", "created")
            .is_some()
    );
    assert_eq!(*fresh.watch_applied().borrow(), 6);
    assert_eq!(
        fresh
            .get_current_snapshot()
            .await
            .unwrap()
            .expect("a snapshot")
            .meta,
        snapshot.meta
    );

    // And the installed snapshot survives a reopen of that store too.
    let mut fresh_reopened = StateMachineStore::open(other_dir.path()).unwrap();
    assert_eq!(fresh_reopened.read(|s| s.clone()), state);
    assert_eq!(fresh_reopened.applied_state().await.unwrap(), applied);
}

fn object(base: u64, last: u64) -> felix_meta::model::SegmentEntry {
    felix_meta::model::SegmentEntry {
        base_offset: base,
        last_offset: last,
        min_timestamp: 0,
        max_timestamp: 0,
        size_bytes: 100,
        tier: felix_meta::model::TierState::Cold,
        object_key: Some(format!("{base:020}-{last:020}.parquet")),
        checksum: None,
        local_copies: BTreeSet::new(),
    }
}

/// The manifest of uploaded objects only grows at its end, without gaps or overlaps, and
/// total retention trims it from the front while raising the floor.
#[test]
fn manifest_records_contiguous_objects_and_trims_from_the_front() {
    use felix_meta::model::{Applied, CommandError, MetaState, ShardKey};
    let mut state = MetaState::default();
    for cmd in [
        Command::CreateTenant { name: "t".into() },
        Command::CreateNamespace {
            tenant: "t".into(),
            name: "n".into(),
        },
        Command::CreateStream {
            tenant: "t".into(),
            namespace: "n".into(),
            name: "s".into(),
            settings: StreamSettings::default(),
        },
    ] {
        state.apply(&cmd).unwrap();
    }
    let shard = ShardKey {
        tenant: "t".into(),
        namespace: "n".into(),
        stream: "s".into(),
        shard: 0,
    };
    let record = |state: &mut MetaState, base, last| {
        state.apply(&Command::RecordObject {
            shard: shard.clone(),
            segment: object(base, last),
        })
    };
    record(&mut state, 0, 99).unwrap();
    // A second uploader for the same range, an overlap and a gap are all refused.
    for (base, last) in [(0, 99), (50, 150), (101, 200)] {
        let before = state.clone();
        let e = record(&mut state, base, last).unwrap_err();
        assert!(matches!(e, CommandError::AlreadyExists { .. }), "{e:?}");
        assert_eq!(state, before, "a refused command changes nothing");
    }
    record(&mut state, 100, 199).unwrap();
    record(&mut state, 200, 299).unwrap();
    // A hot entry cannot be recorded as an object.
    let mut hot = object(300, 399);
    hot.tier = felix_meta::model::TierState::Hot;
    assert!(
        state
            .apply(&Command::RecordObject {
                shard: shard.clone(),
                segment: hot
            })
            .is_err()
    );

    let trimmed = state
        .apply(&Command::TrimManifest {
            shard: shard.clone(),
            below: 200,
        })
        .unwrap();
    let Applied::Trimmed { removed } = trimmed else {
        panic!("{trimmed:?}")
    };
    assert_eq!(
        removed.iter().map(|e| e.base_offset).collect::<Vec<_>>(),
        [0, 100]
    );
    assert_eq!(state.manifest_floors[&shard], 200);
    assert_eq!(state.manifests[&shard].len(), 1);
    // Trimming everything leaves the floor: the next object must start at or above it.
    state
        .apply(&Command::TrimManifest {
            shard: shard.clone(),
            below: 300,
        })
        .unwrap();
    assert!(state.manifests[&shard].is_empty());
    assert!(record(&mut state, 250, 320).is_err());
    record(&mut state, 300, 399).unwrap();
}

#[tokio::test]
async fn a_snapshot_carries_keys_roles_bindings_revocations_and_the_bootstrap_token() {
    use felix_meta::auth::{Permission, SigningKey};
    let dir = tempfile::tempdir().unwrap();
    let mut sm = StateMachineStore::open(dir.path()).unwrap();
    let key = SigningKey::generate(1).unwrap();
    let mut entries = sample_entries();
    let auth = [
        Command::AddSigningKey {
            key: key.clone(),
            retire_others_at: 0,
            initial: true,
        },
        Command::PutRole {
            name: "reader".into(),
            permissions: vec![Permission::parse("stream.subscribe:acme/*").unwrap()],
        },
        Command::BindRole {
            tenant: "acme".into(),
            subject: "svc".into(),
            role: "reader".into(),
        },
        Command::RevokeToken {
            jti: "t1".into(),
            expires_at: u64::MAX,
            now: 1,
        },
        Command::SetBootstrapToken {
            jti: "boot".into(),
            token: "header.body.sig".into(),
        },
        // Trusted OIDC issuers are replicated auth state too.
        Command::PutOidcIssuer {
            issuer: felix_meta::auth::OidcIssuer {
                issuer: "https://idp".into(),
                audience: "felix".into(),
                jwks: format!(
                    r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","kid":"k","x":"{}"}}]}}"#,
                    key.public
                ),
                tenant: Some("acme".into()),
                tenant_claim: None,
                subject_claim: "sub".into(),
                roles_claim: None,
                role_map: Default::default(),
                default_roles: vec!["reader".into()],
                ttl_secs: 900,
            },
        },
    ];
    for (i, cmd) in auth.into_iter().enumerate() {
        entries.push(entry(7 + i as u64, EntryPayload::Normal(cmd)));
    }
    let results = sm.apply(entries).await.unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let state = sm.read(|s| s.clone());
    assert!(state.auth.keys.contains_key(&key.kid));
    assert!(state.auth.issuers.contains_key("https://idp"));
    let snapshot = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let reopened = StateMachineStore::open(dir.path()).unwrap();
    assert_eq!(reopened.read(|s| s.auth.clone()), state.auth);
    let other_dir = tempfile::tempdir().unwrap();
    let mut fresh = StateMachineStore::open(other_dir.path()).unwrap();
    let mut receiving = fresh.begin_receiving_snapshot().await.unwrap();
    *receiving = *snapshot.snapshot;
    fresh
        .install_snapshot(&snapshot.meta, receiving)
        .await
        .unwrap();
    let installed = fresh.read(|s| s.auth.clone());
    assert_eq!(installed, state.auth);
    assert_eq!(installed.active_key().unwrap().kid, key.kid);
    assert_eq!(
        installed.bound_roles("acme", "svc").collect::<Vec<_>>(),
        ["reader"]
    );
    assert!(installed.is_revoked("t1"));
    assert_eq!(installed.bootstrap.unwrap().jti, "boot");
}
