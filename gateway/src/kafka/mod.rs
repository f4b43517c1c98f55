//! The Kafka protocol listener: existing Kafka producers, consumers and tools talk to Felix
//! unchanged (docs/kafka.md).
//!
//! Decides how Kafka's model maps onto Felix's: a topic is a stream of the connection's
//! tenant and namespace (`default`/`default` with auth off; with auth on, the SASL
//! principal's: see [`scope`]) and a partition is a shard.
//!
//! The invariant: the log already stores Kafka RecordBatch v2, so a produce appends the
//! batches the client sent (the broker stamps only the base offset and the leader epoch) and
//! a fetch answers with stored batches. Nothing here re-encodes a record; request and
//! response messages are `kafka-protocol`'s.
//!
//! * [`api`] — the supported APIs and versions, request decoding, response encoding.
//! * [`connection`] — framing and one connection's requests, answered in order.
//! * [`tls`] — TLS on the listener, when it has a certificate.
//! * [`sasl`] — SaslHandshake and SaslAuthenticate: a token verified once per connection.
//! * [`scope`] — which tenant and namespace a connection's topics mean, and the permission
//!   each request checks before any work.
//! * [`topics`] — Metadata, CreateTopics, DeleteTopics, auto-creation, topic ids.
//! * [`configs`] — DescribeConfigs and (Incremental)AlterConfigs: topic configs as stream
//!   settings.
//! * [`partitions`] — CreatePartitions: a topic's shards grow, never shrink.
//! * [`delete_records`] — DeleteRecords: a partition's retention floor, raised.
//! * [`produce`], [`fetch`], [`list_offsets`] — the data path.
//! * [`groups`] — the group coordinator: membership, rebalances, offset commits, which
//!   broker coordinates a group, DeleteGroups. (InitProducerId is in [`produce`].)
//! * [`offsets`] — committed offsets, durable in a log of their own.
//! * [`lag`] — each group's lag behind its partitions' log ends, as a metric.
//! * [`share`] — share groups (KIP-932) over Felix's consumer groups.
//! * [`errors`] — Felix errors as Kafka error codes.
//! * [`unbuilt`] — the KIP-848 heartbeat, refused so clients say so.

mod api;
mod configs;
mod connection;
mod delete_records;
mod describe_partitions;
mod describe_producers;
mod errors;
mod fetch;
mod groups;
mod lag;
mod list_offsets;
mod offsets;
mod partitions;
mod produce;
mod sasl;
mod scope;
mod share;
mod tls;
mod topics;
mod unbuilt;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::broker::Broker;
use crate::config::BrokerConfig;

pub use api::SUPPORTED_APIS;

/// The tenant and namespace a listener serves with auth off (and to a cluster-wide token),
/// and how it creates topics.
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    pub tenant: String,
    pub namespace: String,
    /// Partitions of a topic created without a count.
    pub default_partitions: u32,
    /// Create unknown topics on Metadata and Produce.
    pub auto_create_topics: bool,
    /// Largest request accepted; a larger one closes the connection.
    pub max_request_bytes: usize,
    /// Connections held at once; one past it is closed at accept.
    pub max_connections: usize,
    /// Request bytes being received or handled at once, over all connections.
    pub max_inflight_request_bytes: usize,
}

impl KafkaSettings {
    /// The listener's settings from the node's configuration, serving `tenant`/`namespace`.
    pub fn from_config(config: &BrokerConfig, tenant: &str, namespace: &str) -> KafkaSettings {
        KafkaSettings {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            default_partitions: config.kafka_default_partitions,
            auto_create_topics: config.kafka_auto_create_topics,
            max_request_bytes: config.max_frame_bytes,
            max_connections: config.max_connections,
            max_inflight_request_bytes: config.max_inflight_request_bytes,
        }
    }
}

/// What every connection shares: the broker, the settings and the group coordinator.
pub(crate) struct Kafka {
    broker: Arc<Broker>,
    settings: KafkaSettings,
    groups: groups::GroupCoordinator,
    /// Share-group members this broker coordinates.
    share_members: share::ShareMembers,
    /// Share sessions open on this broker.
    share_sessions: share::ShareSessions,
    /// One permit per request byte in flight ([`KafkaSettings::max_inflight_request_bytes`]).
    inflight: Arc<tokio::sync::Semaphore>,
    /// Connections open now.
    connections: std::sync::atomic::AtomicUsize,
}

