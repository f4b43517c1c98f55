//! The role this broker has for one shard of a cluster, and the state its leadership
//! carries: the placement it follows and the quorum mark.
//!
//! Invariant: the role changes only from the value the changer saw ([`swap_role`]), so a
//! leader's loop that was overtaken by a placement change never flips the role back.

use tokio::sync::watch;

use felix_meta::model::Placement;

use super::quorum::QuorumMark;

/// The role this broker has for one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// No placement names this broker's part yet.
    Unplaced,
    /// Leading at this generation, after cutting the log to the generation's start.
    Leader { generation: u64 },
    /// Following `leader` at this generation.
    Follower { leader: u64, generation: u64 },
    /// Named leader but without a valid lease: refuses writes and reads until it has one.
    Fenced { generation: u64 },
    /// Named leader but unable to lead (its log lacks committed records).
    Unavailable { generation: u64, why: String },
}

/// A shard's replication state on this broker (cluster mode only).
pub struct ReplState {
    pub role: watch::Sender<Role>,
    /// The end of what readers may see (see [`QuorumMark`]).
    pub mark: QuorumMark,
    /// The newest placement this broker has seen for the shard.
    pub placement: watch::Sender<Option<Placement>>,
    /// The shard's move on this broker: the hand-over fence (`crate::moves`).
    pub moves: crate::moves::progress::MoveProgress,
}

impl ReplState {
    pub fn new(visible: u64) -> ReplState {
        ReplState {
            role: watch::channel(Role::Unplaced).0,
            mark: QuorumMark::new(visible),
            placement: watch::channel(None).0,
            moves: Default::default(),
        }
    }

    /// Hands the shard a placement from the registry (its driver wakes only on a change).
    pub fn set_placement(&self, p: &Placement) {
        self.placement.send_if_modified(|old| {
            let changed = old.as_ref() != Some(p);
            *old = Some(p.clone());
            changed
        });
    }

    /// The generation this broker leads at, if it leads.
    pub fn leading(&self) -> Option<u64> {
        match &*self.role.borrow() {
            Role::Leader { generation } => Some(*generation),
            _ => None,
        }
    }
}

/// Sets the role to `to` if it is `from`; says whether it did.
pub(crate) fn swap_role(repl: &ReplState, from: &Role, to: &Role) -> bool {
    repl.role.send_if_modified(|role| {
        if role == from {
            *role = to.clone();
            true
        } else {
            false
        }
    })
}
