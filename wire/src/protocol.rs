//! The QUIC client protocol: how a client and a broker talk. No I/O here — a frame codec and
//! the typed messages; docs/protocol.md describes the same thing for other implementations.
//!
//! Streams: the client opens one bidirectional QUIC stream per request. It writes one
//! request frame and finishes its side; the broker answers with one response frame — or,
//! for a subscription, with `SubscribeOk` followed by `Event` frames until the subscription
//! ends. The first request of a connection must be `Hello`.
//!
//! Frame (`frame.rs`): `[len u32 BE][kind u8][header_len u32 BE][header][body: bytes]`,
//! where `len` counts everything after itself. The header is small and typed: JSON of the
//! types here, or, for the cache's key operations on a connection that agreed to
//! `features::BINARY_CACHE_HEADERS`, a binary one (`binary.rs`); the body carries record
//! batches exactly as felix-wire stores them (Kafka RecordBatch v2), never re-encoded.

use serde::{Deserialize, Serialize};

pub use crate::frame::{DEFAULT_MAX_FRAME, FRAME_PREFIX, Frame, FrameError, FrameKind, MAX_HEADER};
pub use crate::oidc::OidcIssuerSpec;

/// ALPN of the protocol.
pub const ALPN: &[u8] = b"felix/1";
/// The protocol version a Hello announces.
pub const PROTOCOL_VERSION: u16 = 1;
/// Feature bits negotiated in Hello: the broker answers with the intersection.
pub mod features {
    /// A durable subscription that drops ends with `subscription_lagged` and the offset to
    /// resume from, instead of silently skipping.
    pub const SUBSCRIPTION_LAGGED: u64 = 1 << 0;
    /// Idempotent producers: `ProducerInit` and sequenced publishes.
    pub const IDEMPOTENT_PRODUCER: u64 = 1 << 1;
    /// Reused request streams: after answering a cache operation (any but a watch) the
    /// broker keeps the stream open and reads the client's next request frame from it,
    /// answering each in turn, instead of ending the stream after one answer.
    pub const REUSED_STREAMS: u64 = 1 << 2;
    /// Compact binary headers for the cache's key operations and their answers
    /// (`crate::binary`): a client that agreed may send them, and the broker answers such a
    /// request in binary when the answer has a binary form. JSON headers stay valid.
    pub const BINARY_CACHE_HEADERS: u64 = 1 << 3;
    /// Compact binary headers for group polls, acks, nacks and extends and their answers
    /// (`crate::binary_groups`), on the same terms as `BINARY_CACHE_HEADERS`.
    pub const BINARY_GROUP_HEADERS: u64 = 1 << 4;
    /// Every feature this build implements.
    pub const ALL: u64 = SUBSCRIPTION_LAGGED
        | IDEMPOTENT_PRODUCER
        | REUSED_STREAMS
        | BINARY_CACHE_HEADERS
        | BINARY_GROUP_HEADERS;
}

/// Where a subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartAt {
    Earliest,
    Latest,
    Offset(u64),
    /// Milliseconds since the Unix epoch: the first record at or after it.
    Timestamp(i64),
}

/// When the broker acknowledges a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AckMode {
    /// Fire and forget: the broker answers `done` without offsets, and refusals are counted
    /// at the broker (`felix_publish_errors_total`), not reported. A client need not wait.
    None,
    /// One answer for the request's batch (the default): after the write under the fsync
    /// policy, or on enqueue on a broker started with `ack_on_commit: false`.
    #[default]
    Batch,
    /// Like `Batch`, but always after the write, whatever the broker's `ack_on_commit`
    /// (a client's `ack_on_commit: true` sends this).
    Commit,
}

impl AckMode {
    /// The delivery-semantics spec's name for [`AckMode::Batch`]: one answer per batch.
    #[allow(non_upper_case_globals)]
    pub const PerBatch: AckMode = AckMode::Batch;
}

