//! Starting a control-plane node: storage, Raft, the internal HTTP server, and how a node
//! joins its group.
//!
//! Membership bootstrap decides who may `initialize` a group, so that it happens once:
//! * a node with a `cluster-id` marker in its data dir (or any Raft state) never
//!   initializes: it resumes from disk;
//! * a single node (no `--cluster`, or a cluster of one) initializes itself;
//! * in a cluster, only the lowest node id initializes, and only after every other member
//!   has answered that it holds no state — so a member restarting with a wiped volume can
//!   never start a second group beside the first.
//!
//! The wiped-volume guard: a node that finds no state while its peers have one is a member
//! that lost its disk. It must not help elect a leader that misses acknowledged writes, and
//! openraft 0.9 has no switch for that, so the node refuses vote requests (HTTP 503) and does
//! not stand for election until it has caught up with what the leader had committed when
//! the node started; then it writes the marker and votes normally.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use openraft::BasicNode;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::handle::{MetaError, MetaHandle};
use crate::log_store::LogStore;
use crate::model::Command;
use crate::network::{
    ClusterKey, ForwardError, HttpNetworkFactory, MembershipChange, MetaService, NodeStatus,
    PeerClient, PeerSigner,
};
use crate::state_machine::StateMachineStore;
use crate::types::{CommandResult, NodeId, Raft};

const MARKER_FILE: &str = "cluster-id";

/// How to run a control-plane node.
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// This node's id (the broker id).
    pub node_id: NodeId,
    /// The metadata lives in `<data_dir>/meta`.
    pub data_dir: PathBuf,
    /// Where the internal HTTP server listens (Raft RPCs, forwarded proposals).
    pub listen: SocketAddr,
    /// The address other nodes reach this one at; defaults to `listen`.
    pub advertise: Option<String>,
    /// Every member's internal address by node id, this node included. Empty: a
    /// one-member group (the embedded default).
    pub cluster: BTreeMap<NodeId, String>,
    /// Take a snapshot (and purge the log before it) after this many applied entries.
    pub snapshot_after_logs: u64,
    pub heartbeat: Duration,
    pub election_timeout: (Duration, Duration),
    /// Shard-leader lease duration.
    pub lease: Duration,
    /// Timeout of one RPC to a peer.
    pub rpc_timeout: Duration,
    /// How long a broker stays dead before the controller moves its follower replicas to
    /// live brokers (`drain.rs`).
    pub replica_replace_after: Duration,
    /// More routes served on the internal address (the broker's replication endpoints).
    pub extra_routes: Option<axum::Router>,
    /// The cluster secret: with it, every internal request this node sends is signed and
    /// every one it serves (but `/healthz`) must be (`network::require_signed`). `None`:
    /// the internal network is open (loopback-only brokers without auth).
    pub cluster_key: Option<Arc<ClusterKey>>,
}

impl MetaConfig {
    /// A single-node configuration with the defaults.
    pub fn single(node_id: NodeId, data_dir: impl Into<PathBuf>, listen: SocketAddr) -> MetaConfig {
        MetaConfig {
            node_id,
            data_dir: data_dir.into(),
            listen,
            advertise: None,
            cluster: BTreeMap::new(),
            snapshot_after_logs: 5000,
            heartbeat: Duration::from_millis(100),
            election_timeout: (Duration::from_millis(500), Duration::from_millis(1000)),
            lease: Duration::from_secs(10),
            rpc_timeout: Duration::from_secs(2),
            replica_replace_after: Duration::from_secs(600),
            extra_routes: None,
            cluster_key: None,
        }
    }

    /// The signer of this node's internal requests, if the network is authenticated.
    fn signer(&self) -> Option<PeerSigner> {
        self.cluster_key
            .as_ref()
            .map(|key| PeerSigner::new(key.clone(), self.node_id))
    }

    /// A factory for this node's RPCs: signed when the network is authenticated.
    fn network(&self) -> HttpNetworkFactory {
        HttpNetworkFactory::with_client(
            PeerClient::new(self.rpc_timeout).with_signer(self.signer()),
        )
    }

    fn members(&self, advertised: &str) -> BTreeMap<NodeId, BasicNode> {
        if self.cluster.is_empty() {
            return BTreeMap::from([(
                self.node_id,
                BasicNode {
                    addr: advertised.to_owned(),
                },
            )]);
        }
        self.cluster
            .iter()
            .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
            .collect()
    }
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("metadata storage in {path}: {source}")]
    Storage {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("raft: {0}")]
    Raft(String),
}

