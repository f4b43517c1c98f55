//! The commands that change the control plane's state, and their answers.
//!
//! Decides what can be asked of the state machine: each [`Command`] is one log entry's
//! payload (or, in a [`Command::Batch`], one of several), and each gets one answer, an
//! [`Applied`] or a [`CommandError`](super::CommandError). The invariant: commands carry no
//! clock and no randomness, only values, so applying them gives the same state on every node.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::errors::CommandError;
use super::groups::GroupSettings;
use super::names::ShardKey;
use super::settings::{StreamSettings, StreamSettingsPatch};
use super::state::{Broker, SegmentEntry, TierState};
use crate::auth::{OidcIssuer, Permission, SigningKey};

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
    /// Forgets a broker (`felixctl broker remove`): refused while it is recorded alive or any
    /// placement names it, so nothing it holds is forgotten with it.
    RemoveBroker {
        id: u64,
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
    /// Adds a signing key; every key not yet retired is retired at `retire_others_at` (a
    /// rotation). The key pair and the times are made by the proposer: commands carry no
    /// clock and no randomness. With `initial`, only if there is no key yet (the first
    /// start's key: two leaders proposing one across an election still give one key).
    AddSigningKey {
        key: SigningKey,
        retire_others_at: u64,
        #[serde(default)]
        initial: bool,
    },
    /// Creates or replaces a role (not a built-in one).
    PutRole {
        name: String,
        permissions: Vec<Permission>,
    },
    /// Deletes a role and every binding to it.
    DeleteRole {
        name: String,
    },
    /// Binds `subject` of `tenant` to a role: its tokens get the role's grants.
    BindRole {
        tenant: String,
        subject: String,
        role: String,
    },
    UnbindRole {
        tenant: String,
        subject: String,
        role: String,
    },
    /// Revokes token `jti`, which expires at `expires_at`; forgets revocations of tokens
    /// expired before `now` (the proposer's clock, carried as a value).
    RevokeToken {
        jti: String,
        expires_at: u64,
        now: u64,
    },
    /// Records the bootstrap admin token. Idempotent: only the first one is kept, so two
    /// leaders proposing one each across an election still give the cluster one token.
    SetBootstrapToken {
        jti: String,
        token: String,
    },
    /// Registers (or replaces) a trusted OIDC issuer, keyed by its `iss`.
    PutOidcIssuer {
        issuer: OidcIssuer,
    },
    /// Forgets a trusted OIDC issuer: its tokens exchange no more (Felix tokens already
    /// exchanged live out their short lifetime).
    DeleteOidcIssuer {
        issuer: String,
    },
    /// Creates a consumer group of a durable stream (see `groups.rs`).
    CreateGroup {
        tenant: String,
        namespace: String,
        stream: String,
        name: String,
        settings: GroupSettings,
        /// The proposer's clock, carried as a value.
        created_ms: i64,
    },
    /// Replaces a group's settings (a start position: where the group has not started).
    AlterGroup {
        tenant: String,
        namespace: String,
        stream: String,
        name: String,
        settings: GroupSettings,
    },
    DeleteGroup {
        tenant: String,
        namespace: String,
        stream: String,
        name: String,
    },
    /// Starts moving a shard's replica from broker `from` to broker `to`: `to` joins the
    /// replica set and catches up (see `moves.rs`). Refused while another move of the shard
    /// is under way ([`CommandError::MoveInProgress`]).
    StartMove {
        shard: ShardKey,
        from: u64,
        to: u64,
    },
    /// Tops up an under-replicated shard: `to` joins its replica set and catches up like a
    /// move's destination, and nobody leaves (recorded as a move from `to` to itself,
    /// [`ShardMove::adds`](super::ShardMove::adds)). Refused unless the shard holds fewer
    /// replicas than its stream asks for, and while another move of it is under way.
    AddReplica {
        shard: ShardKey,
        to: u64,
    },
    /// The moving leader's hand-over at its fence: `to` leads generation `generation + 1`,
    /// which starts at `end` (the fenced leader's whole log, which `to` holds).
    HandOver {
        shard: ShardKey,
        generation: u64,
        to: u64,
        end: u64,
    },
    /// Makes follower `to` lead a Leader stream's shard whose leader is dead, from the end
    /// of its own log (`end`), accepting the loss of what the old leader acknowledged past
    /// it (`felixctl shard move --force`; `force.rs`). `generation` must be current.
    ForceLeader {
        shard: ShardKey,
        generation: u64,
        to: u64,
        end: u64,
    },
    /// Ends a move: its `from` leaves the replica set (it no longer leads).
    FinishMove {
        shard: ShardKey,
        generation: u64,
    },
    /// Rolls a move back before its hand-over: its `to` leaves the replica set.
    CancelMove {
        shard: ShardKey,
    },
    /// Marks a broker draining (its shards move off, nothing new is placed on it) or not.
    SetBrokerDraining {
        id: u64,
        draining: bool,
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
