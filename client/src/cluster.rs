//! A client of a Felix cluster: it sends each shard's publishes and subscriptions to the
//! shard's leader, follows leadership as it moves, and sends admin requests to any live
//! broker.
//!
//! Invariant: a publish is re-sent only when the broker certainly did not act on it
//! (refused with `not_leader` / `shard_unavailable`, or never got the whole request); an
//! ambiguous outcome (connection lost after sending, `quorum_timeout`, timeout) is returned
//! to the caller, except by an [`IdempotentClusterProducer`], whose re-sends the leader
//! recognises by (producer id, sequence). No new try starts once `request_timeout` has
//! passed since the call began.
//!
//! Modules: `routes` holds the routing table (who leads which shard), `pool` the one
//! connection per broker, `retry` what may be retried and the backoff, `subscription` the
//! subscription that resumes on the new leader, `idempotent` the cluster's idempotent
//! producer.

mod idempotent;
mod pool;
mod retry;
mod routes;
mod subscription;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use felix_wire::protocol::{AckMode, ErrorBody, Request, Response, StreamConfig, codes};
use tokio::time::Instant;

pub use idempotent::IdempotentClusterProducer;
pub use routes::{BrokerRoute, ShardRoute, Topology};
pub use subscription::ClusterSubscription;

use crate::publish::{self, Message, Published, ShardOutcome};
use crate::request::Failed;
use crate::{
    Client, ClientConfig, ClientError, SegmentInfo, StreamInfo, StreamKey, stream_key, unexpected,
};
use pool::Pool;
use retry::{Backoff, Deadline, Verdict, classify, may_retry};
use routes::{Route, RouteTable};

/// No broker preferred for admin requests yet.
const NO_BROKER: u64 = u64::MAX;
/// How long a publish is in flight before the client starts checking, with another broker,
/// whether its shard's leader has changed meanwhile.
const LEADER_CHECK_AFTER: Duration = Duration::from_secs(1);
/// How often it checks after that.
const LEADER_CHECK_EVERY: Duration = Duration::from_millis(500);

/// A client of a Felix cluster. Publishes and subscriptions go to each shard's leader, and
/// follow it when leadership moves (`not_leader`, `shard_unavailable`, a lost broker);
/// admin requests go to any live broker. Keeps one [`Client`] connection per broker,
/// opened when first needed. Cheap to clone (clones share everything); every method can be
/// called concurrently.
///
/// ```no_run
/// use felix_client::{ClientConfig, ClusterClient, Message, StartAt, StreamConfig};
///
/// # async fn demo() -> Result<(), felix_client::ClientError> {
/// let seeds = ["10.0.0.1:5000", "10.0.0.2:5000", "10.0.0.3:5000"];
/// let cluster = ClusterClient::connect(seeds, ClientConfig::default()).await?;
/// cluster.create_tenant("acme").await?;
/// cluster.create_namespace("acme", "prod").await?;
/// let config = StreamConfig { durable: Some(true), shards: Some(4), replicas: Some(3), ..Default::default() };
/// cluster.create_stream("acme", "prod", "orders", config).await?;
///
/// let p = cluster.publish("acme", "prod", "orders", Message::new("paid").with_key("order-42")).await?;
/// let mut sub = cluster.subscribe("acme", "prod", "orders", p.shard, StartAt::Offset(p.base_offset)).await?;
/// let event = sub.next_event().await?.expect("the record just published");
/// assert_eq!(&event.payload[..], b"paid");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ClusterClient {
    inner: Arc<Shared>,
}

struct Shared {
    config: ClientConfig,
    seeds: Vec<String>,
    pool: Pool,
    routes: Mutex<RouteTable>,
    /// The broker admin requests go to while it answers (`NO_BROKER` before the first).
    preferred: AtomicU64,
    /// Streams this client created, and when: a broker that does not know them yet is
    /// asked again rather than believed.
    created: Mutex<HashMap<StreamKey, Instant>>,
    /// Picks the shard of each call's key-less messages.
    round_robin: AtomicU32,
}

impl std::fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterClient")
            .field("seeds", &self.inner.seeds)
            .field("connected", &self.connected_brokers())
            .finish()
    }
}

/// A try at one shard that failed: why, whether the request was sent, and the routes
/// version it was routed by (to refresh them once among concurrent callers).
struct TryFailure {
    error: ClientError,
    sent: bool,
    /// The broker the request went to, when it got that far.
    broker: Option<u64>,
    version: Option<u64>,
}

