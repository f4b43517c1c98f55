//! Kafka consumer groups' committed offsets as Felix kept them before they moved into the
//! partitions' group journals (`crate::groups::kafka_offsets`): a broker's local log,
//! `<data_dir>/kafka/group-offsets`, no longer committed to.
//!
//! Decides what an upgraded broker still knows: the offsets its groups committed before
//! the upgrade, until each has moved into its partition's journal
//! (`kafka/groups/upgrade.rs`, which then forgets it here with a tombstone), and deleted
//! with the group (DeleteGroups appends tombstones here). Every OffsetCommit of an older
//! Felix was one record batch in this log; the table in memory is rebuilt from it when the
//! broker starts.
//!
//! The invariant: replaying the log in order gives the table, because a change is applied
//! to the table under the same lock that appends it, so table order is log order. (Tests
//! still compact it as the older Felix did: a snapshot of the whole table, then the sealed
//! segments wholly before it deleted.)
//!
//! Record format: key = JSON [`OffsetKey`], value = JSON [`Committed`] (none: deleted).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use felix_hot::{FsyncPolicy, LogError, ShardLog};
use felix_wire::{BatchBuilder, Compression, Record};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

/// Compact once this many records were appended since the last snapshot, and at least
/// twice as many as the table holds.
#[cfg(test)]
const COMPACT_AFTER_RECORDS: u64 = 100_000;
/// Records per snapshot batch.
#[cfg(test)]
const SNAPSHOT_BATCH_RECORDS: usize = 2_000;

/// Whose offset: a group's position in one partition, in one tenant's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OffsetKey {
    pub tenant: String,
    pub namespace: String,
    pub group: String,
    pub topic: String,
    pub partition: i32,
}

/// A committed position (the journals' record of it, so this log reads as they do).
pub use crate::groups::kafka_offsets::KafkaOffset as Committed;

struct Table {
    entries: HashMap<OffsetKey, Committed>,
    records_since_snapshot: u64,
}

/// The committed offsets of every group this broker coordinates.
pub struct CommittedOffsets {
    log: ShardLog,
    table: tokio::sync::Mutex<Table>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Encodes entries as one batch.
fn batch(entries: &[(OffsetKey, Option<Committed>)]) -> Result<Vec<u8>, LogError> {
    let now = now_ms();
    let mut b = BatchBuilder::new(Compression::None);
    for (key, value) in entries {
        b.push(Record {
            offset: 0,
            timestamp: now,
            key: Some(Bytes::from(serde_json::to_vec(key).unwrap_or_default())),
            value: value
                .as_ref()
                .map(|v| Bytes::from(serde_json::to_vec(v).unwrap_or_default())),
            headers: Vec::new(),
        });
    }
    b.build().map_err(LogError::InvalidBatch)
}

impl CommittedOffsets {
    /// Opens (or creates) the log in `dir` and rebuilds the table from it.
    pub fn open(dir: &Path, fsync: FsyncPolicy) -> Result<CommittedOffsets, LogError> {
        // A log kept and compacted as a group journal is.
        let log =
            crate::groups::journal::open_log(dir, "kafka/group-offsets".to_owned(), fsync, 0)?;
        let mut table = Table {
            entries: HashMap::new(),
            records_since_snapshot: 0,
        };
        crate::journal_replay::each_record(
            &log,
            |r| {
                table.records_since_snapshot += 1;
                apply(&mut table.entries, &r);
            },
            |e| warn!(error = %e, "skipping an unreadable group-offsets batch"),
        )?;
        if log.committed_offset() > 0 {
            info!(
                offsets = table.entries.len(),
                records = table.records_since_snapshot,
                "Kafka group offsets loaded"
            );
        }
        Ok(CommittedOffsets {
            log,
            table: tokio::sync::Mutex::new(table),
        })
    }

    /// Commits `entries` durably (under the fsync policy) and atomically: all or none. Only
    /// tests write here now (a log as an older Felix left it): offsets are committed in the
    /// partitions' group journals (`kafka/groups/offset_home.rs`).
    #[cfg(test)]
    pub async fn commit(&self, entries: Vec<(OffsetKey, Committed)>) -> Result<(), LogError> {
        if entries.is_empty() {
            return Ok(());
        }
        let entries: Vec<(OffsetKey, Option<Committed>)> =
            entries.into_iter().map(|(k, v)| (k, Some(v))).collect();
        let encoded = batch(&entries)?;
        let (ticket, compact) = {
            let mut table = self.table.lock().await;
            let ticket = self.log.append(encoded).await?;
            for (k, v) in entries {
                if let Some(v) = v {
                    table.entries.insert(k, v);
                }
                table.records_since_snapshot += 1;
            }
            let compact = table.records_since_snapshot
                > COMPACT_AFTER_RECORDS.max(2 * table.entries.len() as u64);
            (ticket, compact)
        };
        ticket.committed().await?;
        if compact && let Err(e) = self.compact().await {
            warn!(error = %e, "could not compact the Kafka group offsets; retrying later");
        }
        Ok(())
    }

