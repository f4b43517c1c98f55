//! The group journals open on this broker and each group's cursor in them: which journal
//! serves a shard, and how a change is recorded (appended to the journal, then applied to
//! the cursor, under the cursor's lock, so journal order is application order).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use felix_hot::ShardLog;
use felix_meta::model::{Group, ShardKey};
use felix_wire::protocol::{ErrorBody, codes};

use super::cursor::{Cursor, Event};
use super::journal;
use super::replica_state::{Following, JournalLog, JournalMark, Replication};
use crate::errors::log_error;
use crate::shard::Shard;

/// Compact a journal once this many records were appended since it was opened or last
/// compacted (and at least twice as many as pending records it would keep).
pub(super) const COMPACT_AFTER_RECORDS: u64 = 200_000;

/// The group journals open on this broker: the groups of each shard it leads and groups
/// were used on, each journal's log whatever this broker's role, and the copy loops of the
/// journals it follows.
#[derive(Default)]
pub struct Groups {
    pub(super) open: tokio::sync::Mutex<HashMap<ShardKey, Arc<GroupShard>>>,
    pub(super) logs: tokio::sync::Mutex<HashMap<ShardKey, JournalLog>>,
    pub(super) followers: tokio::sync::Mutex<HashMap<ShardKey, Following>>,
    /// One takeover of a shard's journal at a time.
    pub(super) taking_over: parking_lot::Mutex<HashMap<ShardKey, Arc<tokio::sync::Mutex<()>>>>,
}

/// The groups of one shard: its journal and each group's cursor.
pub(crate) struct GroupShard {
    pub key: ShardKey,
    /// The data shard the journal is beside: a re-opened shard (a re-created stream) gets
    /// its journal re-opened too.
    pub shard: Arc<Shard>,
    pub(super) log: ShardLog,
    /// How far the other replicas hold the journal.
    pub(super) mark: Arc<JournalMark>,
    /// What a change waits for before it is answered.
    pub(super) replication: Replication,
    pub(super) cursors: parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Cursor>>>>,
    /// Kafka classic groups' committed offsets on this shard ([`super::kafka_offsets`]).
    pub(super) kafka: tokio::sync::Mutex<super::kafka_journal::KafkaTable>,
    pub(super) appended: AtomicU64,
    /// Stored bytes per record of the shard's latest batches (0: none read yet): what a
    /// poll reads for the records it may take, so it does not read (and check) a
    /// [`super::poll::FETCH_CHUNK`] of the log to hand out one batch.
    pub(super) record_bytes: AtomicU64,
    /// Serializes compactions.
    pub(super) compacting: tokio::sync::Mutex<()>,
    /// This broker's id and the wait for a majority (the publish quorum timeout).
    pub(super) me: u64,
    pub(super) quorum_timeout: std::time::Duration,
}

impl GroupShard {
    /// The cursor of `group` on this shard (a fresh one for a group new here, or one that
    /// replaces the progress of an older group of the same name).
    pub(crate) async fn cursor(&self, group: &Group) -> tokio::sync::OwnedMutexGuard<Cursor> {
        let c = self
            .cursors
            .lock()
            .entry(group.name.clone())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(Cursor::new(group.id))))
            .clone();
        let mut guard = c.lock_owned().await;
        if guard.id != group.id {
            *guard = Cursor::new(group.id);
        }
        guard
    }

    /// Appends `events` of the cursor's group and applies them to it; returns the ticket
    /// to await before answering. Called with the cursor's lock held, so journal order is
    /// application order.
    pub(crate) async fn record(
        &self,
        group: &str,
        cursor: &mut Cursor,
        events: Vec<Event>,
    ) -> Result<felix_hot::Appended, ErrorBody> {
        let ticket = journal::append(&self.log, group, cursor.id, &events)
            .await
            .map_err(|e| log_error(&e))?;
        for e in &events {
            cursor.apply(e);
        }
        self.appended
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        Ok(ticket)
    }

    /// Waits for an appended change to be written and, on a Quorum stream of several
    /// replicas, held by a majority of them.
    pub(crate) async fn written(&self, ticket: felix_hot::Appended) -> Result<(), ErrorBody> {
        let (_, last) = ticket.committed().await.map_err(|e| log_error(&e))?;
        let r = &self.replication;
        let Some(generation) = r.generation.filter(|_| r.quorum) else {
            return Ok(());
        };
        let held = self
            .mark
            .wait_majority(
                generation,
                &r.replicas,
                self.me,
                &self.log,
                last + 1,
                self.quorum_timeout,
            )
            .await;
        if held {
            return Ok(());
        }
        Err(ErrorBody::new(
            codes::QUORUM_TIMEOUT,
            "quorum_timeout",
            format!(
                "shard {}: no majority of replicas held the group change in time; it may \
                 or may not take effect",
                self.key
            ),
        )
        .retry_after(500))
    }

    /// Compacts the journal when it has grown: every group still in `live` (group name →
    /// id) is snapshotted, then the segments wholly before the first snapshot go.
    pub(crate) async fn compact_if_grown(&self, live: &HashMap<String, u64>) {
        let cursors: Vec<(String, Arc<tokio::sync::Mutex<Cursor>>)> = self
            .cursors
            .lock()
            .iter()
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect();
        if self.appended.load(Ordering::Relaxed) < COMPACT_AFTER_RECORDS {
            return;
        }
        let Ok(_one) = self.compacting.try_lock() else {
            return;
        };
        let start = self.log.next_offset();
        let mut tickets = Vec::new();
        let mut kept = 0u64;
        for (name, c) in cursors {
            let c = c.lock().await;
            if live.get(&name) != Some(&c.id) {
                self.cursors.lock().remove(&name);
                continue;
            }
            let snapshot = Event::Snapshot {
                progress: c.progress.clone(),
            };
            kept += c.progress.pending.len() as u64;
            match journal::append(&self.log, &name, c.id, &[snapshot]).await {
                Ok(t) => tickets.push(t),
                Err(e) => {
                    tracing::warn!(shard = %self.key, error = %e, "group journal snapshot failed");
                    return;
                }
            }
        }
        match super::kafka_journal::snapshot(&self.log, &*self.kafka.lock().await).await {
            Ok(t) => tickets.extend(t),
            Err(e) => {
                tracing::warn!(shard = %self.key, error = %e, "Kafka offsets snapshot failed");
                return;
            }
        }
        for t in tickets {
            if self.written(t).await.is_err() {
                return;
            }
        }
        self.appended.store(kept.max(1), Ordering::Relaxed);
        match self.log.enforce_retention_with_floor(start, start) {
            Ok(o) => tracing::info!(shard = %self.key, deleted_segments = o.deleted_segments,
                "group journal compacted"),
            Err(e) => {
                tracing::warn!(shard = %self.key, error = %e, "group journal compaction failed")
            }
        }
    }
}
