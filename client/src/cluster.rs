//! The client of a Felix cluster (a single broker is a cluster of one): it sends each
//! shard's publishes and subscriptions to the shard's leader, follows leadership as it
//! moves, and sends admin requests to any live broker.
//!
//! Invariant: a publish is re-sent only when the broker certainly did not act on it
//! (refused with `not_leader` / `shard_unavailable`, or never got the whole request); an
//! ambiguous outcome (connection lost after sending, `quorum_timeout`, timeout) is returned
//! to the caller, except by an [`crate::IdempotentProducer`], whose re-sends the leader
//! recognises by (producer id, sequence). No new try starts once `request_timeout` has
//! passed since the call began.
//!
//! Modules: `routes` holds the routing table (who leads which shard), `pool` the one
//! connection per broker, `retry` what may be retried and the backoff, `publish` the
//! routed publish, `subscription` the subscription of one shard that resumes on the new
//! leader, `stream_subscription` a whole stream's shards read as one. The admin requests
//! are declared in `crate::admin`, once for this client and for a [`Connection`].

mod cache;
mod fencing;
mod group_spread;
mod groups;
mod pool;
mod publish;
mod retry;
mod routes;
mod stream_subscription;
mod subscription;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use felix_wire::protocol::{ErrorBody, Request, Response, codes};
use tokio::time::Instant;

pub use cache::ClusterCacheWatch;
pub use groups::{GroupConsumer, GroupRecord};
pub use routes::{BrokerRoute, ShardRoute, Topology};
pub use stream_subscription::StreamSubscription;
pub use subscription::ClusterSubscription;

use crate::admin::StreamOp;
use crate::request::Failed;
use crate::{ClientConfig, ClientError, Connection, StreamInfo, StreamKey, stream_key};
use pool::Pool;
use retry::{Backoff, Deadline, Verdict, classify, may_retry};
use routes::RouteTable;

/// No broker preferred for admin requests yet.
const NO_BROKER: u64 = u64::MAX;
/// How long a publish is in flight before the client starts checking, with another broker,
/// whether its shard's leader has changed meanwhile.
const LEADER_CHECK_AFTER: Duration = Duration::from_secs(1);
/// How often it checks after that.
const LEADER_CHECK_EVERY: Duration = Duration::from_millis(500);

/// The spec's name for the client: a cluster-aware [`Client`] (one broker is a cluster of
/// one).
pub type ClusterClient = Client;

/// A client of a Felix cluster (or of one broker). Publishes and subscriptions go to each shard's leader, and
/// follow it when leadership moves (`not_leader`, `shard_unavailable`, a lost broker);
/// admin requests go to any live broker. Keeps one [`Connection`] connection per broker,
/// opened when first needed. Cheap to clone (clones share everything); every method can be
/// called concurrently.
///
/// ```no_run
/// use felix_client::{AckMode, ClientConfig, Client, Message, StartAt, StreamConfig};
///
/// # async fn demo() -> Result<(), felix_client::ClientError> {
/// let seeds = ["10.0.0.1:5000", "10.0.0.2:5000", "10.0.0.3:5000"];
/// let cluster = Client::connect(seeds, ClientConfig::default()).await?;
/// cluster.create_tenant("acme").await?;
/// cluster.create_namespace("acme", "prod").await?;
/// let config = StreamConfig { durable: Some(true), shards: Some(4), replicas: Some(3), ..Default::default() };
/// cluster.create_stream("acme", "prod", "orders", config).await?;
///
/// let p = cluster
///     .publish("acme", "prod", "orders", Message::new("paid").with_key("order-42"), AckMode::Batch)
///     .await?
///     .expect("acknowledged");
/// let mut sub = cluster.subscribe_shard("acme", "prod", "orders", p.shard, StartAt::Offset(p.base_offset)).await?;
/// let event = sub.next_event().await?.expect("the record just published");
/// assert_eq!(&event.payload[..], b"paid");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
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

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
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

