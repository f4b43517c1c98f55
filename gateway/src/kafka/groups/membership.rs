//! The requests that move a member through a group's rounds: JoinGroup, SyncGroup,
//! Heartbeat and LeaveGroup, and the expiry of sessions that stopped heartbeating.
//!
//! Decides who may join (a valid session timeout, a protocol every member supports), how a
//! static member coming back replaces its previous incarnation, and when a member is gone.
//! The invariant: each request changes the group under the coordinator's lock and only then
//! waits (for the round's answer, within a bound) or arms a rebalance timer; a member
//! waiting in JoinGroup or SyncGroup is not expected to heartbeat and never expires. Each
//! request needs `group.consume` on the group, checked before anything else, then that this
//! broker coordinates the group (`NOT_COORDINATOR` otherwise, so no second copy of a group's
//! membership lives on another broker); a group is kept under its scope's key
//! ([`Scope::group_key`]), so tenants never share one.
//!
//! Membership lives in memory: after a broker restart the consumers rejoin (their member
//! ids are unknown, so they get fresh ones) and resume from the committed offsets, which
//! are durable and replicated with the partitions (`offset_home.rs`); so do they on another
//! broker when the coordinator's is lost.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, SyncGroupRequest, SyncGroupResponse,
};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::info;

use super::coordinator::{
    Group, GroupCoordinator, GroupState, INITIAL_REBALANCE_DELAY, Member, arm, sb,
};
use super::find::coordinates;
use crate::kafka::Kafka;
use crate::kafka::scope::{On, Scope};
use felix_meta::auth::Action;

/// Session timeouts a member may ask for (Kafka's defaults are 6 s to 30 min; a lower
/// floor lets tests detect a dead consumer sooner).
const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(1000);
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(1800);
/// How often sessions are checked for expiry.
const EXPIRY_CHECK: Duration = Duration::from_millis(500);

/// Who is asking, as DescribeGroups reports members.
pub struct Caller<'a> {
    pub client_id: &'a str,
    pub host: &'a str,
}

/// JoinGroup.
pub async fn join_group(
    kafka: &Arc<Kafka>,
    scope: &Scope,
    request: JoinGroupRequest,
    caller: Caller<'_>,
) -> JoinGroupResponse {
    let fail = |error: ResponseError, member_id: &str| {
        JoinGroupResponse::default()
            .with_error_code(error.code())
            .with_member_id(sb(member_id))
    };
    if request.group_id.is_empty() {
        return fail(ResponseError::InvalidGroupId, &request.member_id);
    }
    if let Err(error) = scope.allow(kafka, Action::GroupConsume, &request.group_id, On::Group) {
        return fail(error, &request.member_id);
    }
    if !coordinates(kafka, &request.group_id) {
        return fail(ResponseError::NotCoordinator, &request.member_id);
    }
    let group_id = scope.group_key(&request.group_id);
    let session_timeout = Duration::from_millis(request.session_timeout_ms.max(0) as u64);
    // v0 has no rebalance timeout: it is the session timeout.
    let rebalance_timeout = match request.rebalance_timeout_ms {
        n if n > 0 => Duration::from_millis(n as u64),
        _ => session_timeout,
    };
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
pub async fn sync_group(
    kafka: &Arc<Kafka>,
    scope: &Scope,
    request: SyncGroupRequest,
) -> SyncGroupResponse {
    let fail = |error: ResponseError| SyncGroupResponse::default().with_error_code(error.code());
    if let Err(error) = scope.allow(kafka, Action::GroupConsume, &request.group_id, On::Group) {
        return fail(error);
    }
    if !coordinates(kafka, &request.group_id) {
        return fail(ResponseError::NotCoordinator);
    }
    let group_id = scope.group_key(&request.group_id);
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
pub fn heartbeat(kafka: &Kafka, scope: &Scope, request: HeartbeatRequest) -> HeartbeatResponse {
    if let Err(error) = scope.allow(kafka, Action::GroupConsume, &request.group_id, On::Group) {
        return HeartbeatResponse::default().with_error_code(error.code());
    }
    if !coordinates(kafka, &request.group_id) {
        return HeartbeatResponse::default().with_error_code(ResponseError::NotCoordinator.code());
    }
    let error = {
        let mut groups = kafka.groups.groups.lock();
        match groups.get_mut(&scope.group_key(&request.group_id)) {
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
    scope: &Scope,
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
    if let Err(error) = scope.allow(kafka, Action::GroupConsume, &request.group_id, On::Group) {
        return LeaveGroupResponse::default().with_error_code(error.code());
    }
    if !coordinates(kafka, &request.group_id) {
        return LeaveGroupResponse::default().with_error_code(ResponseError::NotCoordinator.code());
    }
    let group_id = scope.group_key(&request.group_id);
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
