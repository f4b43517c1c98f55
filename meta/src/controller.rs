//! Failover: what the meta leader does about brokers that stop renewing their leases and
//! shards whose leader died.
//!
//! The decisions are a pure function of the applied state and the leader's view of each
//! broker's lease ([`decide`]); the task around it ([`spawn`]) runs on every node but acts
//! only on the Raft leader once it has been ready in its term (applied its whole log once),
//! and proposes what `decide` returns, plus the shard moves of `drain.rs`. A refused
//! proposal is normal (the state moved on since the decision) and is retried next tick if
//! it still applies.
//!
//! The invariants it keeps:
//! * A broker is marked dead only when this leader judges its lease lapsed, which it does
//!   only after waiting out every lease an earlier leader may have granted; it is marked
//!   alive again as soon as it holds a lease.
//! * A shard's leader is replaced only when its broker is recorded dead **and** its lease
//!   has lapsed, so the old leader has stopped serving (its own lease ended first) before
//!   another broker is told to lead.
//! * The replacement of a quorum shard's leader holds every acknowledged record: it is in
//!   the last replication report's in-sync set (the state machine refuses anything else).
//!   A leader-acknowledged shard is never given a new leader, since only the old leader is
//!   sure to hold what it acknowledged.
//! * An ephemeral shard keeps nothing, so it has nothing a new leader could lack: once its
//!   leader is dead with a lapsed lease, any live broker takes it over in the same decision
//!   (the one [`MetaState::spread`] picks), without waiting for the old broker to return.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::handle::MetaHandle;
use crate::model::{
    Command, Consistency, Durability, MetaState, ShardKey, placed_replicas, stream_key,
};

/// Most commands proposed per tick; the rest follow on the next ticks.
const MAX_COMMANDS_PER_TICK: usize = 1024;
/// Shortest interval between two decisions.
const MIN_TICK: Duration = Duration::from_millis(100);

/// The meta leader's judgement of one broker's shard-leader lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseView {
    /// The broker holds a lease this leader granted.
    Holds,
    /// The broker holds no lease: this leader has led for a whole lease duration (so no
    /// earlier leader's grant can still run) and granted none that still runs.
    Lapsed,
    /// Cannot tell yet: this leader was elected less than a lease duration ago and the
    /// broker has not renewed with it.
    Unknown,
}

/// What the controller would do about `state`, in order: liveness changes first, then
/// placements of unplaced shards, then leader changes.
///
/// * An alive broker whose lease `Lapsed` is marked dead; a dead one that `Holds` a lease
///   is marked alive. `Unknown` changes nothing.
/// * An unplaced shard is placed on the live brokers by [`MetaState::spread`], as
///   `CreateStream` would have (no lease can exist for a shard that never had a leader, so
///   this needs no judgement of leases).
/// * A shard whose leader is dead with a lapsed lease, or that has no leader, gets the
///   live replica with the lowest id as its leader, on a quorum stream only, and among
///   the in-sync replicas when records have been acknowledged. A leader-acknowledged
///   stream's shard is left alone, unless it has never had a leader. An ephemeral shard
///   moves to a live broker at once, replicas and all (it has one).
pub fn decide(state: &MetaState, lease_view: &dyn Fn(u64) -> LeaseView) -> Vec<Command> {
    plan(state, lease_view).commands
}

/// A decision, with the shards that need a new leader and cannot get one (for logging).
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub commands: Vec<Command>,
    pub stuck: Vec<(ShardKey, &'static str)>,
}

pub(crate) fn plan(state: &MetaState, lease_view: &dyn Fn(u64) -> LeaseView) -> Plan {
    plan_with(state, lease_view, &BTreeSet::new())
}

