//! Placement, replication reports, epochs and failover decisions, on `MetaState::apply` and
//! `controller::decide` directly (no Raft).

use std::collections::BTreeSet;

use felix_meta::controller::{LeaseView, decide};
use felix_meta::model::{
    Applied, Broker, Command, CommandError, Consistency, Durability, EpochStart, MetaState,
    Replication, ShardKey, StreamSettings, StreamSettingsPatch,
};

fn broker(id: u64, alive: bool) -> Broker {
    Broker {
        id,
        client_addr: format!("127.0.0.1:{}", 5000 + id),
        kafka_addr: None,
        internal_addr: format!("127.0.0.1:{}", 6000 + id),
        zone: None,
        alive,
        draining: false,
    }
}

fn ok(state: &mut MetaState, cmd: Command) -> Applied {
    state
        .apply(&cmd)
        .unwrap_or_else(|e| panic!("{cmd:?} refused: {e}"))
}

/// A state with tenant `t`, namespace `t/n` and the given brokers.
fn with_brokers(brokers: &[(u64, bool)]) -> MetaState {
    let mut s = MetaState::default();
    ok(&mut s, Command::CreateTenant { name: "t".into() });
    ok(
        &mut s,
        Command::CreateNamespace {
            tenant: "t".into(),
            name: "n".into(),
        },
    );
    for (id, alive) in brokers {
        ok(
            &mut s,
            Command::RegisterBroker {
                broker: broker(*id, *alive),
            },
        );
    }
    s
}

fn settings(consistency: Consistency, replicas: u32, shards: u32) -> StreamSettings {
    StreamSettings {
        consistency,
        replicas,
        shards,
        ..StreamSettings::default()
    }
}

fn create(state: &mut MetaState, name: &str, settings: StreamSettings) {
    ok(
        state,
        Command::CreateStream {
            tenant: "t".into(),
            namespace: "n".into(),
            name: name.into(),
            settings,
        },
    );
}

fn shard(stream: &str, shard: u32) -> ShardKey {
    ShardKey {
        tenant: "t".into(),
        namespace: "n".into(),
        stream: stream.into(),
        shard,
    }
}

fn report(shard: &ShardKey, generation: u64, committed: u64, in_sync: &[u64]) -> Command {
    Command::ReportReplicas {
        shard: shard.clone(),
        generation,
        committed,
        in_sync: in_sync.iter().copied().collect(),
    }
}

fn set_leader(state: &MetaState, shard: &ShardKey, leader: u64) -> Command {
    Command::SetPlacement {
        shard: shard.clone(),
        replicas: state.placements[shard].replicas.clone(),
        leader: Some(leader),
    }
}

// --- placement at creation --------------------------------------------------------------

#[test]
fn create_places_every_shard_on_live_brokers_spread_and_deterministic() {
    let brokers = [(1, true), (2, true), (3, true), (4, false)];
    let mut a = with_brokers(&brokers);
    create(&mut a, "orders", settings(Consistency::Quorum, 3, 6));
    let mut leaders = Vec::new();
    for i in 0..6 {
        let p = &a.placements[&shard("orders", i)];
        assert_eq!(p.replicas.len(), 3);
        let distinct: BTreeSet<_> = p.replicas.iter().collect();
        assert_eq!(distinct.len(), 3, "replicas are distinct: {:?}", p.replicas);
        assert!(!p.replicas.contains(&4), "a dead broker is never chosen");
        assert_eq!(p.leader, p.replicas.first().copied());
        assert_eq!(p.generation, 1);
        assert_eq!(
            p.epochs,
            vec![EpochStart {
                generation: 1,
                start_offset: 0
            }]
        );
        leaders.push(p.leader.expect("a leader"));
    }
    for b in 1..=3 {
        assert_eq!(
            leaders.iter().filter(|l| **l == b).count(),
            2,
            "six shards' leaders spread evenly over three brokers: {leaders:?}"
        );
    }
    // Consecutive shards start at consecutive brokers.
    let first = |i| a.placements[&shard("orders", i)].replicas.clone();
    assert_eq!(
        first(0),
        MetaState::spread(&shard("orders", 0), 3, &[1, 2, 3])
    );
    assert_ne!(first(0)[0], first(1)[0]);

    // The same commands on another node give the same placement.
    let mut b = with_brokers(&brokers);
    create(&mut b, "orders", settings(Consistency::Quorum, 3, 6));
    assert_eq!(a.placements, b.placements);
}

