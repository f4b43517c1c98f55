//! A subscription: catch-up from history, then live delivery.
//!
//! A subscription that starts in the past replays history straight from the shard's tiers
//! (never dropped: QUIC flow control slows the replay instead) and joins live delivery at
//! the fanout's cursor. An ephemeral shard's subscription is live only. A subscription of a
//! cluster's shard ends as soon as this broker no longer leads it, naming why (`not_leader`,
//! `fenced`), so the subscriber resumes on the leader.
//!
//! Invariant: the join happens under the fanout's lock at the cursor, so the records a
//! subscription yields are in offset order with no batch skipped or repeated, except where
//! retention removed history (the offsets show the jump) or, for a client that did not offer
//! `subscription_lagged`, where its queue overflowed.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use felix_cold::ColdError;
use felix_cold::tiered::Tier;
use felix_wire::protocol::{ErrorBody, StartAt, codes};
use tracing::warn;

use crate::broker::Broker;
use crate::errors::{cold_error, err};
use crate::fanout::{Delivery, LiveBatch, SubReceiver, sub_queue};
use crate::node::Node;
use crate::replication::role::Role;
use crate::shard::{Shard, shard_key};

/// A subscription as the server drives it.
pub struct Subscription {
    pub start_offset: u64,
    pub live_offset: u64,
    state: SubState,
    /// Most bytes one history read takes: the subscription's share of its connection's
    /// `subscriber_egress_max_bytes` (see [`Subscription::set_egress_share`]).
    read_limit: usize,
    /// The broker's node, to start rewriting a damaged segment a read was refused on.
    node: Weak<Node>,
}

/// Largest history read, and the default share.
const MAX_HISTORY_READ: usize = 256 << 10;

enum SubState {
    /// Durable: replaying history from `pos`, then live through `queue`.
    Durable {
        shard: Arc<Shard>,
        pos: u64,
        queue: Option<SubReceiver>,
        id: u64,
        tenant: String,
        capacity: usize,
        max_bytes: usize,
        /// Drops end the subscription with `subscription_lagged` (the client offered the
        /// feature); otherwise they show as offset jumps and it carries on.
        announce_drops: bool,
    },
    /// Ephemeral: live only.
    Ephemeral {
        shard: Arc<Shard>,
        queue: SubReceiver,
        id: u64,
    },
}

/// What `Subscription::next` yields.
pub enum SubEvent {
    Batches(LiveBatch),
    /// History cannot be read (e.g. the object store is unreachable): the subscription
    /// ends with this error.
    Failed(ErrorBody),
    Lagged {
        resume_offset: u64,
    },
    /// The shard was closed (stream deleted or broker stopping).
    Closed,
}

impl Subscription {
    /// Bounds what this subscription holds outside its queue to `bytes`: the broker takes
    /// at most one frame at a time from a subscription, so a history read no larger than the
    /// share keeps the connection's egress within `subscriber_egress_max_bytes`. (A live
    /// batch larger than the share is still sent whole: batches are never split.)
    pub fn set_egress_share(&mut self, bytes: usize) {
        self.read_limit = bytes.clamp(4096, MAX_HISTORY_READ);
    }

    /// For a client that did not offer `FEATURE_SUBSCRIPTION_LAGGED`: a durable
    /// subscription's drops are counted and skipped, as an ephemeral one's are, and the
    /// subscription carries on (the records' offsets show the jump). Call before the first
    /// [`Subscription::next`].
    pub fn keep_through_drops(&mut self) {
        if let SubState::Durable { announce_drops, .. } = &mut self.state {
            *announce_drops = false;
        }
    }

