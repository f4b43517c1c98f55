//! Consumer groups (docs/groups.md): acknowledgement per record, a visibility timeout,
//! redelivery with attempt numbers, and dead letters, on a durable stream.
//!
//! * [`cursor`] — one group's progress on one shard and the events that change it.
//! * [`journal`] — where that progress is durable: a log beside each shard's log.
//! * `poll.rs` — handing records out (claims), long-polls, the quorum mark as the bound.
//! * `answers.rs` — ack, nack and extend.
//! * `commit.rs` — a position committed with `expected_offset` (single-writer fencing).
//! * `dead_letter.rs` — publishing exhausted records to the dead-letter stream, once.
//! * `admin.rs` — create, describe, list, delete (existence and settings are the control
//!   plane's).
//! * `requests.rs` — the QUIC requests, answered.
//! * `sweep.rs` — the once-a-second pass: lapsed dead letters, compaction, gauges.
//! * [`metrics`] — the per-group metrics.
//!
//! Invariant: a group's progress on a shard is changed only by the broker leading the
//! shard, under that group's lock, and every change is in the shard's group journal before
//! the request that made it is answered; in particular a record's attempt number is
//! written before the record is handed out.

pub(crate) mod answers;
pub(crate) mod commit;
pub(crate) mod cursor;
pub(crate) mod dead_letter;
pub(crate) mod journal;
pub mod metrics;
pub(crate) mod poll;
pub mod requests;
pub(crate) mod sweep;

mod admin;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use felix_hot::ShardLog;
use felix_meta::model::{Group, ShardKey, group_key};
use felix_wire::protocol::{ErrorBody, codes};

use crate::broker::Broker;
use crate::errors::{err, log_error};
use crate::shard::{Shard, shard_key};
use cursor::{Cursor, Event};

/// Compact a journal once this many records were appended since it was opened or last
/// compacted (and at least twice as many as pending records it would keep).
const COMPACT_AFTER_RECORDS: u64 = 200_000;

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The group journals open on this broker, one per shard it leads and groups were used on.
#[derive(Default)]
pub struct Groups {
    open: tokio::sync::Mutex<HashMap<ShardKey, Arc<GroupShard>>>,
}

/// The groups of one shard: its journal and each group's cursor.
pub(crate) struct GroupShard {
    pub key: ShardKey,
    /// The data shard the journal is beside: a re-opened shard (a re-created stream) gets
    /// its journal re-opened too.
    pub shard: Arc<Shard>,
    log: ShardLog,
    cursors: parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Cursor>>>>,
    appended: AtomicU64,
    /// Serializes compactions.
    compacting: tokio::sync::Mutex<()>,
}

impl Broker {
    /// The group `name` of a stream, from the local copy of the control plane.
    pub(crate) fn group(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        name: &str,
    ) -> Result<Group, ErrorBody> {
        self.node.stream_settings(tenant, namespace, stream)?;
        self.node
            .meta
            .local(|s| {
                s.groups
                    .get(&group_key(tenant, namespace, stream, name))
                    .cloned()
            })
            .ok_or_else(|| {
                err(
                    codes::UNKNOWN_GROUP,
                    "unknown_group",
                    format!("unknown group {name} of stream {tenant}/{namespace}/{stream}"),
                )
            })
    }

    /// The group journal of a shard this broker leads (opened on first use).
    pub(crate) async fn group_shard(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
    ) -> Result<Arc<GroupShard>, ErrorBody> {
        let key = shard_key(tenant, namespace, stream, shard_no);
        let (shard, _) = self.shard(&key)?;
        if shard.log.is_none() {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "ephemeral_stream",
                format!("stream {tenant}/{namespace}/{stream} is ephemeral: it has no groups"),
            ));
        }
        let mut open = self.groups.open.lock().await;
        if let Some(g) = open.get(&key)
            && Arc::ptr_eq(&g.shard, &shard)
        {
            return Ok(g.clone());
        }
        // A re-created stream's shard: its journal is another one (the stream directory
        // was claimed for the new incarnation when the shard was opened).
        open.remove(&key);
        let dir = self
            .shards
            .stream_dir(tenant, namespace, stream)
            .join("groups")
            .join(shard_no.to_string());
        let fsync = self.node.config.fsync_policy();
        let name = format!("{key}/groups");
        let (log, cursors, records) =
            tokio::task::spawn_blocking(move || journal::open(&dir, name, fsync))
                .await
                .map_err(|e| err(codes::INTERNAL, "internal", e.to_string()))?
                .map_err(|e| log_error(&e))?;
        let g = Arc::new(GroupShard {
            key: key.clone(),
            shard,
            log,
            cursors: parking_lot::Mutex::new(
                cursors
                    .into_iter()
                    .map(|(k, c)| (k, Arc::new(tokio::sync::Mutex::new(c))))
                    .collect(),
            ),
            appended: AtomicU64::new(records),
            compacting: tokio::sync::Mutex::new(()),
        });
        open.insert(key, g.clone());
        Ok(g)
    }

    /// Closes the group journals (at shutdown): their writers flush.
    pub(crate) async fn close_groups(&self) {
        let open: Vec<Arc<GroupShard>> = self
            .groups
            .open
            .lock()
            .await
            .drain()
            .map(|(_, g)| g)
            .collect();
        for g in open {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), g.log.sync()).await;
        }
    }
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

    /// Waits for an appended change to be written.
    pub(crate) async fn written(ticket: felix_hot::Appended) -> Result<(), ErrorBody> {
        ticket
            .committed()
            .await
            .map(|_| ())
            .map_err(|e| log_error(&e))
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
        for t in tickets {
            if Self::written(t).await.is_err() {
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