/// A running control-plane node.
pub struct MetaNode {
    handle: MetaHandle,
    accepting_votes: Arc<AtomicBool>,
    shutdown: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    controller: tokio::task::JoinHandle<()>,
    stop_controller: watch::Sender<bool>,
    local_addr: SocketAddr,
}

struct Service {
    handle: MetaHandle,
    accepting_votes: Arc<AtomicBool>,
    has_state: Arc<AtomicBool>,
}

impl MetaService for Service {
    fn raft(&self) -> &Raft {
        self.handle.raft()
    }
    fn accepting_votes(&self) -> bool {
        self.accepting_votes.load(Ordering::Acquire)
    }
    /// Serves `/meta/propose` from clients and from followers forwarding: the command goes
    /// through this node's handle, so it is batched here and forwarded again if this node is
    /// no longer the leader.
    fn propose(&self, cmd: Command) -> BoxFuture<'_, Result<CommandResult, ForwardError>> {
        Box::pin(async move {
            match self.handle.propose(cmd).await {
                Ok(applied) => Ok(Ok(applied)),
                Err(MetaError::Rejected(e)) => Ok(Err(e)),
                Err(MetaError::NotLeader { .. }) => Err(ForwardError::NotLeader { leader: None }),
                Err(MetaError::Timeout(_)) => Err(ForwardError::Timeout),
                Err(MetaError::Indeterminate(m)) => Err(ForwardError::Interrupted(m)),
                Err(MetaError::Stopped(m)) => Err(ForwardError::Remote {
                    status: 503,
                    message: m,
                }),
            }
        })
    }
    fn read_index(&self) -> BoxFuture<'_, Result<u64, ForwardError>> {
        Box::pin(self.handle.read_index())
    }
    /// Serves `/meta/lease`: grants only if this node is the meta leader (never forwards,
    /// so two nodes with stale views cannot bounce a renewal between them).
    fn renew_lease(&self, broker: NodeId) -> BoxFuture<'_, Result<Duration, ForwardError>> {
        Box::pin(self.handle.grant_lease(broker))
    }
    fn status(&self) -> BoxFuture<'_, NodeStatus> {
        Box::pin(async move {
            let m = self.handle.raft().metrics().borrow().clone();
            NodeStatus {
                node_id: self.handle.node_id(),
                leader: m.current_leader,
                term: m.current_term,
                last_applied: m.last_applied.map(|l| l.index),
                committed: m.last_applied.map(|l| l.index),
                has_state: self.has_state.load(Ordering::Acquire),
                accepting_votes: self.accepting_votes(),
                members: m
                    .membership_config
                    .membership()
                    .nodes()
                    .map(|(id, n)| (*id, n.addr.clone()))
                    .collect(),
                voters: m.membership_config.membership().voter_ids().collect(),
                last_log_index: m.last_log_index,
                snapshot: m.snapshot.map(|l| l.index),
                purged: m.purged.map(|l| l.index),
            }
        })
    }
    fn dump(&self) -> BoxFuture<'_, serde_json::Value> {
        Box::pin(async move {
            self.handle
                .local(|s| serde_json::to_value(s).unwrap_or(serde_json::Value::Null))
        })
    }
    fn change_membership(
        &self,
        change: MembershipChange,
    ) -> BoxFuture<'_, Result<(), ForwardError>> {
        Box::pin(async move {
            let result = match change {
                MembershipChange::AddLearner { id, addr } => {
                    self.handle.add_learner(id, addr).await
                }
                MembershipChange::SetVoters { voters } => {
                    self.handle.change_voters(voters, true).await
                }
                MembershipChange::Join { id, addr } => self.handle.join_learner(id, addr).await,
                // Fault injection only: the joiner is told to ask again, and stays a learner.
                MembershipChange::Promote { .. } if crate::faults::promotions_held() => Err(
                    MetaError::Stopped("promotions are held (fault injection)".to_owned()),
                ),
                MembershipChange::Promote { id } => self.handle.promote(id).await,
                MembershipChange::Remove { id } => {
                    let m = self
                        .handle
                        .raft()
                        .metrics()
                        .borrow()
                        .membership_config
                        .clone();
                    if m.membership().voter_ids().any(|v| v == id) {
                        Err(MetaError::Rejected(crate::model::CommandError::Invalid(
                            format!("node {id} is a voter: demote it with set_voters first"),
                        )))
                    } else {
                        self.handle.remove_learner(id).await
                    }
                }
            };
            match result {
                Ok(()) => Ok(()),
                Err(MetaError::NotLeader { leader }) => Err(ForwardError::NotLeader {
                    leader: leader.and_then(|id| {
                        let m = self
                            .handle
                            .raft()
                            .metrics()
                            .borrow()
                            .membership_config
                            .clone();
                        m.membership().get_node(&id).map(|n| (id, n.addr.clone()))
                    }),
                }),
                Err(MetaError::Rejected(e)) => Err(ForwardError::Remote {
                    status: 409,
                    message: e.to_string(),
                }),
                Err(e) => Err(ForwardError::Remote {
                    status: 503,
                    message: e.to_string(),
                }),
            }
        })
    }
    fn healthz(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move { self.handle.is_ready() && self.accepting_votes() })
    }
}

