//! The leader's side of a shard move, one step per call of [`advance`] from the leader's
//! loop (`replication::leader::lead`).
//!
//! * The leader is the source: once the new replica is within [`FENCE_WITHIN`] records of
//!   the log's end, it raises the fence (publishes wait, see `hold.rs`), lets the appends
//!   already accepted finish, waits until the new replica holds the whole log (and, on a
//!   Quorum stream, until the mark covers it and the control plane records the new replica
//!   in sync there), then proposes `HandOver` at that end. The fence comes down once this
//!   broker follows the new leader, or after three quarters of `shard_move_hold_ms`
//!   (the hand-over is then retried later), so a held publish is served within the hold.
//! * A follower moves (or this broker is the new leader after a hand-over): once the new
//!   replica holds everything readers may see, the leader proposes `FinishMove` and the
//!   old replica leaves.
//!
//! Invariant: the hand-over's end is read after the fence is up and every accepted append
//! has been written, so no publish lands on the old leader past the point where the new
//! generation starts: nothing acknowledged is left behind, and nothing is numbered twice.

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use felix_meta::model::ShardMove;
use felix_meta::{Command, MetaError};
use tracing::{debug, info, warn};

use crate::node::Node;
use crate::replication::role::{ReplState, Role};
use crate::shard::Shard;

/// How close (in records) the new replica must be before the leader fences: the rest is
/// copied while publishes wait, so it must be small.
pub(crate) const FENCE_WITHIN: u64 = 2_000;

/// How often a waiting step looks again at the followers' reports.
const POLL: Duration = Duration::from_millis(2);

/// Pause before retrying a step that was refused or ran out of time.
const RETRY: Duration = Duration::from_millis(500);

/// Called from the leader's loop of a shard led at `generation`: starts the move's next
/// step if one is due (at most one runs per shard).
pub(crate) fn advance(node: &Weak<Node>, b: &Node, shard: &Arc<Shard>, generation: u64) {
    let (Some(repl), Some(log)) = (shard.repl.clone(), shard.log.as_ref()) else {
        return;
    };
    let Some(p) = repl.placement.borrow().clone() else {
        return;
    };
    let Some(m) = p.moving else { return };
    if p.generation != generation {
        return;
    }
    let me = b.broker_id();
    let end = log.next_offset();
    let to_end = repl.mark.ends(me, end).get(&m.to).copied().unwrap_or(0);
    let behind = if m.to == me {
        0
    } else {
        end.saturating_sub(to_end)
    };
    b.metrics.moves.saw(&shard.key, behind);
    // The source leads and hands over; an addition (`m.adds()`) has no source.
    let hands_over = m.from == me && !m.adds();
    if hands_over {
        if behind > FENCE_WITHIN {
            return;
        }
    } else if m.to != me && to_end < repl.mark.get() {
        return;
    }
    if !repl.moves.claim() {
        return;
    }
    let (node, shard) = (node.clone(), shard.clone());
    tokio::spawn(async move {
        let guard = StepGuard(repl.clone());
        let outcome = if hands_over {
            hand_over(&node, &shard, &repl, generation, m).await
        } else {
            finish(&node, &shard, &repl, generation, m).await
        };
        if let Err(why) = outcome {
            debug!(shard = %shard.key, from = m.from, to = m.to, why, "move step not taken; retrying");
            repl.moves.retry_after(RETRY);
        }
        drop(guard);
    });
}

/// The source leads: fence, let the new replica take the whole log, hand over.
async fn hand_over(
    node: &Weak<Node>,
    shard: &Shard,
    repl: &ReplState,
    generation: u64,
    m: ShardMove,
) -> Result<(), String> {
    let log = shard.log.as_ref().ok_or("not a durable shard")?;
    let (hold, quorum, me) = {
        let b = node.upgrade().ok_or("stopping")?;
        (
            Duration::from_millis(b.config.shard_move_hold_ms),
            b.is_quorum(&shard.key),
            b.broker_id(),
        )
    };
    let deadline = Instant::now() + hold * 3 / 4;
    repl.moves.set_fence(true);
    // Publishes that passed the fence before it went up append under this lock; once it is
    // free they have all been given their offsets.
    drop(shard.producers.lock().await);
    // Fault injection only: a test holds the hand-over here, its fence up, past the hold.
    felix_meta::faults::wait_while_handovers_held().await;
    let end = log.next_offset();
    wait_until(deadline, || {
        let written = log.committed_offset() >= end;
        let copied = repl.mark.ends(me, end).get(&m.to).copied().unwrap_or(0) >= end;
        let marked = !quorum || repl.mark.get() >= end;
        written && copied && marked
    })
    .await
    .map_err(|_| format!("the new replica did not reach {end} within the hold"))?;
    let b = node.upgrade().ok_or("stopping")?;
    other_logs_copied(&b, shard, m.to, deadline).await?;
    if quorum {
        // The mark may have reached `end` before the new replica did: record it in sync.
        let in_sync = in_sync_at(repl, repl.mark.ends(me, end), end);
        let report = Command::ReportReplicas {
            shard: shard.key.clone(),
            generation,
            committed: end,
            in_sync,
        };
        propose(&b, report).await?;
    }
    let cmd = Command::HandOver {
        shard: shard.key.clone(),
        generation,
        to: m.to,
        end,
    };
    // Recorded before the proposal: the role may follow `m.to` before the answer comes back,
    // and a watch ended then must already know it was this hand-over.
    repl.moves.handed_over(generation + 1, m.to);
    propose_hand_over(&b, shard, repl, generation, cmd).await?;
    b.metrics.moves.handovers.inc();
    info!(shard = %shard.key, from = me, to = m.to, end, generation = generation + 1,
        "handed the shard over at the fence");
    drop(b);
    // Held publishes go to the new leader once this broker follows it.
    let mut role = repl.role.subscribe();
    let left = deadline.saturating_duration_since(Instant::now()) + hold / 4;
    let _ = tokio::time::timeout(
        left,
        role.wait_for(|r| !matches!(r, Role::Leader { generation: g } if *g == generation)),
    )
    .await;
    Ok(())
}

