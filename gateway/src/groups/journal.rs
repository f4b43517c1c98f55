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
//! Record format: key = the group's name, value = JSON `{"id": group id, "ev": Event}`, or,
//! for claims and acks, `{"id": .., "claim": {"consumer", "deadline_ms", "runs": [[first
//! offset, count, attempt], ..], "next"}}` and `{"id": .., "ack": [[first offset, count],
//! ..]}`: runs of consecutive offsets instead of one entry per record, because a Kafka
//! share fetch claims and acks whole stored batches (thousands of records) at a time and
//! writing each offset was most of a claim's journal cost. Entries written before the
//! runs (`"ev"` claims and acks, one offset each) are read as before; a broker older than
//! the runs skips a run entry as unreadable (it has no `"ev"`).

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;
use felix_hot::{Appended, FsyncPolicy, LogConfig, LogError, RetentionPolicy, ShardLog};
use felix_wire::{BatchBuilder, BatchIter, Compression, Record};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::cursor::{Cursor, Event};

/// Segments of a journal: small, so compaction can drop them soon.
const SEGMENT_BYTES: u64 = 4 << 20;

/// Most records one journal entry's runs may name when read back: far above what a poll
/// claims or an answer names at once ([`super::answers::MAX_ANSWER_RECORDS`]), so only a
/// damaged entry is refused (and skipped) rather than expanded into memory without end.
const MAX_RUN_RECORDS: u64 = 1 << 20;

#[derive(Deserialize)]
struct Entry {
    id: u64,
    /// Every event but a claim or an ack; and those too as written before the runs.
    #[serde(default)]
    ev: Option<Event>,
    #[serde(default)]
    claim: Option<ClaimRuns>,
    /// Acked offsets: `(first, count)` runs.
    #[serde(default)]
    ack: Option<Vec<(u64, u64)>>,
}

/// A claim as read: [`Event::Claim`] with its records as `(first, count, attempt)` runs.
#[derive(Deserialize)]
struct ClaimRuns {
    consumer: String,
    deadline_ms: i64,
    runs: Vec<(u64, u64, u32)>,
    next: u64,
}

/// An [`Entry`] as written: the event borrowed, not copied; a claim's and an ack's offsets
/// as runs.
#[derive(Serialize)]
struct EntryRef<'a> {
    id: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    ev: Option<&'a Event>,
    #[serde(skip_serializing_if = "Option::is_none")]
    claim: Option<ClaimRunsRef<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ack: Option<Vec<(u64, u64)>>,
}

#[derive(Serialize)]
struct ClaimRunsRef<'a> {
    consumer: &'a str,
    deadline_ms: i64,
    runs: Vec<(u64, u64, u32)>,
    next: u64,
}