/// [`plan`], with the brokers dead for longer than the replace delay, whose follower
/// replicas are moved to live brokers (`drain.rs`).
pub(crate) fn plan_with(
    state: &MetaState,
    lease_view: &dyn Fn(u64) -> LeaseView,
    replace: &BTreeSet<u64>,
) -> Plan {
    let mut plan = Plan::default();
    // Liveness as it will be once this decision's liveness changes are applied.
    let mut alive = BTreeSet::new();
    for b in state.brokers.values() {
        let now_alive = match (b.alive, lease_view(b.id)) {
            (true, LeaseView::Lapsed) => false,
            (false, LeaseView::Holds) => true,
            (was, _) => was,
        };
        if now_alive != b.alive {
            plan.commands.push(Command::SetBrokerAlive {
                id: b.id,
                alive: now_alive,
            });
        }
        if now_alive {
            alive.insert(b.id);
        }
    }
    let alive_list: Vec<u64> = alive.iter().copied().collect();

    if !alive_list.is_empty() {
        for s in state.streams.values() {
            for shard in 0..s.settings.shards {
                let key = ShardKey {
                    tenant: s.tenant.clone(),
                    namespace: s.namespace.clone(),
                    stream: s.name.clone(),
                    shard,
                };
                if state.placements.contains_key(&key) {
                    continue;
                }
                let replicas =
                    state.spread_in_zones(&key, placed_replicas(&s.settings), &alive_list);
                plan.commands.push(Command::SetPlacement {
                    leader: replicas.first().copied(),
                    replicas,
                    shard: key,
                });
            }
        }
    }

    for (key, p) in &state.placements {
        let Some(stream) = state
            .streams
            .get(&stream_key(&key.tenant, &key.namespace, &key.stream))
        else {
            continue;
        };
        let leaderless = match p.leader {
            Some(l) => !alive.contains(&l) && lease_view(l) == LeaseView::Lapsed,
            None => true,
        };
        if !leaderless {
            continue;
        }
        if stream.settings.durability == Durability::Ephemeral {
            // Nothing to lose: any live broker will do, and waiting for the old one would
            // keep the shard's publishers and subscribers apart meanwhile.
            match MetaState::spread(key, 1, &alive_list).first() {
                Some(&b) => plan.commands.push(Command::SetPlacement {
                    shard: key.clone(),
                    replicas: vec![b],
                    leader: Some(b),
                }),
                None => plan
                    .stuck
                    .push((key.clone(), "no live broker to take it over")),
            }
            continue;
        }
        if stream.settings.consistency == Consistency::Leader
            && (p.leader.is_some() || p.generation > 0)
        {
            plan.stuck.push((
                key.clone(),
                "leader-acknowledged stream: only its last leader surely holds every \
                 acknowledged record, so no other replica is promoted",
            ));
            continue;
        }
        let acknowledged = state.replication.get(key).filter(|r| r.committed > 0);
        let candidate = p
            .replicas
            .iter()
            .copied()
            .filter(|b| Some(*b) != p.leader && alive.contains(b))
            .filter(|b| acknowledged.is_none_or(|r| r.in_sync.contains(b)))
            .min();
        match candidate {
            Some(c) => plan.commands.push(Command::SetPlacement {
                shard: key.clone(),
                replicas: p.replicas.clone(),
                leader: Some(c),
            }),
            None => plan.stuck.push((
                key.clone(),
                "no live replica holds every acknowledged record",
            )),
        }
    }
    // Planned moves last: a failover above decides first where a leader is dead.
    plan.commands
        .extend(crate::drain::plan_moves(state, &alive, replace));
    plan
}