/// A bound Kafka listener, ready to serve.
pub struct KafkaListener {
    listener: TcpListener,
    kafka: Arc<Kafka>,
    /// Set when the listener speaks TLS (`kafka_tls_cert` and `kafka_tls_key`).
    tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Connections idle this long are closed (Kafka's `connections.max.idle.ms` default).
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

impl KafkaListener {
    /// Binds the listener and opens the log of offsets committed before they moved into the
    /// group journals (`<data_dir>/kafka/group-offsets`, `offsets.rs`), whose offsets a
    /// task moves into the journals (`groups/upgrade.rs`).
    pub async fn bind(
        config: &BrokerConfig,
        settings: KafkaSettings,
        broker: Arc<Broker>,
    ) -> anyhow::Result<KafkaListener> {
        let tls = match (&config.kafka_tls_cert, &config.kafka_tls_key) {
            (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
            _ => None,
        };
        let dir = config.data_dir.join("kafka").join("group-offsets");
        let offsets = offsets::CommittedOffsets::open(&dir, config.fsync_policy())
            .with_context(|| format!("open the Kafka group offsets in {}", dir.display()))?;
        let listener = TcpListener::bind(config.kafka_addr)
            .await
            .with_context(|| format!("listen for Kafka on {}", config.kafka_addr))?;
        let kafka = Arc::new(Kafka {
            groups: groups::GroupCoordinator::new(offsets),
            share_members: share::ShareMembers::default(),
            share_sessions: share::ShareSessions::default(),
            broker,
            inflight: Arc::new(tokio::sync::Semaphore::new(
                settings
                    .max_inflight_request_bytes
                    .min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            connections: std::sync::atomic::AtomicUsize::new(0),
            settings,
        });
        tokio::spawn(groups::expire_members(Arc::downgrade(&kafka)));
        tokio::spawn(groups::move_old_offsets(Arc::downgrade(&kafka)));
        tokio::spawn(lag::report(Arc::downgrade(&kafka)));
        tokio::spawn(share::expire_members(Arc::downgrade(&kafka)));
        Ok(KafkaListener {
            listener,
            kafka,
            tls,
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Whether the listener speaks TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A handle that flushes the committed offsets at shutdown.
    pub fn offsets_flusher(&self) -> OffsetsFlusher {
        OffsetsFlusher(self.kafka.clone())
    }

    /// Accepts connections until `shutdown` turns true; each connection also ends then.
    pub async fn serve(self, mut shutdown: watch::Receiver<bool>) {
        let for_connections = shutdown.clone();
        loop {
            let accepted = tokio::select! {
                accepted = self.listener.accept() => accepted,
                _ = shutdown.wait_for(|s| *s) => {
                    debug!("Kafka listener stopping");
                    return;
                }
            };
            match accepted {
                Ok((stream, peer)) => {
                    use std::sync::atomic::Ordering;
                    let open = self.kafka.connections.fetch_add(1, Ordering::AcqRel);
                    if open >= self.kafka.settings.max_connections {
                        self.kafka.connections.fetch_sub(1, Ordering::AcqRel);
                        self.kafka
                            .broker
                            .metrics()
                            .connections_refused
                            .get_or_create(&crate::metrics::ListenerLabel {
                                listener: "kafka".into(),
                            })
                            .inc();
                        warn!(%peer, max_connections = self.kafka.settings.max_connections,
                            "refusing a Kafka connection: the listener is at max_connections");
                        drop(stream);
                        continue;
                    }
                    let kafka = self.kafka.clone();
                    let stop = for_connections.clone();
                    let tls = self.tls.clone();
                    let gauge = kafka.broker.metrics().kafka.connections.clone();
                    gauge.inc();
                    tokio::spawn(async move {
                        serve_connection(stream, peer, tls, kafka.clone(), stop).await;
                        kafka.connections.fetch_sub(1, Ordering::AcqRel);
                        gauge.dec();
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    warn!(error = %e, "Kafka listener could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// One accepted connection: the TLS handshake first when the listener speaks TLS, then its
/// requests until it ends.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    kafka: Arc<Kafka>,
    stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let advertised = match stream.local_addr() {
        Ok(a) => a,
        Err(e) => {
            debug!(%peer, error = %e, "Kafka connection without a local address");
            return;
        }
    };
    let Some(acceptor) = tls else {
        let (reader, writer) = stream.into_split();
        connection::serve(reader, writer, peer, advertised, kafka, stop).await;
        return;
    };
    match tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => {
            let (reader, writer) = tokio::io::split(stream);
            connection::serve(reader, writer, peer, advertised, kafka, stop).await;
        }
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "Kafka TLS handshake failed (a plaintext client on the TLS listener?)");
        }
        Err(_) => {
            debug!(%peer, "Kafka TLS handshake did not finish within {:?}", tls::HANDSHAKE_TIMEOUT);
        }
    }
}

/// Flushes the Kafka group offsets' log (see [`KafkaListener::offsets_flusher`]).
pub struct OffsetsFlusher(Arc<Kafka>);

impl OffsetsFlusher {
    pub async fn flush(&self) {
        self.0.groups.offsets().flush().await;
    }
}