impl<'a> EntryRef<'a> {
    fn of(id: u64, ev: &'a Event) -> EntryRef<'a> {
        let mut e = EntryRef {
            id,
            ev: None,
            claim: None,
            ack: None,
        };
        match ev {
            Event::Claim {
                consumer,
                deadline_ms,
                records,
                next,
            } => {
                e.claim = Some(ClaimRunsRef {
                    consumer,
                    deadline_ms: *deadline_ms,
                    runs: claim_runs(records),
                    next: *next,
                });
            }
            Event::Ack { offsets } => e.ack = Some(offset_runs(offsets)),
            other => e.ev = Some(other),
        }
        e
    }
}

/// `records` as `(first, count, attempt)` runs: consecutive offsets with one attempt, in
/// the order given, so expanding them gives `records` back.
fn claim_runs(records: &[(u64, u32)]) -> Vec<(u64, u64, u32)> {
    let mut runs: Vec<(u64, u64, u32)> = Vec::new();
    for &(offset, attempt) in records {
        match runs.last_mut() {
            Some((first, count, a))
                if *a == attempt && first.checked_add(*count) == Some(offset) =>
            {
                *count += 1;
            }
            _ => runs.push((offset, 1, attempt)),
        }
    }
    runs
}

/// `offsets` as `(first, count)` runs of consecutive offsets, in the order given.
fn offset_runs(offsets: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &offset in offsets {
        match runs.last_mut() {
            Some((first, count)) if first.checked_add(*count) == Some(offset) => *count += 1,
            _ => runs.push((offset, 1)),
        }
    }
    runs
}

/// The offsets of `(first, count)` runs, if they are sound: no offset past `u64::MAX`, at
/// most [`MAX_RUN_RECORDS`] in all.
fn expand_runs<T>(
    runs: impl Iterator<Item = (u64, u64)> + Clone,
    each: impl Fn(usize) -> T,
) -> Option<Vec<(u64, T)>> {
    let mut total = 0u64;
    for (first, count) in runs.clone() {
        first.checked_add(count)?;
        total = total.checked_add(count).filter(|t| *t <= MAX_RUN_RECORDS)?;
    }
    let mut out = Vec::with_capacity(total as usize);
    for (i, (first, count)) in runs.enumerate() {
        out.extend((first..first + count).map(|o| (o, each(i))));
    }
    Some(out)
}

impl Entry {
    /// The event this entry holds; `None` if it holds none, several, or runs that are not
    /// sound.
    fn event(self) -> Option<Event> {
        match (self.ev, self.claim, self.ack) {
            (Some(ev), None, None) => Some(ev),
            (None, Some(c), None) => {
                let records = expand_runs(c.runs.iter().map(|r| (r.0, r.1)), |i| c.runs[i].2)?;
                Some(Event::Claim {
                    consumer: c.consumer,
                    deadline_ms: c.deadline_ms,
                    records,
                    next: c.next,
                })
            }
            (None, None, Some(runs)) => {
                let offsets = expand_runs(runs.into_iter(), |_| ())?;
                Some(Event::Ack {
                    offsets: offsets.into_iter().map(|(o, ())| o).collect(),
                })
            }
            _ => None,
        }
    }
}

/// Opens (or creates) the journal in `dir` and replays it: each group's latest cursor.
#[cfg(test)]
fn open(
    dir: &Path,
    name: String,
    fsync: FsyncPolicy,
) -> Result<(ShardLog, HashMap<String, Cursor>, u64), LogError> {
    let log = open_log(dir, name, fsync, 0)?;
    let (cursors, records) = replay_all(&log)?;
    Ok((log, cursors, records))
}

/// Opens (or creates) the journal's log in `dir`; an empty one starts at `start_offset`
/// (a replica re-seeded from a leader whose journal was compacted starts where it does).
pub(crate) fn open_log(
    dir: &Path,
    name: String,
    fsync: FsyncPolicy,
    start_offset: u64,
) -> Result<ShardLog, LogError> {
    ShardLog::open(
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
            start_offset,
            ..LogConfig::default()
        },
    )
}

/// Replays the whole journal: each group's latest cursor, and how many records it read.
pub(crate) fn replay_all(log: &ShardLog) -> Result<(HashMap<String, Cursor>, u64), LogError> {
    let mut cursors: HashMap<String, Cursor> = HashMap::new();
    let mut records = 0u64;
    crate::journal_replay::each_record(
        log,
        |r| {
            records += 1;
            replay(&mut cursors, &r);
        },
        |e| warn!(error = %e, "skipping an unreadable group-journal batch"),
    )?;
    Ok((cursors, records))
}

/// The generation of the journal's last batch (`-1` when it has none): what a replica's
/// copy is compared by (the newest generation first, then the length).
pub(crate) fn last_generation(log: &ShardLog) -> i32 {
    let next = log.committed_offset();
    if next == 0 || next <= log.first_offset() {
        return -1;
    }
    generation_at(log, next - 1).unwrap_or(-1)
}

/// The generation of the batch holding `offset`, if the journal holds it.
pub(crate) fn generation_at(log: &ShardLog, offset: u64) -> Option<i32> {
    let read = log.read(offset, 1, None).ok()?;
    BatchIter::new(&read.batches, usize::MAX)
        .flatten()
        .find(|(h, _)| h.base_offset as u64 <= offset && h.last_offset() as u64 >= offset)
        .map(|(h, _)| h.partition_leader_epoch)
}

/// Where generation `generation` ends in this journal: the first offset of a batch of a
/// newer generation, or the end. A replica whose last batch is of `generation` but does
/// not match keeps what is below this and cuts the rest.
pub(crate) fn end_of_generation(log: &ShardLog, generation: i32) -> u64 {
    let end = log.committed_offset();
    let mut offset = log.first_offset();
    while offset < end {
        let Ok(read) = log.read(offset, 4 << 20, None) else {
            return offset;
        };
        if read.batches.is_empty() {
            break;
        }
        for (h, _) in BatchIter::new(&read.batches, usize::MAX).flatten() {
            if h.partition_leader_epoch > generation {
                return h.base_offset as u64;
            }
        }
        offset = read.next_offset;
    }
    end
}

/// Appends a record no group owns: a new leader's first write at its generation, which
/// makes everything before it part of that generation's history once a majority holds it.
pub(crate) async fn append_barrier(log: &ShardLog) -> Result<Appended, LogError> {
    let mut b = BatchBuilder::new(Compression::None);
    b.push(Record {
        offset: 0,
        timestamp: super::cursor::now_ms(),
        key: None,
        value: None,
        headers: Vec::new(),
    });
    let batch = b.build().map_err(LogError::InvalidBatch)?;
    log.append(batch).await
}

