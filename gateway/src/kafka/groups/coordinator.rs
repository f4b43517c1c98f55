//! The group coordinator's state machine: each group's members, generation, leader and
//! the rebalance round in progress.
//!
//! Decides when a group rebalances and what each member is answered. Kafka's state machine:
//! `Empty` → (a member joins) `PreparingRebalance` → (every member has rejoined, or the
//! rebalance timeout passed) `CompletingRebalance` → (the leader's SyncGroup) `Stable`; a
//! join, a leave or an expired session sends a group back to `PreparingRebalance`. The
//! first rebalance of an empty group waits [`INITIAL_REBALANCE_DELAY`] for more members, as
//! Kafka's `group.initial.rebalance.delay.ms` does, so a group whose consumers start
//! together forms in one generation.
//!
//! The invariants: one lock holds every group's state and no I/O happens under it; a member
//! waiting in JoinGroup or SyncGroup holds a one-shot channel the state machine answers; a
//! rebalance timer acts only on the round it was armed for.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::protocol::StrBytes;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::debug;

use crate::kafka::Kafka;
use crate::kafka::offsets::CommittedOffsets;

/// How long the first rebalance of an empty group waits for more members.
pub const INITIAL_REBALANCE_DELAY: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl GroupState {
    pub(super) fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// What a waiting JoinGroup is answered.
pub(super) struct Joined {
    pub(super) generation: i32,
    pub(super) protocol_type: String,
    pub(super) protocol: String,
    pub(super) leader: String,
    pub(super) member_id: String,
    /// Every member and its metadata for the chosen protocol: the leader's only.
    pub(super) members: Vec<(String, Option<String>, Bytes)>,
}

pub(super) type JoinAnswer = Result<Joined, ResponseError>;
pub(super) type SyncAnswer = Result<Bytes, ResponseError>;

pub(super) struct Member {
    pub(super) id: String,
    pub(super) instance_id: Option<String>,
    pub(super) client_id: String,
    pub(super) client_host: String,
    pub(super) session_timeout: Duration,
    pub(super) rebalance_timeout: Duration,
    pub(super) protocols: Vec<(String, Bytes)>,
    pub(super) assignment: Bytes,
    pub(super) last_seen: Instant,
    pub(super) join: Option<oneshot::Sender<JoinAnswer>>,
    pub(super) sync: Option<oneshot::Sender<SyncAnswer>>,
}

impl Member {
    pub(super) fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(name, _)| name == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

pub(super) struct Group {
    pub(super) state: GroupState,
    pub(super) generation: i32,
    pub(super) protocol_type: Option<String>,
    pub(super) protocol: Option<String>,
    pub(super) leader: Option<String>,
    /// In the order they joined.
    pub(super) members: Vec<Member>,
    /// Bumped at every rebalance, so a timer of an earlier one does nothing.
    pub(super) round: u64,
    /// The current rebalance is an empty group's first: it waits its delay out.
    pub(super) initial_delay: bool,
}

impl Group {
    pub(super) fn new() -> Group {
        Group {
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: Vec::new(),
            round: 0,
            initial_delay: false,
        }
    }

    pub(super) fn member(&mut self, id: &str) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.id == id)
    }

    /// Removes a member, answering whatever it waits for with `error`.
    pub(super) fn remove(&mut self, id: &str, error: ResponseError) {
        if let Some(pos) = self.members.iter().position(|m| m.id == id) {
            let m = self.members.remove(pos);
            if let Some(tx) = m.join {
                let _ = tx.send(Err(error));
            }
            if let Some(tx) = m.sync {
                let _ = tx.send(Err(error));
            }
            if self.leader.as_deref() == Some(id) {
                self.leader = None;
            }
        }
    }
}

/// The coordinator of every group on this listener.
pub struct GroupCoordinator {
    pub(super) groups: Mutex<HashMap<String, Group>>,
    pub(super) offsets: CommittedOffsets,
    /// Moves of old offsets and DeleteGroups, one at a time per group (`upgrade.rs`).
    pub(super) serial: super::upgrade::GroupSerial,
    pub(super) next_member: AtomicU64,
}