/// A follower moves, or the hand-over is done: the old replica leaves.
async fn finish(
    node: &Weak<Node>,
    shard: &Shard,
    repl: &ReplState,
    generation: u64,
    m: ShardMove,
) -> Result<(), String> {
    let b = node.upgrade().ok_or("stopping")?;
    let me = b.broker_id();
    if b.is_quorum(&shard.key) && m.to != me {
        // Record the new replica in sync at the released mark (the mark may not have moved
        // since it caught up, so no report of the leader's loop names it yet).
        let mark = repl.mark.get();
        let ends = repl
            .mark
            .ends(me, shard.log.as_ref().map_or(0, |l| l.next_offset()));
        let in_sync = in_sync_at(repl, ends, mark);
        let recorded = b.meta.replication(&shard.key);
        if mark > 0 && !recorded.is_some_and(|r| r.in_sync.contains(&m.to)) {
            let report = Command::ReportReplicas {
                shard: shard.key.clone(),
                generation,
                committed: mark,
                in_sync,
            };
            propose(&b, report).await?;
        }
    }
    other_logs_copied(&b, shard, m.to, Instant::now()).await?;
    let cmd = Command::FinishMove {
        shard: shard.key.clone(),
        generation,
    };
    propose(&b, cmd).await?;
    if m.adds() {
        info!(shard = %shard.key, to = m.to, "replica added: the shard is fully replicated again");
    } else {
        info!(shard = %shard.key, from = m.from, to = m.to, "shard move finished: the old replica left");
    }
    Ok(())
}

/// Waits until `to` holds the shard's other logs (the group journal) as well
/// (`shard_logs.rs`), asking again until `deadline`.
async fn other_logs_copied(
    b: &Node,
    shard: &Shard,
    to: u64,
    deadline: Instant,
) -> Result<(), String> {
    let Some(logs) = b.shard_logs.get() else {
        return Ok(());
    };
    loop {
        if logs.caught_up(&shard.key, to).await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "broker {to} does not hold the shard's other logs (group journal) yet"
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Ends the step when dropped, also when the task is aborted.
struct StepGuard(Arc<ReplState>);

impl Drop for StepGuard {
    fn drop(&mut self) {
        self.0.moves.release();
    }
}

/// Proposes the hand-over. An answer that leaves its outcome unknown (the control plane's
/// leader was lost mid-request) is not taken for a refusal: the fence stays up until a
/// linearizable read of the control plane's state says whether the shard's generation moved
/// on. Lowering it on a hand-over applied after all would let this broker write past the
/// new generation's start, records the new leader's generation then cuts away.
async fn propose_hand_over(
    b: &Node,
    shard: &Shard,
    repl: &ReplState,
    generation: u64,
    cmd: Command,
) -> Result<(), String> {
    match b.meta.propose(cmd).await {
        Ok(_) => return Ok(()),
        Err(MetaError::Rejected(e)) => {
            warn!(error = %e, "the control plane refused a move step");
            return Err(e.to_string());
        }
        // No leader was reached: not applied.
        Err(e @ MetaError::Timeout(_)) => return Err(e.to_string()),
        Err(e) => warn!(shard = %shard.key, error = %e,
            "the hand-over's outcome is unknown; asking the control plane, the fence kept up"),
    }
    loop {
        // Once the control plane's leader has committed in its own term (the read barrier),
        // an older proposal it does not hold can no longer be applied.
        let read = b
            .meta
            .read(|s| s.placements.get(&shard.key).map(|p| p.generation))
            .await;
        match read {
            Ok(Some(g)) if g > generation => return Ok(()),
            Ok(_) => return Err("the hand-over was not applied".into()),
            Err(e) => debug!(shard = %shard.key, error = %e, "cannot read the control plane yet"),
        }
        let replaced = matches!(&*repl.role.borrow(), Role::Follower { .. } | Role::Unplaced);
        if replaced || b.stopping.load(std::sync::atomic::Ordering::Acquire) {
            // A newer placement reached this broker (it follows now), or it stops: nothing
            // is appended here at `generation` any more.
            return Ok(());
        }
        tokio::time::sleep(RETRY).await;
    }
}

async fn propose(b: &Node, cmd: Command) -> Result<(), String> {
    match b.meta.propose(cmd).await {
        Ok(_) => Ok(()),
        Err(MetaError::Rejected(e)) => {
            warn!(error = %e, "the control plane refused a move step");
            Err(e.to_string())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Polls `ready` until it holds or `deadline` passes.
async fn wait_until(deadline: Instant, mut ready: impl FnMut() -> bool) -> Result<(), ()> {
    loop {
        if ready() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The replicas of the shard's current placement whose reported end (`ends`) reaches `at`.
fn in_sync_at(
    repl: &ReplState,
    ends: std::collections::HashMap<u64, u64>,
    at: u64,
) -> BTreeSet<u64> {
    repl.placement
        .borrow()
        .as_ref()
        .map(|p| p.replicas.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|r| ends.get(r).copied().unwrap_or(0) >= at)
        .collect()
}