#[test]
fn replicas_are_capped_by_the_live_brokers() {
    let mut s = with_brokers(&[(1, true), (2, true)]);
    create(&mut s, "wide", settings(Consistency::Quorum, 5, 1));
    let p = &s.placements[&shard("wide", 0)];
    assert_eq!(p.replicas.len(), 2);
}

#[test]
fn shards_stay_unplaced_without_a_live_broker_and_ephemeral_shards_get_one_leader() {
    let mut none = with_brokers(&[]);
    create(&mut none, "early", StreamSettings::default());
    assert!(none.placements.is_empty());

    let mut dead = with_brokers(&[(1, false)]);
    create(&mut dead, "early", StreamSettings::default());
    assert!(dead.placements.is_empty());

    // An ephemeral shard is one log on one leader too: placed on a single broker, whatever
    // `replicas` says, so publishers and subscribers on any broker meet there.
    let mut s = with_brokers(&[(1, true), (2, true), (3, true)]);
    create(
        &mut s,
        "memory",
        StreamSettings {
            durability: Durability::Ephemeral,
            replicas: 3,
            shards: 2,
            ..StreamSettings::default()
        },
    );
    assert_eq!(s.placements.len(), 2);
    for k in 0..2 {
        let p = &s.placements[&shard("memory", k)];
        let expected = MetaState::spread(&shard("memory", k), 1, &[1, 2, 3]);
        assert_eq!(p.replicas, expected);
        assert_eq!(p.leader, expected.first().copied());
        assert_eq!(p.generation, 1);
    }
}

#[test]
fn alter_places_added_shards_and_delete_forgets_placement_and_reports() {
    let mut s = with_brokers(&[(1, true), (2, true), (3, true)]);
    create(&mut s, "grow", settings(Consistency::Quorum, 3, 2));
    let before = s.placements.clone();
    ok(
        &mut s,
        Command::AlterStream {
            tenant: "t".into(),
            namespace: "n".into(),
            name: "grow".into(),
            patch: StreamSettingsPatch {
                shards: Some(4),
                ..StreamSettingsPatch::default()
            },
            expected_version: None,
        },
    );
    assert_eq!(s.placements.len(), 4);
    for i in 0..2 {
        assert_eq!(s.placements[&shard("grow", i)], before[&shard("grow", i)]);
    }
    for i in 2..4 {
        let p = &s.placements[&shard("grow", i)];
        assert_eq!(
            p.replicas,
            MetaState::spread(&shard("grow", i), 3, &[1, 2, 3])
        );
        assert_eq!(p.generation, 1);
    }
    let leader = s.placements[&shard("grow", 0)].leader.expect("leader");
    let other = s.placements[&shard("grow", 0)].replicas[1];
    ok(&mut s, report(&shard("grow", 0), 1, 7, &[leader, other]));
    ok(
        &mut s,
        Command::DeleteStream {
            tenant: "t".into(),
            namespace: "n".into(),
            name: "grow".into(),
        },
    );
    assert!(s.placements.is_empty());
    assert!(s.replication.is_empty());
}

// --- replication reports -----------------------------------------------------------------

#[test]
fn a_replication_report_is_fenced_by_generation() {
    let mut s = with_brokers(&[(1, true), (2, true), (3, true)]);
    create(&mut s, "q", settings(Consistency::Quorum, 3, 1));
    let k = shard("q", 0);
    let p = s.placements[&k].clone();
    let leader = p.leader.expect("leader");
    let all: Vec<u64> = p.replicas.clone();
    assert_eq!(
        s.apply(&report(&k, 2, 10, &all)),
        Err(CommandError::StaleGeneration {
            shard: k.to_string(),
            given: 2,
            current: 1
        })
    );
    assert_eq!(
        s.apply(&report(&shard("q", 5), 1, 10, &all)),
        Err(CommandError::StaleGeneration {
            shard: shard("q", 5).to_string(),
            given: 1,
            current: 0
        }),
        "no placement: no generation is current"
    );
    assert_eq!(s.apply(&report(&k, 1, 10, &all)), Ok(Applied::Done));

    // A new leader: the old one's reports are stale from now on.
    let next = p.replicas.iter().copied().find(|b| *b != leader).unwrap();
    let change = set_leader(&s, &k, next);
    ok(&mut s, change);
    assert!(matches!(
        s.apply(&report(&k, 1, 12, &all)),
        Err(CommandError::StaleGeneration {
            given: 1,
            current: 2,
            ..
        })
    ));
}

