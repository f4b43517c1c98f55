//! The network against real openraft nodes, with an in-memory log and state machine
//! (the real stores are tested on their own).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::Config;
use openraft::EntryPayload;
use openraft::LogState;
use openraft::OptionalSend;
use openraft::RaftLogReader;
use openraft::RaftSnapshotBuilder;
use openraft::Snapshot;
use openraft::error::CheckIsLeaderError;
use openraft::error::ClientWriteError;
use openraft::storage::LogFlushed;
use openraft::storage::RaftLogStorage;
use openraft::storage::RaftStateMachine;
use tokio::sync::Mutex;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use futures::future::BoxFuture;
use hyper::Method;
use openraft::BasicNode;
use openraft::error::RPCError;
use openraft::error::RaftError;
use openraft::error::Timeout;
use openraft::network::RPCOption;
use openraft::network::RaftNetwork;
use openraft::network::RaftNetworkFactory;
use openraft::raft::VoteRequest;

use super::client::CallError;
use super::*;
use crate::model::Applied;
use crate::model::Command;
use crate::model::MetaState;
use crate::types::CommandResult;
use crate::types::Entry;
use crate::types::LogId;
use crate::types::NodeId;
use crate::types::Raft;
use crate::types::SnapshotMeta;
use crate::types::StorageError;
use crate::types::StoredMembership;
use crate::types::TypeConfig;
use crate::types::Vote;

// --- in-memory stores -------------------------------------------------------------

#[derive(Default)]
struct LogInner {
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
    log: BTreeMap<u64, Entry>,
}

#[derive(Clone, Default)]
struct MemLog(Arc<Mutex<LogInner>>);

impl RaftLogReader<TypeConfig> for MemLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(self
            .0
            .lock()
            .await
            .log
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for MemLog {
    type LogReader = MemLog;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let g = self.0.lock().await;
        let last = g.log.values().next_back().map(|e| e.log_id).or(g.purged);
        Ok(LogState {
            last_purged_log_id: g.purged,
            last_log_id: last,
        })
    }
    async fn get_log_reader(&mut self) -> MemLog {
        self.clone()
    }
    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.0.lock().await.vote = Some(*vote);
        Ok(())
    }
    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.0.lock().await.vote)
    }
    async fn save_committed(&mut self, c: Option<LogId>) -> Result<(), StorageError> {
        self.0.lock().await.committed = c;
        Ok(())
    }
    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.0.lock().await.committed)
    }
    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut g = self.0.lock().await;
        for e in entries {
            g.log.insert(e.log_id.index, e);
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }
    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.0.lock().await.log.split_off(&log_id.index);
        Ok(())
    }
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut g = self.0.lock().await;
        g.purged = Some(log_id);
        g.log = g.log.split_off(&(log_id.index + 1));
        Ok(())
    }
}

#[derive(Default)]
struct SmInner {
    applied: Option<LogId>,
    membership: StoredMembership,
    state: MetaState,
    snapshot: Option<(SnapshotMeta, Vec<u8>)>,
    installed_snapshots: u64,
}

#[derive(Clone, Default)]
struct MemSm(Arc<Mutex<SmInner>>);

