//! Kafka classic consumer groups' committed offsets, kept in the group journal of each
//! partition's shard (docs/kafka.md, "Committed offsets").
//!
//! Decides where a classic group's committed offset lives and what makes it durable: the
//! offset group `g` committed for partition `p` of topic `t` is a record in the group
//! journal of shard `p` of stream `t`, appended by the shard's leader and answered once the
//! journal's replication rule holds (on a Quorum stream of several replicas: a majority
//! holds it). So it follows the shard's leader on failover and moves with the shard, as a
//! Felix group's progress does. The group's coordinator (`kafka::groups`) only routes: it
//! calls the leader's methods here, or forwards over the signed internal route [`PATH`].
//!
//! The records' format is `kafka_journal.rs`'s.
//!
//! The invariant: a shard's table of offsets is changed only under its lock and only after
//! the change was appended, so table order is journal order; a compaction snapshots the
//! table under that lock. A journal holding Kafka offsets is followed by the shard's other
//! replicas like one of a stream with Felix groups: the leader asks them to when it opens
//! it, and a replica keeps following every journal it holds a copy of.

use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use felix_hot::Appended;
use felix_meta::model::{Durability, ShardKey};
use felix_wire::protocol::{ErrorBody, codes};
use serde::{Deserialize, Serialize};
use tracing::debug;

use super::GroupShard;
pub use super::kafka_journal::KafkaOffset;
use super::kafka_journal::{self, KafkaTable};
use crate::broker::{Broker, BrokerSlot};
use crate::errors::{err, log_error};
use crate::shard::shard_key;

/// The internal route a group's coordinator forwards offset operations on.
pub const PATH: &str = "/repl/kafka-offsets";

/// What a coordinator asks of a shard's leader (or, `Follow`, of a replica).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum OffsetsOp {
    /// Commit each shard's offset, all shards of one topic for one group.
    Commit { offsets: Vec<(u32, KafkaOffset)> },
    /// Each shard's offset. `only_existing`: a shard whose journal was never opened here
    /// answers none instead of opening one (listing a whole namespace).
    Fetch {
        shards: Vec<u32>,
        only_existing: bool,
    },
    /// Delete each shard's offset of the group.
    Delete { shards: Vec<u32> },
    /// Commit each shard's offset only where the journal holds none for the group: an
    /// offset from the old local log moving in (`kafka/groups/upgrade.rs`), which never
    /// overwrites a commit made since. Answers the journal's offset after it.
    Adopt { offsets: Vec<(u32, KafkaOffset)> },
    /// Each shard's position of the Felix group of this name (a Kafka share group's start
    /// offset: everything below it retired), answered in `offset`; none where the group
    /// does not exist or has not started on the shard.
    ShareStart { shards: Vec<u32> },
    /// Move each shard's position of the Felix group to the offset given (a Kafka share
    /// group's start offset altered), answered in `offset`.
    ShareSeek { offsets: Vec<(u32, u64)> },
    /// Forget the Felix group's progress on each shard (a Kafka share group's offsets
    /// deleted); answers the position it had, none where it had not started.
    ShareForget { shards: Vec<u32> },
    /// A replica: follow these shards' journals (they hold Kafka offsets now).
    Follow { shards: Vec<u32> },
}

impl OffsetsOp {
    /// The shards this operation names, in its order.
    pub fn shards(&self) -> Vec<u32> {
        match self {
            OffsetsOp::Commit { offsets } | OffsetsOp::Adopt { offsets } => {
                offsets.iter().map(|(s, _)| *s).collect()
            }
            OffsetsOp::ShareSeek { offsets } => offsets.iter().map(|(s, _)| *s).collect(),
            OffsetsOp::Fetch { shards, .. }
            | OffsetsOp::Delete { shards }
            | OffsetsOp::Follow { shards }
            | OffsetsOp::ShareStart { shards }
            | OffsetsOp::ShareForget { shards } => shards.clone(),
        }
    }
}

/// A forwarded operation on one group's offsets in one stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OffsetsCall {
    pub tenant: String,
    pub namespace: String,
    pub stream: String,
    pub group: String,
    pub op: OffsetsOp,
}

/// The outcome for one shard: its offset (fetch), whether it had one (delete), or why not.
pub type ShardOutcome = Result<Option<KafkaOffset>, ErrorBody>;

impl GroupShard {
    /// Appends `entries` and applies them to the table; the ticket to await before answering.
    async fn record_kafka(
        &self,
        entries: Vec<(String, Option<KafkaOffset>)>,
    ) -> Result<Appended, ErrorBody> {
        let mut table = self.kafka.lock().await;
        let ticket = self
            .log
            .append(kafka_journal::batch(&entries).map_err(|e| log_error(&e))?)
            .await
            .map_err(|e| log_error(&e))?;
        self.appended
            .fetch_add(entries.len() as u64, std::sync::atomic::Ordering::Relaxed);
        for (group, offset) in entries {
            match offset {
                Some(o) => table.insert(group, o),
                None => table.remove(&group),
            };
        }
        Ok(ticket)
    }

