//! Leases over HTTP and failover on a real three-node group, in this process: the nodes
//! are `MetaNode`s on loopback with a short lease, so the controller acts within seconds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use felix_meta::model::{Broker, Command, Consistency, ShardKey, StreamSettings};
use felix_meta::network::{ForwardError, PeerClient};
use felix_meta::{MetaConfig, MetaNode};

const LEASE: Duration = Duration::from_millis(1000);

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").to_string()
}

struct Group {
    _dir: tempfile::TempDir,
    nodes: Vec<MetaNode>,
}

impl Group {
    async fn start() -> Group {
        let dir = tempfile::tempdir().expect("tempdir");
        let cluster: BTreeMap<u64, String> = (1..=3).map(|id| (id, free_addr())).collect();
        let mut nodes = Vec::new();
        for (id, addr) in &cluster {
            let mut config = MetaConfig::single(
                *id,
                dir.path().join(format!("node-{id}")),
                addr.parse().expect("addr"),
            );
            config.cluster = cluster.clone();
            config.advertise = Some(addr.clone());
            config.lease = LEASE;
            nodes.push(MetaNode::start(config).await.expect("start a node"));
        }
        let g = Group { _dir: dir, nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !g.nodes.iter().all(|n| n.handle().is_ready()) {
            assert!(Instant::now() < deadline, "no leader within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        g
    }

    fn leader(&self) -> &MetaNode {
        let id = self.nodes[0].handle().leader().expect("a leader");
        self.nodes
            .iter()
            .find(|n| n.handle().node_id() == id)
            .expect("the leader is one of ours")
    }

    fn follower(&self) -> &MetaNode {
        let id = self.leader().handle().node_id();
        self.nodes
            .iter()
            .find(|n| n.handle().node_id() != id)
            .expect("a follower")
    }

    async fn shutdown(self) {
        for n in self.nodes {
            n.shutdown().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_renews_its_lease_through_any_node_and_only_the_leader_grants() {
    let g = Group::start().await;
    let leader = g.leader();
    let follower = g.follower();

    let granted = follower
        .handle()
        .renew_broker_lease(42)
        .await
        .expect("a follower forwards the renewal to the leader");
    assert_eq!(granted, LEASE);
    assert_eq!(follower.handle().lease_duration(), LEASE);
    assert!(leader.handle().leases().holds(42, Instant::now()));
    assert!(!follower.handle().leases().holds(42, Instant::now()));

    let http = PeerClient::new(Duration::from_secs(2));
    let on_leader = http
        .renew_lease(&leader.local_addr().to_string(), 43)
        .await
        .expect("POST /meta/lease on the leader");
    assert_eq!(on_leader, LEASE);
    match http
        .renew_lease(&follower.local_addr().to_string(), 43)
        .await
    {
        Err(ForwardError::NotLeader {
            leader: Some((id, addr)),
        }) => {
            assert_eq!(id, leader.handle().node_id());
            assert_eq!(addr, leader.local_addr().to_string());
        }
        other => panic!("a follower answers not_leader naming the leader, got {other:?}"),
    }
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_shard_fails_over_to_an_in_sync_replica_when_its_leader_stops_renewing() {
    let g = Group::start().await;
    let h = g.follower().handle().clone();
    for cmd in [
        Command::CreateTenant { name: "t".into() },
        Command::CreateNamespace {
            tenant: "t".into(),
            name: "n".into(),
        },
    ] {
        h.propose(cmd).await.expect("setup");
    }
    // Brokers keep renewing until taken out of this set.
    let renewing = Arc::new(Mutex::new(BTreeSet::from([11, 12, 13])));
    let renewer = {
        let h = h.clone();
        let renewing = renewing.clone();
        tokio::spawn(async move {
            loop {
                let brokers = renewing.lock().expect("lock").clone();
                for b in brokers {
                    let _ = h.renew_broker_lease(b).await;
                }
                tokio::time::sleep(LEASE / 5).await;
            }
        })
    };
    for id in [11, 12, 13] {
        h.renew_broker_lease(id).await.expect("first renewal");
        h.propose(Command::RegisterBroker {
            broker: Broker {
                id,
                client_addr: format!("127.0.0.1:{}", 5000 + id),
                kafka_addr: None,
                internal_addr: format!("127.0.0.1:{}", 6000 + id),
                zone: None,
                alive: true,
                draining: false,
            },
        })
        .await
        .expect("register");
    }
    h.propose(Command::CreateStream {
        tenant: "t".into(),
        namespace: "n".into(),
        name: "orders".into(),
        settings: StreamSettings {
            consistency: Consistency::Quorum,
            replicas: 3,
            ..StreamSettings::default()
        },
    })
    .await
    .expect("create");
    let shard = ShardKey {
        tenant: "t".into(),
        namespace: "n".into(),
        stream: "orders".into(),
        shard: 0,
    };
    // A follower's handle: read past everything acknowledged before looking locally.
    let placed = h
        .read(|s| s.placements.get(&shard).cloned())
        .await
        .expect("read")
        .expect("placed at creation");
    let old_leader = placed.leader.expect("a leader");
    let survivors: Vec<u64> = placed
        .replicas
        .iter()
        .copied()
        .filter(|b| *b != old_leader)
        .collect();
    // The leader reports that it and the highest-numbered survivor hold everything below 10.
    let in_sync = *survivors.iter().max().expect("two survivors");
    h.propose(Command::ReportReplicas {
        shard: shard.clone(),
        generation: placed.generation,
        committed: 10,
        in_sync: BTreeSet::from([old_leader, in_sync]),
    })
    .await
    .expect("report");
    h.read(|_| ()).await.expect("read");
    assert_eq!(h.replication(&shard).map(|r| r.committed), Some(10));

    // The survivors keep renewing; the old leader stops.
    renewing.lock().expect("lock").remove(&old_leader);

    let deadline = Instant::now() + Duration::from_secs(20);
    let moved = loop {
        let p = h.placement(&shard).expect("placement");
        if p.leader != Some(old_leader) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "the shard kept its dead leader {old_leader}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    renewer.abort();
    assert_eq!(
        moved.leader,
        Some(in_sync),
        "the in-sync survivor leads, not the lower-numbered lagging one"
    );
    assert_eq!(moved.replicas, placed.replicas);
    assert_eq!(moved.generation, placed.generation + 1);
    assert_eq!(moved.epoch_start(moved.generation), Some(10));
    assert_eq!(moved.epoch_end(placed.generation), Some(10));
    h.read(|_| ()).await.expect("read");
    let alive = h.local(|s| s.brokers[&old_leader].alive);
    assert!(!alive, "the broker that stopped renewing is marked dead");
    let r = h.replication(&shard).expect("report kept");
    assert_eq!(
        (r.generation, r.committed, r.in_sync),
        (moved.generation, 10, BTreeSet::from([in_sync]))
    );
    g.shutdown().await;
}
