//! The logs that belong to a shard besides its data log, which a move must carry too.
//!
//! A shard's consumer-group journal (`groups/journal.rs`) lives beside its log and moves
//! with the shard (the spec: "Group positions ... move with the shard"). A move waits for
//! the destination to hold the shard's data log in `handover.rs`; for every other log it
//! asks the [`ShardLogs`] the broker registered ([`Node::shard_logs`](crate::node::Node)),
//! at the same two points: before the hand-over (with publishes held) and before the old
//! replica leaves.
//!
//! Invariant: a move never lets a replica go, nor hands leadership over, while another log
//! of the shard answers that the destination lacks part of it; with none registered, the
//! data log is the shard's only state.

use felix_meta::model::ShardKey;
use futures::future::BoxFuture;

/// A shard's other logs, as the broker that leads it sees them.
pub trait ShardLogs: Send + Sync {
    /// Whether broker `to` holds everything of `shard`'s other logs that this broker (the
    /// shard's leader) holds now.
    fn caught_up<'a>(&'a self, shard: &'a ShardKey, to: u64) -> BoxFuture<'a, bool>;
}