/// Whether a try that failed so may have written its records (its outcome is unknown).
pub(crate) fn may_be_written(error: &ClientError, sent: bool) -> bool {
    classify(error, sent) == Verdict::Ambiguous
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

impl Client {
    /// Connects to the cluster through the first seed that answers (`HOST:PORT` each; all
    /// are tried at once). The other brokers are found in the topology and connected to
    /// when a shard they lead is used.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), felix_client::ClientError> {
    /// use felix_client::{ClientConfig, Client};
    /// let config = ClientConfig { ca: Some("ca.pem".into()), ..Default::default() };
    /// let cluster = Client::connect(["broker-1:5000", "broker-2:5000"], config).await?;
    /// println!("connected to brokers {:?}", cluster.connected_brokers());
    /// # Ok(()) }
    /// ```
    pub async fn connect<I, S>(seeds: I, config: ClientConfig) -> Result<Client, ClientError>
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
        let cluster = Client {
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

    /// Presents a fresh token on every open connection without reconnecting, and in the
    /// hello of every connection opened later.
    pub async fn set_token(&self, token: &str) -> Result<(), ClientError> {
        self.inner.pool.set_token(token).await
    }

    /// The seed addresses given to [`Client::connect`].
    pub fn seeds(&self) -> &[String] {
        &self.inner.seeds
    }

    /// The ids of the brokers this client holds an open connection to.
    pub fn connected_brokers(&self) -> Vec<u64> {
        self.inner
            .pool
            .open_all()
            .iter()
            .map(Connection::broker_id)
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
    ) -> Result<Connection, ClientError> {
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
                match tokio::time::timeout(limit, Connection::connect(&addr, config)).await {
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
    pub async fn any_connection(&self) -> Result<Connection, ClientError> {
        self.live_client(&self.budget(), None).await
    }

    /// A live connection, not to `avoid` (a broker that just failed) while another broker
    /// answers.
    async fn live_client(
        &self,
        deadline: &Deadline,
        avoid: Option<u64>,
    ) -> Result<Connection, ClientError> {
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
        mut avoid: Option<u64>,
        op: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(Connection) -> Fut,
        Fut: Future<Output = Result<T, Failed>>,
    {
        let mut backoff = Backoff::new();
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
        self.on_any_broker(
            idempotent,
            &self.budget(),
            None,
            |client: Connection| async move { client.call_tracked(request).await },
        )
        .await
    }

    /// A create forgets the stream's routes (it may be a re-creation with other shards),
    /// a delete its routes and its creation.
    fn stream_op_starts(&self, op: StreamOp, key: &StreamKey) {
        match op {
            StreamOp::Create => self.routes().forget(key),
            StreamOp::Delete => {
                self.routes().forget(key);
                self.created().remove(key);
            }
            StreamOp::Alter | StreamOp::Describe => {}
        }
    }

    /// A stream created is remembered for a while (a broker that does not know it yet is
    /// asked again rather than believed); an altered one is routed afresh.
    fn stream_op_done(&self, op: StreamOp, info: &StreamInfo) {
        let key = stream_key(&info.tenant, &info.namespace, &info.name);
        match op {
            StreamOp::Create => {
                self.created().insert(key, Instant::now());
            }
            StreamOp::Alter => self.routes().forget(&key),
            StreamOp::Describe | StreamOp::Delete => {}
        }
    }

    fn created(&self) -> std::sync::MutexGuard<'_, HashMap<StreamKey, Instant>> {
        self.inner.created.lock().unwrap_or_else(|e| e.into_inner())
    }

    admin_requests!();
    rbac_requests!();
    cluster_requests!();

    /// A fresh topology of the stream from a live broker; the routing table takes it too.
    ///
    /// ```no_run
    /// # async fn demo(cluster: felix_client::Client) -> Result<(), felix_client::ClientError> {
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
        self.load_routes(&key, &self.budget(), None).await
    }

    /// Fetches a stream's topology (retrying within `deadline`) and applies it, asking a
    /// broker other than `avoid` first when another answers (a leader that failed a try may
    /// be cut off and still believe it leads). A stream this client created lately that the
    /// broker does not know yet is asked for again.
    async fn load_routes(
        &self,
        key: &StreamKey,
        deadline: &Deadline,
        avoid: Option<u64>,
    ) -> Result<Topology, ClientError> {
        let created_lately = self
            .created()
            .get(key)
            .is_some_and(|at| at.elapsed() < self.inner.config.request_timeout);
        let (t, ns, s) = key;
        let topology = self
            .on_any_broker(true, deadline, avoid, |client: Connection| async move {
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
        Ok(self.load_routes(key, deadline, None).await?.shard_count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;
    use crate::publish;
    use felix_wire::murmur2::shard_for_key;
    use felix_wire::protocol::AckMode;
    use routes::Route;

    fn offline_cluster() -> Client {
        offline_cluster_with(ClientConfig::default())
    }

    /// A cluster client that has connected to nothing (its seed answers nothing).
    fn offline_cluster_with(config: ClientConfig) -> Client {
        Client {
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
            Client::connect(none, ClientConfig::default()).await,
            Err(ClientError::InvalidArgument(_))
        ));
    }

    #[tokio::test]
    async fn a_bad_seed_address_fails_to_connect_without_hanging() {
        let config = ClientConfig {
            request_timeout: Duration::from_millis(300),
            ..Default::default()
        };
        let result = Client::connect(["not-an-address"], config).await;
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
            .send_to_shard(&key, 0, batch, AckMode::Batch, false)
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
