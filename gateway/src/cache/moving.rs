//! Cache operations across a shard move's hand-over (the spec's "Shard Moves": cache and
//! counter operations are held and forwarded the same way as publishes).
//!
//! Decides what an operation on a key meets while its shard changes owner. It waits like a
//! publish (`moves::hold`): on the old owner while the fence is up, on the new owner while
//! it is still taking over, at most `shard_move_hold_ms` in all. Then it runs where the
//! shard is served: here, or — once the old owner follows the new one — at the new owner,
//! forwarded once more (answered `not_leader` with reason `moved` for the forwarding
//! broker, as a held publish is). A change that raced the fence was not appended (it is
//! refused under the append lock, `ops.rs`), so it is held and tried again: decided once.
//! A watch of the shard ends with `shard_moved` naming the new owner, which a cluster
//! client's watch follows.
//!
//! Invariant: an operation held here past the hold is refused as `shard_unavailable` with
//! reason `moving`, having changed nothing.

use std::future::Future;
use std::time::Instant;

use felix_meta::model::ShardKey;
use felix_wire::protocol::{ErrorBody, codes};

use crate::broker::Broker;
use crate::errors::err;
use crate::moves::hold;
use crate::replication::role::Role;
use crate::shard::Shard;

impl Broker {
    /// Runs `op` on the shard `key` once the shard is served (see the module's top),
    /// trying it again when it raced a hand-over's fence.
    pub(crate) async fn cache_held<T, F, Fut>(
        &self,
        key: &ShardKey,
        mut op: F,
    ) -> Result<T, ErrorBody>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ErrorBody>>,
    {
        let since = Instant::now();
        let mut held = false;
        loop {
            if let Ok((shard, _)) = self.shards.open(key) {
                held |= hold::wait_for_owner(&self.node, &shard, since).await?;
            }
            match op().await {
                // It raced the fence: nothing was appended; hold it like the others.
                Err(e) if hold::met_fence(&e) => held = true,
                Err(mut e) if held && e.code == codes::NOT_LEADER => {
                    e.reason = hold::MOVED.to_owned();
                    return Err(e);
                }
                other => return other,
            }
        }
    }
}

/// Whether a forwarded operation's `not_leader` answer asks the forwarding broker to send
/// it on once more: it was held here across a hand-over (reason `moved`).
pub(crate) fn forward_again(e: &ErrorBody) -> bool {
    e.code == codes::NOT_LEADER && e.reason == hold::MOVED
}

/// How a watch of `shard` ends once this broker handed the shard over to another by a move:
/// `shard_moved` naming the new owner (and its address), where the watch is opened again.
/// `None` while this broker did not hand it over.
pub(crate) fn moved_end(broker: &Broker, shard: &Shard) -> Option<ErrorBody> {
    let repl = shard.repl.as_ref()?;
    let Role::Follower { leader, generation } = repl.role.borrow().clone() else {
        return None;
    };
    if repl.moves.handed_over_to() != Some((generation, leader)) {
        return None;
    }
    let mut e = err(
        codes::SHARD_MOVED,
        "shard_moved",
        format!(
            "shard {} moved to broker {leader}: open the watch there (changes made while it \
             is reopened are not delivered)",
            shard.key
        ),
    )
    .retry_after(0);
    e.leader = Some(leader);
    e.leader_addr = broker
        .node
        .registry
        .borrow()
        .brokers
        .get(&leader)
        .map(|b| b.client_addr.clone());
    Some(e)
}
