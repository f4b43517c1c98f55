//! Live delivery: how a committed batch reaches the subscribers that are caught up, and what
//! happens to one that cannot keep up.
//!
//! Fanout of a durable shard follows the log: one task per shard ([`follow_log`]) reads what
//! readers may see, in offset order, and offers it to every live subscriber's bounded queue.
//! A subscriber whose queue is full loses that event — only it; on a durable stream its
//! subscription then ends with `subscription_lagged` and the offset to resume from (on an
//! ephemeral stream, or for a client that did not offer the feature, the drop is counted
//! and delivery carries on). Publishers never wait for subscribers.
//!
//! Invariant: offering and joining happen under one lock together with the cursor (the
//! next offset fanout offers), so a subscription that replays history and joins at the
//! cursor neither skips nor repeats a batch.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use felix_hot::ShardLog;
use felix_wire::BatchIter;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tracing::warn;

use crate::metrics::Metrics;

/// One batch as fanout hands it to subscribers: stored bytes, shared, never copied.
#[derive(Clone, Debug)]
pub struct LiveBatch {
    pub first_offset: u64,
    pub next_offset: u64,
    pub bytes: Bytes,
}

/// What a subscriber's queue yields.
#[derive(Debug)]
pub enum Delivery {
    Batch(LiveBatch),
    /// The queue overflowed on a durable stream: end with `subscription_lagged`.
    Lagged {
        resume_offset: u64,
    },
}

/// A subscriber's bounded queue, as the fanout sees it.
pub(crate) struct SubQueue {
    id: u64,
    tx: mpsc::Sender<Delivery>,
    /// Set to the first dropped offset when a durable subscriber overflows.
    lagged: Arc<AtomicU64>,
    bytes: Arc<AtomicUsize>,
    max_bytes: usize,
    tenant: String,
    /// Whether drops end the subscription (durable) or are only counted (ephemeral).
    announce_drops: bool,
    /// Batches wholly below this offset are not for this subscriber (it joined the fanout
    /// below the offset it asked to start at).
    start: u64,
    /// Whether it is behind now, for the log.
    lag: crate::lag_log::LagEpisode,
}

/// The consumer end of a subscriber's queue.
pub struct SubReceiver {
    rx: mpsc::Receiver<Delivery>,
    bytes: Arc<AtomicUsize>,
    lagged: Arc<AtomicU64>,
}

const NOT_LAGGED: u64 = u64::MAX;

/// A subscriber's queue: the fanout's end and the subscription's end.
pub(crate) fn sub_queue(
    id: u64,
    capacity: usize,
    max_bytes: usize,
    tenant: &str,
    announce_drops: bool,
    start: u64,
) -> (SubQueue, SubReceiver) {
    let (tx, rx) = mpsc::channel(capacity);
    let bytes = Arc::new(AtomicUsize::new(0));
    let lagged = Arc::new(AtomicU64::new(NOT_LAGGED));
    (
        SubQueue {
            id,
            tx,
            lagged: lagged.clone(),
            bytes: bytes.clone(),
            max_bytes,
            tenant: tenant.to_owned(),
            announce_drops,
            start,
            lag: Default::default(),
        },
        SubReceiver { rx, bytes, lagged },
    )
}

impl SubReceiver {
    /// The next delivery. After an overflow on a durable stream the fanout drops its end:
    /// what was queued before the drop is delivered first, then `Lagged`.
    pub async fn recv(&mut self) -> Option<Delivery> {
        match self.rx.recv().await {
            Some(d) => {
                if let Delivery::Batch(b) = &d {
                    self.bytes.fetch_sub(b.bytes.len(), Ordering::AcqRel);
                }
                Some(d)
            }
            None => match self.lagged.load(Ordering::Acquire) {
                NOT_LAGGED => None,
                resume_offset => Some(Delivery::Lagged { resume_offset }),
            },
        }
    }
}

/// The live fanout of one shard: the subscribers' queues and the cursor (the next offset
/// fanout will offer). Pushing and registering happen under one lock, which is what makes
/// the join of history and live exact.
#[derive(Default)]
pub(crate) struct Fanout {
    inner: Mutex<FanoutInner>,
}

#[derive(Default)]
struct FanoutInner {
    cursor: u64,
    subscribers: Vec<SubQueue>,
}

impl Fanout {
    /// Offers a batch to every subscriber; a full queue drops it for that subscriber only.
    pub(crate) fn offer(&self, batch: LiveBatch, metrics: &Metrics) {
        let mut inner = self.inner.lock();
        inner.cursor = inner.cursor.max(batch.next_offset);
        inner.subscribers.retain_mut(|q| {
            if batch.next_offset <= q.start {
                return true;
            }
            let len = batch.bytes.len();
            let over_bytes = q.bytes.load(Ordering::Acquire) + len > q.max_bytes;
            let sent = !over_bytes && q.tx.try_send(Delivery::Batch(batch.clone())).is_ok();
            if sent {
                q.bytes.fetch_add(len, Ordering::AcqRel);
                q.lag.delivered(q.id, &q.tenant);
                return true;
            }
            if q.tx.is_closed() {
                return false;
            }
            let first_dropped = batch.first_offset.max(q.start);
            q.lag
                .dropped(q.id, &q.tenant, first_dropped, q.announce_drops);
            metrics
                .sub_queue_dropped
                .get_or_create(&Metrics::tenant(&q.tenant))
                .inc();
            if !q.announce_drops {
                return true;
            }
            // Durable: the first drop ends the subscription. Dropping our end lets the
            // subscription deliver what was queued before, then `subscription_lagged`.
            metrics
                .sub_lagged
                .get_or_create(&Metrics::tenant(&q.tenant))
                .inc();
            q.lagged.store(first_dropped, Ordering::Release);
            false
        });
    }

