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

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use felix_hot::ShardLog;
use felix_meta::model::ShardKey;
use felix_wire::protocol::{ErrorBody, codes};
use tokio::sync::watch;

use super::journal;
use crate::broker::Broker;
use crate::errors::{err, log_error};
use crate::shard::Shard;

/// The journal's log of one shard on this broker.
#[derive(Clone)]
pub(crate) struct JournalLog {
    /// The data shard it belongs to: a re-created stream's shard gets a journal of its own.
    pub shard: Arc<Shard>,
    pub log: ShardLog,
    /// How far the other replicas hold it (meaningful while this broker leads).
    pub mark: Arc<JournalMark>,
}

/// How far each replica holds the journal, by the generation of the leader it reported to.
pub(crate) struct JournalMark {
    ends: parking_lot::Mutex<(u64, HashMap<u64, u64>)>,
    changed: watch::Sender<u64>,
    /// The generation at which this broker's copy became the journal's history (a new
    /// leader's takeover adopted the best copy): followers are served from then on only,
    /// so none cuts its copy to a leader's that is still being brought up to date.
    served_at: parking_lot::Mutex<Option<u64>>,
}

impl Default for JournalMark {
    fn default() -> Self {
        JournalMark {
            ends: parking_lot::Mutex::new((0, HashMap::new())),
            changed: watch::channel(0).0,
            served_at: parking_lot::Mutex::new(None),
        }
    }
}

impl JournalMark {
    /// Followers at `generation` may be served from this copy now.
    pub(crate) fn serve_at(&self, generation: u64) {
        *self.served_at.lock() = Some(generation);
    }

    /// Whether followers at `generation` may be served from this copy.
    pub(crate) fn serves(&self, generation: u64) -> bool {
        *self.served_at.lock() == Some(generation)
    }

    /// A replica asking for the journal from `end` on, at `generation`, holds everything
    /// below `end`. Reports of an older generation are forgotten at the first newer one.
    pub(crate) fn report(&self, generation: u64, replica: u64, end: u64) {
        {
            let mut g = self.ends.lock();
            if generation < g.0 {
                return;
            }
            if generation > g.0 {
                *g = (generation, HashMap::new());
            }
            let e = g.1.entry(replica).or_default();
            *e = (*e).max(end);
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// Each replica's reported end at `generation`.
    fn ends_at(&self, generation: u64) -> Vec<(u64, u64)> {
        let g = self.ends.lock();
        if g.0 != generation {
            return Vec::new();
        }
        let mut ends: Vec<(u64, u64)> = g.1.iter().map(|(r, e)| (*r, *e)).collect();
        ends.sort_unstable();
        ends
    }

    /// How many of `replicas` (this broker, `me`, counted by `my_end`) hold everything
    /// below `end` at `generation`.
    fn holders(&self, generation: u64, replicas: &[u64], me: u64, my_end: u64, end: u64) -> usize {
        let g = self.ends.lock();
        replicas
            .iter()
            .filter(|r| {
                if **r == me {
                    my_end >= end
                } else {
                    g.0 == generation && g.1.get(r).is_some_and(|e| *e >= end)
                }
            })
            .count()
    }

    /// Waits until a majority of `replicas` hold everything below `end` at `generation`;
    /// `false` if that took longer than `timeout`.
    pub(crate) async fn wait_majority(
        &self,
        generation: u64,
        replicas: &[u64],
        me: u64,
        log: &ShardLog,
        end: u64,
        timeout: Duration,
    ) -> bool {
        let need = replicas.len() / 2 + 1;
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changed.borrow_and_update();
            if self.holders(generation, replicas, me, log.committed_offset(), end) >= need {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                return false;
            }
        }
    }
}

/// What makes a journal change answerable on a shard led at some generation.
#[derive(Clone, Default)]
pub(crate) struct Replication {
    /// The generation this broker leads the shard at (`None`: a single broker).
    pub generation: Option<u64>,
    /// The shard's replicas as placed when the journal was taken over.
    pub replicas: Vec<u64>,
    /// Wait for a majority of `replicas` (a Quorum stream of more than one replica).
    pub quorum: bool,
}

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
