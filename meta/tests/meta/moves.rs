//! Shard moves on `MetaState::apply` and the drain planner directly (no Raft): the order of
//! the steps, what each refuses, and where the new generation starts.

use std::collections::BTreeSet;

use felix_meta::drain::{MAX_MOVES, plan_moves};
use felix_meta::model::{
    Broker, Command, CommandError, Consistency, MetaState, ShardKey, ShardMove, StreamSettings,
};

pub(super) fn state(brokers: &[u64]) -> MetaState {
    let mut s = MetaState::default();
    ok(&mut s, Command::CreateTenant { name: "t".into() });
    ok(
        &mut s,
        Command::CreateNamespace {
            tenant: "t".into(),
            name: "n".into(),
        },
    );
    for id in brokers {
        ok(
            &mut s,
            Command::RegisterBroker {
                broker: Broker {
                    id: *id,
                    client_addr: format!("127.0.0.1:{}", 5000 + id),
                    kafka_addr: None,
                    internal_addr: format!("127.0.0.1:{}", 6000 + id),
                    zone: None,
                    alive: true,
                    draining: false,
                },
            },
        );
    }
    s
}

pub(super) fn ok(s: &mut MetaState, cmd: Command) {
    s.apply(&cmd)
        .unwrap_or_else(|e| panic!("{cmd:?} refused: {e}"));
}

pub(super) fn create(s: &mut MetaState, name: &str, consistency: Consistency, shards: u32) {
    ok(
        s,
        Command::CreateStream {
            tenant: "t".into(),
            namespace: "n".into(),
            name: name.into(),
            settings: StreamSettings {
                consistency,
                replicas: 3,
                shards,
                ..StreamSettings::default()
            },
        },
    );
}

pub(super) fn key(stream: &str, shard: u32) -> ShardKey {
    ShardKey {
        tenant: "t".into(),
        namespace: "n".into(),
        stream: stream.into(),
        shard,
    }
}

fn outsider(s: &MetaState, k: &ShardKey) -> u64 {
    (1..=4)
        .find(|b| !s.placements[k].replicas.contains(b))
        .expect("a broker outside the replica set")
}

#[test]
fn a_leader_move_adds_hands_over_at_the_fence_then_removes_the_old_replica() {
    let mut s = state(&[1, 2, 3, 4]);
    create(&mut s, "q", Consistency::Quorum, 1);
    let k = key("q", 0);
    let before = s.placements[&k].clone();
    let from = before.leader.unwrap();
    let to = outsider(&s, &k);
    ok(
        &mut s,
        Command::StartMove {
            shard: k.clone(),
            from,
            to,
        },
    );
    let p = s.placements[&k].clone();
    assert_eq!(
        p.replicas.len(),
        4,
        "the new replica joins: {:?}",
        p.replicas
    );
    assert_eq!(p.moving, Some(ShardMove { from, to }));
    assert_eq!(p.generation, before.generation, "no leadership change yet");

    // A second move of the same shard waits for this one.
    let err = s
        .apply(&Command::StartMove {
            shard: k.clone(),
            from,
            to: 99,
        })
        .unwrap_err();
    assert!(matches!(err, CommandError::MoveInProgress { .. }), "{err}");
    // The old replica cannot leave while it leads.
    assert!(
        s.apply(&Command::FinishMove {
            shard: k.clone(),
            generation: p.generation
        })
        .is_err()
    );

    // The leader's report must count the new replica in sync at the fence's end.
    let others: BTreeSet<u64> = p.replicas.iter().copied().filter(|b| *b != to).collect();
    ok(
        &mut s,
        Command::ReportReplicas {
            shard: k.clone(),
            generation: p.generation,
            committed: 100,
            in_sync: others,
        },
    );
    let hand_over = Command::HandOver {
        shard: k.clone(),
        generation: p.generation,
        to,
        end: 100,
    };
    assert!(
        s.apply(&hand_over).is_err(),
        "refused: the new replica is not in sync"
    );
    let below = Command::HandOver {
        shard: k.clone(),
        generation: p.generation,
        to,
        end: 90,
    };
    assert!(s.apply(&below).is_err(), "refused: below the quorum mark");
    ok(
        &mut s,
        Command::ReportReplicas {
            shard: k.clone(),
            generation: p.generation,
            committed: 100,
            in_sync: p.replicas.iter().copied().collect(),
        },
    );
    ok(&mut s, hand_over.clone());
    let p2 = s.placements[&k].clone();
    assert_eq!(p2.leader, Some(to));
    assert_eq!(p2.generation, p.generation + 1);
    assert_eq!(
        p2.epoch_start(p2.generation),
        Some(100),
        "the new generation starts at the fence"
    );
    let r = s.replication[&k].clone();
    assert_eq!(r.generation, p2.generation);
    assert!(
        r.in_sync.contains(&from) && r.in_sync.len() == 4,
        "the old replicas stay in sync, so failover can promote one if the new leader dies: {r:?}"
    );
    // A replayed hand-over from the old generation is stale.
    assert!(matches!(
        s.apply(&hand_over),
        Err(CommandError::StaleGeneration { .. })
    ));
    // Cancelling is too late once the destination leads.
    assert!(s.apply(&Command::CancelMove { shard: k.clone() }).is_err());

    ok(
        &mut s,
        Command::FinishMove {
            shard: k.clone(),
            generation: p2.generation,
        },
    );
    let done = s.placements[&k].clone();
    assert!(!done.replicas.contains(&from));
    assert_eq!(done.replicas.len(), 3);
    assert_eq!(done.moving, None);
}

