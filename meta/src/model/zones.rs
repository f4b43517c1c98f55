//! Failure domains: which zone a broker is in, and choosing brokers so a shard's replicas
//! sit in distinct zones.
//!
//! Decides the order of preference when brokers are chosen for a shard (a new placement, a
//! drain's or a rebalance's destination, a dead broker's replacement): a broker whose zone
//! none of the shard's other replicas is in comes first; a broker without a zone is a zone
//! of its own, so a cluster that names no zones is placed exactly as before. The invariant:
//! zones only reorder candidates that are valid anyway, so a shard is never left short of
//! replicas because the zones ran out; the choice is a pure function of the replicated
//! state, the same on every node.

use std::collections::BTreeSet;

use super::state::MetaState;

/// Longest zone name.
pub const MAX_ZONE_LEN: usize = 64;

/// A zone name is 1 to [`MAX_ZONE_LEN`] characters of `[A-Za-z0-9._-]`.
pub fn check_zone(zone: &str) -> Result<(), String> {
    let ok = !zone.is_empty()
        && zone.len() <= MAX_ZONE_LEN
        && zone
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "zone {zone:?} must be 1-{MAX_ZONE_LEN} characters of [A-Za-z0-9._-]"
        ))
    }
}

/// What a broker counts as for spreading: its zone, or itself when it names none.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Domain {
    Zone(String),
    Broker(u64),
}

impl MetaState {
    /// The failure domain of broker `id`.
    pub(crate) fn domain(&self, id: u64) -> Domain {
        match self.brokers.get(&id).and_then(|b| b.zone.clone()) {
            Some(zone) => Domain::Zone(zone),
            None => Domain::Broker(id),
        }
    }

    /// Whether placing a replica on `candidate` would put it in a zone one of `others`
    /// (the shard's other replicas) is in already.
    pub fn shares_zone(&self, candidate: u64, others: &[u64]) -> bool {
        let d = self.domain(candidate);
        others
            .iter()
            .any(|o| *o != candidate && self.domain(*o) == d)
    }

    /// Picks `n` of `candidates` (in their order of preference): first each candidate whose
    /// zone is not yet taken, then the rest in order, so zones spread as far as they go and
    /// the count never falls short.
    pub(crate) fn pick_in_zones(&self, candidates: &[u64], n: usize) -> Vec<u64> {
        let mut chosen = Vec::with_capacity(n);
        let mut taken = BTreeSet::new();
        for &c in candidates {
            if chosen.len() == n {
                return chosen;
            }
            if taken.insert(self.domain(c)) {
                chosen.push(c);
            }
        }
        for &c in candidates {
            if chosen.len() == n {
                break;
            }
            if !chosen.contains(&c) {
                chosen.push(c);
            }
        }
        chosen
    }
}
