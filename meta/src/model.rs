//! The control plane's replicated state and the commands that change it.
//!
//! Decides what a valid change is. Every command is validated here, inside the state
//! machine, against the state it is applied to — so a stream in an unknown namespace, a
//! second creation of the same stream or an alter against a stale version is refused the
//! same way on every node, whatever API sent it. A refused command still occupies its log
//! entry and changes nothing; its [`CommandError`] is the answer to the proposer.
//!
//! It also decides where a new shard goes ([`MetaState::spread`]) and keeps the two facts
//! failover rests on: each shard's epochs (the offset at which every leader generation
//! began) and its last replication report (the quorum mark and the replicas known to hold
//! everything below it). A leader change on a quorum stream is refused unless the new
//! leader is known to hold every acknowledged record.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Longest tenant, namespace or stream name.
pub const MAX_NAME_LEN: usize = 128;

/// How a stream keeps its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// In memory only, at most once.
    #[default]
    Ephemeral,
    /// In the log on disk, at least once.
    Durable,
}

/// How many replicas must hold a record before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    #[default]
    Leader,
    Quorum,
}

/// The settings of a stream (ARCHITECTURE.md, "Data model"). Every one can be altered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSettings {
    pub durability: Durability,
    pub consistency: Consistency,
    pub replicas: u32,
    pub shards: u32,
    pub segment_bytes: u64,
    pub segment_ms: u64,
    /// Whole stream, both tiers; `None` keeps forever.
    pub retention_ms: Option<u64>,
    pub retention_bytes: Option<u64>,
    /// Local (hot) copy only.
    pub hot_retention_ms: Option<u64>,
    pub hot_retention_bytes: Option<u64>,
    /// Upload sealed segments to the object store.
    pub tiered: bool,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            durability: Durability::Durable,
            consistency: Consistency::Leader,
            replicas: 1,
            shards: 1,
            segment_bytes: 256 * 1024 * 1024,
            segment_ms: 3_600_000,
            retention_ms: None,
            retention_bytes: None,
            hot_retention_ms: None,
            hot_retention_bytes: None,
            tiered: true,
        }
    }
}

impl StreamSettings {
    fn validate(&self) -> Result<(), CommandError> {
        let bad = |m: &str| Err(CommandError::Invalid(m.to_owned()));
        if self.shards == 0 || self.shards > 4096 {
            return bad("shards must be between 1 and 4096");
        }
        if self.replicas == 0 || self.replicas > 7 {
            return bad("replicas must be between 1 and 7");
        }
        if self.segment_bytes < 4096 {
            return bad("segment_bytes must be at least 4096");
        }
        if self.segment_ms == 0 {
            return bad("segment_ms must be positive");
        }
        if self.durability == Durability::Ephemeral && self.consistency == Consistency::Quorum {
            return bad("an ephemeral stream cannot be quorum-acknowledged");
        }
        Ok(())
    }
}

/// A partial change of stream settings: `None` leaves a setting as it is. The retention
/// settings take `Some(None)` to mean "remove the limit".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSettingsPatch {
    pub consistency: Option<Consistency>,
    pub replicas: Option<u32>,
    pub shards: Option<u32>,
    pub segment_bytes: Option<u64>,
    pub segment_ms: Option<u64>,
    pub retention_ms: Option<Option<u64>>,
    pub retention_bytes: Option<Option<u64>>,
    pub hot_retention_ms: Option<Option<u64>>,
    pub hot_retention_bytes: Option<Option<u64>>,
    pub tiered: Option<bool>,
}

impl StreamSettingsPatch {
    fn apply_to(&self, s: &StreamSettings) -> Result<StreamSettings, CommandError> {
        let mut n = s.clone();
        if let Some(v) = self.consistency {
            n.consistency = v;
        }
        if let Some(v) = self.replicas {
            n.replicas = v;
        }
        if let Some(v) = self.shards {
            if v < s.shards {
                return Err(CommandError::Invalid(
                    "shards can only grow: keys would move between shards".into(),
                ));
            }
            n.shards = v;
        }
        if let Some(v) = self.segment_bytes {
            n.segment_bytes = v;
        }
        if let Some(v) = self.segment_ms {
            n.segment_ms = v;
        }
        if let Some(v) = self.retention_ms {
            n.retention_ms = v;
        }
        if let Some(v) = self.retention_bytes {
            n.retention_bytes = v;
        }
        if let Some(v) = self.hot_retention_ms {
            n.hot_retention_ms = v;
        }
        if let Some(v) = self.hot_retention_bytes {
            n.hot_retention_bytes = v;
        }
        if let Some(v) = self.tiered {
            n.tiered = v;
        }
        n.validate()?;
        Ok(n)
    }
}

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
}

