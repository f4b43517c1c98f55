//! What a shard move asks of the group journals (`crate::moves::shard_logs`): whether a
//! move's destination holds a shard's journal up to this leader's end.
//!
//! Registered on the node by the broker's start-up (`register`), from here rather than from
//! `broker.rs`, so that the broker does not import the code that looks back into it.

use std::sync::{Arc, Weak};

use felix_meta::model::ShardKey;
use futures::future::BoxFuture;

use crate::broker::Broker;
use crate::moves::shard_logs::ShardLogs;

/// Makes shard moves carry `broker`'s group journals.
pub fn register(broker: &Arc<Broker>) {
    let _ = broker
        .node
        .shard_logs
        .set(Arc::new(GroupJournals(Arc::downgrade(broker))));
}

/// The consumer-group journals (`groups::replica`): `to` holds a shard's journal once its
/// reported end reached this leader's. A shard with no journal open here, or an empty one,
/// has nothing to carry; the leader itself holds its own.
struct GroupJournals(Weak<Broker>);

impl ShardLogs for GroupJournals {
    fn caught_up<'a>(&'a self, shard: &'a ShardKey, to: u64) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let Some(broker) = self.0.upgrade() else {
                return true;
            };
            if broker.node.broker_id() == to {
                return true;
            }
            match broker.group_journal_ends(shard).await {
                None => true,
                Some((0, _)) => true,
                Some((end, ends)) => ends.iter().any(|(r, e)| *r == to && *e >= end),
            }
        })
    }
}
