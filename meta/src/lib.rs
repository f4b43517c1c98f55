//! felix-meta: Felix's control plane, an openraft group.
//!
//! The replicated state ([`model::MetaState`]) holds tenants, namespaces, streams and their
//! versioned settings, brokers, shard placement and generations, the segment manifest of
//! every shard, producer-id allocation and finalized features. Commands are validated in the
//! state machine ([`model::MetaState::apply`]).
//!
//! * [`log_store`] — the Raft log, vote and purge marker in files under the data directory.
//! * [`state_machine`] — applies commands, builds and installs snapshots.
//! * [`network`] — Raft RPCs and forwarded proposals over HTTP on the internal address.
//! * [`node`] — starting a node: storage, network, membership bootstrap, wiped-volume guard.
//! * [`join`] — a new broker joining a running group as a learner, then a voter.
//! * [`handle`] — [`MetaHandle`], the API the rest of Felix uses: propose (batched),
//!   linearizable reads, a watch of the registry, membership changes, leases.
//! * [`keeper`] — the keepers of a shard's manifest for the object tier
//!   ([`felix_model::ManifestKeeper`]): the [`MetaHandle`], and [`MemoryControlPlane`] for
//!   tests.
//! * [`lease`] — shard-leader leases, granted by the meta leader.
//! * [`faults`] — cutting a node off the internal network, for cluster tests.
//! * [`controller`] — failover: on the meta leader, marks brokers whose lease lapsed dead,
//!   places unplaced shards and promotes a new shard leader when one dies.
//! * [`drain`] — the moves the controller starts itself: off draining brokers, and rolling
//!   back moves whose destination died.
//! * [`rebalance`] — the moves that even out leaders and replicas over the live brokers.

pub mod auth;
pub mod controller;
pub mod drain;
pub mod faults;
pub mod handle;
pub mod join;
pub mod keeper;
pub mod lease;
pub mod log_store;
pub mod model;
pub mod network;
pub mod node;
pub mod rebalance;
pub mod state_machine;
pub mod types;

pub use handle::{MetaError, MetaHandle};
pub use keeper::MemoryControlPlane;
pub use model::{Applied, Command, CommandError, MetaState};
pub use node::{MetaConfig, MetaNode};
pub use types::{NodeId, TypeConfig};