/// Identifies one shard of a stream.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ShardKey {
    pub tenant: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u32,
}

impl std::fmt::Display for ShardKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.tenant, self.namespace, self.stream, self.shard
        )
    }
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
}

/// The offset at which a leader generation began: the shard's quorum mark when the
/// generation was made. The new leader cuts its log back to `start_offset` before it
/// serves, so everything a generation wrote starts there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochStart {
    pub generation: u64,
    pub start_offset: u64,
}

impl Placement {
    /// Where generation `generation` began, if it is recorded.
    pub fn epoch_start(&self, generation: u64) -> Option<u64> {
        self.epochs
            .iter()
            .find(|e| e.generation == generation)
            .map(|e| e.start_offset)
    }

    /// Where generation `generation` ended: the start of the first later generation.
    /// `None` while no later generation exists (the generation is still current). A
    /// follower whose log was written in `generation` keeps it only below this offset.
    pub fn epoch_end(&self, generation: u64) -> Option<u64> {
        self.epochs
            .iter()
            .find(|e| e.generation > generation)
            .map(|e| e.start_offset)
    }
}

/// A shard leader's last report on its replicas (see [`Command::ReportReplicas`]).
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

/// Where a segment's records are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TierState {
    Hot,
    Uploading,
    Cold,
    Deleted,
}

/// One entry of a shard's segment manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    pub base_offset: u64,
    pub last_offset: u64,
    pub min_timestamp: i64,
    pub max_timestamp: i64,
    pub size_bytes: u64,
    pub tier: TierState,
    pub object_key: Option<String>,
    pub checksum: Option<String>,
    /// Brokers that hold a local copy.
    pub local_copies: BTreeSet<u64>,
}

/// Why a command was refused. Stable and typed, so APIs can map each to a wire error.
///
/// Adjacently tagged (`{"error": "invalid", "detail": "..."}`): a refusal travels between
/// brokers as JSON (a non-leader forwards a command and relays the answer), and serde cannot
/// write a newtype variant such as `Invalid(String)` inside an internally tagged enum. That
/// failure used to turn the refusal into an HTTP 500, which the client saw as a retryable
/// `metadata_unavailable` for a request that can never succeed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case", tag = "error", content = "detail")]
pub enum CommandError {
    #[error("{kind} {name:?} already exists")]
    AlreadyExists { kind: String, name: String },
    #[error("unknown {kind} {name:?}")]
    NotFound { kind: String, name: String },
    #[error("version conflict: expected version {expected}, current is {actual}")]
    VersionConflict { expected: u64, actual: u64 },
    #[error("{kind} {name:?} is not empty")]
    NotEmpty { kind: String, name: String },
    #[error("invalid command: {0}")]
    Invalid(String),
    /// The name belongs to a deleted stream whose objects are still being removed.
    #[error(
        "stream {name:?} was deleted and its objects are still being removed from the object \
         store; retry once that is done"
    )]
    BeingDeleted { name: String },
    /// A shard leader spoke for a generation that is no longer (or not yet) the shard's:
    /// it has been replaced and must stop serving the shard.
    #[error("shard {shard}: generation {given} is stale, the current generation is {current}")]
    StaleGeneration {
        shard: String,
        given: u64,
        current: u64,
    },
}

fn exists(kind: &str, name: impl Into<String>) -> CommandError {
    CommandError::AlreadyExists {
        kind: kind.into(),
        name: name.into(),
    }
}
fn missing(kind: &str, name: impl Into<String>) -> CommandError {
    CommandError::NotFound {
        kind: kind.into(),
        name: name.into(),
    }
}

