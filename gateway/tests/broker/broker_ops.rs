//! Operating a cluster's brokers (docs/shard-moves.md, docs/operations.md "Scaling out (and
//! in)"): the broker list's zones and hot bytes, removing a broker for good, and forcing a
//! dead leader's shard onto a follower. Steps of other cluster tests, on their brokers.

use std::time::Duration;

use felix_client::{ClusterClient, Message, StartAt};
use serde_json::Value;

use super::cluster::{Cluster, local_next_offset, read_all};
use super::common::PATIENCE;
use super::felixctl::{run, run_status_in};

/// The zone every broker of the moves test is started in (`FELIX_ZONE`).
pub(super) const ZONE: &str = "az-1";

async fn broker_list(cluster: &Cluster, via: usize) -> Vec<Value> {
    let out = run(
        &cluster.brokers[via],
        &["broker", "list", "--output", "json"],
        b"",
    )
    .await;
    serde_json::from_str(&out.stdout).expect("broker list json")
}

/// Broker `gone` is drained, refused removal while alive, stopped, removed: the list and
/// the control plane's members no longer name it, and the others keep working.
pub(super) async fn a_drained_and_stopped_broker_is_removed(cluster: &mut Cluster, gone: u64) {
    // The list: every broker's zone, and each live broker's hot bytes as it reports them.
    let brokers = broker_list(cluster, 0).await;
    assert_eq!(brokers.len(), cluster.brokers.len(), "{brokers:?}");
    for b in &brokers {
        assert_eq!(b["zone"], ZONE, "registered with its zone: {b}");
        if b["alive"] == true {
            assert!(
                b["hot_bytes"].is_u64(),
                "a live broker reports hot bytes: {b}"
            );
        }
    }
    let total: u64 = brokers.iter().filter_map(|b| b["hot_bytes"].as_u64()).sum();
    assert!(
        total > 0,
        "the streams' logs take bytes somewhere: {brokers:?}"
    );

    let via = if gone == 1 { 1 } else { 0 };
    let id = gone.to_string();
    let cwd = std::env::temp_dir();
    // Alive: refused, and nothing changes.
    let (ok, stderr) =
        run_status_in(&cluster.brokers[via], &cwd, &["broker", "remove", &id], b"").await;
    assert!(!ok, "removing a live broker is refused");
    assert!(stderr.contains("is alive"), "{stderr}");
    let streams = cluster.node(gone).data_dir().join("streams");
    assert!(
        !shard_dirs(&streams).is_empty(),
        "broker {gone} holds shard files before the drain"
    );
    drain_and_empty(cluster, via, gone, &streams, "the first drain").await;

    // Moved back onto it, a replica starts afresh and catches up with its leader.
    run(&cluster.brokers[via], &["broker", "undrain", &id], b"").await;
    let client = cluster.client(Duration::from_secs(30)).await;
    let route = client.topology("t", "ns", BACK).await.expect("topology");
    let route = route.shard(0).expect("shard 0").clone();
    let replaced = route
        .replicas
        .iter()
        .find(|r| Some(**r) != route.leader)
        .expect("a follower")
        .to_string();
    let path = format!("t/ns/{BACK}");
    let out = run(
        &cluster.brokers[via],
        &[
            "shard",
            "move",
            &path,
            "0",
            "--to",
            &id,
            "--replace",
            &replaced,
        ],
        b"",
    )
    .await;
    assert!(out.stdout.contains("done"), "{}", out.stdout);
    let last = client
        .publish_to_shard("t", "ns", BACK, 0, &[Message::new("moved-back")])
        .await
        .expect("a publish after the move back");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while local_next_offset(&cluster.brokers[gone as usize - 1], BACK).await <= last.base_offset {
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker {gone}, moved back onto, did not catch up to {}",
            last.base_offset
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drain_and_empty(cluster, via, gone, &streams, "the second drain").await;
    cluster.node(gone).kill();
    // Removed once the control plane has seen it dead (its lease lapses first).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (ok, stderr) =
            run_status_in(&cluster.brokers[via], &cwd, &["broker", "remove", &id], b"").await;
        if ok {
            break;
        }
        assert!(
            stderr.contains("is alive") && tokio::time::Instant::now() < deadline,
            "broker remove {gone}: {stderr}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let brokers = broker_list(cluster, via).await;
    assert!(
        brokers.iter().all(|b| b["id"] != gone),
        "broker {gone} is gone from the list: {brokers:?}"
    );
    // Members are [id, address] pairs.
    let status = meta_status(cluster, via).await;
    let members = status["members"].as_array().cloned().unwrap_or_default();
    assert!(!members.is_empty(), "{status}");
    assert!(
        members.iter().all(|m| m[0] != gone),
        "broker {gone} is no longer a control-plane member: {members:?}"
    );
    // Asking again names what is missing.
    let (ok, stderr) =
        run_status_in(&cluster.brokers[via], &cwd, &["broker", "remove", &id], b"").await;
    assert!(!ok && stderr.contains("no broker"), "{stderr}");
}

/// Scaling out: a broker started with a new node id and the running members in `--cluster`
/// joins the control plane by itself (a learner, then a voter), is listed alive, and takes
/// its share of leaders at ONE `cluster rebalance` (within one of even); publishes to and
/// reads from every shard of `stream` (replicas on it among them) work.
///
/// The join is first held between its two steps (the running members refuse promotions,
/// `POST /v1/faults/hold_promotions`): the new broker is a learner with its `joining` marker
/// written when it is SIGKILLed; restarted (promotions let through), it resumes the join and
/// becomes a voter.
pub(super) async fn a_new_broker_joins_and_takes_leaders(cluster: &mut Cluster, stream: &str) {
    let via = 0;
    let running: Vec<usize> = (0..cluster.brokers.len())
        .filter(|i| cluster.brokers[*i].is_running())
        .collect();
    for &i in &running {
        hold_promotions(cluster, i, "POST").await;
    }
    let id = cluster.add_node().await;
    // Held a learner: a member of the group, not a voter, its marker on disk.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let status = meta_status(cluster, via).await;
        let members = status["members"].as_array().cloned().unwrap_or_default();
        let voters = status["voters"].as_array().cloned().unwrap_or_default();
        if members.iter().any(|m| m[0] == id) {
            assert!(
                voters.iter().all(|v| *v != id),
                "broker {id} voted while promotions were held: {status}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker {id} did not become a learner: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let marker = cluster.node(id).data_dir().join("meta").join("joining");
    assert!(
        marker.exists(),
        "a joining broker keeps its marker until it votes: {}",
        marker.display()
    );
    cluster.node(id).kill();
    for &i in &running {
        hold_promotions(cluster, i, "DELETE").await;
    }
    cluster.node(id).restart().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let status = meta_status(cluster, via).await;
        let voters = status["voters"].as_array().cloned().unwrap_or_default();
        let listed = broker_list(cluster, via).await;
        let alive = listed.iter().any(|b| b["id"] == id && b["alive"] == true);
        if voters.iter().any(|v| *v == id) && alive {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker {id}, restarted mid-join, did not become a live voter: voters {voters:?}, \
             brokers {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!marker.exists(), "the marker goes once broker {id} votes");

    // One rebalance evens leaders out (felixctl exits 1 if a move is not made, or if they are
    // still uneven after its moves).
    let out = run(&cluster.brokers[via], &["cluster", "rebalance"], b"").await;
    // Whether it had to plan again (a leadership changed under it) shows here, with what
    // the control plane's controllers logged about liveness and leaders meanwhile.
    eprintln!("cluster rebalance onto broker {id}:\n{}", out.stdout);
    if out.stdout.contains("changed meanwhile") {
        for (i, b) in cluster.brokers.iter().enumerate() {
            let log = std::fs::read_to_string(b.log_path()).unwrap_or_default();
            for line in log.lines().filter(|l| {
                l.contains("marked dead")
                    || l.contains("marked alive")
                    || l.contains("shard leader assigned")
                    || l.contains("lease")
            }) {
                eprintln!("broker {}: {line}", i + 1);
            }
        }
    }
    assert!(out.stdout.contains("moves planned"), "{}", out.stdout);
    assert!(out.stdout.contains("within one of even"), "{}", out.stdout);
    let leaders: Vec<(u64, u64)> = broker_list(cluster, via)
        .await
        .iter()
        .map(|b| {
            let n = b["leaders"].as_u64().expect("leaders");
            (b["id"].as_u64().expect("id"), n)
        })
        .collect();
    let counts = leaders.iter().map(|(_, n)| *n);
    let (most, least) = (counts.clone().max().unwrap(), counts.min().unwrap());
    assert!(
        most - least <= 1,
        "leaders within one of even after one rebalance onto broker {id}: {leaders:?}\n{}",
        out.stdout
    );
    let joined = leaders
        .iter()
        .find(|(b, _)| *b == id)
        .map_or(0, |(_, n)| *n);
    assert!(joined >= 1, "broker {id} leads nothing: {leaders:?}");
    // Publishes and reads go on: one record to every shard of `stream` (some now have a
    // replica on the new broker), each read back at its offset.
    let client = cluster.client(Duration::from_secs(30)).await;
    let topology = client.topology("t", "ns", stream).await.expect("topology");
    assert!(
        topology.shards.iter().any(|r| r.replicas.contains(&id)),
        "the rebalance put no replica of {stream} on broker {id}: {topology:?}"
    );
    for route in &topology.shards {
        let shard = route.shard;
        let published = client
            .publish_to_shard("t", "ns", stream, shard, &[Message::new("joined")])
            .await
            .unwrap_or_else(|e| panic!("a publish to shard {shard} after the join: {e}"));
        let mut sub = client
            .subscribe_shard(
                "t",
                "ns",
                stream,
                shard,
                StartAt::Offset(published.base_offset),
            )
            .await
            .expect("subscribe");
        let event = tokio::time::timeout(PATIENCE, sub.next_event())
            .await
            .expect("the record within patience")
            .expect("an event")
            .expect("not ended");
        assert_eq!(
            (event.offset, &event.payload[..]),
            (published.base_offset, &b"joined"[..]),
            "shard {shard}"
        );
    }
}

/// The stream a replica is moved back onto the drained broker from (the moves test's Quorum
/// stream).
const BACK: &str = "moving-q";

/// Drains broker `gone` (asked of broker `via`) and waits until it holds no replica and, still
/// running, no shard files either: each moved replica's files go once its move is committed.
async fn drain_and_empty(
    cluster: &Cluster,
    via: usize,
    gone: u64,
    streams: &std::path::Path,
    what: &str,
) {
    let id = gone.to_string();
    run(&cluster.brokers[via], &["broker", "drain", &id], b"").await;
    let deadline = tokio::time::Instant::now() + 2 * PATIENCE;
    loop {
        let brokers = broker_list(cluster, via).await;
        let b = brokers
            .iter()
            .find(|b| b["id"] == gone)
            .expect("still listed");
        if b["replicas"] == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: broker {gone} still holds replicas: {b}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let left = shard_dirs(streams);
        if left.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            let log = std::fs::read_to_string(cluster.brokers[gone as usize - 1].log_path())
                .unwrap_or_default();
            let names: Vec<String> = left
                .iter()
                .filter_map(|d| {
                    let shard = d.file_name()?.to_string_lossy().into_owned();
                    let mut up = d.parent()?;
                    if up.file_name()? == "groups" {
                        up = up.parent()?;
                    }
                    Some(format!("{}/{shard}", up.file_name()?.to_string_lossy()))
                })
                .collect();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| names.iter().any(|n| l.contains(n.as_str())))
                .collect();
            panic!(
                "{what}: the running broker {gone} keeps moved replicas' files: {left:?}\n{}",
                lines.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The shard directories under a broker's `streams/` (`<t>/<ns>/<stream>/<shard>` and the
/// group journals `<t>/<ns>/<stream>/groups/<shard>`).
fn shard_dirs(streams: &std::path::Path) -> Vec<std::path::PathBuf> {
    let children = |p: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(p)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    };
    let numeric = |p: &std::path::Path| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
    };
    let mut out = Vec::new();
    for t in children(streams) {
        for ns in children(&t) {
            for stream in children(&ns) {
                out.extend(children(&stream).into_iter().filter(|p| numeric(p)));
                out.extend(
                    children(&stream.join("groups"))
                        .into_iter()
                        .filter(|p| numeric(p)),
                );
            }
        }
    }
    out
}

/// Turns the promotion hold on (`POST`) or off (`DELETE`) on broker index `i`.
async fn hold_promotions(cluster: &Cluster, i: usize, method: &str) {
    let addr = cluster.brokers[i].admin_addr;
    let (status, body) = super::common::http_request(addr, method, "/v1/faults/hold_promotions")
        .await
        .expect("fault route");
    assert_eq!(status, 200, "{method} /v1/faults/hold_promotions: {body}");
}

/// `GET /meta/status` of broker `via`'s control plane.
async fn meta_status(cluster: &Cluster, via: usize) -> Value {
    let addr = cluster.brokers[via].internal_addr();
    let (code, body) = super::common::http_get(addr, "/meta/status")
        .await
        .expect("meta status");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status json")
}

/// `felixctl shard move --force`: the Leader stream `stream` (shard 0, led by broker `x`,
/// `end` records published as `expected`) loses its leader; an operator forces a follower
/// holding every record to lead, publishes go on from its copy's end, and the old leader
/// comes back as a follower of that history. A step of
/// `broker::cluster::the_same_fault_on_a_leader_and_a_quorum_stream`.
pub(super) async fn a_dead_leaders_shard_is_forced_onto_a_follower(
    cluster: &mut Cluster,
    client: &ClusterClient,
    (stream, quorum): (&str, &str),
    x: u64,
    mut expected: Vec<String>,
) {
    let route = client.topology("t", "ns", stream).await.expect("topology");
    let route = route.shard(0).expect("shard 0").clone();
    assert_eq!(route.leader, Some(x));
    let f = *route
        .replicas
        .iter()
        .find(|r| **r != x)
        .expect("a follower");
    let end = expected.len() as u64;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while local_next_offset(&cluster.brokers[f as usize - 1], stream).await < end {
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker {f} did not copy {end} records"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let via = (if x == 1 { 2 } else { 1 }) as usize - 1;
    let cwd = std::env::temp_dir();
    let path = format!("t/ns/{stream}");
    let to = f.to_string();
    let force = [
        "shard",
        "move",
        path.as_str(),
        "0",
        "--to",
        to.as_str(),
        "--force",
    ];
    // Refused while the leader lives, and for a Quorum stream at any time.
    let (ok, stderr) = run_status_in(&cluster.brokers[via], &cwd, &force, b"").await;
    assert!(!ok && stderr.contains("is alive"), "{stderr}");
    let quorum_path = format!("t/ns/{quorum}");
    let q_route = client.topology("t", "ns", quorum).await.expect("topology");
    let q_to = q_route.shard(0).expect("shard 0").replicas[0].to_string();
    let (ok, stderr) = run_status_in(
        &cluster.brokers[via],
        &cwd,
        &["shard", "move", &quorum_path, "0", "--to", &q_to, "--force"],
        b"",
    )
    .await;
    assert!(!ok && stderr.contains("Quorum"), "{stderr}");

    cluster.node(x).kill();
    // Forced once the control plane has seen the leader dead.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let out = loop {
        let (ok, stderr) = run_status_in(&cluster.brokers[via], &cwd, &force, b"").await;
        if ok {
            break stderr;
        }
        assert!(
            stderr.contains("is alive") && tokio::time::Instant::now() < deadline,
            "shard move --force: {stderr}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        out.contains("WARNING") && out.contains(&format!("offset {end}")),
        "names what may be lost: {out}"
    );
    let now = client.topology("t", "ns", stream).await.expect("topology");
    assert_eq!(now.shard(0).and_then(|r| r.leader), Some(f));

    // Publishes go on from the follower's copy; nothing it held is lost.
    for i in 0..10 {
        let m = format!("forced-{i}");
        client
            .publish_to_shard("t", "ns", stream, 0, &[Message::new(m.clone())])
            .await
            .expect("a publish after the forced move");
        expected.push(m);
    }
    let all = expected.len() as u64;
    let read = read_all(client, stream, all).await;
    assert_eq!(
        read.into_iter().map(|(_, p)| p).collect::<Vec<_>>(),
        expected
    );

    // The old leader returns as a follower of the forced history.
    cluster.node(x).restart().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while local_next_offset(&cluster.brokers[x as usize - 1], stream).await < all {
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker {x} did not follow the forced leader"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
