//! ShareGroupHeartbeat and ShareGroupDescribe: who is in a share group, what each member
//! subscribed to, and what it is assigned.
//!
//! Decides membership and assignment. Every member is assigned every partition of every
//! topic it subscribed to that exists: records of a share partition go to whichever member
//! fetches first, one at a time, so no partition needs to be split between members. A
//! member's epoch moves when its assignment changes (a topic created, a partition added).
//! A member that sends no heartbeat for [`SESSION_TIMEOUT`] is removed; the records it
//! holds are not released early: their locks lapse and they are redelivered then (what a
//! consumer killed without `close()` gets). Subscribing creates the Felix group on the
//! topic's stream when it has none, with Kafka's share-group defaults (lock 30 s, delivery
//! limit 5, start `latest`); a group created beforehand (`felixctl group create`) keeps its
//! own settings. Membership lives on the group's coordinator only, in memory: after a
//! restart members are answered `UNKNOWN_MEMBER_ID` and join again; the records' state is
//! the groups module's, durable.
//!
//! Both are the coordinator's (FindCoordinator's broker): another broker answers
//! `NOT_COORDINATOR`, so a member never joins a second copy of the group.
//!
//! Permissions: `group.consume` on the group (Kafka's READ on the group) for a heartbeat,
//! and on each subscribed topic; any grant on the group to describe it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use felix_meta::auth::Action;
use felix_wire::groups::{GroupConfig, GroupStart};
use felix_wire::protocol::codes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::share_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member as DescribedMember,
    TopicPartitions as DescribedPartitions,
};
use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{
    GroupId, ShareGroupDescribeRequest, ShareGroupDescribeResponse, ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse, TopicName,
};
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};
use uuid::Uuid;

use super::{DEFAULT_DELIVERY_COUNT_LIMIT, DEFAULT_LOCK_DURATION_MS, sb};
use crate::kafka::Kafka;
use crate::kafka::errors::kafka_error;
use crate::kafka::groups::{Caller, coordinates, not_coordinator};
use crate::kafka::scope::{On, Scope};
use crate::kafka::topics::{resolve, topic_id};

/// How often members are asked to heartbeat.
const HEARTBEAT_INTERVAL_MS: i32 = 5_000;
/// A member silent this long is removed (Kafka's `group.share.session.timeout.ms`).
const SESSION_TIMEOUT: Duration = Duration::from_secs(45);
/// Most members one share group holds (Kafka's `group.share.max.size` default).
const MAX_MEMBERS: usize = 200;
/// Longest a join waits for an offset change of its group, or an offset change for the
/// joins under way, before it is refused as retriable.
const GATE_WAIT: Duration = Duration::from_secs(10);

/// One member's assignment: (topic id, topic name, partitions).
type Assigned = Vec<(Uuid, String, Vec<i32>)>;

struct Member {
    epoch: i32,
    topics: Vec<String>,
    assigned: Assigned,
    client_id: String,
    host: String,
    rack: Option<String>,
    seen: Instant,
}

#[derive(Default)]
struct ShareGroup {
    epoch: i32,
    members: BTreeMap<String, Member>,
}

/// The share groups this broker coordinates: group key (`tenant/namespace/group`) → members.
#[derive(Default)]
pub(crate) struct ShareMembers {
    groups: parking_lot::Mutex<HashMap<String, ShareGroup>>,
    /// Makes the ids of members that did not bring one.
    next_id: AtomicU64,
    /// Each group's gate between joins and offset changes (`reset.rs`): a join holds it
    /// shared from before it looks at the group until its member is in, an offset change
    /// holds it alone from its emptiness check until its change is made, so no member
    /// joins in between (on Kafka the two are one coordinator step). Kept while someone
    /// holds or waits for it.
    gates: parking_lot::Mutex<HashMap<String, Weak<RwLock<()>>>>,
}

/// While held, no member joins the group: what an offset change holds.
pub(super) type JoinsHeld = OwnedRwLockWriteGuard<()>;
/// While held, no offset change of the group starts: what a join holds.
pub(super) type Joining = OwnedRwLockReadGuard<()>;

impl ShareMembers {
    /// How many members the group `key` (`tenant/namespace/group`) has here.
    fn members(&self, key: &str) -> usize {
        self.expire(Instant::now());
        self.groups.lock().get(key).map_or(0, |g| g.members.len())
    }