fn check_name(kind: &str, name: &str) -> Result<(), CommandError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(CommandError::Invalid(format!(
            "{kind} name {name:?} must be 1-{MAX_NAME_LEN} characters of [A-Za-z0-9._-]"
        )))
    }
}

/// A change to the control plane's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "cmd")]
pub enum Command {
    CreateTenant {
        name: String,
    },
    DeleteTenant {
        name: String,
    },
    CreateNamespace {
        tenant: String,
        name: String,
    },
    DeleteNamespace {
        tenant: String,
        name: String,
    },
    CreateStream {
        tenant: String,
        namespace: String,
        name: String,
        settings: StreamSettings,
    },
    /// Changes settings; with `expected_version`, only if the stream is at that version.
    AlterStream {
        tenant: String,
        namespace: String,
        name: String,
        patch: StreamSettingsPatch,
        expected_version: Option<u64>,
    },
    DeleteStream {
        tenant: String,
        namespace: String,
        name: String,
    },
    /// A deleted stream's objects are gone from the object store: its name is free again.
    ObjectsDeleted {
        tenant: String,
        namespace: String,
        name: String,
    },
    RegisterBroker {
        broker: Broker,
    },
    SetBrokerAlive {
        id: u64,
        alive: bool,
    },
    /// Sets a shard's replica set and leader; a leader change bumps the generation and
    /// starts an epoch at the shard's quorum mark. On a quorum stream with acknowledged
    /// records, the new leader must be one of the in-sync replicas.
    SetPlacement {
        shard: ShardKey,
        replicas: Vec<u64>,
        leader: Option<u64>,
    },
    /// A shard leader's report of its quorum mark and in-sync replicas, for generation
    /// `generation`. Refused with [`CommandError::StaleGeneration`] unless that is the
    /// shard's current generation; refused as invalid unless `in_sync` is a majority of
    /// the replicas and includes the leader, or if `committed` would go down.
    ReportReplicas {
        shard: ShardKey,
        generation: u64,
        committed: u64,
        in_sync: BTreeSet<u64>,
    },
    /// Adds a segment to a shard's manifest (refused if it overlaps an existing entry).
    AddSegment {
        shard: ShardKey,
        segment: SegmentEntry,
    },
    /// Moves a segment to another tier, recording its object if it has one.
    SetSegmentTier {
        shard: ShardKey,
        base_offset: u64,
        tier: TierState,
        object_key: Option<String>,
        checksum: Option<String>,
    },
    SetSegmentCopies {
        shard: ShardKey,
        base_offset: u64,
        brokers: BTreeSet<u64>,
    },
    RemoveSegment {
        shard: ShardKey,
        base_offset: u64,
    },
    /// Records an uploaded object at the end of a shard's manifest. Refused unless it starts
    /// exactly where the manifest ends (or, for the first object, at or above the floor), so
    /// two uploaders racing for one range cannot both succeed and the cold tier never has a
    /// gap or an overlap.
    RecordObject {
        shard: ShardKey,
        segment: SegmentEntry,
    },
    /// Total retention: forgets every object wholly below `below` and raises the shard's
    /// floor (its earliest offset) to `below`. Answered with the removed entries, so the
    /// caller can delete their objects once this is committed.
    TrimManifest {
        shard: ShardKey,
        below: u64,
    },
    /// Reserves `count` producer ids; answered with the first.
    AllocateProducerIds {
        count: u32,
    },
    /// Finalizes a feature at a level; levels never go down.
    FinalizeFeature {
        name: String,
        level: u32,
    },
    /// Several commands in one log entry, applied in order; each has its own answer. The
    /// proposer batches commands that queue up while a Raft write is in flight.
    Batch {
        commands: Vec<Command>,
    },
}

/// The answer to one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "ok")]
pub enum Applied {
    Done,
    /// A stream's version after create or alter.
    StreamVersion {
        version: u64,
    },
    /// A shard's generation after a placement change.
    Generation {
        generation: u64,
    },
    ProducerIds {
        first: i64,
        count: u32,
    },
    Batch {
        results: Vec<Result<Applied, CommandError>>,
    },
    /// The manifest entries a `TrimManifest` removed.
    Trimmed {
        removed: Vec<SegmentEntry>,
    },
}

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
    /// ([`Command::ObjectsDeleted`]): a stream created under it would write objects under the
    /// same keys, which the removal could take. Kept here, not in a broker's memory, so a
    /// crash mid-way leaves the job for whichever broker does it next.
    #[serde(default)]
    pub deleting_objects: BTreeSet<String>,
}

