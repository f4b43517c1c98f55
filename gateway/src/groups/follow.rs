//! Following a shard's group journal: a replica of a shard copies the journal from the
//! shard's leader, at the leader's generation, as it copies the shard's records.
//!
//! Decides which journals this broker follows: every shard of a stream with groups that
//! this broker is a follower of (its replication role, which the control plane's placement
//! gives). The once-a-second sweep starts a copy loop for each and stops loops whose role
//! ended, so the journal follows the shard's replica set and leader wherever the control
//! plane places them.
//!
//! Invariant: a loop runs for one (leader, generation) only; the copy it writes is the
//! leader's, batch for batch, and each request reports how far it holds it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use felix_meta::model::ShardKey;
use tracing::{debug, warn};

use super::copy::{self, CopyError};
use crate::broker::Broker;
use crate::replication::role::Role;
use crate::shard::Shard;

/// A running copy loop and the role it was started for.
pub(crate) struct Following {
    role: Role,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Following {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Broker {
    /// Starts or stops the copy loop of `shard`'s journal to match this broker's role.
    pub(crate) async fn follow_journal(self: &Arc<Self>, shard: &Arc<Shard>) {
        let role = shard
            .repl
            .as_ref()
            .map(|r| r.role.borrow().clone())
            .unwrap_or(Role::Unplaced);
        let mut followers = self.groups.followers.lock().await;
        if let Role::Follower { leader, generation } = role {
            if followers
                .get(&shard.key)
                .is_some_and(|f| f.role == role && !f.task.is_finished())
            {
                return;
            }
            let task = tokio::spawn(follow(
                Arc::downgrade(self),
                shard.clone(),
                leader,
                generation,
            ));
            followers.insert(shard.key.clone(), Following { role, task });
        } else {
            followers.remove(&shard.key);
        }
    }

    /// Stops copying `key`'s journal (this broker is about to lead it).
    pub(crate) async fn stop_following_journal(&self, key: &ShardKey) {
        self.groups.followers.lock().await.remove(key);
    }
}

/// Copies the leader's journal until this broker's role for the shard changes.
async fn follow(broker: Weak<Broker>, shard: Arc<Shard>, leader: u64, generation: u64) {
    let Some(repl) = shard.repl.clone() else {
        return;
    };
    let wanted = Role::Follower { leader, generation };
    let mut backoff = Duration::from_millis(50);
    loop {
        if *repl.role.borrow() != wanted || shard.is_closed() {
            return;
        }
        let Some(b) = broker.upgrade() else { return };
        let Some(addr) = b.node.internal_addr_of(leader) else {
            drop(b);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut j = match b.journal_log(&shard).await {
            Ok(j) => j,
            Err(e) => {
                warn!(shard = %shard.key, error = %e.message, "cannot open the group journal");
                drop(b);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let client = b.node.peers.clone();
        let req = copy::request_from(&j, Some(generation), b.broker_id(), 1 << 20, 500);
        drop(b);
        match copy::fetch(&client, &addr, &req).await {
            Ok(answer) => {
                backoff = Duration::from_millis(50);
                let Some(b) = broker.upgrade() else { return };
                if let Err(e) = copy::apply(&b, &mut j, &answer).await {
                    warn!(shard = %shard.key, error = e, "group journal copy failed");
                    drop(b);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                // The leader compacted: what it no longer holds, this copy need not either.
                let first = answer.first;
                if first > j.log.first_offset()
                    && let Err(e) = j.log.enforce_retention_with_floor(first, first)
                {
                    debug!(shard = %shard.key, error = %e, "group journal trim failed");
                }
            }
            Err(CopyError::Behind { first }) => {
                let Some(b) = broker.upgrade() else { return };
                warn!(shard = %shard.key, first,
                    "group journal: the leader compacted past this copy; re-seeding");
                if let Err(e) = b.reseed_journal(&shard, first).await {
                    warn!(shard = %shard.key, error = %e.message, "re-seeding failed");
                    drop(b);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            Err(e) => {
                debug!(shard = %shard.key, leader, error = %e, "group journal fetch failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}
