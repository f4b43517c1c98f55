//! Shard moves on four real `felix` processes (the "Must hold"), one cluster running
//! the scenarios in sequence while three publishers write to a Quorum and a Leader stream
//! through the cluster client and a subscriber reads each:
//!
//! 1. `felixctl shard move` moves each stream's leadership to a broker outside its replica
//!    set; then `felixctl broker drain` empties the broker that leads the Quorum stream.
//!    No publish may fail meanwhile (hand-overs are held, not refused), and the drained
//!    broker ends holding no replica.
//! 2. A move whose destination is SIGKILLed mid-way is rolled back (or completes).
//! 3. A move whose source (the leader) is SIGKILLed mid-way completes on the promoted
//!    replica.
//!
//! Afterwards every acknowledged record is read back at its offset, none twice, and each
//! subscriber saw every offset exactly once.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use felix_client::{ClusterClient, Connection, Message, StartAt, StreamConfig};
use tokio::sync::Mutex;

use super::cluster::{Cluster, create_stream, read_all};
use super::common::PATIENCE;
use super::felixctl::run;

const QUORUM: &str = "moving-q";
const LEADER: &str = "moving-l";

/// What the publishers of one stream saw.
#[derive(Default)]
struct Ledger {
    acked: BTreeMap<String, u64>,
    /// Publishes that failed: with the fault each names (`planned` or `kill`).
    failed: Vec<(String, String)>,
}

impl Ledger {
    fn uncertain(&self) -> HashSet<&str> {
        self.failed.iter().map(|(id, _)| id.as_str()).collect()
    }
}

/// What a subscriber received: (offset, payload) in order.
type Received = Arc<Mutex<Vec<(u64, String)>>>;

