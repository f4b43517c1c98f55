//! How a group consumer's poll spreads its budget over the stream's shards: which shards
//! get a poll and how many records each asks for.
//!
//! Decides the per-shard asks only (no I/O). The invariants: the asks of a round that does
//! not wait never add up to more than the budget (what `max` leaves after the records ready
//! and the polls outstanding), so a consumer does not claim more than it asked for; and
//! every such ask is a shard's whole share of a poll, `max` divided over the shards,
//! never a remainder. Why whole shares: a remainder (34 of a budget of 100 over three
//! shards) asks a shard for a count that ends inside a stored batch, which the broker then
//! has to decode and rebuild with only the claimed records, and it costs a request for few
//! records; whole shares keep the asks steady (100 of 400 over 4 shards, every time), so
//! polls end where stored batches end whenever producers batch alike. A budget short of a
//! share is left for the next call, which the records already ready or outstanding answer
//! meanwhile.

use std::collections::HashMap;

/// Most records a poll asks one shard for (the broker's limit).
const MAX_PER_SHARD: u32 = 500;

/// The polls to start: `(shard, records)`, in the order to start them.
///
/// `outstanding`: the records each shard's poll in flight may still bring (shards with a
/// poll in flight get none); `first`: the shard this round starts at (fairness when the
/// budget is short); `parking`: the round waits, so every idle shard is asked, for at least
/// one record (the first to arrive anywhere answers the poll).
pub(super) fn plan(
    shards: u32,
    max: usize,
    ready: usize,
    outstanding: &HashMap<u32, u32>,
    first: u32,
    parking: bool,
) -> Vec<(u32, u32)> {
    let in_flight: usize = outstanding.values().map(|m| *m as usize).sum();
    let budget = max.saturating_sub(ready + in_flight);
    let idle: Vec<u32> = (0..shards)
        .map(|i| (first.wrapping_add(i)) % shards.max(1))
        .filter(|s| !outstanding.contains_key(s))
        .collect();
    if idle.is_empty() || (budget == 0 && !parking) {
        return Vec::new();
    }
    let cap = |n: usize| (n as u32).min(MAX_PER_SHARD);
    if parking {
        let each = budget.div_ceil(idle.len()).max(1);
        return idle.into_iter().map(|s| (s, cap(each))).collect();
    }
    let share = max.div_ceil(shards.max(1) as usize).max(1);
    let mut left = budget;
    let mut asks = Vec::new();
    for shard in idle {
        // Nothing ready and nothing in flight: the budget is all of `max`, at least a
        // share, so a call always asks something.
        let take = if left >= share {
            share
        } else if asks.is_empty() && ready == 0 && in_flight == 0 {
            left
        } else {
            break;
        };
        left -= take;
        asks.push((shard, cap(take)));
    }
    asks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(asks: &[(u32, u32)]) -> usize {
        asks.iter().map(|(_, n)| *n as usize).sum()
    }

    #[test]
    fn a_round_asks_whole_shares_within_the_budget() {
        let none = HashMap::new();
        assert_eq!(
            plan(4, 400, 0, &none, 0, false),
            vec![(0, 100), (1, 100), (2, 100), (3, 100)]
        );
        // 200 ready and one poll of 100 in flight: one more share, not 34 + 34 + 32.
        let one = HashMap::from([(2, 100)]);
        let asks = plan(4, 400, 200, &one, 1, false);
        assert_eq!(asks, vec![(1, 100)]);
        // Less than a share left: nothing now, the records ready answer this call.
        assert!(plan(4, 400, 250, &one, 0, false).is_empty());
        for (shards, max) in [(4, 64), (3, 100), (7, 10), (1, 5), (16, 400), (2, 2_000)] {
            for ready in [0, 1, max / 3, max - 1] {
                let asks = plan(shards, max, ready, &none, 5, false);
                assert!(
                    total(&asks) <= max - ready,
                    "{shards} {max} {ready}: {asks:?}"
                );
                let share = max.div_ceil(shards as usize).min(MAX_PER_SHARD as usize);
                assert!(
                    asks.iter().all(|(_, n)| *n as usize == share) || asks.len() == 1,
                    "{shards} {max} {ready}: {asks:?}"
                );
                if ready == 0 {
                    assert!(!asks.is_empty(), "a call with nothing held asks something");
                }
            }
        }
    }

    #[test]
    fn a_parking_round_asks_every_idle_shard_for_at_least_one() {
        let one = HashMap::from([(0, 3)]);
        let asks = plan(4, 3, 0, &one, 0, true);
        assert_eq!(asks, vec![(1, 1), (2, 1), (3, 1)]);
        assert_eq!(
            plan(2, 10, 0, &HashMap::new(), 1, true),
            vec![(1, 5), (0, 5)]
        );
    }
}