/// Stream settings as the protocol carries them: every field optional, so the same shape
/// creates (unset = the broker's default) and alters (unset = unchanged). `retention_*`
/// take `0` to mean "no limit"; `hot_retention_*` take `0` to mean "keep no uploaded segment
/// locally" and `u64::MAX` to mean "no limit".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durable: Option<bool>,
    /// `leader` or `quorum`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consistency: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hot_retention_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hot_retention_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tiered: Option<bool>,
}

/// A stream as the broker describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamInfo {
    pub tenant: String,
    pub namespace: String,
    pub name: String,
    pub version: u64,
    /// Every setting, filled in.
    pub config: StreamConfig,
    /// Per shard: first and next offset (durable streams on this broker).
    #[serde(default)]
    pub shards: Vec<ShardInfo>,
    /// Cold-cache lookups (footers and row groups, the broker's whole cache) served
    /// without a GET, and those that needed one, since the broker started.
    #[serde(default)]
    pub cache_hits: u64,
    #[serde(default)]
    pub cache_misses: u64,
}

/// A shard's offsets and tiers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub shard: u32,
    /// The earliest offset a reader can get, in either tier.
    pub first_offset: u64,
    pub next_offset: u64,
    /// The first offset on this broker's local disk.
    #[serde(default)]
    pub hot_first_offset: u64,
    /// Bytes of local segments.
    #[serde(default)]
    pub hot_bytes: u64,
    /// Bytes of recorded objects.
    #[serde(default)]
    pub cold_bytes: u64,
    /// One past the last offset covered by recorded objects.
    #[serde(default)]
    pub uploaded_end: u64,
    /// Sealed segments (and their bytes) not yet covered by objects.
    #[serde(default)]
    pub upload_backlog_segments: u64,
    #[serde(default)]
    pub upload_backlog_bytes: u64,
}

/// One segment or object of a shard, as `felixctl segments` lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentInfo {
    pub shard: u32,
    pub base_offset: u64,
    pub last_offset: u64,
    pub min_timestamp: i64,
    pub max_timestamp: i64,
    pub size_bytes: u64,
    /// `hot` (local, not yet covered by objects), `uploading` (sealed, next in line),
    /// or `cold` (a recorded object; a local copy may still exist).
    pub tier: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_key: Option<String>,
    /// Whether this broker still holds the records locally.
    #[serde(default)]
    pub local: bool,
}

