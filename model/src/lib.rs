//! felix-model: what the control plane (felix-meta) and the object tier (felix-cold) both
//! speak of, so that neither crate needs the other. It holds data and one trait, no logic
//! that decides anything: the rules that change these values are the control plane's
//! (`felix_meta::MetaState::apply`), and what the tier does with them is the tier's.
//!
//! * [`names`] — [`ShardKey`], how one shard of a stream is named.
//! * [`settings`] — [`StreamSettings`], a stream's settings as the control plane records
//!   them (their validation stays with the control plane).
//! * [`manifest`] — a shard's manifest ([`ManifestState`], [`SegmentEntry`]) and the calls
//!   its keeper answers ([`ManifestKeeper`]), which felix-meta's handle implements.

pub mod manifest;
pub mod names;
pub mod settings;

pub use manifest::{KeeperError, ManifestKeeper, ManifestState, Recorded, SegmentEntry, TierState};
pub use names::ShardKey;
pub use settings::{Consistency, Durability, StreamSettings};