    /// Appends `offset` for `group` only if the table holds none for it (checked and
    /// appended under one lock, so a commit in between is never overwritten); the offset
    /// the table holds after, and the ticket to await when one was appended.
    async fn adopt_kafka(
        &self,
        group: &str,
        offset: KafkaOffset,
    ) -> Result<(KafkaOffset, Option<Appended>), ErrorBody> {
        let mut table = self.kafka.lock().await;
        if let Some(held) = table.get(group) {
            return Ok((held.clone(), None));
        }
        let entries = [(group.to_owned(), Some(offset.clone()))];
        let ticket = self
            .log
            .append(kafka_journal::batch(&entries).map_err(|e| log_error(&e))?)
            .await
            .map_err(|e| log_error(&e))?;
        self.appended
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        table.insert(group.to_owned(), offset.clone());
        Ok((offset, Some(ticket)))
    }
}

impl Broker {
    /// The groups of a shard this broker leads, for Kafka offsets: the other replicas are
    /// asked to follow its journal first when it is not open yet (a stream without Felix
    /// groups has no followers of its journal otherwise, and a takeover waits for them).
    async fn kafka_journal(&self, key: &ShardKey) -> Result<Arc<GroupShard>, ErrorBody> {
        // Leadership is checked by `group_shard`; a journal not open here is asked for only
        // once this broker leads the shard.
        if !self.groups.open.lock().await.contains_key(key) {
            self.shard(key)?;
            self.ask_replicas_to_follow(key).await;
        }
        self.group_shard(&key.tenant, &key.namespace, &key.stream, key.shard)
            .await
    }

    /// Tells the shard's other replicas to follow its journal (best effort: a replica that
    /// does not hear it is asked again by the next leader that opens the journal).
    async fn ask_replicas_to_follow(&self, key: &ShardKey) {
        let me = self.broker_id();
        let Some(p) = self
            .node
            .meta
            .placement(key)
            .filter(|p| p.replicas.len() > 1)
        else {
            return;
        };
        let call = OffsetsCall {
            tenant: key.tenant.clone(),
            namespace: key.namespace.clone(),
            stream: key.stream.clone(),
            group: String::new(),
            op: OffsetsOp::Follow {
                shards: vec![key.shard],
            },
        };
        let asks = p.replicas.iter().filter(|r| **r != me).filter_map(|r| {
            let addr = self.node.internal_addr_of(*r)?;
            let peers = self.node.peers.clone();
            let call = call.clone();
            Some(async move {
                let r = peers
                    .call(
                        &addr,
                        PATH,
                        &call,
                        Duration::from_secs(2),
                        crate::replication::transport::FetchError::Failed,
                    )
                    .await;
                if let Err(e) = r {
                    debug!(replica = addr, error = %e, "could not ask a replica to follow a journal");
                }
            })
        });
        futures::future::join_all(asks).await;
    }

    /// Commits `group`'s offsets on shards of one stream this broker leads; one outcome per
    /// shard, in order.
    pub(crate) async fn kafka_offsets_commit(
        &self,
        stream: (&str, &str, &str),
        group: &str,
        offsets: Vec<(u32, KafkaOffset)>,
    ) -> Vec<(u32, ShardOutcome)> {
        let commits = offsets.into_iter().map(|(shard, offset)| async move {
            let key = shard_key(stream.0, stream.1, stream.2, shard);
            let outcome = async {
                let gs = self.kafka_journal(&key).await?;
                let ticket = gs
                    .record_kafka(vec![(group.to_owned(), Some(offset))])
                    .await?;
                gs.written(ticket).await?;
                Ok(None)
            };
            (shard, outcome.await)
        });
        futures::future::join_all(commits).await
    }

    /// Commits `group`'s offsets on shards of one stream this broker leads where the
    /// journal holds none for it; each shard's offset after (the one it already held wins).
    pub(crate) async fn kafka_offsets_adopt(
        &self,
        stream: (&str, &str, &str),
        group: &str,
        offsets: Vec<(u32, KafkaOffset)>,
    ) -> Vec<(u32, ShardOutcome)> {
        let adopts = offsets.into_iter().map(|(shard, offset)| async move {
            let key = shard_key(stream.0, stream.1, stream.2, shard);
            let outcome = async {
                let gs = self.kafka_journal(&key).await?;
                let (now, ticket) = gs.adopt_kafka(group, offset).await?;
                if let Some(ticket) = ticket {
                    gs.written(ticket).await?;
                }
                Ok(Some(now))
            };
            (shard, outcome.await)
        });
        futures::future::join_all(adopts).await
    }