    fn gate(&self, key: &str) -> Arc<RwLock<()>> {
        let mut gates = self.gates.lock();
        if let Some(gate) = gates.get(key).and_then(Weak::upgrade) {
            return gate;
        }
        gates.retain(|_, g| g.strong_count() > 0);
        let gate = Arc::new(RwLock::new(()));
        gates.insert(key.to_owned(), Arc::downgrade(&gate));
        gate
    }

    /// Holds off joins of the group `key` once those under way are in, and counts its
    /// members then: an offset change checks that the group is empty with this count and
    /// makes its change before dropping the guard. `None`: joins did not finish within
    /// [`GATE_WAIT`].
    pub(super) async fn hold_joins(&self, key: &str) -> Option<(JoinsHeld, usize)> {
        let gate = self.gate(key);
        let held = tokio::time::timeout(GATE_WAIT, gate.write_owned())
            .await
            .ok()?;
        Some((held, self.members(key)))
    }

    /// Waits while an offset change of the group `key` is under way; a join holds the
    /// guard until its member is in the group. `None`: the change did not finish within
    /// [`GATE_WAIT`].
    async fn join(&self, key: &str) -> Option<Joining> {
        let gate = self.gate(key);
        tokio::time::timeout(GATE_WAIT, gate.read_owned())
            .await
            .ok()
    }

    /// Removes members silent for [`SESSION_TIMEOUT`], and groups left empty.
    fn expire(&self, now: Instant) {
        let mut groups = self.groups.lock();
        for g in groups.values_mut() {
            let before = g.members.len();
            g.members
                .retain(|_, m| now.duration_since(m.seen) < SESSION_TIMEOUT);
            if g.members.len() != before {
                g.epoch += 1;
            }
        }
        groups.retain(|_, g| !g.members.is_empty());
    }
}

/// Removes silent members every few seconds, until the listener is dropped.
pub(crate) async fn expire_members(kafka: Weak<Kafka>) {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let Some(kafka) = kafka.upgrade() else {
            return;
        };
        kafka.share_members.expire(Instant::now());
    }
}

fn refused(error: ResponseError, message: String) -> ShareGroupHeartbeatResponse {
    ShareGroupHeartbeatResponse::default()
        .with_error_code(error.code())
        .with_error_message(Some(sb(&message)))
}