    /// The next batch(es) to send. History is read from the log without any drop; once the
    /// subscription has caught up with the fanout it joins live delivery.
    pub async fn next(&mut self) -> SubEvent {
        loop {
            match &mut self.state {
                SubState::Ephemeral { queue, shard, .. } => {
                    if shard.is_closed() {
                        return SubEvent::Closed;
                    }
                    if let Some(end) = not_leading(shard) {
                        return end;
                    }
                    match queue.recv().await {
                        Some(Delivery::Batch(b)) => return SubEvent::Batches(b),
                        Some(Delivery::Lagged { resume_offset }) => {
                            return SubEvent::Lagged { resume_offset };
                        }
                        // Ended because the shard moved or was fenced: say so, so the
                        // subscriber resumes on its leader.
                        None => return not_leading(shard).unwrap_or(SubEvent::Closed),
                    }
                }
                SubState::Durable {
                    shard,
                    pos,
                    queue,
                    id,
                    tenant,
                    capacity,
                    max_bytes,
                    announce_drops,
                } => {
                    if shard.is_closed() {
                        return SubEvent::Closed;
                    }
                    if let Some(end) = not_leading(shard) {
                        return end;
                    }
                    if let Some(q) = queue {
                        return match q.recv().await {
                            // Joined the fanout below the start offset: skip what lies
                            // wholly before it.
                            Some(Delivery::Batch(b)) if b.next_offset <= *pos => continue,
                            Some(Delivery::Batch(b)) => SubEvent::Batches(b),
                            Some(Delivery::Lagged { resume_offset }) => {
                                SubEvent::Lagged { resume_offset }
                            }
                            None => not_leading(shard).unwrap_or(SubEvent::Closed),
                        };
                    }
                    let tier = shard.tier.as_ref().expect("durable shard has tiers");
                    // Join live delivery once caught up with the fanout's cursor.
                    let joined = shard.fanout.join_at(*pos, || {
                        sub_queue(*id, *capacity, *max_bytes, tenant, *announce_drops, *pos)
                    });
                    if let Some(rx) = joined {
                        *queue = Some(rx);
                        continue;
                    }
                    let cursor = shard.fanout.cursor();
                    match tier.read(*pos, self.read_limit, Some(cursor)).await {
                        Ok(read) if !read.batches.is_empty() => {
                            if let Some(damage) = &read.hot_damage {
                                crate::segment_repair::served_around(tier, damage);
                            }
                            let batch = LiveBatch {
                                first_offset: *pos,
                                next_offset: read.next_offset,
                                bytes: read.batches,
                            };
                            *pos = read.next_offset;
                            return SubEvent::Batches(batch);
                        }
                        Ok(read) if read.tier == Tier::Cold => {
                            // The rest of an object is past the cursor's bound or empty:
                            // continue after it.
                            *pos = read.next_offset.max(*pos + 1).min(cursor);
                        }
                        Ok(_) => {
                            // No whole batch below the cursor from here: a gap up to it.
                            *pos = (*pos).max(cursor);
                        }
                        Err(ColdError::TooOld { earliest, .. }) if *pos < earliest => {
                            // Retention removed what we were about to read; resume at the
                            // earliest retained offset (the client sees the jump in offsets).
                            *pos = earliest;
                        }
                        Err(e) => {
                            warn!(shard = %shard.key, error = %e, "subscription read failed");
                            if let Some(node) = self.node.upgrade() {
                                crate::segment_repair::refused(&node, shard, &e);
                            }
                            return SubEvent::Failed(cold_error(&e));
                        }
                    }
                }
            }
        }
    }
}

