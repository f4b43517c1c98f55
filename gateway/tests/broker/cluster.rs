//! Three real `felix` processes on loopback form a cluster; faults are SIGKILL and SIGSTOP.
//!
//! * The acked-write audit (the "Must hold"): publishers write unique ids to a
//!   Quorum stream while a fault hits the cluster; afterwards every acknowledged record is
//!   readable exactly at its acknowledged offset, no id appears twice, and a record whose
//!   outcome was unknown is present once or absent. It runs with the leader killed, a
//!   follower killed, two brokers killed in turn, and the leader paused past its lease.
//! * Leader and Quorum streams under the same fault (the spec's `cluster:consistency`).
//! * A follower that was down catches up, from the leader's object store for history the
//!   leader already moved there.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use felix_client::{
    ClientConfig, ClientError, ClusterClient, Connection, Message, StartAt, StreamConfig, codes,
};
use tokio::sync::Mutex;

use super::common::{Broker, BrokerOptions, PATIENCE, free_tcp_addr, http_request, shard_leader};

/// Short leases so a failover takes seconds, not the default ten.
const LEASE_MS: u64 = 1500;

/// A cluster of brokers with node ids 1..=n, sharing one object store directory.
pub(super) struct Cluster {
    pub(super) brokers: Vec<Broker>,
    _objects: tempfile::TempDir,
    /// Every broker's options but its membership: a broker added later gets the same.
    options: BrokerOptions,
    /// `--cluster` as the brokers were started with it (id=internal address, ...).
    spec: String,
}

impl Cluster {
    pub(super) async fn start(n: u64) -> Cluster {
        Cluster::start_with(n, LEASE_MS, &[]).await
    }

    /// A cluster with `auth` on whose brokers share the cluster secret `secret`: every
    /// request between them is signed (docs/internal-network.md).
    pub(super) async fn start_authenticated(n: u64, secret: &str) -> Cluster {
        Cluster::start_with(
            n,
            LEASE_MS,
            &[("FELIX_AUTH", "on"), ("FELIX_CLUSTER_SECRET", secret)],
        )
        .await
    }

    /// A cluster whose brokers hold leases of `lease_ms` and have `env` set as well.
    pub(super) async fn start_with(n: u64, lease_ms: u64, env: &[(&str, &str)]) -> Cluster {
        let objects = tempfile::tempdir().expect("object store dir");
        let internal: Vec<SocketAddr> = (0..n).map(|_| free_tcp_addr()).collect();
        let spec = internal
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={a}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let options = env
            .iter()
            .fold(BrokerOptions::new(), |o, (k, v)| o.env(k, v))
            .env("FELIX_LEASE_MS", lease_ms)
            .env("FELIX_FAULT_INJECTION", 1)
            .env(
                "FELIX_OBJECT_STORE",
                format!("file://{}", objects.path().display()),
            );
        let starts = internal
            .iter()
            .enumerate()
            .map(|(i, addr)| Broker::start(options.clone().member(i as u64 + 1, &spec, *addr)));
        // Together: a member is ready only once a majority has formed the control plane.
        let brokers = futures::future::join_all(starts).await;
        Cluster {
            brokers,
            _objects: objects,
            options,
            spec,
        }
    }

    /// Starts a broker with a new node id (the next one), an empty data dir and the
    /// running members plus itself in `--cluster`, as an operator scaling out would; it
    /// joins the control plane by itself (meta/src/join.rs) and is ready once it votes.
    pub(super) async fn add_node(&mut self) -> u64 {
        let id = self.brokers.len() as u64 + 1;
        let addr = free_tcp_addr();
        self.spec = format!("{},{id}={addr}", self.spec);
        let broker = Broker::start(self.options.clone().member(id, &self.spec, addr)).await;
        self.brokers.push(broker);
        id
    }

    pub(super) fn node(&mut self, id: u64) -> &mut Broker {
        &mut self.brokers[id as usize - 1]
    }

