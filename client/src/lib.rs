//! felix-client: the Rust client of a Felix cluster (a single broker is a cluster of one),
//! and the `felixctl` command-line tool.
//!
//! A [`Client`] sends each shard's publishes and subscriptions to the shard's leader,
//! follows leadership as it moves, and sends admin requests to any live broker. It keeps one
//! [`Connection`] per broker (one QUIC connection speaking [`felix_wire::protocol`]: every
//! request is its own bidirectional stream, a subscription is a stream of `Event` frames,
//! and records travel as Kafka RecordBatch v2, exactly as the log stores them). A
//! [`Connection`] is also the way to pin requests to one broker: nothing is routed or
//! re-sent, which is what a tool inspecting what *that* broker holds wants.
//!
//! ```no_run
//! use felix_client::{AckMode, Client, ClientConfig, Message, StartAt, StreamConfig};
//!
//! # async fn demo() -> Result<(), felix_client::ClientError> {
//! let client = Client::connect(["127.0.0.1:5000"], ClientConfig::default()).await?;
//! client.create_tenant("acme").await?;
//! client.create_namespace("acme", "prod").await?;
//! let config = StreamConfig { durable: Some(true), shards: Some(4), ..Default::default() };
//! client.create_stream("acme", "prod", "orders", config).await?;
//!
//! // Keyed messages go to the key's shard; the answer says where they landed.
//! let ack = client
//!     .publish("acme", "prod", "orders", Message::new("paid").with_key("order-42"), AckMode::Batch)
//!     .await?;
//! let published = ack.expect("AckMode::Batch is acknowledged");
//!
//! let mut sub = client
//!     .subscribe_shard("acme", "prod", "orders", published.shard, StartAt::Offset(published.base_offset))
//!     .await?;
//! if let Some(event) = sub.next_event().await? {
//!     assert_eq!(&event.payload[..], b"paid");
//! }
//! # Ok(()) }
//! ```
//!
//! The examples of the delivery-semantics spec compile as written, each as its own doc test
//! below (the spec's lines verbatim; the hidden lines only declare what the spec's text
//! assumes: a connected `client`, the messages, and the helpers its tests call). The spec's
//! `client.subscribe(tenant, ns, stream)` is a whole-stream [`StreamSubscription`], and
//! `AckMode::PerBatch` is [`AckMode::Batch`] under the spec's name.
//!
//! At-most-once:
//!
//! ```no_run
//! # use felix_client::{Client, ClientConfig};
//! # fn update_dashboard(_: bytes::Bytes) {}
//! # async fn demo() -> Result<(), felix_client::ClientError> {
//! # let client = Client::connect(["127.0.0.1:5000"], ClientConfig::default()).await?;
//! // Real-time sensor data where latest reading matters most
//! let mut subscription = client.subscribe("acme", "sensors", "temperature").await?;
//!
//! while let Some(event) = subscription.next_event().await? {
//!     // Process latest temperature reading
//!     // If we miss a reading, the next one will arrive soon
//!     update_dashboard(event.payload);
//! }
//! # Ok(()) }
//! ```
//!
//! Ordering across streams:
//!
//! ```no_run
//! # use felix_client::{Client, ClientConfig, Message};
//! # async fn demo() -> Result<(), felix_client::ClientError> {
//! # let client = Client::connect(["127.0.0.1:5000"], ClientConfig::default()).await?;
//! # let (login_event, audit_event) = (Message::new("login"), Message::new("audit"));
//! // Publish to two streams
//! use felix_client::AckMode;
//! client
//!     .publish("acme", "prod", "user-login", login_event, AckMode::None)
//!     .await?;
//! client
//!     .publish("acme", "prod", "audit-log", audit_event, AckMode::None)
//!     .await?;
//!
//! // Subscribers to user-login and audit-log may see events in any relative order
//! # Ok(()) }
//! ```
//!
//! Ordering within batches:
//!
//! ```no_run
//! # use felix_client::{Client, ClientConfig, Message};
//! # async fn demo() -> Result<(), felix_client::ClientError> {
//! # let client = Client::connect(["127.0.0.1:5000"], ClientConfig::default()).await?;
//! # let (msg1, msg2, msg3) = (Message::new("1"), Message::new("2"), Message::new("3"));
//! // Batch publish preserves order within the batch
//! use felix_client::AckMode;
//! let messages = vec![msg1, msg2, msg3];
//! client
//!     .publish_batch("acme", "prod", "orders", messages, AckMode::PerBatch)
//!     .await?;
//!
//! // Subscribers will see msg1, msg2, msg3 in that order
//! # Ok(()) }
//! ```
//!
//! The ordering test:
//!
//! ```no_run
//! # use felix_client::{Client, ClientConfig, ClientError, StreamSubscription};
//! # async fn collect_events(
//! #     sub: &mut StreamSubscription,
//! #     n: usize,
//! # ) -> Result<Vec<String>, ClientError> {
//! #     let mut out = Vec::new();
//! #     while out.len() < n {
//! #         let Some(event) = sub.next_event().await? else { break };
//! #         out.push(String::from_utf8_lossy(&event.payload).into_owned());
//! #     }
//! #     Ok(out)
//! # }
//! # async fn demo() -> Result<(), ClientError> {
//! # let client = Client::connect(["127.0.0.1:5000"], ClientConfig::default()).await?;
//! # let mut subscription = client.subscribe("test", "default", "orders").await?;
//! // Publish ordered batch
//! let messages = vec!["msg1", "msg2", "msg3"];
//! use felix_client::AckMode;
//! client
//!     .publish_batch("test", "default", "orders", messages, AckMode::PerBatch)
//!     .await?;
//!
//! // Verify subscriber receives in order
//! let events = collect_events(&mut subscription, 3).await?;
//! assert_eq!(events, vec!["msg1", "msg2", "msg3"]);
//! # Ok(()) }
//! ```
//!
//! The isolation test:
//!
//! ```no_run
//! # use std::time::Duration;
//! # use felix_client::{Client, ClientConfig, ClientError, StreamSubscription};
//! # fn simulate_slow_processing(_: &mut StreamSubscription) {}
//! # async fn count_events(
//! #     sub: &mut StreamSubscription,
//! #     timeout: Duration,
//! # ) -> Result<usize, ClientError> {
//! #     let mut n = 0;
//! #     while let Ok(event) = tokio::time::timeout(timeout, sub.next_event()).await {
//! #         if event?.is_none() {
//! #             break;
//! #         }
//! #         n += 1;
//! #     }
//! #     Ok(n)
//! # }
//! # async fn demo() -> Result<(), ClientError> {
//! # let client = Client::connect(["127.0.0.1:5000"], ClientConfig::default()).await?;
//! # let (timeout, expected_count) = (Duration::from_secs(5), 3);
//! // Start fast and slow subscribers
//! let mut fast_sub = client.subscribe("test", "default", "stream").await?;
//! let mut slow_sub = client.subscribe("test", "default", "stream").await?;
//!
//! // Slow subscriber delays processing
//! simulate_slow_processing(&mut slow_sub);
//!
//! // Verify fast subscriber still receives all messages
//! let fast_count = count_events(&mut fast_sub, timeout).await?;
//! assert!(fast_count >= expected_count);
//! # Ok(()) }
//! ```
//!
//! Modules: [`tls`] builds the QUIC TLS configuration; `connection` is one broker's
//! connection; `request` is one request/response exchange; `admin` the admin requests both
//! a [`Client`] and a [`Connection`] answer; `publish` decides placement and encodes
//! batches; `subscription` decodes events; `idempotent` numbers a producer's batches;
//! `parse` reads `TENANT/NS/STREAM` paths and start positions; `cluster` routes to shard
//! leaders and decides what may be retried.

