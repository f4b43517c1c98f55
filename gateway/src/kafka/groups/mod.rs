//! The Kafka group coordinator (the classic protocol): membership, rebalances and committed
//! offsets of the consumer groups of the listener's namespace.
//!
//! * `coordinator.rs` — the state machine: when a group rebalances, who leads, what each
//!   member is answered ([`GroupCoordinator`]).
//! * `membership.rs` — JoinGroup, SyncGroup, Heartbeat, LeaveGroup and session expiry.
//! * `commits.rs` — OffsetCommit and OffsetFetch: who may commit.
//! * `offset_home.rs` — where committed offsets live: each partition's group journal, on
//!   its leader (forwarded there from the coordinator).
//! * `route.rs` — the route to a partition's leader, which holds the group journal.
//! * `upgrade.rs` — offsets from before the group journals (a broker's old local log)
//!   moved into them, at start-up and on first OffsetFetch.
//! * `find.rs` — FindCoordinator: which broker coordinates a group, and whether this one
//!   does.
//! * `describe.rs` — ListGroups and DescribeGroups.
//! * `delete.rs` — DeleteGroups: a group without members and its offsets.

mod commits;
mod coordinator;
mod delete;
mod describe;
mod find;
mod membership;
mod offset_home;
mod route;
mod upgrade;

pub use commits::{offset_commit, offset_fetch};
pub use coordinator::GroupCoordinator;
pub use delete::delete_groups;
pub use describe::{describe_groups, list_groups};
pub use find::{coordinates, find_coordinator, not_coordinator};
pub use membership::{Caller, expire_members, heartbeat, join_group, leave_group, sync_group};
pub(crate) use route::on_topic;
pub(crate) use upgrade::move_old_offsets;
