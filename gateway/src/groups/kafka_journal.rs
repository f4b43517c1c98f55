//! The format of Kafka classic groups' offsets in a shard's group journal, and their
//! replay (the operations on them are `kafka_offsets.rs`'s).
//!
//! Decides how an offset record is told from a Felix group's: by the header [`HEADER`].
//! Key = the Kafka group's name, value = JSON [`KafkaOffset`] (none: the group's offset
//! deleted). A replay of Felix groups skips these records; [`replay_all`] reads only them,
//! and the latest record of a group wins, so a snapshot of the whole table stands for
//! everything before it.
//!
//! Kept apart from the operations, which need the broker: the group registry, which the
//! broker holds, needs only the table and the snapshot.

use std::collections::HashMap;

use bytes::Bytes;
use felix_hot::{Appended, LogError, ShardLog};
use felix_wire::{BatchBuilder, Compression, Header, Record};
use serde::{Deserialize, Serialize};
use tracing::warn;

/// Marks a journal record as a Kafka classic group's offset.
pub const HEADER: &str = "felix-kafka-offset";

/// A classic group's committed position in one partition (Kafka's OffsetCommit fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaOffset {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
    pub commit_ms: i64,
}

/// One shard's committed offsets, by Kafka group name.
pub(crate) type KafkaTable = HashMap<String, KafkaOffset>;

fn is_kafka(r: &Record) -> bool {
    r.headers.iter().any(|h| h.key == HEADER)
}

/// Whether a journal record is a Kafka offset (a Felix group replay skips it).
pub(crate) fn skip_in_group_replay(r: &Record) -> bool {
    is_kafka(r)
}

/// Encodes offsets (none: deleted) as one batch.
pub(crate) fn batch(entries: &[(String, Option<KafkaOffset>)]) -> Result<Vec<u8>, LogError> {
    let now = super::cursor::now_ms();
    let mut b = BatchBuilder::new(Compression::None);
    for (group, offset) in entries {
        b.push(Record {
            offset: 0,
            timestamp: now,
            key: Some(Bytes::copy_from_slice(group.as_bytes())),
            value: offset
                .as_ref()
                .map(|o| Bytes::from(serde_json::to_vec(o).unwrap_or_default())),
            headers: vec![Header {
                key: HEADER.to_owned(),
                value: None,
            }],
        });
    }
    b.build().map_err(LogError::InvalidBatch)
}

/// Replays the journal's Kafka offsets: the latest record of each group wins.
pub(crate) fn replay_all(log: &ShardLog) -> Result<KafkaTable, LogError> {
    let mut table = KafkaTable::new();
    crate::journal_replay::each_record(
        log,
        |r| {
            if is_kafka(&r) {
                apply(&mut table, &r);
            }
        },
        |_| {}, // the Felix groups' replay reports it
    )?;
    Ok(table)
}

fn apply(table: &mut KafkaTable, r: &Record) {
    let Some(group) = r.key.as_ref().and_then(|k| std::str::from_utf8(k).ok()) else {
        return;
    };
    match r.value.as_ref().map(|v| serde_json::from_slice(v)) {
        Some(Ok(o)) => {
            table.insert(group.to_owned(), o);
        }
        Some(Err(e)) => warn!(error = %e, "skipping an unreadable Kafka offset record"),
        None => {
            table.remove(group);
        }
    }
}

/// Appends the whole table (a compaction's snapshot); call it under the table's lock.
pub(crate) async fn snapshot(
    log: &ShardLog,
    table: &KafkaTable,
) -> Result<Option<Appended>, LogError> {
    if table.is_empty() {
        return Ok(None);
    }
    let mut entries: Vec<(String, Option<KafkaOffset>)> = table
        .iter()
        .map(|(g, o)| (g.clone(), Some(o.clone())))
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut last = None;
    for chunk in entries.chunks(2_000) {
        last = Some(log.append(batch(chunk)?).await?);
    }
    Ok(last)
}