#[test]
fn a_cancelled_move_leaves_the_replica_set_as_it_was() {
    let mut s = state(&[1, 2, 3, 4]);
    create(&mut s, "l", Consistency::Leader, 1);
    let k = key("l", 0);
    let before = s.placements[&k].clone();
    let from = before.replicas[1];
    let to = outsider(&s, &k);
    for bad in [
        Command::StartMove {
            shard: k.clone(),
            from: to,
            to: from,
        },
        Command::StartMove {
            shard: k.clone(),
            from,
            to: from,
        },
        Command::StartMove {
            shard: k.clone(),
            from,
            to: 42,
        },
    ] {
        let snapshot = s.clone();
        assert!(s.apply(&bad).is_err(), "{bad:?} must be refused");
        assert_eq!(s, snapshot, "a refused move changes nothing");
    }
    ok(
        &mut s,
        Command::StartMove {
            shard: k.clone(),
            from,
            to,
        },
    );
    ok(&mut s, Command::CancelMove { shard: k.clone() });
    assert_eq!(s.placements[&k], before);
}

#[test]
fn draining_moves_every_replica_off_with_bounded_concurrency_and_rolls_back_dead_destinations() {
    let mut s = state(&[1, 2, 3, 4]);
    create(&mut s, "d", Consistency::Quorum, 8);
    ok(
        &mut s,
        Command::SetBrokerDraining {
            id: 2,
            draining: true,
        },
    );
    let alive: BTreeSet<u64> = [1, 2, 3, 4].into();
    let plan = plan_moves(&s, &alive, &BTreeSet::new());
    let held = s
        .placements
        .values()
        .filter(|p| p.replicas.contains(&2))
        .count();
    assert_eq!(plan.len(), held.min(MAX_MOVES));
    for cmd in &plan {
        match cmd {
            Command::StartMove { from, to, .. } => {
                assert_eq!(*from, 2);
                assert_ne!(*to, 2, "never onto the draining broker");
            }
            other => panic!("unexpected {other:?}"),
        }
        ok(&mut s, cmd.clone());
    }
    // The destination of one move dies: that move is rolled back.
    let (k, to) = s
        .placements
        .iter()
        .find_map(|(k, p)| p.moving.map(|m| (k.clone(), m.to)))
        .unwrap();
    let alive: BTreeSet<u64> = [1, 2, 3, 4].into_iter().filter(|b| *b != to).collect();
    let plan = plan_moves(&s, &alive, &BTreeSet::new());
    assert!(plan.contains(&Command::CancelMove { shard: k }), "{plan:?}");
    // A new stream avoids the draining broker.
    create(&mut s, "fresh", Consistency::Quorum, 4);
    for i in 0..4 {
        assert!(!s.placements[&key("fresh", i)].replicas.contains(&2));
    }
}

