//! Holding a publish across a shard's hand-over.
//!
//! Between the fence on the old leader and the new leader's first write nobody serves the
//! shard. A publish arriving then is not refused: it waits here, on the old leader while
//! its fence is up and on the new leader while it is still taking over, until one of them
//! serves the shard; then it goes on (to the log here, or forwarded to the new leader).
//!
//! Invariant: a publish waits at most `shard_move_hold_ms` in all; past that it is refused
//! as `shard_unavailable` with reason `moving`, having written nothing.

use std::time::{Duration, Instant};

use felix_wire::protocol::{ErrorBody, codes};

use crate::errors::err;
use crate::node::Node;
use crate::replication::role::{ReplState, Role};
use crate::shard::Shard;

/// The reason a publish held here and then found the shard led elsewhere is answered
/// with (code `not_leader`): the broker that forwarded it forwards it once more, to the
/// new leader.
pub(crate) const MOVED: &str = "moved";

/// Whether a publish to `shard` must wait now: the shard is fenced for a hand-over here,
/// or the control plane made this broker its leader by a move and it is not leading yet.
fn must_hold(node: &Node, repl: &ReplState) -> bool {
    if repl.moves.fenced() {
        return true;
    }
    let me = node.broker_id();
    let placement = repl.placement.borrow();
    let Some(p) = placement.as_ref() else {
        return false;
    };
    let taking_over = p.leader == Some(me) && p.moving.is_some_and(|m| m.to == me);
    taking_over
        && !matches!(
            &*repl.role.borrow(),
            Role::Leader { generation }
                | Role::Fenced { generation }
                | Role::Unavailable { generation, .. } if *generation == p.generation
        )
}

/// Waits while the shard is between owners (see the module's top), at most `hold` from
/// `since`. `Ok(true)` if the publish waited, `Ok(false)` if it did not have to.
pub(crate) async fn wait_for_owner(
    node: &Node,
    shard: &Shard,
    since: Instant,
) -> Result<bool, ErrorBody> {
    let Some(repl) = &shard.repl else {
        return Ok(false);
    };
    if !must_hold(node, repl) {
        return Ok(false);
    }
    let hold = Duration::from_millis(node.config.shard_move_hold_ms);
    let deadline = tokio::time::Instant::from_std(since + hold);
    let mut fence = repl.moves.watch_fence();
    let mut role = repl.role.subscribe();
    let mut placement = repl.placement.subscribe();
    while must_hold(node, repl) {
        tokio::select! {
            _ = fence.changed() => {}
            _ = role.changed() => {}
            _ = placement.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {
                return Err(err(
                    codes::SHARD_UNAVAILABLE,
                    "moving",
                    format!(
                        "shard {} is being handed over to another broker and the switch took \
                         longer than shard_move_hold_ms ({hold:?}); nothing was written",
                        shard.key
                    ),
                )
                .retry_after(200));
            }
        }
    }
    node.metrics
        .moves
        .hold_seconds
        .observe(since.elapsed().as_secs_f64());
    Ok(true)
}

/// Whether an answer refused a publish because the shard was fenced for a hand-over when
/// it came to append (it raced the fence): it is held and tried again.
pub(crate) fn met_fence(e: &ErrorBody) -> bool {
    e.code == codes::SHARD_UNAVAILABLE && e.reason == FENCED_AT_APPEND
}

const FENCED_AT_APPEND: &str = "fenced_for_move";

/// Whether an append may go ahead now, asked under the shard's append lock (the one the
/// hand-over takes after raising the fence): not while the fence is up, and not once this
/// broker no longer leads the shard. A publish checks leadership before it queues for the
/// lock; one that queued across a whole hand-over must not append to the old leader's log
/// past the new generation's start, where the record would be cut away though answered.
pub(crate) fn may_append(shard: &Shard) -> bool {
    shard
        .repl
        .as_ref()
        .is_none_or(|r| !r.moves.fenced() && matches!(&*r.role.borrow(), Role::Leader { .. }))
}

/// The refusal of an append that found the fence up (see [`met_fence`]); never reaches a
/// client.
pub(crate) fn fenced_at_append(shard: &Shard) -> ErrorBody {
    err(
        codes::SHARD_UNAVAILABLE,
        FENCED_AT_APPEND,
        format!("shard {} is being handed over", shard.key),
    )
}
