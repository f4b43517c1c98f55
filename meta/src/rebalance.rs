//! Rebalancing: which shard moves spread leaders and replicas evenly over the live brokers.
//!
//! Decides a plan as a pure function of the applied state ([`plan_rebalance`]); `felixctl
//! cluster rebalance` shows it and then starts its moves a few at a time. The plan first
//! evens out leaderships (a move of the leader's replica to the broker with the fewest
//! leaders, when that broker holds no replica of the shard yet), then replicas (a follower's
//! replica moved from the fullest broker to the emptiest one), until every live,
//! non-draining broker is within one of the others by count.
//!
//! The invariant: every planned move is one the state machine would accept on the state it
//! was planned from (a live destination outside the replica set, a source inside it, no move
//! of the shard under way), and the plan ends: each step narrows the gap between the
//! fullest and the emptiest broker, and no move puts two of a shard's replicas in one zone
//! where they were in distinct ones (`model/zones.rs`). Bytes are not weighed yet
//! (docs/shard-moves.md).

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{MetaState, ShardKey};

/// One planned move: `shard`'s replica on `from` goes to `to` (leadership with it when
/// `from` leads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMove {
    pub shard: ShardKey,
    pub from: u64,
    pub to: u64,
}

/// Most moves one plan holds.
const MAX_PLAN: usize = 1024;

/// The moves that even out leaders, then replicas, over the live non-draining brokers.
pub fn plan_rebalance(state: &MetaState) -> Vec<PlannedMove> {
    let brokers: BTreeSet<u64> = state
        .brokers
        .values()
        .filter(|b| b.alive && !b.draining)
        .map(|b| b.id)
        .collect();
    if brokers.len() < 2 {
        return Vec::new();
    }
    // The placements as they will be once the planned moves are made.
    let mut placements: BTreeMap<&ShardKey, (Vec<u64>, Option<u64>)> = state
        .placements
        .iter()
        .filter(|(_, p)| p.moving.is_none() && p.replicas.iter().all(|r| brokers.contains(r)))
        .map(|(k, p)| (k, (p.replicas.clone(), p.leader)))
        .collect();
    let mut plan = Vec::new();
    for leaders in [true, false] {
        while plan.len() < MAX_PLAN {
            let count = |b: u64| {
                placements
                    .values()
                    .filter(|(r, l)| {
                        if leaders {
                            *l == Some(b)
                        } else {
                            r.contains(&b)
                        }
                    })
                    .count()
            };
            let (Some(&most), Some(&least)) = (
                brokers
                    .iter()
                    .max_by_key(|b| (count(**b), std::cmp::Reverse(**b))),
                brokers.iter().min_by_key(|b| (count(**b), **b)),
            ) else {
                break;
            };
            if count(most) <= count(least) + 1 {
                break;
            }
            // A shard on `most` (led by it, when evening out leaders) that `least` does
            // not hold yet.
            // Never a move that puts two replicas in one zone where they were apart.
            let pick = placements.iter().find(|(_, (r, l))| {
                let others: Vec<u64> = r.iter().copied().filter(|b| *b != most).collect();
                !r.contains(&least)
                    && (!state.shares_zone(least, &others) || state.shares_zone(most, &others))
                    && if leaders {
                        *l == Some(most)
                    } else {
                        r.contains(&most) && *l != Some(most)
                    }
            });
            let Some((key, _)) = pick else { break };
            let key = (*key).clone();
            let entry = placements.get_mut(&key).expect("picked from the map");
            for r in entry.0.iter_mut() {
                if *r == most {
                    *r = least;
                }
            }
            if entry.1 == Some(most) {
                entry.1 = Some(least);
            }
            plan.push(PlannedMove {
                shard: key,
                from: most,
                to: least,
            });
        }
    }
    plan
}
