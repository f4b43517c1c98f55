//! How a change to a log-backed cache shard becomes acknowledged: staged in order under the
//! shard's lock, written outside it.
//!
//! Decides what the shard's lock covers. Holding it across the log's write would give each
//! change its own trip through the log's writer (and, under `on_commit`, its own fsync), so
//! concurrent puts to one shard could never share a group commit. Instead a change is
//! checked, given its version, *accepted* by the log (which fixes its offset) and applied to
//! the state under the lock; the lock is released and the write is waited for outside it,
//! so the changes of many callers ride one write.
//!
//! What keeps that honest:
//! * The log accepts a change only at the offset the state expects (`append_if` at
//!   `applied_end`). If a write failed and the log gave its offsets back, the state is ahead
//!   of the log; the next change is refused there, and the next holder of the lock rebuilds
//!   the state from the log (`replay.rs`), which also bumps [`CacheShard::lost`].
//! * A read answers only from written state: when the state it saw is ahead of the log's
//!   written end, it waits for the write, and refuses (retryably) if a staged write was lost
//!   meanwhile — so no read ever returns a value the log does not hold.
//! * Watches hear a change only once it is written, in log order: staged changes wait in
//!   [`CacheShard::unwritten`] and whoever sees the written end pass them sends them on.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use felix_hot::{Appended, LogError};
use felix_wire::cache::{CacheChange, ChangeKind};
use felix_wire::protocol::{ErrorBody, codes};

use super::record::{LogOp, encode};
use super::state::KvState;
use super::{CacheShard, Change, now_ms};
use crate::broker::Broker;
use crate::errors::{err, log_error};

/// One record batch holding `ops`, as a log-backed shard's log takes it.
pub(crate) fn encode_ops(ops: &[LogOp]) -> Result<Vec<u8>, ErrorBody> {
    encode(ops, now_ms() as i64).map_err(|e| {
        err(
            codes::INTERNAL,
            "internal",
            format!("encode a cache change: {e}"),
        )
    })
}

/// How long a read waits for the write of state it saw before it gives up (retryably).
const READ_WAIT: Duration = Duration::from_secs(5);

/// A change accepted by the log and applied, whose write is still to be waited for.
#[must_use = "a staged change is acknowledged only once `written` says so"]
pub(crate) struct Staged {
    ticket: Option<Appended>,
}

impl Staged {
    /// Waits for the write (outside the shard's lock); the log offset of the change's last
    /// record, for a log-backed shard. A write the log refused is answered as its error,
    /// and counted as lost so reads of the state that held it refuse.
    ///
    /// Called outside the shard's lock: it first lets the other tasks that are ready to run
    /// go (requests of other connections about to stage their own changes), so the one
    /// write that follows carries theirs too. Without it every put of a busy shard wrote
    /// its own group: one `pwritev` per put, a tenth of the broker's CPU under
    /// `felix-bench cache` (bench/results/cache.md).
    pub(crate) async fn written(self, cs: &CacheShard) -> Result<Option<u64>, ErrorBody> {
        if self.ticket.is_some() {
            tokio::task::yield_now().await;
        }
        self.written_now(cs).await
    }

    /// [`Staged::written`] without letting others stage first: for a caller that holds the
    /// shard's lock (nobody else could stage meanwhile).
    pub(crate) async fn written_now(self, cs: &CacheShard) -> Result<Option<u64>, ErrorBody> {
        let Some(ticket) = self.ticket else {
            return Ok(None);
        };
        match ticket.committed().await {
            Ok((_, last)) => {
                release_written(cs);
                Ok(Some(last))
            }
            Err(e) => {
                cs.lost.fetch_add(1, Ordering::AcqRel);
                Err(log_error(&e))
            }
        }
    }
}

/// The watch changes `ops` make, in order; `base`: the log offset of the first (log-backed).
pub(crate) fn changes_of(ops: &[LogOp], base: Option<u64>) -> Vec<Change> {
    ops.iter()
        .enumerate()
        .filter_map(|(i, op)| {
            let (key, kind, version, value) = match op {
                LogOp::Put {
                    key,
                    value,
                    version,
                    ..
                } => (key, ChangeKind::Put, *version, value.clone()),
                LogOp::Delete {
                    key,
                    version,
                    expired,
                } => (
                    key,
                    if *expired {
                        ChangeKind::Expire
                    } else {
                        ChangeKind::Delete
                    },
                    *version,
                    Bytes::new(),
                ),
                LogOp::Floor { .. } | LogOp::Snapshot { .. } => return None,
            };
            Some(Change {
                change: CacheChange {
                    key: key.clone(),
                    kind,
                    version,
                    offset: base.map(|b| b + i as u64),
                },
                value,
            })
        })
        .collect()
}

/// Sends the watches every staged change the log has written, in log order. Called by
/// each writer after its own write, so the last one to finish sends everything.
pub(crate) fn release_written(cs: &CacheShard) {
    let Some(log) = &cs.shard.log else { return };
    let mut unwritten = cs.unwritten.lock();
    let end = log.committed_offset();
    while unwritten.front().is_some_and(|(last, _)| *last < end) {
        let (_, changes) = unwritten.pop_front().expect("front checked");
        for change in changes {
            // No watcher is not an error.
            let _ = cs.changes.send(change);
        }
    }
}