/// A request: the header of a `Request` frame. Only `Publish` has a body (its batches).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    Hello {
        version: u16,
        features: u64,
        #[serde(default)]
        client: String,
        /// A Felix token (docs/security.md). Required, here or by `Authenticate`, before any
        /// other request when the broker runs with auth on; ignored with auth off.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
    },
    /// Presents a (fresh) token on a live connection: it replaces the connection's token
    /// for every later request. Answered `Done`, or `unauthorized` (and the connection keeps
    /// the token it had).
    Authenticate {
        token: String,
    },
    /// Mints a token for `tenant` (needs `rbac.manage` on the tenant). With neither `roles`
    /// nor `allow`, the token gets the built-in `tenant-admin` role. Answered `Token`.
    MintToken {
        tenant: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subject: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        roles: Vec<String>,
        /// `action:pattern` grants.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        allow: Vec<String>,
        /// Lifetime in seconds (default one hour, at most 90 days).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttl_secs: Option<u64>,
    },
    /// Revokes a token by its id (`jti`): refused everywhere once applied.
    RevokeToken {
        jti: String,
    },
    /// Creates or replaces a role (needs `rbac.manage` on `*`).
    PutRole {
        name: String,
        allow: Vec<String>,
    },
    ListRoles {},
    DeleteRole {
        name: String,
    },
    /// Binds a subject of a tenant to a role (needs `rbac.manage` on the tenant).
    BindRole {
        tenant: String,
        subject: String,
        role: String,
    },
    /// Adds a new signing key; the previous ones verify until their tokens have expired
    /// (needs `cluster.manage`). Answered `SigningKey`.
    RotateKey {},
    /// Registers or replaces a trusted OIDC issuer (needs `rbac.manage` on `*`).
    PutOidcIssuer {
        issuer: OidcIssuerSpec,
    },
    /// The registered issuers (needs `rbac.manage` on `*`). Answered `OidcIssuers`.
    ListOidcIssuers {},
    DeleteOidcIssuer {
        issuer: String,
    },
    /// Trades an identity provider's JWT for a short-lived Felix token of `tenant`. Needs no
    /// Felix token. Answered `Token`, or `unauthorized` with the reason the JWT was refused.
    ExchangeOidcToken {
        tenant: String,
        token: String,
    },
    CreateTenant {
        name: String,
    },
    CreateNamespace {
        tenant: String,
        name: String,
    },
    CreateStream {
        tenant: String,
        namespace: String,
        name: String,
        config: StreamConfig,
    },
    AlterStream {
        tenant: String,
        namespace: String,
        name: String,
        config: StreamConfig,
    },
    DescribeStream {
        tenant: String,
        namespace: String,
        name: String,
    },
    ListStreams {
        tenant: String,
        namespace: String,
    },
    DeleteStream {
        tenant: String,
        namespace: String,
        name: String,
    },
    /// The body holds one or more record batches for one shard.
    Publish {
        tenant: String,
        namespace: String,
        stream: String,
        shard: u32,
        #[serde(default)]
        ack: AckMode,
    },
    Subscribe {
        tenant: String,
        namespace: String,
        stream: String,
        shard: u32,
        from: StartAt,
    },
    /// Asks for an idempotent producer id.
    ProducerInit {},
    /// Lists a stream's segments and objects, oldest first, per shard.
    ListSegments {
        tenant: String,
        namespace: String,
        stream: String,
    },
    /// Who leads each shard of a stream, and the cluster's brokers (the routing table of a
    /// cluster client).
    Topology {
        tenant: String,
        namespace: String,
        stream: String,
    },
    /// Single-writer fencing: the body's one batch is written only if the shard's next
    /// offset is `expected_offset`, else refused with `expected_offset_mismatch` carrying
    /// the actual one in `next_offset`. Answered `Published` after the write.
    PublishIf {
        tenant: String,
        namespace: String,
        stream: String,
        shard: u32,
        expected_offset: u64,
    },
    /// A consumer-group request ([`crate::groups`]).
    Group(crate::groups::GroupRequest),
    /// A cluster operation ([`crate::moves`]).
    Cluster(crate::moves::ClusterRequest),
    /// A cache request ([`crate::cache`]); a put's value is the body.
    Cache(crate::cache::CacheRequest),
}

/// A response: the header of a `Response` frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    HelloOk {
        version: u16,
        features: u64,
        broker_id: u64,
    },
    Done {},
    Stream {
        stream: StreamInfo,
    },
    Streams {
        streams: Vec<StreamInfo>,
    },
    /// Offsets the log gave the published batches (first and last record), in order.
    Published {
        shard: u32,
        base_offset: u64,
        last_offset: u64,
    },
    /// The subscription starts: `start_offset` is where delivery begins, `live_offset` the
    /// log's end when it was opened (records at or above it are live).
    SubscribeOk {
        start_offset: u64,
        live_offset: u64,
    },
    ProducerId {
        producer_id: i64,
        epoch: i16,
    },
    Segments {
        segments: Vec<SegmentInfo>,
    },
    Topology {
        shards: Vec<ShardRoute>,
        brokers: Vec<BrokerRoute>,
    },
    /// A minted token, its id and its expiry (seconds since the Unix epoch).
    Token {
        token: String,
        jti: String,
        expires_at: u64,
    },
    Roles {
        roles: Vec<RoleInfo>,
    },
    /// The key id new tokens are signed with.
    SigningKey {
        kid: String,
    },
    OidcIssuers {
        issuers: Vec<OidcIssuerSpec>,
    },
    /// The answer to a consumer-group request ([`crate::groups`]).
    Group(crate::groups::GroupResponse),
    /// The answer to a cluster operation ([`crate::moves`]).
    Cluster(crate::moves::ClusterResponse),
    /// The answer to a cache request ([`crate::cache`]); a found value is the body.
    Cache(crate::cache::CacheResponse),
    Error(ErrorBody),
}

