//! The control plane's replicated state: what it holds, not how it changes.
//!
//! Every node holds one [`MetaState`], changed only by commands applied in log order (the
//! application is in `apply.rs` and the modules it calls). The invariant: the state is plain
//! data in `BTreeMap`s and `BTreeSet`s, so two nodes that applied the same log hold equal
//! states, and snapshots and dumps of them are the same bytes.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::names::ShardKey;
use super::settings::StreamSettings;
use super::shard_map;
use crate::auth::AuthState;

/// A stream and its settings history: `alter` adds a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stream {
    pub tenant: String,
    pub namespace: String,
    pub name: String,
    /// 1 at creation, +1 per alter.
    pub version: u64,
    pub settings: StreamSettings,
    /// Earlier versions' settings, oldest first (index 0 is version 1).
    pub history: Vec<StreamSettings>,
    /// Which stream of this name it is: unique across every stream ever created, so a
    /// stream deleted and created again under the same name is another stream, and files a
    /// broker kept of the old one can never be taken for the new one's. 0 for streams
    /// created before incarnations were recorded.
    #[serde(default)]
    pub incarnation: u64,
}

/// A registered broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Broker {
    pub id: u64,
    /// QUIC client listener.
    pub client_addr: String,
    /// Kafka listener, if any.
    pub kafka_addr: Option<String>,
    /// Internal address (Raft, replication).
    pub internal_addr: String,
    pub zone: Option<String>,
    /// Whether the broker is considered alive (set by the meta leader from lease renewals).
    pub alive: bool,
    /// Being emptied for maintenance (`felixctl broker drain`): the controller moves its
    /// replicas and leaderships to other brokers and places nothing new on it.
    #[serde(default)]
    pub draining: bool,
}

/// Who holds a shard and who leads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub replicas: Vec<u64>,
    pub leader: Option<u64>,
    /// Bumped on every leadership change; fences older leaders (the batches' partition
    /// leader epoch).
    pub generation: u64,
    /// Where each generation's log begins, oldest first; one entry per leadership change.
    /// Empty for placements made before epochs were recorded.
    #[serde(default)]
    pub epochs: Vec<EpochStart>,
    /// A move under way (see `moves.rs`): `to` is in `replicas` and catching up; `from`
    /// leaves once `to` holds everything (after a hand-over if `from` leads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<ShardMove>,
}

/// One shard's replica moving from broker `from` to broker `to`. A move from a broker to
/// itself is an addition ([`ShardMove::adds`]): `to` joins and nobody leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMove {
    pub from: u64,
    pub to: u64,
}

impl ShardMove {
    /// Whether this tops up an under-replicated shard (`Command::AddReplica`) rather than
    /// moving a replica: there is no source, so no hand-over, and its end removes nobody.
    pub fn adds(&self) -> bool {
        self.from == self.to
    }
}

/// The offset at which a leader generation began: the shard's quorum mark when the
/// generation was made. The new leader cuts its log back to `start_offset` before it
/// serves, so everything a generation wrote starts there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochStart {
    pub generation: u64,
    pub start_offset: u64,
}

/// A shard leader's last report on its replicas (see [`Command::ReportReplicas`](super::Command::ReportReplicas)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replication {
    /// The placement generation the report was made in.
    pub generation: u64,
    /// The quorum mark: one past the highest offset a majority of the replicas holds.
    /// Never decreases.
    pub committed: u64,
    /// The replicas known to hold every record below `committed` in this generation
    /// (always including the leader).
    pub in_sync: BTreeSet<u64>,
}

/// A shard's manifest entries are in felix-model, which the object tier shares.
pub use felix_model::{SegmentEntry, TierState};

/// The whole replicated state. `BTreeMap`s keep snapshots and dumps in a stable order, so
/// two nodes with the same state serialize it to the same bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    /// tenant → namespaces
    pub tenants: BTreeMap<String, BTreeSet<String>>,
    /// "tenant/namespace/stream" → stream
    pub streams: BTreeMap<String, Stream>,
    pub brokers: BTreeMap<u64, Broker>,
    #[serde(with = "shard_map")]
    pub placements: BTreeMap<ShardKey, Placement>,
    /// shard → base offset → segment
    #[serde(with = "shard_map")]
    pub manifests: BTreeMap<ShardKey, BTreeMap<u64, SegmentEntry>>,
    /// shard → its earliest offset after total retention (absent: 0).
    #[serde(default, with = "shard_map")]
    pub manifest_floors: BTreeMap<ShardKey, u64>,
    /// shard → its leader's last replication report.
    #[serde(default, with = "shard_map")]
    pub replication: BTreeMap<ShardKey, Replication>,
    pub next_producer_id: i64,
    pub features: BTreeMap<String, u32>,
    /// Streams created so far: the last [`Stream::incarnation`] handed out.
    #[serde(default)]
    pub stream_incarnations: u64,
    /// Deleted streams ("tenant/namespace/stream") whose objects may still be in the object
    /// store. The name stays reserved until a broker has removed them and said so
    /// ([`Command::ObjectsDeleted`](super::Command::ObjectsDeleted)): a stream created under it would write objects under the
    /// same keys, which the removal could take. Kept here, not in a broker's memory, so a
    /// crash mid-way leaves the job for whichever broker does it next.
    #[serde(default)]
    pub deleting_objects: BTreeSet<String>,
    /// Signing keys, roles, bindings, revoked token ids and the bootstrap admin token
    /// (`crate::auth` reads it; `auth.rs` here applies changes to it).
    #[serde(default)]
    pub auth: AuthState,
    /// "tenant/namespace/stream/group" → consumer group (`groups.rs`).
    #[serde(default)]
    pub groups: BTreeMap<String, super::groups::Group>,
    /// Groups created so far: the last [`Group::id`](super::groups::Group::id) handed out.
    #[serde(default)]
    pub group_ids: u64,
}
