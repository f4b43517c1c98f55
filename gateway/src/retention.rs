//! When a durable shard's retention runs and how far it may cut, on a leader and on a
//! replica.
//!
//! Each durable shard has a retention task: it applies the stream's settings every
//! `retention_check_ms`, and at once after an alter. On a single node everything committed
//! may go; in a cluster the leader alone applies the stream's retention to both tiers, never
//! past what readers may see (the quorum mark on a Quorum stream), and a replica that does
//! not lead follows the leader's manifest and trims only its local copy.
//!
//! Invariant: retention never removes a record readers could still be promised: nothing at
//! or above the quorum mark, and on a replica of a tiered stream nothing not yet uploaded.

use std::sync::Arc;
use std::time::Duration;

use felix_cold::tiered::TieredShard;
use felix_cold::{ColdError, retention};
use felix_meta::MetaHandle;
use felix_meta::model::StreamSettings;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::replication::role::ReplState;

/// Applies a shard's retention settings every `every`, until stopped.
pub(crate) async fn run_retention(
    tier: Arc<TieredShard>,
    repl: Option<Arc<ReplState>>,
    meta: MetaHandle,
    settings: Arc<dyn Fn() -> Option<StreamSettings> + Send + Sync>,
    every: Duration,
    now: Arc<tokio::sync::Notify>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(every) => {}
            _ = now.notified() => {}
        }
        if *stop.borrow() {
            return;
        }
        let Some(s) = settings() else { return };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        // Everything committed is acknowledgeable on a Leader shard; in a cluster, the
        // leader alone applies retention, never past what readers may see (the quorum
        // mark on a Quorum stream).
        let acked_end = match &repl {
            None => tier.log.committed_offset(),
            Some(r) if r.leading().is_some() => r.mark.get(),
            Some(_) => {
                if let Err(e) = follower_retention(&tier, &meta, &s) {
                    warn!(shard = %tier.key, error = %e, "replica retention failed; retrying later");
                }
                continue;
            }
        };
        match retention::enforce(&tier, &meta, &s, acked_end, now_ms).await {
            Ok(r) if r.objects_deleted + r.segments_deleted > 0 => {
                info!(shard = %tier.key, objects = r.objects_deleted, segments = r.segments_deleted,
                    earliest = r.earliest_offset, "retention applied");
            }
            Ok(_) => {}
            Err(e) => warn!(shard = %tier.key, error = %e, "retention pass failed; retrying later"),
        }
    }
}

/// Replaces a shard's copy of its manifest with the control plane's applied one (the
/// leader records objects; a replica, or a broker about to lead, catches up with them).
pub(crate) fn refresh_manifest(tier: &TieredShard, meta: &MetaHandle) {
    let state = meta.local(|s| s.manifest(&tier.key));
    tier.log.mark_uploaded_below(state.uploaded_end());
    tier.manifest.replace(state);
}

/// Retention of a replica that does not lead: it follows the manifest the leader keeps and
/// applies only the local part of retention — uploaded segments under the hot policy on a
/// tiered stream, the stream's retention to its copy on another.
fn follower_retention(
    tier: &TieredShard,
    meta: &MetaHandle,
    settings: &StreamSettings,
) -> Result<(), ColdError> {
    refresh_manifest(tier, meta);
    let acked_end = if settings.tiered {
        tier.manifest.uploaded_end()
    } else {
        tier.log.committed_offset()
    };
    retention::enforce_local(tier, settings, acked_end, Default::default()).map(|_| ())
}