/// (De)serializes a map keyed by [`ShardKey`] as a list of `[key, value]` pairs: JSON map
/// keys must be strings, and a shard key is a struct. Also reads a JSON object, the form
/// such a map took while it was always empty (a non-empty one could not be written).
pub mod shard_map {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
    use serde::ser::{SerializeSeq, Serializer};
    use serde::{Deserialize, Serialize};

    use super::ShardKey;

    pub fn serialize<S: Serializer, V: Serialize>(
        map: &BTreeMap<ShardKey, V>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(map.len()))?;
        for pair in map {
            seq.serialize_element(&pair)?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>, V: Deserialize<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<ShardKey, V>, D::Error> {
        struct Pairs<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for Pairs<V> {
            type Value = BTreeMap<ShardKey, V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of [shard, value] pairs")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut map = BTreeMap::new();
                while let Some((k, v)) = seq.next_element::<(ShardKey, V)>()? {
                    map.insert(k, v);
                }
                Ok(map)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut map = BTreeMap::new();
                while let Some((k, v)) = m.next_entry::<ShardKey, V>()? {
                    map.insert(k, v);
                }
                Ok(map)
            }
        }
        deserializer.deserialize_any(Pairs(PhantomData))
    }
}

/// How many brokers a stream's shard is placed on. A durable shard has its replica set;
/// an ephemeral shard keeps nothing to copy, so it is placed on one broker, its leader:
/// publishers and subscribers meet there, whichever broker they reached.
pub fn placed_replicas(settings: &StreamSettings) -> u32 {
    match settings.durability {
        Durability::Durable => settings.replicas,
        Durability::Ephemeral => 1,
    }
}

/// 64-bit FNV-1a: a fixed hash, so placement is the same on every node and every build
/// (std's hasher is randomly seeded).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The key of a stream in [`MetaState::streams`].
pub fn stream_key(tenant: &str, namespace: &str, name: &str) -> String {
    format!("{tenant}/{namespace}/{name}")
}

