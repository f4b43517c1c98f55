//! Following a shard's leader: cut what diverges from the leader's history, then fetch and
//! append.
//!
//! A follower appends the leader's batches unchanged, with their offsets and generation,
//! under its own fsync policy, and asks again from the end of its log (which is its report
//! to the leader). A cache shard's follower rolls its segments at the leader's size.
//!
//! Invariant: a follower that held records of an older generation e cuts its log at the end
//! of e as the control plane recorded it before it fetches, so records no majority held are
//! dropped everywhere.

use std::sync::{Arc, Weak};
use std::time::Duration;

use felix_meta::model::Placement;
use tracing::{debug, warn};

use super::role::Role;
use super::transport::{FetchError, FetchRequest};
use crate::node::Node;
use crate::shard::Shard;

/// A follower's loop: cut what diverges from the leader's history, then fetch and append.
pub(crate) async fn follow(
    node: Weak<Node>,
    shard: Arc<Shard>,
    leader: u64,
    generation: u64,
    placement: Placement,
) {
    let Some(log) = shard.log.clone() else {
        return;
    };
    let Some(repl) = shard.repl.clone() else {
        return;
    };
    // Records of an older generation past that generation's end were never committed.
    let mine = log.generation();
    if mine >= 0
        && (mine as u64) < generation
        && let Some(end) = placement.epoch_end(mine as u64)
        && log.next_offset() > end
    {
        let next = log.next_offset();
        match log.truncate_to(end).await {
            Ok(_) => {
                warn!(shard = %shard.key, from = end, to = next, generation = mine,
                    "dropped records of an older generation that were never committed");
                if let Err(e) = shard.reset_after_truncation().await {
                    warn!(shard = %shard.key, error = e, "rebuilding producer state failed");
                }
            }
            Err(e) => {
                warn!(shard = %shard.key, error = %e, "cannot cut the diverging records; not following");
                return;
            }
        }
    }
    let mut backoff = Duration::from_millis(50);
    loop {
        if repl.role.borrow().clone() != (Role::Follower { leader, generation }) {
            return;
        }
        let Some(b) = node.upgrade() else { return };
        let Some(addr) = b.internal_addr_of(leader) else {
            drop(b);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let me = b.broker_id();
        let client = b.peers.clone();
        drop(b);
        let from = log.next_offset();
        let req = FetchRequest {
            shard: shard.key.clone(),
            generation,
            follower: me,
            from,
            max_bytes: 1 << 20,
            wait_ms: 500,
        };
        let fetched = client.fetch(&addr, &req).await.map(|f| {
            roll_like_the_leader(&shard, &log, f.segment_bytes);
            f.batches
        });
        match fetched {
            Ok(batches) if batches.is_empty() => {
                backoff = Duration::from_millis(50);
            }
            Ok(batches) => {
                backoff = Duration::from_millis(50);
                let mut last = None;
                let mut failed = false;
                for item in felix_wire::BatchIter::new(&batches, usize::MAX) {
                    let Ok((_, bytes)) = item else {
                        warn!(shard = %shard.key, "leader sent a damaged batch; fetching again");
                        failed = true;
                        break;
                    };
                    match log.append_at(bytes.to_vec()).await {
                        Ok(t) => last = Some(t),
                        Err(e) => {
                            warn!(shard = %shard.key, error = %e, "follower append refused");
                            failed = true;
                            break;
                        }
                    }
                }
                if let Some(t) = last
                    && let Err(e) = t.committed().await
                {
                    warn!(shard = %shard.key, error = %e, "follower write failed");
                    failed = true;
                }
                if failed {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            Err(FetchError::Behind { first }) => {
                // Retention removed these records from both tiers: this copy cannot continue
                // without a gap. Wiping the shard's directory makes it start again after the
                // uploaded history (docs/replication.md).
                warn!(shard = %shard.key, from, first,
                    "this replica needs records that retention already removed; it cannot \
                     catch up (remove its shard directory to re-seed it)");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Err(e) => {
                debug!(shard = %shard.key, leader, error = %e, "replication fetch failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// A cache shard's follower rolls its log's segments at the size the leader's does
/// (`cache/segments.rs`).
fn roll_like_the_leader(shard: &Shard, log: &felix_hot::ShardLog, leaders: Option<u64>) {
    let Some(n) = crate::cache::segments::follower_segment_bytes(&shard.key.stream, leaders) else {
        return;
    };
    if log.config().segment_bytes != n {
        log.alter(|c| c.segment_bytes = n);
        debug!(shard = %shard.key, segment_bytes = n, "rolling segments like the leader");
    }
}