    fn seeds(&self) -> Vec<String> {
        self.brokers
            .iter()
            .map(|b| b.quic_addr.to_string())
            .collect()
    }

    pub(super) async fn client(&self, request_timeout: Duration) -> ClusterClient {
        let config = ClientConfig {
            request_timeout,
            token: self.brokers.first().and_then(Broker::admin_token),
            ..ClientConfig::default()
        };
        ClusterClient::connect(self.seeds(), config)
            .await
            .expect("connect to the cluster")
    }

    /// Waits until the shard has a leader other than `not` (and returns it).
    pub(super) async fn leader(
        &self,
        client: &ClusterClient,
        stream: &str,
        not: Option<u64>,
    ) -> u64 {
        shard_leader(client, ("t", "ns", stream), not).await
    }
}

pub(super) async fn create_stream(
    client: &ClusterClient,
    name: &str,
    consistency: &str,
    extra: StreamConfig,
) {
    for r in [
        client.create_tenant("t").await,
        client.create_namespace("t", "ns").await,
    ] {
        match r {
            Ok(()) => {}
            Err(ClientError::Broker(e)) if e.code == codes::ALREADY_EXISTS => {}
            Err(e) => panic!("create tenant/namespace: {e}"),
        }
    }
    client
        .create_stream(
            "t",
            "ns",
            name,
            StreamConfig {
                durable: Some(true),
                shards: Some(1),
                replicas: Some(3),
                consistency: Some(consistency.into()),
                ..extra
            },
        )
        .await
        .expect("create stream");
}

