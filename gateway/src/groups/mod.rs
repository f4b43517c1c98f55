//! Consumer groups (docs/groups.md): acknowledgement per record, a visibility timeout,
//! redelivery with attempt numbers, and dead letters, on a durable stream.
//!
//! * [`cursor`] — one group's progress on one shard and the events that change it.
//! * [`journal`] — where that progress is durable: a log beside each shard's log.
//! * `replica.rs` — that log on every replica of the shard, and when a change is replicated
//!   enough to be answered (a majority on a Quorum stream).
//! * [`copy`] — copying the journal between replicas; `follow.rs` — a follower's copy loop;
//!   `recover.rs` — a new leader taking the journal over.
//! * `poll.rs` — handing records out (claims), long-polls, the quorum mark as the bound.
//! * `answers.rs` — ack, nack and extend.
//! * `commit.rs` — a position committed with `expected_offset` (single-writer fencing).
//! * `dead_letter.rs` — publishing exhausted records to the dead-letter stream, once.
//! * [`duty`] — a broker's own publishes (dead letters forwarded to another broker) and
//!   the check their owner makes with `auth` on.
//! * `admin.rs` — create, describe, list, delete (existence and settings are the control
//!   plane's).
//! * `requests.rs` — the QUIC requests, answered.
//! * `registry.rs` — the journals open on this broker and each group's cursor in them.
//! * `sweep.rs` — the once-a-second pass: lapsed dead letters, compaction, gauges.
//! * [`metrics`] — the per-group metrics.
//! * [`kafka_offsets`] — Kafka classic groups' committed offsets, in the same journal
//!   (`kafka_journal.rs`: their records).
//! * `share_positions.rs` — a Kafka share group's start offsets: described, altered,
//!   deleted, as the Felix group's positions.
//!
//! Invariant: a group's progress on a shard is changed only by the broker leading the
//! shard, under that group's lock, and every change is in the shard's group journal (on a
//! Quorum stream: on a majority of its replicas) before the request that made it is
//! answered; in particular a record's attempt number is written before the record is
//! handed out.

pub(crate) mod answers;
pub(crate) mod commit;
pub mod copy;
pub(crate) mod cursor;
pub(crate) mod dead_letter;
pub mod duty;
pub(crate) mod follow;
pub(crate) mod journal;
pub(crate) mod kafka_journal;
pub mod kafka_offsets;
pub mod metrics;
pub mod move_logs;
pub(crate) mod poll;
pub(crate) mod recover;
pub(crate) mod registry;
pub(crate) mod replica;
pub(crate) mod replica_state;
pub mod requests;
pub(crate) mod share_positions;
pub mod sweep;

mod admin;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use felix_meta::model::{Group, ShardKey, group_key};
use felix_wire::protocol::{ErrorBody, codes};