/// A role and what it grants (`action:pattern`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleInfo {
    pub name: String,
    pub allow: Vec<String>,
    /// Defined by Felix (`tenant-admin`, `cluster-admin`): cannot be changed.
    #[serde(default)]
    pub builtin: bool,
}

/// One shard's placement as a client routes by it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRoute {
    pub shard: u32,
    /// The leading broker's id and QUIC address; `None` while the shard has no leader.
    pub leader: Option<u64>,
    pub leader_addr: Option<String>,
    /// Bumped on every leadership change.
    pub generation: u64,
    pub replicas: Vec<u64>,
}

/// A broker of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRoute {
    pub id: u64,
    pub client_addr: String,
    pub alive: bool,
}

/// An event on a subscription stream: the header of an `Event` frame. `Records` carries
/// whole stored batches in the body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Records {
        /// Offset of the first record in the body, and one past the last.
        first_offset: u64,
        next_offset: u64,
    },
    /// The subscription ended (lagged, shard gone, broker stopping).
    End(ErrorBody),
    /// A change a cache watch delivers; the body is the new value of a put.
    CacheChange(crate::cache::CacheChange),
}

/// An error: a stable numeric code, a stable reason, a human message, and for retryable
/// errors how long to wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: u16,
    pub reason: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// For `subscription_lagged`: the offset to resume from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_offset: Option<u64>,
    /// For `offset_too_old`: the earliest offset the shard still holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest_offset: Option<u64>,
    /// For `expected_offset_mismatch`: the actual offset (a shard's next offset, or a
    /// group's position on the shard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// For `not_leader`: the broker that leads the shard and its QUIC address, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_addr: Option<String>,
    /// `{reason}` again, in the shape the delivery-semantics spec writes (`detail.reason`).
    /// Set on every error this build sends; absent from an older broker's, so read `reason`
    /// when it is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<ErrorDetail>,
}

/// The nested part of an [`ErrorBody`]: `detail.reason` repeats its `reason`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub reason: String,
}

