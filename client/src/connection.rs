//! One QUIC connection to one broker: the `Hello` exchange, then every request on its own
//! bidirectional stream. A [`Connection`] is what a [`crate::Client`] keeps per broker, and
//! the public way to pin requests to one broker.
//!
//! Invariant: a connection talks to the broker that answered its `Hello` and nothing else;
//! it never routes, never re-sends, and says on failure whether a request was sent
//! (`request::Failed`), so that the client above it decides what may be retried.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use felix_wire::Compression;
use felix_wire::protocol::{
    AckMode, PROTOCOL_VERSION, Request, Response, StartAt, StreamInfo, codes, features,
};

use crate::admin::StreamOp;
use crate::publish::{self, Message, Published, ShardOutcome};
use crate::{
    ClientConfig, ClientError, StreamKey, Subscription, Topology, request, round_robin_seed,
    stream_key, tls, unexpected,
};

/// A connection to one Felix broker: every request goes to that broker, as it is. Cheap to clone (clones share the connection); every
/// method can be called concurrently. Dropping the last clone closes the connection.
#[derive(Clone)]
pub struct Connection {
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
    /// Request streams kept open for the next cache request (`REUSED_STREAMS`).
    idle: crate::reuse::IdleStreams,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
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

impl Connection {
    /// Connects to the broker at `addr` (`host:port`; a name is resolved and every address
    /// it has is tried at once, the first handshake wins) and says `Hello`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), felix_client::ClientError> {
    /// use felix_client::{Connection, ClientConfig};
    /// let config = ClientConfig { ca: Some("ca.pem".into()), ..Default::default() };
    /// let client = Connection::connect("broker-1.internal:5000", config).await?;
    /// println!("connected to broker {}", client.broker_id());
    /// # Ok(()) }
    /// ```
    pub async fn connect(addr: &str, config: ClientConfig) -> Result<Connection, ClientError> {
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
    ) -> Result<Connection, ClientError> {
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
            token: config.token.clone(),
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
        Ok(Connection {
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
                idle: Default::default(),
            }),
            compression: config.compression,
        })
    }

    /// The same connection, publishing with another codec.
    pub fn with_compression(&self, compression: Compression) -> Connection {
        Connection {
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

    /// Whether the connection is closed (lost, or closed by [`Connection::close`]): every
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

    /// Presents a fresh token on this live connection: every later request is checked
    /// against it (a broker with auth off accepts and ignores it). On `unauthorized` the
    /// connection keeps the token it had.
    pub async fn set_token(&self, token: &str) -> Result<(), ClientError> {
        match self
            .call(Request::Authenticate {
                token: token.to_owned(),
            })
            .await?
        {
            Response::Done {} => Ok(()),
            other => Err(unexpected("Authenticate", &other)),
        }
    }

    /// One admin request to this broker: never re-sent, so `idempotent` does not matter.
    async fn admin(&self, request: Request, _idempotent: bool) -> Result<Response, ClientError> {
        self.call(request).await
    }

    /// A delete forgets the stream's shard count before it is sent.
    fn stream_op_starts(&self, op: StreamOp, key: &StreamKey) {
        if op == StreamOp::Delete {
            self.forget_shards(key);
        }
    }

    /// Whatever describes a stream tells its shard count.
    fn stream_op_done(&self, _op: StreamOp, info: &StreamInfo) {
        self.remember_shards(info);
    }

    admin_requests!();
    rbac_requests!();
    cluster_requests!();

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

    /// One request whose answer has a body, within `timeout` (a group poll waits longer
    /// than the request timeout).
    pub(crate) async fn call_with_body(
        &self,
        request: &Request,
        body: Bytes,
        timeout: Duration,
    ) -> Result<(Response, Bytes), request::Failed> {
        request::call_with_body(
            &self.inner.conn,
            request,
            body,
            self.inner.max_frame,
            timeout,
            self.has_feature(features::BINARY_GROUP_HEADERS),
        )
        .await
    }

    /// A cache request and its answer's body, within `timeout`: on a reused stream when
    /// the broker agreed to `REUSED_STREAMS`, else on a stream of its own.
    pub(crate) async fn call_cache(
        &self,
        request: &Request,
        body: Bytes,
        timeout: Duration,
    ) -> Result<(Response, Bytes), request::Failed> {
        if !self.has_feature(features::REUSED_STREAMS) {
            return self.call_with_body(request, body, timeout).await;
        }
        crate::reuse::call_reusing(
            &self.inner.conn,
            &self.inner.idle,
            request,
            body,
            self.inner.max_frame,
            timeout,
            self.has_feature(features::BINARY_CACHE_HEADERS),
        )
        .await
    }

    /// The frame limit this connection was made with.
    pub(crate) fn max_frame(&self) -> usize {
        self.inner.max_frame
    }

    /// The QUIC connection underneath.
    pub(crate) fn quinn(&self) -> &quinn::Connection {
        &self.inner.conn
    }

    /// The request timeout this connection was made with.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    /// Who leads each shard of a stream and the cluster's brokers, as this broker knows
    /// them: the routing table of a [`crate::Client`], which calls this for you.
    ///
    /// ```no_run
    /// # async fn demo(client: felix_client::Connection) -> Result<(), felix_client::ClientError> {
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

    fn remember_shards(&self, info: &StreamInfo) {
        let count = shard_count_of(info);
        if let Ok(mut map) = self.inner.shard_counts.lock() {
            map.insert(stream_key(&info.tenant, &info.namespace, &info.name), count);
        }
    }

    fn forget_shards(&self, key: &StreamKey) {
        if let Ok(mut map) = self.inner.shard_counts.lock() {
            map.remove(key);
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

    /// The publish of `publish_batch_detailed` on this broker: a shard refused as
    /// `unknown_shard` (the stream's shard count changed) is retried once with the new count
    /// when no shard of the call was written.
    async fn publish_each_shard(
        &self,
        (tenant, namespace, stream): &StreamKey,
        messages: Arc<Vec<Message>>,
        ack: AckMode,
    ) -> Result<Vec<ShardOutcome>, ClientError> {
        let mut retried = false;
        loop {
            let shards = self.shard_count(tenant, namespace, stream).await?;
            let plan = publish::place_in_turn(&messages, shards, &self.inner.round_robin);
            let now = publish::now_ms();
            let outcomes = publish::send_each(plan, true, |shard, indices| {
                let (conn, messages) = (self.clone(), messages.clone());
                let (t, ns, s) = (tenant.to_owned(), namespace.to_owned(), stream.to_owned());
                async move {
                    conn.publish_shard(&t, &ns, &s, &messages, &indices, shard, ack, now)
                        .await
                }
            })
            .await;
            let unknown_shard = |o: &ShardOutcome| matches!(&o.result, Err(e) if e.code() == Some(codes::UNKNOWN_SHARD));
            if outcomes.iter().any(unknown_shard) {
                self.forget_shards(&stream_key(tenant, namespace, stream));
                if !retried && outcomes.iter().all(unknown_shard) {
                    retried = true;
                    continue;
                }
            }
            return Ok(outcomes);
        }
    }

    /// Publishes record batches already encoded as RecordBatch v2 (one or more, end to end)
    /// to one shard, as they are: the broker stamps offsets and stores the bytes. Used by
    /// [`crate::IdempotentProducer`], whose batches carry a producer id and sequence and must be
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

    /// [`Connection::publish_raw`], saying on failure whether the request was sent (the cluster
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
    /// # async fn demo(client: felix_client::Connection) -> Result<(), felix_client::ClientError> {
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

/// The shard count a description gives (at least 1).
fn shard_count_of(info: &StreamInfo) -> u32 {
    info.config
        .shards
        .or_else(|| u32::try_from(info.shards.len()).ok().filter(|&n| n > 0))
        .unwrap_or(1)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ShardInfo, StreamConfig};

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
}
