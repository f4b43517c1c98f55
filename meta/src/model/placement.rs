//! Where a new shard goes.
//!
//! Decides the replica set and first leader of a shard when its stream is created or grows
//! ([`MetaState::spread`]), and how many brokers a shard is placed on. The invariant: the
//! choice depends only on the replicated state (the live brokers, by id, and their zones:
//! `zones.rs`) and a fixed hash of the shard's name, so every node computes the same
//! placement and a stream's shards spread their leaders over the brokers. Moving a shard later (failover) is the controller's job.

use super::names::{ShardKey, stream_key};
use super::settings::{Durability, StreamSettings};
use super::state::{EpochStart, MetaState, Placement};

/// How many brokers a stream's shard is placed on. A durable shard has its replica set;
/// an ephemeral shard keeps nothing to copy, so it is placed on one broker, its leader:
/// publishers and subscribers meet there, whichever broker they reached.
pub fn placed_replicas(settings: &StreamSettings) -> u32 {
    match settings.durability {
        Durability::Durable => settings.replicas,
        Durability::Ephemeral => 1,
    }
}

/// 64-bit FNV-1a: a fixed hash, so placement is the same on every node and every build
/// (std's hasher is randomly seeded).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl MetaState {
    /// Where a new shard goes: `replicas` consecutive brokers of `alive` (sorted by id;
    /// fewer if there are fewer brokers), starting at a stable hash of the stream plus
    /// the shard number, so a stream's shards spread their leaders over the brokers and
    /// every node computes the same answer. The first is the leader. Empty if `alive` is.
    pub fn spread(shard: &ShardKey, replicas: u32, alive: &[u64]) -> Vec<u64> {
        let ring = Self::ring(shard, alive);
        ring.into_iter().take(replicas as usize).collect()
    }

    /// [`MetaState::spread`] with the brokers' zones: the same first broker (the leader),
    /// then the next ones around the ring whose zones are not taken yet, then the rest.
    /// Without zones, the same answer as `spread`.
    pub fn spread_in_zones(&self, shard: &ShardKey, replicas: u32, alive: &[u64]) -> Vec<u64> {
        self.pick_in_zones(&Self::ring(shard, alive), replicas as usize)
    }

    /// `alive` sorted by id and rotated to start at a stable hash of the stream plus the
    /// shard number.
    fn ring(shard: &ShardKey, alive: &[u64]) -> Vec<u64> {
        let mut sorted = alive.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let n = sorted.len();
        if n == 0 {
            return sorted;
        }
        let key = stream_key(&shard.tenant, &shard.namespace, &shard.stream);
        let start =
            (fnv1a(key.as_bytes()).wrapping_add(u64::from(shard.shard)) % n as u64) as usize;
        sorted.rotate_left(start);
        sorted
    }

    /// The brokers recorded alive, by id.
    pub fn alive_brokers(&self) -> Vec<u64> {
        self.brokers
            .values()
            .filter(|b| b.alive)
            .map(|b| b.id)
            .collect()
    }

    /// Places the given shards of a stream on the live brokers (generation 1, led by the
    /// first replica). Without a live broker they stay unplaced, for the failover controller
    /// to place once one registers.
    pub(super) fn place_new_shards(
        &mut self,
        tenant: &str,
        namespace: &str,
        name: &str,
        shards: std::ops::Range<u32>,
    ) {
        let Some(settings) = self
            .streams
            .get(&stream_key(tenant, namespace, name))
            .map(|s| &s.settings)
        else {
            return;
        };
        let replicas = placed_replicas(settings);
        // A draining broker takes nothing new, unless every live broker drains.
        let mut alive = self.alive_brokers();
        let open: Vec<u64> = alive
            .iter()
            .copied()
            .filter(|b| !self.brokers.get(b).is_some_and(|b| b.draining))
            .collect();
        if !open.is_empty() {
            alive = open;
        }
        if alive.is_empty() {
            return;
        }
        for shard in shards {
            let key = ShardKey {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                stream: name.to_owned(),
                shard,
            };
            let chosen = self.spread_in_zones(&key, replicas, &alive);
            self.placements.insert(
                key,
                Placement {
                    leader: chosen.first().copied(),
                    replicas: chosen,
                    generation: 1,
                    epochs: vec![EpochStart {
                        generation: 1,
                        start_offset: 0,
                    }],
                    moving: None,
                },
            );
        }
    }
}
