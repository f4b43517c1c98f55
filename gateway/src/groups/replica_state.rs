//! The state the group registry keeps per shard about the journal's replication: the
//! journal's log, how far each replica holds it, and the copy loop following a leader.
//!
//! Kept apart from the code that runs the copies ([`super::replica`], [`super::follow`]),
//! which needs the broker: the registry, which the broker holds, needs only these types.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use felix_hot::ShardLog;
use tokio::sync::watch;

use crate::replication::role::Role;
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
    pub(crate) fn ends_at(&self, generation: u64) -> Vec<(u64, u64)> {
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

/// A running copy loop and the role it was started for.
pub(crate) struct Following {
    pub(crate) role: Role,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl Drop for Following {
    fn drop(&mut self) {
        self.task.abort();
    }
}