impl RaftSnapshotBuilder<TypeConfig> for MemSm {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let mut g = self.0.lock().await;
        let data = serde_json::to_vec(&g.state).unwrap();
        let meta = SnapshotMeta {
            last_log_id: g.applied,
            last_membership: g.membership.clone(),
            snapshot_id: format!("{:?}", g.applied),
        };
        g.snapshot = Some((meta.clone(), data.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for MemSm {
    type SnapshotBuilder = MemSm;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let g = self.0.lock().await;
        Ok((g.applied, g.membership.clone()))
    }
    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut g = self.0.lock().await;
        let mut out = Vec::new();
        for e in entries {
            g.applied = Some(e.log_id);
            out.push(match e.payload {
                EntryPayload::Blank => Ok(Applied::Done),
                EntryPayload::Normal(cmd) => g.state.apply(&cmd),
                EntryPayload::Membership(m) => {
                    g.membership = StoredMembership::new(Some(e.log_id), m);
                    Ok(Applied::Done)
                }
            });
        }
        Ok(out)
    }
    async fn get_snapshot_builder(&mut self) -> MemSm {
        self.clone()
    }
    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let mut g = self.0.lock().await;
        g.state = serde_json::from_slice(&data).unwrap();
        g.applied = meta.last_log_id;
        g.membership = meta.last_membership.clone();
        g.snapshot = Some((meta.clone(), data));
        g.installed_snapshots += 1;
        Ok(())
    }
    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let g = self.0.lock().await;
        Ok(g.snapshot.clone().map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

// --- a test service and node ------------------------------------------------------

struct TestService {
    raft: Raft,
    sm: MemSm,
    votes: Arc<AtomicBool>,
    /// When set, propose and read_index answer this.
    forced: Option<ForwardError>,
    healthy: bool,
}

fn leader_hint(leader_id: Option<NodeId>, node: Option<BasicNode>) -> ForwardError {
    ForwardError::NotLeader {
        leader: leader_id.zip(node.map(|n| n.addr)),
    }
}

impl MetaService for TestService {
    fn raft(&self) -> &Raft {
        &self.raft
    }
    fn accepting_votes(&self) -> bool {
        self.votes.load(Ordering::SeqCst)
    }
    fn propose(&self, cmd: Command) -> BoxFuture<'_, Result<CommandResult, ForwardError>> {
        Box::pin(async move {
            if let Some(e) = &self.forced {
                return Err(e.clone());
            }
            match self.raft.client_write(cmd).await {
                Ok(resp) => Ok(resp.data),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                    Err(leader_hint(f.leader_id, f.leader_node))
                }
                Err(e) => Err(ForwardError::Unreachable(e.to_string())),
            }
        })
    }
    fn read_index(&self) -> BoxFuture<'_, Result<u64, ForwardError>> {
        Box::pin(async move {
            if let Some(e) = &self.forced {
                return Err(e.clone());
            }
            match self.raft.ensure_linearizable().await {
                Ok(id) => Ok(id.map_or(0, |id| id.index)),
                Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                    Err(leader_hint(f.leader_id, f.leader_node))
                }
                Err(e) => Err(ForwardError::Unreachable(e.to_string())),
            }
        })
    }
    fn status(&self) -> BoxFuture<'_, NodeStatus> {
        Box::pin(async move {
            let m = self.raft.metrics().borrow().clone();
            NodeStatus {
                node_id: m.id,
                leader: m.current_leader,
                term: m.current_term,
                last_applied: m.last_applied.map(|l| l.index),
                committed: None,
                has_state: m.last_applied.is_some(),
                accepting_votes: self.accepting_votes(),
                members: m
                    .membership_config
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
        Box::pin(async move { serde_json::to_value(&self.sm.0.lock().await.state).unwrap() })
    }
    fn healthz(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move { self.healthy })
    }
}

struct TestNode {
    addr: String,
    raft: Raft,
    sm: MemSm,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl TestNode {
    async fn stop(mut self) {
        self.raft.shutdown().await.unwrap();
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), self.server)
            .await
            .expect("serve returns after shutdown")
            .unwrap();
    }
}

fn config() -> Arc<Config> {
    let c = Config {
        cluster_name: "felix-meta-test".into(),
        heartbeat_interval: 50,
        election_timeout_min: 200,
        election_timeout_max: 400,
        // Small chunks, so a snapshot crosses the wire in several requests.
        snapshot_max_chunk_size: 64,
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..Default::default()
    };
    Arc::new(c.validate().unwrap())
}

async fn start_node(
    id: NodeId,
    votes: bool,
    forced: Option<ForwardError>,
    healthy: bool,
) -> TestNode {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let sm = MemSm::default();
    let net = HttpNetworkFactory::new(Duration::from_secs(5)).with_local_id(id);
    let raft = Raft::new(id, config(), net, MemLog::default(), sm.clone())
        .await
        .unwrap();
    let service = Arc::new(TestService {
        raft: raft.clone(),
        sm: sm.clone(),
        votes: Arc::new(AtomicBool::new(votes)),
        forced,
        healthy,
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, raft_router(service), async move {
        let _ = stopped.await;
    }));
    TestNode {
        addr,
        raft,
        sm,
        stop: Some(stop),
        server,
    }
}

fn node(addr: &str) -> BasicNode {
    BasicNode {
        addr: addr.to_owned(),
    }
}

fn tenant(name: &str) -> Command {
    Command::CreateTenant {
        name: name.to_owned(),
    }
}

