//! Where a cluster client sends each shard's requests: to the shard's leader as the last
//! topology (or a `not_leader` answer naming the leader) said, at the address the broker
//! list gives for it.
//!
//! Invariant: a route names a leader only when both its id and an address are known and the
//! broker list does not mark it dead; otherwise the shard reads as having no leader, and the
//! caller waits and refreshes rather than sending to a broker that cannot take the request.
//! Every change to a stream's routes bumps its version, so concurrent callers that failed on
//! the same routes refresh them once.

use std::collections::HashMap;

pub use felix_wire::protocol::{BrokerRoute, ShardRoute};

use crate::StreamKey;

/// A stream's shards and who leads them, and the cluster's brokers, as one broker reported
/// them ([`crate::Connection::topology`]).
///
/// ```
/// use felix_client::{BrokerRoute, ShardRoute, Topology};
/// let topology = Topology::new(
///     vec![ShardRoute { shard: 0, leader: Some(2), leader_addr: None, generation: 4, replicas: vec![1, 2, 3] }],
///     vec![BrokerRoute { id: 2, client_addr: "10.0.0.2:5000".into(), alive: true }],
/// );
/// assert_eq!(topology.shard_count(), 1);
/// assert_eq!(topology.leader(0), Some((2, "10.0.0.2:5000".to_string())));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// One route per shard, in shard order.
    pub shards: Vec<ShardRoute>,
    /// Every broker of the cluster, with its client address and whether it is alive.
    pub brokers: Vec<BrokerRoute>,
}

impl Topology {
    /// A topology from a broker's answer (shards sorted by number).
    pub fn new(mut shards: Vec<ShardRoute>, brokers: Vec<BrokerRoute>) -> Topology {
        shards.sort_by_key(|s| s.shard);
        Topology { shards, brokers }
    }

    /// How many shards the stream has (one past the highest shard listed).
    pub fn shard_count(&self) -> u32 {
        self.shards.iter().map(|s| s.shard + 1).max().unwrap_or(0)
    }

    /// The route of one shard.
    pub fn shard(&self, shard: u32) -> Option<&ShardRoute> {
        self.shards.iter().find(|s| s.shard == shard)
    }

    /// A broker of the list.
    pub fn broker(&self, id: u64) -> Option<&BrokerRoute> {
        self.brokers.iter().find(|b| b.id == id)
    }

    /// The leader of `shard` and the address to reach it (the broker list's, else the
    /// shard's `leader_addr`); `None` while the shard has no leader, or its leader is
    /// listed as dead or has no known address.
    pub fn leader(&self, shard: u32) -> Option<(u64, String)> {
        let route = self.shard(shard)?;
        let id = route.leader?;
        match self.broker(id) {
            Some(b) if !b.alive => None,
            Some(b) => Some((id, b.client_addr.clone())),
            None => route.leader_addr.clone().map(|addr| (id, addr)),
        }
    }
}

/// Where one shard's requests go now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// The leader and its address.
    Leader { broker: u64, addr: String },
    /// The shard has no reachable leader now (electing, or its leader is down).
    NoLeader,
    /// The stream has fewer shards.
    NoShard { shards: u32 },
}

#[derive(Debug, Default)]
struct StreamRoutes {
    shards: Vec<ShardRoute>,
    version: u64,
}

/// The cluster client's routing table: per stream, each shard's leader; per broker, its
/// address and liveness.
#[derive(Debug, Default)]
pub(crate) struct RouteTable {
    streams: HashMap<StreamKey, StreamRoutes>,
    brokers: HashMap<u64, BrokerRoute>,
    /// Source of version numbers, never reused (also across a forget).
    versions: u64,
}

impl RouteTable {
    fn next_version(&mut self) -> u64 {
        self.versions += 1;
        self.versions
    }

    /// The version of a stream's routes; `None` when the stream is not known yet.
    pub(crate) fn version(&self, key: &StreamKey) -> Option<u64> {
        self.streams.get(key).map(|s| s.version)
    }

    /// Replaces a stream's routes with a fresh topology and updates the broker list.
    pub(crate) fn apply_topology(&mut self, key: &StreamKey, topology: &Topology) {
        for b in &topology.brokers {
            self.brokers.insert(b.id, b.clone());
        }
        let version = self.next_version();
        self.streams.insert(
            key.clone(),
            StreamRoutes {
                shards: topology.shards.clone(),
                version,
            },
        );
    }