struct Load {
    ledgers: BTreeMap<&'static str, Arc<Mutex<Ledger>>>,
    seen: BTreeMap<&'static str, Received>,
    /// Set while a broker is killed on purpose: failures then are expected.
    killing: Arc<AtomicBool>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    async fn start(client: &ClusterClient) -> Load {
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let killing = Arc::new(AtomicBool::new(false));
        let mut load = Load {
            ledgers: BTreeMap::new(),
            seen: BTreeMap::new(),
            killing: killing.clone(),
            stop,
            tasks: Vec::new(),
        };
        for stream in [QUORUM, LEADER] {
            let ledger = Arc::new(Mutex::new(Ledger::default()));
            load.ledgers.insert(stream, ledger.clone());
            let seen = Arc::new(Mutex::new(Vec::new()));
            load.seen.insert(stream, seen.clone());
            let mut sub = client
                .subscribe_shard("t", "ns", stream, 0, StartAt::Earliest)
                .await
                .expect("subscribe");
            let mut stop = stop_rx.clone();
            load.tasks.push(tokio::spawn(async move {
                loop {
                    let ev = tokio::select! {
                        ev = sub.next_event() => ev,
                        _ = stop.wait_for(|s| *s) => return,
                    };
                    match ev {
                        Ok(Some(e)) => seen
                            .lock()
                            .await
                            .push((e.offset, String::from_utf8_lossy(&e.payload).into_owned())),
                        other => panic!("{stream}: the subscription ended: {other:?}"),
                    }
                }
            }));
        }
        for p in 0..3 {
            let (client, stop, killing) = (client.clone(), stop_rx.clone(), killing.clone());
            let ledgers = load.ledgers.clone();
            load.tasks.push(tokio::spawn(async move {
                for i in 0.. {
                    if *stop.borrow() {
                        return;
                    }
                    for (stream, ledger) in &ledgers {
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
                                let why = if killing.load(Ordering::Acquire) {
                                    "kill"
                                } else {
                                    "planned"
                                };
                                l.failed.push((id, format!("{why}: {e}")));
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }));
        }
        load
    }

    async fn acked(&self, stream: &str) -> usize {
        self.ledgers[stream].lock().await.acked.len()
    }

    /// Waits until `n` more publishes of each stream were acknowledged.
    async fn progress(&self, n: usize, what: &str) {
        for stream in [QUORUM, LEADER] {
            let target = self.acked(stream).await + n;
            let deadline = tokio::time::Instant::now() + PATIENCE;
            while self.acked(stream).await < target {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: {stream} made no progress"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    async fn planned_failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (stream, l) in &self.ledgers {
            for (id, why) in &l.lock().await.failed {
                if why.starts_with("planned") {
                    out.push(format!("{stream} {id}: {why}"));
                }
            }
        }
        out
    }
}

/// The brokers that hold no replica of `stream`'s shard 0, and its leader.
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
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shard_moves_and_drains_hold_publishes_and_lose_nothing() {
    let mut cluster = Cluster::start(4).await;
    let client = cluster.client(Duration::from_secs(30)).await;
    create_stream(&client, QUORUM, "quorum", StreamConfig::default()).await;
    create_stream(&client, LEADER, "leader", StreamConfig::default()).await;
    for s in [QUORUM, LEADER] {
        cluster.leader(&client, s, None).await;
    }
    let load = Load::start(&client).await;
    load.progress(100, "before any move").await;

    // 1a. Each stream's leadership moves to the broker outside its replica set.
    for stream in [QUORUM, LEADER] {
        let (outside, leader) = placement(&client, stream).await;
        let to = outside[0];
        let path = format!("t/ns/{stream}");
        let to_arg = to.to_string();
        let out = run(
            &cluster.brokers[0],
            &["shard", "move", &path, "0", "--to", &to_arg],
            b"",
        )
        .await;
        assert!(out.stdout.contains("done"), "{}", out.stdout);
        let (_, now) = placement(&client, stream).await;
        assert_eq!(
            now,
            Some(to),
            "{stream}: led by {to} after the move (was {leader:?})"
        );
        load.progress(50, "after a move").await;
    }

    // 1b. Drain the broker now leading the Quorum stream.
    let (_, drained) = placement(&client, QUORUM).await;
    let drained = drained.expect("a leader");
    let id = drained.to_string();
    let out = run(&cluster.brokers[0], &["broker", "drain", &id], b"").await;
    assert!(out.stdout.contains("done"), "{}", out.stdout);
    let list = run(
        &cluster.brokers[0],
        &["broker", "list", "--output", "json"],
        b"",
    )
    .await;
    let brokers: Vec<serde_json::Value> = serde_json::from_str(&list.stdout).expect("json");
    let entry = brokers
        .iter()
        .find(|b| b["id"] == drained)
        .expect("the drained broker is listed");
    assert_eq!(
        entry["replicas"], 0,
        "the drained broker holds no replica: {entry}"
    );
    assert_eq!(entry["draining"], true);
    load.progress(50, "after the drain").await;
    let refused = load.planned_failures().await;
    assert!(
        refused.is_empty(),
        "planned moves refused or failed publishes: {refused:?}"
    );

    // 2. The destination dies mid-move: rolled back (or done), nothing lost.
    run(&cluster.brokers[0], &["broker", "undrain", &id], b"").await;
    let (outside, _) = placement(&client, QUORUM).await;
    let dest = outside[0];
    let conn = cluster.node(if dest == 1 { 2 } else { 1 }).client().await;
    load.killing.store(true, Ordering::Release);
    conn.move_shard("t", "ns", QUORUM, 0, dest, None)
        .await
        .expect("start a move");
    cluster.node(dest).kill();
    moves_settle(&conn, "destination killed").await;
    cluster.node(dest).restart().await;
    load.progress(50, "after the destination died").await;

    // 3. The source (the leader) dies mid-move: the promoted replica completes it.
    let (outside, source) = placement(&client, QUORUM).await;
    let source = source.expect("a leader");
    let conn = cluster.node(if source == 1 { 2 } else { 1 }).client().await;
    conn.move_shard("t", "ns", QUORUM, 0, outside[0], None)
        .await
        .expect("start a move");
    cluster.node(source).kill();
    moves_settle(&conn, "source killed").await;
    cluster.node(source).restart().await;
    load.killing.store(false, Ordering::Release);
    load.progress(50, "after the source died").await;

    // Stop, then audit every stream: each acknowledged record at its offset, none twice,
    // and the subscriber saw each offset once.
    load.stop.send(true).expect("stop");
    let ledgers = load.ledgers.clone();
    let seen = load.seen.clone();
    for t in load.tasks {
        t.await.expect("load task");
    }
    for stream in [QUORUM, LEADER] {
        let ledger = ledgers[stream].lock().await;
        let end = ledger.acked.values().max().copied().unwrap_or(0) + 1;
        let records = read_all(&client, stream, end).await;
        let uncertain = ledger.uncertain();
        let mut ids = HashSet::new();
        for (i, (offset, id)) in records.iter().enumerate() {
            assert_eq!(*offset, i as u64, "{stream}: offsets dense from 0");
            assert!(ids.insert(id.as_str()), "{stream}: {id} stored twice");
            assert!(
                ledger.acked.contains_key(id) || uncertain.contains(id.as_str()),
                "{stream}: offset {offset} holds {id}, which nobody sent"
            );
        }
        for (id, offset) in &ledger.acked {
            assert_eq!(
                records.get(*offset as usize).map(|(_, r)| r.as_str()),
                Some(id.as_str()),
                "{stream}: acknowledged {id} at {offset} is not there"
            );
        }
        let seen = seen[stream].lock().await;
        for (i, (offset, id)) in seen.iter().enumerate() {
            assert_eq!(
                *offset, i as u64,
                "{stream}: the subscriber saw offsets out of order, repeated or skipped"
            );
            assert_eq!(
                Some(id),
                records.get(i).map(|(_, r)| r),
                "{stream}: at {offset}"
            );
        }
        eprintln!(
            "{stream}: {} acknowledged, {} failed during kills, {} read, subscriber saw {}",
            ledger.acked.len(),
            ledger.failed.len(),
            records.len(),
            seen.len()
        );
    }
}
