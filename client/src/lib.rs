//! felix-client: the Rust client of a Felix broker, and the `felixctl` command-line tool.
//!
//! A [`Client`] holds one QUIC connection to a broker and speaks the protocol of
//! [`felix_wire::protocol`]: every request is its own bidirectional stream (one request
//! frame, one response frame), a subscription is a stream of `Event` frames, and records
//! travel as Kafka RecordBatch v2, exactly as the log stores them.
//!
//! ```no_run
//! use felix_client::{AckMode, Client, ClientConfig, Message, StartAt, StreamConfig};
//!
//! # async fn demo() -> Result<(), felix_client::ClientError> {
//! let client = Client::connect("127.0.0.1:5000", ClientConfig::default()).await?;
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
//!     .subscribe("acme", "prod", "orders", published.shard, StartAt::Offset(published.base_offset))
//!     .await?;
//! if let Some(event) = sub.next_event().await? {
//!     assert_eq!(&event.payload[..], b"paid");
//! }
//! # Ok(()) }
//! ```
//!
//! Against a cluster of brokers, a [`ClusterClient`] sends each shard's publishes and
//! subscriptions to its leader and follows leadership as it moves (see docs/client.md).
//!
//! Modules: [`tls`] builds the QUIC TLS configuration; `request` is one request/response
//! exchange; `publish` decides placement and encodes batches; `subscription` decodes events;
//! `parse` reads `TENANT/NS/STREAM` paths and start positions; `cluster` routes to shard
//! leaders and decides what may be retried.

// `ClientError::Broker` holds the broker's `ErrorBody` inline (~150 bytes since it names
// the leader for `not_leader`). Errors are the rare path, and boxing it would change the
// public variant every caller matches on.
#![allow(clippy::result_large_err)]

mod cluster;
mod error;
mod idempotent;
mod parse;
mod publish;
mod request;
mod subscription;
pub mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use felix_wire::protocol::{DEFAULT_MAX_FRAME, PROTOCOL_VERSION, Request, Response};

pub use cluster::{
    BrokerRoute, ClusterClient, ClusterSubscription, IdempotentClusterProducer, ShardRoute,
    Topology,
};
pub use error::ClientError;
pub use felix_wire::Compression;
pub use felix_wire::protocol::{
    AckMode, ErrorBody, SegmentInfo, ShardInfo, StartAt, StreamConfig, StreamInfo, codes, features,
};
pub use idempotent::IdempotentProducer;
pub use parse::{parse_namespace_path, parse_start_at, parse_stream_path};
pub use publish::{Message, Published, ShardOutcome};
pub use subscription::{Event, Subscription};

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
#[derive(Debug, Clone)]
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
    /// those the broker agrees to ([`Client::features`]). Leaving out
    /// [`features::SUBSCRIPTION_LAGGED`] keeps a durable subscription open past a drop: the
    /// drop shows as a jump between consecutive offsets instead of ending it.
    pub features: u64,
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
        }
    }
}

/// A connection to a Felix broker. Cheap to clone (clones share the connection); every
/// method can be called concurrently. Dropping the last clone closes the connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    compression: Compression,
}

struct Inner {
    conn: quinn::Connection,
    endpoint: quinn::Endpoint,
    features: u64,
    broker_id: u64,
    request_timeout: Duration,
    max_frame: usize,
    ack_on_commit: bool,
    /// Shard counts of the streams published to, learned from DescribeStream.
    shard_counts: Mutex<HashMap<StreamKey, u32>>,
    /// Picks the shard of each call's key-less messages.
    round_robin: AtomicU32,
}

type StreamKey = (String, String, String);

fn stream_key(tenant: &str, namespace: &str, stream: &str) -> StreamKey {
    (tenant.to_owned(), namespace.to_owned(), stream.to_owned())
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("remote", &self.inner.conn.remote_address())
            .field("broker_id", &self.inner.broker_id)
            .field("features", &self.inner.features)
            .field("compression", &self.compression)
            .finish()
    }
}

