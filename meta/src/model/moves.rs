//! Shard moves: how a shard's replica set changes on a live cluster, one step at a time.
//!
//! Decides which replica-set changes are allowed and in what order. A move of a shard's
//! replica from broker `from` to broker `to` is three commands:
//!
//! 1. [`Command::StartMove`]: `to` joins the replica set and catches up from the leader's log
//!    (a new replica's log starts after the uploaded history, so it copies only what the
//!    leader keeps hot). The move is recorded in the placement ([`Placement::moving`]), so
//!    every broker sees it.
//! 2. If `from` leads, [`Command::HandOver`]: proposed by the fenced leader once `to` holds
//!    its whole log; `to` leads the next generation, which starts at that log's end.
//! 3. [`Command::FinishMove`]: `from` leaves the replica set. [`Command::CancelMove`] instead
//!    rolls a move back before its hand-over (`to` leaves).
//!
//! [`Command::AddReplica`] tops up a shard holding fewer replicas than its stream asks for
//! (placed while brokers were down): step 1 without a source, then step 3 removing nobody.
//!
//! The invariants: a shard has at most one move at a time; a hand-over never starts a
//! generation below the shard's quorum mark, and on a Quorum stream only hands the shard to
//! a replica the last report counts in sync at the very end of the old leader's log; nothing
//! a generation acknowledged is therefore left behind.

use super::command::{Applied, Command};
use super::errors::{CommandError, missing};
use super::names::ShardKey;
use super::settings::{Consistency, Durability};
use super::state::{MetaState, Placement, ShardMove};

fn invalid<T>(m: String) -> Result<T, CommandError> {
    Err(CommandError::Invalid(m))
}

impl MetaState {
    /// Applies the move commands (see the module's top).
    pub(super) fn apply_move(&mut self, cmd: &Command) -> Result<Applied, CommandError> {
        match cmd {
            Command::StartMove { shard, from, to } => self.start_move(shard, *from, *to),
            Command::AddReplica { shard, to } => self.add_replica(shard, *to),
            Command::HandOver {
                shard,
                generation,
                to,
                end,
            } => self.hand_over(shard, *generation, *to, *end),
            Command::FinishMove { shard, generation } => self.finish_move(shard, *generation),
            Command::CancelMove { shard } => self.cancel_move(shard),
            Command::SetBrokerDraining { id, draining } => {
                let b = self
                    .brokers
                    .get_mut(id)
                    .ok_or_else(|| missing("broker", id.to_string()))?;
                b.draining = *draining;
                Ok(Applied::Done)
            }
            other => invalid(format!("not a move command: {other:?}")),
        }
    }

    /// Forgets broker `id` if it is stopped and holds nothing (see [`Command::RemoveBroker`]).
    pub(super) fn remove_broker(&mut self, id: u64) -> Result<Applied, CommandError> {
        let b = self
            .brokers
            .get(&id)
            .ok_or_else(|| missing("broker", id.to_string()))?;
        if b.alive {
            return invalid(format!(
                "broker {id} is alive: drain it, stop it, then remove it"
            ));
        }
        let held: Vec<String> = self
            .placements
            .iter()
            .filter(|(_, p)| {
                p.replicas.contains(&id)
                    || p.leader == Some(id)
                    || p.moving.is_some_and(|m| m.from == id || m.to == id)
            })
            .map(|(k, _)| k.to_string())
            .take(5)
            .collect();
        if !held.is_empty() {
            return invalid(format!(
                "broker {id} still holds replicas (e.g. {}): drain it first, or wait for the \
                 controller to replace them",
                held.join(", ")
            ));
        }
        self.brokers.remove(&id);
        Ok(Applied::Done)
    }

    fn placement_of(&self, shard: &ShardKey) -> Result<&Placement, CommandError> {
        self.require_shard(shard)?;
        self.placements
            .get(shard)
            .ok_or_else(|| CommandError::Invalid(format!("shard {shard} is not placed yet")))
    }

    /// Whether broker `to` may take a new replica of `shard`, whose replicas are `replicas`:
    /// a registered broker, alive, not draining, holding none of it yet.
    fn check_destination(
        &self,
        shard: &ShardKey,
        replicas: &[u64],
        to: u64,
    ) -> Result<(), CommandError> {
        if replicas.contains(&to) {
            return invalid(format!("broker {to} already holds a replica of {shard}"));
        }
        match self.brokers.get(&to) {
            None => Err(missing("broker", to.to_string())),
            Some(b) if !b.alive => invalid(format!("broker {to} is not alive")),
            Some(b) if b.draining => invalid(format!("broker {to} is draining")),
            Some(_) => Ok(()),
        }
    }

    fn start_move(
        &mut self,
        shard: &ShardKey,
        from: u64,
        to: u64,
    ) -> Result<Applied, CommandError> {
        let ephemeral = self.require_shard(shard)?.settings.durability == Durability::Ephemeral;
        let p = self.placement_of(shard)?;
        if let Some(m) = p.moving {
            return Err(CommandError::MoveInProgress {
                shard: shard.to_string(),
                from: m.from,
                to: m.to,
            });
        }
        if !p.replicas.contains(&from) {
            return invalid(format!("broker {from} holds no replica of {shard}"));
        }
        self.check_destination(shard, &p.replicas, to)?;
        let generation = p.generation;
        let p = self.placements.get_mut(shard).expect("checked above");
        if ephemeral {
            // An ephemeral shard keeps nothing to copy: it moves in one step, as a
            // takeover does (records not yet delivered on the old leader are gone).
            p.generation += 1;
            p.replicas = vec![to];
            p.leader = Some(to);
            return Ok(Applied::Generation {
                generation: p.generation,
            });
        }
        p.replicas.push(to);
        p.moving = Some(ShardMove { from, to });
        Ok(Applied::Generation { generation })
    }