#[test]
fn a_replication_report_needs_a_majority_that_includes_the_leader() {
    let mut s = with_brokers(&[(1, true), (2, true), (3, true), (4, true)]);
    create(&mut s, "q", settings(Consistency::Quorum, 3, 1));
    let k = shard("q", 0);
    let p = s.placements[&k].clone();
    let leader = p.leader.expect("leader");
    let followers: Vec<u64> = p
        .replicas
        .iter()
        .copied()
        .filter(|b| *b != leader)
        .collect();
    let outsider = (1..=4).find(|b| !p.replicas.contains(b)).unwrap();
    let invalid = |r: Result<Applied, CommandError>| matches!(r, Err(CommandError::Invalid(_)));

    assert!(
        invalid(s.apply(&report(&k, 1, 5, &[leader]))),
        "one of three is no majority"
    );
    assert!(
        invalid(s.apply(&report(&k, 1, 5, &followers))),
        "the leader must be in sync"
    );
    assert!(
        invalid(s.apply(&report(&k, 1, 5, &[leader, followers[0], outsider]))),
        "only replicas can be in sync"
    );
    assert!(s.replication.is_empty(), "refused reports change nothing");

    ok(&mut s, report(&k, 1, 5, &[leader, followers[0]]));
    assert_eq!(
        s.replication[&k],
        Replication {
            generation: 1,
            committed: 5,
            in_sync: BTreeSet::from([leader, followers[0]]),
        }
    );
    assert!(
        invalid(s.apply(&report(&k, 1, 4, &[leader, followers[0]]))),
        "the quorum mark never goes down"
    );
    ok(&mut s, report(&k, 1, 9, &p.replicas));
    assert_eq!(s.replication[&k].committed, 9);
    assert_eq!(s.replication[&k].in_sync.len(), 3);
    assert!(
        !MetaState::touches_registry(&report(&k, 1, 9, &p.replicas)),
        "reports are frequent and do not republish the registry"
    );
}

#[test]
fn a_leader_change_starts_an_epoch_at_the_quorum_mark() {
    let mut s = with_brokers(&[(1, true), (2, true), (3, true)]);
    create(&mut s, "q", settings(Consistency::Quorum, 3, 1));
    let k = shard("q", 0);
    let p = s.placements[&k].clone();
    let leader = p.leader.expect("leader");
    ok(&mut s, report(&k, 1, 100, &p.replicas));
    let next = p.replicas.iter().copied().find(|b| *b != leader).unwrap();
    let change = set_leader(&s, &k, next);
    assert_eq!(s.apply(&change), Ok(Applied::Generation { generation: 2 }));
    let p = &s.placements[&k];
    assert_eq!(
        p.epochs,
        vec![
            EpochStart {
                generation: 1,
                start_offset: 0
            },
            EpochStart {
                generation: 2,
                start_offset: 100
            },
        ]
    );
    assert_eq!(p.epoch_start(1), Some(0));
    assert_eq!(p.epoch_end(1), Some(100));
    assert_eq!(p.epoch_start(2), Some(100));
    assert_eq!(p.epoch_end(2), None, "the current epoch has no end yet");
    assert_eq!(
        s.replication[&k],
        Replication {
            generation: 2,
            committed: 100,
            in_sync: BTreeSet::from([next]),
        },
        "only the new leader is known in sync in the new generation; the mark is kept"
    );

    // Same leader again: no new generation, no new epoch.
    let change = set_leader(&s, &k, next);
    assert_eq!(s.apply(&change), Ok(Applied::Generation { generation: 2 }));
    assert_eq!(s.placements[&k].epochs.len(), 2);
}