    /// Records what a `not_leader` answer said: `leader` leads `shard` now (at `addr`, when
    /// given). The broker is taken to be alive: it just answered someone.
    pub(crate) fn apply_hint(
        &mut self,
        key: &StreamKey,
        shard: u32,
        leader: u64,
        addr: Option<&str>,
    ) {
        if let Some(addr) = addr {
            self.learn_broker(leader, addr);
        } else if let Some(b) = self.brokers.get_mut(&leader) {
            b.alive = true;
        }
        let version = self.next_version();
        let Some(routes) = self.streams.get_mut(key) else {
            return;
        };
        routes.version = version;
        match routes.shards.iter_mut().find(|s| s.shard == shard) {
            Some(route) => {
                route.leader = Some(leader);
                if addr.is_some() {
                    route.leader_addr = addr.map(str::to_owned);
                }
            }
            None => routes.shards.push(ShardRoute {
                shard,
                leader: Some(leader),
                leader_addr: addr.map(str::to_owned),
                generation: 0,
                replicas: Vec::new(),
            }),
        }
    }

    /// Records a broker's address (from a connection to it, or a hint), taking it to be
    /// alive.
    pub(crate) fn learn_broker(&mut self, id: u64, addr: &str) {
        self.brokers.insert(
            id,
            BrokerRoute {
                id,
                client_addr: addr.to_owned(),
                alive: true,
            },
        );
    }

    /// Forgets a stream's routes (deleted, or re-created with another shape).
    pub(crate) fn forget(&mut self, key: &StreamKey) {
        self.streams.remove(key);
    }

    /// How many shards a known stream has.
    pub(crate) fn shard_count(&self, key: &StreamKey) -> Option<u32> {
        let routes = self.streams.get(key)?;
        Some(routes.shards.iter().map(|s| s.shard + 1).max().unwrap_or(0))
    }

    /// Where `shard`'s requests go; `None` when the stream is not known yet.
    pub(crate) fn route(&self, key: &StreamKey, shard: u32) -> Option<Route> {
        let routes = self.streams.get(key)?;
        let shards = routes.shards.iter().map(|s| s.shard + 1).max().unwrap_or(0);
        if shard >= shards {
            return Some(Route::NoShard { shards });
        }
        let Some(route) = routes.shards.iter().find(|s| s.shard == shard) else {
            return Some(Route::NoLeader);
        };
        let Some(id) = route.leader else {
            return Some(Route::NoLeader);
        };
        let addr = match self.brokers.get(&id) {
            Some(b) if !b.alive => return Some(Route::NoLeader),
            Some(b) => Some(b.client_addr.clone()),
            None => route.leader_addr.clone(),
        };
        Some(match addr {
            Some(addr) => Route::Leader { broker: id, addr },
            None => Route::NoLeader,
        })
    }