    /// Deletes every committed offset of a group durably (a tombstone per offset, in one
    /// write): how many there were.
    pub async fn delete_group(
        &self,
        tenant: &str,
        namespace: &str,
        group: &str,
    ) -> Result<usize, LogError> {
        let ticket = {
            let mut table = self.table.lock().await;
            let keys: Vec<(OffsetKey, Option<Committed>)> = table
                .entries
                .keys()
                .filter(|k| k.tenant == tenant && k.namespace == namespace && k.group == group)
                .map(|k| (k.clone(), None))
                .collect();
            if keys.is_empty() {
                return Ok(0);
            }
            let ticket = self.log.append(batch(&keys)?).await?;
            for (k, _) in &keys {
                table.entries.remove(k);
            }
            table.records_since_snapshot += keys.len() as u64;
            (ticket, keys.len())
        };
        ticket.0.committed().await?;
        Ok(ticket.1)
    }

    /// Forgets `entries` durably (a tombstone each, in one write) where the table still
    /// holds that very offset: offsets moved into the group journals
    /// (`kafka/groups/upgrade.rs`). How many were forgotten.
    pub async fn forget(&self, entries: &[(OffsetKey, Committed)]) -> Result<usize, LogError> {
        let (ticket, n) = {
            let mut table = self.table.lock().await;
            let keys: Vec<(OffsetKey, Option<Committed>)> = entries
                .iter()
                .filter(|(k, v)| table.entries.get(k) == Some(v))
                .map(|(k, _)| (k.clone(), None))
                .collect();
            if keys.is_empty() {
                return Ok(0);
            }
            let ticket = self.log.append(batch(&keys)?).await?;
            for (k, _) in &keys {
                table.entries.remove(k);
            }
            table.records_since_snapshot += keys.len() as u64;
            (ticket, keys.len())
        };
        ticket.committed().await?;
        Ok(n)
    }

