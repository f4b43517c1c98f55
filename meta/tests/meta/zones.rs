//! Zones (`model/zones.rs`): a shard's replicas go to distinct zones where there are
//! enough, on placement, on a drain and on a rebalance; without zones nothing changes.

use std::collections::BTreeSet;

use felix_meta::drain::plan_moves;
use felix_meta::model::{Command, Consistency, MetaState, check_zone};

use super::moves::{complete, create, key, ok, state};

/// Brokers 1..=6 in zones a, a, b, b, c, c.
fn zoned() -> MetaState {
    let mut s = state(&[1, 2, 3, 4, 5, 6]);
    for id in 1..=6u64 {
        let mut b = s.brokers[&id].clone();
        b.zone = Some(["a", "b", "c"][((id - 1) / 2) as usize].to_owned());
        ok(&mut s, Command::RegisterBroker { broker: b });
    }
    s
}

fn zones_of(s: &MetaState, replicas: &[u64]) -> BTreeSet<String> {
    replicas
        .iter()
        .map(|r| s.brokers[r].zone.clone().expect("zoned"))
        .collect()
}

#[test]
fn new_shards_put_their_replicas_in_distinct_zones_and_keep_their_leaders() {
    let mut s = zoned();
    create(&mut s, "z", Consistency::Quorum, 12);
    let mut leaders = BTreeSet::new();
    for shard in 0..12 {
        let p = &s.placements[&key("z", shard)];
        assert_eq!(p.replicas.len(), 3);
        assert_eq!(
            zones_of(&s, &p.replicas).len(),
            3,
            "shard {shard}: {:?} in three zones",
            p.replicas
        );
        // The leader is the one zone-less placement would pick: zones do not move leaders.
        let plain = MetaState::spread(&key("z", shard), 3, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(p.leader, plain.first().copied(), "shard {shard}");
        leaders.insert(p.leader.unwrap());
    }
    assert!(leaders.len() > 3, "leaders still spread: {leaders:?}");
}

#[test]
fn without_zones_placement_is_unchanged_and_too_few_zones_still_fill_the_replica_set() {
    let mut plain = state(&[1, 2, 3, 4]);
    create(&mut plain, "p", Consistency::Quorum, 8);
    for shard in 0..8 {
        assert_eq!(
            plain.placements[&key("p", shard)].replicas,
            MetaState::spread(&key("p", shard), 3, &[1, 2, 3, 4]),
        );
    }
    // Two zones for three replicas: both zones used, and still three replicas.
    let mut s = state(&[1, 2, 3, 4]);
    for id in 1..=4u64 {
        let mut b = s.brokers[&id].clone();
        b.zone = Some(if id <= 2 { "a" } else { "b" }.to_owned());
        ok(&mut s, Command::RegisterBroker { broker: b });
    }
    create(&mut s, "two", Consistency::Quorum, 8);
    for shard in 0..8 {
        let r = &s.placements[&key("two", shard)].replicas;
        assert_eq!(r.len(), 3);
        assert_eq!(zones_of(&s, r).len(), 2, "{r:?}");
    }
}

#[test]
fn a_drain_moves_a_replica_to_a_zone_the_shard_is_not_in() {
    let mut s = zoned();
    create(&mut s, "d", Consistency::Quorum, 6);
    let k = key("d", 0);
    let p = s.placements[&k].clone();
    let from = *p.replicas.iter().find(|r| Some(**r) != p.leader).unwrap();
    ok(
        &mut s,
        Command::SetBrokerDraining {
            id: from,
            draining: true,
        },
    );
    let alive: BTreeSet<u64> = (1..=6).collect();
    let plan = plan_moves(&s, &alive, &BTreeSet::new());
    let to = plan
        .iter()
        .find_map(|c| match c {
            Command::StartMove { shard, to, .. } if *shard == k => Some(*to),
            _ => None,
        })
        .expect("the drain moves shard 0's replica");
    let others: Vec<u64> = p.replicas.iter().copied().filter(|r| *r != from).collect();
    assert!(
        !s.shares_zone(to, &others),
        "destination {to} shares a zone with {others:?}"
    );
    complete(&mut s, &k, from, to);
    assert_eq!(zones_of(&s, &s.placements[&k].replicas).len(), 3);
}

#[test]
fn a_rebalance_keeps_every_shard_in_distinct_zones() {
    let mut s = zoned();
    // Broker 6 joins late (draining while the stream is created), then is let take work.
    ok(
        &mut s,
        Command::SetBrokerDraining {
            id: 6,
            draining: true,
        },
    );
    create(&mut s, "r", Consistency::Leader, 12);
    ok(
        &mut s,
        Command::SetBrokerDraining {
            id: 6,
            draining: false,
        },
    );
    let plan = felix_meta::rebalance::plan_rebalance(&s);
    assert!(!plan.is_empty(), "broker 6 gets work");
    for m in &plan {
        complete(&mut s, &m.shard, m.from, m.to);
    }
    assert!(s.broker_load(6).0 > 0);
    for shard in 0..12 {
        let r = &s.placements[&key("r", shard)].replicas;
        assert_eq!(zones_of(&s, r).len(), 3, "shard {shard}: {r:?}");
    }
}

#[test]
fn a_zone_name_is_checked() {
    assert!(check_zone("eu-west-1a").is_ok());
    for bad in ["", "a b", "../x", &"z".repeat(65)] {
        assert!(check_zone(bad).is_err(), "{bad:?}");
    }
}