    /// `group`'s offsets on shards of one stream this broker leads.
    pub(crate) async fn kafka_offsets_fetch(
        &self,
        stream: (&str, &str, &str),
        group: &str,
        shards: Vec<u32>,
        only_existing: bool,
    ) -> Vec<(u32, ShardOutcome)> {
        let fetches = shards.into_iter().map(|shard| async move {
            let key = shard_key(stream.0, stream.1, stream.2, shard);
            let outcome = async {
                if only_existing && !self.journal_known(&key).await {
                    self.shard(&key)?;
                    return Ok(None);
                }
                let gs = self.kafka_journal(&key).await?;
                let offset = gs.kafka.lock().await.get(group).cloned();
                Ok(offset)
            };
            (shard, outcome.await)
        });
        futures::future::join_all(fetches).await
    }

    /// Deletes `group`'s offsets on shards of one stream this broker leads: each shard's
    /// deleted offset (none: it had none).
    pub(crate) async fn kafka_offsets_delete(
        &self,
        stream: (&str, &str, &str),
        group: &str,
        shards: Vec<u32>,
    ) -> Vec<(u32, ShardOutcome)> {
        let deletes = shards.into_iter().map(|shard| async move {
            let key = shard_key(stream.0, stream.1, stream.2, shard);
            let outcome = async {
                if !self.journal_known(&key).await {
                    self.shard(&key)?;
                    return Ok(None);
                }
                let gs = self.kafka_journal(&key).await?;
                let Some(had) = gs.kafka.lock().await.get(group).cloned() else {
                    return Ok(None);
                };
                let ticket = gs.record_kafka(vec![(group.to_owned(), None)]).await?;
                gs.written(ticket).await?;
                Ok(Some(had))
            };
            (shard, outcome.await)
        });
        futures::future::join_all(deletes).await
    }

    /// Whether this broker has the shard's journal open or a copy of it on disk.
    async fn journal_known(&self, key: &ShardKey) -> bool {
        if self.groups.open.lock().await.contains_key(key) {
            return true;
        }
        let dir = self.journal_dir(key);
        tokio::task::spawn_blocking(move || dir.exists())
            .await
            .unwrap_or(false)
    }

    /// The Kafka offsets of every shard whose journal this broker leads and has open (the
    /// lag metric, ListGroups): each shard and its table.
    pub(crate) async fn kafka_offsets_led(&self) -> Vec<(ShardKey, KafkaTable)> {
        let open: Vec<Arc<GroupShard>> = self.groups.open.lock().await.values().cloned().collect();
        let mut out = Vec::new();
        for gs in open {
            if gs.shard.is_closed() || self.shard(&gs.key).is_err() {
                continue;
            }
            let table = gs.kafka.lock().await.clone();
            out.push((gs.key.clone(), table));
        }
        out
    }

    /// The sweep's part for journals that may hold Kafka offsets (streams without Felix
    /// groups too): a replica follows every journal it holds a copy of, and a leader opens
    /// every journal it holds a copy of (so, after a restart or a failover, the offsets are
    /// in its tables for the lag metric), asks replicas that do not follow it yet to, and
    /// compacts it when it has grown.
    pub(crate) async fn sweep_kafka_journals(self: &Arc<Self>) {
        let streams: Vec<(String, String, String, u32, u32)> = self.node.meta.local(|s| {
            s.streams
                .values()
                .filter(|st| st.settings.durability == Durability::Durable)
                .map(|st| {
                    (
                        st.tenant.clone(),
                        st.namespace.clone(),
                        st.name.clone(),
                        st.settings.shards,
                        st.settings.replicas,
                    )
                })
                .collect()
        });
        for (t, n, s, shards, replicas) in streams {
            for shard in 0..shards {
                let key = shard_key(&t, &n, &s, shard);
                if !self.node.holds_replica(&key) || !self.journal_known(&key).await {
                    continue;
                }
                if self.shard(&key).is_err() {
                    if self.node.cluster
                        && replicas > 1
                        && let Ok(replica) = self.open_replica(&key)
                    {
                        self.follow_journal(&replica).await;
                    }
                    continue;
                }
                let Ok(gs) = self.group_shard(&t, &n, &s, shard).await else {
                    continue;
                };
                // A replica that has not asked for the journal at this generation (a move's
                // new replica, one that was down when the journal was opened) is asked to
                // follow it, without holding the sweep up: a move waits for it.
                if let Some(generation) = gs.replication.generation {
                    let reported = gs.mark.ends_at(generation);
                    let me = self.broker_id();
                    let missing = gs
                        .replication
                        .replicas
                        .iter()
                        .any(|r| *r != me && !reported.iter().any(|(q, _)| q == r));
                    if missing {
                        let broker = self.clone();
                        let key = key.clone();
                        tokio::spawn(async move { broker.ask_replicas_to_follow(&key).await });
                    }
                }
                if gs.appended.load(std::sync::atomic::Ordering::Relaxed)
                    >= super::registry::COMPACT_AFTER_RECORDS
                {
                    let live = self.node.meta.local(|m| {
                        m.groups_of(&t, &n, &s)
                            .into_iter()
                            .map(|g| (g.name, g.id))
                            .collect()
                    });
                    gs.compact_if_grown(&live).await;
                }
            }
        }
    }

