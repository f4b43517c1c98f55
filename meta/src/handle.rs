//! [`MetaHandle`]: how the rest of Felix talks to the control plane.
//!
//! * `propose` sends a command and waits until it is applied, from any node: a follower
//!   forwards to the Raft leader. Commands that queue up while Raft writes are in flight go
//!   into one log entry ([`Command::Batch`]), so many small updates (manifest entries,
//!   replication reports) cost one Raft round trip together, not one each.
//! * `read` is linearizable: the leader confirms its leadership with a quorum round; a
//!   follower asks the leader for that read index and waits until it has applied it.
//! * `registry` is a watch of the local registry, for the data path, which never waits on
//!   Raft.
//! * `renew_broker_lease` renews a broker's shard-leader lease with the meta leader, from
//!   any node. The leader confirms its leadership with a quorum before it grants, so a
//!   deposed leader that has not noticed yet cannot hand out a lease its successor does
//!   not wait out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tracing::debug;

use crate::lease::{LeaseError, LeaseTable};
use crate::model::{Applied, Command, CommandError, MetaState, Placement, Replication, ShardKey};
use crate::network::{ForwardError, HttpNetworkFactory};
use crate::state_machine::{Registry, StateMachineStore};
use crate::types::{CommandResult, NodeId, Raft};

/// Proposals waiting longer than this fail with [`MetaError::Timeout`].
const PROPOSE_DEADLINE: Duration = Duration::from_secs(10);
/// Raft writes the proposer keeps in flight; further proposals queue and are batched.
const WRITES_IN_FLIGHT: usize = 4;
/// Most commands per batch entry.
const MAX_BATCH: usize = 512;
/// Shortest timeout given to one lease renewal RPC near the end of its deadline.
const MIN_RPC: Duration = Duration::from_millis(100);

/// Why a control-plane call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// The state machine refused the command (it was applied as a no-op).
    #[error(transparent)]
    Rejected(#[from] CommandError),
    /// No leader could be reached before the deadline; the command was not applied.
    #[error("no metadata leader reachable within {0:?}")]
    Timeout(Duration),
    /// The command may or may not have been applied (the leader was lost mid-request).
    #[error("outcome unknown: {0}")]
    Indeterminate(String),
    /// The operation needs the leader and this node is not it.
    #[error("not the metadata leader (leader: {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    /// The node is shutting down or Raft failed.
    #[error("metadata node stopped: {0}")]
    Stopped(String),
}

struct Proposal {
    cmd: Command,
    reply: oneshot::Sender<Result<Applied, MetaError>>,
}

pub(crate) struct HandleInner {
    pub node_id: NodeId,
    pub raft: Raft,
    pub sm: StateMachineStore,
    pub peers: HttpNetworkFactory,
    pub leases: LeaseTable,
    proposals: mpsc::Sender<Proposal>,
}

/// The control plane, as seen from one node. Cheap to clone.
#[derive(Clone)]
pub struct MetaHandle {
    pub(crate) inner: Arc<HandleInner>,
}

impl MetaHandle {
    pub(crate) fn new(
        node_id: NodeId,
        raft: Raft,
        sm: StateMachineStore,
        peers: HttpNetworkFactory,
        lease_duration: Duration,
    ) -> MetaHandle {
        let (tx, rx) = mpsc::channel(16 * 1024);
        let inner = Arc::new(HandleInner {
            node_id,
            raft,
            sm,
            peers,
            leases: LeaseTable::new(lease_duration),
            proposals: tx,
        });
        tokio::spawn(run_proposer(inner.clone(), rx));
        tokio::spawn(track_leadership(inner.clone()));
        MetaHandle { inner }
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.inner.node_id
    }

    /// The Raft instance (for membership administration and metrics).
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// Proposes a command and waits until it is applied; returns its answer. Works on any
    /// node: a follower forwards to the leader.
    pub async fn propose(&self, cmd: Command) -> Result<Applied, MetaError> {
        let (reply, rx) = oneshot::channel();
        self.inner
            .proposals
            .send(Proposal { cmd, reply })
            .await
            .map_err(|_| MetaError::Stopped("proposer stopped".into()))?;
        rx.await
            .map_err(|_| MetaError::Stopped("proposer stopped".into()))?
    }

