//! The control plane's promises on real processes: three `felix-meta` nodes on loopback,
//! killed with SIGKILL, restarted, and wiped.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command as Process, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use felix_meta::model::{
    Applied, Command, CommandError, SegmentEntry, ShardKey, StreamSettings, TierState,
};
use felix_meta::network::{ForwardError, HttpNetworkFactory, NodeStatus};
use parking_lot::Mutex;

const BIN: &str = env!("CARGO_BIN_EXE_felix-meta");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral port")
        .local_addr()
        .expect("local addr")
        .port()
}

/// A cluster of `felix-meta` processes sharing a temp dir.
struct Cluster {
    dir: tempfile::TempDir,
    addrs: BTreeMap<u64, String>,
    children: Mutex<BTreeMap<u64, Child>>,
    snapshot_logs: u64,
    client: HttpNetworkFactory,
    /// Nodes named in `--cluster` for processes spawned from now on.
    cluster_ids: Mutex<BTreeSet<u64>>,
}

impl Cluster {
    fn start(n: u64, snapshot_logs: u64) -> Cluster {
        Cluster::start_of(n, n, snapshot_logs)
    }

    /// Reserves addresses for `reserve` nodes and starts the first `n` as a group of `n`.
    fn start_of(n: u64, reserve: u64, snapshot_logs: u64) -> Cluster {
        let addrs = (1..=reserve)
            .map(|id| (id, format!("127.0.0.1:{}", free_port())))
            .collect();
        let c = Cluster {
            dir: tempfile::tempdir().expect("tempdir"),
            addrs,
            children: Mutex::new(BTreeMap::new()),
            snapshot_logs,
            client: HttpNetworkFactory::new(Duration::from_secs(3)),
            cluster_ids: Mutex::new((1..=n).collect()),
        };
        for id in 1..=n {
            c.spawn(id);
        }
        c
    }

    fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}"))
    }

    fn spawn(&self, id: u64) {
        let ids = self.cluster_ids.lock().clone();
        let cluster = self
            .addrs
            .iter()
            .filter(|(id, _)| ids.contains(id))
            .map(|(id, a)| format!("{id}={a}"))
            .collect::<Vec<_>>()
            .join(",");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("node-{id}.log")))
            .expect("log file");
        let child = Process::new(BIN)
            .args(["--node-id", &id.to_string(), "--cluster", &cluster])
            .arg("--data-dir")
            .arg(self.data_dir(id))
            .args(["--snapshot-logs", &self.snapshot_logs.to_string()])
            // No broker renews a lease here: a long lease keeps the failover controller from
            // marking registered brokers dead in the middle of these tests.
            .args(["--lease-ms", "600000"])
            .env("FELIX_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn felix-meta");
        self.children.lock().insert(id, child);
    }

    fn kill(&self, id: u64) {
        if let Some(mut c) = self.children.lock().remove(&id) {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    fn stop(&self, id: u64) {
        if let Some(mut c) = self.children.lock().remove(&id) {
            // SAFETY: sending a signal to our own child process.
            unsafe { libc_kill(c.id() as i32, 15) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn running(&self) -> Vec<u64> {
        self.children.lock().keys().copied().collect()
    }

    async fn status(&self, id: u64) -> Option<NodeStatus> {
        self.client.status(&self.addrs[&id]).await.ok()
    }

    /// Waits until every running node agrees on one leader (that is running), and returns it.
    async fn leader(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            let running = self.running();
            let mut leaders = BTreeSet::new();
            let mut answered = 0;
            for id in &running {
                if let Some(s) = self.status(*id).await {
                    answered += 1;
                    if let Some(l) = s.leader {
                        leaders.insert(l);
                    }
                }
            }
            if answered == running.len() && leaders.len() == 1 {
                let l = *leaders.iter().next().expect("one");
                if running.contains(&l) {
                    return l;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader among {running:?} within {within:?} (saw {leaders:?})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn propose(
        &self,
        id: u64,
        cmd: &Command,
    ) -> Result<Result<Applied, CommandError>, ForwardError> {
        self.client.forward_propose(&self.addrs[&id], cmd).await
    }

    /// Proposes through any running node until one answers (the outcome is then known).
    async fn propose_ok(&self, cmd: &Command) -> Result<Applied, CommandError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for id in self.running() {
                if let Ok(r) = self.propose(id, cmd).await {
                    return r;
                }
            }
            assert!(Instant::now() < deadline, "no node accepted {cmd:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn dump(&self, id: u64) -> Option<serde_json::Value> {
        let (status, body) = http_get(&self.addrs[&id], "/meta/dump")?;
        (status == 200)
            .then(|| serde_json::from_slice(&body).ok())
            .flatten()
    }

    /// Waits until every running node has applied everything the leader's log holds and
    /// their applied states are identical; returns that state.
    async fn converged(&self, within: Duration) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            let mut statuses = Vec::new();
            for id in self.running() {
                statuses.push(self.status(id).await);
            }
            let leader_log = statuses
                .iter()
                .flatten()
                .find(|s| s.leader == Some(s.node_id))
                .and_then(|s| s.last_log_index);
            let all_applied = leader_log.is_some()
                && statuses
                    .iter()
                    .all(|s| s.as_ref().is_some_and(|s| s.last_applied == leader_log));
            if !all_applied {
                assert!(
                    Instant::now() < deadline,
                    "nodes {:?} did not catch up within {within:?}",
                    self.running()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let dumps: Vec<_> = self.running().iter().map(|id| self.dump(*id)).collect();
            if dumps.iter().all(Option::is_some)
                && dumps.windows(2).all(|w| w[0] == w[1])
                && !dumps.is_empty()
            {
                return dumps[0].clone().expect("some");
            }
            assert!(
                Instant::now() < deadline,
                "nodes {:?} did not converge within {within:?}",
                self.running()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, mut c) in std::mem::take(&mut *self.children.lock()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// A minimal HTTP/1.1 GET (the tests need only the dump).
fn http_get(addr: &str, path: &str) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..split]).ok()?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Some((status, dechunk(&body)));
    }
    Some((status, body))
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let len = usize::from_str_radix(std::str::from_utf8(&b[..i]).unwrap_or("0").trim(), 16)
            .unwrap_or(0);
        if len == 0 {
            break;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + len]);
        b = &b[i + 2 + len + 2..];
    }
    out
}

fn tenant(name: &str) -> Command {
    Command::CreateTenant { name: name.into() }
}
fn namespace(t: &str, n: &str) -> Command {
    Command::CreateNamespace {
        tenant: t.into(),
        name: n.into(),
    }
}
fn stream(t: &str, n: &str, s: &str) -> Command {
    Command::CreateStream {
        tenant: t.into(),
        namespace: n.into(),
        name: s.into(),
        settings: StreamSettings::default(),
    }
}
fn namespaces_of(dump: &serde_json::Value, tenant: &str) -> BTreeSet<String> {
    dump["tenants"][tenant]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_mid_proposals_loses_no_acknowledged_command() {
    let c = Arc::new(Cluster::start(3, 5000));
    let leader = c.leader(Duration::from_secs(30)).await;
    c.propose_ok(&tenant("acme")).await.expect("tenant created");

    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let proposer = {
        let (c, acked, stop) = (c.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Acquire) {
                let name = format!("ns-{i}");
                let running = c.running();
                let via = running[(i as usize) % running.len()];
                if let Ok(Ok(_)) = c.propose(via, &namespace("acme", &name)).await {
                    acked.lock().push(name);
                }
                i += 1;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before_kill = acked.lock().len();
    assert!(
        before_kill > 0,
        "proposals were acknowledged before the kill"
    );
    c.kill(leader);
    let killed_at = Instant::now();
    let new_leader = c.leader(Duration::from_secs(15)).await;
    assert_ne!(new_leader, leader);
    eprintln!(
        "new leader {new_leader} agreed {:?} after the kill",
        killed_at.elapsed()
    );
    // The new leader accepts commands.
    let deadline = Instant::now() + Duration::from_secs(15);
    while acked.lock().len() <= before_kill + 5 {
        assert!(
            Instant::now() < deadline,
            "no command acknowledged after failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Release);
    proposer.await.expect("proposer");

    c.spawn(leader);
    let state = c.converged(Duration::from_secs(30)).await;
    let present = namespaces_of(&state, "acme");
    let acked = acked.lock().clone();
    for name in &acked {
        assert!(
            present.contains(name),
            "acknowledged namespace {name} survived the leader's SIGKILL"
        );
    }
    eprintln!(
        "{} acknowledged commands, all present on the 3 nodes",
        acked.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_every_node_restores_identical_state() {
    let c = Cluster::start(3, 30);
    c.leader(Duration::from_secs(30)).await;
    c.propose_ok(&tenant("acme")).await.expect("tenant");
    c.propose_ok(&namespace("acme", "prod"))
        .await
        .expect("namespace");
    c.propose_ok(&Command::RegisterBroker {
        broker: felix_meta::model::Broker {
            id: 1,
            client_addr: "127.0.0.1:5000".into(),
            kafka_addr: None,
            internal_addr: c.addrs[&1].clone(),
            zone: Some("a".into()),
            alive: true,
            draining: false,
        },
    })
    .await
    .expect("broker");
    // With a live broker, every stream's shard is placed when it is created.
    for s in 0..40 {
        c.propose_ok(&stream("acme", "prod", &format!("s{s}")))
            .await
            .expect("stream");
    }
    let shard = ShardKey {
        tenant: "acme".into(),
        namespace: "prod".into(),
        stream: "s1".into(),
        shard: 0,
    };
    let generation = c
        .propose_ok(&Command::SetPlacement {
            shard: shard.clone(),
            replicas: vec![1],
            leader: Some(1),
        })
        .await
        .expect("placement");
    assert_eq!(generation, Applied::Generation { generation: 1 });
    c.propose_ok(&Command::AddSegment {
        shard: shard.clone(),
        segment: SegmentEntry {
            base_offset: 0,
            last_offset: 99,
            min_timestamp: 1,
            max_timestamp: 2,
            size_bytes: 4096,
            tier: TierState::Hot,
            object_key: None,
            checksum: None,
            local_copies: BTreeSet::from([1]),
        },
    })
    .await
    .expect("segment");
    c.propose_ok(&Command::AllocateProducerIds { count: 10 })
        .await
        .expect("ids");
    let before = c.converged(Duration::from_secs(20)).await;
    assert_eq!(
        before["placements"].as_array().map(Vec::len),
        Some(40),
        "the dump (and the snapshots, taken every 30 entries) hold every placement"
    );

    // One by SIGKILL, the others by SIGTERM.
    c.kill(1);
    c.stop(2);
    c.stop(3);
    for id in 1..=3 {
        c.spawn(id);
    }
    c.leader(Duration::from_secs(30)).await;
    let after = c.converged(Duration::from_secs(30)).await;
    assert_eq!(
        before, after,
        "state after restarting all three equals the state before"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_does_not_vote_until_it_has_caught_up() {
    let c = Cluster::start(3, 5000);
    let leader = c.leader(Duration::from_secs(30)).await;
    c.propose_ok(&tenant("acme")).await.expect("tenant");
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let (stale, wiped) = (others[0], others[1]);

    // `stale` misses a write that the leader and `wiped` acknowledge.
    c.stop(stale);
    c.propose_ok(&namespace("acme", "only-on-two"))
        .await
        .expect("acknowledged by a majority of two");
    // `wiped` loses its disk; the leader dies. Only `stale` (missing the write) and the
    // wiped node remain: they must not elect a leader without the write.
    c.kill(wiped);
    std::fs::remove_dir_all(c.data_dir(wiped)).expect("wipe");
    c.kill(leader);
    c.spawn(stale);
    c.spawn(wiped);
    let watch_until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < watch_until {
        for id in [stale, wiped] {
            if let Some(s) = c.status(id).await {
                assert!(
                    s.leader.is_none() || s.leader == Some(leader),
                    "node {id} reports leader {:?}: a leader was elected without the acknowledged write",
                    s.leader
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The old leader returns with its disk: the group recovers and the write is everywhere.
    c.spawn(leader);
    c.leader(Duration::from_secs(30)).await;
    let state = c.converged(Duration::from_secs(30)).await;
    assert!(namespaces_of(&state, "acme").contains("only-on-two"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = c.status(wiped).await.expect("wiped node answers");
        if s.accepting_votes {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the wiped node caught up and votes again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.propose_ok(&namespace("acme", "after"))
        .await
        .expect("writes continue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_loses_its_disk_under_a_live_leader_catches_up_and_the_leader_stays() {
    let c = Cluster::start(3, 5000);
    let leader = c.leader(Duration::from_secs(30)).await;
    c.propose_ok(&tenant("acme")).await.expect("tenant");
    for i in 0..5 {
        c.propose_ok(&namespace("acme", &format!("before-{i}")))
            .await
            .expect("namespace");
    }
    // A follower the leader has replicated to loses its disk and comes back empty: its log
    // is now behind what the leader recorded as matching. The leader must start over with
    // it, not fall over (openraft asserts against a follower's log going back unless told
    // that Felix's members may lose their state).
    let wiped = (1..=3).find(|id| *id != leader).expect("a follower");
    c.kill(wiped);
    std::fs::remove_dir_all(c.data_dir(wiped)).expect("wipe");
    c.spawn(wiped);
    c.propose_ok(&namespace("acme", "after-wipe"))
        .await
        .expect("the leader and the third member carry on");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if c.status(wiped).await.is_some_and(|s| s.accepting_votes) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the wiped member did not catch up within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let state = c.converged(Duration::from_secs(30)).await;
    assert!(namespaces_of(&state, "acme").contains("after-wipe"));
    assert_eq!(
        c.leader(Duration::from_secs(5)).await,
        leader,
        "the leader kept its place through the member's return"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_follower_catches_up_from_a_snapshot() {
    let c = Cluster::start(3, 20);
    let leader = c.leader(Duration::from_secs(30)).await;
    c.propose_ok(&tenant("acme")).await.expect("tenant");
    let lagging = (1..=3).find(|id| *id != leader).expect("a follower");
    c.stop(lagging);
    for i in 0..150 {
        c.propose_ok(&namespace("acme", &format!("n{i}")))
            .await
            .expect("namespace");
    }
    // Snapshots and purges run in the background after applying: wait for the purge.
    let deadline = Instant::now() + Duration::from_secs(30);
    let purged = loop {
        let leader_status = c
            .status(c.leader(Duration::from_secs(10)).await)
            .await
            .expect("leader status");
        if let Some(p) = leader_status.purged.filter(|p| *p > 20) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "the leader purged its log after snapshots (purged {:?})",
            leader_status.purged
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        purged > 20,
        "log purged past the lagging follower's position (purged {purged})"
    );
    c.spawn(lagging);
    let state = c.converged(Duration::from_secs(30)).await;
    assert_eq!(namespaces_of(&state, "acme").len(), 150);
    let s = c.status(lagging).await.expect("lagging node status");
    assert!(
        s.snapshot.is_some_and(|i| i >= purged),
        "the follower installed a snapshot covering the purged log (snapshot {:?}, purged {purged})",
        s.snapshot
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creators_of_one_stream_see_exactly_one_success() {
    let c = Arc::new(Cluster::start(3, 5000));
    c.leader(Duration::from_secs(30)).await;
    c.propose_ok(&tenant("acme")).await.expect("tenant");
    c.propose_ok(&namespace("acme", "prod"))
        .await
        .expect("namespace");
    for round in 0..5 {
        let name = format!("orders-{round}");
        let mut tasks = Vec::new();
        for i in 0..9u64 {
            let c = c.clone();
            let cmd = stream("acme", "prod", &name);
            tasks.push(tokio::spawn(
                async move { c.propose(1 + i % 3, &cmd).await },
            ));
        }
        let mut wins = 0;
        let mut exists = 0;
        for t in tasks {
            match t.await.expect("task").expect("the node answered") {
                Ok(Applied::StreamVersion { version: 1 }) => wins += 1,
                Err(CommandError::AlreadyExists { .. }) => exists += 1,
                other => panic!("unexpected answer {other:?}"),
            }
        }
        assert_eq!((wins, exists), (1, 8), "exactly one creator of {name} wins");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_as_a_learner_is_promoted_and_another_is_removed() {
    use felix_meta::network::MembershipChange;
    let c = Cluster::start_of(3, 4, 5000);
    let leader = c.leader(Duration::from_secs(30)).await;
    c.propose_ok(&tenant("acme")).await.expect("tenant");
    // Node 4 starts knowing the 4-member list; it is not a member yet.
    c.cluster_ids.lock().insert(4);
    c.spawn(4);
    let change = |m: MembershipChange| {
        let c = &c;
        async move {
            c.client
                .client()
                .change_membership(&c.addrs[&leader], &m)
                .await
        }
    };
    change(MembershipChange::AddLearner {
        id: 4,
        addr: c.addrs[&4].clone(),
    })
    .await
    .expect("node 4 added as a learner and caught up");
    change(MembershipChange::SetVoters {
        voters: BTreeSet::from([1, 2, 3, 4]),
    })
    .await
    .expect("node 4 promoted");
    let status = c.status(leader).await.expect("leader status");
    assert_eq!(status.members.len(), 4);
    // Remove a follower other than the leader: demote, then remove.
    let gone = (1..=3).find(|id| *id != leader).expect("a follower");
    let voters: BTreeSet<u64> = (1..=4).filter(|id| *id != gone).collect();
    change(MembershipChange::SetVoters { voters })
        .await
        .expect("demoted");
    change(MembershipChange::Remove { id: gone })
        .await
        .expect("removed");
    c.stop(gone);
    let status = c.status(leader).await.expect("leader status");
    assert!(
        status.members.iter().all(|(id, _)| *id != gone),
        "removed node is no longer a member"
    );
    // Removing a voter directly is refused with a clear error.
    let voter = (1..=4)
        .find(|id| *id != leader && *id != gone)
        .expect("a voter");
    let refused = change(MembershipChange::Remove { id: voter }).await;
    assert!(
        matches!(refused, Err(ForwardError::Remote { status: 409, .. })),
        "{refused:?}"
    );
    c.propose_ok(&namespace("acme", "after-reconfig"))
        .await
        .expect("writes continue");
    let state = c.converged(Duration::from_secs(20)).await;
    assert!(namespaces_of(&state, "acme").contains("after-reconfig"));
}