/// Starts the controller task on this node; it ends when `stop` turns true (or its
/// sender is dropped). It decides every tenth of a lease (at least every 100 ms), and only
/// while this node is the Raft leader and ready.
pub(crate) fn spawn(
    handle: MetaHandle,
    mut stop: watch::Receiver<bool>,
    replace_after: Duration,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let period = (handle.lease_duration() / 10).max(MIN_TICK);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Shards already reported as stuck, so each is logged once, not every tick.
        let mut reported: BTreeSet<ShardKey> = BTreeSet::new();
        // When this leader first saw each broker recorded dead (forgotten on a leader change:
        // a new leader waits the whole delay again, which only delays a replacement).
        let mut dead_since: BTreeMap<u64, Instant> = BTreeMap::new();
        // Dead brokers whose replicas are being replaced (logged once each).
        let mut replacing: BTreeSet<u64> = BTreeSet::new();
        // The term in which this node, leading, was last seen ready. A busy leader's log
        // nearly always holds an entry not yet applied (the shard leaders' replication
        // reports), so `is_ready` alone would starve the controller under a Quorum load;
        // once ready in its term, a leader decides on its applied state, and the state
        // machine checks every proposal again.
        let mut ready_term: Option<u64> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let term = handle.current_term();
            if handle.is_leader() && handle.is_ready() {
                ready_term = Some(term);
            }
            if !(handle.is_leader() && ready_term == Some(term)) {
                ready_term = None;
                reported.clear();
                dead_since.clear();
                continue;
            }
            let now = Instant::now();
            let dead: Vec<u64> = handle.local(|s| {
                s.brokers
                    .values()
                    .filter(|b| !b.alive)
                    .map(|b| b.id)
                    .collect()
            });
            dead_since.retain(|b, _| dead.contains(b));
            for b in dead {
                dead_since.entry(b).or_insert(now);
            }
            let replace: BTreeSet<u64> = dead_since
                .iter()
                .filter(|(_, t)| now.duration_since(**t) >= replace_after)
                .map(|(b, _)| *b)
                .collect();
            for b in replace.difference(&replacing) {
                warn!(
                    broker = b,
                    after = ?replace_after,
                    "broker dead past the replace delay: moving its follower replicas to live brokers"
                );
            }
            replacing = replace.clone();
            let leases = handle.leases();
            let view = |b: u64| {
                if leases.holds(b, now) {
                    LeaseView::Holds
                } else if leases.may_reassign(now) {
                    LeaseView::Lapsed
                } else {
                    LeaseView::Unknown
                }
            };
            let Plan {
                mut commands,
                stuck,
            } = handle.local(|s| plan_with(s, &view, &replace));

            let stuck_now: BTreeSet<ShardKey> = stuck.iter().map(|(k, _)| k.clone()).collect();
            for (shard, why) in &stuck {
                if !reported.contains(shard) {
                    info!(%shard, "shard has no live leader and none can be promoted: {why}");
                }
            }
            reported = stuck_now;

            if commands.is_empty() {
                continue;
            }
            if commands.len() > MAX_COMMANDS_PER_TICK {
                commands.truncate(MAX_COMMANDS_PER_TICK);
            }
            let proposals = commands.into_iter().map(|cmd| {
                let handle = handle.clone();
                async move {
                    let r = handle.propose(cmd.clone()).await;
                    (cmd, r)
                }
            });
            let results = tokio::select! {
                r = futures::future::join_all(proposals) => r,
                _ = stop.wait_for(|s| *s) => return,
            };
            for (cmd, r) in results {
                match r {
                    Ok(_) => match &cmd {
                        Command::SetBrokerAlive { id, alive } => {
                            if *alive {
                                info!(broker = id, "broker holds a lease again: marked alive");
                            } else {
                                warn!(broker = id, "broker's lease lapsed: marked dead");
                            }
                        }
                        Command::SetPlacement { shard, leader, .. } => {
                            info!(%shard, leader = ?leader, "shard leader assigned");
                        }
                        Command::StartMove { shard, from, to } => {
                            info!(%shard, from, to, "shard move started (drain or replacement)");
                        }
                        Command::AddReplica { shard, to } => {
                            info!(%shard, to, "replica added to an under-replicated shard");
                        }
                        Command::CancelMove { shard } => {
                            warn!(%shard, "shard move rolled back: its destination is down");
                        }
                        _ => {}
                    },
                    Err(e)
                        if matches!(
                            cmd,
                            Command::StartMove { .. }
                                | Command::AddReplica { .. }
                                | Command::CancelMove { .. }
                        ) =>
                    {
                        info!(command = ?cmd, error = %e, "shard move proposal refused")
                    }
                    Err(e) => debug!(command = ?cmd, error = %e, "failover proposal refused"),
                }
            }
        }
    })
}
