//! Rebuilding a cache shard's state from its log: after a restart, on a broker that has
//! just become the shard's owner, and after followers' records arrived while it followed.
//!
//! Decides when the state in memory may be trusted: it was built at the generation this
//! broker leads at now, and it has applied the log up to the log's committed end. A state
//! built at another generation, or ahead of a log that was cut back, is rebuilt from the
//! log's first record; a state behind the log applies the records it missed. An in-memory
//! cache has no log: on a new generation it starts empty (its entries were the old
//! owner's, and are lost with it, as the spec says).

use felix_hot::ShardLog;
use felix_wire::protocol::{ErrorBody, codes};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{BatchIter, DecodedBatch};
use tracing::warn;

use super::CacheShard;
use super::record::LogOp;
use super::state::{KvState, Replayer};
use crate::broker::Broker;
use crate::errors::{err, log_error};

/// Versions of a generation start here, so two owners never hand out the same version.
fn first_version(generation: u64) -> u64 {
    generation << 32
}

/// The changes in `[from, to)` of `log`, in order, each with its offset, and where the read
/// ended.
pub(crate) fn read_changes(
    log: &ShardLog,
    from: u64,
    to: u64,
) -> Result<(Vec<(u64, LogOp)>, u64), ErrorBody> {
    let mut ops = Vec::new();
    let mut offset = from.max(log.first_offset());
    while offset < to {
        let read = log
            .read(offset, 4 << 20, Some(to))
            .map_err(|e| log_error(&e))?;
        if read.batches.is_empty() {
            break;
        }
        for (_, bytes) in BatchIter::new(&read.batches, usize::MAX).flatten() {
            match DecodedBatch::decode(bytes, DEFAULT_MAX_DECOMPRESSED) {
                Ok(decoded) => {
                    for r in decoded.records {
                        // A read starts at the batch holding `offset`: skip what came before.
                        if (r.offset as u64) < offset {
                            continue;
                        }
                        match LogOp::of(&r) {
                            Some(op) => ops.push((r.offset as u64, op)),
                            None if decoded.header.is_control() => {}
                            None => warn!(
                                shard = log.shard(),
                                offset = r.offset,
                                "skipping a record that is not a cache change"
                            ),
                        }
                    }
                }
                Err(e) => {
                    warn!(shard = log.shard(), error = %e, "skipping an unreadable cache batch")
                }
            }
        }
        offset = read.next_offset;
    }
    Ok((ops, offset.max(from)))
}

/// How long a rebuild waits for writes staged before it to settle.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits (bounded) until the log has written or given back everything it accepted.
async fn settle_staged(log: &ShardLog) {
    let mut written = log.watch_committed();
    let _ = tokio::time::timeout(
        SETTLE_WAIT,
        written.wait_for(|end| *end >= log.next_offset()),
    )
    .await;
}

impl Broker {
    /// Brings `st` up to date with the shard's log and generation (see the module doc).
    pub(crate) async fn catch_up(
        &self,
        cs: &CacheShard,
        st: &mut KvState,
    ) -> Result<(), ErrorBody> {
        let generation = match &cs.shard.repl {
            None => 0,
            Some(r) => match r.leading() {
                Some(g) => g,
                None => {
                    crate::routing::check_leading(&self.node, &cs.shard)?;
                    return Err(err(
                        codes::LEADERSHIP_LOST,
                        "leadership_lost",
                        format!("shard {}: this broker no longer leads it", cs.key),
                    ));
                }
            },
        };
        let Some(log) = cs.shard.log.clone() else {
            if st.built_at != Some(generation) {
                self.release_memory(st.bytes());
                *st = KvState::starting_at(first_version(generation), generation);
            }
            return Ok(());
        };
        let ahead = log.next_offset() < st.applied_end;
        let rebuild = st.built_at != Some(generation) || ahead;
        if rebuild {
            // Writes staged before this rebuild are settled first (written, or failed and
            // given back), so the log read below is all the log will hold of them.
            settle_staged(&log).await;
            // The state held changes the log no longer does (a write failed and its offsets
            // were given back) or another owner's: reads that saw it must not answer, and
            // their watch changes are never sent.
            cs.lost.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            super::commit::release_written(cs);
            cs.unwritten.lock().clear();
        }
        let end = log.committed_offset();
        let from = if rebuild { 0 } else { st.applied_end };
        if !rebuild && from >= end {
            return Ok(());
        }
        let reader = log.clone();
        let (ops, read_end) = tokio::task::spawn_blocking(move || read_changes(&reader, from, end))
            .await
            .map_err(|e| err(codes::INTERNAL, "internal", e.to_string()))??;
        if rebuild {
            *st = KvState::starting_at(first_version(generation), generation);
        }
        let mut replayer = Replayer::default();
        for (_, op) in &ops {
            replayer.apply(st, op);
        }
        st.applied_end = read_end.max(end);
        Ok(())
    }

    /// Gives back in-memory cache bytes to the broker's budget.
    pub(crate) fn release_memory(&self, bytes: u64) {
        let _ = self.caches.memory.fetch_update(
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
            |m| Some(m.saturating_sub(bytes)),
        );
    }
}
