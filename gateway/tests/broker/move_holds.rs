//! What a publish or a cache operation held across a shard's hand-over is answered, on
//! three real `felix` processes (issue 25's duplicate, issue 24's cache during a move):
//!
//! 1. A Leader-stream publish written by its leader, whose lease then lapses before the
//!    answer (fault injection holds the answer after the write; the leader is cut off
//!    until its lease lapses): the answer is `leadership_lost` (outcome unknown), never a
//!    retryable refusal that the cluster client would re-send — which stored the record
//!    twice (moving-l-p2-727 in the moves test).
//! 2. A Leader stream's shard moved back and forth under publish load, its destination
//!    SIGKILLed mid-move once and its source once: every acknowledged record at its
//!    offset, and no record stored twice.
//!
//! One cluster for all steps: CI time goes to brokers starting, not to the checks.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use felix_client::{ClusterClient, Connection, Message, StreamConfig};
use felix_wire::protocol::codes;
use tokio::sync::Mutex;

use super::cluster::{Cluster, read_all, set_isolated};
use super::common::{Broker, PATIENCE, http_request};

/// The brokers' lease: the lease-lapse step waits two of them.
const LEASE_MS: u64 = 1500;

/// Creates a durable one-shard stream of `replicas` replicas (tenant `t`, namespace `ns`).
async fn create(client: &ClusterClient, name: &str, consistency: &str, replicas: u32) {
    let _ = client.create_tenant("t").await;
    let _ = client.create_namespace("t", "ns").await;
    client
        .create_stream(
            "t",
            "ns",
            name,
            StreamConfig {
                durable: Some(true),
                shards: Some(1),
                replicas: Some(replicas),
                consistency: Some(consistency.into()),
                ..StreamConfig::default()
            },
        )
        .await
        .expect("create stream");
}

/// Holds (`true`) or releases a broker's answers to publishes after their write.
async fn hold_answers(broker: &Broker, held: bool) {
    let method = if held { "POST" } else { "DELETE" };
    let (status, body) = http_request(broker.admin_addr, method, "/v1/faults/hold_answers")
        .await
        .expect("the fault-injection route");
    assert_eq!(status, 200, "{method} /v1/faults/hold_answers: {body}");
}

/// The route of shard 0 of `stream`: (brokers outside its replica set, its leader).
async fn placement(client: &ClusterClient, stream: &str) -> (Vec<u64>, Option<u64>) {
    let t = client.topology("t", "ns", stream).await.expect("topology");
    let route = t.shard(0).expect("shard 0").clone();
    let outside = t
        .brokers
        .iter()
        .map(|b| b.id)
        .filter(|b| !route.replicas.contains(b))
        .collect();
    (outside, route.leader)
}

