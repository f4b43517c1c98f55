//! This broker as one node of the cluster: its settings, its handle on the control plane,
//! the registry it serves from, its lease and the client to its peers; and the questions
//! every room asks of them (does this stream exist, is this shard placed here, who is alive).
//!
//! Invariant: the data path answers from the local registry (the control plane's watch) and
//! never waits on Raft, except to catch up once when a name another broker just created is
//! not applied here yet ([`Node::catch_up_if_unknown`]) and to propose a change.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use felix_meta::model::{Command, Consistency, ShardKey, StreamSettings};
use felix_meta::state_machine::Registry;
use felix_meta::{Applied, MetaHandle};
use felix_wire::protocol::{ErrorBody, codes};
use tokio::sync::watch;

use crate::config::BrokerConfig;
use crate::errors::{err, meta_error};
use crate::metrics::Metrics;
use crate::replication::lease::Lease;
use crate::replication::transport::PeerClient;

/// What every part of the broker shares about the node it runs on.
pub struct Node {
    pub(crate) config: BrokerConfig,
    pub(crate) meta: MetaHandle,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) registry: watch::Receiver<Arc<Registry>>,
    /// Part of a cluster: shards have leaders and replicas (else this node leads all).
    pub(crate) cluster: bool,
    pub(crate) lease: Arc<Lease>,
    /// The internal HTTP client to other brokers (replication fetches, forwarded
    /// publishes), one connection pool for both.
    pub(crate) peers: PeerClient,
    /// Set once shutdown began: publishes are refused and placements no longer followed.
    pub(crate) stopping: AtomicBool,
    /// The shards' other logs a move must carry (`moves::shard_logs`), once registered.
    pub(crate) shard_logs: std::sync::OnceLock<Arc<dyn crate::moves::shard_logs::ShardLogs>>,
}

impl Node {
    pub(crate) fn new(config: &BrokerConfig, meta: MetaHandle, metrics: Arc<Metrics>) -> Node {
        let peers = PeerClient::new(meta.peer_signer());
        Node {
            registry: meta.registry(),
            config: config.clone(),
            meta,
            metrics,
            cluster: config.cluster.len() > 1,
            lease: Arc::new(Lease::default()),
            peers,
            stopping: AtomicBool::new(false),
            shard_logs: std::sync::OnceLock::new(),
        }
    }

    /// The broker's id.
    pub fn broker_id(&self) -> u64 {
        self.config.node_id
    }

    /// Proposes a change to the control plane and, in a cluster, waits until this node has
    /// applied it too.
    pub(crate) async fn propose(&self, cmd: Command) -> Result<Applied, ErrorBody> {
        let applied = self.meta.propose(cmd).await.map_err(meta_error)?;
        if self.cluster {
            // Proposed through the control plane's leader: wait until this node has applied
            // it too, so the answer (and the client's next request here) sees the change.
            self.meta.read(|_| ()).await.map_err(meta_error)?;
        }
        Ok(applied)
    }

    /// A stream's version and settings, or the typed refusal naming what does not exist.
    pub(crate) fn stream_settings(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(u64, StreamSettings), ErrorBody> {
        self.stream_entry(tenant, namespace, name, |s| (s.version, s.settings.clone()))
    }

    /// What `read` takes from a stream's entry in the registry, under one look-up (a
    /// shard's open on every operation wants its settings and incarnation both).
    pub(crate) fn stream_entry<T>(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        read: impl FnOnce(&felix_meta::model::Stream) -> T,
    ) -> Result<T, ErrorBody> {
        let reg = self.registry.borrow();
        require_namespace(&reg, tenant, namespace)?;
        let s = reg.stream(tenant, namespace, name).ok_or_else(|| {
            err(
                codes::UNKNOWN_STREAM,
                "unknown_stream",
                format!("unknown stream {tenant}/{namespace}/{name}"),
            )
        })?;
        Ok(read(s))
    }

    /// Whether this broker keeps a copy of the shard: always on a single node; in a
    /// cluster, when the shard's placement names it.
    pub(crate) fn holds_replica(&self, key: &ShardKey) -> bool {
        if !self.cluster {
            return true;
        }
        self.registry
            .borrow()
            .placements
            .get(key)
            .is_some_and(|p| p.replicas.contains(&self.config.node_id))
    }

    /// In a cluster, a tenant, namespace or stream another broker just created may not be
    /// applied here yet: on such a refusal, catch up with the control plane (a linearizable
    /// read) and say whether to try again.
    pub(crate) async fn catch_up_if_unknown(&self, e: &ErrorBody) -> bool {
        let unknown = matches!(
            e.code,
            codes::UNKNOWN_TENANT | codes::UNKNOWN_NAMESPACE | codes::UNKNOWN_STREAM
        );
        self.cluster && unknown && self.meta.read(|_| ()).await.is_ok()
    }

    /// Whether the shard's stream is a Quorum stream now.
    pub(crate) fn is_quorum(&self, key: &ShardKey) -> bool {
        settings_of(&self.registry.borrow(), key)
            .is_some_and(|s| s.consistency == Consistency::Quorum)
    }

    /// Whether the applied placement still names this broker leader at `generation`.
    pub(crate) fn is_leader_at(&self, key: &ShardKey, generation: u64) -> bool {
        self.meta.local(|s| {
            s.placements.get(key).is_some_and(|p| {
                p.leader == Some(self.config.node_id) && p.generation == generation
            })
        })
    }

    /// Whether the control plane counts a broker alive.
    pub(crate) fn is_alive(&self, id: u64) -> bool {
        self.registry
            .borrow()
            .brokers
            .get(&id)
            .is_some_and(|b| b.alive)
    }

    /// A broker's internal address (replication, Raft).
    pub(crate) fn internal_addr_of(&self, id: u64) -> Option<String> {
        self.registry
            .borrow()
            .brokers
            .get(&id)
            .map(|b| b.internal_addr.clone())
    }
}

/// The typed refusal for an unknown tenant or namespace, checked against the registry.
pub(crate) fn require_namespace(
    reg: &Registry,
    tenant: &str,
    namespace: &str,
) -> Result<(), ErrorBody> {
    if !reg.has_tenant(tenant) {
        return Err(err(
            codes::UNKNOWN_TENANT,
            "unknown_tenant",
            format!("unknown tenant {tenant:?}"),
        ));
    }
    if !reg.has_namespace(tenant, namespace) {
        return Err(err(
            codes::UNKNOWN_NAMESPACE,
            "unknown_namespace",
            format!("unknown namespace {tenant}/{namespace}"),
        ));
    }
    Ok(())
}

/// The settings of a shard's stream as the registry holds them, if the stream exists.
pub(crate) fn settings_of<'a>(reg: &'a Registry, key: &ShardKey) -> Option<&'a StreamSettings> {
    reg.streams
        .get(&felix_meta::model::stream_key(
            &key.tenant,
            &key.namespace,
            &key.stream,
        ))
        .map(|s| &s.settings)
}