    /// The brokers not known to be dead, by id.
    pub(crate) fn live_brokers(&self) -> Vec<(u64, String)> {
        let mut live: Vec<(u64, String)> = self
            .brokers
            .values()
            .filter(|b| b.alive)
            .map(|b| (b.id, b.client_addr.clone()))
            .collect();
        live.sort();
        live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> StreamKey {
        ("t".into(), "n".into(), "s".into())
    }

    fn shard(shard: u32, leader: Option<u64>) -> ShardRoute {
        ShardRoute {
            shard,
            leader,
            leader_addr: leader.map(|id| format!("10.0.0.{id}:5000")),
            generation: 1,
            replicas: vec![1, 2, 3],
        }
    }

    fn broker(id: u64, alive: bool) -> BrokerRoute {
        BrokerRoute {
            id,
            client_addr: format!("broker-{id}:5000"),
            alive,
        }
    }

    fn three_brokers(shards: Vec<ShardRoute>) -> Topology {
        Topology::new(
            shards,
            vec![broker(1, true), broker(2, true), broker(3, true)],
        )
    }

    fn leader(id: u64) -> Route {
        Route::Leader {
            broker: id,
            addr: format!("broker-{id}:5000"),
        }
    }

    #[test]
    fn a_shard_routes_to_its_leader_at_the_broker_lists_address() {
        let mut table = RouteTable::default();
        assert_eq!(table.route(&key(), 0), None, "unknown stream");
        table.apply_topology(
            &key(),
            &three_brokers(vec![shard(1, Some(3)), shard(0, Some(2))]),
        );
        assert_eq!(table.shard_count(&key()), Some(2));
        assert_eq!(table.route(&key(), 0), Some(leader(2)));
        assert_eq!(table.route(&key(), 1), Some(leader(3)));
        assert_eq!(table.route(&key(), 2), Some(Route::NoShard { shards: 2 }));
    }

    #[test]
    fn a_shard_without_a_leader_or_with_a_dead_one_has_no_route() {
        let mut table = RouteTable::default();
        let topology = Topology::new(
            vec![shard(0, None), shard(1, Some(2)), shard(3, Some(1))],
            vec![broker(1, true), broker(2, false)],
        );
        table.apply_topology(&key(), &topology);
        assert_eq!(table.route(&key(), 0), Some(Route::NoLeader));
        assert_eq!(table.route(&key(), 1), Some(Route::NoLeader), "dead leader");
        assert_eq!(
            table.route(&key(), 2),
            Some(Route::NoLeader),
            "missing shard"
        );
        assert_eq!(table.route(&key(), 3), Some(leader(1)));
        assert_eq!(topology.leader(1), None);
        assert_eq!(topology.leader(3), Some((1, "broker-1:5000".into())));
        assert_eq!(table.live_brokers(), vec![(1, "broker-1:5000".into())]);
    }

    #[test]
    fn a_leader_missing_from_the_broker_list_is_reached_at_its_leader_addr() {
        let mut table = RouteTable::default();
        table.apply_topology(&key(), &Topology::new(vec![shard(0, Some(7))], vec![]));
        assert_eq!(
            table.route(&key(), 0),
            Some(Route::Leader {
                broker: 7,
                addr: "10.0.0.7:5000".into()
            })
        );
    }

    #[test]
    fn a_not_leader_hint_reroutes_the_shard_and_bumps_the_version() {
        let mut table = RouteTable::default();
        table.apply_topology(
            &key(),
            &three_brokers(vec![shard(0, Some(1)), shard(1, Some(1))]),
        );
        let before = table.version(&key()).unwrap();
        table.apply_hint(&key(), 0, 2, None);
        assert_eq!(table.route(&key(), 0), Some(leader(2)));
        assert_eq!(table.route(&key(), 1), Some(leader(1)), "other shards stay");
        assert!(table.version(&key()).unwrap() > before);

        table.apply_hint(&key(), 1, 9, Some("10.9.9.9:5000"));
        assert_eq!(
            table.route(&key(), 1),
            Some(Route::Leader {
                broker: 9,
                addr: "10.9.9.9:5000".into()
            })
        );
        assert!(table.live_brokers().contains(&(9, "10.9.9.9:5000".into())));
    }

    #[test]
    fn a_hint_revives_a_broker_marked_dead() {
        let mut table = RouteTable::default();
        let topology = Topology::new(
            vec![shard(0, Some(1))],
            vec![broker(1, true), broker(2, false)],
        );
        table.apply_topology(&key(), &topology);
        table.apply_hint(&key(), 0, 2, None);
        assert_eq!(table.route(&key(), 0), Some(leader(2)));
    }

    #[test]
    fn a_fresh_topology_replaces_hints_and_forget_drops_the_stream() {
        let mut table = RouteTable::default();
        table.apply_topology(&key(), &three_brokers(vec![shard(0, Some(1))]));
        table.apply_hint(&key(), 0, 2, None);
        let hinted = table.version(&key()).unwrap();
        table.apply_topology(&key(), &three_brokers(vec![shard(0, Some(3))]));
        assert_eq!(table.route(&key(), 0), Some(leader(3)));
        assert!(table.version(&key()).unwrap() > hinted);
        table.forget(&key());
        assert_eq!(table.version(&key()), None);
        assert_eq!(table.route(&key(), 0), None);
        assert_eq!(table.live_brokers().len(), 3, "brokers stay");
    }
}