#[test]
fn a_quorum_shard_refuses_a_leader_that_is_not_in_sync() {
    let mut s = with_brokers(&[(1, true), (2, true), (3, true)]);
    create(&mut s, "q", settings(Consistency::Quorum, 3, 1));
    create(&mut s, "l", settings(Consistency::Leader, 3, 1));
    for name in ["q", "l"] {
        let k = shard(name, 0);
        let p = s.placements[&k].clone();
        let leader = p.leader.expect("leader");
        let in_sync = p.replicas[1];
        let lagging = p.replicas[2];
        ok(&mut s, report(&k, 1, 50, &[leader, in_sync]));
        let before = s.clone();
        let r = s.apply(&set_leader(&before, &k, lagging));
        if name == "q" {
            match r {
                Err(CommandError::Invalid(m)) => {
                    assert!(m.contains("does not hold every acknowledged record"), "{m}")
                }
                other => panic!("expected Invalid, got {other:?}"),
            }
            assert_eq!(s, before, "a refused leader change changes nothing");
            ok(&mut s, set_leader(&before, &k, in_sync));
            assert_eq!(s.placements[&k].leader, Some(in_sync));
        } else {
            assert_eq!(
                r,
                Ok(Applied::Generation { generation: 2 }),
                "a leader-acknowledged stream takes any replica (the operator's choice)"
            );
        }
    }
}

#[test]
fn a_state_with_placements_manifests_and_reports_round_trips_through_json() {
    let mut s = with_brokers(&[(1, true), (2, true), (3, true)]);
    create(&mut s, "q", settings(Consistency::Quorum, 3, 2));
    let k = shard("q", 0);
    let p = s.placements[&k].clone();
    ok(&mut s, report(&k, 1, 100, &p.replicas));
    ok(
        &mut s,
        Command::AddSegment {
            shard: k.clone(),
            segment: felix_meta::model::SegmentEntry {
                base_offset: 0,
                last_offset: 99,
                min_timestamp: 1,
                max_timestamp: 2,
                size_bytes: 4096,
                tier: felix_meta::model::TierState::Hot,
                object_key: None,
                checksum: None,
                local_copies: BTreeSet::from([1]),
            },
        },
    );
    ok(&mut s, Command::TrimManifest { shard: k, below: 0 });
    // Snapshots and `/meta/dump` are JSON, whose map keys must be strings: maps keyed by
    // shard are written as lists of pairs.
    let json = serde_json::to_vec(&s).expect("a state with shard-keyed maps serializes");
    let back: MetaState = serde_json::from_slice(&json).expect("and reads back");
    assert_eq!(back, s);
}

#[test]
fn a_snapshot_from_before_epochs_and_reports_still_loads() {
    let mut s = with_brokers(&[(1, true), (2, true), (3, true)]);
    create(&mut s, "q", settings(Consistency::Quorum, 3, 2));
    let mut json = serde_json::to_value(&s).expect("serialize");
    json.as_object_mut()
        .expect("object")
        .remove("replication")
        .expect("the state has a replication field");
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("epochs");
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(json.get_mut("placements").expect("placements"));
    assert!(!json.to_string().contains("epochs"));
    let old: MetaState = serde_json::from_value(json).expect("an old snapshot deserializes");
    assert!(old.replication.is_empty());
    assert_eq!(old.placements.len(), 2);
    assert!(old.placements.values().all(|p| p.epochs.is_empty()));
    assert_eq!(old.placements.values().next().unwrap().epoch_end(1), None);

    // Older still: shard-keyed maps were JSON objects (always empty: a non-empty one could
    // not be written).
    let older = serde_json::json!({
        "tenants": {"t": ["n"]},
        "streams": {},
        "brokers": {},
        "placements": {},
        "manifests": {},
        "next_producer_id": 0,
        "features": {}
    });
    let older: MetaState = serde_json::from_value(older).expect("an older snapshot loads");
    assert!(older.placements.is_empty() && older.manifest_floors.is_empty());
}

// --- failover decisions ------------------------------------------------------------------

fn views(f: impl Fn(u64) -> LeaseView + 'static) -> Box<dyn Fn(u64) -> LeaseView> {
    Box::new(f)
}

#[test]
fn a_broker_whose_lease_lapsed_is_marked_dead_and_one_that_renews_alive() {
    let s = with_brokers(&[(1, true), (2, false), (3, true)]);
    let view = views(|b| match b {
        1 => LeaseView::Lapsed,
        2 => LeaseView::Holds,
        _ => LeaseView::Holds,
    });
    assert_eq!(
        decide(&s, &*view),
        vec![
            Command::SetBrokerAlive {
                id: 1,
                alive: false
            },
            Command::SetBrokerAlive { id: 2, alive: true },
        ]
    );
}

