//! Leading a shard: taking leadership at a generation, moving the quorum mark, fencing
//! while the lease is out, and serving the followers' fetches.
//!
//! A follower pulls: it asks the leader for the batches after the end of its own log
//! (`POST /repl/fetch`), and the offset it asks from is also its report: it holds everything
//! below it. The leader's loop turns those reports into the quorum mark (the highest offset a
//! majority holds), records the mark and the replicas that hold it in the control plane
//! (`ReportReplicas`), and only then releases it to the publishes waiting for Quorum
//! acknowledgements and to readers. When the control plane names a new leader (generation
//! g), it records where g starts: the committed mark; the new leader cuts its log there
//! before it serves.
//!
//! Invariant: a mark is released only after the control plane accepted it for this
//! generation and while the lease holds, so a deposed leader never acknowledges a Quorum
//! write; a leader never serves records past the committed mark of an older generation.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use felix_meta::model::{Placement, ShardKey};
use felix_meta::{Command, CommandError, MetaError};
use tracing::{debug, info, warn};

use super::quorum::quorum_mark;
use super::role::{ReplState, Role, swap_role};
use super::transport::{FetchError, FetchRequest, Fetched};
use crate::node::Node;
use crate::retention::refresh_manifest;
use crate::shard::Shard;

/// A broker that cannot lead a Quorum shard it was given (its log lacks committed records)
/// hands the shard to a live replica that holds everything committed; the control plane
/// checks that choice again. A Leader shard has no such replica to trust: it stays
/// unavailable until an operator intervenes.
pub(crate) async fn hand_over(broker: &Node, key: &ShardKey, p: &Placement) {
    if !broker.is_quorum(key) {
        return;
    }
    let Some(replication) = broker.meta.replication(key) else {
        return;
    };
    let me = broker.broker_id();
    let Some(successor) = p
        .replicas
        .iter()
        .copied()
        .find(|r| *r != me && replication.in_sync.contains(r) && broker.is_alive(*r))
    else {
        warn!(shard = %key, "no live in-sync replica to hand the shard to; it stays unavailable");
        return;
    };
    let cmd = Command::SetPlacement {
        shard: key.clone(),
        replicas: p.replicas.clone(),
        leader: Some(successor),
    };
    match broker.meta.propose(cmd).await {
        Ok(_) => info!(shard = %key, successor, "handed the shard to an in-sync replica"),
        Err(e) => warn!(shard = %key, successor, error = %e, "could not hand the shard over"),
    }
}

/// Takes leadership at `p.generation`: cuts the log at the generation's start (records past
/// the committed mark were never acknowledged), adopts the generation, rebuilds the
/// producer table and the read bound.
pub(crate) async fn become_leader(
    broker: &Node,
    shard: &Shard,
    repl: &ReplState,
    p: &Placement,
) -> Result<(), String> {
    let log = shard.log.as_ref().ok_or("not a durable shard")?;
    let start = p.epoch_start(p.generation).unwrap_or(0);
    let next = log.next_offset();
    // Leading again at the generation the log already has (a restart): everything in it
    // was written by this leader in this generation or earlier and kept; nothing to cut.
    let same_generation = log.generation() >= 0 && log.generation() as u64 >= p.generation;
    // What readers may see from the start: everything committed, nothing above it yet.
    let visible = if same_generation {
        let quorum = broker.is_quorum(&shard.key);
        let committed = broker
            .meta
            .replication(&shard.key)
            .filter(|r| r.generation == p.generation)
            .map_or(start, |r| r.committed);
        if quorum && next < committed {
            return Err(format!(
                "the local log ends at {next}, below the committed mark {committed} (records \
                 lost since they were acknowledged, e.g. by a machine crash)"
            ));
        }
        if quorum {
            committed.max(start)
        } else {
            log.committed_offset()
        }
    } else {
        if next < start {
            // It lost records the control plane counts as committed (a machine crash under a
            // periodic fsync policy): it must not lead, or it would hand their offsets out
            // again.
            return Err(format!(
                "the local log ends at {next}, below the committed mark {start}; \
                 it cannot lead without those records"
            ));
        }
        if next > start {
            log.truncate_to(start)
                .await
                .map_err(|e| format!("cut the log at {start}: {e}"))?;
            warn!(shard = %shard.key, from = start, to = next,
                "dropped records past the committed mark before leading");
        }
        shard.reset_after_truncation().await?;
        start
    };
    log.set_generation(p.generation as i32)
        .map_err(|e| e.to_string())?;
    repl.mark.reset(visible);
    shard.reset_fanout(visible);
    if let Some(tier) = &shard.tier {
        refresh_manifest(tier, &broker.meta);
    }
    repl.role.send_replace(Role::Leader {
        generation: p.generation,
    });
    Ok(())
}

