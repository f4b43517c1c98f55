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
//! client's watch follows, as soon as the role changes here (not at the next half-second
//! recheck: a shard moved away and back within it would leave the watch open, blind to the
//! changes made elsewhere meanwhile).
//!
//! Invariant: an operation held here past the hold is refused as `shard_unavailable` with
//! reason `moving`, having changed nothing.

use std::future::Future;
use std::time::Instant;

use felix_meta::model::ShardKey;
use felix_wire::protocol::{ErrorBody, codes};
use tokio::sync::watch;

use crate::broker::Broker;
use crate::errors::err;
use crate::moves::hold;
use crate::node::Node;
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

/// How a watch of `shard`, opened while this broker led it at `opened`, ends because of a
/// move: `shard_moved` naming the new owner (and its address), where the watch is opened
/// again, once this broker follows the owner it handed the shard to; or naming this broker
/// when it leads again at another generation (the shard was led elsewhere meanwhile, and
/// the changes made there never reached this watch). `None` otherwise.
pub(crate) fn watch_end(node: &Node, shard: &Shard, opened: Option<u64>) -> Option<ErrorBody> {
    let repl = shard.repl.as_ref()?;
    let role = repl.role.borrow().clone();
    let (owner, why) = match role {
        Role::Follower { leader, generation }
            if repl.moves.handed_over_to() == Some((generation, leader)) =>
        {
            (leader, "open the watch there")
        }
        Role::Leader { generation } if opened.is_some_and(|o| o != generation) => (
            node.broker_id(),
            "it was led elsewhere meanwhile and the changes made there were not delivered \
             here; open the watch again",
        ),
        _ => return None,
    };
    let mut e = err(
        codes::SHARD_MOVED,
        "shard_moved",
        format!(
            "shard {} moved to broker {owner}: {why} (changes made while it is reopened are \
             not delivered)",
            shard.key
        ),
    )
    .retry_after(0);
    e.leader = Some(owner);
    e.leader_addr = node
        .registry
        .borrow()
        .brokers
        .get(&owner)
        .map(|b| b.client_addr.clone());
    Some(e)
}

/// Resolves when `shard`'s role changes here (never for a shard that is not replicated,
/// nor once its role can no longer change).
pub(crate) async fn role_changed(role: &mut Option<watch::Receiver<Role>>) {
    let changed = match role.as_mut() {
        Some(r) => r.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        *role = None;
        std::future::pending::<()>().await
    }
}