fn replay(cursors: &mut HashMap<String, Cursor>, r: &Record) {
    let (Some(key), Some(value)) = (&r.key, &r.value) else {
        return;
    };
    if super::kafka_journal::skip_in_group_replay(r) {
        return;
    }
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
    let id = entry.id;
    let Some(ev) = entry.event() else {
        warn!(group, "skipping a group-journal record with no sound event");
        return;
    };
    let cursor = cursors
        .entry(group.to_owned())
        .or_insert_with(|| Cursor::new(id));
    // A newer group of the same name replaces the old one's progress; an older one's
    // late records are not its.
    if id > cursor.id {
        *cursor = Cursor::new(id);
    }
    if id == cursor.id {
        cursor.apply(&ev);
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
        let value = serde_json::to_vec(&EntryRef::of(id, ev)).unwrap_or_default();
        b.push(Record {
            offset: 0,
            timestamp: now,
            key: Some(Bytes::copy_from_slice(group.as_bytes())),
            value: Some(Bytes::from(value)),
            headers: Vec::new(),
        });
    }
    let batch = b.build().map_err(LogError::InvalidBatch)?;
    // Deferred: the change's holder writes it when it waits for it, right after letting go
    // of the group's cursor (`Registry::written`), so a poll or an acknowledgement does not
    // hand its journal write to the log's writer thread and wait to be woken (felix-hot's
    // `inline.rs`); under a per-write fsync policy or a write gate the thread writes it as
    // before.
    log.append_deferred(batch).await
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

    /// Appends records with the raw values given, as a journal written by some earlier
    /// build holds them.
    async fn append_raw(log: &ShardLog, group: &str, values: &[&str]) {
        let mut b = BatchBuilder::new(Compression::None);
        for v in values {
            b.push(Record {
                offset: 0,
                timestamp: 1,
                key: Some(Bytes::copy_from_slice(group.as_bytes())),
                value: Some(Bytes::copy_from_slice(v.as_bytes())),
                headers: Vec::new(),
            });
        }
        let t = log.append(b.build().expect("batch")).await.expect("append");
        t.committed().await.expect("written");
    }

    /// The stored values of the journal's records, in order.
    fn values(log: &ShardLog) -> Vec<Bytes> {
        let read = log.read(0, 1 << 20, None).expect("read");
        BatchIter::new(&read.batches, usize::MAX)
            .flatten()
            .flat_map(|(_, b)| {
                felix_wire::DecodedBatch::decode(b, usize::MAX)
                    .expect("decode")
                    .records
            })
            .filter_map(|r| r.value)
            .collect()
    }

    #[tokio::test]
    async fn a_journal_written_before_runs_still_recovers_and_continues_with_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let open_it = || open(dir.path(), "t/n/s/0/groups".into(), FsyncPolicy::OnCommit);
        {
            let (log, _, _) = open_it().expect("open");
            // As the build before runs wrote them: a claim and an ack name every offset.
            append_raw(
                &log,
                "a",
                &[
                    r#"{"id":1,"ev":{"e":"skip","to":0}}"#,
                    r#"{"id":1,"ev":{"e":"claim","consumer":"c","deadline_ms":9000000000000,"records":[[0,1],[1,1],[2,1],[3,1]],"next":4}}"#,
                    r#"{"id":1,"ev":{"e":"ack","offsets":[0,1]}}"#,
                    r#"{"id":1,"ev":{"e":"release","offsets":[3],"not_before_ms":0}}"#,
                ],
            )
            .await;
            let (cursors, _) = replay_all(&log).expect("replay");
            let p = &cursors["a"].progress;
            assert_eq!((p.next, p.acked), (Some(4), 2));
            assert_eq!(p.pending.keys().copied().collect::<Vec<_>>(), vec![2, 3]);
            // This build continues the same journal with runs.
            let more = [
                Event::Claim {
                    consumer: "d".into(),
                    deadline_ms: 9_000_000_000_000,
                    records: vec![(3, 2), (4, 1), (5, 1)],
                    next: 6,
                },
                Event::Ack {
                    offsets: vec![2, 3, 4],
                },
            ];
            let t = append(&log, "a", 1, &more).await.expect("append");
            t.committed().await.expect("written");
        }
        let (_, cursors, records) = open_it().expect("reopen");
        assert_eq!(records, 6);
        let p = &cursors["a"].progress;
        assert_eq!((p.next, p.acked), (Some(6), 5));
        assert_eq!(p.pending.keys().copied().collect::<Vec<_>>(), vec![5]);
        assert_eq!(p.pending[&5].attempts, 1);
        assert_eq!(
            p.pending[&5].hold,
            crate::groups::cursor::Hold::Claimed {
                consumer: "d".into(),
                deadline_ms: 9_000_000_000_000
            }
        );
    }

    #[tokio::test]
    async fn claims_and_acks_are_written_as_runs_and_replay_as_they_were_applied() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, _, _) =
            open(dir.path(), "t/n/s/0/groups".into(), FsyncPolicy::OnCommit).expect("open");
        // Redeliveries first (attempts 2 and 3, with a gap), then a fresh batch of 5,000.
        let mut records = vec![(10, 2), (11, 2), (12, 3), (20, 2)];
        records.extend((100..5_100).map(|o| (o, 1)));
        let events = vec![
            Event::Skip { to: 0 },
            Event::Claim {
                consumer: "c".into(),
                deadline_ms: 9_000_000_000_000,
                records: records.clone(),
                next: 5_100,
            },
            Event::Ack {
                offsets: (100..3_000).chain([11, 4_000]).collect(),
            },
        ];
        let mut live = Cursor::new(1);
        for e in &events {
            live.apply(e);
        }
        let t = append(&log, "a", 1, &events).await.expect("append");
        t.committed().await.expect("written");
        let stored = values(&log);
        assert_eq!(stored.len(), 3);
        assert!(
            stored[1].len() < 200 && stored[2].len() < 200,
            "5,004 claimed and 2,902 acked records are a few runs each: {:?}",
            (stored[1].len(), stored[2].len())
        );
        // Read back, each entry is the event that was applied.
        let read: Vec<Event> = stored
            .iter()
            .map(|v| {
                serde_json::from_slice::<Entry>(v)
                    .expect("entry")
                    .event()
                    .expect("event")
            })
            .collect();
        assert_eq!(read, events);
        let (cursors, _) = replay_all(&log).expect("replay");
        assert_eq!(cursors["a"].progress, live.progress);
    }

    #[tokio::test]
    async fn a_damaged_run_is_skipped_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, _, _) =
            open(dir.path(), "t/n/s/0/groups".into(), FsyncPolicy::OnCommit).expect("open");
        append_raw(
            &log,
            "a",
            &[
                r#"{"id":1,"ev":{"e":"skip","to":0}}"#,
                r#"{"id":1,"claim":{"consumer":"c","deadline_ms":1,"runs":[[0,18446744073709551615,1]],"next":1}}"#,
                r#"{"id":1,"claim":{"consumer":"c","deadline_ms":1,"runs":[[0,2000000,1]],"next":1}}"#,
                r#"{"id":1,"ack":[[0,1]],"ev":{"e":"skip","to":5}}"#,
                r#"{"id":1}"#,
            ],
        )
        .await;
        let (cursors, _) = replay_all(&log).expect("replay");
        let p = &cursors["a"].progress;
        assert_eq!((p.next, p.acked), (Some(0), 0));
        assert!(p.pending.is_empty());
    }

    #[tokio::test]
    async fn copies_are_compared_by_the_generations_of_their_batches() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = open_log(
            dir.path(),
            "t/n/s/0/groups".into(),
            FsyncPolicy::OnCommit,
            0,
        )
        .expect("open");
        assert_eq!(last_generation(&log), -1, "an empty copy has no generation");
        log.set_generation(1).expect("generation 1");
        append(&log, "a", 1, &[Event::Skip { to: 0 }])
            .await
            .expect("a");
        append(&log, "a", 1, &[claim(0)]).await.expect("b");
        log.set_generation(3).expect("generation 3");
        let t = append_barrier(&log).await.expect("barrier");
        t.committed().await.expect("written");
        assert_eq!(last_generation(&log), 3);
        assert_eq!(generation_at(&log, 1), Some(1));
        assert_eq!(generation_at(&log, 2), Some(3));
        assert_eq!(generation_at(&log, 3), None, "past the end");
        // A copy whose last batch is of generation 1 or 2 agrees with this one below 2.
        assert_eq!(end_of_generation(&log, 1), 2);
        assert_eq!(end_of_generation(&log, 2), 2);
        assert_eq!(end_of_generation(&log, 3), 3);
        // The barrier belongs to no group: a replay ignores it.
        let (cursors, _) = replay_all(&log).expect("replay");
        assert_eq!(cursors["a"].progress.next, Some(1));
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
