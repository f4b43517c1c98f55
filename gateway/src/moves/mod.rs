//! Shard moves on a broker: the leader's side of a move, holding publishes across a
//! hand-over, and the cluster operations `felixctl` asks for.
//!
//! The control plane records each step of a move (`felix_meta::model` `moves.rs`); this
//! module makes the steps happen on the shard's leader and keeps the promise clients see
//! (the spec's "Shard Moves"): publishes are held, not refused, while nobody serves the
//! shard, and nothing acknowledged is lost.
//!
//! * [`progress`] — the per-shard state of a move on this broker (the fence, retries).
//! * [`handover`] — driven from the leader's loop: waits for the new replica to catch up,
//!   fences, hands leadership over, removes the old replica.
//! * [`hold`] — a publish that meets a fence (or a new owner still taking over) waits up
//!   to `shard_move_hold_ms`, then goes to whoever leads.
//! * [`admin`] — `Request::Cluster`: broker list, drain, undrain, move, move list.
//! * [`brokers`] — the broker list with each broker's hot bytes; removing a broker.
//! * [`force`] — a Leader stream's shard forced onto a follower when its leader is dead.
//! * [`metrics`] — moves in progress, records to catch up, hold time.
//! * [`shard_logs`] — the shard's other logs (the group journal) a move must carry too.

pub(crate) mod admin;
pub(crate) mod brokers;
pub(crate) mod force;
pub(crate) mod handover;
pub(crate) mod hold;
pub mod metrics;
pub(crate) mod progress;
pub mod shard_logs;
