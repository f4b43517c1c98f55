//! Kafka share groups (KIP-932) over Felix's consumer groups (docs/kafka.md, "Share
//! groups").
//!
//! Decides how a share group maps onto Felix: a Kafka share group `g` consuming topic `t`
//! *is* the Felix consumer group `g` on the stream behind `t` (one state for both faces). A
//! record acquired by a share consumer is a record claimed by the consumer named by its
//! member id; the acquisition lock is the group's visibility timeout, the delivery count is
//! the attempt number, the delivery-count limit is `max_attempts`; ACCEPT is an ack,
//! RELEASE a nack without delay, REJECT a dead letter now. The group's progress and its
//! invariants are the groups module's ([`crate::groups`]); nothing here keeps a record's
//! state, only what a Kafka client needs beside it:
//!
//! * `membership.rs` — ShareGroupHeartbeat and ShareGroupDescribe: members, their
//!   subscriptions and assignments (every partition of every subscribed topic to every
//!   member: a share partition is consumed by many), kept by the group's coordinator.
//! * `session.rs` — share sessions: the partitions a member fetches from this broker, the
//!   session epoch, and which attempt of each record this member holds here (Kafka names
//!   a record by offset alone, Felix's answers by offset and attempt).
//! * `acknowledge.rs` — acknowledgement batches (piggy-backed on ShareFetch, or in
//!   ShareAcknowledge) applied as Felix answers.
//! * `fetch.rs` — ShareFetch: acknowledgements, then claims, long-polled.
//! * `configs.rs` — a share group's configs (lock, delivery limit, start, dead letters)
//!   through AlterConfigs on the group resource.
//! * `offsets.rs` — DescribeShareGroupOffsets: the group's position on each partition.
//! * `reset.rs` — AlterShareGroupOffsets and DeleteShareGroupOffsets: an admin moving or
//!   forgetting those positions while the group has no members.
//!
//! The invariant: a share consumer's request changes a record's state only through the
//! groups module's operations (poll, ack, nack, reject), so every promise of
//! docs/groups.md (claims journaled before they are handed out, answers journaled before
//! they are answered, dead letters once) holds for Kafka clients too.

mod acknowledge;
mod configs;
mod fetch;
mod membership;
mod offsets;
mod reset;
mod session;

pub use acknowledge::share_acknowledge;
pub(crate) use configs::{GROUP_RESOURCES, alter_share_group};
pub use fetch::share_fetch;
pub(crate) use membership::{ShareMembers, expire_members};
pub use membership::{share_group_describe, share_group_heartbeat};
pub use offsets::describe_share_group_offsets;
pub use reset::{alter_share_group_offsets, delete_share_group_offsets};
pub(crate) use session::ShareSessions;

use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::Kafka;
use super::scope::Scope;
use super::topics::{durable_topics, topic_id};

/// The acquisition lock of a share group Felix creates (Kafka's
/// `group.share.record.lock.duration.ms` default).
pub const DEFAULT_LOCK_DURATION_MS: u64 = 30_000;
/// The delivery-count limit of a share group Felix creates (Kafka's
/// `group.share.delivery.count.limit` default).
pub const DEFAULT_DELIVERY_COUNT_LIMIT: u32 = 5;

/// The durable topic of `scope` whose id is `id`: its name and partition count.
pub(super) fn topic_by_id(kafka: &Kafka, scope: &Scope, id: Uuid) -> Option<(String, u32)> {
    durable_topics(kafka, scope)
        .into_iter()
        .find(|(name, _)| topic_id(&scope.tenant, &scope.namespace, name) == id)
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}