impl MetaState {
    /// Applies one command: validates it against the current state and, if valid, changes
    /// the state. A refused command leaves the state exactly as it was.
    pub fn apply(&mut self, cmd: &Command) -> Result<Applied, CommandError> {
        match cmd {
            Command::CreateTenant { name } => {
                check_name("tenant", name)?;
                if self.tenants.contains_key(name) {
                    return Err(exists("tenant", name));
                }
                self.tenants.insert(name.clone(), BTreeSet::new());
                Ok(Applied::Done)
            }
            Command::DeleteTenant { name } => {
                let ns = self
                    .tenants
                    .get(name)
                    .ok_or_else(|| missing("tenant", name))?;
                if !ns.is_empty() {
                    return Err(CommandError::NotEmpty {
                        kind: "tenant".into(),
                        name: name.clone(),
                    });
                }
                self.tenants.remove(name);
                Ok(Applied::Done)
            }
            Command::CreateNamespace { tenant, name } => {
                check_name("namespace", name)?;
                let ns = self
                    .tenants
                    .get_mut(tenant)
                    .ok_or_else(|| missing("tenant", tenant))?;
                if !ns.insert(name.clone()) {
                    return Err(exists("namespace", format!("{tenant}/{name}")));
                }
                Ok(Applied::Done)
            }
            Command::DeleteNamespace { tenant, name } => {
                let ns = self
                    .tenants
                    .get(tenant)
                    .ok_or_else(|| missing("tenant", tenant))?;
                if !ns.contains(name) {
                    return Err(missing("namespace", format!("{tenant}/{name}")));
                }
                let prefix = format!("{tenant}/{name}/");
                if self.streams.keys().any(|k| k.starts_with(&prefix)) {
                    return Err(CommandError::NotEmpty {
                        kind: "namespace".into(),
                        name: format!("{tenant}/{name}"),
                    });
                }
                if let Some(ns) = self.tenants.get_mut(tenant) {
                    ns.remove(name);
                }
                Ok(Applied::Done)
            }
            Command::CreateStream {
                tenant,
                namespace,
                name,
                settings,
            } => {
                check_name("stream", name)?;
                self.require_namespace(tenant, namespace)?;
                settings.validate()?;
                let key = stream_key(tenant, namespace, name);
                if self.streams.contains_key(&key) {
                    return Err(exists("stream", key));
                }
                if self.deleting_objects.contains(&key) {
                    return Err(CommandError::BeingDeleted { name: key });
                }
                self.stream_incarnations += 1;
                self.streams.insert(
                    key,
                    Stream {
                        tenant: tenant.clone(),
                        namespace: namespace.clone(),
                        name: name.clone(),
                        version: 1,
                        settings: settings.clone(),
                        history: Vec::new(),
                        incarnation: self.stream_incarnations,
                    },
                );
                self.place_new_shards(tenant, namespace, name, 0..settings.shards);
                Ok(Applied::StreamVersion { version: 1 })
            }
            Command::AlterStream {
                tenant,
                namespace,
                name,
                patch,
                expected_version,
            } => {
                let key = stream_key(tenant, namespace, name);
                let stream = self
                    .streams
                    .get_mut(&key)
                    .ok_or_else(|| missing("stream", &key))?;
                if let Some(expected) = expected_version
                    && *expected != stream.version
                {
                    return Err(CommandError::VersionConflict {
                        expected: *expected,
                        actual: stream.version,
                    });
                }
                let next = patch.apply_to(&stream.settings)?;
                let (old_shards, new_shards) = (stream.settings.shards, next.shards);
                let old = std::mem::replace(&mut stream.settings, next);
                stream.history.push(old);
                stream.version += 1;
                let version = stream.version;
                self.place_new_shards(tenant, namespace, name, old_shards..new_shards);
                Ok(Applied::StreamVersion { version })
            }
            Command::DeleteStream {
                tenant,
                namespace,
                name,
            } => {
                let key = stream_key(tenant, namespace, name);
                let Some(stream) = self.streams.remove(&key) else {
                    return Err(missing("stream", key));
                };
                // Only a durable stream can have written objects.
                if stream.settings.durability == Durability::Durable {
                    self.deleting_objects.insert(key);
                }
                let gone = |k: &ShardKey| {
                    k.tenant == *tenant && k.namespace == *namespace && k.stream == *name
                };
                self.placements.retain(|k, _| !gone(k));
                self.replication.retain(|k, _| !gone(k));
                self.manifests.retain(|k, _| !gone(k));
                self.manifest_floors.retain(|k, _| !gone(k));
                Ok(Applied::Done)
            }
            Command::ObjectsDeleted {
                tenant,
                namespace,
                name,
            } => {
                // Idempotent: a broker that finished after another did changes nothing.
                self.deleting_objects
                    .remove(&stream_key(tenant, namespace, name));
                Ok(Applied::Done)
            }
            Command::RegisterBroker { broker } => {
                if broker.internal_addr.is_empty() || broker.client_addr.is_empty() {
                    return Err(CommandError::Invalid(
                        "a broker needs client and internal addresses".into(),
                    ));
                }
                // Re-registration (a restart, an address change) replaces the entry.
                self.brokers.insert(broker.id, broker.clone());
                Ok(Applied::Done)
            }
            Command::SetBrokerAlive { id, alive } => {
                let b = self
                    .brokers
                    .get_mut(id)
                    .ok_or_else(|| missing("broker", id.to_string()))?;
                b.alive = *alive;
                Ok(Applied::Done)
            }
            Command::SetPlacement {
                shard,
                replicas,
                leader,
            } => {
                let stream = self
                    .streams
                    .get(&stream_key(&shard.tenant, &shard.namespace, &shard.stream))
                    .ok_or_else(|| missing("stream", shard.to_string()))?;
                if shard.shard >= stream.settings.shards {
                    return Err(missing("shard", shard.to_string()));
                }
                if replicas.is_empty() {
                    return Err(CommandError::Invalid(
                        "a shard needs at least one replica".into(),
                    ));
                }
                let distinct: BTreeSet<_> = replicas.iter().collect();
                if distinct.len() != replicas.len() {
                    return Err(CommandError::Invalid(
                        "replica set lists a broker twice".into(),
                    ));
                }
                if let Some(b) = replicas.iter().find(|b| !self.brokers.contains_key(b)) {
                    return Err(missing("broker", b.to_string()));
                }
                if let Some(l) = leader
                    && !replicas.contains(l)
                {
                    return Err(CommandError::Invalid(
                        "the leader must be one of the replicas".into(),
                    ));
                }
                let quorum = stream.settings.consistency == Consistency::Quorum;
                let current = self.placements.get(shard);
                let new_leader = leader.filter(|l| current.is_none_or(|p| p.leader != Some(*l)));
                let report = self.replication.get(shard);
                if let Some(l) = new_leader
                    && quorum
                    && let Some(r) = report
                    && r.committed > 0
                    && !r.in_sync.contains(&l)
                {
                    return Err(CommandError::Invalid(format!(
                        "broker {l} does not hold every acknowledged record of {shard} \
                         (in sync below {}: {:?})",
                        r.committed, r.in_sync
                    )));
                }
                let committed = report.map_or(0, |r| r.committed);
                let entry = self.placements.entry(shard.clone()).or_insert(Placement {
                    replicas: Vec::new(),
                    leader: None,
                    generation: 0,
                    epochs: Vec::new(),
                });
                if new_leader.is_some() {
                    entry.generation += 1;
                    entry.epochs.push(EpochStart {
                        generation: entry.generation,
                        start_offset: committed,
                    });
                }
                entry.replicas = replicas.clone();
                entry.leader = *leader;
                let generation = entry.generation;
                if let Some(r) = self.replication.get_mut(shard) {
                    match new_leader {
                        // A new generation: only its leader is known to be in sync.
                        Some(l) => {
                            r.generation = generation;
                            r.in_sync = BTreeSet::from([l]);
                        }
                        // A broker taken out of the replica set holds no copy that counts.
                        None => r.in_sync.retain(|b| replicas.contains(b)),
                    }
                }
                Ok(Applied::Generation { generation })
            }
            Command::ReportReplicas {
                shard,
                generation,
                committed,
                in_sync,
            } => {
                let placement = self
                    .placements
                    .get(shard)
                    .filter(|p| p.generation == *generation)
                    .ok_or_else(|| CommandError::StaleGeneration {
                        shard: shard.to_string(),
                        given: *generation,
                        current: self.placements.get(shard).map_or(0, |p| p.generation),
                    })?;
                let invalid = |m: String| Err(CommandError::Invalid(m));
                match placement.leader {
                    Some(l) if in_sync.contains(&l) => {}
                    Some(l) => return invalid(format!("{shard}: the leader {l} is not in sync")),
                    None => return invalid(format!("{shard} has no leader")),
                }
                if let Some(b) = in_sync.iter().find(|b| !placement.replicas.contains(b)) {
                    return invalid(format!("{shard}: broker {b} is not a replica"));
                }
                let majority = placement.replicas.len() / 2 + 1;
                if in_sync.len() < majority {
                    return invalid(format!(
                        "{shard}: {} in-sync replicas are fewer than a majority of {}",
                        in_sync.len(),
                        placement.replicas.len()
                    ));
                }
                if let Some(r) = self.replication.get(shard)
                    && *committed < r.committed
                {
                    return invalid(format!(
                        "{shard}: the quorum mark never goes down ({committed} < {})",
                        r.committed
                    ));
                }
                self.replication.insert(
                    shard.clone(),
                    Replication {
                        generation: *generation,
                        committed: *committed,
                        in_sync: in_sync.clone(),
                    },
                );
                Ok(Applied::Done)
            }
            Command::AddSegment { shard, segment } => {
                self.require_shard(shard)?;
                if segment.last_offset < segment.base_offset {
                    return Err(CommandError::Invalid(
                        "segment ends before it starts".into(),
                    ));
                }
                let manifest = self.manifests.entry(shard.clone()).or_default();
                let overlaps = manifest
                    .range(..=segment.last_offset)
                    .next_back()
                    .is_some_and(|(_, s)| s.last_offset >= segment.base_offset);
                if overlaps {
                    return Err(exists(
                        "segment",
                        format!("{shard}@{}..={}", segment.base_offset, segment.last_offset),
                    ));
                }
                manifest.insert(segment.base_offset, segment.clone());
                Ok(Applied::Done)
            }
            Command::SetSegmentTier {
                shard,
                base_offset,
                tier,
                object_key,
                checksum,
            } => {
                let seg = self.segment_mut(shard, *base_offset)?;
                if matches!(tier, TierState::Cold)
                    && object_key.is_none()
                    && seg.object_key.is_none()
                {
                    return Err(CommandError::Invalid(
                        "a cold segment needs its object key".into(),
                    ));
                }
                seg.tier = *tier;
                if object_key.is_some() {
                    seg.object_key = object_key.clone();
                }
                if checksum.is_some() {
                    seg.checksum = checksum.clone();
                }
                Ok(Applied::Done)
            }
            Command::SetSegmentCopies {
                shard,
                base_offset,
                brokers,
            } => {
                let seg = self.segment_mut(shard, *base_offset)?;
                seg.local_copies = brokers.clone();
                Ok(Applied::Done)
            }
            Command::RemoveSegment { shard, base_offset } => {
                let manifest = self
                    .manifests
                    .get_mut(shard)
                    .ok_or_else(|| missing("shard", shard.to_string()))?;
                manifest
                    .remove(base_offset)
                    .ok_or_else(|| missing("segment", format!("{shard}@{base_offset}")))?;
                Ok(Applied::Done)
            }
            Command::RecordObject { shard, segment } => {
                self.require_shard(shard)?;
                if segment.last_offset < segment.base_offset {
                    return Err(CommandError::Invalid("object ends before it starts".into()));
                }
                if segment.tier != TierState::Cold || segment.object_key.is_none() {
                    return Err(CommandError::Invalid(
                        "a recorded object is cold and has an object key".into(),
                    ));
                }
                let floor = self.manifest_floors.get(shard).copied().unwrap_or(0);
                let manifest = self.manifests.entry(shard.clone()).or_default();
                let fits = match manifest.values().next_back() {
                    Some(last) => segment.base_offset == last.last_offset + 1,
                    None => segment.base_offset >= floor,
                };
                if !fits {
                    let next = manifest
                        .values()
                        .next_back()
                        .map_or(floor, |l| l.last_offset + 1);
                    return Err(exists(
                        "object range",
                        format!(
                            "{shard}@{}..={} (the manifest continues at {next})",
                            segment.base_offset, segment.last_offset
                        ),
                    ));
                }
                manifest.insert(segment.base_offset, segment.clone());
                Ok(Applied::Done)
            }
            Command::TrimManifest { shard, below } => {
                self.require_shard(shard)?;
                let floor = self.manifest_floors.entry(shard.clone()).or_insert(0);
                *floor = (*floor).max(*below);
                let mut removed = Vec::new();
                if let Some(manifest) = self.manifests.get_mut(shard) {
                    while let Some(entry) = manifest.first_entry() {
                        if entry.get().last_offset >= *below {
                            break;
                        }
                        removed.push(entry.remove());
                    }
                }
                Ok(Applied::Trimmed { removed })
            }
            Command::AllocateProducerIds { count } => {
                if *count == 0 {
                    return Err(CommandError::Invalid(
                        "allocate at least one producer id".into(),
                    ));
                }
                let first = self.next_producer_id;
                self.next_producer_id = first
                    .checked_add(*count as i64)
                    .ok_or_else(|| CommandError::Invalid("producer ids exhausted".into()))?;
                Ok(Applied::ProducerIds {
                    first,
                    count: *count,
                })
            }
            Command::FinalizeFeature { name, level } => {
                check_name("feature", name)?;
                let current = self.features.get(name).copied().unwrap_or(0);
                if *level < current {
                    return Err(CommandError::Invalid(format!(
                        "feature {name} is finalized at level {current}; levels never go down"
                    )));
                }
                self.features.insert(name.clone(), *level);
                Ok(Applied::Done)
            }
            Command::Batch { commands } => {
                let results = commands.iter().map(|c| self.apply(c)).collect();
                Ok(Applied::Batch { results })
            }
        }
    }

