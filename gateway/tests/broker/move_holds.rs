//! What a publish or a cache operation held across a shard's hand-over is answered, on
//! three real `felix` processes (issue 25's duplicate, issue 24's cache during a move):
//!
//! 1. A Leader-stream publish written by its leader, whose lease then lapses before the
//!    answer (fault injection holds the answer after the write; the leader is cut off
//!    until its lease lapses): the answer is `leadership_lost` (outcome unknown), never a
//!    retryable refusal that the cluster client would re-send — which stored the record
//!    twice (moving-l-p2-727 in the moves test).
//! 2. A hand-over held with its fence up past `FELIX_SHARD_MOVE_HOLD_MS` (fault injection:
//!    a control plane too slow for the hold): a publish sent to the source then is refused
//!    as `shard_unavailable`/`moving` after the hold, and is not written.
//! 3. A log-backed cache's shard moved twice while two clients `counter_add`, `cache_put`
//!    and `cache_get` through it: nothing refused, every add counted once, each get reads
//!    the put before it; a watch at the old owner ends with `shard_moved` naming the new
//!    owner, and a cluster client's watch follows the shard.
//! 4. A Leader stream's shard moved back and forth under publish load, its destination
//!    SIGKILLed mid-move once and its source once: every acknowledged record at its
//!    offset, and no record stored twice.
//!
//! One cluster for all steps: CI time goes to brokers starting, not to the checks. A step of
//! the moves test (five brokers) lives here too: a publish held by a leader the cluster
//! marked dead ([`held_by_a_leader_marked_dead`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use felix_client::{
    AckMode, CacheConfig, ClusterClient, Connection, Message, StreamConfig, WatchTarget,
};
use felix_wire::protocol::codes;
use tokio::sync::Mutex;

use super::cluster::{Cluster, read_all, set_isolated};
use super::common::{Broker, PATIENCE, http_request, metric_lines, metric_value};
use super::leases::await_lease;

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

