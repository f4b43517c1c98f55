//! Putting a damaged local segment right after a read was served around it.
//!
//! When a tiered read finds a local segment damaged and serves its records from the object
//! store instead, the broker rewrites the segment from that verified copy in the
//! background, once at a time per file, and says so in the log. Until it is done, and if it
//! cannot be done (records never uploaded: only a replica holds them), reads keep being
//! served around the damage or refused as `corrupt_data`.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use felix_cold::tiered::TieredShard;
use felix_hot::LogError;
use parking_lot::Mutex;

/// Segment files being rewritten now.
static IN_FLIGHT: LazyLock<Mutex<HashSet<PathBuf>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

/// Reports the damage a read was served around (see [`crate::corruption::served_around`])
/// and starts rewriting the damaged segment from the object store, unless that is already
/// under way.
pub(crate) fn served_around(tier: &Arc<TieredShard>, damage: &LogError) {
    crate::corruption::served_around(damage);
    let LogError::Corrupt { segment, .. } = damage else {
        return;
    };
    let Some(base) = segment
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return;
    };
    if !IN_FLIGHT.lock().insert(segment.clone()) {
        return;
    }
    let tier = tier.clone();
    let segment = segment.clone();
    tokio::spawn(async move {
        let shard = tier.key.to_string();
        match tier.repair_from_objects(base).await {
            Ok(Some(done)) => tracing::info!(
                shard,
                segment = %segment.display(),
                base = done.base_offset,
                next = done.next_offset,
                "rewrote a damaged local segment from the object store's verified copy"
            ),
            Ok(None) => tracing::warn!(
                shard,
                segment = %segment.display(),
                "a damaged local segment cannot be rewritten from the object store: not all \
                 of its records were uploaded"
            ),
            Err(e) => tracing::error!(
                shard,
                segment = %segment.display(),
                error = %e,
                "rewriting a damaged local segment from the object store failed; reads keep \
                 being served from the object store"
            ),
        }
        IN_FLIGHT.lock().remove(&segment);
    });
}