    pub(crate) fn remove(&self, id: u64) {
        self.inner.lock().subscribers.retain(|q| q.id != id);
    }

    /// The next offset fanout will offer.
    pub(crate) fn cursor(&self) -> u64 {
        self.inner.lock().cursor
    }

    /// Joins a catching-up subscriber to live delivery if it has reached the cursor (`pos`
    /// is where its replay stands); else gives back `None` and it reads on.
    pub(crate) fn join_at(
        &self,
        pos: u64,
        queue: impl FnOnce() -> (SubQueue, SubReceiver),
    ) -> Option<SubReceiver> {
        let mut inner = self.inner.lock();
        if pos < inner.cursor {
            return None;
        }
        let (q, rx) = queue();
        inner.subscribers.push(q);
        Some(rx)
    }

    /// Joins a subscriber at once; `at` is read under the fanout's lock (an ephemeral
    /// shard's next number), so no batch numbered below it is offered to it.
    pub(crate) fn join_now(&self, q: SubQueue, at: impl FnOnce() -> u64) -> u64 {
        let mut inner = self.inner.lock();
        inner.subscribers.push(q);
        at()
    }

    /// Ends every live subscriber.
    pub(crate) fn clear(&self) {
        self.inner.lock().subscribers.clear();
    }

    /// Ends every live subscriber and restarts delivery at `offset`.
    pub(crate) fn reset(&self, offset: u64) {
        let mut inner = self.inner.lock();
        inner.subscribers.clear();
        inner.cursor = offset;
    }

    /// With no live subscriber, moves the cursor to `end` without anything being read or
    /// offered, and says so. Under the lock, as an offer to nobody would: a subscriber that
    /// joins later joins at or past `end`, having replayed up to it from the log itself.
    pub(crate) fn skip_unwatched(&self, end: u64) -> bool {
        let mut inner = self.inner.lock();
        if !inner.subscribers.is_empty() {
            return false;
        }
        inner.cursor = inner.cursor.max(end);
        true
    }

    /// Moves the cursor to `offset` if it is behind it.
    fn advance(&self, offset: u64) {
        let mut inner = self.inner.lock();
        inner.cursor = inner.cursor.max(offset);
    }
}

/// Follows a durable shard's log: offers every committed batch, in offset order, to the
/// shard's live subscribers.
pub(crate) async fn follow_log(
    log: ShardLog,
    mut committed: watch::Receiver<u64>,
    fanout: Arc<Fanout>,
    closed: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut pending: VecDeque<LiveBatch> = VecDeque::new();
    loop {
        if closed.load(Ordering::Acquire) {
            return;
        }
        let cursor = fanout.cursor();
        if *committed.borrow() <= cursor {
            // Waiting on the shard's own watch alone would keep this task, and the log
            // with its open files, alive after the shard is retired: the watch's sender
            // lives as long as the log does.
            tokio::select! {
                changed = committed.changed() => if changed.is_err() { return },
                _ = stop.wait_for(|s| *s) => return,
            }
            continue;
        }
        let visible = *committed.borrow();
        // Nobody to offer to (a quiet stream, a cache's log): no read back.
        if fanout.skip_unwatched(visible) {
            continue;
        }
        let read = match log.read(cursor, 1 << 20, Some(visible)) {
            Ok(r) => r,
            Err(e) => {
                warn!(shard = log.shard(), error = %e, "fanout read failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        if read.batches.is_empty() {
            // A gap up to the committed end (nothing readable): move the cursor past it.
            fanout.advance(read.next_offset);
            continue;
        }
        let buf = Bytes::from(read.batches);
        for item in BatchIter::new(&buf, usize::MAX) {
            let Ok((h, bytes)) = item else { break };
            pending.push_back(LiveBatch {
                first_offset: h.base_offset as u64,
                next_offset: h.last_offset() as u64 + 1,
                bytes: buf.slice_ref(bytes),
            });
        }
        while let Some(b) = pending.pop_front() {
            fanout.offer(b, &metrics);
        }
        fanout.advance(read.next_offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> (SubQueue, SubReceiver) {
        sub_queue(1, 16, 1 << 20, "t", true, 0)
    }

    #[test]
    fn the_cursor_skips_what_nobody_watches_and_never_what_a_subscriber_waits_for() {
        let f = Fanout::default();
        // Nobody subscribed: the cursor passes the committed end with nothing read.
        assert!(f.skip_unwatched(10));
        assert_eq!(f.cursor(), 10);
        // A catching-up subscriber below the cursor reads on from the log; at it, it joins.
        assert!(f.join_at(5, queue).is_none());
        let _live = f.join_at(10, queue).expect("joins at the cursor");
        // With a subscriber, what is past the cursor is read and offered, never skipped.
        assert!(!f.skip_unwatched(20));
        assert_eq!(f.cursor(), 10);
    }
}