    /// Where a new shard goes: `replicas` consecutive brokers of `alive` (sorted by id;
    /// fewer if there are fewer brokers), starting at a stable hash of the stream plus
    /// the shard number, so a stream's shards spread their leaders over the brokers and
    /// every node computes the same answer. The first is the leader. Empty if `alive` is.
    pub fn spread(shard: &ShardKey, replicas: u32, alive: &[u64]) -> Vec<u64> {
        let n = alive.len();
        if n == 0 {
            return Vec::new();
        }
        let mut sorted = alive.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let n = sorted.len();
        let key = stream_key(&shard.tenant, &shard.namespace, &shard.stream);
        let start =
            (fnv1a(key.as_bytes()).wrapping_add(u64::from(shard.shard)) % n as u64) as usize;
        (0..(replicas as usize).min(n))
            .map(|i| sorted[(start + i) % n])
            .collect()
    }

    /// The brokers recorded alive, by id.
    pub fn alive_brokers(&self) -> Vec<u64> {
        self.brokers
            .values()
            .filter(|b| b.alive)
            .map(|b| b.id)
            .collect()
    }

    /// Places the given shards of a stream on the live brokers (generation 1, led by the
    /// first replica). Without a live broker they stay unplaced, for the failover controller
    /// to place once one registers.
    fn place_new_shards(
        &mut self,
        tenant: &str,
        namespace: &str,
        name: &str,
        shards: std::ops::Range<u32>,
    ) {
        let Some(settings) = self
            .streams
            .get(&stream_key(tenant, namespace, name))
            .map(|s| &s.settings)
        else {
            return;
        };
        let replicas = placed_replicas(settings);
        let alive = self.alive_brokers();
        if alive.is_empty() {
            return;
        }
        for shard in shards {
            let key = ShardKey {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                stream: name.to_owned(),
                shard,
            };
            let chosen = Self::spread(&key, replicas, &alive);
            self.placements.insert(
                key,
                Placement {
                    leader: chosen.first().copied(),
                    replicas: chosen,
                    generation: 1,
                    epochs: vec![EpochStart {
                        generation: 1,
                        start_offset: 0,
                    }],
                },
            );
        }
    }

