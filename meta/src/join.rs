//! A new broker joining a running control-plane group (scaling out).
//!
//! A node with an empty data directory whose id the group does not have yet (its peers in
//! `--cluster` hold state whose membership lacks it) asks the leader to add it as a learner
//! (`MembershipChange::Join`, answered once it caught up), catches up with what the leader
//! had applied, then asks to be made a voter (`MembershipChange::Promote`). Until then it
//! neither votes nor stands for election, like a member with a wiped volume.
//!
//! Invariants:
//! * Safe to repeat: both requests are no-ops once done, so a lost answer is asked again,
//!   and a node restarted mid-way finds its `joining` marker and goes on from where it was
//!   (the `cluster-id` marker is written only once it votes).
//! * A conflict is refused, never resolved by guessing: an id that is a member at another
//!   address, or an address that is another member's, stops the join with the leader's
//!   reason (`StartError::Config` when found at start).

use std::path::Path;
use std::time::Duration;

use tracing::{info, warn};

use crate::handle::MetaHandle;
use crate::network::{ForwardError, HttpNetworkFactory, MembershipChange, NodeStatus};
use crate::types::NodeId;

/// Marks a join under way: removed once this node votes.
pub(crate) const JOINING_FILE: &str = "joining";

/// How long to wait before asking again after a request that did not get through.
const RETRY: Duration = Duration::from_millis(500);

/// Whether the answers of this node's peers say a group exists that does not have
/// `node_id` yet (so this node is a new one, not a member that lost its volume). `Err`
/// with the reason if `node_id` is a member there at another address than `advertised`.
pub(crate) fn is_new_member(
    answers: &[(NodeId, Option<NodeStatus>)],
    node_id: NodeId,
    advertised: &str,
) -> Result<bool, String> {
    let mut new = false;
    for s in answers.iter().filter_map(|(_, s)| s.as_ref()) {
        if !s.has_state || s.members.is_empty() {
            continue;
        }
        match s.members.iter().find(|(id, _)| *id == node_id) {
            Some((_, addr)) if addr != advertised => {
                return Err(format!(
                    "node id {node_id} is already a member of the control plane at {addr}, \
                     not at this broker's internal address {advertised}: give this broker a \
                     new --node-id (or `felixctl broker remove {node_id}` first if that broker \
                     is gone for good)"
                ));
            }
            Some(_) => return Ok(false),
            None => new = true,
        }
    }
    Ok(new)
}

/// Asks the group, through any of `peers` (following the leader's hint), to add this node
/// as a learner, waits until it caught up, then to make it a voter. Returns `Err` with the
/// leader's reason on a conflict (nothing was changed); retries everything else.
pub(crate) async fn join(
    handle: &MetaHandle,
    network: &HttpNetworkFactory,
    peers: &[(NodeId, String)],
    advertised: &str,
) -> Result<(), String> {
    let id = handle.node_id();
    info!(
        node = id,
        addr = advertised,
        "not a member of the running control plane: asking to join as a learner"
    );
    let join = MembershipChange::Join {
        id,
        addr: advertised.to_owned(),
    };
    ask(network, peers, &join).await?;
    info!(node = id, "joined as a learner; catching up");
    catch_up(handle, network, peers).await;
    ask(network, peers, &MembershipChange::Promote { id }).await?;
    info!(node = id, "promoted to a voter of the control plane");
    Ok(())
}

/// Sends `change` to the leader until it is applied; `Err` on a refusal (409).
async fn ask(
    network: &HttpNetworkFactory,
    peers: &[(NodeId, String)],
    change: &MembershipChange,
) -> Result<(), String> {
    let client = network.client();
    let mut at = 0usize;
    let mut hint: Option<String> = None;
    loop {
        let addr = hint.take().unwrap_or_else(|| {
            at = (at + 1) % peers.len();
            peers[at].1.clone()
        });
        match client.change_membership(&addr, change).await {
            Ok(()) => return Ok(()),
            Err(ForwardError::Remote {
                status: 409,
                message,
            }) => return Err(message),
            Err(ForwardError::NotLeader {
                leader: Some((_, leader)),
            }) => {
                hint = Some(leader);
                continue;
            }
            Err(e) => {
                warn!(%addr, error = %e, ?change, "membership request not applied; asking again")
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Waits until this node has applied everything the current leader had applied when
/// asked. Polls the peers: a leader is needed for this node to receive anything at all.
pub(crate) async fn catch_up(
    handle: &MetaHandle,
    peers: &HttpNetworkFactory,
    others: &[(NodeId, String)],
) {
    loop {
        let mut leader_applied = None;
        for (id, addr) in others {
            if let Ok(s) = peers.status(addr).await
                && s.leader == Some(*id)
            {
                leader_applied = s.last_applied;
            }
        }
        let own = *handle.applied().borrow();
        if let Some(target) = leader_applied
            && own >= target
        {
            info!(
                node = handle.node_id(),
                applied = own,
                "caught up with the metadata leader"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Writes the `joining` marker durably.
pub(crate) fn mark_joining(dir: &Path) -> std::io::Result<()> {
    let path = dir.join(JOINING_FILE);
    std::fs::write(
        &path,
        b"this node is joining a running control-plane group\n",
    )?;
    std::fs::File::open(&path)?.sync_all()?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(members: &[(NodeId, &str)]) -> Option<NodeStatus> {
        Some(NodeStatus {
            node_id: 1,
            leader: Some(1),
            term: 1,
            last_applied: Some(10),
            committed: Some(10),
            has_state: true,
            accepting_votes: true,
            members: members.iter().map(|(i, a)| (*i, a.to_string())).collect(),
            voters: members.iter().map(|(i, _)| *i).collect(),
            last_log_index: Some(10),
            snapshot: None,
            purged: None,
        })
    }

    #[test]
    fn a_node_the_group_lacks_is_new_and_a_member_is_not() {
        let answers = vec![(1, status(&[(1, "a:1"), (2, "a:2")])), (2, None)];
        assert_eq!(is_new_member(&answers, 4, "a:4"), Ok(true));
        assert_eq!(is_new_member(&answers, 2, "a:2"), Ok(false));
        // Nobody answered with state: not known to be new (the group may be forming).
        assert_eq!(is_new_member(&[(1, None)], 4, "a:4"), Ok(false));
    }

    #[test]
    fn an_id_used_at_another_address_is_refused() {
        let answers = vec![(1, status(&[(1, "a:1"), (2, "a:2")]))];
        let why = is_new_member(&answers, 2, "b:9").unwrap_err();
        assert!(
            why.contains("already a member") && why.contains("a:2"),
            "{why}"
        );
    }
}