async fn wait_applied(n: &TestNode, index: u64) {
    n.raft
        .wait(Some(Duration::from_secs(10)))
        .applied_index_at_least(Some(index), "applied")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_replicates_forwards_and_installs_snapshots_over_http() {
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(start_node(id, true, None, true).await);
    }
    let members: BTreeMap<NodeId, BasicNode> = nodes
        .iter()
        .zip(1..)
        .map(|(n, id)| (id, node(&n.addr)))
        .collect();
    nodes[0].raft.initialize(members.clone()).await.unwrap();

    let m = nodes[0]
        .raft
        .wait(Some(Duration::from_secs(10)))
        .metrics(|m| m.current_leader.is_some(), "a leader")
        .await
        .unwrap();
    let leader = m.current_leader.unwrap();
    let li = (leader - 1) as usize;
    let fi = (li + 1) % 3;
    let client = PeerClient::new(Duration::from_secs(5));

    // A follower points at the leader; the leader commits.
    let err = client
        .forward_propose(&nodes[fi].addr, &tenant("t0"))
        .await
        .unwrap_err();
    let leader_addr = nodes[li].addr.clone();
    // The follower may not know the leader yet; then it names none.
    match &err {
        ForwardError::NotLeader { leader: Some(l) } => assert_eq!(l, &(leader, leader_addr)),
        ForwardError::NotLeader { leader: None } => {}
        other => panic!("expected NotLeader, got {other:?}"),
    }
    for i in 0..5 {
        let r = client
            .forward_propose(&nodes[li].addr, &tenant(&format!("t{i}")))
            .await;
        assert_eq!(r, Ok(Ok(Applied::Done)));
    }
    // A refused command is a 200 with the refusal.
    let r = client
        .forward_propose(&nodes[li].addr, &tenant("t0"))
        .await
        .unwrap();
    assert!(
        matches!(r, Err(crate::model::CommandError::AlreadyExists { .. })),
        "{r:?}"
    );

    let index = client.read_index(&nodes[li].addr).await.unwrap();
    assert!(index >= 7, "blank + membership + 6 commands, got {index}");
    assert!(matches!(
        client.read_index(&nodes[fi].addr).await,
        Err(ForwardError::NotLeader { .. })
    ));
    for n in &nodes {
        wait_applied(n, index).await;
    }
    let want = client.dump(&nodes[li].addr).await.unwrap();
    assert_eq!(want["tenants"].as_object().unwrap().len(), 5);
    for n in &nodes {
        assert_eq!(client.dump(&n.addr).await.unwrap(), want);
        let s = client.status(&n.addr).await.unwrap();
        assert_eq!(s.leader, Some(leader));
        assert_eq!(s.members.len(), 3);
        assert!(client.healthz(&n.addr).await.unwrap());
    }

    // Snapshot and purge the leader's log: a new member can only catch up from the
    // snapshot, sent over /raft/snapshot in 64-byte chunks.
    nodes[li].raft.trigger().snapshot().await.unwrap();
    nodes[li]
        .raft
        .wait(Some(Duration::from_secs(10)))
        .metrics(|m| m.snapshot.map(|s| s.index) >= Some(index), "snapshot")
        .await
        .unwrap();
    nodes[li].raft.trigger().purge_log(index).await.unwrap();
    nodes[li]
        .raft
        .wait(Some(Duration::from_secs(10)))
        .metrics(|m| m.purged.map(|p| p.index) >= Some(index), "purged")
        .await
        .unwrap();

    let n4 = start_node(4, true, None, true).await;
    nodes[li]
        .raft
        .add_learner(4, node(&n4.addr), true)
        .await
        .unwrap();
    wait_applied(&n4, index).await;
    assert_eq!(n4.sm.0.lock().await.installed_snapshots, 1);
    assert_eq!(client.dump(&n4.addr).await.unwrap(), want);

    n4.stop().await;
    for n in nodes {
        n.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_votes_and_transport_failures_map_to_rpc_errors() {
    let n = start_node(1, false, None, false).await;
    let mut factory = HttpNetworkFactory::new(Duration::from_secs(5)).with_local_id(9);
    let opt = || RPCOption::new(Duration::from_millis(500));
    let vote = || VoteRequest {
        vote: Vote::new(7, 9),
        last_log_id: None,
    };

    // A node that does not accept votes answers 503: the candidate sees Unreachable.
    let mut conn = factory.new_client(1, &node(&n.addr)).await;
    let err = conn.vote(vote(), opt()).await.unwrap_err();
    assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
    assert!(!factory.client().healthz(&n.addr).await.unwrap());

    // Nothing listening: Unreachable.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut conn = factory.new_client(2, &node(&closed)).await;
    let err = conn.vote(vote(), opt()).await.unwrap_err();
    assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
    assert!(matches!(
        factory.client().status(&closed).await,
        Err(ForwardError::Unreachable(_))
    ));

    // A peer that accepts but never answers: Timeout within hard_ttl.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let mut conn = factory.new_client(3, &node(&silent_addr)).await;
    let started = std::time::Instant::now();
    let err = conn.vote(vote(), opt()).await.unwrap_err();
    assert!(
        matches!(
            err,
            RPCError::Timeout(Timeout {
                target: 3,
                id: 9,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    let quick = factory.client().with_timeout(Duration::from_millis(300));
    assert_eq!(
        quick.read_index(&silent_addr).await,
        Err(ForwardError::Timeout)
    );
    hold.abort();

    // A vote accepted by a node that does accept votes.
    let m = start_node(2, true, None, true).await;
    let mut conn = factory.new_client(2, &node(&m.addr)).await;
    let resp = conn.vote(vote(), opt()).await.unwrap();
    assert!(resp.vote_granted);

    m.stop().await;
    n.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_errors_round_trip() {
    let client = PeerClient::new(Duration::from_secs(5));
    let cases = [
        (
            ForwardError::NotLeader {
                leader: Some((3, "10.0.0.3:9000".into())),
            },
            421,
        ),
        (ForwardError::NotLeader { leader: None }, 421),
        (ForwardError::Unreachable("leader gone".into()), 503),
        (ForwardError::Timeout, 504),
        (ForwardError::Interrupted("reset".into()), 502),
        (
            ForwardError::Remote {
                status: 409,
                message: "busy".into(),
            },
            409,
        ),
    ];
    for (e, status) in cases {
        assert_eq!(e.http_status(), status);
        let n = start_node(1, true, Some(e.clone()), true).await;
        assert_eq!(
            client.forward_propose(&n.addr, &tenant("x")).await,
            Err(e.clone())
        );
        assert_eq!(client.read_index(&n.addr).await, Err(e));
        n.stop().await;
    }
    // Errors not produced by the service: unparsable bodies keep their status.
    assert_eq!(
        ForwardError::from_response(421, b"nope"),
        ForwardError::NotLeader { leader: None }
    );
    assert_eq!(
        ForwardError::from_response(502, b"bad gateway"),
        ForwardError::Remote {
            status: 502,
            message: "bad gateway".into()
        }
    );
    assert_eq!(
        ForwardError::from_response(422, b"bad json"),
        ForwardError::Remote {
            status: 422,
            message: "bad json".into()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_limits() {
    let forced = ForwardError::Remote {
        status: 409,
        message: "parsed".into(),
    };
    let n = start_node(1, true, Some(forced.clone()), true).await;
    let client = PeerClient::new(Duration::from_secs(10));
    let batch = |count: usize| Command::Batch {
        commands: (0..count)
            .map(|i| tenant(&format!("tenant-{i:08}")))
            .collect(),
    };
    // About 3 MiB: over axum's default 2 MiB, under BODY_LIMIT, so the service sees it.
    let body = serde_json::to_vec(&batch(65_536)).unwrap();
    assert!(
        body.len() > 2 * 1024 * 1024 && body.len() < BODY_LIMIT,
        "{}",
        body.len()
    );
    assert_eq!(
        client.forward_propose(&n.addr, &batch(65_536)).await,
        Err(forced)
    );
    // Over BODY_LIMIT: refused before sending.
    match client
        .forward_propose(&n.addr, &batch(BODY_LIMIT / 32))
        .await
    {
        Err(ForwardError::Remote { status: 413, .. }) => {}
        other => panic!("expected 413, got {other:?}"),
    }
    // And by the server, if sent anyway (413, or the connection closed mid-upload).
    let body = serde_json::to_vec(&batch(BODY_LIMIT / 32)).unwrap();
    match client
        .call(
            Method::POST,
            &n.addr,
            "/meta/propose",
            Some(body),
            client.timeout(),
        )
        .await
    {
        Ok((413, _)) | Err(CallError::Broken(_)) => {}
        other => panic!("expected 413, got {other:?}"),
    }
    n.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_drains_then_returns() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let router = Router::new()
        .route("/quick", get(|| async { "quick" }))
        .route(
            "/hang",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(600)).await;
                "late"
            }),
        );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, router, async move {
        let _ = stopped.await;
    }));
    let client = PeerClient::new(Duration::from_secs(30));
    assert_eq!(
        client
            .call(Method::GET, &addr, "/quick", None, client.timeout())
            .await
            .unwrap(),
        (200, Bytes::from_static(b"quick"))
    );
    let hanging = {
        let (client, addr) = (client.clone(), addr.clone());
        tokio::spawn(async move {
            client
                .call(Method::GET, &addr, "/hang", None, client.timeout())
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    stop.send(()).unwrap();
    tokio::time::timeout(SHUTDOWN_DRAIN + Duration::from_secs(2), server)
        .await
        .expect("serve returns within the drain time")
        .unwrap();
    assert!(started.elapsed() >= SHUTDOWN_DRAIN - Duration::from_millis(100));
    // The listener is closed.
    assert!(matches!(
        client
            .call(Method::GET, &addr, "/quick", None, client.timeout())
            .await,
        Err(CallError::Connect(_))
    ));
    hanging.abort();
}