    /// Runs `f` on the state after a linearizable read barrier: every command acknowledged
    /// before this call is visible.
    pub async fn read<T>(&self, f: impl FnOnce(&MetaState) -> T) -> Result<T, MetaError> {
        let deadline = Instant::now() + PROPOSE_DEADLINE;
        loop {
            match self.read_index().await {
                Ok(index) => {
                    self.wait_applied(index, deadline).await?;
                    return Ok(self.inner.sm.read(f));
                }
                Err(ForwardError::NotLeader {
                    leader: Some((_, addr)),
                }) => match self.inner.peers.read_index(&addr).await {
                    Ok(index) => {
                        self.wait_applied(index, deadline).await?;
                        return Ok(self.inner.sm.read(f));
                    }
                    Err(e) => debug!(error = %e, "read index from leader failed; retrying"),
                },
                Err(e) => debug!(error = %e, "read index unavailable; retrying"),
            }
            if Instant::now() >= deadline {
                return Err(MetaError::Timeout(PROPOSE_DEADLINE));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// On the leader: confirms leadership with a quorum and returns the index a linearizable
    /// read must wait for.
    pub(crate) async fn read_index(&self) -> Result<u64, ForwardError> {
        match self.inner.raft.ensure_linearizable().await {
            Ok(log_id) => Ok(log_id.map_or(0, |l| l.index)),
            Err(RaftError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(ForwardError::NotLeader {
                    leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)),
                })
            }
            Err(e) => Err(ForwardError::Remote {
                status: 503,
                message: e.to_string(),
            }),
        }
    }

    async fn wait_applied(&self, index: u64, deadline: Instant) -> Result<(), MetaError> {
        let mut rx = self.inner.sm.watch_applied();
        let wait = rx.wait_for(|applied| *applied >= index);
        match tokio::time::timeout_at(deadline.into(), wait).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(MetaError::Stopped("state machine closed".into())),
            Err(_) => Err(MetaError::Timeout(PROPOSE_DEADLINE)),
        }
    }

    /// Reads the local applied state without a barrier (may be slightly behind the leader).
    pub fn local<T>(&self, f: impl FnOnce(&MetaState) -> T) -> T {
        self.inner.sm.read(f)
    }

    /// A watch of the local registry (tenants, namespaces, streams, brokers, placement),
    /// updated after every apply that changes it.
    pub fn registry(&self) -> watch::Receiver<Arc<Registry>> {
        self.inner.sm.watch_registry()
    }

    /// A watch of the local applied log index.
    pub fn applied(&self) -> watch::Receiver<u64> {
        self.inner.sm.watch_applied()
    }

    /// The current Raft leader, as this node knows it.
    pub fn leader(&self) -> Option<NodeId> {
        self.inner.raft.metrics().borrow().current_leader
    }

    /// Whether this node is the Raft leader.
    pub fn is_leader(&self) -> bool {
        self.leader() == Some(self.inner.node_id)
    }

    /// Ready to serve: a leader is known and the local state machine has applied every
    /// entry this node's log holds (so the registry reflects what the leader had sent).
    pub fn is_ready(&self) -> bool {
        let m = self.inner.raft.metrics().borrow().clone();
        m.current_leader.is_some() && m.last_applied.map(|l| l.index) >= m.last_log_index
    }

    /// The Raft term this node knows (a new leader is elected in a higher term).
    pub fn current_term(&self) -> u64 {
        self.inner.raft.metrics().borrow().current_term
    }