    fn require_namespace(&self, tenant: &str, namespace: &str) -> Result<(), CommandError> {
        let ns = self
            .tenants
            .get(tenant)
            .ok_or_else(|| missing("tenant", tenant))?;
        if !ns.contains(namespace) {
            return Err(missing("namespace", format!("{tenant}/{namespace}")));
        }
        Ok(())
    }

    fn require_shard(&self, shard: &ShardKey) -> Result<(), CommandError> {
        let stream = self
            .streams
            .get(&stream_key(&shard.tenant, &shard.namespace, &shard.stream))
            .ok_or_else(|| missing("stream", shard.to_string()))?;
        if shard.shard >= stream.settings.shards {
            return Err(missing("shard", shard.to_string()));
        }
        Ok(())
    }

    fn segment_mut(
        &mut self,
        shard: &ShardKey,
        base: u64,
    ) -> Result<&mut SegmentEntry, CommandError> {
        self.manifests
            .get_mut(shard)
            .and_then(|m| m.get_mut(&base))
            .ok_or_else(|| missing("segment", format!("{shard}@{base}")))
    }

    /// Whether a command changes the registry brokers keep locally (tenants, namespaces,
    /// streams, brokers, placement) rather than only manifests, producer ids or features.
    pub fn touches_registry(cmd: &Command) -> bool {
        match cmd {
            Command::AddSegment { .. }
            | Command::SetSegmentTier { .. }
            | Command::SetSegmentCopies { .. }
            | Command::RemoveSegment { .. }
            | Command::RecordObject { .. }
            | Command::TrimManifest { .. }
            | Command::ReportReplicas { .. }
            | Command::AllocateProducerIds { .. } => false,
            Command::Batch { commands } => commands.iter().any(Self::touches_registry),
            _ => true,
        }
    }
}
