//! A shard's group journal on every replica of the shard, and how far each replica holds it.
//!
//! Decides where the journal's log lives on this broker whatever its role for the shard
//! (one [`JournalLog`] per shard, shared by the leader's [`super::GroupShard`], the
//! follower's copy loop and the copy endpoint), and when a change is replicated enough to be
//! answered: on a Quorum stream of several replicas, once a majority of the shard's replicas
//! (as the control plane places them) hold the journal up to it, counted at the leader's
//! generation ([`JournalMark`]); on a Leader stream, once the leader wrote it.
//!
//! Invariant: a replica's report counts only for the generation it was made in, so a report
//! to a deposed leader never releases a newer leader's change, nor the other way round.

use std::path::PathBuf;
use std::sync::Arc;

use felix_meta::model::ShardKey;
use felix_wire::protocol::{ErrorBody, codes};

use super::journal;
pub(crate) use super::replica_state::{JournalLog, Replication};
use crate::broker::Broker;
use crate::errors::{err, log_error};
use crate::shard::Shard;

impl Broker {
    /// Where a shard's group journal stands on its replicas, while this broker leads the
    /// shard and has taken the journal over: this broker's end and each other replica's
    /// reported end (the replicas that reported at this generation). `None` otherwise. A
    /// shard move waits on it: a new replica holds the groups' progress once its end
    /// reached the leader's (docs/groups.md).
    pub async fn group_journal_ends(&self, key: &ShardKey) -> Option<(u64, Vec<(u64, u64)>)> {
        let g = self.groups.open.lock().await.get(key).cloned()?;
        let generation = g.replication.generation?;
        Some((g.log.committed_offset(), g.mark.ends_at(generation)))
    }

    /// The journal directory of a shard.
    pub(crate) fn journal_dir(&self, key: &ShardKey) -> PathBuf {
        self.shards
            .stream_dir(&key.tenant, &key.namespace, &key.stream)
            .join("groups")
            .join(key.shard.to_string())
    }

    /// The journal log of a shard on this broker, opened on first use (a fresh one for a
    /// re-created stream's shard).
    pub(crate) async fn journal_log(&self, shard: &Arc<Shard>) -> Result<JournalLog, ErrorBody> {
        if shard.log.is_none() {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "ephemeral_stream",
                format!(
                    "stream of shard {} is ephemeral: it has no groups",
                    shard.key
                ),
            ));
        }
        let mut logs = self.groups.logs.lock().await;
        if let Some(j) = logs.get(&shard.key)
            && Arc::ptr_eq(&j.shard, shard)
        {
            return Ok(j.clone());
        }
        let j = self.open_journal_log(shard, 0).await?;
        logs.insert(shard.key.clone(), j.clone());
        Ok(j)
    }

    async fn open_journal_log(
        &self,
        shard: &Arc<Shard>,
        start: u64,
    ) -> Result<JournalLog, ErrorBody> {
        let dir = self.journal_dir(&shard.key);
        let fsync = self.node.config.fsync_policy();
        let name = format!("{}/groups", shard.key);
        let log = tokio::task::spawn_blocking(move || journal::open_log(&dir, name, fsync, start))
            .await
            .map_err(|e| err(codes::INTERNAL, "internal", e.to_string()))?
            .map_err(|e| log_error(&e))?;
        Ok(JournalLog {
            shard: shard.clone(),
            log,
            mark: Arc::default(),
        })
    }

    /// Throws this replica's copy of a shard's journal away and starts an empty one at
    /// `start`: the copy needs records its source already compacted away, or diverged
    /// below them. The old directory is renamed first, so a writer still holding it writes
    /// into a directory no one opens again.
    pub(crate) async fn reseed_journal(
        &self,
        shard: &Arc<Shard>,
        start: u64,
    ) -> Result<JournalLog, ErrorBody> {
        let mut logs = self.groups.logs.lock().await;
        logs.remove(&shard.key);
        let dir = self.journal_dir(&shard.key);
        let gone = dir.with_extension(format!("discarded-{}", super::now_ms()));
        let renamed = {
            let (dir, gone) = (dir.clone(), gone.clone());
            tokio::task::spawn_blocking(move || {
                if dir.exists() {
                    std::fs::rename(&dir, &gone)?;
                    std::fs::remove_dir_all(&gone)?;
                }
                Ok::<(), std::io::Error>(())
            })
            .await
        };
        match renamed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(err(codes::INTERNAL, "internal", e.to_string())),
            Err(e) => return Err(err(codes::INTERNAL, "internal", e.to_string())),
        }
        let j = self.open_journal_log(shard, start).await?;
        logs.insert(shard.key.clone(), j.clone());
        Ok(j)
    }
}