    /// Applies `call` to the shards this broker leads (refusing the others with
    /// `not_leader`): a coordinator's own call, or one forwarded here, never forwarded again.
    pub(crate) async fn kafka_offsets_here(
        self: &Arc<Self>,
        call: OffsetsCall,
    ) -> Vec<(u32, ShardOutcome)> {
        let stream = (
            call.tenant.as_str(),
            call.namespace.as_str(),
            call.stream.as_str(),
        );
        match call.op {
            OffsetsOp::Commit { offsets } => {
                self.kafka_offsets_commit(stream, &call.group, offsets)
                    .await
            }
            OffsetsOp::Fetch {
                shards,
                only_existing,
            } => {
                self.kafka_offsets_fetch(stream, &call.group, shards, only_existing)
                    .await
            }
            OffsetsOp::Delete { shards } => {
                self.kafka_offsets_delete(stream, &call.group, shards).await
            }
            OffsetsOp::Adopt { offsets } => {
                self.kafka_offsets_adopt(stream, &call.group, offsets).await
            }
            OffsetsOp::ShareStart { shards } => {
                self.share_start_offsets(stream, &call.group, shards).await
            }
            OffsetsOp::ShareSeek { offsets } => self.share_seek(stream, &call.group, offsets).await,
            OffsetsOp::ShareForget { shards } => {
                self.share_forget(stream, &call.group, shards).await
            }
            OffsetsOp::Follow { shards } => {
                let mut out = Vec::with_capacity(shards.len());
                for shard in shards {
                    let key = shard_key(stream.0, stream.1, stream.2, shard);
                    let outcome = async {
                        let replica = self.open_replica(&key)?;
                        // The copy on disk is what keeps it followed (the sweep), even if
                        // this broker's role for the shard is not settled yet.
                        self.journal_log(&replica).await?;
                        self.follow_journal(&replica).await;
                        Ok(None)
                    };
                    out.push((shard, outcome.await));
                }
                out
            }
        }
    }
}

/// The route's handler: the signed internal network decided the caller is a broker of the
/// cluster (the coordinator checked the Kafka client's grants before forwarding).
pub(crate) async fn serve(
    State(slot): State<BrokerSlot>,
    Json(call): Json<OffsetsCall>,
) -> Json<Vec<(u32, ShardOutcome)>> {
    let Some(broker) = slot.get().and_then(Weak::upgrade) else {
        let shards = call.op.shards();
        let starting = err(
            codes::SHARD_UNAVAILABLE,
            "starting",
            "the broker is starting",
        );
        return Json(
            shards
                .into_iter()
                .map(|s| (s, Err(starting.clone().retry_after(500))))
                .collect(),
        );
    };
    Json(broker.kafka_offsets_here(call).await)
}

#[cfg(test)]
mod tests {
    use super::kafka_journal::{batch, replay_all};
    use super::*;
    use felix_hot::FsyncPolicy;

    fn at(offset: i64) -> KafkaOffset {
        KafkaOffset {
            offset,
            leader_epoch: -1,
            metadata: Some("m".into()),
            commit_ms: 1,
        }
    }

    #[tokio::test]
    async fn kafka_offsets_replay_from_the_journal_and_felix_groups_do_not_see_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = super::super::journal::open_log(
            dir.path(),
            "t/n/s/0/groups".into(),
            FsyncPolicy::OnCommit,
            0,
        )
        .expect("open");
        for (group, offset) in [("a", Some(at(3))), ("b", Some(at(9))), ("a", Some(at(5)))] {
            log.append(batch(&[(group.into(), offset)]).expect("batch"))
                .await
                .expect("append");
        }
        let t = log
            .append(batch(&[("b".into(), None)]).expect("batch"))
            .await
            .expect("append");
        t.committed().await.expect("written");
        let table = replay_all(&log).expect("replay");
        assert_eq!(table.get("a"), Some(&at(5)));
        assert_eq!(table.get("b"), None, "deleted");
        let (cursors, _) = super::super::journal::replay_all(&log).expect("replay");
        assert!(cursors.is_empty(), "no Felix group: {:?}", cursors.keys());
    }
}