fn storage_err(path: &Path) -> impl FnOnce(std::io::Error) -> StartError + '_ {
    move |source| StartError::Storage {
        path: path.to_owned(),
        source,
    }
}

impl MetaNode {
    /// Starts the node: opens storage, starts Raft and the internal server, and joins or
    /// forms the group (see the module docs). Returns once the node runs; use
    /// [`MetaHandle::wait_ready`] to wait for a leader.
    pub async fn start(config: MetaConfig) -> Result<MetaNode, StartError> {
        if !config.cluster.is_empty() && !config.cluster.contains_key(&config.node_id) {
            return Err(StartError::Config(format!(
                "--cluster does not list this node's id {}",
                config.node_id
            )));
        }
        let dir = config.data_dir.join("meta");
        std::fs::create_dir_all(&dir).map_err(storage_err(&dir))?;
        let log_store = LogStore::open(&dir).map_err(storage_err(&dir))?;
        let sm = StateMachineStore::open(&dir).map_err(storage_err(&dir))?;
        let marker = dir.join(MARKER_FILE);
        let had_marker = marker.exists();
        let has_state = had_marker || log_store.has_state();

        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: config.listen,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| StartError::Listen {
            addr: config.listen,
            source,
        })?;
        let advertised = config
            .advertise
            .clone()
            .unwrap_or_else(|| local_addr.to_string());