/// How a subscription of a cluster's shard ends once this broker no longer leads it.
fn not_leading(shard: &Shard) -> Option<SubEvent> {
    let repl = shard.repl.as_ref()?;
    let role = repl.role.borrow().clone();
    // Handed over by a move: say so, naming the new owner, where the subscription resumes.
    if let Role::Follower { leader, .. } = role
        && repl
            .placement
            .borrow()
            .as_ref()
            .is_some_and(|p| p.leader == Some(leader) && p.moving.is_some_and(|m| m.to == leader))
    {
        let mut e = err(
            codes::SHARD_MOVED,
            "shard_moved",
            format!(
                "shard {} moved to broker {leader}: resume there after the last offset \
                 received",
                shard.key
            ),
        )
        .retry_after(0);
        e.leader = Some(leader);
        return Some(SubEvent::Failed(e));
    }
    let (code, reason) = match role {
        Role::Leader { .. } => return None,
        Role::Fenced { .. } => (codes::SHARD_UNAVAILABLE, "fenced"),
        Role::Unavailable { .. } => (codes::SHARD_UNAVAILABLE, "leader_unavailable"),
        Role::Follower { .. } | Role::Unplaced => (codes::NOT_LEADER, "not_leader"),
    };
    Some(SubEvent::Failed(
        err(
            code,
            reason,
            format!(
                "shard {}: this broker no longer leads it; resume on the leader",
                shard.key
            ),
        )
        .retry_after(200),
    ))
}

impl Drop for Subscription {
    fn drop(&mut self) {
        match &self.state {
            SubState::Durable { shard, id, .. } | SubState::Ephemeral { shard, id, .. } => {
                shard.fanout.remove(*id)
            }
        }
    }
}

impl Broker {
    /// Opens a subscription on one shard.
    pub async fn subscribe(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
        from: StartAt,
    ) -> Result<Subscription, ErrorBody> {
        let key = shard_key(tenant, namespace, stream, shard_no);
        let (shard, _) = match self.shard(&key) {
            Err(e) if self.node.catch_up_if_unknown(&e).await => self.shard(&key)?,
            other => other?,
        };
        let id = self.next_sub_id.fetch_add(1, Ordering::Relaxed);
        let capacity = self.node.config.subscriber_queue_capacity.max(1);
        let max_bytes = self.node.config.subscriber_queue_max_bytes;
        let Some(log) = &shard.log else {
            // Ephemeral: live only.
            let (q, queue) = sub_queue(id, capacity, max_bytes, tenant, false, 0);
            let live = shard
                .fanout
                .join_now(q, || shard.ephemeral_next.load(Ordering::Acquire));
            return Ok(Subscription {
                node: Arc::downgrade(&self.node),
                read_limit: MAX_HISTORY_READ,
                start_offset: live,
                live_offset: live,
                state: SubState::Ephemeral {
                    shard: shard.clone(),
                    queue,
                    id,
                },
            });
        };
        // The committed end, not the fanout's cursor: the fanout may not have caught up with
        // a publish that was just acknowledged, and a replay sent right after the ack must
        // find it. A start above the cursor joins live delivery at the cursor and skips
        // what lies below its start.
        let _ = log;
        let live = shard.visible_end();
        let tier = shard.tier.as_ref().expect("durable shard has tiers");
        let first = tier.earliest_offset();
        let start = match from {
            StartAt::Earliest => first,
            StartAt::Latest => live,
            StartAt::Offset(o) if o < first => {
                return Err(cold_error(&ColdError::TooOld {
                    requested: o,
                    earliest: first,
                }));
            }
            StartAt::Offset(o) => {
                if o > live {
                    return Err(err(
                        codes::OFFSET_OUT_OF_RANGE,
                        "offset_out_of_range",
                        format!("offset {o} is outside [{first}, {live}] on this shard"),
                    ));
                }
                o
            }
            StartAt::Timestamp(ts) => tier
                .offset_for_time(ts)
                .await
                .map_err(|e| cold_error(&e))?
                .unwrap_or(live)
                .clamp(first, live),
        };
        Ok(Subscription {
            node: Arc::downgrade(&self.node),
            read_limit: MAX_HISTORY_READ,
            start_offset: start,
            live_offset: live,
            state: SubState::Durable {
                shard: shard.clone(),
                pos: start,
                queue: None,
                id,
                tenant: tenant.to_owned(),
                capacity,
                max_bytes,
                announce_drops: true,
            },
        })
    }
}