/// A timer to run at a deadline: the rebalance round it belongs to.
pub(super) struct RebalanceTimer {
    group: String,
    round: u64,
    after: Duration,
}

impl GroupCoordinator {
    pub fn new(offsets: CommittedOffsets) -> GroupCoordinator {
        GroupCoordinator {
            groups: Mutex::new(HashMap::new()),
            offsets,
            serial: Default::default(),
            next_member: AtomicU64::new(0),
        }
    }

    pub fn offsets(&self) -> &CommittedOffsets {
        &self.offsets
    }

    pub(super) fn new_member_id(&self, client_id: &str) -> String {
        let n = self.next_member.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let client: String = client_id
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(64)
            .collect();
        format!("{client}-{nanos:016x}-{n:x}")
    }

    /// Starts a rebalance (or restarts an initial delay): returns the timer to arm.
    pub(super) fn prepare_rebalance(
        group_id: &str,
        group: &mut Group,
        was_empty: bool,
    ) -> RebalanceTimer {
        if group.state == GroupState::CompletingRebalance {
            for m in &mut group.members {
                if let Some(tx) = m.sync.take() {
                    let _ = tx.send(Err(ResponseError::RebalanceInProgress));
                }
            }
        }
        group.state = GroupState::PreparingRebalance;
        group.round += 1;
        group.initial_delay = was_empty;
        let longest = group
            .members
            .iter()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or(INITIAL_REBALANCE_DELAY);
        let after = if was_empty {
            INITIAL_REBALANCE_DELAY.min(longest)
        } else {
            longest
        };
        RebalanceTimer {
            group: group_id.to_owned(),
            round: group.round,
            after,
        }
    }

    /// Completes the join phase if every member has rejoined (and no initial delay runs).
    pub(super) fn maybe_complete_join(group: &mut Group) {
        if group.state == GroupState::PreparingRebalance
            && !group.initial_delay
            && group.members.iter().all(|m| m.join.is_some())
        {
            Self::complete_join(group);
        }
    }

    /// Ends the join phase: members that did not rejoin leave, a new generation starts and
    /// every waiting JoinGroup is answered (the leader with every member's metadata).
    fn complete_join(group: &mut Group) {
        let gone: Vec<String> = group
            .members
            .iter()
            .filter(|m| m.join.is_none())
            .map(|m| m.id.clone())
            .collect();
        for id in gone {
            group.remove(&id, ResponseError::UnknownMemberId);
        }
        group.generation = group.generation.wrapping_add(1).max(1);
        group.initial_delay = false;
        if group.members.is_empty() {
            group.state = GroupState::Empty;
            group.protocol = None;
            group.leader = None;
            return;
        }
        let leader = match &group.leader {
            Some(l) if group.members.iter().any(|m| &m.id == l) => l.clone(),
            _ => group.members[0].id.clone(),
        };
        // The leader's most preferred protocol that every member supports.
        let leader_protocols: Vec<String> = group
            .members
            .iter()
            .find(|m| m.id == leader)
            .map(|m| m.protocols.iter().map(|(n, _)| n.clone()).collect())
            .unwrap_or_default();
        let protocol = leader_protocols
            .into_iter()
            .find(|p| {
                group
                    .members
                    .iter()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == p))
            })
            .unwrap_or_default();
        group.protocol = Some(protocol.clone());
        group.leader = Some(leader.clone());
        group.state = GroupState::CompletingRebalance;
        let everyone: Vec<(String, Option<String>, Bytes)> = group
            .members
            .iter()
            .map(|m| {
                (
                    m.id.clone(),
                    m.instance_id.clone(),
                    m.metadata_for(&protocol),
                )
            })
            .collect();
        let protocol_type = group.protocol_type.clone().unwrap_or_default();
        let now = Instant::now();
        for m in &mut group.members {
            m.last_seen = now;
            m.assignment = Bytes::new();
            if let Some(tx) = m.join.take() {
                let _ = tx.send(Ok(Joined {
                    generation: group.generation,
                    protocol_type: protocol_type.clone(),
                    protocol: protocol.clone(),
                    leader: leader.clone(),
                    member_id: m.id.clone(),
                    members: if m.id == leader {
                        everyone.clone()
                    } else {
                        Vec::new()
                    },
                }));
            }
        }
        debug!(
            generation = group.generation,
            members = group.members.len(),
            leader,
            "group rebalanced"
        );
    }

    /// A rebalance timer fired: complete the round it was armed for, if still current.
    fn rebalance_deadline(&self, group_id: &str, round: u64) {
        let mut groups = self.groups.lock();
        if let Some(group) = groups.get_mut(group_id)
            && group.round == round
            && group.state == GroupState::PreparingRebalance
        {
            Self::complete_join(group);
        }
    }
}