        let raft_config = openraft::Config {
            cluster_name: "felix-meta".into(),
            heartbeat_interval: config.heartbeat.as_millis() as u64,
            election_timeout_min: config.election_timeout.0.as_millis() as u64,
            election_timeout_max: config.election_timeout.1.as_millis() as u64,
            install_snapshot_timeout: config.rpc_timeout.as_millis().max(1000) as u64 * 5,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_after_logs),
            max_in_snapshot_log_to_keep: (config.snapshot_after_logs / 10).max(1),
            ..Default::default()
        }
        .validate()
        .map_err(|e| StartError::Config(e.to_string()))?;
        let peers = config.network().with_local_id(config.node_id);
        let raft = Raft::new(
            config.node_id,
            Arc::new(raft_config),
            peers.clone(),
            log_store,
            sm.clone(),
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let handle = MetaHandle::new(
            config.node_id,
            raft.clone(),
            sm,
            peers.clone(),
            config.lease,
        );

        let accepting_votes = Arc::new(AtomicBool::new(true));
        let has_state_flag = Arc::new(AtomicBool::new(has_state));
        let service = Arc::new(Service {
            handle: handle.clone(),
            accepting_votes: accepting_votes.clone(),
            has_state: has_state_flag.clone(),
        });
        let (shutdown, mut shutdown_rx) = watch::channel(false);
        let (stop_controller, stop_controller_rx) = watch::channel(false);
        let controller = crate::controller::spawn(
            handle.clone(),
            stop_controller_rx,
            config.replica_replace_after,
        );
        let mut router = crate::network::raft_router(service);
        if let Some(extra) = config.extra_routes.clone() {
            router = router.merge(extra);
        }
        // Every route, the broker's included, behind the signature check.
        if let Some(key) = &config.cluster_key {
            router = crate::network::require_signed(router, key.clone());
        }
        // A node cut off by fault injection refuses everything it receives.
        router = router.layer(axum::middleware::from_fn(
            |req: axum::extract::Request, next: axum::middleware::Next| async move {
                if crate::faults::isolated() {
                    return axum::response::IntoResponse::into_response((
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        "cut off the network (fault injection)",
                    ));
                }
                next.run(req).await
            },
        ));
        let server = tokio::spawn(async move {
            crate::network::serve(listener, router, async move {
                let _ = shutdown_rx.wait_for(|s| *s).await;
            })
            .await;
        });

        let node = MetaNode {
            handle,
            accepting_votes,
            shutdown,
            server,
            controller,
            stop_controller,
            local_addr,
        };
        if dir.join(crate::join::JOINING_FILE).exists() {
            // Restarted while joining a running group: ask again (both steps are no-ops
            // once done) before voting. Also without local state: the leader may have made
            // this node a learner before anything reached its disk, and the group then
            // lists it already, so the new-member check below would take it for a member
            // catching up and it would stay a learner for good.
            node.finish_joining(&config, &advertised, &marker, has_state_flag);
        } else if has_state {
            if !had_marker {
                write_marker(&marker, config.node_id).map_err(storage_err(&dir))?;
            }
            info!(
                node = config.node_id,
                "resuming metadata from {}",
                dir.display()
            );
        } else {
            node.bootstrap(&config, &advertised, &marker, has_state_flag)
                .await?;
        }
        Ok(node)
    }

    async fn bootstrap(
        &self,
        config: &MetaConfig,
        advertised: &str,
        marker: &Path,
        has_state: Arc<AtomicBool>,
    ) -> Result<(), StartError> {
        let members = config.members(advertised);
        let raft = self.handle.raft().clone();
        if members.len() == 1 {
            raft.initialize(members)
                .await
                .map_err(|e| StartError::Raft(e.to_string()))?;
            write_marker(marker, config.node_id).map_err(storage_err(marker))?;
            has_state.store(true, Ordering::Release);
            info!(
                node = config.node_id,
                "initialized a one-member metadata group"
            );
            return Ok(());
        }
        // Until this node knows whether the group exists, it neither votes nor stands.
        self.accepting_votes.store(false, Ordering::Release);
        raft.runtime_config().elect(false);
        let peers = config.network();
        let node_id = config.node_id;
        // A broker started with a new --node-id beside a running group joins it (scaling
        // out); one whose id the group has at another address is refused here, at start.
        let mut first = Vec::new();
        for (id, addr) in config.cluster.iter().filter(|(id, _)| **id != node_id) {
            first.push((*id, peers.status(addr).await.ok()));
        }
        match crate::join::is_new_member(&first, node_id, advertised) {
            Err(why) => return Err(StartError::Config(why)),
            Ok(true) => {
                let dir = marker.parent().unwrap_or(marker);
                crate::join::mark_joining(dir).map_err(storage_err(dir))?;
                self.finish_joining(config, advertised, marker, has_state);
                return Ok(());
            }
            Ok(false) => {}
        }
        let lowest = *config.cluster.keys().next().expect("cluster is not empty");
        let others: Vec<(NodeId, String)> = config
            .cluster
            .iter()
            .filter(|(id, _)| **id != node_id)
            .map(|(id, a)| (*id, a.clone()))
            .collect();
        let accepting = self.accepting_votes.clone();
        let marker = marker.to_path_buf();
        let handle = self.handle.clone();
        let advertised = advertised.to_owned();
        tokio::spawn(async move {
            loop {
                // Ask every peer whether it holds the group.
                let mut answers = Vec::new();
                for (id, addr) in &others {
                    answers.push((*id, peers.status(addr).await.ok()));
                }
                // A peer whose log goes past the initial membership entry belongs to a
                // group that may have committed something: this node is a member that lost
                // (or never had) its state and must catch up before it votes.
                let group_exists = answers
                    .iter()
                    .filter_map(|(_, s)| s.as_ref())
                    .filter(|s| s.has_state)
                    .any(|s| {
                        s.last_log_index
                            .max(s.last_applied)
                            .max(s.snapshot)
                            .unwrap_or(0)
                            > 0
                    });
                if group_exists {
                    match crate::join::is_new_member(&answers, node_id, &advertised) {
                        Ok(false) => {}
                        Ok(true) => {
                            // The group came up after this node's first look: join it.
                            let dir = marker.parent().unwrap_or(marker.as_path());
                            if let Err(e) = crate::join::mark_joining(dir) {
                                warn!(node = node_id, error = %e, "cannot mark the join");
                            }
                            if let Err(why) =
                                crate::join::join(&handle, &peers, &others, &advertised).await
                            {
                                tracing::error!(
                                    node = node_id,
                                    "cannot join the control plane: {why}"
                                );
                                return; // stays out: never votes
                            }
                            let _ = std::fs::remove_file(dir.join(crate::join::JOINING_FILE));
                            break;
                        }
                        Err(why) => {
                            tracing::error!(node = node_id, "cannot join the control plane: {why}");
                            return;
                        }
                    }
                    warn!(
                        node = node_id,
                        "no local metadata but the group exists: catching up before voting"
                    );
                    crate::join::catch_up(&handle, &peers, &others).await;
                    break;
                }
                // A peer holds state but nothing is committed yet: the group is being formed
                // right now, and there is nothing a vote could lose.
                if answers
                    .iter()
                    .any(|(_, s)| s.as_ref().is_some_and(|s| s.has_state))
                {
                    break;
                }
                let all_answered_empty = answers
                    .iter()
                    .all(|(_, s)| s.as_ref().is_some_and(|s| !s.has_state));
                if node_id == lowest && all_answered_empty {
                    match raft.initialize(members.clone()).await {
                        Ok(()) => info!(node = node_id, "initialized the metadata group"),
                        Err(e) => warn!(node = node_id, error = %e, "initialize refused"),
                    }
                    break;
                }
                if handle.applied().borrow().to_owned() > 0 {
                    break; // another node initialized and replicated to us
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            if let Err(e) = write_marker(&marker, node_id) {
                warn!(node = node_id, error = %e, "could not write the cluster marker");
            }
            has_state.store(true, Ordering::Release);
            accepting.store(true, Ordering::Release);
            raft.runtime_config().elect(true);
            info!(node = node_id, "metadata member is voting");
        });
        Ok(())
    }

    /// Joins a running group (`join.rs`) in the background, then votes: neither votes nor
    /// stands until it is a caught-up voter. A refusal (a conflict) is logged and leaves
    /// this node out of the group, not voting.
    fn finish_joining(
        &self,
        config: &MetaConfig,
        advertised: &str,
        marker: &Path,
        has_state: Arc<AtomicBool>,
    ) {
        self.accepting_votes.store(false, Ordering::Release);
        let raft = self.handle.raft().clone();
        raft.runtime_config().elect(false);
        let network = config.network();
        let node_id = config.node_id;
        let peers: Vec<(NodeId, String)> = config
            .cluster
            .iter()
            .filter(|(id, _)| **id != node_id)
            .map(|(id, a)| (*id, a.clone()))
            .collect();
        let (handle, accepting) = (self.handle.clone(), self.accepting_votes.clone());
        let (advertised, marker) = (advertised.to_owned(), marker.to_path_buf());
        tokio::spawn(async move {
            if let Err(why) = crate::join::join(&handle, &network, &peers, &advertised).await {
                tracing::error!(node = node_id, "cannot join the control plane: {why}");
                return;
            }
            if let Err(e) = write_marker(&marker, node_id) {
                warn!(node = node_id, error = %e, "could not write the cluster marker");
            }
            if let Some(dir) = marker.parent() {
                let _ = std::fs::remove_file(dir.join(crate::join::JOINING_FILE));
            }
            has_state.store(true, Ordering::Release);
            accepting.store(true, Ordering::Release);
            raft.runtime_config().elect(true);
            info!(node = node_id, "metadata member is voting");
        });
    }

    /// The handle for the rest of Felix.
    pub fn handle(&self) -> &MetaHandle {
        &self.handle
    }

    /// The internal address the node listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Whether the node votes (false while a wiped member catches up).
    pub fn accepting_votes(&self) -> bool {
        self.accepting_votes.load(Ordering::Acquire)
    }

    /// Stops the failover controller, Raft and the server.
    pub async fn shutdown(self) {
        let _ = self.stop_controller.send(true);
        let mut controller = self.controller;
        if tokio::time::timeout(Duration::from_secs(5), &mut controller)
            .await
            .is_err()
        {
            controller.abort();
        }
        let _ = self.handle.raft().shutdown().await;
        let _ = self.shutdown.send(true);
        let _ = self.server.await;
    }
}

fn write_marker(path: &Path, node_id: NodeId) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(
        f,
        "felix metadata member {node_id}; this directory belongs to an initialized group"
    )?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