/// Holds (`true`) or releases a broker's shard hand-overs with their fence up.
async fn hold_handovers(broker: &Broker, held: bool) {
    let method = if held { "POST" } else { "DELETE" };
    let (status, body) = http_request(broker.admin_addr, method, "/v1/faults/hold_handovers")
        .await
        .expect("the fault-injection route");
    assert_eq!(status, 200, "{method} /v1/faults/hold_handovers: {body}");
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

    // 2. A hand-over that cannot finish within the hold refuses what it held as `moving`.
    moving_past_the_hold(&mut cluster, &client).await;

    // 3. A log-backed cache's shard moved twice while clients put, get and add through it
    //    (before any broker is killed: a killed broker's pooled connection would time out).
    cache_moves(&mut cluster, &client).await;

    // 4. A Leader stream moved back and forth under load, with kills mid-move.
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

/// Step 2: the source's hand-over is held with its fence up (fault injection: a control
/// plane too slow for the hold); a publish sent to it waits the hold (2 s), is refused as
/// `shard_unavailable`/`moving`, and is not in the log; released, the move finishes.
async fn moving_past_the_hold(cluster: &mut Cluster, client: &ClusterClient) {
    let slow = "holds-slow";
    create(client, slow, "leader", 2).await;
    let source = cluster.leader(client, slow, None).await;
    client
        .publish_to_shard("t", "ns", slow, 0, &[Message::new("slow-first")])
        .await
        .expect("a publish before the move");
    hold_handovers(cluster.node(source), true).await;
    let (outside, _) = placement(client, slow).await;
    let to = outside[0];
    let third = (1..=3).find(|b| *b != to && *b != source).expect("a third");
    let conn = cluster.node(third).client().await;
    conn.move_shard("t", "ns", slow, 0, to, None)
        .await
        .expect("start a move");
    // One try at a time, straight to the source (a cluster client would try again): the
    // fence goes up once the destination has caught up.
    let direct = cluster.node(source).client().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut acked = Vec::new();
    let refused = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no publish was refused as moving while the hand-over was held"
        );
        let id = format!("slow-{}", acked.len());
        let sent = std::time::Instant::now();
        match direct
            .publish("t", "ns", slow, Message::new(id.clone()), AckMode::Batch)
            .await
        {
            Ok(_) => acked.push(id),
            Err(felix_client::ClientError::Broker(e)) if e.reason == "moving" => {
                assert_eq!(e.code, codes::SHARD_UNAVAILABLE, "{e}");
                assert!(e.retry_after_ms.is_some(), "retryable: {e}");
                let held = sent.elapsed();
                assert!(
                    held >= Duration::from_millis(1900),
                    "refused after the hold (2 s), not before: {held:?}"
                );
                eprintln!("refused as moving after {held:?} held: {e}");
                break id;
            }
            Err(e) => panic!("{id}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    hold_handovers(cluster.node(source), false).await;
    moves_settle(&conn, "the held hand-over, released").await;
    let (_, now) = placement(client, slow).await;
    assert_eq!(now, Some(to), "the move finished once released");
    let last = client
        .publish_to_shard("t", "ns", slow, 0, &[Message::new("slow-last")])
        .await
        .expect("a publish after the move");
    let records = read_all(client, slow, last.base_offset + 1).await;
    assert!(
        records.iter().all(|(_, id)| *id != refused),
        "{refused} was refused as moving, yet written: {records:?}"
    );
    assert_eq!(
        records.len(),
        acked.len() + 2,
        "every acknowledged publish once, the refused one not at all: {records:?}"
    );
}

/// A step of `broker::moves` (it needs a broker outside a three-replica set): the source
/// of a move holds a publish at its fence (its hand-over held by fault injection) while it
/// is cut off the internal network. Its lease lapses, the control plane marks it dead and
/// fails its Quorum shard over to another replica; it knows nothing of that, keeps its
/// fence up and answers its clients. A cluster client whose routes still name it sends it
/// a publish: the source holds it for the hold and refuses it as `moving` (unwritten), and
/// the client sends it to the new leader, where it lands once. A client that gave the call
/// up as soon as the rest of the cluster named another leader and the source dead failed
/// it as an unknown outcome (issue 25's loaded drain: 4 publishes of about 1,400).
pub(super) async fn held_by_a_leader_marked_dead(cluster: &mut Cluster, client: &ClusterClient) {
    let name = "holds-dead";
    create(client, name, "quorum", 3).await;
    let source = cluster.leader(client, name, None).await;
    // A client whose routes name the source, and keep naming it: it refreshes them only
    // when a publish fails.
    let pinned = cluster.client(Duration::from_secs(20)).await;
    pinned
        .publish_to_shard("t", "ns", name, 0, &[Message::new("dead-first")])
        .await
        .expect("a publish before the move");
    hold_handovers(cluster.node(source), true).await;
    let (outside, _) = placement(client, name).await;
    let to = outside[0];
    let other = (1..=cluster.brokers.len() as u64)
        .find(|b| *b != to && *b != source)
        .expect("another broker");
    let conn = cluster.node(other).client().await;
    conn.move_shard("t", "ns", name, 0, to, None)
        .await
        .expect("start a move");
    // The fence is up once a publish straight to the source is refused as `moving`.
    let direct = cluster.node(source).client().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the source never held a publish at its fence"
        );
        match direct
            .publish("t", "ns", name, Message::new("dead-probe"), AckMode::Batch)
            .await
        {
            Err(felix_client::ClientError::Broker(e)) if e.reason == "moving" => break,
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("a publish before the fence: {e}"),
        }
    }
    set_isolated(cluster.node(source), true).await;
    // Sent just before the source's lease lapses (it cannot renew it now): the source still
    // leads and holds the publish at its fence, for the hold (2 s); meanwhile its lease
    // lapses, the others mark it dead and fail the shard over, which a client checking
    // after a second sees.
    await_lease(cluster.node(source), false, Duration::from_millis(400)).await;
    let sent = std::time::Instant::now();
    let answer = pinned
        .publish_to_shard("t", "ns", name, 0, &[Message::new("dead-held")])
        .await;
    let took = sent.elapsed();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let successor = loop {
        let t = conn.topology("t", "ns", name).await.expect("topology");
        let leader = t.shard(0).and_then(|r| r.leader);
        let dead = !t.broker(source).is_some_and(|b| b.alive);
        if let Some(l) = leader.filter(|l| *l != source && dead) {
            break l;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker {source}, cut off, was not replaced within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "a publish sent to broker {source} (marked dead, replaced by {successor}): {:?} after {took:?}",
        answer.as_ref().map(|p| p.base_offset)
    );
    let published = answer.unwrap_or_else(|e| {
        panic!(
            "a publish held by broker {source}, alive but marked dead and replaced by \
             {successor}, failed: {e}"
        )
    });
    set_isolated(cluster.node(source), false).await;
    hold_handovers(cluster.node(source), false).await;
    moves_settle(&conn, "the move whose source was cut off").await;
    // Healed: the source holds a lease again before the next step counts on it.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !conn
        .topology("t", "ns", name)
        .await
        .expect("topology")
        .broker(source)
        .is_some_and(|b| b.alive)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker {source}, healed, was not marked alive within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let records = read_all(client, name, published.base_offset + 1).await;
    let at: Vec<u64> = records
        .iter()
        .filter(|(_, id)| id == "dead-held")
        .map(|(o, _)| *o)
        .collect();
    assert_eq!(
        at,
        vec![published.base_offset],
        "stored once, at its acknowledged offset: {records:?}"
    );
}

/// Step 4: nothing refused, every counter add counted once, each get sees the put before
/// it; a watch at the old owner ends with `shard_moved` naming the new one, and a cluster
/// client's watch follows it (it sees a change made after the moves).
async fn cache_moves(cluster: &mut Cluster, client: &ClusterClient) {
    let cache = "holds-cache";
    let config = CacheConfig {
        durable: Some(true),
        shards: Some(1),
        replicas: Some(2),
        ..CacheConfig::default()
    };
    client
        .create_cache("t", "ns", cache, config)
        .await
        .expect("create the cache");
    let backing = format!("__cache.{cache}");
    let owner = cluster.leader(client, &backing, None).await;
    client
        .counter_add("t", "ns", cache, "hits", 0)
        .await
        .expect("the counter at 0");

    // A watch at the owner through a plain connection, and one through the cluster client.
    let mut plain = cluster
        .node(owner)
        .client()
        .await
        .watch_cache("t", "ns", cache, WatchTarget::Key("hits".into()))
        .await
        .expect("a watch at the owner");
    let plain = tokio::spawn(async move {
        loop {
            match plain.next_change().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    });
    let mut followed = client
        .watch_cache("t", "ns", cache, WatchTarget::Key("hits".into()))
        .await
        .expect("a cluster watch");
    let last_seen = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let watcher = {
        let last_seen = last_seen.clone();
        tokio::spawn(async move {
            loop {
                let e = followed
                    .next_change()
                    .await
                    .expect("the cluster watch goes on");
                if let Ok(v) = String::from_utf8_lossy(&e.value).trim().parse::<i64>() {
                    last_seen.fetch_max(v, std::sync::atomic::Ordering::AcqRel);
                }
            }
        })
    };

    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let adds = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let mut tasks = Vec::new();
    for w in 0..2 {
        let (client, stop, errors, adds) = (
            client.clone(),
            stop_rx.clone(),
            errors.clone(),
            adds.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !*stop.borrow() {
                i += 1;
                match client.counter_add("t", "ns", cache, "hits", 1).await {
                    Ok(_) => {
                        adds.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    }
                    Err(e) => errors.lock().await.push(format!("counter_add: {e}")),
                }
                // Each writer owns its keys, so a get reads back its own last put.
                let key = format!("w{w}-k{}", i % 16);
                let value = format!("w{w}-v{i}");
                if let Err(e) = client
                    .cache_put("t", "ns", cache, &key, value.clone(), None)
                    .await
                {
                    errors.lock().await.push(format!("put {key}: {e}"));
                    continue;
                }
                match client.cache_get("t", "ns", cache, &key).await {
                    Ok(Some(v)) if v == value.as_bytes() => {}
                    other => errors.lock().await.push(format!("get {key}: {other:?}")),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    let wait_adds = |n: i64| {
        let adds = adds.clone();
        async move {
            let target = adds.load(std::sync::atomic::Ordering::Acquire) + n;
            let deadline = tokio::time::Instant::now() + PATIENCE;
            while adds.load(std::sync::atomic::Ordering::Acquire) < target {
                assert!(tokio::time::Instant::now() < deadline, "no counter adds");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_adds(50).await;
    let held_before = held_count(cluster).await;
    let mut first_to = None;
    for _ in 0..2 {
        let (outside, leader) = placement(client, &backing).await;
        let (to, leader) = (outside[0], leader.expect("an owner"));
        first_to.get_or_insert(to);
        let third = (1..=3).find(|b| *b != to && *b != leader).expect("a third");
        let conn = cluster.node(third).client().await;
        conn.move_shard("t", "ns", &backing, 0, to, None)
            .await
            .expect("move the cache's shard");
        moves_settle(&conn, "a cache shard move").await;
        let (_, now) = placement(client, &backing).await;
        assert_eq!(now, Some(to), "the cache's shard is owned by {to}");
        wait_adds(30).await;
    }
    // The cluster watch delivers a change made after both moves.
    let after = client
        .counter_get("t", "ns", cache, "hits")
        .await
        .expect("counter_get");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while last_seen.load(std::sync::atomic::Ordering::Acquire) <= after {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cluster watch saw nothing after the moves (last {})",
            last_seen.load(std::sync::atomic::Ordering::Acquire)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(true).expect("stop");
    for t in tasks {
        t.await.expect("a cache client task");
    }
    watcher.abort();
    let errors = errors.lock().await;
    assert!(
        errors.is_empty(),
        "cache operations failed across the moves: {errors:?}"
    );
    let total = client
        .counter_get("t", "ns", cache, "hits")
        .await
        .expect("counter_get");
    let adds = adds.load(std::sync::atomic::Ordering::Acquire);
    assert_eq!(total, adds, "every acknowledged counter add counted once");
    // The watch at the first owner ended naming the owner the shard was handed to.
    let end = tokio::time::timeout(PATIENCE, plain)
        .await
        .expect("the old owner's watch ends")
        .expect("the watch task");
    match end {
        Err(felix_client::ClientError::Broker(e)) => {
            assert_eq!(e.code, codes::SHARD_MOVED, "{e}");
            assert_eq!(e.leader, first_to, "{e}");
        }
        other => panic!("the old owner's watch ended without shard_moved: {other:?}"),
    }
    let held = held_count(cluster).await - held_before;
    eprintln!(
        "cache across two moves: {adds} counter adds, all counted once, none refused; \
         {held} operations held at a hand-over"
    );
}

/// How many publishes and cache operations the brokers held at hand-overs so far.
async fn held_count(cluster: &Cluster) -> f64 {
    let mut n = 0.0;
    for b in &cluster.brokers {
        let text = b.metrics().await;
        n += metric_lines(&text, "felix_shard_move_hold_seconds_count")
            .iter()
            .map(|l| metric_value(l))
            .sum::<f64>();
    }
    n
}