pub(super) fn arm(kafka: &Arc<Kafka>, timer: RebalanceTimer) {
    let weak = Arc::downgrade(kafka);
    tokio::spawn(async move {
        tokio::time::sleep(timer.after).await;
        if let Some(kafka) = weak.upgrade() {
            kafka.groups.rebalance_deadline(&timer.group, timer.round);
        }
    });
}

/// A Kafka string from ours.
pub(super) fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, protocols: &[&str]) -> Member {
        Member {
            id: id.to_owned(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "h".into(),
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(10),
            protocols: protocols
                .iter()
                .map(|p| (p.to_string(), Bytes::from(format!("meta-{id}-{p}"))))
                .collect(),
            assignment: Bytes::new(),
            last_seen: Instant::now(),
            join: None,
            sync: None,
        }
    }

    #[tokio::test]
    async fn a_join_round_answers_the_leader_with_every_member_and_the_rest_with_none() {
        let mut group = Group::new();
        group.protocol_type = Some("consumer".into());
        let mut answers = Vec::new();
        for (id, protocols) in [
            ("a", vec!["range", "cooperative-sticky"]),
            ("b", vec!["cooperative-sticky", "range"]),
        ] {
            let mut m = member(id, &protocols);
            let (tx, rx) = oneshot::channel();
            m.join = Some(tx);
            group.members.push(m);
            answers.push(rx);
        }
        GroupCoordinator::prepare_rebalance("g", &mut group, false);
        GroupCoordinator::maybe_complete_join(&mut group);
        assert_eq!(group.state, GroupState::CompletingRebalance);
        assert_eq!(group.generation, 1);
        let a = answers.remove(0).await.expect("answered").expect("joined");
        let b = answers.remove(0).await.expect("answered").expect("joined");
        assert_eq!(a.leader, "a");
        assert_eq!(
            a.protocol, "range",
            "the leader's first choice every member supports"
        );
        assert_eq!(a.members.len(), 2);
        assert_eq!(a.members[1].2, Bytes::from("meta-b-range"));
        assert!(b.members.is_empty());
        assert_eq!(b.generation, 1);
    }

    #[tokio::test]
    async fn members_that_do_not_rejoin_by_the_deadline_are_dropped() {
        let mut group = Group::new();
        group.protocol_type = Some("consumer".into());
        let mut a = member("a", &["range"]);
        let (tx, rx) = oneshot::channel();
        a.join = Some(tx);
        group.members.push(a);
        group.members.push(member("b", &["range"]));
        GroupCoordinator::prepare_rebalance("g", &mut group, false);
        GroupCoordinator::maybe_complete_join(&mut group);
        assert_eq!(
            group.state,
            GroupState::PreparingRebalance,
            "b has not rejoined"
        );
        GroupCoordinator::complete_join(&mut group);
        let a = rx.await.expect("answered").expect("joined");
        assert_eq!(a.members.len(), 1);
        assert_eq!(group.members.len(), 1);
    }
}