impl Broker {
    /// Under the shard's lock: has the log accept `ops` at the state's end (log-backed),
    /// applies them, and stages their watch changes. An in-memory shard applies and tells
    /// the watches at once.
    pub(crate) async fn stage_changes(
        &self,
        cs: &CacheShard,
        st: &mut KvState,
        ops: Vec<LogOp>,
    ) -> Result<Staged, ErrorBody> {
        if cs.shard.log.is_none() {
            for op in &ops {
                st.apply(op);
            }
            for change in changes_of(&ops, None) {
                let _ = cs.changes.send(change);
            }
            return Ok(Staged { ticket: None });
        }
        let batch = encode_ops(&ops)?;
        self.stage_batch(cs, st, batch, ops).await
    }

    /// Under the shard's lock, for a log-backed shard: has the log accept `batch` at the
    /// state's end, applies `ops` (what `batch` holds; a compaction's records, which change
    /// nothing in the state, are encoded before the lock is taken and pass none), and
    /// stages their watch changes.
    pub(crate) async fn stage_batch(
        &self,
        cs: &CacheShard,
        st: &mut KvState,
        batch: Vec<u8>,
        ops: Vec<LogOp>,
    ) -> Result<Staged, ErrorBody> {
        let Some(log) = &cs.shard.log else {
            return Err(err(
                codes::INTERNAL,
                "internal",
                format!("cache shard {} keeps no log to append to", cs.key),
            ));
        };
        self.disk.check(batch.len() as u64)?;
        let ticket = {
            // The append lock a shard move's hand-over takes after raising its fence: a
            // change is appended before the hand-over reads the log's end, or not here
            // (held, then sent to the new owner: `cache/moving.rs`).
            let _order = cs.shard.producers.lock().await;
            if !crate::moves::hold::may_append(&cs.shard) {
                return Err(crate::moves::hold::fenced_at_append(&cs.shard));
            }
            // Deferred: this change's holder writes it (with whatever was staged meanwhile)
            // when it waits for it, right after the shard's lock is let go: no thread
            // hand-off on a put's path (felix-hot's `inline.rs`).
            log.append_if_deferred(batch, st.applied_end)
                .await
                .map_err(|e| match e {
                    // The log gave back offsets of a failed write the state had applied:
                    // nothing written; the next change rebuilds the state first.
                    LogError::OffsetMismatch { .. } => err(
                        codes::SHARD_UNAVAILABLE,
                        "shard_unavailable",
                        format!(
                            "cache shard {}: an earlier write failed; the shard rebuilds \
                                 its state from the log before the next change, nothing was \
                                 written",
                            cs.key
                        ),
                    )
                    .retry_after(50),
                    e => log_error(&e),
                })?
        };
        for op in &ops {
            st.apply(op);
        }
        st.applied_end = ticket.last_offset + 1;
        // A compaction's records are no changes: `changes_of` finds none in them.
        let changes = changes_of(&ops, Some(ticket.base_offset));
        cs.unwritten.lock().push_back((ticket.last_offset, changes));
        Ok(Staged {
            ticket: Some(ticket),
        })
    }

    /// Stages `ops` and waits for their write, keeping the caller's lock: for the sweep's
    /// expiry deletes, which must be written before the pass goes on.
    pub(crate) async fn commit_changes(
        &self,
        cs: &CacheShard,
        st: &mut KvState,
        ops: Vec<LogOp>,
    ) -> Result<Option<u64>, ErrorBody> {
        self.stage_changes(cs, st, ops).await?.written_now(cs).await
    }

    /// Outside the lock: waits until the log has written everything below `tail` (the
    /// state a read saw), refusing if a staged write was lost meanwhile (`lost_before`: the
    /// shard's lost-write count when the read was made).
    pub(crate) async fn wait_written(
        &self,
        cs: &CacheShard,
        tail: u64,
        lost_before: u64,
    ) -> Result<(), ErrorBody> {
        let Some(log) = &cs.shard.log else {
            return Ok(());
        };
        if log.committed_offset() < tail {
            let mut written = log.watch_committed();
            let reached = tokio::time::timeout(READ_WAIT, written.wait_for(|end| *end >= tail))
                .await
                .is_ok_and(|r| r.is_ok());
            if !reached {
                return Err(unwritten_read(cs));
            }
        }
        if cs.lost.load(Ordering::Acquire) != lost_before {
            return Err(unwritten_read(cs));
        }
        Ok(())
    }
}

/// A read saw a change whose write failed or did not finish: nothing to answer from.
fn unwritten_read(cs: &CacheShard) -> ErrorBody {
    err(
        codes::SHARD_UNAVAILABLE,
        "shard_unavailable",
        format!(
            "cache shard {}: the state this read saw was not written (a write failed or the \
             log is offline); retry",
            cs.key
        ),
    )
    .retry_after(100)
}