#[test]
fn a_dead_brokers_followers_are_replaced_and_a_catching_up_replica_is_not_a_voter() {
    let mut s = state(&[1, 2, 3, 4]);
    create(&mut s, "r", Consistency::Quorum, 4);
    // Broker 3 dies; its Quorum leaderships failed over (not modelled here), its follower
    // replicas stay until the replace delay passed.
    ok(
        &mut s,
        Command::SetBrokerAlive {
            id: 3,
            alive: false,
        },
    );
    let alive: BTreeSet<u64> = [1, 2, 4].into();
    assert!(
        plan_moves(&s, &alive, &BTreeSet::new()).is_empty(),
        "not before the delay"
    );
    let plan = plan_moves(&s, &alive, &[3].into());
    let followers = s
        .placements
        .values()
        .filter(|p| p.replicas.contains(&3) && p.leader != Some(3))
        .count();
    assert_eq!(plan.len(), followers.min(MAX_MOVES));
    let Some(Command::StartMove { shard, from: 3, to }) = plan.first().cloned() else {
        panic!("expected a move off broker 3: {plan:?}");
    };
    ok(
        &mut s,
        Command::StartMove {
            shard: shard.clone(),
            from: 3,
            to,
        },
    );
    let p = s.placements[&shard].clone();
    assert_eq!(
        p.voters().len(),
        3,
        "the destination does not vote while it catches up"
    );
    // The two live old replicas are a majority: Quorum writes go on during the catch-up.
    let live: BTreeSet<u64> = p
        .replicas
        .iter()
        .copied()
        .filter(|b| *b != 3 && *b != to)
        .collect();
    ok(
        &mut s,
        Command::ReportReplicas {
            shard: shard.clone(),
            generation: p.generation,
            committed: 10,
            in_sync: live,
        },
    );
}

/// Carries a move through to its end, as the shard's leader would.
pub(super) fn complete(s: &mut MetaState, shard: &ShardKey, from: u64, to: u64) {
    ok(
        s,
        Command::StartMove {
            shard: shard.clone(),
            from,
            to,
        },
    );
    let p = s.placements[shard].clone();
    if p.leader == Some(from) {
        ok(
            s,
            Command::HandOver {
                shard: shard.clone(),
                generation: p.generation,
                to,
                end: 0,
            },
        );
    }
    let generation = s.placements[shard].generation;
    ok(
        s,
        Command::FinishMove {
            shard: shard.clone(),
            generation,
        },
    );
}

#[test]
fn a_rebalance_plan_spreads_leaders_and_replicas_onto_an_empty_broker_within_one() {
    let mut s = state(&[1, 2, 3, 4]);
    ok(
        &mut s,
        Command::SetBrokerDraining {
            id: 4,
            draining: true,
        },
    );
    create(&mut s, "b", Consistency::Leader, 12);
    ok(
        &mut s,
        Command::SetBrokerDraining {
            id: 4,
            draining: false,
        },
    );
    assert_eq!(s.broker_load(4), (0, 0), "the new broker starts empty");
    let plan = felix_meta::rebalance::plan_rebalance(&s);
    assert!(!plan.is_empty());
    for m in &plan {
        complete(&mut s, &m.shard, m.from, m.to);
    }
    let loads: Vec<(usize, usize)> = (1..=4).map(|b| s.broker_load(b)).collect();
    let leaders: Vec<usize> = loads.iter().map(|l| l.1).collect();
    let replicas: Vec<usize> = loads.iter().map(|l| l.0).collect();
    let spread = |v: &[usize]| v.iter().max().unwrap() - v.iter().min().unwrap();
    assert!(
        spread(&leaders) <= 1,
        "leaders within one of even: {leaders:?}"
    );
    assert!(
        spread(&replicas) <= 1,
        "replicas within one of even: {replicas:?}"
    );
    assert!(
        felix_meta::rebalance::plan_rebalance(&s).is_empty(),
        "balanced: nothing more to do"
    );
}

