//! Forcing a Leader stream's shard onto a follower's copy when its leader is dead
//! (`felixctl shard move --force`): the operator accepts losing what the dead leader
//! acknowledged past the follower's copy, in exchange for the shard serving again.
//!
//! Decides where the forced generation starts: at the end of the promoted follower's own log
//! (the broker asks it before proposing), so its history is the shard's from there on; the
//! old leader, if it ever returns, cuts what it holds past that offset as a follower does
//! with any older generation's uncommitted records. The invariants: only a Leader stream is
//! forced (a Quorum stream fails over by itself to a replica holding every acknowledged
//! record, and never to one that does not); the new generation never starts below the mark
//! the control plane recorded as held (a hand-over's end), so nothing a previous hand-over
//! promised is dropped; the generation given must be current, so two forces race safely.

use super::command::Applied;
use super::errors::CommandError;
use super::names::ShardKey;
use super::settings::Consistency;
use super::state::MetaState;

impl MetaState {
    /// [`Command::ForceLeader`](super::Command::ForceLeader).
    pub(super) fn force_leader(
        &mut self,
        shard: &ShardKey,
        generation: u64,
        to: u64,
        end: u64,
    ) -> Result<Applied, CommandError> {
        let stream = self.require_shard(shard)?;
        if stream.settings.consistency == Consistency::Quorum {
            return Err(CommandError::Invalid(format!(
                "{shard} is a Quorum stream's shard: it fails over by itself to a replica \
                 holding every acknowledged record, never to one that does not"
            )));
        }
        let p = self
            .placements
            .get(shard)
            .ok_or_else(|| CommandError::Invalid(format!("{shard} is not placed")))?;
        if p.generation != generation {
            return Err(CommandError::StaleGeneration {
                shard: shard.to_string(),
                given: generation,
                current: p.generation,
            });
        }
        if !p.replicas.contains(&to) {
            return Err(CommandError::Invalid(format!(
                "broker {to} holds no copy of {shard} (replicas: {:?})",
                p.replicas
            )));
        }
        if p.leader == Some(to) {
            return Err(CommandError::Invalid(format!(
                "broker {to} already leads {shard}"
            )));
        }
        if let Some(l) = p.leader
            && self.brokers.get(&l).is_some_and(|b| b.alive)
        {
            return Err(CommandError::Invalid(format!(
                "{shard}'s leader, broker {l}, is alive: move it without --force"
            )));
        }
        let held = self.replication.get(shard).map_or(0, |r| r.committed);
        if end < held {
            return Err(CommandError::Invalid(format!(
                "broker {to}'s copy of {shard} ends at {end}, below offset {held} the shard \
                 was recorded holding: choose a replica that holds it"
            )));
        }
        let p = self.placements.get_mut(shard).expect("checked above");
        p.moving = None;
        let generation = p.lead_from(to, end);
        if let Some(r) = self.replication.get_mut(shard) {
            r.generation = generation;
            r.in_sync = std::collections::BTreeSet::from([to]);
        }
        Ok(Applied::Generation { generation })
    }
}