/// Splits `host:port` (`[v6]:port` for IPv6 literals) into host and port.
fn split_host_port(addr: &str) -> Result<(String, u16), ClientError> {
    let bad = || ClientError::InvalidArgument(format!("{addr:?} is not HOST:PORT"));
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let host = match host.strip_prefix('[') {
        Some(h) => h.strip_suffix(']').ok_or_else(bad)?,
        None if host.contains(':') => return Err(bad()),
        None => host,
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = port.parse::<u16>().map_err(|_| bad())?;
    Ok((host.to_owned(), port))
}

/// One QUIC handshake to one address.
async fn handshake(
    addr: SocketAddr,
    quic: quinn::ClientConfig,
    server_name: String,
) -> Result<(quinn::Endpoint, quinn::Connection), ClientError> {
    let bind: SocketAddr = if addr.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let endpoint = tls::client_endpoint(bind)
        .map_err(|e| ClientError::Connect(format!("cannot open a UDP socket: {e}")))?;
    let connecting = endpoint
        .connect_with(quic, addr, &server_name)
        .map_err(|e| ClientError::Connect(format!("{addr}: {e}")))?;
    let conn = connecting
        .await
        .map_err(|e| ClientError::Connect(format!("{addr}: {e}")))?;
    Ok((endpoint, conn))
}

impl Client {
    /// Connects to the broker at `addr` (`host:port`; a name is resolved and every address
    /// it has is tried at once, the first handshake wins) and says `Hello`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), felix_client::ClientError> {
    /// use felix_client::{Client, ClientConfig};
    /// let config = ClientConfig { ca: Some("ca.pem".into()), ..Default::default() };
    /// let client = Client::connect("broker-1.internal:5000", config).await?;
    /// println!("connected to broker {}", client.broker_id());
    /// # Ok(()) }
    /// ```
    pub async fn connect(addr: &str, config: ClientConfig) -> Result<Client, ClientError> {
        let (host, port) = split_host_port(addr)?;
        let timeout = config.request_timeout;
        tokio::time::timeout(timeout, Self::connect_inner(&host, port, config))
            .await
            .map_err(|_| ClientError::Connect(format!("{addr}: no answer within {timeout:?}")))?
    }

    async fn connect_inner(
        host: &str,
        port: u16,
        config: ClientConfig,
    ) -> Result<Client, ClientError> {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| ClientError::Connect(format!("cannot resolve {host}: {e}")))?
            .collect();
        if addrs.is_empty() {
            return Err(ClientError::Connect(format!("{host} has no address")));
        }
        // A name is verified as such; an address against the certificate's addresses, then
        // "localhost" (the broker's generated certificate), as the tls module decides.
        let server_name = tls::server_name(host);

        let mut attempts = tokio::task::JoinSet::new();
        for addr in addrs {
            // The tls module also sets the transport: 6 s idle timeout, 2 s keep-alives.
            let quic = tls::client_config(host, addr.ip(), config.ca.as_deref(), config.insecure)?;
            attempts.spawn(handshake(addr, quic, server_name.clone()));
        }
        let mut last_error = None;
        let (endpoint, conn) = loop {
            match attempts.join_next().await {
                Some(Ok(Ok(pair))) => break pair,
                Some(Ok(Err(e))) => last_error = Some(e),
                Some(Err(e)) => last_error = Some(ClientError::Connect(e.to_string())),
                None => {
                    return Err(last_error
                        .unwrap_or_else(|| ClientError::Connect(format!("{host}: no address"))));
                }
            }
        };
        attempts.abort_all();

        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            features: config.features,
            client: config.name.clone(),
        };
        let response = request::call(
            &conn,
            &hello,
            Bytes::new(),
            config.max_frame,
            config.request_timeout,
        )
        .await?;
        let Response::HelloOk {
            version,
            features,
            broker_id,
        } = response
        else {
            return Err(unexpected("Hello", &response));
        };
        if version != PROTOCOL_VERSION {
            return Err(ClientError::Protocol(format!(
                "broker speaks protocol version {version}, this client {PROTOCOL_VERSION}"
            )));
        }
        tracing::debug!(
            remote = %conn.remote_address(),
            broker_id,
            features,
            "connected"
        );
        Ok(Client {
            inner: Arc::new(Inner {
                conn,
                endpoint,
                features: features & features::ALL,
                broker_id,
                request_timeout: config.request_timeout,
                max_frame: config.max_frame,
                ack_on_commit: config.ack_on_commit,
                shard_counts: Mutex::new(HashMap::new()),
                // Each client starts its rotation somewhere else, so short-lived clients
                // (one felixctl run each) do not all pile onto shard 0.
                round_robin: AtomicU32::new(round_robin_seed()),
            }),
            compression: config.compression,
        })
    }

    /// The same connection, publishing with another codec.
    pub fn with_compression(&self, compression: Compression) -> Client {
        Client {
            inner: self.inner.clone(),
            compression,
        }
    }

    /// The codec of published batches.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// The feature bits both sides support ([`features`]).
    pub fn features(&self) -> u64 {
        self.inner.features
    }

    /// Whether the broker agreed to `feature` (one of [`features`]).
    pub fn has_feature(&self, feature: u64) -> bool {
        self.inner.features & feature == feature
    }

    /// The id of the broker this client is connected to.
    pub fn broker_id(&self) -> u64 {
        self.inner.broker_id
    }

    /// The broker's address.
    pub fn remote_address(&self) -> SocketAddr {
        self.inner.conn.remote_address()
    }

    /// Whether the connection is closed (lost, or closed by [`Client::close`]): every
    /// request on it would fail. A broker that vanished is noticed within the QUIC idle
    /// timeout (6 s).
    pub fn is_closed(&self) -> bool {
        self.inner.conn.close_reason().is_some()
    }

    /// Closes the connection, waiting briefly for the close to reach the broker. Requests
    /// still in flight on any clone fail with [`ClientError::Transport`].
    pub async fn close(&self) {
        self.inner.conn.close(0u32.into(), b"closed");
        let _ = tokio::time::timeout(Duration::from_secs(1), self.inner.endpoint.wait_idle()).await;
    }

    async fn call(&self, request: Request) -> Result<Response, ClientError> {
        request::call(
            &self.inner.conn,
            &request,
            Bytes::new(),
            self.inner.max_frame,
            self.inner.request_timeout,
        )
        .await
    }

    /// One request, saying on failure whether it was sent.
    pub(crate) async fn call_tracked(
        &self,
        request: &Request,
    ) -> Result<Response, request::Failed> {
        request::call_tracked(
            &self.inner.conn,
            request,
            Bytes::new(),
            self.inner.max_frame,
            self.inner.request_timeout,
            true,
        )
        .await
    }

    async fn call_done(&self, request: Request) -> Result<(), ClientError> {
        let what = request_name(&request);
        match self.call(request).await? {
            Response::Done {} => Ok(()),
            other => Err(unexpected(what, &other)),
        }
    }

    async fn call_stream(&self, request: Request) -> Result<StreamInfo, ClientError> {
        let what = request_name(&request);
        match self.call(request).await? {
            Response::Stream { stream } => {
                self.remember_shards(&stream);
                Ok(stream)
            }
            other => Err(unexpected(what, &other)),
        }
    }

    /// Creates a tenant. Fails with `already_exists` if there is one of that name.
    pub async fn create_tenant(&self, name: &str) -> Result<(), ClientError> {
        self.call_done(Request::CreateTenant {
            name: name.to_owned(),
        })
        .await
    }

    /// Creates a namespace in a tenant.
    pub async fn create_namespace(&self, tenant: &str, name: &str) -> Result<(), ClientError> {
        self.call_done(Request::CreateNamespace {
            tenant: tenant.to_owned(),
            name: name.to_owned(),
        })
        .await
    }

    /// Creates a stream; unset settings take the broker's defaults (an ephemeral stream of
    /// one shard unless told otherwise). Returns the stream with every setting filled in.
    ///
    /// ```no_run
    /// # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
    /// use felix_client::StreamConfig;
    /// let config = StreamConfig {
    ///     durable: Some(true),
    ///     shards: Some(8),
    ///     consistency: Some("quorum".into()),
    ///     replicas: Some(3),
    ///     retention_ms: Some(7 * 24 * 3600 * 1000),
    ///     ..Default::default()
    /// };
    /// let info = client.create_stream("acme", "prod", "orders", config).await?;
    /// assert_eq!(info.config.shards, Some(8));
    /// # Ok(()) }
    /// ```
    pub async fn create_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        config: StreamConfig,
    ) -> Result<StreamInfo, ClientError> {
        self.call_stream(Request::CreateStream {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            config,
        })
        .await
    }

    /// Changes the settings that are set in `config`, leaving the others as they are.
    pub async fn alter_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        config: StreamConfig,
    ) -> Result<StreamInfo, ClientError> {
        self.call_stream(Request::AlterStream {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            config,
        })
        .await
    }

    /// A stream's settings and, for a durable stream, each shard's offsets on this broker.
    pub async fn describe_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<StreamInfo, ClientError> {
        self.call_stream(Request::DescribeStream {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
        .await
    }

    /// The streams of a namespace.
    pub async fn list_streams(
        &self,
        tenant: &str,
        namespace: &str,
    ) -> Result<Vec<StreamInfo>, ClientError> {
        match self
            .call(Request::ListStreams {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
            })
            .await?
        {
            Response::Streams { streams } => Ok(streams),
            other => Err(unexpected("ListStreams", &other)),
        }
    }

    /// A stream's segments and objects (every shard, oldest first).
    pub async fn list_segments(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<Vec<SegmentInfo>, ClientError> {
        match self
            .call(Request::ListSegments {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                stream: stream.to_owned(),
            })
            .await?
        {
            Response::Segments { segments } => Ok(segments),
            other => Err(unexpected("ListSegments", &other)),
        }
    }

    /// Who leads each shard of a stream and the cluster's brokers, as this broker knows
    /// them: the routing table of a [`ClusterClient`], which calls this for you.
    ///
    /// ```no_run
    /// # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
    /// let topology = client.topology("acme", "prod", "orders").await?;
    /// for route in &topology.shards {
    ///     println!("shard {} led by {:?} at {:?}", route.shard, route.leader, route.leader_addr);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn topology(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<Topology, ClientError> {
        let request = Request::Topology {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
        };
        match self.call(request).await? {
            Response::Topology { shards, brokers } => Ok(Topology::new(shards, brokers)),
            other => Err(unexpected("Topology", &other)),
        }
    }

    /// Deletes a stream and its records.
    pub async fn delete_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), ClientError> {
        self.forget_shards(tenant, namespace, name);
        self.call_done(Request::DeleteStream {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
        .await
    }

    /// Asks for an idempotent producer id and epoch (the broker must support
    /// [`features::IDEMPOTENT_PRODUCER`]).
    pub async fn producer_init(&self) -> Result<(i64, i16), ClientError> {
        match self.call(Request::ProducerInit {}).await? {
            Response::ProducerId { producer_id, epoch } => Ok((producer_id, epoch)),
            other => Err(unexpected("ProducerInit", &other)),
        }
    }

    fn remember_shards(&self, info: &StreamInfo) {
        let count = shard_count_of(info);
        if let Ok(mut map) = self.inner.shard_counts.lock() {
            map.insert(stream_key(&info.tenant, &info.namespace, &info.name), count);
        }
    }

    fn forget_shards(&self, tenant: &str, namespace: &str, stream: &str) {
        if let Ok(mut map) = self.inner.shard_counts.lock() {
            map.remove(&stream_key(tenant, namespace, stream));
        }
    }

    /// How many shards a stream has: cached from the last describe (or create/alter) of it,
    /// described when not known yet.
    pub async fn shard_count(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<u32, ClientError> {
        let cached = self
            .inner
            .shard_counts
            .lock()
            .ok()
            .and_then(|m| m.get(&stream_key(tenant, namespace, stream)).copied());
        match cached {
            Some(n) => Ok(n),
            None => Ok(shard_count_of(
                &self.describe_stream(tenant, namespace, stream).await?,
            )),
        }
    }

    /// Publishes one message; returns where it landed. With [`AckMode::None`] it returns
    /// `None` once the broker has taken the request (queued, not yet written; the broker
    /// may still shed it under load).
    ///
    /// ```no_run
    /// # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
    /// use felix_client::{AckMode, Message};
    /// let ack = client
    ///     .publish("acme", "prod", "orders", Message::new("hello").with_key("user-7"), AckMode::Batch)
    ///     .await?;
    /// if let Some(p) = ack {
    ///     println!("shard {} offset {}", p.shard, p.base_offset);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn publish(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        message: Message,
        ack: AckMode,
    ) -> Result<Option<Published>, ClientError> {
        let mut published = self
            .publish_batch(tenant, namespace, stream, vec![message], ack)
            .await?;
        Ok(published.pop())
    }

    /// Publishes messages: each shard's share goes as one RecordBatch in one request, the
    /// requests for different shards concurrently. Order is kept within a shard. Returns one
    /// [`Published`] per shard, in shard order (empty for [`AckMode::None`]).
    ///
    /// On error nothing says which shards were written: use
    /// [`Client::publish_batch_detailed`] for a per-shard outcome.
    ///
    /// ```no_run
    /// # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
    /// use felix_client::{AckMode, Message};
    /// // Key-less messages of one call go to one shard (round-robin per call), in order.
    /// let msgs = vec![Message::new("msg1"), Message::new("msg2"), Message::new("msg3")];
    /// let acks = client.publish_batch("acme", "prod", "orders", msgs, AckMode::Batch).await?;
    /// assert_eq!(acks.len(), 1);
    /// assert_eq!(acks[0].last_offset - acks[0].base_offset, 2);
    /// # Ok(()) }
    /// ```
    pub async fn publish_batch(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        messages: Vec<Message>,
        ack: AckMode,
    ) -> Result<Vec<Published>, ClientError> {
        let outcomes = self
            .publish_batch_detailed(tenant, namespace, stream, messages, ack)
            .await?;
        let mut published = Vec::with_capacity(outcomes.len());
        for outcome in outcomes {
            if let Some(p) = outcome.result? {
                published.push(p);
            }
        }
        Ok(published)
    }

    /// Like [`Client::publish_batch`], but reports each shard's outcome separately, with the
    /// positions of the messages it carried: the `i`-th position of an acknowledged shard has
    /// offset `base_offset + i`. The outer error is for failures before anything was sent
    /// (the stream's shard count could not be learned).
    ///
    /// A shard refused as `unknown_shard` (the stream's shard count changed) is retried once
    /// with the new count when no shard of the call was written.
    pub async fn publish_batch_detailed(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        messages: Vec<Message>,
        ack: AckMode,
    ) -> Result<Vec<ShardOutcome>, ClientError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let messages = Arc::new(messages);
        let mut retried = false;
        loop {
            let shards = self.shard_count(tenant, namespace, stream).await?;
            let keyless = if messages.iter().any(|m| m.key.is_none()) {
                self.inner.round_robin.fetch_add(1, Ordering::Relaxed) % shards.max(1)
            } else {
                0
            };
            let plan = publish::place(&messages, shards, keyless);
            let outcomes = self
                .send_plan(tenant, namespace, stream, &messages, plan, ack)
                .await;
            let unknown_shard = |o: &ShardOutcome| matches!(&o.result, Err(e) if e.code() == Some(codes::UNKNOWN_SHARD));
            if outcomes.iter().any(unknown_shard) {
                self.forget_shards(tenant, namespace, stream);
                if !retried && outcomes.iter().all(unknown_shard) {
                    retried = true;
                    continue;
                }
            }
            return Ok(outcomes);
        }
    }

    async fn send_plan(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        messages: &Arc<Vec<Message>>,
        plan: Vec<(u32, Vec<usize>)>,
        ack: AckMode,
    ) -> Vec<ShardOutcome> {
        let now = publish::now_ms();
        if let [(shard, indices)] = plan.as_slice() {
            // The common case (one key, or key-less): no task to spawn.
            let result = self
                .publish_shard(
                    tenant, namespace, stream, messages, indices, *shard, ack, now,
                )
                .await;
            return vec![ShardOutcome {
                shard: *shard,
                indices: indices.clone(),
                result,
            }];
        }
        let mut tasks = tokio::task::JoinSet::new();
        for (pos, (shard, indices)) in plan.iter().enumerate() {
            let client = self.clone();
            let (t, ns, s) = (tenant.to_owned(), namespace.to_owned(), stream.to_owned());
            let messages = messages.clone();
            let (shard, indices) = (*shard, indices.clone());
            tasks.spawn(async move {
                let result = client
                    .publish_shard(&t, &ns, &s, &messages, &indices, shard, ack, now)
                    .await;
                (pos, result)
            });
        }
        let mut results: Vec<Option<Result<Option<Published>, ClientError>>> =
            plan.iter().map(|_| None).collect();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((pos, result)) => results[pos] = Some(result),
                Err(e) => tracing::error!("publish task failed: {e}"),
            }
        }
        plan.into_iter()
            .zip(results)
            .map(|((shard, indices), result)| ShardOutcome {
                shard,
                indices,
                result: result.unwrap_or_else(|| {
                    Err(ClientError::Transport("the publish task was lost".into()))
                }),
            })
            .collect()
    }

    /// Publishes record batches already encoded as RecordBatch v2 (one or more, end to end)
    /// to one shard, as they are: the broker stamps offsets and stores the bytes. Used by
    /// [`IdempotentProducer`], whose batches carry a producer id and sequence and must be
    /// re-sent byte for byte.
    pub async fn publish_raw(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
        batches: Bytes,
        ack: AckMode,
    ) -> Result<Option<Published>, ClientError> {
        Ok(self
            .publish_raw_tracked(tenant, namespace, stream, shard, batches, ack)
            .await?)
    }

    /// [`Client::publish_raw`], saying on failure whether the request was sent (the cluster
    /// client re-sends a refused publish, never an ambiguous one unless idempotent).
    pub(crate) async fn publish_raw_tracked(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
        batches: Bytes,
        ack: AckMode,
    ) -> Result<Option<Published>, request::Failed> {
        let ack = match ack {
            AckMode::Batch if self.inner.ack_on_commit => AckMode::Commit,
            other => other,
        };
        let request = Request::Publish {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
            shard,
            ack,
        };
        let acknowledged = ack != AckMode::None;
        let response = request::call_tracked(
            &self.inner.conn,
            &request,
            batches,
            self.inner.max_frame,
            self.inner.request_timeout,
            acknowledged,
        )
        .await?;
        match response {
            Response::Done {} if !acknowledged => Ok(None),
            Response::Published {
                shard,
                base_offset,
                last_offset,
            } => Ok(Some(Published {
                shard,
                base_offset,
                last_offset,
            })),
            other => Err(request::Failed {
                error: unexpected("Publish", &other),
                sent: true,
            }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn publish_shard(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        messages: &[Message],
        indices: &[usize],
        shard: u32,
        ack: AckMode,
        now: i64,
    ) -> Result<Option<Published>, ClientError> {
        let body = publish::encode_batch(messages, indices, self.compression, now, None)?;
        let published = self
            .publish_raw(tenant, namespace, stream, shard, body, ack)
            .await?;
        if let Some(p) = &published {
            let expected = indices.len() as u64;
            if p.last_offset.checked_sub(p.base_offset).map(|d| d + 1) != Some(expected) {
                tracing::warn!(
                    shard,
                    base_offset = p.base_offset,
                    last_offset = p.last_offset,
                    records = expected,
                    "the broker's offsets do not span the records sent"
                );
            }
        }
        Ok(published)
    }

    /// Subscribes to one shard of a stream from `from`. Answers once the broker has opened
    /// the subscription (within the request timeout); records then come from
    /// [`Subscription::next_event`].
    ///
    /// ```no_run
    /// # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
    /// use felix_client::StartAt;
    /// let mut sub = client.subscribe("acme", "prod", "orders", 0, StartAt::Latest).await?;
    /// while let Some(event) = sub.next_event().await? {
    ///     println!("{} {}", event.offset, String::from_utf8_lossy(&event.payload));
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn subscribe(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
        from: StartAt,
    ) -> Result<Subscription, ClientError> {
        let request = Request::Subscribe {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
            shard,
            from,
        };
        let max = self.inner.max_frame;
        let frame = request::encode_request(&request, Bytes::new(), max)?;
        tokio::time::timeout(self.inner.request_timeout, async {
            let mut open = request::open(&self.inner.conn, &frame).await?;
            match request::read_response(&mut open.recv, max).await? {
                Response::SubscribeOk {
                    start_offset,
                    live_offset,
                } => Ok(Subscription::new(
                    shard,
                    start_offset,
                    live_offset,
                    open.recv,
                    max,
                )),
                other => Err(unexpected("Subscribe", &other)),
            }
        })
        .await
        .map_err(|_| ClientError::Timeout)?
    }
}

fn round_robin_seed() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id().rotate_left(16)
}

/// The shard count a description gives (at least 1).
fn shard_count_of(info: &StreamInfo) -> u32 {
    info.config
        .shards
        .or_else(|| u32::try_from(info.shards.len()).ok().filter(|&n| n > 0))
        .unwrap_or(1)
        .max(1)
}

fn request_name(request: &Request) -> &'static str {
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
    }
}