/// Waits until no move is under way (done or rolled back).
async fn moves_settle(conn: &Connection, what: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Ok(moves) = conn.list_moves().await
            && moves.is_empty()
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: moves still under way after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the publishers of one stream saw: id → acknowledged offset, and the ids whose
/// publish failed (with why).
#[derive(Default)]
struct Ledger {
    acked: BTreeMap<String, u64>,
    failed: HashMap<String, String>,
}

/// Publishers writing to one stream through the cluster client until stopped.
struct Publishers {
    ledger: Arc<Mutex<Ledger>>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Publishers {
    fn start(client: &ClusterClient, stream: &'static str, n: usize) -> Publishers {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let tasks = (0..n)
            .map(|p| {
                let (client, ledger, stop) = (client.clone(), ledger.clone(), stop_rx.clone());
                tokio::spawn(async move {
                    for i in 0.. {
                        if *stop.borrow() {
                            return;
                        }
                        let id = format!("{stream}-p{p}-{i}");
                        let r = client
                            .publish_to_shard("t", "ns", stream, 0, &[Message::new(id.clone())])
                            .await;
                        let mut l = ledger.lock().await;
                        match r {
                            Ok(p) => {
                                l.acked.insert(id, p.base_offset);
                            }
                            Err(e) => {
                                l.failed.insert(id, e.to_string());
                            }
                        }
                        drop(l);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
            })
            .collect();
        Publishers {
            ledger,
            stop,
            tasks,
        }
    }

    /// Waits until `n` more publishes were acknowledged.
    async fn progress(&self, n: usize, what: &str) {
        let target = self.ledger.lock().await.acked.len() + n;
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while self.ledger.lock().await.acked.len() < target {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: no progress within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn finish(self) -> Ledger {
        self.stop.send(true).expect("stop");
        for t in self.tasks {
            t.await.expect("publisher task");
        }
        Arc::try_unwrap(self.ledger)
            .ok()
            .expect("the only ledger")
            .into_inner()
    }
}

/// Every acknowledged record at its offset, none stored twice, nothing nobody sent.
async fn audit(client: &ClusterClient, stream: &str, ledger: &Ledger) {
    let end = ledger.acked.values().max().copied().unwrap_or(0) + 1;
    let records = read_all(client, stream, end).await;
    let mut at: HashMap<&str, u64> = HashMap::new();
    for (offset, id) in &records {
        if let Some(first) = at.insert(id, *offset) {
            panic!("{stream}: {id} stored twice, at {first} and at {offset}");
        }
        assert!(
            ledger.acked.contains_key(id) || ledger.failed.contains_key(id),
            "{stream}: offset {offset} holds {id}, which nobody sent"
        );
    }
    for (id, offset) in &ledger.acked {
        assert_eq!(
            at.get(id.as_str()),
            Some(offset),
            "{stream}: acknowledged {id} is not at {offset}"
        );
    }
    eprintln!(
        "{stream}: {} acknowledged, {} failed, {} read, none twice",
        ledger.acked.len(),
        ledger.failed.len(),
        records.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_publishes_are_decided_once_across_moves_and_lapses() {
    let mut cluster = Cluster::start_with(3, LEASE_MS, &[]).await;
    let client = cluster.client(Duration::from_secs(20)).await;

    // 1. A write whose leader's lease lapses before its answer.
    let lapse = "holds-lapse";
    create(&client, lapse, "leader", 2).await;
    let x = cluster.leader(&client, lapse, None).await;
    hold_answers(cluster.node(x), true).await;
    let publish = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .publish_to_shard("t", "ns", lapse, 0, &[Message::new("once")])
                .await
        })
    };
    // Written (a subscriber sees it) while its answer is held.
    let written = read_all(&client, lapse, 1).await;
    assert_eq!(written, vec![(0, "once".to_owned())]);
    set_isolated(cluster.node(x), true).await;
    // Two leases: it lapsed on broker x, whatever the last renewal was.
    tokio::time::sleep(Duration::from_millis(2 * LEASE_MS)).await;
    hold_answers(cluster.node(x), false).await;
    // Give a client that took the answer for a refusal time to re-send, then heal: its
    // re-send would land once the lease is back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    set_isolated(cluster.node(x), false).await;
    let answer = publish.await.expect("the publish task");
    match &answer {
        Err(felix_client::ClientError::Broker(e)) => {
            assert_eq!(e.code, codes::LEADERSHIP_LOST, "{e}");
            assert_eq!(e.reason, "leadership_lost", "{e}");
        }
        other => panic!("a write answered past a lapsed lease: {other:?}"),
    }
    assert!(
        answer.as_ref().err().is_some_and(|e| e.outcome_unknown()),
        "leadership_lost is an unknown outcome"
    );
    let after = client
        .publish_to_shard("t", "ns", lapse, 0, &[Message::new("after")])
        .await
        .expect("a publish once the lease is back");
    let records = read_all(&client, lapse, after.base_offset + 1).await;
    let once = records.iter().filter(|(_, id)| id == "once").count();
    assert_eq!(once, 1, "stored once, not re-sent: {records:?}");
    assert_eq!(
        after.base_offset, 1,
        "nothing else was written: {records:?}"
    );

    // 2. A Leader stream moved back and forth under load, with kills mid-move.
    let moving = "holds-moving";
    create(&client, moving, "leader", 2).await;
    cluster.leader(&client, moving, None).await;
    let load = Publishers::start(&client, moving, 3);
    load.progress(50, "before the moves").await;
    for round in 0..4 {
        let (outside, leader) = placement(&client, moving).await;
        let (to, leader) = (outside[0], leader.expect("a leader"));
        // Asked of the third broker, which neither kill touches.
        let third = (1..=3).find(|b| *b != to && *b != leader).expect("a third");
        let conn = cluster.node(third).client().await;
        conn.move_shard("t", "ns", moving, 0, to, None)
            .await
            .expect("start a move");
        // Round 1 kills the destination, round 3 the source, mid-move; each comes back
        // after two leases (a Leader stream waits for its leader, so the move may only end
        // once it is back: rolled back, or finished).
        let victim = match round {
            1 => Some(to),
            3 => Some(leader),
            _ => None,
        };
        if let Some(v) = victim {
            cluster.node(v).kill();
            tokio::time::sleep(Duration::from_millis(2 * LEASE_MS)).await;
            cluster.node(v).restart().await;
        }
        moves_settle(&conn, "a move").await;
        load.progress(30, "after a move").await;
    }
    let ledger = load.finish().await;
    audit(&client, moving, &ledger).await;
}
