//! The control plane's replicated state and the commands that change it.
//!
//! Decides what a valid change is: every command is validated inside the state machine,
//! against the state it is applied to, so a command is accepted or refused the same way on
//! every node whatever API sent it; a refused command still occupies its log entry and
//! changes nothing. It also decides where a new shard goes and keeps the two facts failover
//! rests on: each shard's epochs and its last replication report.
//!
//! * `state.rs` — what the state holds ([`MetaState`]: tenants, streams, brokers, placement,
//!   manifests, replication reports, producer ids, features).
//! * `command.rs` — the commands ([`Command`]) and their answers ([`Applied`]).
//! * `errors.rs` — why a command is refused ([`CommandError`]).
//! * `apply.rs` — applying a command: tenants, namespaces, streams, brokers, producer ids and
//!   features ([`MetaState::apply`]).
//! * `names.rs` — valid names, the stream key and the shard key ([`ShardKey`]).
//! * `settings.rs` — a stream's settings and how an alter changes them.
//! * `placement.rs` — where a new shard goes ([`MetaState::spread`]).
//! * `epochs.rs` — placement changes, leader generations and their epochs, replication
//!   reports: a leader change on a quorum stream is refused unless the new leader is known
//!   to hold every acknowledged record.
//! * `manifest.rs` — a shard's segment manifest: no gap, no overlap.
//! * `moves.rs` — shard moves: a replica added, leadership handed over at a fence, the old
//!   replica removed; draining brokers.
//! * `force.rs` — a Leader stream's shard forced onto a follower's copy when its leader is
//!   dead, the loss accepted by an operator.
//! * `auth.rs` — signing keys, roles, bindings, revocations and the bootstrap token
//!   (the state itself and the token logic are in [`crate::auth`]).
//! * `groups.rs` — consumer groups: which exist and their settings (not their progress);
//!   `apply_groups.rs` applies their commands.
//! * `zones.rs` — failure domains: replicas of a shard in distinct zones where there are
//!   enough.
//! * [`shard_map`] — the serde form of maps keyed by a shard.

mod apply;
mod apply_groups;
mod auth;
mod command;
mod epochs;
mod errors;
mod force;
mod groups;
mod manifest;
mod moves;
mod names;
mod placement;
mod settings;
pub mod shard_map;
mod state;
mod zones;

pub use command::{Applied, Command};
pub use errors::CommandError;
pub use groups::{
    Group, GroupSettings, GroupStart, MAX_ATTEMPTS, MAX_VISIBILITY_TIMEOUT_MS, group_key,
};
pub use names::{MAX_NAME_LEN, ShardKey, stream_key};
pub use placement::placed_replicas;
pub use settings::{Consistency, Durability, StreamSettings, StreamSettingsPatch};
pub use state::{
    Broker, EpochStart, MetaState, Placement, Replication, SegmentEntry, ShardMove, Stream,
    TierState,
};
pub use zones::{MAX_ZONE_LEN, check_zone};