pub(crate) fn unexpected(request: &str, response: &Response) -> ClientError {
    ClientError::Protocol(format!("unexpected answer to {request}: {response:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_split_for_names_and_both_ip_families() {
        assert_eq!(
            split_host_port("127.0.0.1:5000").unwrap(),
            ("127.0.0.1".into(), 5000)
        );
        assert_eq!(
            split_host_port("broker.local:1").unwrap(),
            ("broker.local".into(), 1)
        );
        assert_eq!(split_host_port("[::1]:5000").unwrap(), ("::1".into(), 5000));
        for bad in [
            "",
            "host",
            ":5000",
            "host:",
            "host:99999",
            "::1:5000",
            "[::1:5000",
        ] {
            assert!(
                matches!(split_host_port(bad), Err(ClientError::InvalidArgument(_))),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn shard_count_comes_from_the_config_then_the_shard_list() {
        let mut info = StreamInfo {
            tenant: "t".into(),
            namespace: "n".into(),
            name: "s".into(),
            version: 1,
            config: StreamConfig {
                shards: Some(6),
                ..Default::default()
            },
            shards: Vec::new(),
            cache_hits: 0,
            cache_misses: 0,
        };
        assert_eq!(shard_count_of(&info), 6);
        info.config.shards = None;
        assert_eq!(shard_count_of(&info), 1);
        info.shards = (0..3)
            .map(|shard| ShardInfo {
                shard,
                first_offset: 0,
                next_offset: 0,
                hot_first_offset: 0,
                hot_bytes: 0,
                cold_bytes: 0,
                uploaded_end: 0,
                upload_backlog_segments: 0,
                upload_backlog_bytes: 0,
            })
            .collect();
        assert_eq!(shard_count_of(&info), 3);
        info.config.shards = Some(0);
        assert_eq!(shard_count_of(&info), 1);
    }

    #[test]
    fn the_default_config_matches_the_documented_defaults() {
        let c = ClientConfig::default();
        assert_eq!(c.request_timeout, Duration::from_secs(30));
        assert_eq!(c.compression, Compression::None);
        assert!(!c.insecure && c.ca.is_none());
        assert_eq!(c.max_frame, DEFAULT_MAX_FRAME);
    }
}