// `ClientError::Broker` holds the broker's `ErrorBody` inline (~150 bytes since it names
// the leader for `not_leader`). Errors are the rare path, and boxing it would change the
// public variant every caller matches on.
#![allow(clippy::result_large_err)]

#[macro_use]
mod admin;
#[macro_use]
mod cache;
#[macro_use]
mod rbac;
#[macro_use]
mod moves;
mod cluster;
mod connection;
mod error;
mod idempotent;
mod parse;
mod publish;
mod request;
mod reuse;
mod subscription;
pub mod tls;

use std::path::PathBuf;
use std::time::Duration;

use felix_wire::protocol::{DEFAULT_MAX_FRAME, Request, Response};

pub use cache::{CacheEvent, CacheValue, CacheWatch, WatchTarget};
pub use cluster::{
    BrokerRoute, Client, ClusterCacheWatch, ClusterClient, ClusterSubscription, GroupConsumer,
    GroupRecord, ShardRoute, StreamSubscription, Topology,
};
pub use connection::Connection;
pub use error::ClientError;
pub use felix_wire::Compression;
pub use felix_wire::cache::{CacheConfig, CacheInfo, ChangeKind, Condition, WatchResume};
pub use felix_wire::groups::{GroupConfig, GroupInfo, GroupShardInfo, GroupStart};
pub use felix_wire::moves::{BrokerInfo, ClusterRequest, ClusterResponse, MoveInfo};
pub use felix_wire::protocol::{
    AckMode, ErrorBody, OidcIssuerSpec, RoleInfo, SegmentInfo, ShardInfo, StartAt, StreamConfig,
    StreamInfo, codes, features,
};
pub use idempotent::{IdempotentClusterProducer, IdempotentProducer};
pub use parse::{parse_namespace_path, parse_start_at, parse_stream_path};
pub use publish::{Message, Published, ShardOutcome};
pub use rbac::{IssuedToken, TokenSpec};
pub use subscription::{Event, Subscription};