/// Stable error codes. A retired code stays retired: never reuse a number.
pub mod codes {
    pub const BAD_REQUEST: u16 = 1;
    pub const UNSUPPORTED_VERSION: u16 = 2;
    pub const UNKNOWN_TENANT: u16 = 3;
    pub const UNKNOWN_NAMESPACE: u16 = 4;
    pub const UNKNOWN_STREAM: u16 = 5;
    pub const ALREADY_EXISTS: u16 = 6;
    pub const INVALID_ARGUMENT: u16 = 7;
    pub const RECORD_TOO_LARGE: u16 = 8;
    pub const OVERLOADED: u16 = 9;
    pub const SUBSCRIPTION_LAGGED: u16 = 10;
    pub const OFFSET_OUT_OF_RANGE: u16 = 11;
    pub const SHARD_UNAVAILABLE: u16 = 12;
    pub const QUORUM_TIMEOUT: u16 = 13;
    pub const INTERNAL: u16 = 14;
    pub const UNAUTHORIZED: u16 = 15;
    pub const OUT_OF_ORDER_SEQUENCE: u16 = 16;
    pub const UNKNOWN_SHARD: u16 = 17;
    pub const NOT_EMPTY: u16 = 18;
    pub const VERSION_CONFLICT: u16 = 19;
    pub const FRAME_TOO_LARGE: u16 = 20;
    pub const METADATA_UNAVAILABLE: u16 = 21;
    /// The requested offset was removed by retention; `earliest_offset` says where the
    /// shard now starts.
    pub const OFFSET_TOO_OLD: u16 = 22;
    /// This broker does not lead the shard; `leader`/`leader_addr` name the one that does,
    /// when known. A cluster client re-routes and retries.
    pub const NOT_LEADER: u16 = 23;
    /// Stored data failed its checks (reason `corrupt_segment` for the local log,
    /// `corrupt_object` for the object store); the message names the shard and the file or
    /// object. Not retryable: the same read meets the same damage.
    pub const CORRUPT_DATA: u16 = 24;
    /// The token is valid but does not grant the action (reason `forbidden`); the message
    /// names the action and nothing of the resource. Not retryable with the same token.
    pub const FORBIDDEN: u16 = 25;
    /// No consumer group of that name on the stream (reason `unknown_group`).
    pub const UNKNOWN_GROUP: u16 = 26;
    /// An answer to a claim that is no longer the caller's: its deadline passed
    /// (`claim_expired`), or the record is not claimed by this consumer at this attempt
    /// (`not_claimed_by_you`). Nothing of the request was applied.
    pub const CLAIM_NOT_HELD: u16 = 27;
    /// `publish_if` or a group `commit` found another offset than expected (reason
    /// `expected_offset_mismatch`); `next_offset` carries the actual one. Nothing written.
    pub const EXPECTED_OFFSET_MISMATCH: u16 = 28;
    /// A cache value over `MAX_VALUE_BYTES` (1 MiB; reason `value_too_large`). Large values
    /// belong in object storage. Nothing written.
    pub const VALUE_TOO_LARGE: u16 = 45;
    /// No cache of that name in the namespace (reason `unknown_cache`).
    pub const UNKNOWN_CACHE: u16 = 46;
    /// A write's owner lost the shard before a majority held the write, or a leader's
    /// lease lapsed after its write landed and before it could answer (reason
    /// `leadership_lost`): its outcome is unknown, not failed.
    pub const LEADERSHIP_LOST: u16 = 47;
    /// `counter_add` or `counter_get` on a key whose value is not a decimal integer, or an
    /// add that would overflow 64 bits (reason `not_a_counter`). Nothing written.
    pub const NOT_A_COUNTER: u16 = 48;
    /// A subscription ended because its shard was handed over to another broker (reason
    /// `shard_moved`); `leader` names the new owner, where it resumes after the last offset
    /// received.
    pub const SHARD_MOVED: u16 = 53;
    /// A shard move was refused because another move of the shard is under way (reason
    /// `move_in_progress`); nothing changed. Retry once it finished.
    pub const MOVE_IN_PROGRESS: u16 = 54;
}

impl ErrorBody {
    /// An error with a code, its reason and a message.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            code,
            reason: reason.to_owned(),
            message: message.into(),
            retry_after_ms: None,
            resume_offset: None,
            earliest_offset: None,
            next_offset: None,
            leader: None,
            leader_addr: None,
            detail: Some(ErrorDetail {
                reason: reason.to_owned(),
            }),
        }
    }
    /// Marks the error retryable after `ms`.
    pub fn retry_after(mut self, ms: u64) -> ErrorBody {
        self.retry_after_ms = Some(ms);
        self
    }
}

impl std::fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.reason, self.code, self.message)?;
        if let Some(ms) = self.retry_after_ms {
            write!(f, " (retry after {ms} ms)")?;
        }
        if let Some(o) = self.resume_offset {
            write!(f, " (resume from offset {o})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_carries_its_reason_at_the_top_and_in_detail_and_reads_without_detail() {
        let e = ErrorBody::new(codes::OVERLOADED, "publish_queue_full", "full").retry_after(50);
        let json: serde_json::Value = serde_json::to_value(&e).unwrap();
        assert_eq!(json["reason"], "publish_queue_full");
        assert_eq!(json["detail"]["reason"], "publish_queue_full");
        // An older broker's error, without `detail`, still reads.
        let old =
            r#"{"code":9,"reason":"publish_queue_full","message":"full","retry_after_ms":50}"#;
        let parsed: ErrorBody = serde_json::from_str(old).unwrap();
        assert_eq!((parsed.code, parsed.detail), (codes::OVERLOADED, None));
    }
}
