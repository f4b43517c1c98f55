//! The Kafka group coordinator (the classic protocol): membership, rebalances and committed
//! offsets of the consumer groups of the listener's namespace. This broker coordinates
//! every group.
//!
//! Decides when a group rebalances and who gets which assignment. Kafka's state machine:
//! `Empty` → (a member joins) `PreparingRebalance` → (every member has rejoined, or the
//! rebalance timeout passed) `CompletingRebalance` → (the leader's SyncGroup) `Stable`; a
//! join, a leave or an expired session sends a group back to `PreparingRebalance`. The
//! first rebalance of an empty group waits [`INITIAL_REBALANCE_DELAY`] for more members, as
//! Kafka's `group.initial.rebalance.delay.ms` does, so a group whose consumers start
//! together forms in one generation.
//!
//! The invariants: one lock holds every group's state and no I/O happens under it; a member
//! waiting in JoinGroup or SyncGroup holds a one-shot channel the state machine answers;
//! an offset is committed only by a current member of the current generation (or, for a
//! group without members, by anyone, as Kafka allows for manual assignment).
//!
//! Membership lives in memory: after a broker restart the consumers rejoin (their member
//! ids are unknown, so they get fresh ones) and resume from the committed offsets, which
//! are durable ([`super::offsets`]).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeGroupsRequest, DescribeGroupsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest,
    ListGroupsResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
    OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::Kafka;
use super::offsets::{Committed, CommittedOffsets, OffsetKey};
use super::topics::broker_id;