    /// Waits up to `timeout` for [`MetaHandle::is_ready`].
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.is_ready() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.is_ready()
    }

    /// Renews a broker's shard-leader lease in this node's table, if it is the metadata
    /// leader, without confirming leadership with a quorum first. Brokers use
    /// [`MetaHandle::renew_broker_lease`], which does.
    pub fn renew_lease(&self, broker: NodeId) -> Result<Duration, LeaseError> {
        self.inner.leases.renew(broker, Instant::now())
    }

    /// The signer of this node's internal requests (`None`: the internal network is not
    /// authenticated), for the broker's own clients of other brokers.
    pub fn peer_signer(&self) -> Option<crate::network::PeerSigner> {
        self.inner.peers.client().signer().cloned()
    }

    /// The lease table (leader side).
    pub fn leases(&self) -> &LeaseTable {
        &self.inner.leases
    }

    /// The shard-leader lease duration ([`crate::MetaConfig::lease`]).
    pub fn lease_duration(&self) -> Duration {
        self.inner.leases.duration()
    }

    /// Renews `broker`'s shard-leader lease with the metadata leader and returns the
    /// duration granted. Works on any node: on the leader it grants locally, elsewhere it
    /// asks the leader over HTTP (`POST /meta/lease`), following the leader if it moves,
    /// for at most half a lease ([`MetaError::Timeout`] after that).
    ///
    /// The caller counts the lease from an instant taken **before** it called, on its own
    /// monotonic clock (a [`crate::lease::BrokerLease`] with that `sent_at`): the leader
    /// records the grant no earlier, so the broker's lease always ends first.
    pub async fn renew_broker_lease(&self, broker: NodeId) -> Result<Duration, MetaError> {
        let wait = (self.inner.leases.duration() / 2).min(PROPOSE_DEADLINE);
        let deadline = Instant::now() + wait;
        let mut hint: Option<String> = None;
        loop {
            let target = match hint.take() {
                Some(addr) => Some(addr),
                None => match self.inner.leader_addr() {
                    Some((id, _)) if id == self.inner.node_id => {
                        match self.grant_lease(broker).await {
                            Ok(d) => return Ok(d),
                            Err(ForwardError::NotLeader {
                                leader: Some((id, addr)),
                            }) if id != self.inner.node_id => Some(addr),
                            Err(e) => {
                                debug!(error = %e, broker, "lease not granted here; retrying");
                                None
                            }
                        }
                    }
                    Some((_, addr)) => addr,
                    None => None,
                },
            };
            let mut follow = false;
            if let Some(addr) = target {
                let left = deadline.saturating_duration_since(Instant::now());
                let client = self.inner.peers.client();
                let client = client.with_timeout(client.timeout().min(left).max(MIN_RPC));
                match client.renew_lease(&addr, broker).await {
                    Ok(d) => return Ok(d),
                    Err(ForwardError::NotLeader {
                        leader: Some((id, next)),
                    }) if next != addr => {
                        follow = id != self.inner.node_id;
                        if follow {
                            hint = Some(next);
                        }
                    }
                    Err(e) => debug!(error = %e, broker, %addr, "lease renewal failed; retrying"),
                }
            }
            if Instant::now() >= deadline {
                return Err(MetaError::Timeout(wait));
            }
            if !follow {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Grants a lease if this node is the meta leader, after confirming that with a
    /// quorum; `NotLeader` (naming the leader if known) otherwise. The grant is recorded
    /// at the instant before the confirmation: a successor is elected only after the
    /// quorum answered, so it waits out this grant.
    pub(crate) async fn grant_lease(&self, broker: NodeId) -> Result<Duration, ForwardError> {
        let asked = Instant::now();
        self.read_index().await?;
        self.inner
            .leases
            .renew(broker, asked)
            .map_err(|_| ForwardError::NotLeader {
                leader: self
                    .inner
                    .leader_addr()
                    .and_then(|(id, a)| a.map(|a| (id, a)))
                    .filter(|(id, _)| *id != self.inner.node_id),
            })
    }

    /// The shard's replication report, from the local applied state.
    pub fn replication(&self, shard: &ShardKey) -> Option<Replication> {
        self.local(|s| s.replication.get(shard).cloned())
    }

    /// The shard's placement, from the local applied state.
    pub fn placement(&self, shard: &ShardKey) -> Option<Placement> {
        self.local(|s| s.placements.get(shard).cloned())
    }

    /// Adds a node as a learner and waits until it has caught up. Leader only.
    pub async fn add_learner(&self, id: NodeId, addr: String) -> Result<(), MetaError> {
        self.inner
            .raft
            .add_learner(id, openraft::BasicNode { addr }, true)
            .await
            .map(|_| ())
            .map_err(|e| self.membership_error(e))
    }

    /// Makes `voters` the voting members (learners among them are promoted; voters not
    /// listed are removed from voting and stay learners unless `remove_others`). Leader only.
    pub async fn change_voters(
        &self,
        voters: std::collections::BTreeSet<NodeId>,
        retain: bool,
    ) -> Result<(), MetaError> {
        self.inner
            .raft
            .change_membership(voters, retain)
            .await
            .map(|_| ())
            .map_err(|e| self.membership_error(e))
    }

    /// Adds new member `id` at `addr` as a learner and waits until it caught up (a broker
    /// joining, meta/src/join.rs). Nothing to do if it is a member at `addr` already, so a
    /// joiner may ask again after a lost answer or a restart. Refused if `id` is a member at
    /// another address or `addr` is another member's: two brokers must never share an id
    /// (each would take the other's votes and leases). Leader only.
    pub async fn join_learner(&self, id: NodeId, addr: String) -> Result<(), MetaError> {
        let m = self.inner.raft.metrics().borrow().membership_config.clone();
        let membership = m.membership();
        for (member, node) in membership.nodes() {
            let conflict = if *member == id && node.addr != addr {
                Some(format!(
                    "node id {id} is already a member of the control plane at {}; a broker at \
                     {addr} cannot join under it (give it a new --node-id, or `felixctl broker \
                     remove {id}` first if that broker is gone for good)",
                    node.addr
                ))
            } else if *member != id && node.addr == addr {
                Some(format!(
                    "address {addr} is already member {member}'s; node {id} cannot join at it"
                ))
            } else {
                None
            };
            if let Some(why) = conflict {
                return Err(MetaError::Rejected(CommandError::Invalid(why)));
            }
        }
        if membership.get_node(&id).is_some() {
            return Ok(());
        }
        self.add_learner(id, addr).await
    }

    /// Makes member `id` a voter as well, the other voters staying (nothing to do if it
    /// votes already). Leader only.
    pub async fn promote(&self, id: NodeId) -> Result<(), MetaError> {
        let m = self.inner.raft.metrics().borrow().membership_config.clone();
        let membership = m.membership();
        if membership.voter_ids().any(|v| v == id) {
            return Ok(());
        }
        if membership.get_node(&id).is_none() {
            return Err(MetaError::Rejected(CommandError::Invalid(format!(
                "node {id} is not a member of the control plane: it must join as a learner first"
            ))));
        }
        self.inner
            .raft
            .change_membership(
                openraft::ChangeMembers::AddVoterIds(std::collections::BTreeSet::from([id])),
                true,
            )
            .await
            .map(|_| ())
            .map_err(|e| self.membership_error(e))
    }

    /// Removes a learner from the group, keeping `voters` as they are. Leader only.
    pub async fn remove_learner(&self, id: NodeId) -> Result<(), MetaError> {
        use openraft::ChangeMembers;
        self.inner
            .raft
            .change_membership(
                ChangeMembers::RemoveNodes(std::collections::BTreeSet::from([id])),
                false,
            )
            .await
            .map(|_| ())
            .map_err(|e| self.membership_error(e))
    }

    /// Whether node `id` is a member (voter or learner) of the group, as this node knows.
    pub fn is_member(&self, id: NodeId) -> bool {
        self.inner
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&id)
            .is_some()
    }

    /// Takes node `id` out of the group through the leader: demoted from the voters if it
    /// votes, then removed. Nothing to do if it is not a member. Refused if it would leave
    /// no voter. Works on any node (the change is sent to the leader's membership route).
    pub async fn remove_member(&self, id: NodeId) -> Result<(), MetaError> {
        use crate::network::MembershipChange;
        let m = self.inner.raft.metrics().borrow().membership_config.clone();
        let membership = m.membership();
        if membership.get_node(&id).is_none() {
            return Ok(());
        }
        let voters: std::collections::BTreeSet<NodeId> =
            membership.voter_ids().filter(|v| *v != id).collect();
        if voters.is_empty() {
            return Err(MetaError::Rejected(CommandError::Invalid(format!(
                "node {id} is the control plane's only voter"
            ))));
        }
        let was_voter = membership.voter_ids().any(|v| v == id);
        let Some((_, Some(leader))) = self.inner.leader_addr() else {
            return Err(MetaError::NotLeader { leader: None });
        };
        let client = self.inner.peers.client();
        let send = |change: MembershipChange| {
            let client = client.clone();
            let leader = leader.clone();
            async move {
                client
                    .change_membership(&leader, &change)
                    .await
                    .map_err(|e| MetaError::Rejected(CommandError::Invalid(e.to_string())))
            }
        };
        if was_voter {
            send(MembershipChange::SetVoters { voters }).await?;
        }
        send(MembershipChange::Remove { id }).await
    }

    fn membership_error(
        &self,
        e: RaftError<NodeId, ClientWriteError<NodeId, openraft::BasicNode>>,
    ) -> MetaError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => MetaError::NotLeader {
                leader: f.leader_id,
            },
            RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
                MetaError::Rejected(CommandError::Invalid(c.to_string()))
            }
            RaftError::Fatal(f) => MetaError::Stopped(f.to_string()),
        }
    }
}