/// The leader's loop: advances the read bound (Leader stream) or the quorum mark (Quorum
/// stream, reported to the control plane before it is released), and fences the shard while
/// the lease has lapsed.
pub(crate) async fn lead(node: Weak<Node>, shard: Arc<Shard>, generation: u64, replicas: Vec<u64>) {
    let Some(repl) = shard.repl.clone() else {
        return;
    };
    let Some(log) = shard.log.clone() else {
        return;
    };
    let mut committed = log.watch_committed();
    let floor = repl.mark.get();
    // Set once the control plane refused a report for a newer generation: this broker was
    // replaced and must not take the role back when its lease renews.
    let mut deposed = false;
    loop {
        let Some(b) = node.upgrade() else { return };
        if shard.is_closed() {
            return;
        }
        // The lease: without it another broker may lead by now.
        let holds = b.lease.holds();
        let role = repl.role.borrow().clone();
        // Each flip is made only from the exact role this task set, checked atomically:
        // the shard's driver may have moved the role on (and aborted this task) meanwhile.
        let fence = Role::Fenced { generation };
        let lead = Role::Leader { generation };
        match (&role, holds) {
            (Role::Leader { .. }, false) if swap_role(&repl, &lead, &fence) => {
                warn!(shard = %shard.key, generation, "lease lapsed: fenced");
                shard.end_subscribers();
            }
            (Role::Fenced { .. }, true) if !deposed => {
                // Writes refused while the lease was out (`enqueue_ack`) may have left
                // idempotent producers' sequences past the log: take them from the log.
                if let Err(e) = shard.reset_after_truncation().await {
                    warn!(shard = %shard.key, error = %e, "cannot rebuild producer sequences");
                } else if swap_role(&repl, &fence, &lead) {
                    info!(shard = %shard.key, generation, "lease renewed: leading again");
                }
            }
            _ => {}
        }
        if matches!(&*repl.role.borrow(), Role::Leader { .. }) {
            crate::moves::handover::advance(&node, &b, &shard, generation);
            // A move changes the replica set without a new generation: the majority is
            // counted over the voters (not a destination still catching up), and the
            // destination is reported in sync once it holds the mark.
            let (replicas, voters) = repl
                .placement
                .borrow()
                .as_ref()
                .filter(|p| p.generation == generation)
                .map_or_else(
                    || (replicas.clone(), replicas.clone()),
                    |p| (p.replicas.clone(), p.voters()),
                );
            let end = log.committed_offset();
            if b.is_quorum(&shard.key) {
                let ends = repl.mark.ends(b.broker_id(), end);
                let (mark, _) = quorum_mark(&voters, &ends, floor);
                let in_sync = replicas
                    .iter()
                    .copied()
                    .filter(|r| ends.get(r).copied().unwrap_or(0) >= mark)
                    .collect();
                if mark > repl.mark.get() {
                    let cmd = Command::ReportReplicas {
                        shard: shard.key.clone(),
                        generation,
                        committed: mark,
                        in_sync,
                    };
                    match b.meta.propose(cmd).await {
                        Ok(_) => {
                            // Re-check the lease after the report landed: the ack must
                            // not go out from a broker that may have been replaced.
                            if b.lease.holds()
                                && repl.leading() == Some(generation)
                                && b.is_leader_at(&shard.key, generation)
                            {
                                repl.mark.raise(mark);
                            }
                            continue;
                        }
                        Err(MetaError::Rejected(CommandError::StaleGeneration { .. })) => {
                            deposed = true;
                            if swap_role(&repl, &lead, &fence) {
                                warn!(shard = %shard.key, generation,
                                    "a newer generation exists: no longer leading");
                                shard.end_subscribers();
                            }
                        }
                        Err(e) => {
                            debug!(shard = %shard.key, error = %e, "replication report failed; retrying");
                            drop(b);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    }
                }
            } else {
                repl.mark.raise(end);
            }
        }
        drop(b);
        tokio::select! {
            _ = committed.changed() => {}
            _ = repl.mark.progressed() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Serves a follower's fetch on a shard this broker leads: records the follower's report,
/// waits up to `wait_ms` for something new, and answers with whole batches (from the object
/// store when the local log no longer holds them) and the size this leader's log rolls its
/// segments at.
pub(crate) async fn serve_fetch(
    shard: Arc<Shard>,
    req: FetchRequest,
) -> Result<Fetched, FetchError> {
    let segment_bytes = shard.log.as_ref().map(|l| l.config().segment_bytes);
    let batches = serve_batches(shard, req).await?;
    Ok(Fetched {
        batches,
        segment_bytes,
    })
}

async fn serve_batches(shard: Arc<Shard>, req: FetchRequest) -> Result<Bytes, FetchError> {
    let (Some(repl), Some(log)) = (shard.repl.clone(), shard.log.clone()) else {
        return Err(FetchError::Failed("not a durable shard".into()));
    };
    let leading = match &*repl.role.borrow() {
        Role::Leader { generation } | Role::Fenced { generation } => Some(*generation),
        _ => None,
    };
    if leading != Some(req.generation) {
        return Err(FetchError::NotLeader {
            generation: leading,
        });
    }
    let first = log.first_offset();
    if req.from < first {
        // Moved to the object store already: serve the follower from there (the batches
        // rebuilt from Parquet keep offsets and generations).
        let Some(tier) = shard.tier.clone() else {
            return Err(FetchError::Behind { first });
        };
        return match tier
            .read(req.from, req.max_bytes.clamp(4096, 16 << 20), Some(first))
            .await
        {
            Ok(read) if !read.batches.is_empty() => Ok(read.batches),
            Ok(_) => Err(FetchError::Failed(format!(
                "no whole batch at offset {} in the object store",
                req.from
            ))),
            Err(felix_cold::ColdError::TooOld { earliest, .. }) => {
                Err(FetchError::Behind { first: earliest })
            }
            Err(e) => Err(FetchError::Failed(e.to_string())),
        };
    }
    let end = log.committed_offset();
    if req.from > log.next_offset() {
        return Err(FetchError::Ahead {
            from: req.from,
            end,
        });
    }
    repl.mark.report(req.follower, req.from);
    let mut committed = log.watch_committed();
    let wait = Duration::from_millis(req.wait_ms.min(5_000));
    let _ = tokio::time::timeout(wait, committed.wait_for(|c| *c > req.from)).await;
    let read = log
        .read(req.from, req.max_bytes.clamp(4096, 16 << 20), None)
        .map_err(|e| FetchError::Failed(e.to_string()))?;
    Ok(Bytes::from(read.batches))
}