#[test]
fn a_quorum_shard_is_promoted_to_the_lowest_live_in_sync_replica() {
    let mut s = with_brokers(&[(1, true), (2, true), (3, true), (4, true)]);
    create(&mut s, "q", settings(Consistency::Quorum, 3, 1));
    let k = shard("q", 0);
    ok(
        &mut s,
        Command::SetPlacement {
            shard: k.clone(),
            replicas: vec![3, 1, 2],
            leader: Some(3),
        },
    );
    let generation = s.placements[&k].generation;
    // 1 is the lowest replica but is not in sync: 2 is the choice.
    ok(&mut s, report(&k, generation, 40, &[3, 2]));
    let view = views(|b| {
        if b == 3 {
            LeaseView::Lapsed
        } else {
            LeaseView::Holds
        }
    });
    let cmds = decide(&s, &*view);
    assert_eq!(
        cmds,
        vec![
            Command::SetBrokerAlive {
                id: 3,
                alive: false
            },
            Command::SetPlacement {
                shard: k.clone(),
                replicas: vec![3, 1, 2],
                leader: Some(2),
            },
        ]
    );
    for c in &cmds {
        ok(&mut s, c.clone());
    }
    let p = &s.placements[&k];
    assert_eq!(p.leader, Some(2));
    assert_eq!(p.epoch_start(p.generation), Some(40));
    assert!(decide(&s, &*view).is_empty(), "nothing more to do");

    // The new leader dies too, and no other replica is in sync: nobody is promoted.
    let view = views(|b| {
        if b == 3 || b == 2 {
            LeaseView::Lapsed
        } else {
            LeaseView::Holds
        }
    });
    assert_eq!(
        decide(&s, &*view),
        vec![Command::SetBrokerAlive {
            id: 2,
            alive: false
        }]
    );
}

#[test]
fn a_leader_acknowledged_shard_is_never_promoted() {
    let mut s = with_brokers(&[(1, true), (2, true), (3, true)]);
    create(&mut s, "l", settings(Consistency::Leader, 3, 1));
    let k = shard("l", 0);
    let leader = s.placements[&k].leader.expect("leader");
    ok(
        &mut s,
        Command::SetBrokerAlive {
            id: leader,
            alive: false,
        },
    );
    let view = views(move |b| {
        if b == leader {
            LeaseView::Lapsed
        } else {
            LeaseView::Holds
        }
    });
    assert!(decide(&s, &*view).is_empty());
}

#[test]
fn an_ephemeral_shard_is_taken_over_at_once_by_a_live_broker() {
    let mut s = with_brokers(&[(1, true), (2, true), (3, true)]);
    create(
        &mut s,
        "memory",
        StreamSettings {
            durability: Durability::Ephemeral,
            ..StreamSettings::default()
        },
    );
    let k = shard("memory", 0);
    let leader = s.placements[&k].leader.expect("leader");
    let view = views(move |b| {
        if b == leader {
            LeaseView::Lapsed
        } else {
            LeaseView::Holds
        }
    });
    // Unlike a Leader durable shard, it does not wait for its broker: the decision that
    // marks the leader dead also hands the shard to a live broker.
    let alive: Vec<u64> = [1, 2, 3].into_iter().filter(|b| *b != leader).collect();
    let successor = MetaState::spread(&k, 1, &alive)[0];
    let cmds = decide(&s, &*view);
    assert_eq!(
        cmds,
        vec![
            Command::SetBrokerAlive {
                id: leader,
                alive: false
            },
            Command::SetPlacement {
                shard: k.clone(),
                replicas: vec![successor],
                leader: Some(successor),
            },
        ]
    );
    for c in &cmds {
        ok(&mut s, c.clone());
    }
    let p = &s.placements[&k];
    assert_eq!((p.leader, p.generation), (Some(successor), 2));
    assert!(decide(&s, &*view).is_empty(), "nothing more to do");

    // Judged by a meta leader that cannot tell yet, nothing moves.
    let unknown = views(|_| LeaseView::Unknown);
    ok(
        &mut s,
        Command::SetBrokerAlive {
            id: successor,
            alive: false,
        },
    );
    assert!(decide(&s, &*unknown).is_empty());
}

#[test]
fn an_unknown_lease_view_changes_nothing() {
    let mut s = with_brokers(&[(1, true), (2, true), (3, true)]);
    create(&mut s, "q", settings(Consistency::Quorum, 3, 2));
    // Marked dead by an earlier meta leader; this one cannot judge leases yet.
    let leader = s.placements[&shard("q", 0)].leader.expect("leader");
    ok(
        &mut s,
        Command::SetBrokerAlive {
            id: leader,
            alive: false,
        },
    );
    let view = views(|_| LeaseView::Unknown);
    assert!(decide(&s, &*view).is_empty());
}

