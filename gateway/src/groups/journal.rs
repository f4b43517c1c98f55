//! The group journal of one shard: every group's progress on the shard, durable without
//! the control plane.
//!
//! Decides where progress lives and what makes it durable: each change ([`Event`]) is a
//! record appended to a log of its own beside the shard's log
//! (`<stream dir>/groups/<shard>`, a [`ShardLog`] like the shard's), and a request that
//! changed it is answered once that append is written under the broker's fsync policy. The
//! log's writer groups concurrent appends into one write, so an ack costs an append, never
//! a Raft round.
//!
//! The invariant: replaying the journal in order gives each group's progress, because a
//! group's events are applied under that group's lock in the order they are appended. The
//! journal is compacted by appending every live group's whole progress as a snapshot and
//! then deleting the sealed segments wholly before the first snapshot.
//!
//! Record format: key = the group's name, value = JSON `{"id": group id, "ev": Event}`.

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;
use felix_hot::{Appended, FsyncPolicy, LogConfig, LogError, RetentionPolicy, ShardLog};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{BatchBuilder, BatchIter, Compression, DecodedBatch, Record};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::cursor::{Cursor, Event};

/// Segments of a journal: small, so compaction can drop them soon.
const SEGMENT_BYTES: u64 = 4 << 20;

#[derive(Serialize, Deserialize)]
struct Entry {
    id: u64,
    ev: Event,
}

/// Opens (or creates) the journal in `dir` and replays it: each group's latest cursor.
pub(crate) fn open(
    dir: &Path,
    name: String,
    fsync: FsyncPolicy,
) -> Result<(ShardLog, HashMap<String, Cursor>, u64), LogError> {
    let log = ShardLog::open(
        dir,
        LogConfig {
            shard: name,
            segment_bytes: SEGMENT_BYTES,
            segment_age: None,
            fsync,
            // Compaction decides what goes: the policy only has to allow it.
            retention: RetentionPolicy {
                max_bytes: Some(0),
                max_age: None,
            },
            ..LogConfig::default()
        },
    )?;
    let mut cursors: HashMap<String, Cursor> = HashMap::new();
    let mut records = 0u64;
    let end = log.committed_offset();
    let mut offset = log.first_offset();
    while offset < end {
        let read = log.read(offset, 4 << 20, None)?;
        if read.batches.is_empty() {
            break;
        }
        for (_, bytes) in BatchIter::new(&read.batches, usize::MAX).flatten() {
            match DecodedBatch::decode(bytes, DEFAULT_MAX_DECOMPRESSED) {
                Ok(decoded) => {
                    for r in decoded.records {
                        records += 1;
                        replay(&mut cursors, &r);
                    }
                }
                Err(e) => warn!(error = %e, "skipping an unreadable group-journal batch"),
            }
        }
        offset = read.next_offset;
    }
    Ok((log, cursors, records))
}

fn replay(cursors: &mut HashMap<String, Cursor>, r: &Record) {
    let (Some(key), Some(value)) = (&r.key, &r.value) else {
        return;
    };
    let Ok(group) = std::str::from_utf8(key) else {
        return;
    };
    let entry: Entry = match serde_json::from_slice(value) {
        Ok(e) => e,
        Err(e) => {
            warn!(error = %e, "skipping an unreadable group-journal record");
            return;
        }
    };
    let cursor = cursors
        .entry(group.to_owned())
        .or_insert_with(|| Cursor::new(entry.id));
    // A newer group of the same name replaces the old one's progress; an older one's
    // late records are not its.
    if entry.id > cursor.id {
        *cursor = Cursor::new(entry.id);
    }
    if entry.id == cursor.id {
        cursor.apply(&entry.ev);
    }
}

/// Appends `events` of group `group` (id `id`) as one batch; await the ticket for the write.
pub(crate) async fn append(
    log: &ShardLog,
    group: &str,
    id: u64,
    events: &[Event],
) -> Result<Appended, LogError> {
    let now = super::cursor::now_ms();
    let mut b = BatchBuilder::new(Compression::None);
    for ev in events {
        let value = serde_json::to_vec(&Entry { id, ev: ev.clone() }).unwrap_or_default();
        b.push(Record {
            offset: 0,
            timestamp: now,
            key: Some(Bytes::copy_from_slice(group.as_bytes())),
            value: Some(Bytes::from(value)),
            headers: Vec::new(),
        });
    }
    let batch = b.build().map_err(LogError::InvalidBatch)?;
    log.append(batch).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(offset: u64) -> Event {
        Event::Claim {
            consumer: "c".into(),
            deadline_ms: 1,
            records: vec![(offset, 1)],
            next: offset + 1,
        }
    }

    #[tokio::test]
    async fn replay_gives_each_groups_progress_and_a_snapshot_replaces_what_came_before() {
        let dir = tempfile::tempdir().expect("tempdir");
        let open_it = || open(dir.path(), "t/n/s/0/groups".into(), FsyncPolicy::OnCommit);
        {
            let (log, cursors, _) = open_it().expect("open");
            assert!(cursors.is_empty());
            for e in [Event::Skip { to: 0 }, claim(0), claim(1)] {
                append(&log, "a", 1, &[e]).await.expect("append");
            }
            append(&log, "a", 1, &[Event::Ack { offsets: vec![0] }])
                .await
                .expect("ack");
            // An older group of the same name (id 0) is not this one's.
            append(&log, "a", 0, &[Event::Ack { offsets: vec![1] }])
                .await
                .expect("stale");
            let t = append(&log, "b", 2, &[Event::Skip { to: 7 }])
                .await
                .expect("b");
            t.committed().await.expect("written");
        }
        let (log, cursors, records) = open_it().expect("reopen");
        assert_eq!(records, 6);
        let a = &cursors["a"];
        assert_eq!(a.id, 1);
        assert_eq!(
            a.progress.pending.keys().copied().collect::<Vec<_>>(),
            vec![1]
        );
        assert_eq!((a.progress.acked, a.progress.next), (1, Some(2)));
        assert_eq!(cursors["b"].progress.next, Some(7));
        // A snapshot stands for everything before it: segments before it may go.
        let snapshot = Event::Snapshot {
            progress: a.progress.clone(),
        };
        let t = append(&log, "a", 1, &[snapshot]).await.expect("snapshot");
        t.committed().await.expect("written");
        drop(log);
        let (_, cursors, _) = open_it().expect("reopen");
        assert_eq!(cursors["a"].progress, a.progress);
    }
}
