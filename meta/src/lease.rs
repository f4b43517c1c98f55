//! Shard-leader leases: how long a broker may act as a shard's leader without hearing from
//! the control plane.
//!
//! No wall-clock time is ever replicated. The meta leader keeps grants in memory on its own
//! monotonic clock; a broker counts its lease from the moment it *sent* the renewal, on its
//! own monotonic clock, so the broker's view always ends no later than the leader's. A newly
//! elected meta leader knows nothing of the grants its predecessor made, so it waits one
//! full lease duration after taking office before it may reassign any shard: by then every
//! lease the old leader granted has lapsed on the broker's side too.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The leader-side table of grants.
#[derive(Debug)]
pub struct LeaseTable {
    duration: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// When this node last became meta leader; `None` while it is not leader.
    leader_since: Option<Instant>,
    /// Broker → when its lease was last renewed (leader's clock).
    grants: HashMap<u64, Instant>,
}

/// Why a renewal was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("this node is not the metadata leader")]
    NotLeader,
}

impl LeaseTable {
    pub fn new(duration: Duration) -> LeaseTable {
        LeaseTable {
            duration,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The lease duration.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// Records a leadership change of this node (from the Raft metrics). Losing leadership
    /// forgets every grant; gaining it starts the wait before any reassignment.
    pub fn set_leader(&self, is_leader: bool, now: Instant) {
        let mut inner = self.inner.lock();
        match (is_leader, inner.leader_since) {
            (true, None) => inner.leader_since = Some(now),
            (false, Some(_)) => {
                inner.leader_since = None;
                inner.grants.clear();
            }
            _ => {}
        }
    }

    /// Renews `broker`'s lease at `now`; returns the duration granted.
    pub fn renew(&self, broker: u64, now: Instant) -> Result<Duration, LeaseError> {
        let mut inner = self.inner.lock();
        if inner.leader_since.is_none() {
            return Err(LeaseError::NotLeader);
        }
        inner.grants.insert(broker, now);
        Ok(self.duration)
    }

    /// Whether `broker` holds a lease at `now`, by this leader's grants.
    pub fn holds(&self, broker: u64, now: Instant) -> bool {
        let inner = self.inner.lock();
        inner
            .grants
            .get(&broker)
            .is_some_and(|at| now.saturating_duration_since(*at) < self.duration)
    }

    /// Whether this leader may reassign shards at `now`: it must have led for a whole lease
    /// duration, so no lease granted by an earlier leader can still be running.
    pub fn may_reassign(&self, now: Instant) -> bool {
        let inner = self.inner.lock();
        inner
            .leader_since
            .is_some_and(|since| now.saturating_duration_since(since) >= self.duration)
    }

    /// Whether `broker`'s lease may be considered lapsed at `now` so its shards can move:
    /// the leader has waited out its predecessors' grants and holds none for the broker.
    pub fn lapsed(&self, broker: u64, now: Instant) -> bool {
        self.may_reassign(now) && !self.holds(broker, now)
    }
}

/// The broker-side view of its own lease.
#[derive(Debug, Clone, Copy)]
pub struct BrokerLease {
    /// When the renewal that produced this lease was sent (broker's clock).
    pub sent_at: Instant,
    pub duration: Duration,
}

impl BrokerLease {
    /// Whether the lease still holds at `now`.
    pub fn valid_at(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.sent_at) < self.duration
    }
    /// Time left at `now`.
    pub fn remaining(&self, now: Instant) -> Duration {
        self.duration
            .saturating_sub(now.saturating_duration_since(self.sent_at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(10);

    #[test]
    fn only_a_leader_grants_leases() {
        let t = LeaseTable::new(D);
        let now = Instant::now();
        assert_eq!(t.renew(1, now), Err(LeaseError::NotLeader));
        t.set_leader(true, now);
        assert_eq!(t.renew(1, now), Ok(D));
        assert!(t.holds(1, now + D / 2));
        assert!(!t.holds(1, now + D));
    }

    #[test]
    fn a_new_leader_waits_a_full_lease_before_reassigning() {
        let t = LeaseTable::new(D);
        let start = Instant::now();
        t.set_leader(true, start);
        assert!(!t.may_reassign(start));
        assert!(
            !t.lapsed(7, start + D / 2),
            "a predecessor's grant may still run"
        );
        assert!(t.may_reassign(start + D));
        assert!(
            t.lapsed(7, start + D),
            "no grant from this leader and the wait is over"
        );
        t.renew(7, start + D).unwrap();
        assert!(!t.lapsed(7, start + D + D / 2));
    }

    #[test]
    fn losing_leadership_forgets_grants_and_restarts_the_wait() {
        let t = LeaseTable::new(D);
        let start = Instant::now();
        t.set_leader(true, start);
        t.renew(1, start).unwrap();
        t.set_leader(false, start + D / 4);
        assert!(!t.holds(1, start + D / 4));
        t.set_leader(true, start + D * 3);
        assert!(!t.may_reassign(start + D * 3 + D / 2));
    }

    #[test]
    fn a_broker_counts_its_lease_from_when_it_sent_the_renewal() {
        let sent = Instant::now();
        let lease = BrokerLease {
            sent_at: sent,
            duration: D,
        };
        assert!(lease.valid_at(sent + D - Duration::from_millis(1)));
        assert!(!lease.valid_at(sent + D));
        assert_eq!(lease.remaining(sent + D * 2), Duration::ZERO);
    }
}