/// ShareGroupHeartbeat: joins (epoch 0), heartbeats, or leaves (epoch -1) a share group.
pub async fn share_group_heartbeat(
    kafka: &Kafka,
    scope: &Scope,
    request: ShareGroupHeartbeatRequest,
    caller: Caller<'_>,
) -> ShareGroupHeartbeatResponse {
    let group = request.group_id.to_string();
    if group.is_empty() {
        return refused(ResponseError::InvalidGroupId, "empty group id".into());
    }
    if let Err(e) = scope.allow(kafka, Action::GroupConsume, &group, On::Group) {
        return refused(e, format!("not allowed to consume as share group {group}"));
    }
    if !coordinates(kafka, &group) {
        let (e, m) = not_coordinator(&group);
        return refused(e, m);
    }
    let key = scope.group_key(&group);
    let epoch = request.member_epoch;
    let mut member_id = request.member_id.to_string();
    if epoch == -1 {
        let mut groups = kafka.share_members.groups.lock();
        if let Some(g) = groups.get_mut(&key)
            && g.members.remove(&member_id).is_some()
        {
            g.epoch += 1;
        }
        return ShareGroupHeartbeatResponse::default()
            .with_member_id(Some(sb(&member_id)))
            .with_member_epoch(-1);
    }
    if epoch < 0 {
        return refused(
            ResponseError::InvalidRequest,
            format!("member epoch {epoch}: 0 joins, -1 leaves"),
        );
    }
    // A joining member waits out an offset change of the group, and holds off the next
    // one until it is in.
    let _joining = match epoch {
        0 => match kafka.share_members.join(&key).await {
            Some(joining) => Some(joining),
            None => {
                return refused(
                    ResponseError::CoordinatorLoadInProgress,
                    format!("share group {group}'s offsets are being changed: join again"),
                );
            }
        },
        _ => None,
    };
    if epoch == 0 && member_id.is_empty() {
        let n = kafka.share_members.next_id.fetch_add(1, Ordering::Relaxed);
        member_id = format!("felix-{}-{n}", crate::groups::now_ms());
    }
    if member_id.is_empty() || member_id.len() > crate::groups::poll::MAX_CONSUMER_LEN {
        return refused(
            ResponseError::InvalidRequest,
            format!(
                "a member id is 1-{} bytes",
                crate::groups::poll::MAX_CONSUMER_LEN
            ),
        );
    }
    // The subscription this heartbeat stands for: the one sent, else the one known.
    let topics = match &request.subscribed_topic_names {
        Some(names) => names.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
        None => {
            let groups = kafka.share_members.groups.lock();
            match groups.get(&key).and_then(|g| g.members.get(&member_id)) {
                Some(m) => m.topics.clone(),
                None if epoch == 0 => {
                    return refused(
                        ResponseError::InvalidRequest,
                        "a joining member names its subscribed topics".into(),
                    );
                }
                None => {
                    return refused(
                        ResponseError::UnknownMemberId,
                        format!("member {member_id} is not in share group {group}: join again"),
                    );
                }
            }
        }
    };
    let assigned = match assignment(kafka, scope, &group, &topics).await {
        Ok(a) => a,
        Err((error, message)) => return refused(error, message),
    };
    let mut groups = kafka.share_members.groups.lock();
    let g = groups.entry(key).or_default();
    let known = g.members.contains_key(&member_id);
    if !known && epoch != 0 {
        return refused(
            ResponseError::UnknownMemberId,
            format!("member {member_id} is not in share group {group}: join again"),
        );
    }
    if !known && g.members.len() >= MAX_MEMBERS {
        return refused(
            ResponseError::GroupMaxSizeReached,
            format!("share group {group} has {MAX_MEMBERS} members, its most"),
        );
    }
    let group_epoch = g.epoch;
    let m = g
        .members
        .entry(member_id.clone())
        .or_insert_with(|| Member {
            epoch: 0,
            topics: Vec::new(),
            assigned: Vec::new(),
            client_id: caller.client_id.to_owned(),
            host: caller.host.to_owned(),
            rack: None,
            seen: Instant::now(),
        });
    m.seen = Instant::now();
    m.topics = topics;
    m.rack = request.rack_id.as_ref().map(|r| r.to_string());
    let changed = m.epoch == 0 || m.assigned != assigned;
    if changed {
        m.assigned = assigned;
        m.epoch = group_epoch + 1;
    }
    let member_epoch = m.epoch;
    let answer = Assignment::default().with_topic_partitions(
        m.assigned
            .iter()
            .map(|(id, _, partitions)| {
                TopicPartitions::default()
                    .with_topic_id(*id)
                    .with_partitions(partitions.clone())
            })
            .collect(),
    );
    if changed {
        g.epoch = member_epoch;
    }
    ShareGroupHeartbeatResponse::default()
        .with_member_id(Some(sb(&member_id)))
        .with_member_epoch(member_epoch)
        .with_heartbeat_interval_ms(HEARTBEAT_INTERVAL_MS)
        .with_assignment(Some(answer))
}

/// Every partition of every subscribed topic that exists, its Felix group created if it
/// has none. A topic not yet created is left out (assigned once it exists).
async fn assignment(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    topics: &[String],
) -> Result<Assigned, (ResponseError, String)> {
    let mut out = Vec::new();
    for topic in topics {
        scope
            .allow(kafka, Action::GroupConsume, topic, On::Topic)
            .map_err(|e| {
                (
                    e,
                    format!("not allowed to consume topic {topic} as a group"),
                )
            })?;
        let Ok(shape) = resolve(kafka, scope, topic, false).await else {
            continue;
        };
        ensure_group(kafka, scope, topic, group).await?;
        let id = topic_id(&scope.tenant, &scope.namespace, topic);
        out.push((id, topic.clone(), (0..shape.shards as i32).collect()));
    }
    out.sort();
    Ok(out)
}

/// Creates the Felix group `group` on the stream behind `topic` unless it exists.
pub(super) async fn ensure_group(
    kafka: &Kafka,
    scope: &Scope,
    topic: &str,
    group: &str,
) -> Result<(), (ResponseError, String)> {
    let (t, n) = (&scope.tenant, &scope.namespace);
    match kafka.broker.group(t, n, topic, group) {
        Ok(_) => return Ok(()),
        Err(e) if e.code == codes::UNKNOWN_GROUP => {}
        Err(e) => return Err((kafka_error(&e), e.message)),
    }
    let config = GroupConfig {
        visibility_timeout_ms: Some(DEFAULT_LOCK_DURATION_MS),
        max_attempts: Some(DEFAULT_DELIVERY_COUNT_LIMIT),
        dead_letter: None,
        start: Some(GroupStart::Latest),
    };
    match kafka.broker.create_group(t, n, topic, group, config).await {
        Ok(_) => Ok(()),
        // Created by another member meanwhile.
        Err(e) if e.code == codes::ALREADY_EXISTS => Ok(()),
        // A stream of several replicas in a cluster (no group there yet), or a group name
        // Felix refuses: the message says which.
        Err(e) if e.code == codes::INVALID_ARGUMENT => Err((
            if e.reason == "groups_not_replicated" {
                ResponseError::InvalidRequest
            } else {
                ResponseError::InvalidGroupId
            },
            format!("share group {group} on topic {topic}: {}", e.message),
        )),
        Err(e) => Err((kafka_error(&e), e.message)),
    }
}

