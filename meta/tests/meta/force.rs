//! `Command::ForceLeader` (`felixctl shard move --force`) on `MetaState::apply` directly:
//! what it refuses, and where the forced generation starts.

use felix_meta::model::{Applied, Command, CommandError, Consistency};

use super::moves::{create, key, ok, state};

#[test]
fn a_dead_leaders_shard_is_forced_onto_a_follower_from_its_copys_end() {
    let mut s = state(&[1, 2, 3]);
    create(&mut s, "l", Consistency::Leader, 1);
    create(&mut s, "q", Consistency::Quorum, 1);
    let k = key("l", 0);
    let p = s.placements[&k].clone();
    let leader = p.leader.unwrap();
    let f = *p.replicas.iter().find(|r| **r != leader).unwrap();
    let force = |generation, to, end| Command::ForceLeader {
        shard: k.clone(),
        generation,
        to,
        end,
    };
    let refused = |s: &mut felix_meta::model::MetaState, cmd: Command, why: &str| {
        let before = s.placements[&k].clone();
        match s.apply(&cmd) {
            Err(CommandError::Invalid(m)) => assert!(m.contains(why), "{m}"),
            other => panic!("{cmd:?}: expected a refusal naming {why:?}, got {other:?}"),
        }
        assert_eq!(s.placements[&k], before, "a refusal changes nothing");
    };
    refused(&mut s, force(p.generation, f, 40), "is alive");
    ok(
        &mut s,
        Command::SetBrokerAlive {
            id: leader,
            alive: false,
        },
    );
    refused(&mut s, force(p.generation, leader, 40), "already leads");
    let q = key("q", 0);
    let qp = s.placements[&q].clone();
    match s.apply(&Command::ForceLeader {
        shard: q.clone(),
        generation: qp.generation,
        to: *qp.replicas.iter().find(|r| Some(**r) != qp.leader).unwrap(),
        end: 0,
    }) {
        Err(CommandError::Invalid(m)) => assert!(m.contains("Quorum"), "{m}"),
        other => panic!("a Quorum shard is never forced: {other:?}"),
    }
    assert!(matches!(
        s.apply(&force(p.generation + 1, f, 40)),
        Err(CommandError::StaleGeneration { .. })
    ));
    match s.apply(&force(p.generation, f, 40)) {
        Ok(Applied::Generation { generation }) => assert_eq!(generation, p.generation + 1),
        other => panic!("forced: {other:?}"),
    }
    let now = &s.placements[&k];
    assert_eq!(now.leader, Some(f));
    assert_eq!(now.replicas, p.replicas, "the old leader stays a replica");
    let last = now.epochs.last().unwrap();
    assert_eq!((last.generation, last.start_offset), (p.generation + 1, 40));
    assert_eq!(
        now.epoch_end(p.generation),
        Some(40),
        "the old leader cuts its copy at 40 when it returns"
    );
}