use crate::broker::Broker;
use crate::errors::{err, log_error};
use crate::metrics::Metrics;
use crate::shard::shard_key;
pub(crate) use cursor::now_ms;
pub(crate) use registry::GroupShard;

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

    /// [`Broker::group`], confirmed by a linearizable read of the control plane before a
    /// group is called unknown: a group created through another broker a moment ago may
    /// not have reached this broker's copy yet, and a client that was told the group exists
    /// must not then be told it does not (seen in issue 25's moves test: a poll right after
    /// `create_group` answered `unknown_group`).
    pub(crate) async fn group_confirmed(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        name: &str,
    ) -> Result<Group, ErrorBody> {
        let unknown = match self.group(tenant, namespace, stream, name) {
            Err(e) if e.code == codes::UNKNOWN_GROUP => e,
            known => return known,
        };
        let key = group_key(tenant, namespace, stream, name);
        self.node
            .meta
            .read(|s| s.groups.get(&key).cloned())
            .await
            .map_err(crate::errors::meta_error)?
            .ok_or(unknown)
    }

    /// The groups of a shard this broker leads (opened on first use): on a replicated shard,
    /// the journal is taken over at the leader's generation first ([`recover`]).
    pub(crate) async fn group_shard(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
    ) -> Result<Arc<GroupShard>, ErrorBody> {
        let key = shard_key(tenant, namespace, stream, shard_no);
        let (shard, _) = self.shard(&key)?;
        let generation = shard.repl.as_ref().and_then(|r| r.leading());
        // The replicas a change waits for: a placement that grew or moved (same generation)
        // takes the journal over again, so the new replicas count from then on.
        let placement = self
            .node
            .meta
            .placement(&key)
            .filter(|p| generation.is_some() && p.replicas.len() > 1);
        let replicas = placement
            .as_ref()
            .map(|p| p.replicas.clone())
            .unwrap_or_default();
        let current = |open: &HashMap<ShardKey, Arc<GroupShard>>| {
            open.get(&key)
                .filter(|g| {
                    Arc::ptr_eq(&g.shard, &shard)
                        && g.replication.generation == generation
                        && g.replication.replicas == replicas
                })
                .cloned()
        };
        if let Some(g) = current(&*self.groups.open.lock().await) {
            return Ok(g);
        }
        // A re-created stream's shard, or a new leadership: the journal is taken over again,
        // once (one taking over per shard at a time), and without holding up the other
        // shards' groups meanwhile: a takeover may wait seconds for other replicas.
        let one = self
            .groups
            .taking_over
            .lock()
            .entry(key.clone())
            .or_default()
            .clone();
        let _one = one.lock().await;
        if let Some(g) = current(&*self.groups.open.lock().await) {
            return Ok(g);
        }
        self.groups.open.lock().await.remove(&key);
        let mut j = self.journal_log(&shard).await?;
        let replication = match (generation, placement) {
            (Some(generation), Some(p)) => self.take_journal_over(&mut j, &p, generation).await?,
            (generation, _) => replica::Replication {
                generation,
                ..Default::default()
            },
        };
        let log = j.log.clone();
        let ((cursors, records), kafka) = tokio::task::spawn_blocking(move || {
            Ok::<_, felix_hot::LogError>((
                journal::replay_all(&log)?,
                kafka_journal::replay_all(&log)?,
            ))
        })
        .await
        .map_err(|e| err(codes::INTERNAL, "internal", e.to_string()))?
        .map_err(|e| log_error(&e))?;
        let g = Arc::new(GroupShard {
            key: key.clone(),
            shard,
            log: j.log,
            mark: j.mark,
            replication,
            cursors: parking_lot::Mutex::new(
                cursors
                    .into_iter()
                    .map(|(k, c)| (k, Arc::new(tokio::sync::Mutex::new(c))))
                    .collect(),
            ),
            kafka: tokio::sync::Mutex::new(kafka),
            appended: AtomicU64::new(records),
            record_bytes: AtomicU64::new(0),
            compacting: tokio::sync::Mutex::new(()),
            me: self.broker_id(),
            quorum_timeout: std::time::Duration::from_millis(
                self.node.config.publish_quorum_timeout_ms,
            ),
        });
        if g.replication.generation.is_some() {
            self.rewind_past_end(&g).await?;
        }
        self.groups.open.lock().await.insert(key, g.clone());
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
        self.groups.followers.lock().await.clear();
        let logs: Vec<replica::JournalLog> = self
            .groups
            .logs
            .lock()
            .await
            .drain()
            .map(|(_, j)| j)
            .collect();
        drop(open);
        for j in logs {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), j.log.sync()).await;
        }
    }
}

impl Metrics {
    /// Counts records handed out by a poll.
    pub(crate) fn group_handed_out(&self, key: &ShardKey, group: &str, first: u64, again: u64) {
        if first + again == 0 {
            return;
        }
        let l = metrics::GroupLabel::of(key, group);
        // Every count a delivery can lead to exists from the first one on.
        self.groups.seed(&l);
        self.groups
            .delivered
            .get_or_create(&l)
            .inc_by(first + again);
        if again > 0 {
            self.groups.redelivered.get_or_create(&l).inc_by(again);
        }
    }

    pub(crate) fn group_acked(&self, key: &ShardKey, group: &str, n: u64) {
        if n > 0 {
            self.groups
                .acked
                .get_or_create(&metrics::GroupLabel::of(key, group))
                .inc_by(n);
        }
    }

    pub(crate) fn group_dead_lettered(&self, key: &ShardKey, group: &str, n: u64) {
        if n > 0 {
            self.groups
                .dead_lettered
                .get_or_create(&metrics::GroupLabel::of(key, group))
                .inc_by(n);
        }
    }
}