/// The feature bit of idempotent producers, under the name the spec gives it.
pub const FEATURE_IDEMPOTENT_PRODUCER: u64 = features::IDEMPOTENT_PRODUCER;

/// How a [`Client`] connects and behaves.
///
/// ```
/// use std::time::Duration;
/// let config = felix_client::ClientConfig {
///     insecure: true,
///     request_timeout: Duration::from_secs(5),
///     ..Default::default()
/// };
/// assert_eq!(config.compression, felix_client::Compression::None);
/// ```
#[derive(Clone)]
pub struct ClientConfig {
    /// A PEM file of CA certificates to trust for the broker's certificate (instead of the
    /// system roots).
    pub ca: Option<PathBuf>,
    /// Accept any broker certificate. For development against a self-signed broker only.
    pub insecure: bool,
    /// The name this client announces in `Hello` (shows in the broker's logs).
    pub name: String,
    /// Limit on every request, from opening its stream to reading its answer (and on
    /// connecting). A request that runs out of time fails with [`ClientError::Timeout`], its
    /// outcome unknown.
    pub request_timeout: Duration,
    /// The codec of published batches.
    pub compression: Compression,
    /// The largest frame sent or accepted (header and body).
    pub max_frame: usize,
    /// Ask for acknowledgements after the write on this connection's publishes, also from
    /// a broker started with `ack_on_commit: false` (sends `AckMode::Commit` for
    /// `AckMode::Batch`).
    pub ack_on_commit: bool,
    /// The feature bits offered in `Hello` (default [`features::ALL`]); the connection uses
    /// those the broker agrees to ([`Connection::features`]). Leaving out
    /// [`features::SUBSCRIPTION_LAGGED`] keeps a durable subscription open past a drop: the
    /// drop shows as a jump between consecutive offsets instead of ending it.
    pub features: u64,
    /// The Felix token presented in `Hello` (docs/security.md). Needed by a broker running
    /// with auth on; ignored by one with auth off. Replace it on a live connection with
    /// [`Connection::set_token`] or [`Client::set_token`].
    pub token: Option<String>,
}

