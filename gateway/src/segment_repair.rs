//! Putting a damaged local segment right from a good copy of its records.
//!
//! Two paths find damage. A tiered read that meets a damaged local segment whose records
//! were uploaded serves them from the object store instead ([`served_around`]); a read that
//! cannot be served around is refused as `corrupt_data` ([`refused`]). Either way the broker
//! then rewrites the segment in the background, once at a time per file, from the first good
//! copy it finds: the object store's (when every record of the segment was uploaded), else,
//! in a cluster, another replica's. The log takes a copy only if it is exactly the
//! segment's records (`ShardLog::replace_sealed_segment`), and the outcome is logged either
//! way. Until it is done, and when no copy exists, reads stay served around or refused.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use felix_cold::ColdError;
use felix_cold::tiered::TieredShard;
use felix_hot::{LogError, RepairOutcome};
use parking_lot::Mutex;

use crate::node::Node;
use crate::replication::segment_copy::copy_range;
use crate::shard::Shard;

/// Segment files being rewritten now.
static IN_FLIGHT: LazyLock<Mutex<HashSet<PathBuf>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

/// Reports the damage a read was served around (see [`crate::corruption::served_around`])
/// and starts rewriting the damaged segment from the object store.
pub(crate) fn served_around(tier: &Arc<TieredShard>, damage: &LogError) {
    crate::corruption::served_around(damage);
    let Some((segment, base)) = damaged_segment(damage) else {
        return;
    };
    let tier = tier.clone();
    start(segment, async move {
        match tier.repair_from_objects(base).await {
            Ok(Some(done)) => Ok((done, "the object store".to_owned())),
            Ok(None) => Err("not all of its records were uploaded".to_owned()),
            Err(e) => Err(format!("the object store: {e}")),
        }
    });
}

/// After a read was refused as corrupt: starts rewriting the damaged segment from the
/// object store or another replica. Other errors are left alone.
pub(crate) fn refused(node: &Arc<Node>, shard: &Arc<Shard>, error: &ColdError) {
    let ColdError::Log(damage) = error else {
        return;
    };
    let Some((segment, base)) = damaged_segment(damage) else {
        return;
    };
    let (node, shard) = (node.clone(), shard.clone());
    start(
        segment,
        async move { from_any_copy(&node, &shard, base).await },
    );
}

/// The damaged segment's file and base offset (its file name), for a corruption error.
fn damaged_segment(damage: &LogError) -> Option<(PathBuf, u64)> {
    let LogError::Corrupt { segment, .. } = damage else {
        return None;
    };
    let base = segment
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse::<u64>().ok())?;
    Some((segment.clone(), base))
}

/// Runs `repair` for `segment` unless a repair of it is under way, and logs its outcome.
fn start(
    segment: PathBuf,
    repair: impl Future<Output = Result<(RepairOutcome, String), String>> + Send + 'static,
) {
    if !IN_FLIGHT.lock().insert(segment.clone()) {
        return;
    }
    tokio::spawn(async move {
        report(&segment, repair.await);
        IN_FLIGHT.lock().remove(&segment);
    });
}

fn report(segment: &Path, outcome: Result<(RepairOutcome, String), String>) {
    match outcome {
        Ok((done, source)) => tracing::info!(
            segment = %segment.display(),
            base = done.base_offset,
            next = done.next_offset,
            source,
            "rewrote a damaged local segment from a verified copy"
        ),
        Err(why) => tracing::error!(
            segment = %segment.display(),
            why,
            "a damaged local segment could not be rewritten; its records stay refused here \
             unless another tier serves them"
        ),
    }
}

/// Rewrites the sealed segment at `base` from the object store if it holds all of it, else
/// from the first other replica of the shard with a good copy.
async fn from_any_copy(
    node: &Node,
    shard: &Shard,
    base: u64,
) -> Result<(RepairOutcome, String), String> {
    let log = shard.log.clone().ok_or("the shard keeps no log")?;
    let (_, next) = log
        .sealed_segment_range(base)
        .filter(|(b, _)| *b == base)
        .ok_or("the damaged file is no longer a sealed segment of the log")?;
    let mut failures = Vec::new();
    if let Some(tier) = &shard.tier {
        match tier.repair_from_objects(base).await {
            Ok(Some(done)) => return Ok((done, "the object store".to_owned())),
            Ok(None) => {
                failures.push("the object store: not all of its records were uploaded".into())
            }
            Err(e) => failures.push(format!("the object store: {e}")),
        }
    }
    if node.cluster {
        let me = node.broker_id();
        let replicas: Vec<u64> = node
            .registry
            .borrow()
            .placements
            .get(&shard.key)
            .map(|p| p.replicas.iter().copied().filter(|id| *id != me).collect())
            .unwrap_or_default();
        for id in replicas {
            let Some(addr) = node.internal_addr_of(id) else {
                continue;
            };
            let copy = match copy_range(&node.peers, &addr, &shard.key, base, next).await {
                Ok(copy) => copy,
                Err(e) => {
                    failures.push(format!("broker {id}: {e}"));
                    continue;
                }
            };
            let log = log.clone();
            match tokio::task::spawn_blocking(move || log.replace_sealed_segment(base, &copy)).await
            {
                Ok(Ok(done)) => return Ok((done, format!("broker {id}"))),
                Ok(Err(e)) => failures.push(format!("broker {id}'s copy: {e}")),
                Err(e) => failures.push(format!("broker {id}: {e}")),
            }
        }
    }
    if failures.is_empty() {
        failures.push("no other copy exists (one broker, untiered stream)".into());
    }
    Err(failures.join("; "))
}
