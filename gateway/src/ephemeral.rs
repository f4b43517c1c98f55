//! Ephemeral shards: at most once, and one leader per shard in a cluster.
//!
//! Decides how a publish to an ephemeral shard is numbered and handed out, and which broker
//! serves the shard:
//! * An ephemeral shard keeps nothing. A publish is numbered, offered to the live
//!   subscribers' bounded queues and answered at once: it is acknowledged when it is queued,
//!   never after a write, and never waits for a subscriber. A full queue drops the batch for
//!   that subscriber only; the drop is counted (`felix_sub_queue_dropped_total`) and not
//!   announced, since there is no offset to resume from.
//! * In a cluster the control plane places each ephemeral shard on one broker, its leader
//!   (`felix_meta::model::placed_replicas`), so a publisher and a subscriber that reached
//!   different brokers meet there: other brokers forward its publishes to it and answer its
//!   subscriptions with `not_leader` naming it, as for a durable shard. The role here follows
//!   the placement and this broker's lease: without a lease the leader is fenced, because the
//!   controller may have handed the shard to another broker by then. When the role changes,
//!   the subscribers it served end (`not_leader`, `fenced`), so they resume on the new leader.
//! * Idempotent producers' sequences are kept in memory by the leader: a batch it already
//!   took is answered with its offsets and not offered again. They last as long as the
//!   leader does; a broker that takes the shard over knows no producer yet and takes each
//!   one's next batch as its first.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use felix_meta::model::Placement;
use felix_wire::BatchHeader;
use felix_wire::batch::stamp_base_offset;
use felix_wire::protocol::ErrorBody;
use tokio::sync::watch;
use tracing::info;

use crate::fanout::LiveBatch;
use crate::metrics::Metrics;
use crate::node::Node;
use crate::producers::SeqCheck;
use crate::replication::role::{ReplState, Role};
use crate::shard::Shard;

/// How often a leader re-reads its lease (as the durable leader's driver does).
const LEASE_CHECK: Duration = Duration::from_millis(100);

/// Numbers the batches, offers them to the shard's subscribers and answers with the first
/// and last offsets given. A batch of an idempotent producer that this shard already took
/// is answered with its original offsets instead.
pub(crate) async fn publish(
    shard: &Shard,
    batches: Vec<(BatchHeader, Bytes)>,
    metrics: &Metrics,
) -> Result<(u64, u64), ErrorBody> {
    // Only idempotent batches take the producers' lock (held across the check and the
    // numbering, so two re-sends of one batch cannot both be offered); others stay
    // lock-free.
    let mut producers = if batches.iter().any(|(h, _)| h.producer_id >= 0) {
        Some(shard.producers.lock().await)
    } else {
        None
    };
    let mut first = u64::MAX;
    let mut last = 0;
    for (h, bytes) in batches {
        if let Some(table) = &producers {
            match table.check_in_memory(&h) {
                SeqCheck::Append => {}
                SeqCheck::Duplicate {
                    base_offset,
                    last_offset,
                } => {
                    first = first.min(base_offset);
                    last = last.max(last_offset);
                    continue;
                }
                SeqCheck::Reject(e) => return Err(e),
            }
        }
        let count = h.last_offset_delta as u64 + 1;
        let base = shard.ephemeral_next.fetch_add(count, Ordering::AcqRel);
        let mut owned = bytes.to_vec();
        stamp_base_offset(&mut owned, base as i64);
        if let Some(table) = &mut producers {
            table.record(&h, base, base + count - 1);
        }
        first = first.min(base);
        last = last.max(base + count - 1);
        shard.offer_live(
            LiveBatch {
                first_offset: base,
                next_offset: base + count,
                bytes: Bytes::from(owned),
            },
            metrics,
        );
    }
    // `batches` is never empty (the publish path refuses an empty publish).
    Ok((first, last))
}

/// The role the placement gives this broker for an ephemeral shard.
fn role_for(placement: Option<&Placement>, me: u64, lease_holds: bool) -> Role {
    match placement.and_then(|p| p.leader.map(|l| (l, p.generation))) {
        None => Role::Unplaced,
        Some((leader, generation)) if leader == me && lease_holds => Role::Leader { generation },
        Some((leader, generation)) if leader == me => Role::Fenced { generation },
        Some((leader, generation)) => Role::Follower { leader, generation },
    }
}

/// Takes the role the shard's current placement gives this broker; ends the subscribers
/// served under the old role when it changes.
fn take_role(shard: &Shard, repl: &ReplState, me: u64, lease_holds: bool) {
    let wanted = role_for(repl.placement.borrow().as_ref(), me, lease_holds);
    let changed = repl.role.send_if_modified(|role| {
        let changed = *role != wanted;
        *role = wanted.clone();
        changed
    });
    if changed {
        shard.end_subscribers();
        info!(shard = %shard.key, role = ?wanted, "ephemeral shard");
    }
}

/// Cluster mode: gives a just-opened ephemeral shard its role at once (so the first request
/// is answered by the placement, not refused while a task starts), then keeps the role in
/// step with the placement and the lease until the shard's tasks are stopped.
pub(crate) fn lead(node: &Arc<Node>, shard: &Arc<Shard>, stop: watch::Receiver<bool>) {
    let Some(repl) = shard.repl.clone() else {
        return;
    };
    take_role(shard, &repl, node.broker_id(), node.lease.holds());
    tokio::spawn(follow_placement(
        Arc::downgrade(node),
        Arc::downgrade(shard),
        repl,
        stop,
    ));
}

async fn follow_placement(
    node: Weak<Node>,
    shard: Weak<Shard>,
    repl: Arc<ReplState>,
    mut stop: watch::Receiver<bool>,
) {
    let mut placement = repl.placement.subscribe();
    loop {
        {
            let (Some(b), Some(s)) = (node.upgrade(), shard.upgrade()) else {
                return;
            };
            if s.is_closed() {
                return;
            }
            take_role(&s, &repl, b.broker_id(), b.lease.holds());
        }
        tokio::select! {
            _ = placement.changed() => {}
            _ = tokio::time::sleep(LEASE_CHECK) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(leader: Option<u64>, generation: u64) -> Placement {
        Placement {
            replicas: leader.into_iter().collect(),
            leader,
            generation,
            epochs: Vec::new(),
            moving: None,
        }
    }

    #[test]
    fn the_placed_broker_leads_while_it_holds_its_lease_and_others_point_to_it() {
        let p = placed(Some(2), 3);
        assert_eq!(role_for(Some(&p), 2, true), Role::Leader { generation: 3 });
        assert_eq!(role_for(Some(&p), 2, false), Role::Fenced { generation: 3 });
        assert_eq!(
            role_for(Some(&p), 1, true),
            Role::Follower {
                leader: 2,
                generation: 3
            }
        );
        assert_eq!(role_for(Some(&placed(None, 3)), 1, true), Role::Unplaced);
        assert_eq!(role_for(None, 1, true), Role::Unplaced);
    }
}