/// Reads shard 0 from the earliest offset up to (not including) `end`, on its leader.
pub(super) async fn read_all(client: &ClusterClient, stream: &str, end: u64) -> Vec<(u64, String)> {
    let mut sub = client
        .subscribe_shard("t", "ns", stream, 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while out.last().is_none_or(|(o, _)| o + 1 < end) {
        let ev = tokio::time::timeout_at(deadline, sub.next_event())
            .await
            .unwrap_or_else(|_| panic!("{stream}: read {} records, not up to {end}", out.len()));
        match ev {
            Ok(Some(e)) => out.push((e.offset, String::from_utf8_lossy(&e.payload).into_owned())),
            Ok(None) => panic!("{stream}: the subscription ended at {} records", out.len()),
            Err(e) => panic!(
                "{stream}: subscription failed after {} records: {e}",
                out.len()
            ),
        }
    }
    out
}

/// What the publishers saw.
#[derive(Default)]
struct Ledger {
    /// id → acknowledged offset.
    acked: BTreeMap<String, u64>,
    /// ids whose outcome is unknown (timeout, lost connection, quorum_timeout, refusal).
    uncertain: HashSet<String>,
}

/// One publisher: ids `{name}-{i}`, one record per publish, until told to stop. `publish`
/// answers the acknowledged offset, or `None` when the outcome is unknown.
fn spawn_publisher<F, Fut>(
    name: String,
    ledger: &Arc<Mutex<Ledger>>,
    stop: &tokio::sync::watch::Receiver<bool>,
    publish: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(String) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<u64>> + Send,
{
    let (ledger, stop) = (ledger.clone(), stop.clone());
    tokio::spawn(async move {
        for i in 0.. {
            if *stop.borrow() {
                return;
            }
            let id = format!("{name}-{i}");
            let acked = publish(id.clone()).await;
            let mut l = ledger.lock().await;
            match acked {
                Some(offset) => {
                    l.acked.insert(id, offset);
                }
                None => {
                    l.uncertain.insert(id);
                    drop(l);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    })
}

/// Three publishers through the cluster client.
fn start_publishers(
    client: &ClusterClient,
    stream: &str,
    ledger: &Arc<Mutex<Ledger>>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..3)
        .map(|p| {
            let (client, stream) = (client.clone(), stream.to_owned());
            spawn_publisher(format!("p{p}"), ledger, stop, move |id| {
                let (client, stream) = (client.clone(), stream.clone());
                async move {
                    client
                        .publish_to_shard("t", "ns", &stream, 0, &[Message::new(id)])
                        .await
                        .ok()
                        .map(|p| p.base_offset)
                }
            })
        })
        .collect()
}

/// Cuts a broker off the internal network (`true`) or heals the cut (fault injection).
pub(super) async fn set_isolated(broker: &Broker, isolated: bool) {
    let method = if isolated { "POST" } else { "DELETE" };
    let (status, body) = http_request(broker.admin_addr, method, "/v1/faults/isolate")
        .await
        .expect("the fault-injection route");
    assert_eq!(status, 200, "{method} /v1/faults/isolate: {body}");
}

async fn wait_acked(ledger: &Arc<Mutex<Ledger>>, at_least: usize, what: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while ledger.lock().await.acked.len() < at_least {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: fewer than {at_least} acknowledged publishes within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks the promise: every acknowledged id at its offset, no id twice, nothing unknown.
fn audit(records: &[(u64, String)], ledger: &Ledger, what: &str) {
    let mut seen: HashMap<&str, u64> = HashMap::new();
    for (i, (offset, id)) in records.iter().enumerate() {
        assert_eq!(*offset, i as u64, "{what}: offsets must be dense from 0");
        if let Some(first) = seen.insert(id, *offset) {
            panic!("{what}: {id} stored twice, at {first} and {offset}");
        }
        assert!(
            ledger.acked.contains_key(id.as_str()) || ledger.uncertain.contains(id.as_str()),
            "{what}: offset {offset} holds {id}, which nobody sent"
        );
    }
    for (id, offset) in &ledger.acked {
        let at = records.get(*offset as usize).map(|(_, id)| id.as_str());
        assert_eq!(
            at,
            Some(id.as_str()),
            "{what}: acknowledged {id} at offset {offset} is not there"
        );
    }
}

/// The fault the audit puts to the cluster while the publishers run.
#[derive(Clone, Copy, Debug)]
enum Fault {
    KillLeader,
    KillFollower,
    KillTwoInTurn,
    PauseLeader,
}

async fn acked_write_audit(fault: Fault) {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    let stream = "audit";
    create_stream(&client, stream, "quorum", StreamConfig::default()).await;
    let leader = cluster.leader(&client, stream, None).await;

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let publishers = start_publishers(&client, stream, &ledger, &stop);
    wait_acked(&ledger, 150, "before the fault").await;

    let follower = (1..=3).find(|b| *b != leader).expect("a follower");
    let survivor;
    match fault {
        Fault::KillLeader => {
            cluster.node(leader).kill();
            survivor = cluster.leader(&client, stream, Some(leader)).await;
        }
        Fault::KillFollower => {
            cluster.node(follower).kill();
            survivor = leader;
        }
        Fault::KillTwoInTurn => {
            cluster.node(leader).kill();
            let second = cluster.leader(&client, stream, Some(leader)).await;
            let n = ledger.lock().await.acked.len();
            wait_acked(&ledger, n + 100, "after the first failover").await;
            cluster.node(leader).restart().await;
            // Give the returning broker time to catch up, then take the new leader away.
            tokio::time::sleep(Duration::from_secs(3)).await;
            cluster.node(second).kill();
            survivor = cluster.leader(&client, stream, Some(second)).await;
        }
        Fault::PauseLeader => {
            cluster.node(leader).pause(true);
            survivor = cluster.leader(&client, stream, Some(leader)).await;
            cluster.node(leader).pause(false);
        }
    }
    let n = ledger.lock().await.acked.len();
    wait_acked(&ledger, n + 150, "after the fault").await;
    stop_tx.send(true).expect("stop publishers");
    for p in publishers {
        p.await.expect("publisher task");
    }
    let ledger = ledger.lock().await;
    let end = ledger.acked.values().max().copied().unwrap_or(0) + 1;
    let records = read_all(&client, stream, end).await;
    audit(
        &records,
        &ledger,
        &format!("{fault:?}, read on broker {survivor}"),
    );
    eprintln!(
        "{fault:?}: {} acknowledged, {} unknown outcomes, {} records read",
        ledger.acked.len(),
        ledger.uncertain.len(),
        records.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_acks_survive_killing_the_leader() {
    acked_write_audit(Fault::KillLeader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_acks_survive_killing_a_follower() {
    acked_write_audit(Fault::KillFollower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_acks_survive_two_brokers_killed_in_turn() {
    acked_write_audit(Fault::KillTwoInTurn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_acks_survive_a_leader_paused_past_its_lease() {
    acked_write_audit(Fault::PauseLeader).await;
}

/// Publishes `n` records `prefix-i`, one acknowledged batch of one record each, through an
/// idempotent producer: a publish whose outcome was unknown (sent to a broker just killed)
/// is re-sent under its sequence and still lands once.
async fn publish_n(client: &ClusterClient, stream: &str, prefix: &str, n: usize) {
    let producer = client.idempotent_producer().await.expect("producer id");
    for i in 0..n {
        producer
            .publish_to_shard(
                "t",
                "ns",
                stream,
                0,
                &[Message::new(format!("{prefix}-{i}"))],
            )
            .await
            .unwrap_or_else(|e| panic!("{stream}: publish {prefix}-{i}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_fault_on_a_leader_and_a_quorum_stream() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    create_stream(&client, "leader-stream", "leader", StreamConfig::default()).await;
    let x = cluster.leader(&client, "leader-stream", None).await;
    // A Quorum stream led by the same broker, so one kill hits both.
    let mut quorum = None;
    for i in 0..20 {
        let name = format!("quorum-stream-{i}");
        create_stream(&client, &name, "quorum", StreamConfig::default()).await;
        if cluster.leader(&client, &name, None).await == x {
            quorum = Some(name);
            break;
        }
    }
    let quorum = quorum.expect("a quorum stream placed on the same leader");
    publish_n(&client, "leader-stream", "l", 100).await;
    publish_n(&client, &quorum, "q", 100).await;

    cluster.node(x).kill();

    // Quorum: a replica holding everything acknowledged takes over, and nothing is lost.
    publish_n(&client, &quorum, "q-after", 10).await;
    let q = read_all(&client, &quorum, 110).await;
    let expected: Vec<String> = (0..100)
        .map(|i| format!("q-{i}"))
        .chain((0..10).map(|i| format!("q-after-{i}")))
        .collect();
    assert_eq!(
        q.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>(),
        expected
    );
    let new_leader = cluster.leader(&client, &quorum, Some(x)).await;
    assert_ne!(new_leader, x);

    // Leader: nobody else may hold the acknowledged records, so it waits for its broker.
    let impatient = cluster.client(Duration::from_secs(3)).await;
    match impatient
        .publish_to_shard("t", "ns", "leader-stream", 0, &[Message::new("l-during")])
        .await
    {
        Err(ClientError::Broker(e)) => assert_eq!(
            e.code,
            codes::SHARD_UNAVAILABLE,
            "a Leader stream without its leader must be unavailable, got {e}"
        ),
        Err(e) => panic!("a Leader stream without its leader: unexpected {e}"),
        Ok(p) => panic!("a Leader stream accepted a write without its leader: {p:?}"),
    }
    let topology = client
        .topology("t", "ns", "leader-stream")
        .await
        .expect("topology");
    assert_eq!(
        topology.shard(0).and_then(|r| r.leader),
        Some(x),
        "a Leader shard was promoted"
    );

    // The old leader returns with its disk: the Leader stream has lost nothing.
    cluster.node(x).restart().await;
    publish_n(&client, "leader-stream", "l-after", 10).await;
    let l = read_all(&client, "leader-stream", 110).await;
    let expected: Vec<String> = (0..100)
        .map(|i| format!("l-{i}"))
        .chain((0..10).map(|i| format!("l-after-{i}")))
        .collect();
    assert_eq!(
        l.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>(),
        expected
    );

    // Unless an operator accepts the loss: `shard move --force`.
    super::broker_ops::a_dead_leaders_shard_is_forced_onto_a_follower(
        &mut cluster,
        &client,
        ("leader-stream", &quorum),
        x,
        expected,
    )
    .await;
}

/// The next offset a broker's own copy of shard 0 holds (its local log), or 0 while it
/// does not answer: a broker just resumed from SIGSTOP on a loaded machine can miss a QUIC
/// handshake's 6 s, and every caller polls this under a deadline anyway.
pub(super) async fn local_next_offset(broker: &Broker, stream: &str) -> u64 {
    let client =
        match Connection::connect(&broker.quic_addr.to_string(), ClientConfig::default()).await {
            Ok(client) => client,
            Err(e) => {
                eprintln!("broker at {} does not answer yet: {e}", broker.quic_addr);
                return 0;
            }
        };
    let info = client
        .describe_stream("t", "ns", stream)
        .await
        .expect("describe on one broker");
    info.shards.first().map_or(0, |s| s.next_offset)
}

/// How a follower is away while the leader moves on.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Away {
    /// SIGKILLed and restarted: its log restarts after the uploaded history.
    Killed,
    /// SIGSTOPped and continued: its log still ends where it stopped, below the leader's
    /// local log, so the leader serves it from the object store.
    Paused,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_that_was_killed_catches_up_from_the_leader() {
    follower_catch_up(Away::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_that_was_paused_catches_up_from_the_object_store() {
    follower_catch_up(Away::Paused).await;
}

async fn follower_catch_up(away: Away) {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    // Small segments, uploaded at once and then dropped from the leader's disk.
    let config = StreamConfig {
        segment_bytes: Some(4096),
        hot_retention_bytes: Some(0),
        ..StreamConfig::default()
    };
    create_stream(&client, "catchup", "quorum", config).await;
    let leader = cluster.leader(&client, "catchup", None).await;
    let follower = (1..=3).find(|b| *b != leader).expect("a follower");
    publish_n(&client, "catchup", "a", 50).await;
    // Both followers hold the first records before one goes away.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while local_next_offset(cluster.node(follower), "catchup").await < 50 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the follower never caught up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    match away {
        Away::Killed => cluster.node(follower).kill(),
        Away::Paused => cluster.node(follower).pause(true),
    }
    publish_n(&client, "catchup", "b", 400).await;

    // The leader moves what it uploaded off its disk while the follower is away.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let info = cluster
            .node(leader)
            .client()
            .await
            .describe_stream("t", "ns", "catchup")
            .await;
        let hot_first = info.expect("describe").shards[0].hot_first_offset;
        if hot_first > 50 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader kept its early segments"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    match away {
        Away::Killed => cluster.node(follower).restart().await,
        Away::Paused => cluster.node(follower).pause(false),
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while local_next_offset(cluster.node(follower), "catchup").await < 450 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the returning follower did not catch up within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Its own copy holds the same records from where it starts; what lies below is in the
    // object store (a replica keeps locally only what is not uploaded yet).
    cluster.node(follower).kill();
    let dir = cluster
        .node(follower)
        .data_dir()
        .join("streams/t/ns/catchup/0");
    let log = felix_hot::ShardLog::open(&dir, felix_hot::LogConfig::default())
        .expect("open the follower's log");
    let first = log.first_offset();
    // The leader's view of the manifest (a follower refreshes its copy only now and then).
    let segments = cluster
        .node(leader)
        .client()
        .await
        .list_segments("t", "ns", "catchup")
        .await
        .expect("segments");
    let uploaded_end = segments
        .iter()
        .filter(|s| s.tier == "cold")
        .map(|s| s.last_offset + 1)
        .max()
        .unwrap_or(0);
    assert!(
        first <= uploaded_end,
        "the follower's copy starts at {first}, but objects cover only [0, {uploaded_end})"
    );
    // A paused follower's log ended at 50, below the leader's local log: it reached 450 by
    // appending [50, 450) in order, the start of which only the object store still held.
    // (Its own hot retention may since have dropped what is uploaded.)
    let mut payloads = Vec::new();
    let mut from = first;
    while from < log.committed_offset() {
        let read = log
            .read(from, 1 << 20, None)
            .expect("read the follower's log");
        let bytes = bytes::Bytes::from(read.batches);
        for item in felix_wire::BatchIter::new(&bytes, usize::MAX) {
            let (_, batch) = item.expect("a whole batch");
            let decoded = felix_wire::DecodedBatch::decode(batch, 1 << 24).expect("decode");
            for r in decoded.records {
                assert_eq!(
                    r.offset as u64,
                    first + payloads.len() as u64,
                    "offsets are dense"
                );
                payloads.push(String::from_utf8_lossy(&r.value.unwrap_or_default()).into_owned());
            }
        }
        from = read.next_offset;
    }
    let expected: Vec<String> = (0..50)
        .map(|i| format!("a-{i}"))
        .chain((0..400).map(|i| format!("b-{i}")))
        .skip(first as usize)
        .collect();
    assert_eq!(
        payloads.len(),
        expected.len(),
        "the follower holds [{first}, 450)"
    );
    assert_eq!(payloads, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_cut_off_the_network_acknowledges_nothing_its_successor_does_not_keep() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    let stream = "cut";
    create_stream(&client, stream, "quorum", StreamConfig::default()).await;
    let x = cluster.leader(&client, stream, None).await;
    let other = (1..=3).find(|b| *b != x).expect("another broker");

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut tasks = start_publishers(&client, stream, &ledger, &stop);
    // One more publisher talks to the old leader only, whatever happens: anything it is
    // told was stored must still be there at that offset at the end.
    let direct = cluster.node(x).client().await;
    tasks.push(spawn_publisher(
        "direct".into(),
        &ledger,
        &stop,
        move |id| {
            let direct = direct.clone();
            async move {
                let batch = vec![Message::new(id)];
                let published = direct
                    .publish_batch("t", "ns", stream, batch, felix_client::AckMode::Batch)
                    .await;
                published.ok()?.first().map(|p| p.base_offset)
            }
        },
    ));
    wait_acked(&ledger, 150, "before the cut").await;

    set_isolated(cluster.node(x), true).await;
    // The rest of the cluster moves the shard; ask a broker on that side.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let new_leader = loop {
        let t = cluster
            .node(other)
            .client()
            .await
            .topology("t", "ns", stream)
            .await;
        if let Some(l) = t.ok().and_then(|t| t.shard(0).and_then(|r| r.leader))
            && l != x
        {
            break l;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no failover away from the cut leader"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let n = ledger.lock().await.acked.len();
    wait_acked(&ledger, n + 150, "after the cut").await;

    set_isolated(cluster.node(x), false).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_tx.send(true).expect("stop publishers");
    for t in tasks {
        t.await.expect("publisher task");
    }
    let ledger = ledger.lock().await;
    let end = ledger.acked.values().max().copied().unwrap_or(0) + 1;
    let records = read_all(&client, stream, end).await;
    audit(
        &records,
        &ledger,
        &format!("cut leader {x}, new leader {new_leader}"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_forwards_publishes_for_shards_it_does_not_lead() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    create_stream(&client, "fwd", "quorum", StreamConfig::default()).await;
    let leader = cluster.leader(&client, "fwd", None).await;
    let follower = (1..=3).find(|b| *b != leader).expect("a follower");
    // A plain client that knows only the follower.
    let plain = cluster.node(follower).client().await;
    for i in 0..20 {
        let published = plain
            .publish_batch(
                "t",
                "ns",
                "fwd",
                vec![Message::new(format!("f-{i}"))],
                felix_client::AckMode::Batch,
            )
            .await
            .expect("a publish through a follower");
        assert_eq!(
            published[0].base_offset, i,
            "forwarded publishes get the leader's offsets"
        );
    }
    let metrics = cluster.node(follower).metrics().await;
    let forwarded = super::common::metric_lines(&metrics, "felix_publishes_forwarded_total");
    assert_eq!(
        forwarded.first().map(|l| super::common::metric_value(l)),
        Some(20.0),
        "{forwarded:?}"
    );
    let records = read_all(&client, "fwd", 20).await;
    let payloads: Vec<String> = records.into_iter().map(|(_, p)| p).collect();
    assert_eq!(
        payloads,
        (0..20).map(|i| format!("f-{i}")).collect::<Vec<_>>()
    );

    // felixctl pointed at the follower: its publish is forwarded, its subscription follows
    // the broker's hint to the leader.
    let node = cluster.node(follower);
    super::felixctl::run(node, &["publish", "t/ns/fwd"], b"from-felixctl\n").await;
    let out = super::felixctl::run(
        node,
        &[
            "subscribe",
            "t/ns/fwd",
            "--from",
            "earliest",
            "--count",
            "21",
        ],
        b"",
    )
    .await;
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 21, "{}\n{}", out.stdout, out.stderr);
    assert!(lines[20].contains("from-felixctl"), "{}", lines[20]);

    refusals_keep_their_type_through_every_broker(&mut cluster).await;
    a_recreated_quorum_stream_takes_publishes_at_once(&client).await;
    // Last: it kills and restarts a broker.
    super::repair::a_damaged_segment_is_rewritten_from_another_replica(&mut cluster, &client).await;
}

/// Deleted and created again under the same name, a 3-replica Quorum stream is a new,
/// empty stream on every replica: the followers act on the delete too, so the new leader's
/// publishes reach a quorum at once (they used to time out until a failover, the followers
/// still holding the old log) and nothing of the old stream is served.
async fn a_recreated_quorum_stream_takes_publishes_at_once(client: &ClusterClient) {
    client
        .delete_stream("t", "ns", "fwd")
        .await
        .expect("delete stream");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        // The name stays reserved until the old objects are gone.
        let created = client
            .create_stream(
                "t",
                "ns",
                "fwd",
                StreamConfig {
                    durable: Some(true),
                    shards: Some(1),
                    replicas: Some(3),
                    consistency: Some("quorum".into()),
                    ..Default::default()
                },
            )
            .await;
        match created {
            Ok(_) => break,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("create again: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("create the stream again: {e}"),
        }
    }
    // `quorum_timeout` is returned at once (its outcome is unknown), so a stuck quorum
    // fails here rather than being retried into success.
    for i in 0..5u64 {
        let published = client
            .publish(
                "t",
                "ns",
                "fwd",
                Message::new(format!("new-{i}")),
                felix_client::AckMode::Batch,
            )
            .await
            .unwrap_or_else(|e| panic!("publish {i} to the re-created stream: {e}"))
            .expect("acknowledged");
        assert_eq!(published.base_offset, i, "the new stream starts at 0");
    }
    let payloads: Vec<String> = read_all(client, "fwd", 5)
        .await
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        payloads,
        (0..5).map(|i| format!("new-{i}")).collect::<Vec<_>>()
    );
}

/// A command the control plane refuses gets the same typed error through any broker: two
/// of the three are not the Raft leader and relay its answer (a refusal that could not cross
/// that hop used to come back as a retryable `metadata_unavailable`).
async fn refusals_keep_their_type_through_every_broker(cluster: &mut Cluster) {
    for id in 1..=3 {
        let client = cluster.node(id).client().await;
        let refused = |r: Result<(), ClientError>, code: u16, what: &str| match r {
            Err(ClientError::Broker(e)) => {
                assert_eq!(e.code, code, "broker {id}, {what}: {e:?}");
                assert!(e.retry_after_ms.is_none(), "broker {id}, {what}: {e:?}");
            }
            other => panic!("broker {id}, {what}: expected code {code}, got {other:?}"),
        };
        let stream = |shards| StreamConfig {
            durable: Some(true),
            shards: Some(shards),
            ..Default::default()
        };
        let bad_name = client
            .create_stream("t", "ns", "bad%name", stream(1))
            .await
            .map(|_| ());
        refused(bad_name, codes::INVALID_ARGUMENT, "a hostile name");
        let no_shards = client
            .create_stream("t", "ns", &format!("zero-{id}"), stream(0))
            .await
            .map(|_| ());
        refused(no_shards, codes::INVALID_ARGUMENT, "zero shards");
        let again = client
            .create_stream("t", "ns", "fwd", stream(1))
            .await
            .map(|_| ());
        refused(again, codes::ALREADY_EXISTS, "an existing stream");
        refused(
            client.create_tenant("t").await,
            codes::ALREADY_EXISTS,
            "an existing tenant",
        );
        refused(
            client.create_namespace("nobody", "ns").await,
            codes::UNKNOWN_TENANT,
            "a namespace of an unknown tenant",
        );
    }
}

/// What a reader sees of a Quorum stream: only what a majority holds. With both followers
/// cut off, a record the leader wrote is neither acknowledged nor delivered to a subscriber;
/// once the cut heals it is delivered once or (if a follower took over) not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quorum_subscriber_sees_nothing_a_majority_does_not_hold() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    create_stream(&client, "gated", "quorum", StreamConfig::default()).await;
    let leader = cluster.leader(&client, "gated", None).await;
    publish_n(&client, "gated", "before", 10).await;
    let mut sub = client
        .subscribe_shard("t", "ns", "gated", 0, StartAt::Earliest)
        .await
        .expect("subscribe");
    for i in 0..10u64 {
        let e = tokio::time::timeout(PATIENCE, sub.next_event())
            .await
            .expect("a record in time")
            .expect("subscription")
            .expect("not ended");
        assert_eq!(e.offset, i);
    }

    let followers: Vec<u64> = (1..=3).filter(|b| *b != leader).collect();
    for f in &followers {
        set_isolated(cluster.node(*f), true).await;
    }
    // Straight to the leader: its write lands there, but no majority can confirm it.
    let direct = cluster.node(leader).client().await;
    let r = direct
        .publish_batch(
            "t",
            "ns",
            "gated",
            vec![Message::new("during")],
            felix_client::AckMode::Batch,
        )
        .await;
    assert!(
        r.is_err(),
        "a Quorum publish without a majority was acknowledged: {r:?}"
    );
    // Meanwhile the subscriber got nothing past what was acknowledged.
    match tokio::time::timeout(Duration::from_secs(2), sub.next_event()).await {
        Err(_) => {}
        Ok(Ok(Some(e))) => panic!(
            "a subscriber saw offset {} ({:?}) that no majority held",
            e.offset, e.payload
        ),
        Ok(other) => panic!("the subscription ended: {other:?}"),
    }

    for f in &followers {
        set_isolated(cluster.node(*f), false).await;
    }
    // After the cut, new records flow again; "during" is there at most once, before them.
    publish_n(&client, "gated", "after", 5).await;
    let mut rest = Vec::new();
    while rest.last().is_none_or(|p: &String| p != "after-4") {
        let e = tokio::time::timeout(PATIENCE, sub.next_event())
            .await
            .expect("records after the cut")
            .expect("subscription")
            .expect("not ended");
        rest.push(String::from_utf8_lossy(&e.payload).into_owned());
    }
    let afters: Vec<String> = (0..5).map(|i| format!("after-{i}")).collect();
    let during: Vec<&String> = rest.iter().filter(|p| *p == "during").collect();
    assert!(during.len() <= 1, "{rest:?}");
    let without: Vec<String> = rest.iter().filter(|p| *p != "during").cloned().collect();
    assert_eq!(without, afters, "after the cut: {rest:?}");
}
