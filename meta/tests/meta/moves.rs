//! Shard moves on `MetaState::apply` and the drain planner directly (no Raft): the order of
//! the steps, what each refuses, and where the new generation starts.

use std::collections::BTreeSet;

use felix_meta::drain::{MAX_MOVES, plan_moves};
use felix_meta::model::{
    Broker, Command, CommandError, Consistency, MetaState, ShardKey, ShardMove, StreamSettings,
};

fn state(brokers: &[u64]) -> MetaState {
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

fn ok(s: &mut MetaState, cmd: Command) {
    s.apply(&cmd)
        .unwrap_or_else(|e| panic!("{cmd:?} refused: {e}"));
}

fn create(s: &mut MetaState, name: &str, consistency: Consistency, shards: u32) {
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

fn key(stream: &str, shard: u32) -> ShardKey {
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
    let plan = plan_moves(&s, &alive);
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
    let plan = plan_moves(&s, &alive);
    assert!(plan.contains(&Command::CancelMove { shard: k }), "{plan:?}");
    // A new stream avoids the draining broker.
    create(&mut s, "fresh", Consistency::Quorum, 4);
    for i in 0..4 {
        assert!(!s.placements[&key("fresh", i)].replicas.contains(&2));
    }
}