/// A publish to one shard that gave up: the error, and whether the records may have been
/// written anyway (some try had an unknown outcome).
pub(crate) struct PublishFailure {
    pub error: ClientError,
    pub maybe_written: bool,
}

fn broker_error(code: u16, reason: &str, message: String) -> ClientError {
    ClientError::Broker(ErrorBody::new(code, reason, message))
}

impl ClusterClient {
    /// Connects to the cluster through the first seed that answers (`HOST:PORT` each; all
    /// are tried at once). The other brokers are found in the topology and connected to
    /// when a shard they lead is used.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), felix_client::ClientError> {
    /// use felix_client::{ClientConfig, ClusterClient};
    /// let config = ClientConfig { ca: Some("ca.pem".into()), ..Default::default() };
    /// let cluster = ClusterClient::connect(["broker-1:5000", "broker-2:5000"], config).await?;
    /// println!("connected to brokers {:?}", cluster.connected_brokers());
    /// # Ok(()) }
    /// ```
    pub async fn connect<I, S>(seeds: I, config: ClientConfig) -> Result<ClusterClient, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let seeds: Vec<String> = seeds.into_iter().map(|s| s.as_ref().to_owned()).collect();
        if seeds.is_empty() {
            return Err(ClientError::InvalidArgument(
                "a cluster client needs at least one seed broker".into(),
            ));
        }
        let cluster = ClusterClient {
            inner: Arc::new(Shared {
                pool: Pool::new(config.clone()),
                config,
                seeds,
                routes: Mutex::new(RouteTable::default()),
                preferred: AtomicU64::new(NO_BROKER),
                created: Mutex::new(HashMap::new()),
                round_robin: AtomicU32::new(crate::round_robin_seed()),
            }),
        };
        let deadline = Deadline::after(cluster.inner.config.request_timeout);
        let seeds = cluster.inner.seeds.clone();
        cluster.dial_first(&seeds, &deadline, true).await?;
        Ok(cluster)
    }

    /// The configuration every connection uses.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The seed addresses given to [`ClusterClient::connect`].
    pub fn seeds(&self) -> &[String] {
        &self.inner.seeds
    }

    /// The ids of the brokers this client holds an open connection to.
    pub fn connected_brokers(&self) -> Vec<u64> {
        self.inner
            .pool
            .open_all()
            .iter()
            .map(Client::broker_id)
            .collect()
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, RouteTable> {
        self.inner.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn budget(&self) -> Deadline {
        Deadline::after(self.inner.config.request_timeout)
    }

    /// Connects to the first of `addrs` to answer (all at once), keeps the connection and
    /// prefers that broker for admin requests.
    async fn dial_first(
        &self,
        addrs: &[String],
        deadline: &Deadline,
        full_timeout: bool,
    ) -> Result<Client, ClientError> {
        let mut attempts = tokio::task::JoinSet::new();
        for addr in addrs {
            let (addr, config) = (addr.clone(), self.inner.config.clone());
            let limit = if full_timeout {
                config.request_timeout
            } else {
                pool::CONNECT_TIMEOUT.min(config.request_timeout)
            }
            .min(deadline.remaining());
            attempts.spawn(async move {
                match tokio::time::timeout(limit, Client::connect(&addr, config)).await {
                    Ok(result) => result.map(|c| (addr, c)),
                    Err(_) => Err(ClientError::Connect(format!(
                        "{addr}: no answer within {limit:?}"
                    ))),
                }
            });
        }
        let mut last_error = None;
        while let Some(joined) = attempts.join_next().await {
            match joined {
                Ok(Ok((addr, client))) => {
                    attempts.abort_all();
                    let client = self.inner.pool.insert(client).await;
                    self.routes().learn_broker(client.broker_id(), &addr);
                    self.inner
                        .preferred
                        .store(client.broker_id(), Ordering::Relaxed);
                    return Ok(client);
                }
                Ok(Err(e)) => last_error = Some(e),
                Err(e) => last_error = Some(ClientError::Connect(e.to_string())),
            }
        }
        Err(last_error.unwrap_or_else(|| ClientError::Connect("no broker to connect to".into())))
    }

    /// A live connection for an admin request: to the preferred broker, else any open one,
    /// else the first known broker or seed that answers.
    pub async fn any_client(&self) -> Result<Client, ClientError> {
        self.live_client(&self.budget(), None).await
    }

    /// A live connection, not to `avoid` (a broker that just failed) while another broker
    /// answers.
    async fn live_client(
        &self,
        deadline: &Deadline,
        avoid: Option<u64>,
    ) -> Result<Client, ClientError> {
        let preferred = self.inner.preferred.load(Ordering::Relaxed);
        if preferred != NO_BROKER
            && Some(preferred) != avoid
            && let Some(client) = self.inner.pool.open(preferred)
        {
            return Ok(client);
        }
        let open = self.inner.pool.open_all();
        if let Some(client) = open.iter().find(|c| Some(c.broker_id()) != avoid) {
            self.inner
                .preferred
                .store(client.broker_id(), Ordering::Relaxed);
            return Ok(client.clone());
        }
        let mut addrs: Vec<String> = self
            .routes()
            .live_brokers()
            .into_iter()
            .filter(|(id, _)| Some(*id) != avoid)
            .map(|(_, addr)| addr)
            .collect();
        for seed in &self.inner.seeds {
            if !addrs.contains(seed) {
                addrs.push(seed.clone());
            }
        }
        match self.dial_first(&addrs, deadline, false).await {
            Ok(client) => Ok(client),
            // Nobody else answers: the broker to avoid is better than none.
            Err(e) => open.into_iter().next().ok_or(e),
        }
    }

    /// Runs `op` on a live broker, trying again (another broker once this one's connection
    /// is lost) while the failure is retryable: refusals and failures to send always, other
    /// transport failures only when `idempotent`.
    async fn on_any_broker<T, F, Fut>(
        &self,
        idempotent: bool,
        deadline: &Deadline,
        op: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, Failed>>,
    {
        let mut backoff = Backoff::new();
        let mut avoid = None;
        loop {
            let (error, sent) = match self.live_client(deadline, avoid).await {
                Ok(client) => match op(client.clone()).await {
                    Ok(value) => return Ok(value),
                    Err(Failed { error, sent }) => {
                        // The next try goes to another broker if one answers.
                        avoid = Some(client.broker_id());
                        (error, sent)
                    }
                },
                Err(error) => (error, false),
            };
            if !may_retry(&error, sent, idempotent) {
                return Err(error);
            }
            let wait = backoff.next_delay(&error);
            if !deadline.allows(wait) {
                return Err(error);
            }
            tracing::debug!(%error, ?wait, "admin request failed; retrying");
            tokio::time::sleep(wait).await;
        }
    }

    /// One admin request to any live broker.
    async fn admin(&self, request: Request, idempotent: bool) -> Result<Response, ClientError> {
        let request = &request;
        self.on_any_broker(idempotent, &self.budget(), |client: Client| async move {
            client.call_tracked(request).await
        })
        .await
    }

    async fn admin_done(&self, request: Request) -> Result<(), ClientError> {
        let what = crate::request_name(&request);
        match self.admin(request, false).await? {
            Response::Done {} => Ok(()),
            other => Err(unexpected(what, &other)),
        }
    }

    async fn admin_stream(
        &self,
        request: Request,
        idempotent: bool,
    ) -> Result<StreamInfo, ClientError> {
        let what = crate::request_name(&request);
        match self.admin(request, idempotent).await? {
            Response::Stream { stream } => Ok(stream),
            other => Err(unexpected(what, &other)),
        }
    }

    /// Creates a tenant (on any live broker; re-sent only if it certainly was not sent).
    pub async fn create_tenant(&self, name: &str) -> Result<(), ClientError> {
        self.admin_done(Request::CreateTenant {
            name: name.to_owned(),
        })
        .await
    }

    /// Creates a namespace in a tenant.
    pub async fn create_namespace(&self, tenant: &str, name: &str) -> Result<(), ClientError> {
        self.admin_done(Request::CreateNamespace {
            tenant: tenant.to_owned(),
            name: name.to_owned(),
        })
        .await
    }

    /// Creates a stream, as [`Client::create_stream`]. Its shards may have no leader for a
    /// moment: publishes and subscriptions wait for one (within the request timeout).
    pub async fn create_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        config: StreamConfig,
    ) -> Result<StreamInfo, ClientError> {
        let key = stream_key(tenant, namespace, name);
        self.routes().forget(&key);
        let info = self
            .admin_stream(
                Request::CreateStream {
                    tenant: tenant.to_owned(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    config,
                },
                false,
            )
            .await?;
        self.inner
            .created
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Instant::now());
        Ok(info)
    }

    /// Changes the settings set in `config`, as [`Client::alter_stream`].
    pub async fn alter_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        config: StreamConfig,
    ) -> Result<StreamInfo, ClientError> {
        let info = self
            .admin_stream(
                Request::AlterStream {
                    tenant: tenant.to_owned(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    config,
                },
                false,
            )
            .await?;
        self.routes().forget(&stream_key(tenant, namespace, name));
        Ok(info)
    }

    /// A stream's settings and, per shard, its offsets on the broker that answered.
    pub async fn describe_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<StreamInfo, ClientError> {
        self.admin_stream(
            Request::DescribeStream {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            },
            true,
        )
        .await
    }

    /// The streams of a namespace.
    pub async fn list_streams(
        &self,
        tenant: &str,
        namespace: &str,
    ) -> Result<Vec<StreamInfo>, ClientError> {
        let request = Request::ListStreams {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
        };
        match self.admin(request, true).await? {
            Response::Streams { streams } => Ok(streams),
            other => Err(unexpected("ListStreams", &other)),
        }
    }

    /// A stream's segments and objects, as the broker that answered holds them.
    pub async fn list_segments(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<Vec<SegmentInfo>, ClientError> {
        let request = Request::ListSegments {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
        };
        match self.admin(request, true).await? {
            Response::Segments { segments } => Ok(segments),
            other => Err(unexpected("ListSegments", &other)),
        }
    }

    /// Deletes a stream and its records.
    pub async fn delete_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), ClientError> {
        let key = stream_key(tenant, namespace, name);
        self.routes().forget(&key);
        self.inner
            .created
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        self.admin_done(Request::DeleteStream {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
        .await
    }

    /// Asks any live broker for an idempotent producer id and epoch.
    pub async fn producer_init(&self) -> Result<(i64, i16), ClientError> {
        match self.admin(Request::ProducerInit {}, true).await? {
            Response::ProducerId { producer_id, epoch } => Ok((producer_id, epoch)),
            other => Err(unexpected("ProducerInit", &other)),
        }
    }

    /// A fresh topology of the stream from a live broker; the routing table takes it too.
    ///
    /// ```no_run
    /// # async fn demo(cluster: felix_client::ClusterClient) -> Result<(), felix_client::ClientError> {
    /// let topology = cluster.topology("acme", "prod", "orders").await?;
    /// let (leader, addr) = topology.leader(0).expect("shard 0 has a leader");
    /// println!("shard 0 is led by broker {leader} at {addr}");
    /// # Ok(()) }
    /// ```
    pub async fn topology(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<Topology, ClientError> {
        let key = stream_key(tenant, namespace, stream);
        self.load_routes(&key, &self.budget()).await
    }

    /// Fetches a stream's topology (retrying within `deadline`) and applies it. A stream
    /// this client created lately that the broker does not know yet is asked for again.
    async fn load_routes(
        &self,
        key: &StreamKey,
        deadline: &Deadline,
    ) -> Result<Topology, ClientError> {
        let created_lately = self
            .inner
            .created
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .is_some_and(|at| at.elapsed() < self.inner.config.request_timeout);
        let (t, ns, s) = key;
        let topology = self
            .on_any_broker(true, deadline, |client: Client| async move {
                match client.topology(t, ns, s).await {
                    Err(e) if created_lately && e.code() == Some(codes::UNKNOWN_STREAM) => {
                        Err(Failed {
                            error: broker_error(
                                codes::METADATA_UNAVAILABLE,
                                "unknown_stream",
                                format!(
                                    "broker {} does not know the stream {t}/{ns}/{s} created lately",
                                    client.broker_id()
                                ),
                            ),
                            sent: true,
                        })
                    }
                    other => other.map_err(|error| Failed { error, sent: true }),
                }
            })
            .await?;
        self.routes().apply_topology(key, &topology);
        Ok(topology)
    }

    /// How many shards a stream has (from the routing table, fetched when unknown).
    pub async fn shard_count(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<u32, ClientError> {
        let key = stream_key(tenant, namespace, stream);
        self.shard_count_of(&key, &self.budget()).await
    }

    async fn shard_count_of(
        &self,
        key: &StreamKey,
        deadline: &Deadline,
    ) -> Result<u32, ClientError> {
        if let Some(n) = self.routes().shard_count(key) {
            return Ok(n);
        }
        Ok(self.load_routes(key, deadline).await?.shard_count())
    }

    /// The leader's connection for one shard, and the routes version it was chosen by.
    async fn leader_client(
        &self,
        key: &StreamKey,
        shard: u32,
        deadline: &Deadline,
    ) -> Result<(Client, Option<u64>), TryFailure> {
        let not_sent = |error: ClientError, version| TryFailure {
            error,
            sent: false,
            broker: None,
            version,
        };
        let mut refreshed = false;
        loop {
            let (route, version) = {
                let table = self.routes();
                (table.route(key, shard), table.version(key))
            };
            match route {
                None if !refreshed => {
                    refreshed = true;
                    self.load_routes(key, deadline)
                        .await
                        .map_err(|e| not_sent(e, version))?;
                }
                Some(Route::NoShard { .. }) if !refreshed => {
                    // The stream may have been re-created with more shards.
                    refreshed = true;
                    self.load_routes(key, deadline)
                        .await
                        .map_err(|e| not_sent(e, version))?;
                }
                None => {
                    let (t, ns, s) = key;
                    let error = broker_error(
                        codes::UNKNOWN_STREAM,
                        "unknown_stream",
                        format!("no topology for {t}/{ns}/{s}"),
                    );
                    return Err(not_sent(error, version));
                }
                Some(Route::NoShard { shards }) => {
                    let error = broker_error(
                        codes::UNKNOWN_SHARD,
                        "unknown_shard",
                        format!("shard {shard} of a stream of {shards} shards"),
                    );
                    return Err(not_sent(error, version));
                }
                Some(Route::NoLeader) => {
                    let error = broker_error(
                        codes::SHARD_UNAVAILABLE,
                        "no_leader",
                        format!("shard {shard} has no reachable leader now"),
                    );
                    return Err(not_sent(error, version));
                }
                Some(Route::Leader { broker, addr }) => {
                    return match self.inner.pool.get(broker, &addr, deadline).await {
                        Ok(client) => Ok((client, version)),
                        Err(error) => Err(TryFailure {
                            error,
                            sent: false,
                            broker: Some(broker),
                            version,
                        }),
                    };
                }
            }
        }
    }

    /// Learns from a failed try at a shard: follows a `not_leader` hint, else refreshes the
    /// stream's routes (once among callers that failed on the same version). Returns whether
    /// a hint re-routed the shard; an error only when the stream cannot be routed at all
    /// any more (deleted, ...).
    async fn learn(
        &self,
        key: &StreamKey,
        shard: u32,
        failure: &TryFailure,
        deadline: &Deadline,
    ) -> Result<bool, ClientError> {
        if let ClientError::Broker(body) = &failure.error
            && body.code == codes::NOT_LEADER
        {
            let leader = match (body.leader, body.leader_addr.as_deref()) {
                (Some(id), _) if Some(id) != failure.broker => Some(id),
                (None, Some(addr)) => match self.inner.pool.dial(addr, deadline).await {
                    Ok(client) => {
                        let client = self.inner.pool.insert(client).await;
                        Some(client.broker_id()).filter(|&id| Some(id) != failure.broker)
                    }
                    Err(e) => {
                        tracing::debug!(addr, error = %e, "cannot reach the leader named");
                        None
                    }
                },
                _ => None,
            };
            if let Some(leader) = leader {
                self.routes()
                    .apply_hint(key, shard, leader, body.leader_addr.as_deref());
                return Ok(true);
            }
        }
        if self.routes().version(key) != failure.version {
            return Ok(false); // someone refreshed since this try was routed
        }
        match self.load_routes(key, deadline).await {
            Ok(_) => Ok(false),
            Err(e) if classify(&e, true) == Verdict::Final => Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "cannot refresh the routes");
                Ok(false)
            }
        }
    }

    /// One try at publishing `batch` to `shard`'s leader.
    async fn publish_once(
        &self,
        key: &StreamKey,
        shard: u32,
        batch: Bytes,
        deadline: &Deadline,
    ) -> Result<Published, TryFailure> {
        let (client, version) = self.leader_client(key, shard, deadline).await?;
        let (t, ns, s) = key;
        let leader = client.broker_id();
        let call = client.publish_raw_tracked(t, ns, s, shard, batch, AckMode::Batch);
        // A leader killed mid-call is only noticed at the QUIC idle timeout (6 s); the rest
        // of the cluster names its successor sooner. Give up on the call then: its outcome
        // is unknown, which an idempotent producer answers by re-sending.
        let result = tokio::select! {
            result = call => result,
            () = self.leader_moved(key, shard, leader, deadline) => Err(Failed {
                error: ClientError::Transport(format!(
                    "broker {leader} stopped leading shard {shard} while the publish was in flight"
                )),
                sent: true,
            }),
        };
        match result {
            Ok(Some(published)) => Ok(published),
            Ok(None) => Err(TryFailure {
                error: ClientError::Protocol("the broker did not acknowledge".into()),
                sent: true,
                broker: Some(client.broker_id()),
                version,
            }),
            Err(Failed { error, sent }) => Err(TryFailure {
                error,
                sent,
                broker: Some(client.broker_id()),
                version,
            }),
        }
    }

    /// Resolves once another broker's topology names a leader of `shard` other than
    /// `leader` (checked every half second after the first second); never otherwise.
    async fn leader_moved(&self, key: &StreamKey, shard: u32, leader: u64, deadline: &Deadline) {
        tokio::time::sleep(LEADER_CHECK_AFTER).await;
        let (t, ns, s) = key;
        loop {
            let open = self
                .inner
                .pool
                .open_all()
                .into_iter()
                .find(|c| c.broker_id() != leader);
            let other = match open {
                Some(c) => Some(c),
                None => self
                    .live_client(deadline, Some(leader))
                    .await
                    .ok()
                    .filter(|c| c.broker_id() != leader),
            };
            if let Some(other) = other
                && let Ok(Ok(topology)) =
                    tokio::time::timeout(LEADER_CHECK_EVERY, other.topology(t, ns, s)).await
                && topology
                    .shard(shard)
                    .is_some_and(|r| r.leader.is_some_and(|l| l != leader))
            {
                return;
            }
            tokio::time::sleep(LEADER_CHECK_EVERY).await;
        }
    }

    /// Publishes an encoded batch to `shard`, following its leader, re-sending while the
    /// failure allows (see [`retry`]) and `request_timeout` has not passed.
    pub(crate) async fn send_to_shard(
        &self,
        key: &StreamKey,
        shard: u32,
        batch: Bytes,
        idempotent: bool,
    ) -> Result<Published, PublishFailure> {
        let deadline = self.budget();
        let mut backoff = Backoff::new();
        // The error of the last try whose outcome is unknown: reported rather than a
        // later, plainer refusal, so that the caller knows the records may have landed.
        let mut unknown: Option<ClientError> = None;
        let mut hinted_before = false;
        loop {
            let failure = match self
                .publish_once(key, shard, batch.clone(), &deadline)
                .await
            {
                Ok(published) => return Ok(published),
                Err(failure) => failure,
            };
            if classify(&failure.error, failure.sent) == Verdict::Ambiguous {
                unknown = retry::copy_of_unknown(&failure.error);
            }
            let give_up = |last: ClientError, unknown: Option<ClientError>| PublishFailure {
                maybe_written: unknown.is_some(),
                error: unknown.unwrap_or(last),
            };
            if !may_retry(&failure.error, failure.sent, idempotent) {
                return Err(give_up(failure.error, unknown));
            }
            let hinted = match self.learn(key, shard, &failure, &deadline).await {
                Ok(hinted) => hinted,
                Err(e) => return Err(give_up(e, unknown)),
            };
            let wait = if hinted && !hinted_before {
                Duration::ZERO
            } else {
                backoff.next_delay(&failure.error)
            };
            hinted_before = hinted;
            if !deadline.allows(wait) {
                return Err(give_up(failure.error, unknown));
            }
            tracing::debug!(shard, error = %failure.error, ?wait, "publish failed; retrying");
            tokio::time::sleep(wait).await;
        }
    }

    /// Which shard gets which messages (as [`Client::publish_batch`] places them).
    fn plan(&self, messages: &[Message], shards: u32) -> Vec<(u32, Vec<usize>)> {
        let keyless = if messages.iter().any(|m| m.key.is_none()) {
            self.inner.round_robin.fetch_add(1, Ordering::Relaxed) % shards.max(1)
        } else {
            0
        };
        publish::place(messages, shards, keyless)
    }

    /// Publishes one message to its key's shard (a key-less one to the next shard in
    /// turn) and waits for the acknowledgement (`AckMode::Batch`). A refusal
    /// (`not_leader`, `shard_unavailable`, no connection) is retried on the new leader with
    /// backoff until `request_timeout`; an unknown outcome (connection lost after sending,
    /// `quorum_timeout`) is returned at once, since re-sending could write it twice — use
    /// [`ClusterClient::idempotent_producer`] to have those re-sent too.
    pub async fn publish(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        message: Message,
    ) -> Result<Published, ClientError> {
        let mut published = self
            .publish_batch(tenant, namespace, stream, vec![message])
            .await?;
        published
            .pop()
            .ok_or_else(|| ClientError::Protocol("no acknowledgement".into()))
    }

    /// Publishes messages, one batch per shard, each to its shard's leader concurrently,
    /// retrying as [`ClusterClient::publish`] does. Returns one [`Published`] per shard, in
    /// shard order; fails if any shard failed ([`ClusterClient::publish_batch_detailed`]
    /// says which).
    pub async fn publish_batch(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        messages: Vec<Message>,
    ) -> Result<Vec<Published>, ClientError> {
        let outcomes = self
            .publish_batch_detailed(tenant, namespace, stream, messages)
            .await?;
        let mut published = Vec::with_capacity(outcomes.len());
        for outcome in outcomes {
            if let Some(p) = outcome.result? {
                published.push(p);
            }
        }
        Ok(published)
    }

    /// Like [`ClusterClient::publish_batch`], with each shard's outcome and the positions of
    /// the messages it carried (as [`Client::publish_batch_detailed`]). The outer error is
    /// for failures before anything was sent (the stream could not be routed).
    pub async fn publish_batch_detailed(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        messages: Vec<Message>,
    ) -> Result<Vec<ShardOutcome>, ClientError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let key = stream_key(tenant, namespace, stream);
        let shards = self.shard_count_of(&key, &self.budget()).await?;
        let plan = self.plan(&messages, shards);
        let messages = Arc::new(messages);
        let compression = self.inner.config.compression;
        let now = publish::now_ms();
        let mut tasks = tokio::task::JoinSet::new();
        for (pos, (shard, indices)) in plan.iter().enumerate() {
            let (cluster, key, messages) = (self.clone(), key.clone(), messages.clone());
            let (shard, indices) = (*shard, indices.clone());
            tasks.spawn(async move {
                let result =
                    match publish::encode_batch(&messages, &indices, compression, now, None) {
                        Ok(batch) => cluster
                            .send_to_shard(&key, shard, batch, false)
                            .await
                            .map(Some)
                            .map_err(|f| f.error),
                        Err(e) => Err(e),
                    };
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
        Ok(plan
            .into_iter()
            .zip(results)
            .map(|((shard, indices), result)| ShardOutcome {
                shard,
                indices,
                result: result.unwrap_or_else(|| {
                    Err(ClientError::Transport("the publish task was lost".into()))
                }),
            })
            .collect())
    }

    /// Publishes `messages` as one batch to `shard`, retrying as
    /// [`ClusterClient::publish`] does.
    pub async fn publish_to_shard(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
        messages: &[Message],
    ) -> Result<Published, ClientError> {
        if messages.is_empty() {
            return Err(ClientError::InvalidArgument(
                "a batch needs at least one message".into(),
            ));
        }
        let indices: Vec<usize> = (0..messages.len()).collect();
        let batch = publish::encode_batch(
            messages,
            &indices,
            self.inner.config.compression,
            publish::now_ms(),
            None,
        )?;
        let key = stream_key(tenant, namespace, stream);
        self.send_to_shard(&key, shard, batch, false)
            .await
            .map_err(|f| f.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_wire::murmur2::shard_for_key;

    fn offline_cluster() -> ClusterClient {
        offline_cluster_with(ClientConfig::default())
    }

    /// A cluster client that has connected to nothing (its seed answers nothing).
    fn offline_cluster_with(config: ClientConfig) -> ClusterClient {
        ClusterClient {
            inner: Arc::new(Shared {
                pool: Pool::new(config.clone()),
                config,
                seeds: vec!["127.0.0.1:1".into()],
                routes: Mutex::new(RouteTable::default()),
                preferred: AtomicU64::new(NO_BROKER),
                created: Mutex::new(HashMap::new()),
                round_robin: AtomicU32::new(0),
            }),
        }
    }

    #[tokio::test]
    async fn keyed_messages_go_to_the_same_shard_as_with_a_plain_client() {
        let cluster = offline_cluster();
        let msgs: Vec<Message> = (0..40)
            .map(|i| Message::new("p").with_key(format!("key-{i}")))
            .collect();
        for (shard, indices) in cluster.plan(&msgs, 6) {
            for i in indices {
                let key = msgs[i].key.as_ref().expect("keyed");
                assert_eq!(shard_for_key(key, 6), shard);
            }
        }
    }

    #[tokio::test]
    async fn keyless_calls_take_the_shards_in_turn() {
        let cluster = offline_cluster();
        let shards: Vec<u32> = (0..6)
            .map(|_| cluster.plan(&[Message::new("a"), Message::new("b")], 3)[0].0)
            .collect();
        assert_eq!(shards, vec![0, 1, 2, 0, 1, 2]);
    }

    #[tokio::test]
    async fn connect_needs_a_seed() {
        let none: [&str; 0] = [];
        assert!(matches!(
            ClusterClient::connect(none, ClientConfig::default()).await,
            Err(ClientError::InvalidArgument(_))
        ));
    }

    #[tokio::test]
    async fn a_bad_seed_address_fails_to_connect_without_hanging() {
        let config = ClientConfig {
            request_timeout: Duration::from_millis(300),
            ..Default::default()
        };
        let result = ClusterClient::connect(["not-an-address"], config).await;
        assert!(matches!(result, Err(ClientError::InvalidArgument(_))));
    }

    #[tokio::test]
    async fn a_shard_without_a_leader_is_refused_before_sending() {
        let cluster = offline_cluster();
        let key = stream_key("t", "n", "s");
        let topology = Topology::new(
            vec![ShardRoute {
                shard: 0,
                leader: None,
                leader_addr: None,
                generation: 1,
                replicas: vec![1, 2, 3],
            }],
            vec![],
        );
        cluster.routes().apply_topology(&key, &topology);
        let deadline = Deadline::after(Duration::from_secs(5));
        let failure = cluster
            .leader_client(&key, 0, &deadline)
            .await
            .expect_err("no leader");
        assert_eq!(failure.error.code(), Some(codes::SHARD_UNAVAILABLE));
        assert!(!failure.sent);
        assert_eq!(classify(&failure.error, failure.sent), Verdict::Refused);
    }

    #[tokio::test]
    async fn a_not_leader_hint_reroutes_without_asking_for_a_topology() {
        let cluster = offline_cluster();
        let key = stream_key("t", "n", "s");
        let route = |leader| ShardRoute {
            shard: 0,
            leader: Some(leader),
            leader_addr: None,
            generation: 1,
            replicas: vec![1, 2],
        };
        let brokers = vec![
            BrokerRoute {
                id: 1,
                client_addr: "127.0.0.1:1".into(),
                alive: true,
            },
            BrokerRoute {
                id: 2,
                client_addr: "127.0.0.1:2".into(),
                alive: true,
            },
        ];
        cluster
            .routes()
            .apply_topology(&key, &Topology::new(vec![route(1)], brokers));
        let mut body = ErrorBody::new(codes::NOT_LEADER, "not_leader", "moved");
        body.leader = Some(2);
        let failure = TryFailure {
            error: ClientError::Broker(body),
            sent: true,
            broker: Some(1),
            version: cluster.routes().version(&key),
        };
        let deadline = Deadline::after(Duration::from_secs(5));
        let hinted = cluster.learn(&key, 0, &failure, &deadline).await;
        assert!(matches!(hinted, Ok(true)));
        assert_eq!(
            cluster.routes().route(&key, 0),
            Some(Route::Leader {
                broker: 2,
                addr: "127.0.0.1:2".into()
            })
        );
    }

    #[tokio::test]
    async fn a_publish_to_an_unreachable_leader_gives_up_at_the_deadline_as_not_written() {
        let cluster = offline_cluster_with(ClientConfig {
            request_timeout: Duration::from_millis(600),
            ..Default::default()
        });
        let key = stream_key("t", "n", "s");
        let topology = Topology::new(
            vec![ShardRoute {
                shard: 0,
                leader: Some(1),
                leader_addr: None,
                generation: 1,
                replicas: vec![1],
            }],
            // Nothing answers QUIC on port 1 of loopback.
            vec![BrokerRoute {
                id: 1,
                client_addr: "127.0.0.1:1".into(),
                alive: true,
            }],
        );
        cluster.routes().apply_topology(&key, &topology);
        let started = Instant::now();
        let batch = publish::encode_batch(&[Message::new("x")], &[0], Default::default(), 0, None)
            .expect("encodes");
        let failure = cluster
            .send_to_shard(&key, 0, batch, false)
            .await
            .expect_err("nothing answers");
        assert!(!failure.maybe_written, "{}", failure.error);
        assert!(!failure.error.outcome_unknown(), "{}", failure.error);
        assert!(
            matches!(failure.error, ClientError::Connect(_)),
            "{}",
            failure.error
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "gave up in time"
        );
    }
}