#[test]
fn a_shard_placed_short_while_a_broker_was_dead_is_topped_up_once_it_is_back() {
    let mut s = state(&[1, 2, 3]);
    let dead = Command::SetBrokerAlive {
        id: 3,
        alive: false,
    };
    ok(&mut s, dead);
    create(&mut s, "q", Consistency::Quorum, 2);
    let k = key("q", 0);
    assert_eq!(
        s.placements[&k].replicas.len(),
        2,
        "placed on the live brokers only"
    );
    // Nowhere to add it while broker 3 is dead.
    let alive: BTreeSet<u64> = [1, 2].into();
    assert!(plan_moves(&s, &alive, &BTreeSet::new()).is_empty());
    let refused = s
        .apply(&Command::AddReplica {
            shard: k.clone(),
            to: 3,
        })
        .unwrap_err();
    assert!(refused.to_string().contains("not alive"), "{refused}");

    ok(&mut s, Command::SetBrokerAlive { id: 3, alive: true });
    let alive: BTreeSet<u64> = [1, 2, 3].into();
    let plan = plan_moves(&s, &alive, &BTreeSet::new());
    assert_eq!(
        plan,
        vec![
            Command::AddReplica {
                shard: k.clone(),
                to: 3
            },
            Command::AddReplica {
                shard: key("q", 1),
                to: 3
            },
        ]
    );
    ok(&mut s, plan[0].clone());
    let p = s.placements[&k].clone();
    assert_eq!(p.replicas.len(), 3);
    assert_eq!(p.moving, Some(ShardMove { from: 3, to: 3 }));
    assert!(p.moving.is_some_and(|m| m.adds()));
    assert_eq!(
        p.voters().len(),
        2,
        "the new replica votes once it finished"
    );
    // One change at a time, and never past the stream's count.
    assert!(matches!(
        s.apply(&plan[0]),
        Err(CommandError::MoveInProgress { .. })
    ));
    // A Quorum shard's addition finishes once the new replica is recorded in sync; nobody
    // leaves.
    let finish = Command::FinishMove {
        shard: k.clone(),
        generation: p.generation,
    };
    ok(
        &mut s,
        Command::ReportReplicas {
            shard: k.clone(),
            generation: p.generation,
            committed: 10,
            in_sync: [1, 2].into(),
        },
    );
    assert!(s.apply(&finish).is_err(), "not in sync yet");
    ok(
        &mut s,
        Command::ReportReplicas {
            shard: k.clone(),
            generation: p.generation,
            committed: 10,
            in_sync: [1, 2, 3].into(),
        },
    );
    ok(&mut s, finish);
    let done = s.placements[&k].clone();
    assert_eq!(done.replicas.len(), 3, "nobody left: {:?}", done.replicas);
    assert_eq!(done.moving, None);
    assert_eq!(done.voters().len(), 3);
    let full = s
        .apply(&Command::AddReplica {
            shard: k.clone(),
            to: 4,
        })
        .unwrap_err();
    assert!(full.to_string().contains("as many as"), "{full}");
    // The other shard is still short; the fully replicated one is not planned again.
    let plan = plan_moves(&s, &alive, &BTreeSet::new());
    assert_eq!(
        plan,
        vec![Command::AddReplica {
            shard: key("q", 1),
            to: 3
        }]
    );
}

#[test]
fn an_addition_whose_new_replica_was_promoted_still_finishes() {
    let mut s = state(&[1, 2, 3]);
    ok(
        &mut s,
        Command::SetBrokerAlive {
            id: 3,
            alive: false,
        },
    );
    create(&mut s, "q", Consistency::Quorum, 1);
    ok(&mut s, Command::SetBrokerAlive { id: 3, alive: true });
    let k = key("q", 0);
    ok(
        &mut s,
        Command::AddReplica {
            shard: k.clone(),
            to: 3,
        },
    );
    let p = s.placements[&k].clone();
    ok(
        &mut s,
        Command::ReportReplicas {
            shard: k.clone(),
            generation: p.generation,
            committed: 5,
            in_sync: [1, 2, 3].into(),
        },
    );
    // The leader dies; failover promotes the new replica (in sync, recorded).
    ok(
        &mut s,
        Command::SetPlacement {
            shard: k.clone(),
            replicas: p.replicas.clone(),
            leader: Some(3),
        },
    );
    let g = s.placements[&k].generation;
    ok(
        &mut s,
        Command::FinishMove {
            shard: k.clone(),
            generation: g,
        },
    );
    let done = s.placements[&k].clone();
    assert_eq!(done.replicas.len(), 3);
    assert_eq!(done.moving, None);
}