    /// Every offset the log still holds.
    pub async fn entries(&self) -> Vec<(OffsetKey, Committed)> {
        let table = self.table.lock().await;
        let mut out: Vec<(OffsetKey, Committed)> = table
            .entries
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// A group's committed offset for one partition.
    pub async fn get(&self, key: &OffsetKey) -> Option<Committed> {
        self.table.lock().await.entries.get(key).cloned()
    }

    /// Every committed offset of a group.
    pub async fn of_group(
        &self,
        tenant: &str,
        namespace: &str,
        group: &str,
    ) -> Vec<(OffsetKey, Committed)> {
        let table = self.table.lock().await;
        let mut out: Vec<(OffsetKey, Committed)> = table
            .entries
            .iter()
            .filter(|(k, _)| k.tenant == tenant && k.namespace == namespace && k.group == group)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Every committed offset of every group (for the lag metric).
    pub async fn all(&self) -> Vec<(OffsetKey, i64)> {
        let table = self.table.lock().await;
        table
            .entries
            .iter()
            .map(|(k, v)| (k.clone(), v.offset))
            .collect()
    }

    /// The groups that have committed offsets in a namespace.
    pub async fn groups(&self, tenant: &str, namespace: &str) -> BTreeSet<String> {
        let table = self.table.lock().await;
        table
            .entries
            .keys()
            .filter(|k| k.tenant == tenant && k.namespace == namespace)
            .map(|k| k.group.clone())
            .collect()
    }

    /// Flushes the log to the device (at shutdown).
    pub async fn flush(&self) {
        if let Err(e) = tokio::time::timeout(Duration::from_secs(10), self.log.sync()).await {
            warn!(error = %e, "flushing the Kafka group offsets timed out");
        }
    }

    /// Appends the whole table, then deletes the sealed segments wholly before it.
    #[cfg(test)]
    async fn compact(&self) -> Result<(), LogError> {
        let (tickets, snapshot_start, live) = {
            let mut table = self.table.lock().await;
            let snapshot_start = self.log.next_offset();
            let mut sorted: Vec<(OffsetKey, Option<Committed>)> = table
                .entries
                .iter()
                .map(|(k, v)| (k.clone(), Some(v.clone())))
                .collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            let mut tickets = Vec::new();
            for chunk in sorted.chunks(SNAPSHOT_BATCH_RECORDS) {
                tickets.push(self.log.append(batch(chunk)?).await?);
            }
            table.records_since_snapshot = table.entries.len() as u64;
            (tickets, snapshot_start, table.entries.len())
        };
        for t in tickets {
            t.committed().await?;
        }
        let outcome = self
            .log
            .enforce_retention_with_floor(snapshot_start, snapshot_start)?;
        info!(
            offsets = live,
            deleted_segments = outcome.deleted_segments,
            "Kafka group offsets compacted"
        );
        Ok(())
    }
}

/// Applies one record to the table: the latest record of a key wins; no value deletes.
fn apply(entries: &mut HashMap<OffsetKey, Committed>, r: &Record) {
    let Some(key) = r
        .key
        .as_ref()
        .and_then(|k| serde_json::from_slice::<OffsetKey>(k).ok())
    else {
        warn!("skipping a group-offsets record without a readable key");
        return;
    };
    match r
        .value
        .as_ref()
        .map(|v| serde_json::from_slice::<Committed>(v))
    {
        Some(Ok(v)) => {
            entries.insert(key, v);
        }
        Some(Err(e)) => {
            warn!(error = %e, "skipping a group-offsets record without a readable value")
        }
        None => {
            entries.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(group: &str, partition: i32) -> OffsetKey {
        OffsetKey {
            tenant: "default".into(),
            namespace: "default".into(),
            group: group.into(),
            topic: "t".into(),
            partition,
        }
    }

    fn at(offset: i64) -> Committed {
        Committed {
            offset,
            leader_epoch: -1,
            metadata: Some("m".into()),
            commit_ms: 1,
        }
    }

    #[tokio::test]
    async fn committed_offsets_survive_reopening_and_compaction() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let offsets = CommittedOffsets::open(dir.path(), FsyncPolicy::OnCommit).expect("open");
            for i in 0..50 {
                offsets
                    .commit(vec![(key("g", 0), at(i)), (key("g", 1), at(i * 2))])
                    .await
                    .expect("commit");
            }
            offsets
                .commit(vec![(key("h", 0), at(7))])
                .await
                .expect("commit");
            offsets.compact().await.expect("compact");
            offsets
                .commit(vec![(key("g", 0), at(100))])
                .await
                .expect("commit");
            assert_eq!(offsets.get(&key("g", 0)).await, Some(at(100)));
        }
        let offsets = CommittedOffsets::open(dir.path(), FsyncPolicy::OnCommit).expect("reopen");
        assert_eq!(offsets.get(&key("g", 0)).await, Some(at(100)));
        assert_eq!(offsets.get(&key("g", 1)).await, Some(at(98)));
        assert_eq!(offsets.get(&key("h", 0)).await, Some(at(7)));
        assert_eq!(offsets.of_group("default", "default", "g").await.len(), 2);
        let groups: Vec<String> = offsets
            .groups("default", "default")
            .await
            .into_iter()
            .collect();
        assert_eq!(groups, vec!["g".to_owned(), "h".to_owned()]);
    }

    #[tokio::test]
    async fn compaction_drops_superseded_segments() {
        let dir = tempfile::tempdir().expect("tempdir");
        let offsets = CommittedOffsets::open(dir.path(), FsyncPolicy::OnCommit).expect("open");
        // About 40 KB per round: enough rounds to seal several 4 MiB segments.
        let metadata = "x".repeat(400);
        for round in 0..300 {
            let entries = (0..100)
                .map(|p| {
                    (
                        key("g", p),
                        Committed {
                            metadata: Some(metadata.clone()),
                            ..at(round)
                        },
                    )
                })
                .collect();
            offsets.commit(entries).await.expect("commit");
        }
        let before = offsets.log.size_bytes();
        offsets.compact().await.expect("compact");
        assert!(
            offsets.log.size_bytes() < before / 2,
            "{before} -> {}",
            offsets.log.size_bytes()
        );
        drop(offsets);
        let offsets = CommittedOffsets::open(dir.path(), FsyncPolicy::OnCommit).expect("reopen");
        for p in 0..100 {
            assert_eq!(offsets.get(&key("g", p)).await.map(|c| c.offset), Some(299));
        }
    }
}
