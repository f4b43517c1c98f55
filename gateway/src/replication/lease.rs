//! The broker's shard-leader lease: how long this broker may act as a leader without
//! hearing from the control plane, and its renewal.
//!
//! Invariant: the lease is counted from the instant the renewal was sent, so it ends here
//! no later than the control plane counts it; a broker whose lease lapsed acknowledges no
//! write (see `enqueue_ack` and the leader's loop in `replication::leader`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use felix_meta::MetaHandle;
use tracing::{info, warn};

/// The broker's shard-leader lease, as this broker counts it: from the instant it sent the
/// renewal that the control plane granted, so it ends no later than the control plane's view.
pub struct Lease {
    base: Instant,
    /// Nanoseconds after `base` until which the lease holds; 0: never granted.
    until: AtomicU64,
}

impl Default for Lease {
    fn default() -> Self {
        Lease {
            base: Instant::now(),
            until: AtomicU64::new(0),
        }
    }
}

impl Lease {
    pub fn holds(&self) -> bool {
        let now = self.base.elapsed().as_nanos() as u64;
        now < self.until.load(Ordering::Acquire)
    }

    /// How long the lease still holds (zero once it lapsed).
    pub fn remaining(&self) -> Duration {
        let now = self.base.elapsed().as_nanos() as u64;
        Duration::from_nanos(self.until.load(Ordering::Acquire).saturating_sub(now))
    }

    fn extend(&self, sent: Instant, granted: Duration) {
        let until = (sent.saturating_duration_since(self.base) + granted).as_nanos() as u64;
        self.until.fetch_max(until, Ordering::AcqRel);
    }
}

/// Renews the broker's lease every quarter of its duration, until the broker is gone. A
/// renewal that failed (it kept trying for half a lease) is followed by the next at once,
/// not a quarter later: waiting would let one slow round with the control plane (a loaded
/// machine, an election) lapse the lease, which marks a live broker dead and fails its
/// Quorum shards over (seen in a loaded drain, docs/shard-moves.md).
pub async fn keep_lease(meta: MetaHandle, broker_id: u64, lease: Arc<Lease>, every: Duration) {
    let mut failing = false;
    loop {
        let sent = Instant::now();
        match meta.renew_broker_lease(broker_id).await {
            Ok(granted) => {
                lease.extend(sent, granted);
                if failing {
                    info!("shard-leader lease renewed again");
                }
                failing = false;
            }
            Err(e) => {
                if !failing {
                    warn!(error = %e, "cannot renew the shard-leader lease; this broker stops \
                        acknowledging writes when it lapses");
                }
                failing = true;
            }
        }
        if Arc::strong_count(&lease) == 1 {
            return;
        }
        // A short pause all the same, should a failure ever come back at once.
        let pause = if failing {
            every.min(Duration::from_millis(50))
        } else {
            every
        };
        tokio::time::sleep(pause).await;
    }
}
