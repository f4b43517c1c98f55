//! Whether the object store is up, as `felix_tier_store_up` and the log say it: a ping
//! every second ([`TierStore::ping`]: a HEAD outside the guard's permits and retries, with
//! a 2 s timeout) and the full check (bucket, credentials) at start and every 30 s after.
//!
//! Invariant: a store that stops answering (down, or hung: connections accepted, nothing
//! returned) is reported down within a few seconds, not after every retry of a 30 s
//! timeout; two failed probes in a row are needed, so one slow answer on a loaded machine
//! does not flap the gauge. A HEAD per second costs about 86,400 requests a day on S3.

use std::sync::Arc;
use std::time::Duration;

use felix_cold::store::TierStore;
use tracing::{info, warn};

use crate::metrics::Metrics;

/// Time between probes.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// Time a ping may take before it counts as failed.
const PING_TIMEOUT: Duration = Duration::from_secs(2);
/// Pings between full checks.
const CHECK_EVERY: u32 = 30;
/// Failed probes in a row before the store is reported down.
const FAILURES_TO_DOWN: u32 = 2;

/// Probes the store for as long as the broker runs.
pub(crate) async fn run(store: TierStore, metrics: Arc<Metrics>) {
    let mut was_up = None;
    let mut failures = 0;
    for tick in 0u32.. {
        let probe = if tick % CHECK_EVERY == 0 {
            // The full check goes through the guard (a permit, its timeout and retries);
            // bounded like a ping, so a store that hangs during a check is still reported
            // within two probes. A check that only waited for a permit behind busy uploads
            // fails alone: the ping after it clears the count.
            match tokio::time::timeout(PING_TIMEOUT, store.check()).await {
                Ok(result) => result.map_err(|e| e.to_string()),
                Err(_) => Err(format!("no answer within {PING_TIMEOUT:?}")),
            }
        } else {
            store.ping(PING_TIMEOUT).await.map_err(|e| e.to_string())
        };
        failures = match &probe {
            Ok(()) => 0,
            Err(_) => failures + 1,
        };
        // The first answer decides at once (the gauge reads 0 until then).
        let up = match (&probe, was_up) {
            (Ok(()), _) => true,
            (Err(_), None) => false,
            (Err(_), Some(_)) => failures < FAILURES_TO_DOWN && was_up == Some(true),
        };
        if !up
            && was_up != Some(false)
            && let Err(e) = &probe
        {
            warn!(store = store.description(), error = %e,
                "object store unreachable: uploads wait (sealed segments stay local) and \
                 history older than the local log cannot be read until it returns");
        }
        if up && was_up == Some(false) {
            info!(store = store.description(), "object store reachable again");
        }
        metrics.tier_store_up.set(i64::from(up));
        was_up = Some(up);
        tokio::time::sleep(PROBE_EVERY).await;
    }
}