/// How long the first rebalance of an empty group waits for more members.
pub const INITIAL_REBALANCE_DELAY: Duration = Duration::from_secs(3);
/// Session timeouts a member may ask for (Kafka's defaults are 6 s to 30 min; a lower
/// floor lets tests detect a dead consumer sooner).
const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(1000);
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(1800);
/// Longest offset metadata kept (Kafka's `offset.metadata.max.bytes`).
const MAX_METADATA_BYTES: usize = 4096;
/// How often sessions are checked for expiry.
const EXPIRY_CHECK: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl GroupState {
    fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// What a waiting JoinGroup is answered.
struct Joined {
    generation: i32,
    protocol_type: String,
    protocol: String,
    leader: String,
    member_id: String,
    /// Every member and its metadata for the chosen protocol: the leader's only.
    members: Vec<(String, Option<String>, Bytes)>,
}

type JoinAnswer = Result<Joined, ResponseError>;
type SyncAnswer = Result<Bytes, ResponseError>;

struct Member {
    id: String,
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    last_seen: Instant,
    join: Option<oneshot::Sender<JoinAnswer>>,
    sync: Option<oneshot::Sender<SyncAnswer>>,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(name, _)| name == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

struct Group {
    state: GroupState,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    /// In the order they joined.
    members: Vec<Member>,
    /// Bumped at every rebalance, so a timer of an earlier one does nothing.
    round: u64,
    /// The current rebalance is an empty group's first: it waits its delay out.
    initial_delay: bool,
}

impl Group {
    fn new() -> Group {
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

    fn member(&mut self, id: &str) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.id == id)
    }

    /// Removes a member, answering whatever it waits for with `error`.
    fn remove(&mut self, id: &str, error: ResponseError) {
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
    groups: Mutex<HashMap<String, Group>>,
    offsets: CommittedOffsets,
    next_member: AtomicU64,
}

/// A timer to run at a deadline: the rebalance round it belongs to.
struct RebalanceTimer {
    group: String,
    round: u64,
    after: Duration,
}

impl GroupCoordinator {
    pub fn new(offsets: CommittedOffsets) -> GroupCoordinator {
        GroupCoordinator {
            groups: Mutex::new(HashMap::new()),
            offsets,
            next_member: AtomicU64::new(0),
        }
    }

    pub fn offsets(&self) -> &CommittedOffsets {
        &self.offsets
    }

    fn new_member_id(&self, client_id: &str) -> String {
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
    fn prepare_rebalance(group_id: &str, group: &mut Group, was_empty: bool) -> RebalanceTimer {
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
    fn maybe_complete_join(group: &mut Group) {
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

fn arm(kafka: &Arc<Kafka>, timer: RebalanceTimer) {
    let weak = Arc::downgrade(kafka);
    tokio::spawn(async move {
        tokio::time::sleep(timer.after).await;
        if let Some(kafka) = weak.upgrade() {
            kafka.groups.rebalance_deadline(&timer.group, timer.round);
        }
    });
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

/// Who is asking, as DescribeGroups reports members.
pub struct Caller<'a> {
    pub client_id: &'a str,
    pub host: &'a str,
}

/// JoinGroup.
pub async fn join_group(
    kafka: &Arc<Kafka>,
    request: JoinGroupRequest,
    caller: Caller<'_>,
) -> JoinGroupResponse {
    let fail = |error: ResponseError, member_id: &str| {
        JoinGroupResponse::default()
            .with_error_code(error.code())
            .with_member_id(sb(member_id))
    };
    let group_id = request.group_id.to_string();
    let session_timeout = Duration::from_millis(request.session_timeout_ms.max(0) as u64);
    // v0 has no rebalance timeout: it is the session timeout.
    let rebalance_timeout = match request.rebalance_timeout_ms {
        n if n > 0 => Duration::from_millis(n as u64),
        _ => session_timeout,
    };
    if group_id.is_empty() {
        return fail(ResponseError::InvalidGroupId, &request.member_id);
    }
    if !(MIN_SESSION_TIMEOUT..=MAX_SESSION_TIMEOUT).contains(&session_timeout) {
        return fail(ResponseError::InvalidSessionTimeout, &request.member_id);
    }
    let protocol_type = request.protocol_type.to_string();
    let protocols: Vec<(String, Bytes)> = request
        .protocols
        .iter()
        .map(|p| (p.name.to_string(), p.metadata.clone()))
        .collect();
    if protocol_type.is_empty() || protocols.is_empty() {
        return fail(ResponseError::InconsistentGroupProtocol, &request.member_id);
    }
    let instance_id = request.group_instance_id.as_ref().map(|s| s.to_string());
    let coordinator = &kafka.groups;
    let (tx, rx) = oneshot::channel();
    let timer;
    {
        let mut groups = coordinator.groups.lock();
        let group = groups.entry(group_id.clone()).or_insert_with(Group::new);
        let others_agree = group
            .members
            .iter()
            .filter(|m| m.id != *request.member_id)
            .all(|m| {
                m.protocols
                    .iter()
                    .any(|(n, _)| protocols.iter().any(|(p, _)| p == n))
            });
        if !group.members.is_empty()
            && (group.protocol_type.as_deref() != Some(protocol_type.as_str()) || !others_agree)
        {
            return fail(ResponseError::InconsistentGroupProtocol, &request.member_id);
        }
        let member_id = if request.member_id.is_empty() {
            // A static member coming back replaces its previous incarnation.
            if let Some(instance) = &instance_id
                && let Some(old) = group
                    .members
                    .iter()
                    .find(|m| m.instance_id.as_ref() == Some(instance))
                    .map(|m| m.id.clone())
            {
                group.remove(&old, ResponseError::FencedInstanceId);
            }
            let id = coordinator.new_member_id(caller.client_id);
            group.members.push(Member {
                id: id.clone(),
                instance_id: instance_id.clone(),
                client_id: caller.client_id.to_owned(),
                client_host: caller.host.to_owned(),
                session_timeout,
                rebalance_timeout,
                protocols: Vec::new(),
                assignment: Bytes::new(),
                last_seen: Instant::now(),
                join: None,
                sync: None,
            });
            id
        } else {
            let id = request.member_id.to_string();
            if group.member(&id).is_none() {
                return fail(ResponseError::UnknownMemberId, &id);
            }
            id
        };
        let was_empty = group.members.len() == 1 && group.state == GroupState::Empty;
        group.protocol_type = Some(protocol_type);
        let member = group
            .member(&member_id)
            .expect("the member was found or added above");
        member.protocols = protocols;
        member.session_timeout = session_timeout;
        member.rebalance_timeout = rebalance_timeout;
        member.last_seen = Instant::now();
        if let Some(old) = member.join.replace(tx) {
            let _ = old.send(Err(ResponseError::RebalanceInProgress));
        }
        timer = if group.state == GroupState::PreparingRebalance {
            None
        } else {
            Some(GroupCoordinator::prepare_rebalance(
                &group_id, group, was_empty,
            ))
        };
        GroupCoordinator::maybe_complete_join(group);
    }
    if let Some(timer) = timer {
        arm(kafka, timer);
    }
    // Bounded: the rebalance timer answers long before this.
    let wait = rebalance_timeout.max(INITIAL_REBALANCE_DELAY) + Duration::from_secs(30);
    match tokio::time::timeout(wait, rx).await {
        Ok(Ok(Ok(joined))) => {
            let members = joined
                .members
                .into_iter()
                .map(|(id, instance, metadata)| {
                    JoinGroupResponseMember::default()
                        .with_member_id(sb(&id))
                        .with_group_instance_id(instance.map(|i| sb(&i)))
                        .with_metadata(metadata)
                })
                .collect();
            JoinGroupResponse::default()
                .with_generation_id(joined.generation)
                .with_protocol_type(Some(sb(&joined.protocol_type)))
                .with_protocol_name(Some(sb(&joined.protocol)))
                .with_leader(sb(&joined.leader))
                .with_member_id(sb(&joined.member_id))
                .with_members(members)
        }
        Ok(Ok(Err(error))) => fail(error, ""),
        Ok(Err(_)) | Err(_) => fail(ResponseError::RebalanceInProgress, ""),
    }
}

/// SyncGroup: the leader hands out assignments; every member receives its own.
pub async fn sync_group(kafka: &Arc<Kafka>, request: SyncGroupRequest) -> SyncGroupResponse {
    let fail = |error: ResponseError| SyncGroupResponse::default().with_error_code(error.code());
    let group_id = request.group_id.to_string();
    let member_id = request.member_id.to_string();
    let (tx, rx) = oneshot::channel();
    let (protocol_type, protocol, wait) = {
        let mut groups = kafka.groups.groups.lock();
        let Some(group) = groups.get_mut(&group_id) else {
            return fail(ResponseError::UnknownMemberId);
        };
        let Some(member) = group.member(&member_id) else {
            return fail(ResponseError::UnknownMemberId);
        };
        member.last_seen = Instant::now();
        let wait = member.session_timeout;
        if request.generation_id != group.generation {
            return fail(ResponseError::IllegalGeneration);
        }
        let names = (
            group.protocol_type.clone().unwrap_or_default(),
            group.protocol.clone().unwrap_or_default(),
        );
        match group.state {
            GroupState::Empty => return fail(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => return fail(ResponseError::RebalanceInProgress),
            GroupState::Stable => {
                let assignment = group
                    .member(&member_id)
                    .map(|m| m.assignment.clone())
                    .unwrap_or_default();
                return SyncGroupResponse::default()
                    .with_protocol_type(Some(sb(&names.0)))
                    .with_protocol_name(Some(sb(&names.1)))
                    .with_assignment(assignment);
            }
            GroupState::CompletingRebalance => {}
        }
        if let Some(m) = group.member(&member_id)
            && let Some(old) = m.sync.replace(tx)
        {
            let _ = old.send(Err(ResponseError::RebalanceInProgress));
        }
        if group.leader.as_deref() == Some(member_id.as_str()) {
            let assignments: HashMap<String, Bytes> = request
                .assignments
                .into_iter()
                .map(|a| (a.member_id.to_string(), a.assignment))
                .collect();
            group.state = GroupState::Stable;
            for m in &mut group.members {
                m.assignment = assignments.get(&m.id).cloned().unwrap_or_default();
                if let Some(tx) = m.sync.take() {
                    let _ = tx.send(Ok(m.assignment.clone()));
                }
            }
            info!(
                group = group_id,
                generation = group.generation,
                members = group.members.len(),
                "group stable"
            );
        }
        (names.0, names.1, wait)
    };
    match tokio::time::timeout(wait + Duration::from_secs(5), rx).await {
        Ok(Ok(Ok(assignment))) => SyncGroupResponse::default()
            .with_protocol_type(Some(sb(&protocol_type)))
            .with_protocol_name(Some(sb(&protocol)))
            .with_assignment(assignment),
        Ok(Ok(Err(error))) => fail(error),
        Ok(Err(_)) | Err(_) => fail(ResponseError::RebalanceInProgress),
    }
}

/// Heartbeat: keeps a member's session and tells it when to rejoin.
pub fn heartbeat(kafka: &Kafka, request: HeartbeatRequest) -> HeartbeatResponse {
    let error = {
        let mut groups = kafka.groups.groups.lock();
        match groups.get_mut(&request.group_id.to_string()) {
            None => Some(ResponseError::UnknownMemberId),
            Some(group) => {
                let generation = group.generation;
                let state = group.state;
                match group.member(&request.member_id) {
                    None => Some(ResponseError::UnknownMemberId),
                    Some(m) => {
                        m.last_seen = Instant::now();
                        if request.generation_id != generation {
                            Some(ResponseError::IllegalGeneration)
                        } else if state == GroupState::PreparingRebalance {
                            Some(ResponseError::RebalanceInProgress)
                        } else {
                            None
                        }
                    }
                }
            }
        }
    };
    HeartbeatResponse::default().with_error_code(error.map_or(0, |e| e.code()))
}

/// LeaveGroup: by member id (v0-2) or a list of members (v3+).
pub fn leave_group(
    kafka: &Arc<Kafka>,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let leaving: Vec<(String, Option<String>)> = if version >= 3 {
        request
            .members
            .iter()
            .map(|m| {
                (
                    m.member_id.to_string(),
                    m.group_instance_id.as_ref().map(|s| s.to_string()),
                )
            })
            .collect()
    } else {
        vec![(request.member_id.to_string(), None)]
    };
    let group_id = request.group_id.to_string();
    let mut results = Vec::with_capacity(leaving.len());
    let mut timer = None;
    {
        let mut groups = kafka.groups.groups.lock();
        let group = groups.get_mut(&group_id);
        match group {
            None => {
                for (id, instance) in &leaving {
                    results.push((
                        id.clone(),
                        instance.clone(),
                        Some(ResponseError::UnknownMemberId),
                    ));
                }
            }
            Some(group) => {
                let mut removed = false;
                for (id, instance) in &leaving {
                    let found = group
                        .members
                        .iter()
                        .find(|m| {
                            (!id.is_empty() && m.id == *id)
                                || (id.is_empty()
                                    && instance.is_some()
                                    && m.instance_id == *instance)
                        })
                        .map(|m| m.id.clone());
                    match found {
                        Some(found) => {
                            group.remove(&found, ResponseError::UnknownMemberId);
                            removed = true;
                            results.push((found, instance.clone(), None));
                        }
                        None => results.push((
                            id.clone(),
                            instance.clone(),
                            Some(ResponseError::UnknownMemberId),
                        )),
                    }
                }
                if removed {
                    if group.members.is_empty() {
                        group.generation = group.generation.wrapping_add(1).max(1);
                        group.state = GroupState::Empty;
                        group.protocol = None;
                        group.leader = None;
                    } else if group.state != GroupState::PreparingRebalance {
                        timer = Some(GroupCoordinator::prepare_rebalance(&group_id, group, false));
                    }
                    GroupCoordinator::maybe_complete_join(group);
                }
            }
        }
    }
    if let Some(timer) = timer {
        arm(kafka, timer);
    }
    if version >= 3 {
        let members = results
            .into_iter()
            .map(|(id, instance, error)| {
                MemberResponse::default()
                    .with_member_id(sb(&id))
                    .with_group_instance_id(instance.map(|i| sb(&i)))
                    .with_error_code(error.map_or(0, |e| e.code()))
            })
            .collect();
        LeaveGroupResponse::default().with_members(members)
    } else {
        let error = results.first().and_then(|r| r.2);
        LeaveGroupResponse::default().with_error_code(error.map_or(0, |e| e.code()))
    }
}

/// Removes members whose session expired, rebalancing their groups, until the listener is
/// dropped.
pub async fn expire_members(kafka: Weak<Kafka>) {
    loop {
        tokio::time::sleep(EXPIRY_CHECK).await;
        let Some(kafka) = kafka.upgrade() else { return };
        let now = Instant::now();
        let mut timers = Vec::new();
        {
            let mut groups = kafka.groups.groups.lock();
            for (group_id, group) in groups.iter_mut() {
                // A member waiting in JoinGroup or SyncGroup is not expected to heartbeat.
                let expired: Vec<String> = group
                    .members
                    .iter()
                    .filter(|m| {
                        m.join.is_none()
                            && m.sync.is_none()
                            && now.duration_since(m.last_seen) > m.session_timeout
                    })
                    .map(|m| m.id.clone())
                    .collect();
                if expired.is_empty() {
                    continue;
                }
                for id in &expired {
                    info!(group = group_id, member = id, "member session expired");
                    group.remove(id, ResponseError::UnknownMemberId);
                }
                if group.members.is_empty() {
                    group.generation = group.generation.wrapping_add(1).max(1);
                    group.state = GroupState::Empty;
                    group.protocol = None;
                    group.leader = None;
                } else {
                    if group.state != GroupState::PreparingRebalance {
                        timers.push(GroupCoordinator::prepare_rebalance(group_id, group, false));
                    }
                    GroupCoordinator::maybe_complete_join(group);
                }
            }
        }
        for timer in timers {
            arm(&kafka, timer);
        }
    }
}

/// Why a member may not commit, or `None` if it may.
fn commit_refusal(
    coordinator: &GroupCoordinator,
    group_id: &str,
    member_id: &str,
    generation: i32,
) -> Option<ResponseError> {
    let mut groups = coordinator.groups.lock();
    let Some(group) = groups.get_mut(group_id) else {
        // No live group: a manual-assignment consumer (or an admin) commits.
        return (!member_id.is_empty() && generation >= 0)
            .then_some(ResponseError::UnknownMemberId);
    };
    if generation < 0 && member_id.is_empty() {
        return (!group.members.is_empty()).then_some(ResponseError::IllegalGeneration);
    }
    let state = group.state;
    let current = group.generation;
    let Some(member) = group.member(member_id) else {
        return Some(ResponseError::UnknownMemberId);
    };
    member.last_seen = Instant::now();
    if generation != current {
        return Some(ResponseError::IllegalGeneration);
    }
    // A member may commit while the group prepares a rebalance (its revoke callback does)
    // but not between join and sync.
    (state == GroupState::CompletingRebalance).then_some(ResponseError::RebalanceInProgress)
}

/// A partition of an OffsetCommit and why it was refused, if it was.
type PartitionAnswer = (i32, Option<ResponseError>);

/// OffsetCommit: every partition of the request is committed in one durable write.
pub async fn offset_commit(kafka: &Kafka, request: OffsetCommitRequest) -> OffsetCommitResponse {
    let s = &kafka.settings;
    let group_id = request.group_id.to_string();
    let refusal = if group_id.is_empty() {
        Some(ResponseError::InvalidGroupId)
    } else {
        commit_refusal(
            &kafka.groups,
            &group_id,
            &request.member_id,
            request.generation_id_or_member_epoch,
        )
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut entries = Vec::new();
    let mut answers: Vec<(TopicName, Vec<PartitionAnswer>)> = Vec::new();
    for topic in &request.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in &topic.partitions {
            let error = refusal.or_else(|| {
                let too_long = p
                    .committed_metadata
                    .as_ref()
                    .is_some_and(|m| m.len() > MAX_METADATA_BYTES);
                too_long.then_some(ResponseError::OffsetMetadataTooLarge)
            });
            if error.is_none() {
                entries.push((
                    OffsetKey {
                        tenant: s.tenant.clone(),
                        namespace: s.namespace.clone(),
                        group: group_id.clone(),
                        topic: topic.name.to_string(),
                        partition: p.partition_index,
                    },
                    Committed {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                        commit_ms: now,
                    },
                ));
            }
            partitions.push((p.partition_index, error));
        }
        answers.push((topic.name.clone(), partitions));
    }
    let written = kafka.groups.offsets.commit(entries).await;
    if let Err(e) = &written {
        warn!(group = group_id, error = %e, "could not commit Kafka offsets");
    }
    let topics = answers
        .into_iter()
        .map(|(name, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|(index, error)| {
                    let error = error.or_else(|| {
                        written
                            .is_err()
                            .then_some(ResponseError::CoordinatorNotAvailable)
                    });
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(index)
                        .with_error_code(error.map_or(0, |e| e.code()))
                })
                .collect();
            OffsetCommitResponseTopic::default()
                .with_name(name)
                .with_partitions(partitions)
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}

/// OffsetFetch (v1-7): a group's committed offsets, for the named partitions or all.
pub async fn offset_fetch(kafka: &Kafka, request: OffsetFetchRequest) -> OffsetFetchResponse {
    let s = &kafka.settings;
    let group = request.group_id.to_string();
    let offsets = &kafka.groups.offsets;
    let entry = |partition: i32, committed: Option<Committed>| match committed {
        Some(c) => OffsetFetchResponsePartition::default()
            .with_partition_index(partition)
            .with_committed_offset(c.offset)
            .with_committed_leader_epoch(c.leader_epoch)
            .with_metadata(Some(sb(c.metadata.as_deref().unwrap_or("")))),
        None => OffsetFetchResponsePartition::default()
            .with_partition_index(partition)
            .with_committed_offset(-1)
            .with_committed_leader_epoch(-1)
            .with_metadata(Some(sb(""))),
    };
    let topics = match request.topics {
        Some(topics) => {
            let mut out = Vec::with_capacity(topics.len());
            for t in topics {
                let mut partitions = Vec::with_capacity(t.partition_indexes.len());
                for p in t.partition_indexes {
                    let key = OffsetKey {
                        tenant: s.tenant.clone(),
                        namespace: s.namespace.clone(),
                        group: group.clone(),
                        topic: t.name.to_string(),
                        partition: p,
                    };
                    partitions.push(entry(p, offsets.get(&key).await));
                }
                out.push(
                    OffsetFetchResponseTopic::default()
                        .with_name(t.name)
                        .with_partitions(partitions),
                );
            }
            out
        }
        None => {
            let mut by_topic: BTreeMap<String, Vec<OffsetFetchResponsePartition>> = BTreeMap::new();
            for (key, committed) in offsets.of_group(&s.tenant, &s.namespace, &group).await {
                by_topic
                    .entry(key.topic.clone())
                    .or_default()
                    .push(entry(key.partition, Some(committed)));
            }
            by_topic
                .into_iter()
                .map(|(name, partitions)| {
                    OffsetFetchResponseTopic::default()
                        .with_name(TopicName(sb(&name)))
                        .with_partitions(partitions)
                })
                .collect()
        }
    };
    OffsetFetchResponse::default().with_topics(topics)
}

/// FindCoordinator: this broker coordinates every group; a transaction coordinator is
/// refused (Felix has no transactions).
pub fn find_coordinator(
    kafka: &Kafka,
    request: FindCoordinatorRequest,
    version: i16,
    advertised: SocketAddr,
) -> FindCoordinatorResponse {
    let me = broker_id(kafka);
    let host = sb(&advertised.ip().to_string());
    let port = i32::from(advertised.port());
    // In a cluster every broker names the same coordinator for a group, so all its members
    // meet on one broker (whose local log keeps the group's offsets).
    let coordinator_of = |key: &str| -> (BrokerId, StrBytes, i32) {
        cluster_coordinator(kafka, key).unwrap_or((me, host.clone(), port))
    };
    // A transaction coordinator lookup is refused with an error clients treat as fatal
    // (an authorization failure), so `init_transactions()` fails at once with the message
    // instead of retrying the lookup until its timeout (librdkafka) or reporting a missing
    // group coordinator (kafkajs).
    let refusal = |key_type: i8| {
        (key_type != 0).then_some((
            ResponseError::TransactionalIdAuthorizationFailed,
            "Felix has no transactions: use an idempotent producer (enable.idempotence) \
             without a transactional.id",
        ))
    };
    if version >= 4 {
        let coordinators = request
            .coordinator_keys
            .iter()
            .map(|key| {
                let c = Coordinator::default().with_key(key.clone());
                match refusal(request.key_type) {
                    Some((error, message)) => c
                        .with_node_id((-1).into())
                        .with_port(-1)
                        .with_error_code(error.code())
                        .with_error_message(Some(StrBytes::from_static_str(message))),
                    None => {
                        let (id, host, port) = coordinator_of(key);
                        c.with_node_id(id).with_host(host).with_port(port)
                    }
                }
            })
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    match refusal(request.key_type) {
        Some((error, message)) => FindCoordinatorResponse::default()
            .with_error_code(error.code())
            .with_error_message(Some(StrBytes::from_static_str(message)))
            .with_node_id((-1).into())
            .with_port(-1),
        None => {
            let (id, host, port) = coordinator_of(&request.key);
            FindCoordinatorResponse::default()
                .with_node_id(id)
                .with_host(host)
                .with_port(port)
        }
    }
}

/// A cluster's coordinator for `key`: one of the live brokers with a Kafka listener, chosen
/// by a stable hash of the key (FNV-1a) so every broker answers the same. `None` on a
/// single node.
fn cluster_coordinator(kafka: &Kafka, key: &str) -> Option<(BrokerId, StrBytes, i32)> {
    let mut live: Vec<(u64, SocketAddr)> = kafka
        .broker
        .kafka_brokers()?
        .into_iter()
        .filter(|(_, _, alive)| *alive)
        .filter_map(|(id, addr, _)| Some((id, addr?.parse().ok()?)))
        .collect();
    if live.is_empty() {
        return None;
    }
    live.sort_by_key(|(id, _)| *id);
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let (id, addr) = live[(hash % live.len() as u64) as usize];
    Some((
        BrokerId(i32::try_from(id).ok()?),
        sb(&addr.ip().to_string()),
        i32::from(addr.port()),
    ))
}

/// ListGroups: groups with members, and groups known only by their committed offsets.
pub async fn list_groups(kafka: &Kafka, request: ListGroupsRequest) -> ListGroupsResponse {
    let s = &kafka.settings;
    let mut listed: BTreeMap<String, (String, &'static str)> = BTreeMap::new();
    for group in kafka.groups.offsets.groups(&s.tenant, &s.namespace).await {
        listed.insert(group, ("consumer".to_owned(), GroupState::Empty.name()));
    }
    {
        let groups = kafka.groups.groups.lock();
        for (id, g) in groups.iter() {
            let protocol_type = g
                .protocol_type
                .clone()
                .unwrap_or_else(|| "consumer".to_owned());
            listed.insert(id.clone(), (protocol_type, g.state.name()));
        }
    }
    let filter: Vec<String> = request
        .states_filter
        .iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    let groups = listed
        .into_iter()
        .filter(|(_, (_, state))| filter.is_empty() || filter.contains(&state.to_ascii_lowercase()))
        .map(|(id, (protocol_type, state))| {
            ListedGroup::default()
                .with_group_id(GroupId(sb(&id)))
                .with_protocol_type(sb(&protocol_type))
                .with_group_state(sb(state))
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

/// DescribeGroups: state, protocol and members of each group (`Dead` if unknown).
pub async fn describe_groups(
    kafka: &Kafka,
    request: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let s = &kafka.settings;
    let with_offsets = kafka.groups.offsets.groups(&s.tenant, &s.namespace).await;
    let groups = kafka.groups.groups.lock();
    let described = request
        .groups
        .iter()
        .map(|id| {
            let base = DescribedGroup::default().with_group_id(id.clone());
            match groups.get(&id.to_string()) {
                Some(g) => {
                    let protocol = g.protocol.clone().unwrap_or_default();
                    let members = g
                        .members
                        .iter()
                        .map(|m| {
                            DescribedGroupMember::default()
                                .with_member_id(sb(&m.id))
                                .with_group_instance_id(m.instance_id.as_deref().map(sb))
                                .with_client_id(sb(&m.client_id))
                                .with_client_host(sb(&m.client_host))
                                .with_member_metadata(m.metadata_for(&protocol))
                                .with_member_assignment(m.assignment.clone())
                        })
                        .collect();
                    base.with_group_state(sb(g.state.name()))
                        .with_protocol_type(sb(g.protocol_type.as_deref().unwrap_or("")))
                        .with_protocol_data(sb(&protocol))
                        .with_members(members)
                }
                None if with_offsets.contains(&id.to_string()) => base
                    .with_group_state(sb(GroupState::Empty.name()))
                    .with_protocol_type(sb("consumer")),
                None => base.with_group_state(sb("Dead")),
            }
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(described)
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
