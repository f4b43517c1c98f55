//! A watch that resumes after the change it heard last (log-backed caches): what the owner
//! replays from its log before the watch goes live again.
//!
//! Decides whether a watch can resume without a gap. The change heard last must be in the
//! owner's log at the offset the watch names, with the version it heard: then every change
//! after it is in the log too, and is replayed in order before the live ones (a live change
//! the replay already sent is skipped by its offset). When the log no longer holds that
//! change (compacted away) the watch ends with `watch_lagged`; when it holds another change
//! there, or none yet (the owner that served the watch lost changes it had written, as a
//! Leader cache's failover may), with `watch_diverged`: either way the caller learns that
//! it missed changes, never silently. A compaction's snapshot records are no changes: they
//! are never replayed to a watch.

use felix_wire::cache::WatchResume;
use felix_wire::protocol::{ErrorBody, codes};

use super::commit::changes_of;
use super::replay::read_changes;
use super::{CacheShard, Change};
use crate::errors::err;

/// The changes after `resume` that the shard's log holds now, in order, and the offset the
/// live changes take over from.
pub(crate) async fn replay_since(
    cs: &CacheShard,
    resume: WatchResume,
) -> Result<(Vec<Change>, u64), ErrorBody> {
    let Some(log) = cs.shard.log.clone() else {
        return Err(err(
            codes::INVALID_ARGUMENT,
            "invalid_argument",
            "an in-memory cache keeps no log: its watches cannot resume",
        ));
    };
    let Some(heard) = resume.next_offset.checked_sub(1) else {
        return Err(err(
            codes::INVALID_ARGUMENT,
            "invalid_argument",
            "a watch resumes after a change it heard: next_offset is at least 1",
        ));
    };
    let end = log.committed_offset();
    if heard < log.first_offset() {
        return Err(err(
            codes::SUBSCRIPTION_LAGGED,
            "watch_lagged",
            format!(
                "shard {}: the change at offset {heard} was compacted away, so the changes \
                 since cannot be replayed; open the watch afresh",
                cs.key
            ),
        ));
    }
    let reader = log.clone();
    let (ops, _) = tokio::task::spawn_blocking(move || read_changes(&reader, heard, end))
        .await
        .map_err(|e| err(codes::INTERNAL, "internal", e.to_string()))??;
    let heard_version = ops
        .first()
        .filter(|(offset, _)| *offset == heard)
        .and_then(|(_, op)| op.version());
    if heard_version != Some(resume.last_version) {
        return Err(err(
            codes::SUBSCRIPTION_LAGGED,
            "watch_diverged",
            format!(
                "shard {}: the change heard last (offset {heard}, version {}) is not in this \
                 owner's log, which a previous owner's lost writes cause; changes may have \
                 been missed: open the watch afresh",
                cs.key, resume.last_version
            ),
        ));
    }
    // Versions grow in log order. A compaction's snapshot records are skipped: marked
    // ones carry no version here, and unmarked ones (written before snapshots were marked)
    // repeat versions already replayed or heard.
    let (mut changes, mut newest) = (Vec::new(), resume.last_version);
    for (offset, op) in &ops[1..] {
        if let Some(v) = op.version().filter(|v| *v > newest) {
            newest = v;
            changes.extend(changes_of(std::slice::from_ref(op), Some(*offset)));
        }
    }
    Ok((changes, end))
}