/// ShareGroupDescribe: the members this coordinator knows, their subscriptions and
/// assignments. A group with no member here is `GROUP_ID_NOT_FOUND`.
pub async fn share_group_describe(
    kafka: &Kafka,
    scope: &Scope,
    request: ShareGroupDescribeRequest,
) -> ShareGroupDescribeResponse {
    kafka.share_members.expire(Instant::now());
    let groups = request
        .group_ids
        .into_iter()
        .map(|id| describe_one(kafka, scope, id))
        .collect();
    ShareGroupDescribeResponse::default().with_groups(groups)
}

fn describe_one(kafka: &Kafka, scope: &Scope, id: GroupId) -> DescribedGroup {
    let base = DescribedGroup::default()
        .with_group_id(id.clone())
        .with_authorized_operations(i32::MIN);
    if let Err(e) = scope.allow_view(kafka, &id, On::Group) {
        return base.with_error_code(e.code());
    }
    if !coordinates(kafka, &id) {
        let (e, m) = not_coordinator(&id);
        return base
            .with_error_code(e.code())
            .with_error_message(Some(sb(&m)));
    }
    let groups = kafka.share_members.groups.lock();
    let Some(g) = groups.get(&scope.group_key(&id)) else {
        return base
            .with_error_code(ResponseError::GroupIdNotFound.code())
            .with_error_message(Some(sb(&format!("no share group {} here", &*id))));
    };
    let members = g
        .members
        .iter()
        .map(|(member_id, m)| {
            let partitions = m
                .assigned
                .iter()
                .map(|(topic_id, name, partitions)| {
                    DescribedPartitions::default()
                        .with_topic_id(*topic_id)
                        .with_topic_name(TopicName(sb(name)))
                        .with_partitions(partitions.clone())
                })
                .collect();
            DescribedMember::default()
                .with_member_id(sb(member_id))
                .with_rack_id(m.rack.as_deref().map(sb))
                .with_member_epoch(m.epoch)
                .with_client_id(sb(&m.client_id))
                .with_client_host(sb(&m.host))
                .with_subscribed_topic_names(m.topics.iter().map(|t| TopicName(sb(t))).collect())
                .with_assignment(DescribedAssignment::default().with_topic_partitions(partitions))
        })
        .collect();
    base.with_group_state(sb(if g.members.is_empty() {
        "Empty"
    } else {
        "Stable"
    }))
    .with_group_epoch(g.epoch)
    .with_assignment_epoch(g.epoch)
    .with_assignor_name(sb("simple"))
    .with_members(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(members: &ShareMembers, key: &str, id: &str) {
        let mut groups = members.groups.lock();
        groups.entry(key.to_owned()).or_default().members.insert(
            id.to_owned(),
            Member {
                epoch: 1,
                topics: vec!["t".into()],
                assigned: Vec::new(),
                client_id: "c".into(),
                host: "h".into(),
                rack: None,
                seen: Instant::now(),
            },
        );
    }

    /// An offset change's emptiness check and its change are one step for membership: a
    /// join waits until the change is made, and a change started while a member joins
    /// waits for it and then counts it.
    #[tokio::test]
    async fn joins_and_offset_changes_of_a_group_take_turns() {
        let members = ShareMembers::default();
        let (change, count) = members.hold_joins("t/n/g").await.expect("no joins");
        assert_eq!(count, 0);
        let mut join = Box::pin(members.join("t/n/g"));
        assert!(
            futures::poll!(&mut join).is_pending(),
            "a join must wait while an offset change holds the group"
        );
        // Another group's joins are not held.
        assert!(members.join("t/n/other").await.is_some());
        drop(change);
        let joining = join.await.expect("the change is over");
        let mut change = Box::pin(members.hold_joins("t/n/g"));
        assert!(
            futures::poll!(&mut change).is_pending(),
            "an offset change must wait for a join under way"
        );
        admit(&members, "t/n/g", "m1");
        drop(joining);
        let (_held, count) = change.await.expect("the join is over");
        assert_eq!(count, 1, "the change sees the member that joined");
    }
}
