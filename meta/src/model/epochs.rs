//! Leader generations, the epochs they begin, and the shard leaders' replication reports:
//! the two facts failover rests on.
//!
//! Decides whether a placement change is allowed and where the new generation's log begins.
//! A leader change bumps the shard's generation and starts an epoch at the shard's quorum
//! mark (the last [`Replication`] report's `committed`); a leader's report is taken only for
//! the current generation, only with a majority in sync including the leader, and only if
//! the quorum mark does not go down. The invariant: on a quorum stream with acknowledged
//! records, a leader change is refused unless the new leader is one of the replicas known
//! to hold every acknowledged record, so no acknowledged record is lost to a failover.

use std::collections::BTreeSet;

use super::command::Applied;
use super::errors::{CommandError, missing};
use super::names::ShardKey;
use super::settings::Consistency;
use super::state::{EpochStart, MetaState, Placement, Replication};

impl Placement {
    /// The replicas a Quorum shard's majority is counted over: all of them, but a move's
    /// destination until it leads (it joins the in-sync set once it holds the mark, and a
    /// hand-over or the move's end needs it there). So adding a replica while another is
    /// down never needs more live copies than before the move.
    pub fn voters(&self) -> Vec<u64> {
        match self.moving {
            Some(m) if self.leader != Some(m.to) => self
                .replicas
                .iter()
                .copied()
                .filter(|b| *b != m.to)
                .collect(),
            _ => self.replicas.clone(),
        }
    }

    /// Where generation `generation` began, if it is recorded.
    pub fn epoch_start(&self, generation: u64) -> Option<u64> {
        self.epochs
            .iter()
            .find(|e| e.generation == generation)
            .map(|e| e.start_offset)
    }

    /// Where generation `generation` ended: the start of the first later generation.
    /// `None` while no later generation exists (the generation is still current). A
    /// follower whose log was written in `generation` keeps it only below this offset.
    pub fn epoch_end(&self, generation: u64) -> Option<u64> {
        self.epochs
            .iter()
            .find(|e| e.generation > generation)
            .map(|e| e.start_offset)
    }

    /// Starts the next generation, led by `leader`, its epoch beginning at `start`; returns
    /// the new generation.
    pub(super) fn lead_from(&mut self, leader: u64, start: u64) -> u64 {
        self.generation += 1;
        self.leader = Some(leader);
        self.epochs.push(EpochStart {
            generation: self.generation,
            start_offset: start,
        });
        self.generation
    }
}

impl MetaState {
    /// [`Command::SetPlacement`](super::Command::SetPlacement): sets a shard's replica set
    /// and leader.
    pub(super) fn set_placement(
        &mut self,
        shard: &ShardKey,
        replicas: &[u64],
        leader: Option<u64>,
    ) -> Result<Applied, CommandError> {
        let stream = self.require_shard(shard)?;
        if replicas.is_empty() {
            return Err(CommandError::Invalid(
                "a shard needs at least one replica".into(),
            ));
        }
        let distinct: BTreeSet<_> = replicas.iter().collect();
        if distinct.len() != replicas.len() {
            return Err(CommandError::Invalid(
                "replica set lists a broker twice".into(),
            ));
        }
        if let Some(b) = replicas.iter().find(|b| !self.brokers.contains_key(b)) {
            return Err(missing("broker", b.to_string()));
        }
        if let Some(l) = leader
            && !replicas.contains(&l)
        {
            return Err(CommandError::Invalid(
                "the leader must be one of the replicas".into(),
            ));
        }
        let quorum = stream.settings.consistency == Consistency::Quorum;
        let current = self.placements.get(shard);
        let new_leader = leader.filter(|l| current.is_none_or(|p| p.leader != Some(*l)));
        let report = self.replication.get(shard);
        if let Some(l) = new_leader
            && quorum
            && let Some(r) = report
            && r.committed > 0
            && !r.in_sync.contains(&l)
        {
            return Err(CommandError::Invalid(format!(
                "broker {l} does not hold every acknowledged record of {shard} \
                 (in sync below {}: {:?})",
                r.committed, r.in_sync
            )));
        }
        let committed = report.map_or(0, |r| r.committed);
        let entry = self.placements.entry(shard.clone()).or_insert(Placement {
            replicas: Vec::new(),
            leader: None,
            generation: 0,
            epochs: Vec::new(),
            moving: None,
        });
        if let Some(l) = new_leader {
            entry.lead_from(l, committed);
        }
        entry.replicas = replicas.to_vec();
        entry.leader = leader;
        let generation = entry.generation;
        if let Some(r) = self.replication.get_mut(shard) {
            match new_leader {
                // A new generation: only its leader is known to be in sync.
                Some(l) => {
                    r.generation = generation;
                    r.in_sync = BTreeSet::from([l]);
                }
                // A broker taken out of the replica set holds no copy that counts.
                None => r.in_sync.retain(|b| replicas.contains(b)),
            }
        }
        Ok(Applied::Generation { generation })
    }

    /// [`Command::ReportReplicas`](super::Command::ReportReplicas): records a shard leader's
    /// quorum mark and in-sync replicas.
    pub(super) fn report_replicas(
        &mut self,
        shard: &ShardKey,
        generation: u64,
        committed: u64,
        in_sync: &BTreeSet<u64>,
    ) -> Result<Applied, CommandError> {
        let placement = self
            .placements
            .get(shard)
            .filter(|p| p.generation == generation)
            .ok_or_else(|| CommandError::StaleGeneration {
                shard: shard.to_string(),
                given: generation,
                current: self.placements.get(shard).map_or(0, |p| p.generation),
            })?;
        let invalid = |m: String| Err(CommandError::Invalid(m));
        match placement.leader {
            Some(l) if in_sync.contains(&l) => {}
            Some(l) => return invalid(format!("{shard}: the leader {l} is not in sync")),
            None => return invalid(format!("{shard} has no leader")),
        }
        if let Some(b) = in_sync.iter().find(|b| !placement.replicas.contains(b)) {
            return invalid(format!("{shard}: broker {b} is not a replica"));
        }
        let voters = placement.voters();
        let majority = voters.len() / 2 + 1;
        let voting = in_sync.iter().filter(|b| voters.contains(b)).count();
        if voting < majority {
            return invalid(format!(
                "{shard}: {voting} in-sync replicas are fewer than a majority of {voters:?}"
            ));
        }
        if let Some(r) = self.replication.get(shard)
            && committed < r.committed
        {
            return invalid(format!(
                "{shard}: the quorum mark never goes down ({committed} < {})",
                r.committed
            ));
        }
        self.replication.insert(
            shard.clone(),
            Replication {
                generation,
                committed,
                in_sync: in_sync.clone(),
            },
        );
        Ok(Applied::Done)
    }
}