    fn hand_over(
        &mut self,
        shard: &ShardKey,
        generation: u64,
        to: u64,
        end: u64,
    ) -> Result<Applied, CommandError> {
        let quorum = self.require_shard(shard)?.settings.consistency == Consistency::Quorum;
        let p = self.placement_of(shard)?;
        if p.generation != generation {
            return Err(CommandError::StaleGeneration {
                shard: shard.to_string(),
                given: generation,
                current: p.generation,
            });
        }
        match p.moving {
            Some(m) if m.to == to && p.leader == Some(m.from) => {}
            _ => {
                return invalid(format!(
                    "{shard} has no move from its leader to broker {to} under way"
                ));
            }
        }
        let report = self.replication.get(shard);
        let committed = report.map_or(0, |r| r.committed);
        if end < committed {
            return invalid(format!(
                "{shard}: a hand-over at {end} would start below the quorum mark {committed}"
            ));
        }
        if quorum && !report.is_some_and(|r| r.committed == end && r.in_sync.contains(&to)) {
            return invalid(format!(
                "{shard}: broker {to} is not recorded in sync at offset {end}"
            ));
        }
        let p = self.placements.get_mut(shard).expect("checked above");
        let generation = p.lead_from(to, end);
        // Unlike a failover, the in-sync set stays: every replica in it holds the whole old
        // log up to `end`, where the new generation starts, so if the new leader dies before
        // its first report, failover can still promote one of them.
        if let Some(r) = self.replication.get_mut(shard) {
            r.generation = generation;
        }
        Ok(Applied::Generation { generation })
    }

    fn finish_move(&mut self, shard: &ShardKey, generation: u64) -> Result<Applied, CommandError> {
        let quorum = self.require_shard(shard)?.settings.consistency == Consistency::Quorum;
        let p = self.placement_of(shard)?;
        if p.generation != generation {
            return Err(CommandError::StaleGeneration {
                shard: shard.to_string(),
                given: generation,
                current: p.generation,
            });
        }
        let Some(m) = p.moving else {
            return invalid(format!("{shard} has no move under way"));
        };
        // An addition has no source to hand over; its destination may lead already (a
        // failover promoted it once recorded in sync), and it finishes all the same.
        if !m.adds() && p.leader == Some(m.from) {
            return invalid(format!(
                "{shard}: broker {} still leads; it hands over first",
                m.from
            ));
        }
        let acknowledged = self.replication.get(shard).filter(|r| r.committed > 0);
        if quorum && acknowledged.is_some_and(|r| !r.in_sync.contains(&m.to)) {
            return invalid(format!(
                "{shard}: broker {} does not hold every acknowledged record yet",
                m.to
            ));
        }
        let p = self.placements.get_mut(shard).expect("checked above");
        p.moving = None;
        if m.adds() {
            return Ok(Applied::Done);
        }
        p.replicas.retain(|b| *b != m.from);
        if let Some(r) = self.replication.get_mut(shard) {
            r.in_sync.remove(&m.from);
        }
        Ok(Applied::Done)
    }

    /// How many replicas `shard` should have: its stream's setting (one if ephemeral).
    pub fn wanted_replicas(&self, shard: &ShardKey) -> Option<usize> {
        self.streams
            .get(&super::names::stream_key(
                &shard.tenant,
                &shard.namespace,
                &shard.stream,
            ))
            .map(|s| super::placement::placed_replicas(&s.settings) as usize)
    }

    fn add_replica(&mut self, shard: &ShardKey, to: u64) -> Result<Applied, CommandError> {
        self.require_shard(shard)?;
        let wanted = self.wanted_replicas(shard).unwrap_or(0);
        let p = self.placement_of(shard)?;
        if let Some(m) = p.moving {
            return Err(CommandError::MoveInProgress {
                shard: shard.to_string(),
                from: m.from,
                to: m.to,
            });
        }
        if p.replicas.len() >= wanted {
            return invalid(format!(
                "{shard} holds {} replicas, as many as its stream asks for",
                p.replicas.len()
            ));
        }
        self.check_destination(shard, &p.replicas, to)?;
        let p = self.placements.get_mut(shard).expect("checked above");
        p.replicas.push(to);
        p.moving = Some(ShardMove { from: to, to });
        Ok(Applied::Generation {
            generation: p.generation,
        })
    }

    fn cancel_move(&mut self, shard: &ShardKey) -> Result<Applied, CommandError> {
        let p = self.placement_of(shard)?;
        let Some(m) = p.moving else {
            return invalid(format!("{shard} has no move under way"));
        };
        if p.leader == Some(m.to) {
            return invalid(format!(
                "{shard}: broker {} leads already; the move can only finish",
                m.to
            ));
        }
        let p = self.placements.get_mut(shard).expect("checked above");
        p.replicas.retain(|b| *b != m.to);
        p.moving = None;
        if let Some(r) = self.replication.get_mut(shard) {
            r.in_sync.remove(&m.to);
        }
        Ok(Applied::Done)
    }

    /// How many shard replicas and leaderships each broker holds: (replicas, leaders).
    pub fn broker_load(&self, id: u64) -> (usize, usize) {
        let replicas = self
            .placements
            .values()
            .filter(|p| p.replicas.contains(&id))
            .count();
        let leaders = self
            .placements
            .values()
            .filter(|p| p.leader == Some(id))
            .count();
        (replicas, leaders)
    }
}