impl HandleInner {
    /// The Raft leader this node knows of, with its internal address if known.
    fn leader_addr(&self) -> Option<(NodeId, Option<String>)> {
        let m = self.raft.metrics().borrow().clone();
        m.current_leader.map(|id| {
            let addr = m
                .membership_config
                .membership()
                .get_node(&id)
                .map(|n| n.addr.clone());
            (id, addr)
        })
    }
}

/// Keeps the lease table's idea of leadership in step with Raft.
async fn track_leadership(inner: Arc<HandleInner>) {
    let mut metrics = inner.raft.metrics();
    loop {
        let is_leader = metrics.borrow().current_leader == Some(inner.node_id);
        inner.leases.set_leader(is_leader, Instant::now());
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Takes proposals off the queue and writes them, batching whatever queued up while
/// earlier writes were in flight.
async fn run_proposer(inner: Arc<HandleInner>, mut rx: mpsc::Receiver<Proposal>) {
    let slots = Arc::new(Semaphore::new(WRITES_IN_FLIGHT));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let inner = inner.clone();
        tokio::spawn(async move {
            write_batch(&inner, batch).await;
            drop(permit);
        });
    }
}

async fn write_batch(inner: &HandleInner, batch: Vec<Proposal>) {
    let (cmd, replies): (Command, Vec<_>) = if batch.len() == 1 {
        let p = batch.into_iter().next().expect("one proposal");
        (p.cmd, vec![p.reply])
    } else {
        let (cmds, replies) = batch.into_iter().map(|p| (p.cmd, p.reply)).unzip();
        (Command::Batch { commands: cmds }, replies)
    };
    let batched = replies.len() > 1;
    let result = write_with_retry(inner, cmd).await;
    match result {
        Ok(Ok(Applied::Batch { results })) if batched && results.len() == replies.len() => {
            for (reply, r) in replies.into_iter().zip(results) {
                let _ = reply.send(r.map_err(MetaError::Rejected));
            }
        }
        Ok(r) => {
            let r = r.map_err(MetaError::Rejected);
            for reply in replies {
                let _ = reply.send(r.clone());
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// Writes locally if leader, else forwards to the leader; retries while the command is
/// known not to have been accepted (no leader yet, or the node we asked was not leader).
async fn write_with_retry(inner: &HandleInner, cmd: Command) -> Result<CommandResult, MetaError> {
    let deadline = Instant::now() + PROPOSE_DEADLINE;
    // A forwarded proposal waits for the leader's commit, which can outlast one RPC timeout.
    let forwarder = inner.peers.client().with_timeout(PROPOSE_DEADLINE);
    loop {
        match inner.leader_addr() {
            Some((id, _)) if id == inner.node_id => {
                match inner.raft.client_write(cmd.clone()).await {
                    Ok(resp) => return Ok(resp.data),
                    Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {}
                    Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                        return Err(MetaError::Rejected(CommandError::Invalid(e.to_string())));
                    }
                    Err(RaftError::Fatal(f)) => return Err(MetaError::Stopped(f.to_string())),
                }
            }
            Some((_, Some(addr))) => match forwarder.forward_propose(&addr, &cmd).await {
                Ok(r) => return Ok(r),
                // Refused before anything was written: safe to retry.
                Err(ForwardError::NotLeader { .. }) => {}
                Err(ForwardError::Unreachable(e)) => {
                    debug!(error = %e, "leader unreachable; waiting for a new one");
                }
                Err(e) => return Err(MetaError::Indeterminate(e.to_string())),
            },
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(MetaError::Timeout(PROPOSE_DEADLINE));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