// By hand, so a token never lands in a log line.
impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("ca", &self.ca)
            .field("insecure", &self.insecure)
            .field("name", &self.name)
            .field("request_timeout", &self.request_timeout)
            .field("compression", &self.compression)
            .field("max_frame", &self.max_frame)
            .field("ack_on_commit", &self.ack_on_commit)
            .field("features", &self.features)
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            ca: None,
            insecure: false,
            name: format!("felix-client/{}", env!("CARGO_PKG_VERSION")),
            request_timeout: Duration::from_secs(30),
            compression: Compression::None,
            max_frame: DEFAULT_MAX_FRAME,
            ack_on_commit: false,
            features: features::ALL,
            token: None,
        }
    }
}

/// A stream's (tenant, namespace, name).
pub(crate) type StreamKey = (String, String, String);

pub(crate) fn stream_key(tenant: &str, namespace: &str, stream: &str) -> StreamKey {
    (tenant.to_owned(), namespace.to_owned(), stream.to_owned())
}

/// Where a client starts its round-robin of key-less messages: each client somewhere else,
/// so short-lived clients (one felixctl run each) do not all pile onto shard 0.
pub(crate) fn round_robin_seed() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id().rotate_left(16)
}

pub(crate) fn request_name(request: &Request) -> &'static str {
    match request {
        Request::Hello { .. } => "Hello",
        Request::CreateTenant { .. } => "CreateTenant",
        Request::CreateNamespace { .. } => "CreateNamespace",
        Request::CreateStream { .. } => "CreateStream",
        Request::AlterStream { .. } => "AlterStream",
        Request::DescribeStream { .. } => "DescribeStream",
        Request::ListStreams { .. } => "ListStreams",
        Request::DeleteStream { .. } => "DeleteStream",
        Request::Publish { .. } => "Publish",
        Request::Subscribe { .. } => "Subscribe",
        Request::ProducerInit {} => "ProducerInit",
        Request::ListSegments { .. } => "ListSegments",
        Request::Topology { .. } => "Topology",
        Request::Authenticate { .. } => "Authenticate",
        Request::MintToken { .. } => "MintToken",
        Request::RevokeToken { .. } => "RevokeToken",
        Request::PutRole { .. } => "PutRole",
        Request::ListRoles {} => "ListRoles",
        Request::DeleteRole { .. } => "DeleteRole",
        Request::BindRole { .. } => "BindRole",
        Request::RotateKey {} => "RotateKey",
        Request::PutOidcIssuer { .. } => "PutOidcIssuer",
        Request::ListOidcIssuers {} => "ListOidcIssuers",
        Request::DeleteOidcIssuer { .. } => "DeleteOidcIssuer",
        Request::ExchangeOidcToken { .. } => "ExchangeOidcToken",
        Request::Group(_) => "Group",
        Request::Cluster(_) => "Cluster",
        Request::Cache(_) => "Cache",
        Request::PublishIf { .. } => "PublishIf",
    }
}

pub(crate) fn unexpected(request: &str, response: &Response) -> ClientError {
    ClientError::Protocol(format!("unexpected answer to {request}: {response:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_config_matches_the_documented_defaults() {
        let c = ClientConfig::default();
        assert_eq!(c.request_timeout, Duration::from_secs(30));
        assert_eq!(c.compression, Compression::None);
        assert!(!c.insecure && c.ca.is_none());
        assert_eq!(c.max_frame, DEFAULT_MAX_FRAME);
    }

    #[test]
    fn the_spec_names_are_the_same_things() {
        assert_eq!(AckMode::PerBatch, AckMode::Batch);
        assert_eq!(FEATURE_IDEMPOTENT_PRODUCER, features::IDEMPOTENT_PRODUCER);
        assert_eq!(Message::from("msg1"), Message::new("msg1"));
        assert_eq!(
            std::any::type_name::<ClusterClient>(),
            std::any::type_name::<Client>()
        );
    }
}