#[test]
fn an_unplaced_shard_is_placed_as_create_would_have() {
    let mut s = with_brokers(&[]);
    create(&mut s, "early", settings(Consistency::Quorum, 3, 2));
    for id in [5, 6, 7] {
        ok(
            &mut s,
            Command::RegisterBroker {
                broker: broker(id, true),
            },
        );
    }
    let view = views(|_| LeaseView::Unknown);
    let cmds = decide(&s, &*view);
    assert_eq!(cmds.len(), 2);
    for (i, c) in cmds.iter().enumerate() {
        let replicas = MetaState::spread(&shard("early", i as u32), 3, &[5, 6, 7]);
        assert_eq!(
            c,
            &Command::SetPlacement {
                shard: shard("early", i as u32),
                leader: replicas.first().copied(),
                replicas,
            }
        );
        ok(&mut s, c.clone());
    }
    let p = &s.placements[&shard("early", 0)];
    assert_eq!(p.generation, 1);
    assert_eq!(
        p.epochs,
        vec![EpochStart {
            generation: 1,
            start_offset: 0
        }]
    );
}

/// Every refusal survives the trip between brokers: a non-leader relays the leader's answer
/// as JSON, and the client must get the same typed error the leader would have given.
/// A deleted durable stream's name stays reserved until a broker reports its objects gone
/// (a stream created under it would write objects under the same keys); the reservation
/// is state, so it survives a crash of the broker that was removing them. An ephemeral
/// stream has no objects and frees its name at once.
#[test]
fn a_deleted_durable_streams_name_stays_reserved_until_its_objects_are_gone() {
    let mut s = with_brokers(&[(1, true)]);
    create(&mut s, "gone", settings(Consistency::Leader, 1, 1));
    let delete = Command::DeleteStream {
        tenant: "t".into(),
        namespace: "n".into(),
        name: "gone".into(),
    };
    ok(&mut s, delete.clone());
    assert!(s.deleting_objects.contains("t/n/gone"));
    let again = Command::CreateStream {
        tenant: "t".into(),
        namespace: "n".into(),
        name: "gone".into(),
        settings: settings(Consistency::Leader, 1, 1),
    };
    assert_eq!(
        s.apply(&again),
        Err(CommandError::BeingDeleted {
            name: "t/n/gone".into()
        })
    );
    // The reservation is part of the state a snapshot carries.
    let restored: MetaState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert!(restored.deleting_objects.contains("t/n/gone"));

    let done = Command::ObjectsDeleted {
        tenant: "t".into(),
        namespace: "n".into(),
        name: "gone".into(),
    };
    ok(&mut s, done.clone());
    ok(&mut s, done);
    assert!(s.deleting_objects.is_empty());
    ok(&mut s, again);

    let mut ephemeral = settings(Consistency::Leader, 1, 1);
    ephemeral.durability = Durability::Ephemeral;
    create(&mut s, "live", ephemeral);
    ok(
        &mut s,
        Command::DeleteStream {
            tenant: "t".into(),
            namespace: "n".into(),
            name: "live".into(),
        },
    );
    assert!(s.deleting_objects.is_empty());
}

#[test]
fn every_command_refusal_round_trips_as_json() {
    let refusals = [
        CommandError::AlreadyExists {
            kind: "stream".into(),
            name: "t/ns/s".into(),
        },
        CommandError::NotFound {
            kind: "tenant".into(),
            name: "t".into(),
        },
        CommandError::VersionConflict {
            expected: 3,
            actual: 4,
        },
        CommandError::NotEmpty {
            kind: "namespace".into(),
            name: "t/ns".into(),
        },
        CommandError::Invalid("stream name \"bad%name\" is not allowed".into()),
        CommandError::StaleGeneration {
            shard: "t/ns/s/0".into(),
            given: 1,
            current: 2,
        },
        CommandError::BeingDeleted {
            name: "t/ns/s".into(),
        },
    ];
    for refusal in refusals {
        let result: felix_meta::types::CommandResult = Err(refusal.clone());
        let json = serde_json::to_string(&result)
            .unwrap_or_else(|e| panic!("{refusal:?} does not serialize: {e}"));
        let back: felix_meta::types::CommandResult = serde_json::from_str(&json).unwrap();
        assert_eq!(back, Err(refusal), "{json}");
    }
}
