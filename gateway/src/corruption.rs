//! Stored data that fails its checks: one error for every path that finds it, one counter,
//! one log line per damaged place.
//!
//! Corruption is not an outage. A damaged segment file or object stays damaged however
//! often it is read, so a client is told so with a stable, non-retryable error
//! (`corrupt_data` with reason `corrupt_segment` or `corrupt_object`, naming the shard and
//! the file or object) instead of `shard_unavailable`, which clients retry for ever. The
//! error is logged once per place (the same file read by a hundred subscribers is one
//! operator event) and counted per tier in `felix_corruption_detected_total{tier}` on
//! every detection.

use std::collections::HashSet;
use std::sync::LazyLock;

use felix_wire::protocol::{ErrorBody, codes};
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// Where the damage was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// A segment file of the local log.
    Hot,
    /// An object in the object store (or its cached row groups).
    Cold,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    pub tier: String,
}

/// Detections since start, by tier. Process-wide because the paths that find corruption
/// (log reads, cold reads, recovery at shard open) map errors without a broker at hand;
/// [`crate::metrics::Metrics`] registers this family.
pub static DETECTED: LazyLock<Family<TierLabel, Counter>> = LazyLock::new(Family::default);

/// Places already logged; bounded so a disk full of damage cannot grow it without end.
static LOGGED: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(|| Mutex::new(HashSet::new()));
const MAX_LOGGED: usize = 4096;

/// Counts and (once per place) logs a damaged local segment whose records a tiered read
/// served from the object store instead (see `TieredShard::read`): the reader is not
/// refused; `segment_repair` rewrites the file.
pub fn served_around(damage: &felix_hot::LogError) {
    let place = match damage {
        felix_hot::LogError::Corrupt { segment, .. } => segment.display().to_string(),
        other => other.to_string(),
    };
    DETECTED
        .get_or_create(&TierLabel {
            tier: "hot".to_owned(),
        })
        .inc();
    if first_report(&place) {
        tracing::error!(
            tier = "hot",
            place,
            detail = %damage,
            "stored data failed its checks; its records were served from the object store \
             instead, and the file is being rewritten from there"
        );
    }
}

/// Whether `place` has not been logged yet (and is now).
fn first_report(place: &str) -> bool {
    let mut logged = LOGGED.lock();
    logged.len() < MAX_LOGGED && logged.insert(place.to_owned())
}

/// Counts and (once per place) logs a detection, and returns the client's error.
pub fn detected(tier: Tier, place: &str, detail: &str) -> ErrorBody {
    let (label, reason) = match tier {
        Tier::Hot => ("hot", "corrupt_segment"),
        Tier::Cold => ("cold", "corrupt_object"),
    };
    DETECTED
        .get_or_create(&TierLabel {
            tier: label.to_owned(),
        })
        .inc();
    if first_report(place) {
        tracing::error!(
            tier = label,
            place,
            detail,
            "stored data failed its checks; it is not served (restore it from a replica or the object store)"
        );
    }
    ErrorBody::new(
        codes::CORRUPT_DATA,
        reason,
        format!("stored data is corrupt and is not served: {detail}"),
    )
}
