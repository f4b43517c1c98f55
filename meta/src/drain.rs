//! Draining brokers and rolling back stuck moves: the moves the controller starts itself.
//!
//! Decides, as a pure function of the applied state and which brokers are alive
//! ([`plan_moves`]), which shard moves to start or cancel on this controller tick:
//!
//! * a move whose destination is dead is cancelled (rolled back before its hand-over; the
//!   source still holds everything), unless the destination leads already;
//! * every follower replica on a broker dead for longer than the replace delay
//!   (`replace`) is moved to a live broker, so the cluster returns to full replication
//!   without a person (a Leader stream's shard the dead broker leads stays: only it holds
//!   what it acknowledged);
//! * every replica on a draining broker is moved to the live, non-draining broker that
//!   holds none of that shard, in a zone its other replicas are not in if there is one,
//!   and then holds the fewest replicas, at most [`MAX_MOVES`] moves at a
//!   time across the cluster, so a drain does not flood the leaders with catch-up reads;
//! * a shard holding fewer replicas than its stream asks for (placed while brokers were
//!   down: a new shard goes on the live brokers only) whose leader is alive gets a replica
//!   added on such a broker (`Command::AddReplica`), within the same limit, so it returns
//!   to full replication once enough brokers are back.
//!
//! The invariant: the controller only proposes; the state machine (`model/moves.rs`)
//! checks every step again, so a decision made on a stale view is refused, not applied.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Command, MetaState};

/// Most moves under way at once, cluster-wide, that the controller starts for drains.
pub const MAX_MOVES: usize = 4;

/// The moves to start or cancel now (see the module's top).
pub fn plan_moves(
    state: &MetaState,
    alive: &BTreeSet<u64>,
    replace: &BTreeSet<u64>,
) -> Vec<Command> {
    let mut commands = Vec::new();
    let mut under_way = 0;
    for (key, p) in &state.placements {
        let Some(m) = p.moving else { continue };
        if !alive.contains(&m.to) && p.leader != Some(m.to) {
            commands.push(Command::CancelMove { shard: key.clone() });
        } else {
            under_way += 1;
        }
    }
    let draining: BTreeSet<u64> = state
        .brokers
        .values()
        .filter(|b| b.draining || (replace.contains(&b.id) && !alive.contains(&b.id)))
        .map(|b| b.id)
        .collect();
    if under_way >= MAX_MOVES {
        return commands;
    }
    // Replicas per candidate destination, counting the moves started in this plan.
    let mut load: BTreeMap<u64, usize> = alive
        .iter()
        .filter(|b| !draining.contains(b))
        .map(|b| (*b, state.broker_load(*b).0))
        .collect();
    for (key, p) in &state.placements {
        if under_way >= MAX_MOVES {
            break;
        }
        if p.moving.is_some() {
            continue;
        }
        // Followers first would leave leaderships for last; any order is correct, and
        // the placement order is stable on every node.
        let Some(&from) = p.replicas.iter().find(|b| draining.contains(b)) else {
            // Under-replicated: topped up by its (live) leader, which copies to the new
            // replica as to a move's destination.
            let short = state
                .wanted_replicas(key)
                .is_some_and(|w| p.replicas.len() < w);
            if short && p.leader.is_some_and(|l| alive.contains(&l)) {
                let others = p.replicas.clone();
                if let Some((&to, _)) = load
                    .iter()
                    .filter(|(b, _)| !p.replicas.contains(b))
                    .min_by_key(|(b, n)| (state.shares_zone(**b, &others), **n, **b))
                {
                    *load.entry(to).or_default() += 1;
                    under_way += 1;
                    commands.push(Command::AddReplica {
                        shard: key.clone(),
                        to,
                    });
                }
            }
            continue;
        };
        // A leader must be alive to hand its shard over.
        if p.leader == Some(from) && !alive.contains(&from) {
            continue;
        }
        // Another zone than the shard's other replicas' first, then the emptiest.
        let others: Vec<u64> = p.replicas.iter().copied().filter(|b| *b != from).collect();
        let Some((&to, _)) = load
            .iter()
            .filter(|(b, _)| !p.replicas.contains(b))
            .min_by_key(|(b, n)| (state.shares_zone(**b, &others), **n, **b))
        else {
            continue;
        };
        *load.entry(to).or_default() += 1;
        under_way += 1;
        commands.push(Command::StartMove {
            shard: key.clone(),
            from,
            to,
        });
    }
    commands
}
