//! The quorum mark: the end of what readers of a replicated shard may see, the one place it
//! lives, how it moves and who waits on it.
//!
//! On a Quorum stream the mark is the highest offset a majority of the replicas holds
//! ([`quorum_mark`]), computed by the leader from the followers' fetch reports and released
//! only after the control plane recorded it (`ReportReplicas`); on a Leader stream it is the
//! leader's committed end. Publishes waiting for a Quorum acknowledgement
//! ([`QuorumMark::wait_past`]), subscriptions, pull reads, the fanout, the uploader and
//! retention all read it here and never look past it.
//!
//! Invariant: while a role lasts the mark only rises ([`QuorumMark::raise`]); it is set
//! anew ([`QuorumMark::reset`]) only when this broker takes leadership at a new generation,
//! after the log was cut at the generation's start.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

/// A shard's read bound and the followers' reports it is computed from.
pub struct QuorumMark {
    released: watch::Sender<u64>,
    /// Followers' reported ends at the current generation.
    followers: Mutex<HashMap<u64, u64>>,
    /// Wakes the leader's driver when a follower reported progress.
    progress: Notify,
}

impl QuorumMark {
    pub fn new(at: u64) -> QuorumMark {
        QuorumMark {
            released: watch::channel(at).0,
            followers: Mutex::new(HashMap::new()),
            progress: Notify::new(),
        }
    }

    /// The end of what readers may see now.
    pub fn get(&self) -> u64 {
        *self.released.borrow()
    }

    /// Changes whenever the mark moves.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.released.subscribe()
    }

    /// Raises the mark to `end` (it never goes down while a role lasts).
    pub(crate) fn raise(&self, end: u64) {
        self.released.send_if_modified(|v| {
            let moved = end > *v;
            *v = (*v).max(end);
            moved
        });
    }

    /// Sets the mark where a new leadership starts and forgets the old followers' reports.
    pub(crate) fn reset(&self, at: u64) {
        self.followers.lock().clear();
        self.released.send_replace(at);
    }

    /// Waits until the mark covers `last`, at most `wait`; says whether it did.
    pub async fn wait_past(&self, last: u64, wait: Duration) -> bool {
        let mut mark = self.released.subscribe();
        matches!(
            tokio::time::timeout(wait, mark.wait_for(|m| *m > last)).await,
            Ok(Ok(_))
        )
    }

    /// A follower holds everything below `end` (its fetch asked from there).
    pub(crate) fn report(&self, follower: u64, end: u64) {
        self.followers.lock().insert(follower, end);
        self.progress.notify_one();
    }

    /// Every replica's known end: the followers' reports and the leader's own `end`.
    pub(crate) fn ends(&self, leader: u64, end: u64) -> HashMap<u64, u64> {
        let mut ends = self.followers.lock().clone();
        ends.insert(leader, end);
        ends
    }

    /// Resolves when a follower reported progress.
    pub(crate) async fn progressed(&self) {
        self.progress.notified().await
    }
}

/// The majority mark of a replica set and the replicas that hold it: `ends` holds every
/// replica's end that is known (the leader's included); unknown replicas hold nothing.
pub fn quorum_mark(replicas: &[u64], ends: &HashMap<u64, u64>, floor: u64) -> (u64, BTreeSet<u64>) {
    let mut known: Vec<u64> = replicas
        .iter()
        .map(|r| ends.get(r).copied().unwrap_or(0))
        .collect();
    known.sort_unstable_by(|a, b| b.cmp(a));
    let majority = replicas.len() / 2 + 1;
    let mark = known
        .get(majority.saturating_sub(1))
        .copied()
        .unwrap_or(0)
        .max(floor);
    let in_sync = replicas
        .iter()
        .copied()
        .filter(|r| ends.get(r).copied().unwrap_or(0) >= mark)
        .collect();
    (mark, in_sync)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_is_what_a_majority_holds() {
        let replicas = [1, 2, 3];
        let ends = HashMap::from([(1, 100), (2, 60), (3, 10)]);
        let (mark, in_sync) = quorum_mark(&replicas, &ends, 0);
        assert_eq!(mark, 60);
        assert_eq!(in_sync.into_iter().collect::<Vec<_>>(), vec![1, 2]);
        // One replica unknown: the other two decide.
        let (mark, _) = quorum_mark(&replicas, &HashMap::from([(1, 100), (3, 30)]), 0);
        assert_eq!(mark, 30);
        // Alone, a leader of three holds no majority: the floor stays.
        let (mark, in_sync) = quorum_mark(&replicas, &HashMap::from([(1, 100)]), 7);
        assert_eq!(mark, 7);
        assert!(in_sync.contains(&1));
        // A single replica is its own majority.
        let (mark, _) = quorum_mark(&[4], &HashMap::from([(4, 9)]), 0);
        assert_eq!(mark, 9);
    }
}
