//! One shard on this broker: its log (durable) or its numbering (ephemeral), its live
//! fanout, its role in a cluster and its read bound.
//!
//! Invariant: readers never see past [`Shard::visible_end`] — the quorum mark on a shard of
//! a cluster (see `replication::quorum`), else the log's committed end — and once a shard
//! is closed it serves nothing more: its tasks stop and its subscribers end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use felix_cold::tiered::TieredShard;
use felix_hot::ShardLog;
use felix_meta::model::ShardKey;
use tokio::sync::watch;
use tracing::warn;

use crate::fanout::{Fanout, LiveBatch};
use crate::metrics::Metrics;
use crate::producers::ProducerTable;
use crate::replication::role::ReplState;

/// One shard on this broker.
pub struct Shard {
    pub key: ShardKey,
    /// `None` for an ephemeral shard.
    pub(crate) log: Option<ShardLog>,
    /// Role, read bound and followers' progress (durable shards of a cluster).
    pub(crate) repl: Option<Arc<ReplState>>,
    pub(crate) fanout: Arc<Fanout>,
    /// Ephemeral shards number batches themselves.
    pub(crate) ephemeral_next: AtomicU64,
    pub(crate) closed: Arc<AtomicBool>,
    /// Idempotent producers' sequences (in memory only on an ephemeral shard). Held across
    /// the check and the enqueue of a publish, so two re-sends of one batch cannot both be
    /// appended.
    pub(crate) producers: tokio::sync::Mutex<ProducerTable>,
    /// Both tiers behind one read path (durable shards).
    pub(crate) tier: Option<Arc<TieredShard>>,
    /// Stops the shard's upload and retention tasks when set or dropped.
    pub(crate) stop_tasks: watch::Sender<bool>,
    /// Asks the retention task for a pass now.
    pub(crate) retention_now: Arc<tokio::sync::Notify>,
    /// Which stream of its name this shard is of ([`felix_meta::model::Stream::incarnation`]).
    pub(crate) incarnation: u64,
}

/// A shard's key from the names a request carries.
pub(crate) fn shard_key(tenant: &str, namespace: &str, stream: &str, shard: u32) -> ShardKey {
    ShardKey {
        tenant: tenant.to_owned(),
        namespace: namespace.to_owned(),
        stream: stream.to_owned(),
        shard,
    }
}

impl Shard {
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Offers a batch to the live subscribers (an ephemeral shard's publish path).
    pub(crate) fn offer_live(&self, batch: LiveBatch, metrics: &Metrics) {
        self.fanout.offer(batch, metrics);
    }

    /// Ends every live subscriber (their subscriptions then end with the shard's state as
    /// the reason: moved, fenced, closed).
    pub(crate) fn end_subscribers(&self) {
        self.fanout.clear();
    }

    /// Closes the shard: its tasks stop and its subscribers end. Its files stay.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = self.stop_tasks.send(true);
        self.fanout.clear();
    }

    /// Restarts live delivery at `offset` (after the log was cut there).
    pub(crate) fn reset_fanout(&self, offset: u64) {
        self.fanout.reset(offset);
    }

    /// Rebuilds what was derived from records that a cut removed: idempotent producers'
    /// sequences.
    pub(crate) async fn reset_after_truncation(&self) -> Result<(), String> {
        let Some(log) = &self.log else { return Ok(()) };
        let table = ProducerTable::rebuild(log).map_err(|e| e.to_string())?;
        *self.producers.lock().await = table;
        Ok(())
    }

    /// The end of what readers may see: the quorum mark on a Quorum shard of a cluster,
    /// else the log's committed end.
    pub(crate) fn visible_end(&self) -> u64 {
        match (&self.repl, &self.log) {
            (_, None) => self.ephemeral_next.load(Ordering::Acquire),
            (Some(r), _) => r.mark.get(),
            (None, Some(log)) => log.committed_offset(),
        }
    }

    /// Changes whenever [`Shard::visible_end`] may have moved.
    pub(crate) fn watch_visible(&self) -> Option<watch::Receiver<u64>> {
        match (&self.repl, &self.log) {
            (_, None) => None,
            (Some(r), _) => Some(r.mark.watch()),
            (None, Some(log)) => Some(log.watch_committed()),
        }
    }
}

/// Keeps the shard's idempotent-producer snapshot in step with sealed segments.
pub(crate) async fn snapshot_producers_at_seal(
    log: ShardLog,
    closed: Arc<AtomicBool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut sealed = log.subscribe_sealed();
    loop {
        // As in `follow_log`: the stop signal, not the log's channel, ends this task.
        let next = tokio::select! {
            next = sealed.recv() => next,
            _ = stop.wait_for(|s| *s) => return,
        };
        let up_to = match next {
            Ok(seg) => seg.last_offset + 1,
            // Missed notifications: catch up to the newest sealed segment.
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                match log.sealed_segments().last() {
                    Some(seg) => seg.last_offset + 1,
                    None => continue,
                }
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        if closed.load(Ordering::Acquire) {
            return;
        }
        let log2 = log.clone();
        let result =
            tokio::task::spawn_blocking(move || ProducerTable::snapshot_through(&log2, up_to))
                .await;
        if let Ok(Err(e)) = result {
            warn!(shard = log.shard(), error = %e, "could not snapshot producer state");
        }
    }
}
